//! The pipe protocol between the pool and a worker: one JSON object per line.
//!
//! pool → worker: the job (`{"lang", "code", "inputs", "tools", "limits"}`), then one reply
//! per tool call (`{"ok": value}` or `{"err": "text"}`).
//! worker → pool: `{"ready": true}` once confined, then tool calls (`{"call": name,
//! "args": value}`; model calls are `{"call": "$llm", "args": [requests]}`, answered
//! `{"ok": [{"ok": text} | {"err": message}, ...]}`) and finally `{"done": outcome}`. Private to this crate: both ends are
//! the same binary, so the shapes carry no version.

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::{ExecError, ExecErrorKind, ExecOutcome, Job, Lang, Limits, ToolCallRecord};

pub(crate) fn job_to_json(job: &Job) -> Value {
    json!({
        "lang": job.lang.as_str(),
        "code": job.code,
        "inputs": job.inputs,
        "tools": job.tools,
        "limits": {
            "timeout_us": u64::try_from(job.limits.timeout.as_micros()).unwrap_or(u64::MAX),
            "memory_bytes": job.limits.memory_bytes,
            "max_recursion": job.limits.max_recursion,
            "max_output_bytes": job.limits.max_output_bytes,
            "max_tool_calls": job.limits.max_tool_calls,
            "max_llm_calls": job.limits.max_llm_calls,
        },
    })
}

pub(crate) fn job_from_json(value: Value) -> Result<Job, String> {
    let Value::Object(mut map) = value else { return Err("the job is not an object".to_owned()) };
    let lang: Lang = text(&map, "lang")?.parse().map_err(|error: ExecError| error.message)?;
    let code = text(&map, "code")?.to_owned();
    let inputs = match map.remove("inputs") {
        Some(Value::Object(inputs)) => inputs,
        _ => return Err("job.inputs is not an object".to_owned()),
    };
    let tools = match map.remove("tools") {
        Some(Value::Array(tools)) => tools
            .into_iter()
            .map(|tool| match tool {
                Value::String(tool) => Ok(tool),
                _ => Err("job.tools holds a non-string".to_owned()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err("job.tools is not an array".to_owned()),
    };
    let limits = map.get("limits").and_then(Value::as_object).ok_or("job.limits is not an object")?;
    let number =
        |key: &str| limits.get(key).and_then(Value::as_u64).ok_or(format!("job.limits.{key} is missing"));
    let limits = Limits {
        timeout: Duration::from_micros(number("timeout_us")?),
        memory_bytes: number("memory_bytes")?,
        max_recursion: u32::try_from(number("max_recursion")?).unwrap_or(u32::MAX),
        max_output_bytes: usize::try_from(number("max_output_bytes")?).unwrap_or(usize::MAX),
        max_tool_calls: u32::try_from(number("max_tool_calls")?).unwrap_or(u32::MAX),
        max_llm_calls: u32::try_from(number("max_llm_calls")?).unwrap_or(u32::MAX),
    };
    Ok(Job { lang, code, inputs, tools, limits })
}

fn text<'a>(map: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    map.get(key).and_then(Value::as_str).ok_or(format!("job.{key} is not a string"))
}

pub(crate) fn outcome_to_json(outcome: &ExecOutcome) -> Value {
    let result = match &outcome.result {
        Ok(value) => json!({ "ok": value }),
        Err(error) => json!({ "err": { "kind": error.kind.as_str(), "message": error.message } }),
    };
    let calls: Vec<Value> = outcome
        .tool_calls
        .iter()
        .map(|call| json!({ "name": call.name, "args": call.args, "ok": call.ok, "duration_us": call.duration_us }))
        .collect();
    json!({
        "done": {
            "result": result,
            "stdout": outcome.stdout,
            "tool_calls": calls,
            "llm_calls": outcome.llm_calls,
            "duration_us": u64::try_from(outcome.duration.as_micros()).unwrap_or(u64::MAX),
        }
    })
}

pub(crate) fn outcome_from_json(mut done: Value) -> Result<ExecOutcome, String> {
    let mut result = done.get_mut("result").map(Value::take).unwrap_or_default();
    let result = if let Some(value) = result.get_mut("ok") {
        Ok(value.take())
    } else if let Some(error) = result.get("err") {
        let kind = error
            .get("kind")
            .and_then(Value::as_str)
            .and_then(ExecErrorKind::parse)
            .ok_or("outcome error has no known kind")?;
        let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
        Err(ExecError::new(kind, message))
    } else {
        return Err("outcome has no result".to_owned());
    };
    let stdout = done.get("stdout").and_then(Value::as_str).unwrap_or_default().to_owned();
    let tool_calls = match done.get_mut("tool_calls").map(Value::take) {
        Some(Value::Array(calls)) => calls
            .into_iter()
            .map(|mut call| ToolCallRecord {
                name: call.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                args: call.get_mut("args").map(Value::take).unwrap_or_default(),
                ok: call.get("ok").and_then(Value::as_bool).unwrap_or(false),
                duration_us: call.get("duration_us").and_then(Value::as_u64).unwrap_or(0),
            })
            .collect(),
        _ => Vec::new(),
    };
    let llm_calls = done.get("llm_calls").and_then(Value::as_u64).unwrap_or(0);
    let llm_calls = u32::try_from(llm_calls).unwrap_or(u32::MAX);
    let duration = Duration::from_micros(done.get("duration_us").and_then(Value::as_u64).unwrap_or(0));
    Ok(ExecOutcome { result, stdout, tool_calls, llm_calls, duration })
}
