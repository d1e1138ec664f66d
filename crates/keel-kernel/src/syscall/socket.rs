//! The syscall channel: a Unix socket speaking JSON-RPC 2.0, one object per line. A
//! connection must authenticate with `hello` and its run token; after that, requests are
//! served concurrently and answered as they complete (clients match replies by id).
//! Nothing a client sends can take the kernel down: every malformed input gets an error.

use std::sync::Arc;

use keel_protocol::rpc::{
    self, ErrorKind, HelloParams, HelloResult, MAX_EXEC_LINE_BYTES, MAX_LINE_BYTES, Response, RpcError,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::run::LiveRun;
use crate::{Error, Kernel, Result};

/// Lines over [`MAX_LINE_BYTES`] (a `code.exec` with large inputs) are read and served one
/// at a time in the whole process: each may hold 129 MiB, and several times that once
/// parsed, until its call answers.
fn large_lines() -> Arc<Semaphore> {
    static LARGE_LINES: std::sync::OnceLock<Arc<Semaphore>> = std::sync::OnceLock::new();
    LARGE_LINES.get_or_init(|| Arc::new(Semaphore::new(1))).clone()
}

pub(crate) fn listen(kernel: Kernel) -> Result<()> {
    let path = kernel.data_dir().syscall_socket();
    // We hold the data directory's lock, so a socket file left here is a dead kernel's.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|source| Error::SyscallSocket { path: path.display().to_string(), source })?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(kernel.clone(), stream));
                }
                Err(err) => {
                    tracing::warn!("syscall socket accept failed: {err}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    });
    Ok(())
}

async fn serve_connection(kernel: Kernel, stream: UnixStream) {
    let (read_half, mut write_half) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Response>();
    let writer = tokio::spawn(async move {
        while let Some(response) = rx.recv().await {
            // Serialising our own response types cannot fail (no non-string map keys).
            let Ok(mut line) = serde_json::to_vec(&response) else { continue };
            line.push(b'\n');
            if write_half.write_all(&line).await.is_err() {
                break;
            }
        }
    });
    let mut reader = BufReader::new(read_half);
    // The run, and for a `code.exec` program's connection (`--lang cpython`) the seq of
    // that `code.exec`: such a connection may only call tools and the model, as the program's.
    let mut run: Option<(Arc<LiveRun>, Option<u64>)> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        let limit = MAX_LINE_BYTES as u64 + 1;
        match (&mut reader).take(limit).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // A longer line may be a `code.exec` with large inputs, from an authenticated
        // connection only: read the rest under the one large-line permit.
        let mut large = None;
        if line.last() != Some(&b'\n') && line.len() as u64 >= limit && run.is_some() {
            let Ok(permit) = large_lines().acquire_owned().await else { break };
            large = Some(permit);
            let rest = (MAX_EXEC_LINE_BYTES - line.len()) as u64 + 1;
            match (&mut reader).take(rest).read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let max = if large.is_some() { MAX_EXEC_LINE_BYTES } else { MAX_LINE_BYTES };
        if line.last() != Some(&b'\n') && line.len() > max {
            let message = format!(
                "request line longer than {max} bytes (only a code.exec after hello may pass {MAX_LINE_BYTES}); \
                 send large payloads in smaller pieces. Closing the connection"
            );
            let _ = tx.send(Response::err(Value::Null, ErrorKind::TooLarge.error(message)));
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let request = match parse_request(&line) {
            Ok(request) => request,
            Err((id, error)) => {
                let _ = tx.send(Response::err(id, error));
                continue;
            }
        };
        let (id, method, params) = request;
        // Protocol 1 closes the connection after any other line that long.
        if large.is_some() && method != "code.exec" {
            let message = format!(
                "{method}: the request is {} bytes; only code.exec may send more than {MAX_LINE_BYTES} \
                 (its inputs); send large payloads in smaller pieces. Closing the connection",
                line.len()
            );
            let _ = tx.send(Response::err(id, ErrorKind::TooLarge.error(message)));
            break;
        }
        let Some((live, exec)) = run.clone() else {
            let response = match hello(&kernel, &method, params).await {
                Ok((live, result)) => {
                    run = Some(live);
                    Response::ok(id, result)
                }
                Err(error) => Response::err(id, error),
            };
            let _ = tx.send(response);
            continue;
        };
        if method == "hello" {
            let error = ErrorKind::InvalidRequest.error("this connection has already said hello");
            let _ = tx.send(Response::err(id, error));
            continue;
        }
        let params = match exec {
            None => params,
            Some(seq) => match exec_params(&method, params, seq) {
                Ok(params) => params,
                Err(error) => {
                    let _ = tx.send(Response::err(id, error));
                    continue;
                }
            },
        };
        let kernel = kernel.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            // A large line's permit is held until its call answers (its params live as long).
            let _large: Option<OwnedSemaphorePermit> = large;
            // When the agent is gone, what it asked for is dropped mid-flight: an LLM
            // stream closes, a tool's processes are killed, an MCP call is cancelled.
            let mut ended = live.ended.subscribe();
            let call = async {
                match exec {
                    // A program's model call counts against its `max_llm_calls`.
                    Some(seq) if method == "llm.chat" => kernel.exec_llm_chat(&live, seq, params).await,
                    _ => kernel.syscall(&live, &method, params).await,
                }
            };
            let reply = tokio::select! {
                reply = call => reply,
                _ = ended.wait_for(|ended| *ended) => return,
            };
            let response = match reply {
                Ok(result) => Response::ok(id, result),
                Err(error) => Response::err(id, error.to_rpc()),
            };
            let _ = tx.send(response);
        });
    }
    drop(tx);
    let _ = writer.await;
}

type Parsed = (Value, String, Value);

/// Turns one line into (id, method, params), or the error to answer with.
fn parse_request(line: &[u8]) -> std::result::Result<Parsed, (Value, RpcError)> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        (
            Value::Null,
            ErrorKind::ParseError
                .error(format!("the line is not valid JSON ({e}); send one JSON-RPC object per line")),
        )
    })?;
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    let request: rpc::Request = serde_json::from_value(value).map_err(|e| {
        (id.clone(), ErrorKind::InvalidRequest.error(format!(
            "not a JSON-RPC 2.0 request ({e}); expected {{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"...\",\"params\":{{...}}}}"
        )))
    })?;
    if request.jsonrpc != "2.0" {
        return Err((
            id,
            ErrorKind::InvalidRequest
                .error(format!("\"jsonrpc\" must be \"2.0\", got {:?}", request.jsonrpc)),
        ));
    }
    let id =
        match request.id {
            Some(id @ (Value::Number(_) | Value::String(_))) => id,
            _ => {
                return Err((id, ErrorKind::InvalidRequest.error(
                "every request needs an \"id\" (a number or string); Keel does not take notifications",
            )));
            }
        };
    let params = request.params.unwrap_or_else(|| Value::Object(Default::default()));
    Ok((id, request.method, params))
}

/// A connection's run, and for a `code.exec` program's the seq of that `code.exec`.
type Authenticated = (Arc<LiveRun>, Option<u64>);

/// What a `code.exec` program may send: tool calls and model calls (marked as the
/// program's) and `tool.list` / `sys.ping`.
fn exec_params(method: &str, mut params: Value, seq: u64) -> std::result::Result<Value, RpcError> {
    match method {
        "tool.call" | "llm.chat" => {
            if let Some(map) = params.as_object_mut() {
                map.insert("exec".into(), Value::from(seq));
            }
            Ok(params)
        }
        "tool.list" | "sys.ping" => Ok(params),
        other => Err(ErrorKind::Denied
            .error(format!("a code.exec program may call tools and the model only (tool.call, tool.list, llm.chat), not {other}"))),
    }
}

async fn hello(
    kernel: &Kernel,
    method: &str,
    params: Value,
) -> std::result::Result<(Authenticated, Value), RpcError> {
    if method != "hello" {
        return Err(ErrorKind::Unauthenticated.error(format!(
            "say hello first: {{\"method\":\"hello\",\"params\":{{\"token\":\"$KEEL_RUN_TOKEN\"}}}} before calling {method}"
        )));
    }
    let params: HelloParams = serde_json::from_value(params)
        .map_err(|e| ErrorKind::InvalidParams.error(format!("hello takes {{\"token\": \"...\"}}: {e}")))?;
    let live = kernel.live_by_token_ready(&params.token).await.map(|live| (live, None));
    let live = live.or_else(|| kernel.exec_by_token(&params.token).map(|(live, seq)| (live, Some(seq))));
    let live = live.ok_or_else(|| {
        ErrorKind::Unauthenticated.error(
            "unknown run token: use the KEEL_RUN_TOKEN the kernel gave this run (tokens end with their run)",
        )
    })?;
    let result = HelloResult { run_id: live.0.id.to_string(), protocol: keel_protocol::PROTOCOL_VERSION };
    let result = serde_json::to_value(result).map_err(|e| ErrorKind::Internal.error(e.to_string()))?;
    Ok((live, result))
}
