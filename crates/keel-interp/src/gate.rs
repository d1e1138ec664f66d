//! The tool gate both engines call through: grant check, call budget, call records and the
//! job-ending ("fatal") errors that a program must not be able to catch.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{ExecError, ExecErrorKind, LLM_CALL, LlmRequest, ToolCallRecord};

/// What a tool call from inside a program came to.
#[derive(Debug)]
pub(crate) enum GateError {
    /// The tool is not in the job's list; raised inside the program (catchable).
    NotGranted(String),
    /// The tool ran and returned an error; raised inside the program (catchable).
    Tool(String),
    /// The job must end now (tool-call budget spent); the engine makes this uncatchable.
    Fatal(ExecError),
}

/// Grant list, call budget and records for one job.
pub(crate) struct ToolGate<'a> {
    granted: Vec<String>,
    max_calls: u32,
    max_llm_calls: u32,
    /// Model calls made so far (each prompt of a batch counts).
    pub(crate) llm_calls: u32,
    call: &'a mut dyn FnMut(&str, Value) -> Result<Value, String>,
    pub(crate) records: Vec<ToolCallRecord>,
    /// Set once the job must end whatever the program does (tool-call or output limit).
    pub(crate) fatal: Option<ExecError>,
    /// The last "not granted" message raised, to classify an uncaught one as `not_granted`.
    pub(crate) last_not_granted: Option<String>,
    /// Time spent waiting for tools, which does not count against the interpreter's budget.
    pub(crate) tool_time: Duration,
}

impl<'a> ToolGate<'a> {
    pub(crate) fn new(
        granted: Vec<String>,
        limits: &crate::Limits,
        call: &'a mut dyn FnMut(&str, Value) -> Result<Value, String>,
    ) -> Self {
        ToolGate {
            granted,
            max_calls: limits.max_tool_calls,
            max_llm_calls: limits.max_llm_calls,
            llm_calls: 0,
            call,
            records: Vec::new(),
            fatal: None,
            last_not_granted: None,
            tool_time: Duration::ZERO,
        }
    }

    pub(crate) fn is_granted(&self, name: &str) -> bool {
        self.granted.iter().any(|tool| tool == name)
    }

    pub(crate) fn granted(&self) -> &[String] {
        &self.granted
    }

    /// Checks the grant and the budget, then calls the tool and records the call.
    pub(crate) fn call(&mut self, name: &str, args: Value) -> Result<Value, GateError> {
        if let Some(fatal) = &self.fatal {
            return Err(GateError::Fatal(fatal.clone()));
        }
        if !self.is_granted(name) {
            let message = format!(
                "tool {name:?} is not granted to this program; granted tools: [{}]",
                self.granted.join(", ")
            );
            self.last_not_granted = Some(message.clone());
            return Err(GateError::NotGranted(message));
        }
        if self.records.len() >= self.max_calls as usize {
            let error = ExecError::new(
                ExecErrorKind::ToolCallLimit,
                format!(
                    "the program made more than {} tool calls (calling {name:?}); batch the work into fewer \
                     calls or raise max_tool_calls",
                    self.max_calls
                ),
            );
            self.fatal = Some(error.clone());
            return Err(GateError::Fatal(error));
        }
        let started = Instant::now();
        let result = (self.call)(name, args.clone());
        let elapsed = started.elapsed();
        self.tool_time += elapsed;
        self.records.push(ToolCallRecord {
            name: name.to_owned(),
            args,
            ok: result.is_ok(),
            duration_us: u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        });
        result.map_err(GateError::Tool)
    }

    /// Checks the model-call budget, then asks the host for every request at once; the
    /// answers are in the requests' order. Passing `max_llm_calls` ends the job
    /// (uncatchable), before any of the batch is asked for.
    pub(crate) fn llm(
        &mut self,
        requests: Vec<LlmRequest>,
    ) -> Result<Vec<Result<String, String>>, GateError> {
        if let Some(fatal) = &self.fatal {
            return Err(GateError::Fatal(fatal.clone()));
        }
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let asked = u32::try_from(requests.len()).unwrap_or(u32::MAX);
        if self.llm_calls.saturating_add(asked) > self.max_llm_calls {
            let error = ExecError::new(
                ExecErrorKind::LlmCallLimit,
                format!(
                    "the program asked for more than {} LLM calls ({} made, {asked} more asked); filter or \
                     chunk the input into fewer calls, or raise max_llm_calls (--max-llm-calls)",
                    self.max_llm_calls, self.llm_calls
                ),
            );
            self.fatal = Some(error.clone());
            return Err(GateError::Fatal(error));
        }
        self.llm_calls += asked;
        let count = requests.len();
        let args: Vec<Value> = requests
            .into_iter()
            .map(|request| serde_json::to_value(request).unwrap_or(Value::Null))
            .collect();
        let started = Instant::now();
        let answer = (self.call)(LLM_CALL, Value::Array(args));
        self.tool_time += started.elapsed();
        let items = match answer {
            Ok(Value::Array(items)) if items.len() == count => items,
            Ok(_) => return Err(GateError::Tool("the host answered the LLM calls out of shape".to_owned())),
            Err(message) => return Err(GateError::Tool(message)),
        };
        Ok(items
            .into_iter()
            .map(|item| match (item.get("ok").and_then(Value::as_str), item.get("err")) {
                (Some(text), _) => Ok(text.to_owned()),
                (None, Some(Value::String(message))) => Err(message.clone()),
                _ => Err("the host answered an LLM call out of shape".to_owned()),
            })
            .collect())
    }

    /// Classifies an uncaught program error: a fatal gate error wins, then an uncaught
    /// "not granted" error, then what the engine says.
    pub(crate) fn classify(&self, kind: ExecErrorKind, message: String) -> ExecError {
        if let Some(fatal) = &self.fatal {
            return fatal.clone();
        }
        if let Some(not_granted) = &self.last_not_granted
            && message.contains(not_granted.as_str())
        {
            return ExecError::new(ExecErrorKind::NotGranted, message);
        }
        ExecError::new(kind, message)
    }
}
