//! `http.fetch`: an HTTP request on behalf of an agent, sent through the run's egress
//! proxy so the run's allowlist, audit and credential injection apply to it as to the
//! agent's own traffic. A run without egress gets a fetcher that refuses every URL: the
//! kernel never makes a direct connection for an agent.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

/// Body bytes returned when the call does not say.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
/// The most body bytes a call may ask for.
pub const MAX_BYTES: u64 = 16 << 20;
/// Seconds a call may take when it does not say.
pub const DEFAULT_TIMEOUT_SECS: u64 = 30;
/// The longest a call may ask for.
pub const MAX_TIMEOUT_SECS: u64 = 300;

const NO_EGRESS: &str =
    "http.fetch: this run has no network egress; start it with --network allowlist --allow-host HOST";

/// Makes `http.fetch` calls for one run.
pub struct Fetcher {
    /// `None`: the run has no egress and every call is refused.
    client: Option<reqwest::Client>,
}

impl Fetcher {
    /// A fetcher whose every request goes through `proxy` (the run's egress proxy, e.g.
    /// `http://127.0.0.1:PORT`); with `None`, one that refuses every URL.
    /// `extra_root_pem` is trusted in addition to the system roots (the Keel CA, so a
    /// connection the proxy intercepts to inject a credential verifies).
    pub fn new(proxy: Option<String>, extra_root_pem: Option<Vec<u8>>) -> Result<Fetcher, String> {
        let Some(proxy) = proxy else { return Ok(Fetcher { client: None }) };
        let proxy = reqwest::Proxy::all(&proxy)
            .map_err(|e| format!("http.fetch: the egress proxy address {proxy:?} is not usable: {e}"))?;
        let mut builder = reqwest::Client::builder()
            .proxy(proxy)
            .redirect(reqwest::redirect::Policy::limited(5))
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = extra_root_pem {
            let roots = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("http.fetch: the extra root certificates are not valid PEM: {e}"))?;
            if roots.is_empty() {
                return Err("http.fetch: the extra root certificates hold no PEM certificate".into());
            }
            builder = builder.tls_certs_merge(roots);
        }
        let client =
            builder.build().map_err(|e| format!("http.fetch: could not make the HTTP client: {e}"))?;
        Ok(Fetcher { client: Some(client) })
    }

    /// `http.fetch {url, method?, headers?, body?, timeout_secs?, max_bytes?}` →
    /// `{status, headers, body, encoding, bytes, truncated}`; `body` is text when the
    /// response is UTF-8, base64 (`encoding: "base64"`) otherwise. An HTTP error status
    /// is a result, not an error; a transport failure is an error.
    pub async fn fetch(&self, args: &Value) -> Result<Value, String> {
        let request = Request::parse(args)?;
        let Some(client) = &self.client else { return Err(NO_EGRESS.to_owned()) };
        let what = format!("{} {}", request.method, request.url);
        let mut builder = client
            .request(request.method.clone(), request.url.clone())
            .headers(request.headers)
            .timeout(request.timeout);
        if let Some(body) = request.body {
            builder = builder.body(body);
        }
        let read = async {
            let mut response =
                builder.send().await.map_err(|e| format!("http.fetch: {what} failed: {}", chain(&e)))?;
            let status = response.status().as_u16();
            let mut headers = Map::new();
            for (name, value) in response.headers() {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                match headers.get_mut(name.as_str()) {
                    Some(Value::String(existing)) => {
                        existing.push_str(", ");
                        existing.push_str(&value);
                    }
                    _ => {
                        headers.insert(name.as_str().to_owned(), Value::String(value));
                    }
                }
            }
            let mut body = Vec::new();
            let mut truncated = false;
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| format!("http.fetch: {what}: reading the body failed: {}", chain(&e)))?
            {
                let room = request.max_bytes.saturating_sub(body.len() as u64) as usize;
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, String>((status, headers, body, truncated))
        };
        // The client's timeout covers the body too; this bounds the whole call anyway.
        let (status, headers, body, truncated) =
            tokio::time::timeout(request.timeout + Duration::from_secs(1), read).await.map_err(|_| {
                format!("http.fetch: {what} timed out after {} s", request.timeout.as_secs_f64())
            })??;
        let bytes = body.len();
        let (body, encoding) = match String::from_utf8(body) {
            Ok(text) => (text, "utf8"),
            Err(binary) => (BASE64.encode(binary.as_bytes()), "base64"),
        };
        Ok(json!({
            "status": status,
            "headers": headers,
            "body": body,
            "encoding": encoding,
            "bytes": bytes,
            "truncated": truncated,
        }))
    }
}

/// An error with its causes, which is where reqwest says what actually went wrong.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A checked `http.fetch` call.
struct Request {
    url: reqwest::Url,
    method: reqwest::Method,
    headers: HeaderMap,
    body: Option<String>,
    timeout: Duration,
    max_bytes: u64,
}

impl Request {
    fn parse(args: &Value) -> Result<Request, String> {
        let bad = |message: String| format!("http.fetch: {message}");
        let Some(args) = args.as_object() else {
            return Err(bad("the arguments must be a JSON object".into()));
        };
        let url = match args.get("url") {
            Some(Value::String(url)) => url,
            _ => return Err(bad("`url` (a string) is required".into())),
        };
        let url = reqwest::Url::parse(url).map_err(|e| bad(format!("{url:?} is not a valid URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(format!("only http and https URLs can be fetched, not {}:", url.scheme())));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad(format!("{url} has no host")));
        }
        let method = match args.get("method") {
            None | Some(Value::Null) => reqwest::Method::GET,
            Some(Value::String(m)) => match m.to_ascii_uppercase().as_str() {
                "GET" => reqwest::Method::GET,
                "POST" => reqwest::Method::POST,
                "PUT" => reqwest::Method::PUT,
                "PATCH" => reqwest::Method::PATCH,
                "DELETE" => reqwest::Method::DELETE,
                "HEAD" => reqwest::Method::HEAD,
                _ => {
                    return Err(bad(format!(
                        "`method` must be GET, POST, PUT, PATCH, DELETE or HEAD, got {m:?}"
                    )));
                }
            },
            Some(other) => return Err(bad(format!("`method` must be a string, got {other}"))),
        };
        let mut headers = HeaderMap::new();
        match args.get("headers") {
            None | Some(Value::Null) => {}
            Some(Value::Object(given)) => {
                for (name, value) in given {
                    let Some(value) = value.as_str() else {
                        return Err(bad(format!("header {name:?} must be a string, got {value}")));
                    };
                    let header = HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| bad(format!("{name:?} is not a valid header name")))?;
                    let value = HeaderValue::from_str(value)
                        .map_err(|_| bad(format!("the value of header {name:?} is not valid")))?;
                    headers.append(header, value);
                }
            }
            Some(other) => return Err(bad(format!("`headers` must be an object of strings, got {other}"))),
        }
        let body = match args.get("body") {
            None | Some(Value::Null) => None,
            Some(Value::String(body)) => Some(body.clone()),
            Some(other) => return Err(bad(format!("`body` must be a string, got {other}"))),
        };
        let timeout = match args.get("timeout_secs") {
            None | Some(Value::Null) => Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            Some(value) => match value.as_f64() {
                Some(secs) if secs > 0.0 && secs <= MAX_TIMEOUT_SECS as f64 => Duration::from_secs_f64(secs),
                _ => {
                    return Err(bad(format!(
                        "`timeout_secs` must be a number above 0 and at most {MAX_TIMEOUT_SECS}, got {value}"
                    )));
                }
            },
        };
        let max_bytes = match args.get("max_bytes") {
            None | Some(Value::Null) => DEFAULT_MAX_BYTES,
            Some(value) => match value.as_u64() {
                Some(n) if (1..=MAX_BYTES).contains(&n) => n,
                _ => {
                    return Err(bad(format!(
                        "`max_bytes` must be a whole number from 1 to {MAX_BYTES}, got {value}"
                    )));
                }
            },
        };
        Ok(Request { url, method, headers, body, timeout, max_bytes })
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A stand-in for the egress proxy: answers each plain-HTTP proxy request with
    /// `body`, and reports the request it got (head and body).
    async fn fake_proxy(body: Vec<u8>) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                let body = body.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 4096];
                    loop {
                        let n = socket.read(&mut buffer).await.unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        request.extend_from_slice(&buffer[..n]);
                        let text = String::from_utf8_lossy(&request).to_string();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length: usize = text
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().parse().unwrap_or(0))
                                })
                                .unwrap_or(0);
                            if request.len() >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    let _ = seen.send(String::from_utf8_lossy(&request).into_owned());
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-test: a\r\nx-test: b\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&body).await;
                });
            }
        });
        (address, requests)
    }

    #[tokio::test]
    async fn a_get_goes_through_the_proxy() {
        let (proxy, mut requests) = fake_proxy(b"hello".to_vec()).await;
        let fetcher = Fetcher::new(Some(proxy), None).unwrap();
        let out = fetcher.fetch(&json!({"url": "http://example.test/path?q=1"})).await.unwrap();
        assert_eq!(out["status"], 200);
        assert_eq!(out["body"], "hello");
        assert_eq!(out["encoding"], "utf8");
        assert_eq!(out["truncated"], false);
        assert_eq!(out["headers"]["x-test"], "a, b");
        let request = requests.recv().await.unwrap();
        assert!(request.starts_with("GET http://example.test/path?q=1 HTTP/1.1\r\n"), "{request}");
        assert!(request.to_ascii_lowercase().contains("host: example.test"), "{request}");
    }

    #[tokio::test]
    async fn a_post_sends_its_headers_and_body() {
        let (proxy, mut requests) = fake_proxy(vec![0, 255, 1]).await;
        let fetcher = Fetcher::new(Some(proxy), None).unwrap();
        let out = fetcher
            .fetch(&json!({"url": "http://example.test/", "method": "post",
                "headers": {"X-Key": "v"}, "body": "{\"a\":1}"}))
            .await
            .unwrap();
        assert_eq!(out["encoding"], "base64");
        assert_eq!(out["body"], BASE64.encode([0u8, 255, 1]));
        let request = requests.recv().await.unwrap();
        assert!(request.starts_with("POST http://example.test/ HTTP/1.1\r\n"), "{request}");
        assert!(request.to_ascii_lowercase().contains("x-key: v"), "{request}");
        assert!(request.ends_with("{\"a\":1}"), "{request}");
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_truncated() {
        let (proxy, _requests) = fake_proxy(vec![b'x'; 5000]).await;
        let fetcher = Fetcher::new(Some(proxy), None).unwrap();
        let out = fetcher.fetch(&json!({"url": "http://example.test/", "max_bytes": 100})).await.unwrap();
        assert_eq!(out["body"].as_str().unwrap().len(), 100);
        assert_eq!(out["bytes"], 100);
        assert_eq!(out["truncated"], true);
        let out = fetcher.fetch(&json!({"url": "http://example.test/", "max_bytes": 5000})).await.unwrap();
        assert_eq!(out["truncated"], false);
    }

    #[tokio::test]
    async fn a_run_without_egress_is_refused_every_url() {
        let fetcher = Fetcher::new(None, None).unwrap();
        let message = fetcher.fetch(&json!({"url": "https://example.com/"})).await.unwrap_err();
        assert_eq!(message, NO_EGRESS);
    }

    #[tokio::test]
    async fn bad_calls_are_refused_before_anything_is_sent() {
        let fetcher = Fetcher::new(Some("http://127.0.0.1:9".into()), None).unwrap();
        for (args, says) in [
            (json!({"url": "file:///etc/passwd"}), "only http and https URLs can be fetched, not file:"),
            (json!({"url": "ftp://example.com/x"}), "not ftp:"),
            (json!({"url": "not a url"}), "is not a valid URL"),
            (json!({}), "`url` (a string) is required"),
            (json!({"url": "http://x/", "method": "TRACE"}), "`method` must be GET"),
            (json!({"url": "http://x/", "headers": {"a": 1}}), "header \"a\" must be a string"),
            (json!({"url": "http://x/", "headers": {"a b": "1"}}), "not a valid header name"),
            (json!({"url": "http://x/", "body": {}}), "`body` must be a string"),
            (json!({"url": "http://x/", "timeout_secs": 0}), "`timeout_secs` must be"),
            (json!({"url": "http://x/", "max_bytes": 0}), "`max_bytes` must be"),
        ] {
            let message = fetcher.fetch(&args).await.unwrap_err();
            assert!(message.contains(says), "{args}: {message}");
        }
        assert!(Fetcher::new(Some("not a proxy".into()), None).is_err());
        assert!(Fetcher::new(Some("http://127.0.0.1:1".into()), Some(b"garbage".to_vec())).is_err());
    }

    #[tokio::test]
    async fn an_unreachable_proxy_is_an_error_that_says_so() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let fetcher = Fetcher::new(Some(format!("http://{address}")), None).unwrap();
        let message = fetcher.fetch(&json!({"url": "http://example.test/"})).await.unwrap_err();
        assert!(message.starts_with("http.fetch: GET http://example.test/ failed:"), "{message}");
    }
}
