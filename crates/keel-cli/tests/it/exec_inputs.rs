//! `keel exec --input-file` end to end: a few-MB log reaches the program as a string
//! without passing through the journal, the program filters it and asks the model about
//! the pieces (`llm_batch`, scripted provider), and sending the whole file in one prompt
//! is refused up front by the budget. Bad `--input-file` arguments get clear errors.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::harness::Keel;

/// A deterministic log of about 3 MB: one `ERROR` line in 97, the rest `INFO`.
fn write_log(path: &std::path::Path) -> usize {
    let mut text = String::new();
    let mut errors = 0;
    for i in 0..40_000 {
        let level = if i % 97 == 0 { "ERROR" } else { "INFO" };
        errors += usize::from(level == "ERROR");
        let _ = writeln!(
            text,
            "2026-01-01T00:{:02}:{:02}Z {level} svc-{} request {i} took {}ms",
            i / 60 % 60,
            i % 60,
            i % 7,
            i % 500
        );
    }
    std::fs::write(path, text).unwrap();
    errors
}

const PROGRAM: &str = r#"
errors = [line for line in log.split("\n") if " ERROR " in line]
chunks = ["\n".join(errors[i:i + 100]) for i in range(0, len(errors), 100)]
answers = llm_batch(["Summarise these errors:\n" + chunk for chunk in chunks], max_tokens=100)
{"errors": len(errors), "chunks": len(chunks), "answers": answers}
"#;

#[test]
fn keel_exec_input_file_gives_the_program_a_large_file_stored_once() {
    let mut keel = Keel::new();
    keel.start_daemon();
    let log = keel.data.path().join("app.log");
    let errors = write_log(&log);
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(size > 2 << 20, "a few MB: {size}");
    let script = keel.data.path().join("script.json");
    let reply = json!({"responses": [{"match": "Summarise these errors", "content": "timeouts in svc-3"}]});
    std::fs::write(&script, reply.to_string()).unwrap();
    let input = format!("log={}", log.display());
    let (script, memory) = (script.display().to_string(), (256u64 << 20).to_string());
    let args = [
        "exec",
        "--sandbox",
        "none",
        "--input-file",
        &input,
        "--llm-script",
        &script,
        "--budget-tokens",
        "200000",
        "--memory-bytes",
        &memory,
        "--json",
        "-e",
        PROGRAM,
    ];
    let out = keel.json(&args);
    assert_eq!(out["ok"], true, "{out}");
    let chunks = errors.div_ceil(100);
    assert_eq!(out["result"]["errors"], errors, "{out}");
    assert_eq!(out["result"]["answers"], json!(vec!["timeouts in svc-3"; chunks]), "{out}");
    assert_eq!(out["llm_calls"], chunks, "{out}");

    let view = keel.inspect(out["run_id"].as_str().unwrap());
    let journal = view["journal"].as_array().unwrap();
    let exec = journal.iter().find(|e| e["method"] == "code.exec").expect("a code.exec entry");
    let hash = exec["params"]["input_refs"]["log"].as_str().expect("the input named by hash").to_owned();
    assert!(hash.starts_with("sha256:") && hash.len() == 71, "{hash}");
    assert!(exec["params"].to_string().len() < 4096, "the journal holds the hash, not the file");
    let calls = journal.iter().filter(|e| e["method"] == "llm.chat" && e["params"]["exec"] == exec["seq"]);
    assert_eq!(calls.count(), chunks, "each llm call is an llm.chat of the run, marked as the program's");
    assert!(view["usage"]["input_tokens"].as_u64().unwrap() < size / 4, "only the errors reached the model");

    // The same file again is the same stored input.
    let again = keel.json(&["exec", "--sandbox", "none", "--input-file", &input, "--json", "-e", "len(log)"]);
    assert_eq!(again["result"], size, "{again}");
    let view = keel.inspect(again["run_id"].as_str().unwrap());
    let exec = view["journal"].as_array().unwrap().iter().find(|e| e["method"] == "code.exec").cloned();
    assert_eq!(exec.unwrap()["params"]["input_refs"]["log"], Value::from(hash));

    // The whole file in one prompt never fits the budget: refused before anything is sent.
    let whole = keel.run(&[
        "exec",
        "--sandbox",
        "none",
        "--input-file",
        &input,
        "--llm-script",
        &script,
        "--budget-tokens",
        "200000",
        "-e",
        "llm('Summarise these errors:\\n' + log)",
    ]);
    assert_eq!(whole.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&whole.stderr);
    assert!(stderr.contains("budget exhausted before the call"), "{stderr}");
    assert!(stderr.contains("more than the run's whole tokens budget of 200000"), "{stderr}");
    assert!(stderr.contains("--budget-tokens"), "{stderr}");

    // --max-llm-calls: a batch of 5 prompts is one too many for 4, and asks for none.
    let limited = keel.run(&[
        "exec",
        "--sandbox",
        "none",
        "--input-file",
        &input,
        "--llm-script",
        &script,
        "--max-llm-calls",
        "4",
        "--memory-bytes",
        &memory,
        "--json",
        "-e",
        PROGRAM,
    ]);
    assert_eq!(limited.status.code(), Some(1));
    let out: Value = serde_json::from_slice(&limited.stdout).expect("exec --json prints JSON");
    assert_eq!(out["error"]["kind"], "llm_call_limit", "{out}");
    let view = keel.inspect(out["run_id"].as_str().unwrap());
    let sent = view["journal"].as_array().unwrap().iter().filter(|e| e["method"] == "llm.chat").count();
    assert_eq!(sent, 0, "the batch past the limit was never sent");
}

#[test]
fn bad_input_files_are_refused_saying_what_to_do() {
    let keel = Keel::new();
    let dir = keel.data.path();
    std::fs::write(dir.join("latin1.txt"), b"caf\xe9\n").unwrap();
    let latin1 = format!("text={}", dir.join("latin1.txt").display());
    let missing = format!("text={}", dir.join("missing.txt").display());
    for (arg, expected) in [
        (latin1.as_str(), "is not UTF-8 text (invalid byte at offset 3)"),
        (missing.as_str(), "cannot read"),
        ("no-equals-sign", "write NAME=PATH"),
        ("2x=/etc/hostname", "must be an identifier"),
        ("x=", "the path is empty"),
    ] {
        let out = keel.run(&["exec", "--input-file", arg, "-e", "1"]);
        assert_eq!(out.status.code(), Some(1), "{arg}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{arg}: {stderr}");
    }
    // Over 64 MiB: refused from the file's size, before it is read.
    let big = std::fs::File::create(dir.join("big.txt")).unwrap();
    big.set_len((64 << 20) + 1).unwrap();
    let out =
        keel.run(&["exec", "--input-file", &format!("big={}", dir.join("big.txt").display()), "-e", "1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("over the limit of 67108864 (64 MiB)"), "{out:?}");
}

/// Found by the API contract check: an exec whose budget ran out parked its run as
/// `waiting(budget)` and `keel exec` (or `POST /v1/exec`) waited forever. It is stopped
/// and the caller told which budget ran out.
#[test]
fn an_exec_that_runs_out_of_budget_is_stopped_and_says_which() {
    let keel = Keel::new();
    for (flags, which) in [
        (["--budget-tool-calls", "0"], "tool calls would reach 1 of a 0 limit"),
        (["--budget-wall", "0s"], "wall-time"),
    ] {
        let mut args = vec!["exec", "-e", "echo(x=1)"];
        args.extend(flags);
        let out = keel.run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?}: {stderr}");
        assert!(stderr.contains("ran out of its budget") && stderr.contains(which), "{flags:?}: {stderr}");
    }
    let runs = keel.json(&["ps", "--json"]);
    let states: Vec<&Value> = runs.as_array().unwrap().iter().map(|r| &r["state"]).collect();
    assert_eq!(states, [&json!("cancelled"), &json!("cancelled")], "no exec run is left waiting");
}
