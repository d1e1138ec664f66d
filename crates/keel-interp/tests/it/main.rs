//! Integration tests: jobs through the [`Pool`] in real, confined worker processes.

mod containment;
mod pool;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use keel_interp::{
    ExecErrorKind, ExecOutcome, Job, Lang, Limits, Pool, PoolConfig, ToolHandler, WorkerCommand,
};
use serde_json::{Value, json};

pub fn worker_command() -> WorkerCommand {
    WorkerCommand { program: PathBuf::from(env!("CARGO_BIN_EXE_keel-interp-worker")), args: Vec::new() }
}

pub fn pool(size: usize) -> Pool {
    Pool::new(PoolConfig { worker: worker_command(), size })
}

pub fn job(lang: Lang, code: &str) -> Job {
    Job {
        lang,
        code: code.to_owned(),
        inputs: serde_json::Map::new(),
        tools: ["echo", "fs.read", "fail", "hang", "word_count", "mcp:fs/read_file"]
            .map(str::to_owned)
            .to_vec(),
        limits: Limits { timeout: Duration::from_secs(2), ..Limits::default() },
    }
}

/// In-memory tools: `echo` returns its args, `fail` errors, `hang` never returns.
#[derive(Default)]
pub struct Tools {
    pub calls: AtomicU32,
}

#[async_trait::async_trait]
impl ToolHandler for Tools {
    async fn call(&self, name: &str, args: Value) -> Result<Value, String> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        match name {
            "echo" | "mcp:fs/read_file" => Ok(args),
            "fail" => Err("disk on fire".to_owned()),
            "hang" => std::future::pending().await,
            "fs.read" => Ok(json!(format!("contents of {}", args["path"].as_str().unwrap_or("?")))),
            "word_count" => Ok(json!(args["text"].as_str().unwrap_or("").split_whitespace().count())),
            other => Err(format!("no tool {other}")),
        }
    }
}

pub fn kind(outcome: &ExecOutcome) -> Option<ExecErrorKind> {
    outcome.result.as_ref().err().map(|error| error.kind)
}

/// Asserts the pool still serves a plain job in `lang`.
pub async fn still_serves(pool: &Pool, lang: Lang) {
    let code = match lang {
        Lang::Python => "echo(v=1)",
        Lang::JavaScript => "echo({v: 1})",
    };
    let outcome = pool.exec(job(lang, code), &Tools::default()).await;
    assert_eq!(outcome.result, Ok(json!({"v": 1})), "the pool no longer serves {lang}");
}
