//! Unit tests of the engines, run in-process (no worker, no confinement), and of the
//! confinement itself in forked children.

use serde_json::{Value, json};

use crate::{ExecErrorKind, ExecOutcome, Job, Lang, Limits, run_in_process};

fn job(lang: Lang, code: &str) -> Job {
    Job {
        lang,
        code: code.to_owned(),
        inputs: serde_json::Map::new(),
        tools: ["echo", "fs.read", "fail", "mcp:fs/read-file", "word_count"].map(str::to_owned).to_vec(),
        limits: Limits { timeout: std::time::Duration::from_secs(2), ..Limits::default() },
    }
}

/// A tool set: `echo` returns its args, `fail` errors, `fs.read` returns the path's length.
fn tools(name: &str, args: Value) -> Result<Value, String> {
    match name {
        "echo" | "mcp:fs/read-file" => Ok(args),
        "fail" => Err("disk on fire".to_owned()),
        "fs.read" => Ok(json!(format!("contents of {}", args["path"].as_str().unwrap_or("?")))),
        "word_count" => Ok(json!(args["text"].as_str().unwrap_or("").split_whitespace().count())),
        other => Err(format!("no tool {other}")),
    }
}

fn run(job: Job) -> ExecOutcome {
    run_in_process(job, &mut tools)
}

fn ok(lang: Lang, code: &str) -> Value {
    let outcome = run(job(lang, code));
    match outcome.result {
        Ok(value) => value,
        Err(error) => panic!("{code}: {error}"),
    }
}

fn err(lang: Lang, code: &str) -> (ExecErrorKind, String) {
    let outcome = run(job(lang, code));
    match outcome.result {
        Ok(value) => panic!("{code}: expected an error, got {value}"),
        Err(error) => (error.kind, error.message),
    }
}

#[test]
fn python_tools_appear_as_functions_namespaces_and_call_tool() {
    assert_eq!(ok(Lang::Python, "echo(x=1)"), json!({"x": 1}));
    assert_eq!(ok(Lang::Python, "fs.read(path='a.txt')"), json!("contents of a.txt"));
    assert_eq!(ok(Lang::Python, "mcp.fs.read_file(path='x')"), json!({"path": "x"}));
    assert_eq!(ok(Lang::Python, "call_tool('fs.read', {'path': 'b'})"), json!("contents of b"));
    assert_eq!(ok(Lang::Python, "call_tool('fs.read', path='c')"), json!("contents of c"));
    assert_eq!(ok(Lang::Python, "echo({'a': [1, 2.5, None, True]})"), json!({"a": [1, 2.5, null, true]}));
}

#[test]
fn javascript_tools_appear_as_functions_namespaces_and_call_tool() {
    assert_eq!(ok(Lang::JavaScript, "echo({x: 1})"), json!({"x": 1}));
    assert_eq!(ok(Lang::JavaScript, "fs.read({path: 'a.txt'})"), json!("contents of a.txt"));
    assert_eq!(ok(Lang::JavaScript, "mcp.fs.read_file({path: 'x'})"), json!({"path": "x"}));
    assert_eq!(ok(Lang::JavaScript, "call_tool('fs.read', {path: 'b'})"), json!("contents of b"));
}

#[test]
fn inputs_are_globals_and_print_is_captured() {
    let mut python = job(Lang::Python, "print('n is', n)\nn * 2");
    python.inputs.insert("n".to_owned(), json!(21));
    let outcome = run(python);
    assert_eq!(outcome.result, Ok(json!(42)));
    assert_eq!(outcome.stdout, "n is 21\n");

    let mut javascript = job(Lang::JavaScript, "console.log('n is', n, {a: 1}); n * 2");
    javascript.inputs.insert("n".to_owned(), json!(21));
    let outcome = run(javascript);
    assert_eq!(outcome.result, Ok(json!(42)));
    assert_eq!(outcome.stdout, "n is 21 {\"a\":1}\n");
}

#[test]
fn ten_tool_calls_aggregate() {
    let python = "total = 0\nfor i in range(10):\n    total += word_count(text='a b ' * i)\ntotal";
    let outcome = run(job(Lang::Python, python));
    assert_eq!(outcome.result, Ok(json!(90)));
    assert_eq!(outcome.tool_calls.len(), 10);
    assert!(outcome.tool_calls.iter().all(|call| call.ok && call.name == "word_count"));

    let javascript = "let t = 0; for (let i = 0; i < 10; i++) t += word_count({text: 'a b '.repeat(i)}); t";
    let outcome = run(job(Lang::JavaScript, javascript));
    assert_eq!(outcome.result, Ok(json!(90)));
    assert_eq!(outcome.tool_calls.len(), 10);
}

#[test]
fn tool_errors_raise_and_can_be_caught() {
    let python = "try:\n    fail()\n    r = 'no'\nexcept Exception as e:\n    r = str(e)\nr";
    assert_eq!(ok(Lang::Python, python), json!("disk on fire"));
    let (kind, message) = err(Lang::Python, "fail()");
    assert_eq!(kind, ExecErrorKind::Runtime);
    assert!(message.contains("disk on fire"), "{message}");

    let javascript = "let r; try { fail(); r = 'no' } catch (e) { r = e.message } r";
    assert_eq!(ok(Lang::JavaScript, javascript), json!("disk on fire"));
    let (kind, message) = err(Lang::JavaScript, "fail({})");
    assert_eq!(kind, ExecErrorKind::Runtime);
    assert!(message.contains("disk on fire"), "{message}");
}

#[test]
fn ungranted_tools_fail_without_reaching_the_callback() {
    for (lang, code) in
        [(Lang::Python, "call_tool('shell.run', cmd='id')"), (Lang::JavaScript, "call_tool('shell.run', {})")]
    {
        let mut reached = false;
        let outcome = run_in_process(job(lang, code), &mut |_, _| {
            reached = true;
            Ok(Value::Null)
        });
        assert!(!reached);
        let error = outcome.result.expect_err("not granted");
        assert_eq!(error.kind, ExecErrorKind::NotGranted, "{error}");
        assert!(error.message.contains("tool \"shell.run\" is not granted"), "{error}");
    }
    // Names that are not tools at all are ordinary name errors.
    assert_eq!(err(Lang::Python, "shell.run(cmd='id')").0, ExecErrorKind::Runtime);
    assert_eq!(err(Lang::JavaScript, "shell.run({cmd: 'id'})").0, ExecErrorKind::Runtime);
}

#[test]
fn the_tool_call_budget_is_enforced_and_uncatchable() {
    let mut python = job(
        Lang::Python,
        "for i in range(10):\n    try:\n        echo(i=i)\n    except Exception:\n        pass\n1",
    );
    python.limits.max_tool_calls = 3;
    let outcome = run(python);
    assert_eq!(outcome.result.map_err(|error| error.kind), Err(ExecErrorKind::ToolCallLimit));
    assert_eq!(outcome.tool_calls.len(), 3);

    let mut javascript =
        job(Lang::JavaScript, "for (let i = 0; i < 10; i++) { try { echo({i}) } catch (e) {} } 1");
    javascript.limits.max_tool_calls = 3;
    let outcome = run(javascript);
    assert_eq!(outcome.result.map_err(|error| error.kind), Err(ExecErrorKind::ToolCallLimit));
    assert_eq!(outcome.tool_calls.len(), 3);
}

#[test]
fn syntax_errors_are_syntax() {
    assert_eq!(err(Lang::Python, "def (").0, ExecErrorKind::Syntax);
    assert_eq!(err(Lang::JavaScript, "function (").0, ExecErrorKind::Syntax);
}

#[test]
fn infinite_loops_time_out() {
    for (lang, code) in [(Lang::Python, "while True: pass"), (Lang::JavaScript, "for(;;){}")] {
        let mut job = job(lang, code);
        job.limits.timeout = std::time::Duration::from_millis(200);
        let outcome = run(job);
        assert_eq!(outcome.result.map_err(|error| error.kind), Err(ExecErrorKind::Timeout), "{code}");
    }
}

#[test]
fn recursion_is_recursion() {
    assert_eq!(err(Lang::Python, "def f(): return f()\nf()").0, ExecErrorKind::Recursion);
    assert_eq!(err(Lang::JavaScript, "function f(){return f()} f()").0, ExecErrorKind::Recursion);
}

#[test]
fn output_is_bounded() {
    for (lang, code) in [
        (Lang::Python, "while True: print('x' * 100)"),
        (Lang::JavaScript, "for(;;) console.log('x'.repeat(100))"),
    ] {
        let mut job = job(lang, code);
        job.limits.max_output_bytes = 10_000;
        let outcome = run(job);
        assert_eq!(outcome.result.map_err(|error| error.kind), Err(ExecErrorKind::OutputLimit), "{code}");
        assert!(outcome.stdout.len() <= 10_000);
    }
}

#[test]
fn python_reaches_nothing_host_side() {
    let mut failures = Vec::new();
    for code in [
        "import os\nos.getenv('HOME')",
        "import os\nos.listdir('/')",
        "import subprocess",
        "import socket",
        "from pathlib import Path\nPath('/etc/passwd').read_text()",
        "open('/etc/passwd').read()",
        "eval('1')",
        "exec('1')",
        "().__class__.__subclasses__()",
        "def f(): pass\nf.__globals__",
        "__import__('os')",
    ] {
        let outcome = run(job(Lang::Python, code));
        match outcome.result {
            Ok(value) => failures.push(format!("{code}: got {value}")),
            Err(error) => {
                assert!(
                    matches!(error.kind, ExecErrorKind::Runtime | ExecErrorKind::Syntax),
                    "{code}: {error}"
                );
                println!("{code:?} -> {error}");
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn javascript_reaches_nothing_host_side() {
    assert_eq!(
        ok(
            Lang::JavaScript,
            "const g = (function(){}).constructor.constructor('return this')(); [typeof g.os, typeof g.std, typeof g.require]"
        ),
        json!(["undefined", "undefined", "undefined"])
    );
    assert_eq!(err(Lang::JavaScript, "require('fs')").0, ExecErrorKind::Runtime);
    assert_eq!(err(Lang::JavaScript, "import('os')").0, ExecErrorKind::Runtime);
}

#[test]
fn results_become_json() {
    assert_eq!(ok(Lang::Python, "(1, {'a': {1, 2}}, 1.5)"), json!([1, {"a": [1, 2]}, 1.5]));
    assert_eq!(ok(Lang::Python, "{1: 'x'}"), json!({"1": "x"}));
    assert_eq!(ok(Lang::Python, "None"), Value::Null);
    assert_eq!(ok(Lang::JavaScript, "({a: [1, 'b', null]})"), json!({"a": [1, "b", null]}));
    assert_eq!(ok(Lang::JavaScript, "undefined"), Value::Null);
    assert_eq!(ok(Lang::JavaScript, "Promise.resolve(5).then((x) => x + 1)"), json!(6));
    assert_eq!(ok(Lang::JavaScript, "(async () => echo({v: 1}).v + 1)()"), json!(2));
    assert_eq!(err(Lang::JavaScript, "10n").0, ExecErrorKind::Runtime);
}

/// Runs `body` in a forked child after [`crate::worker::confine`] and returns how the
/// child ended: `Ok(exit code)` or `Err(signal)`.
fn in_confined_child(body: fn() -> i32) -> Result<i32, i32> {
    // SAFETY: the child only confines itself, runs `body` (raw syscalls) and `_exit`s;
    // glibc's fork handlers keep malloc usable in the child of a threaded parent.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = match crate::worker::confine() {
            Ok(()) => body(),
            Err(_) => 99,
        };
        // SAFETY: ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child we just forked.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    if libc::WIFSIGNALED(status) { Err(libc::WTERMSIG(status)) } else { Ok(libc::WEXITSTATUS(status)) }
}

#[test]
fn confinement_allows_the_worker_its_pipe_and_memory() {
    let ended = in_confined_child(|| {
        let buffer = vec![7u8; 64 << 20];
        let message = b"";
        // SAFETY: writes zero bytes to stdout.
        let written = unsafe { libc::write(1, message.as_ptr().cast(), 0) };
        i32::from(buffer[1000] == 7 && written == 0)
    });
    assert_eq!(ended, Ok(1));
}

#[test]
fn confinement_refuses_opening_files() {
    let ended = in_confined_child(|| {
        let path = c"/etc/passwd";
        // SAFETY: a raw openat with a valid C string.
        let fd = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), libc::O_RDONLY) };
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if fd < 0 && errno == libc::EACCES { 0 } else { 1 }
    });
    assert_eq!(ended, Ok(0));
}

#[test]
fn confinement_kills_on_socket() {
    let ended = in_confined_child(|| {
        // SAFETY: a raw socket call with integer arguments.
        unsafe { libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) };
        0
    });
    assert_eq!(ended, Err(libc::SIGSYS));
}

#[test]
fn confinement_kills_on_execve() {
    let ended = in_confined_child(|| {
        let path = c"/bin/true";
        let argv = [path.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null::<libc::c_char>()];
        // SAFETY: a raw execve with valid, null-terminated arrays.
        unsafe { libc::syscall(libc::SYS_execve, path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        0
    });
    assert_eq!(ended, Err(libc::SIGSYS));
}

#[test]
fn confinement_kills_on_fork_and_kill() {
    let fork = in_confined_child(|| {
        // SAFETY: a raw clone that would fork; the filter kills first.
        unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
        0
    });
    assert_eq!(fork, Err(libc::SIGSYS));
    let kill = in_confined_child(|| {
        // SAFETY: a raw kill of the parent; the filter kills first.
        unsafe { libc::syscall(libc::SYS_kill, libc::getppid(), libc::SIGKILL) };
        0
    });
    assert_eq!(kill, Err(libc::SIGSYS));
}

#[test]
fn the_seccomp_policy_has_a_reason_per_rule_and_compiles() {
    for allowed in crate::worker::SECCOMP_POLICY {
        assert!(!allowed.reason.is_empty(), "{}", allowed.name);
    }
    for refused in crate::worker::SECCOMP_REFUSED {
        assert!(!refused.reason.is_empty(), "{}", refused.name);
    }
    assert!(crate::worker::seccomp_program(1).is_ok());
    assert!(crate::worker::seccomp_refusals().is_ok());
}

#[test]
fn lang_and_kind_names_round_trip() {
    assert_eq!("py".parse::<Lang>().ok(), Some(Lang::Python));
    assert_eq!("js".parse::<Lang>().ok(), Some(Lang::JavaScript));
    assert_eq!("ruby".parse::<Lang>().map_err(|error| error.kind), Err(ExecErrorKind::Invalid));
    for kind in ExecErrorKind::ALL {
        assert_eq!(ExecErrorKind::parse(kind.as_str()), Some(kind));
    }
}

#[test]
fn the_wire_shapes_round_trip() {
    let mut job = job(Lang::JavaScript, "1");
    job.inputs.insert("a".to_owned(), json!([1, {"b": null}]));
    let line = crate::protocol::job_to_json(&job).to_string();
    let back = crate::protocol::job_from_json(serde_json::from_str(&line).expect("json"));
    assert_eq!(back, Ok(job.clone()));
    let outcome = run(job);
    let done = crate::protocol::outcome_to_json(&outcome);
    let back = crate::protocol::outcome_from_json(done["done"].clone()).expect("outcome");
    assert_eq!(back.result, outcome.result);
    assert_eq!(back.tool_calls, outcome.tool_calls);
}

/// A host whose model answers `upper(<prompt>)`, or an error for a prompt `fail`, and
/// records every batch it was asked.
fn llm_host(batches: &mut Vec<Vec<Value>>) -> impl FnMut(&str, Value) -> Result<Value, String> + '_ {
    move |name, args| {
        if name != crate::LLM_CALL {
            return tools(name, args);
        }
        let requests = args.as_array().cloned().unwrap_or_default();
        batches.push(requests.clone());
        Ok(Value::Array(
            requests
                .iter()
                .map(|request| match request["prompt"].as_str() {
                    Some("fail") => json!({ "err": "budget exhausted: tokens would reach 9" }),
                    Some(prompt) => json!({ "ok": format!("{}{}", prompt.to_uppercase(), request["system"].as_str().map(|s| format!(" [{s}]")).unwrap_or_default()) }),
                    None => json!({ "err": "no prompt" }),
                })
                .collect(),
        ))
    }
}

#[test]
fn programs_call_the_model_with_llm_and_llm_batch_in_both_languages() {
    for (lang, code) in [
        (
            Lang::Python,
            "a = llm('hi', system='terse', max_tokens=5)\nb = llm_batch(['x', {'prompt': 'y', 'model': 'm'}], system='s')\n[a, b]",
        ),
        (
            Lang::JavaScript,
            "const a = llm('hi', {system: 'terse', max_tokens: 5}); const b = llm_batch(['x', {prompt: 'y', model: 'm'}], {system: 's'}); [a, b]",
        ),
    ] {
        let mut batches = Vec::new();
        let outcome = run_in_process(job(lang, code), &mut llm_host(&mut batches));
        assert_eq!(outcome.result.clone().unwrap(), json!(["HI [terse]", ["X [s]", "Y [s]"]]), "{lang}");
        assert_eq!(outcome.llm_calls, 3, "{lang}");
        assert!(outcome.tool_calls.is_empty(), "model calls are not tool calls");
        assert_eq!(batches.len(), 2, "{lang}: one host call per llm / llm_batch");
        assert_eq!(batches[0], vec![json!({"prompt": "hi", "system": "terse", "max_tokens": 5})], "{lang}");
        assert_eq!(batches[1][1], json!({"prompt": "y", "system": "s", "model": "m"}), "{lang}");
    }
}

#[test]
fn a_failed_model_call_is_a_catchable_error_with_the_hosts_message() {
    for (lang, code) in [
        (Lang::Python, "try:\n    llm('fail')\nexcept RuntimeError as e:\n    r = str(e)\nr"),
        (Lang::JavaScript, "let r; try { llm('fail') } catch (e) { r = e.message } r"),
    ] {
        let mut batches = Vec::new();
        let outcome = run_in_process(job(lang, code), &mut llm_host(&mut batches));
        let text = outcome.result.unwrap().as_str().unwrap_or_default().to_owned();
        assert!(text.contains("budget exhausted"), "{lang}: {text}");
    }
    for (lang, code) in
        [(Lang::Python, "llm_batch(['a', 'fail'])"), (Lang::JavaScript, "llm_batch(['a', 'fail'])")]
    {
        let mut batches = Vec::new();
        let error = run_in_process(job(lang, code), &mut llm_host(&mut batches)).result.unwrap_err();
        assert!(error.message.contains("llm_batch: prompt 1: budget exhausted"), "{lang}: {error}");
    }
    for (lang, code) in [
        (Lang::Python, "llm(3)"),
        (Lang::JavaScript, "llm(3)"),
        (Lang::Python, "llm('a', temperature=1)"),
        (Lang::Python, "llm('a', max_tokens=0)"),
        (Lang::JavaScript, "llm('a', {max_tokens: 0})"),
        (Lang::JavaScript, "llm('a', {system: 3})"),
    ] {
        let mut batches = Vec::new();
        let error = run_in_process(job(lang, code), &mut llm_host(&mut batches)).result.unwrap_err();
        assert!(error.message.contains("llm"), "{lang}: {error}");
        assert!(batches.is_empty(), "a bad call never reaches the host");
    }
}

#[test]
fn the_llm_call_limit_ends_the_program_uncatchably() {
    for (lang, code) in [
        (
            Lang::Python,
            "for i in range(10):\n    try:\n        llm('p')\n    except Exception:\n        pass\n1",
        ),
        (Lang::JavaScript, "for (let i = 0; i < 10; i++) { try { llm('p') } catch (e) {} } 1"),
        (Lang::Python, "llm_batch(['a', 'b', 'c', 'd'])"),
    ] {
        let mut job = job(lang, code);
        job.limits.max_llm_calls = 3;
        let mut batches = Vec::new();
        let outcome = run_in_process(job, &mut llm_host(&mut batches));
        let error = outcome.result.unwrap_err();
        assert_eq!(error.kind, ExecErrorKind::LlmCallLimit, "{lang}: {error}");
        assert!(error.message.contains("max_llm_calls"), "{error}");
        assert!(outcome.llm_calls <= 3);
        assert!(batches.iter().map(Vec::len).sum::<usize>() <= 3, "nothing past the limit reached the host");
    }
}

/// A waiting worker copies the pages it shares with the template, and only those: memory
/// an allocator mapped writable but never touched stays unpopulated (with jemalloc, each
/// waiting worker otherwise held megabytes of zeroed extents of its own).
#[test]
fn populating_a_worker_copies_only_the_pages_already_touched() {
    const PAGES: usize = 1024;
    let page = crate::sys::page_size();
    // SAFETY: a fresh private anonymous mapping, unmapped at the end; only its own pages
    // are touched and inspected.
    unsafe {
        let start = libc::mmap(
            std::ptr::null_mut(),
            PAGES * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(start, libc::MAP_FAILED);
        for index in [0, 1, 2, 100, 101] {
            *(start as *mut u8).add(index * page) = 1;
        }
        crate::sys::populate_writable(64 << 20);
        let mut resident = vec![0u8; PAGES];
        assert_eq!(libc::mincore(start, PAGES * page, resident.as_mut_ptr()), 0);
        let touched: Vec<usize> = (0..PAGES).filter(|&i| resident[i] & 1 == 1).collect();
        libc::munmap(start, PAGES * page);
        assert_eq!(touched, vec![0, 1, 2, 100, 101]);
    }
}
