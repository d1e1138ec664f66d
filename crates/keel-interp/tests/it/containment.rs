//! Hostile programs: each is contained with a clear error kind, and the pool serves the
//! next job afterwards.

use std::time::Duration;

use keel_interp::{ExecErrorKind, ExecOutcome, Lang, Pool};

use crate::{Tools, job, kind, pool, still_serves};

async fn contained(
    pool: &Pool,
    lang: Lang,
    code: &str,
    limits: impl FnOnce(&mut keel_interp::Limits),
) -> ExecOutcome {
    let mut job = job(lang, code);
    job.limits.timeout = Duration::from_millis(500);
    limits(&mut job.limits);
    let outcome = pool.exec(job, &Tools::default()).await;
    assert!(outcome.result.is_err(), "{code}: expected a failure, got {:?}", outcome.result);
    still_serves(pool, lang).await;
    outcome
}

async fn expect(pool: &Pool, lang: Lang, code: &str, expected: &[ExecErrorKind]) {
    let outcome = contained(pool, lang, code, |_| {}).await;
    let error = outcome.result.as_ref().err().map(ToString::to_string).unwrap_or_default();
    assert!(expected.contains(&kind(&outcome).unwrap_or(ExecErrorKind::Invalid)), "{code}: {error}");
    let code: String = code.chars().take(60).collect();
    let error: String = error.chars().take(300).collect();
    println!("{lang} {code:?} -> {error}");
}

const DEEP: usize = 100_000;

#[tokio::test]
async fn python_hostile_programs() {
    use ExecErrorKind::*;
    let pool = pool(2);
    let py = Lang::Python;
    expect(&pool, py, "def f(): return f()\nf()", &[Recursion]).await;
    expect(&pool, py, "10**10**10", &[Memory, Timeout]).await;
    expect(&pool, py, "'a'*10**12", &[Memory]).await;
    expect(&pool, py, "x = ['a' * 1000000 for _ in range(10000)]\nlen(x)", &[Memory]).await;
    expect(&pool, py, &"[".repeat(DEEP), &[Syntax, Recursion, WorkerCrashed]).await;
    let nested = format!("import json\njson.loads({:?})", "[".repeat(DEEP) + &"]".repeat(DEEP));
    expect(&pool, py, &nested, &[Runtime, Recursion]).await;
    // monty's `re` does not backtrack: the ReDoS pattern answers at once.
    let redos = pool.exec(job(py, "import re\nre.match(r'(a+)+$', 'a' * 30 + 'b')"), &Tools::default()).await;
    assert_eq!(redos.result, Ok(serde_json::Value::Null));
    expect(&pool, py, "().__class__.__subclasses__()", &[Runtime]).await;
    expect(&pool, py, "def f(): pass\nf.__globals__", &[Runtime]).await;
    expect(&pool, py, "import os\nos.system('id')", &[Runtime]).await;
    expect(&pool, py, "import os\nos.getenv('HOME')", &[Runtime]).await;
    expect(&pool, py, "open('/etc/passwd').read()", &[Runtime]).await;
    expect(&pool, py, "from pathlib import Path\nPath('/etc/passwd').read_text()", &[Runtime]).await;
    expect(&pool, py, "eval('1')", &[Runtime]).await;
    expect(&pool, py, "exec('1')", &[Runtime]).await;
    expect(&pool, py, "import socket", &[Runtime]).await;
    expect(&pool, py, "call_tool('shell.run', cmd='id')", &[NotGranted]).await;
    expect(&pool, py, "while True: pass", &[Timeout]).await;
    expect(&pool, py, "fail()", &[Runtime]).await;
    let outcome =
        contained(&pool, py, "while True: print('x' * 1000)", |limits| limits.max_output_bytes = 100_000)
            .await;
    assert_eq!(kind(&outcome), Some(OutputLimit));
    let outcome =
        contained(&pool, py, "for i in range(1000): echo(i=i)", |limits| limits.max_tool_calls = 5).await;
    assert_eq!(kind(&outcome), Some(ToolCallLimit));
    assert_eq!(outcome.tool_calls.len(), 5);
}

#[tokio::test]
async fn javascript_hostile_programs() {
    use ExecErrorKind::*;
    let pool = pool(2);
    let js = Lang::JavaScript;
    expect(&pool, js, "function f(){return f()} f()", &[Recursion]).await;
    expect(&pool, js, "'a'.repeat(1e12)", &[Memory]).await;
    let hog = "const a = []; for (;;) a.push('x'.repeat(1e6) + a.length)";
    // Generous time: filling the heap to its limit is slow on a loaded machine, and the
    // point is that the memory limit, not the clock, stops it.
    let outcome = contained(&pool, js, hog, |limits| limits.timeout = Duration::from_secs(60)).await;
    assert_eq!(kind(&outcome), Some(Memory), "{:?}", outcome.result);
    expect(&pool, js, &"[".repeat(DEEP), &[Syntax, Recursion]).await;
    let nested = format!("JSON.parse('{}')", "[".repeat(DEEP) + &"]".repeat(DEEP));
    expect(&pool, js, &nested, &[Recursion]).await;
    expect(&pool, js, &format!("eval('{}')", "[".repeat(DEEP)), &[Recursion, Syntax]).await;
    expect(&pool, js, "/(a+)+$/.test('a'.repeat(30)+'b')", &[Timeout]).await;
    expect(&pool, js, "require('fs')", &[Runtime]).await;
    expect(&pool, js, "import('os')", &[Runtime]).await;
    expect(
        &pool,
        js,
        "const g = (function(){}).constructor.constructor('return this')(); g.os.exec('id')",
        &[Runtime],
    )
    .await;
    expect(&pool, js, "call_tool('shell.run', {cmd: 'id'})", &[NotGranted]).await;
    expect(&pool, js, "for(;;){}", &[Timeout]).await;
    expect(&pool, js, "fail({})", &[Runtime]).await;
    let outcome = contained(&pool, js, "for(;;) console.log('x'.repeat(1000))", |limits| {
        limits.max_output_bytes = 100_000
    })
    .await;
    assert_eq!(kind(&outcome), Some(OutputLimit));
    let outcome =
        contained(&pool, js, "for (let i = 0; i < 1000; i++) echo({i})", |limits| limits.max_tool_calls = 5)
            .await;
    assert_eq!(kind(&outcome), Some(ToolCallLimit));
}

/// A native stack overflow in the worker kills it; the pool reports it and carries on.
#[tokio::test]
async fn a_worker_that_dies_is_reported_and_replaced() {
    let pool = pool(1);
    // A recursion limit far past the native stack lets QuickJS overflow it (SIGSEGV).
    let outcome =
        contained(&pool, Lang::JavaScript, "function f(n) { return f(n + 1) + 1 } f(0)", |limits| {
            limits.max_recursion = 10_000_000;
            limits.timeout = Duration::from_secs(5);
        })
        .await;
    let error = outcome.result.as_ref().err().map(ToString::to_string).unwrap_or_default();
    assert_eq!(kind(&outcome), Some(ExecErrorKind::WorkerCrashed), "{error}");
    println!("{error}");
    assert!(pool.stats().crashed >= 1);
}
