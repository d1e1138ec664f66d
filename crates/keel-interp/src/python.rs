//! The Python engine: monty's suspendable VM, with tools answered through name lookups,
//! host namespace objects and external function calls.

use std::{collections::HashMap, time::Instant};

use monty::{MontyRun, RunProgress};
use monty_types::{
    CompileOptions, DictPairs, ExcType, MontyClassInstance, MontyClassType, MontyException, MontyObject,
    MontyUuid, NameLookupResult, PrintWriter, ResourceLimits, ResourceTracker,
};
use serde_json::Value;

use crate::{
    ExecError, ExecErrorKind, ExecOutcome, Job, LlmRequest,
    gate::{GateError, ToolGate},
    tool_path,
};

/// Deepest JSON value converted either way.
pub(crate) const MAX_VALUE_DEPTH: usize = 128;

/// The generic entry point every program has.
const CALL_TOOL: &str = "call_tool";
/// `llm(prompt, system=None, model=None, max_tokens=None)`: one model call, its text.
const LLM: &str = "llm";
/// `llm_batch(prompts, system=None, model=None, max_tokens=None)`: several, concurrently.
const LLM_BATCH: &str = "llm_batch";

/// Maps the names a program can look up to tools and tool namespaces.
struct ToolNames {
    /// Dotted program path (`mcp.fs.read_file`) → the tool's real name (`mcp:fs/read_file`).
    tools: HashMap<String, String>,
    /// Dotted namespace prefixes (`mcp`, `mcp.fs`) that have tools below them.
    namespaces: Vec<String>,
    /// Namespace objects handed out, by their uuid.
    handed_out: HashMap<MontyUuid, String>,
}

impl ToolNames {
    fn new(granted: &[String]) -> Self {
        let mut tools = HashMap::new();
        let mut namespaces = Vec::new();
        for name in granted {
            let path = tool_path(name);
            for depth in 1..path.len() {
                let prefix = path[..depth].join(".");
                if !namespaces.contains(&prefix) {
                    namespaces.push(prefix);
                }
            }
            tools.insert(path.join("."), name.clone());
        }
        ToolNames { tools, namespaces, handed_out: HashMap::new() }
    }

    /// Answers a name lookup: a tool function, a namespace object, or nothing.
    fn lookup(&mut self, path: String) -> Option<MontyObject> {
        if let Some(tool) = self.tools.get(&path) {
            return Some(MontyObject::Function { name: tool.clone(), docstring: None });
        }
        if !self.namespaces.contains(&path) {
            return None;
        }
        let counter = u128::try_from(self.handed_out.len() + 1).unwrap_or(u128::MAX);
        let id =
            MontyUuid::try_from_slice(&(0x6b65_656c_0000_0000_0000_0000_0000_0000 | counter).to_be_bytes())?;
        self.handed_out.insert(id, path.clone());
        Some(MontyObject::ClassInstance(Box::new(MontyClassInstance {
            class_type: MontyClassType {
                name: "ToolNamespace".to_owned(),
                id,
                host_defined: true,
                is_dataclass: false,
                attrs: DictPairs::from(Vec::new()),
            },
            instance_id: id,
            attrs: DictPairs::from(Vec::new()),
        })))
    }
}

pub(crate) fn run(job: Job, call: &mut dyn FnMut(&str, Value) -> Result<Value, String>) -> ExecOutcome {
    let started = Instant::now();
    let mut stdout = String::new();
    let mut gate = ToolGate::new(job.tools.clone(), &job.limits, call);
    let result = run_program(&job, &mut gate, &mut stdout);
    let llm_calls = gate.llm_calls;
    ExecOutcome { result, stdout, tool_calls: gate.records, llm_calls, duration: started.elapsed() }
}

fn run_program(job: &Job, gate: &mut ToolGate<'_>, stdout: &mut String) -> Result<Value, ExecError> {
    let mut input_names = Vec::with_capacity(job.inputs.len());
    let mut input_values = Vec::with_capacity(job.inputs.len());
    for (name, value) in &job.inputs {
        input_names.push(name.clone());
        input_values.push(json_to_monty(value, 0).map_err(|message| {
            ExecError::new(ExecErrorKind::Invalid, format!("input {name:?}: {message}"))
        })?);
    }
    let runner = MontyRun::new(job.code.clone(), "main.py", input_names, CompileOptions::default()).map_err(
        |exception| {
            let kind = match exception.exc_type() {
                ExcType::SyntaxError => ExecErrorKind::Syntax,
                _ => ExecErrorKind::Invalid,
            };
            ExecError::new(kind, exception.to_string())
        },
    )?;
    let limits = ResourceLimits {
        max_duration: Some(job.limits.timeout),
        max_memory: None,
        gc_interval: None,
        max_recursion_depth: job.limits.max_recursion as usize,
        max_suspensions: usize::MAX,
    };
    let max_output = Some(job.limits.max_output_bytes);
    let mut names = ToolNames::new(gate.granted());
    let mut progress = runner.start(
        input_values,
        ResourceTracker::new(limits),
        PrintWriter::CollectString(stdout, max_output),
    );
    loop {
        let step = match progress {
            Err(exception) => return Err(classify(gate, &exception, stdout, job.limits.max_output_bytes)),
            Ok(step) => step,
        };
        progress = match step {
            RunProgress::Complete(value) => {
                if let Some(fatal) = &gate.fatal {
                    return Err(fatal.clone());
                }
                return monty_to_json(&value, 0).map_err(|message| {
                    ExecError::new(ExecErrorKind::Runtime, format!("the program's result {message}"))
                });
            }
            RunProgress::NameLookup(lookup) => {
                let path = match lookup.object_id() {
                    Some(id) => names.handed_out.get(&id).map(|prefix| format!("{prefix}.{}", lookup.name)),
                    None if [CALL_TOOL, LLM, LLM_BATCH].contains(&lookup.name.as_str()) => {
                        let function = MontyObject::Function { name: lookup.name.clone(), docstring: None };
                        progress = lookup.resume(function, PrintWriter::CollectString(stdout, max_output));
                        continue;
                    }
                    None => Some(lookup.name.clone()),
                };
                let answer = path.and_then(|path| names.lookup(path));
                let writer = PrintWriter::CollectString(stdout, max_output);
                match answer {
                    Some(value) => lookup.resume(value, writer),
                    None => lookup.resume(NameLookupResult::Undefined, writer),
                }
            }
            RunProgress::FunctionCall(function)
                if function.object_id.is_none()
                    && [LLM, LLM_BATCH].contains(&function.function_name.as_str()) =>
            {
                let writer = PrintWriter::CollectString(stdout, max_output);
                let batch = function.function_name == LLM_BATCH;
                let requests = match llm_requests(&function, batch) {
                    Ok(requests) => requests,
                    Err(message) => {
                        let exception = MontyException::new(ExcType::TypeError, Some(message));
                        progress = function.resume(exception, writer);
                        continue;
                    }
                };
                match gate.llm(requests) {
                    Ok(answers) => match llm_answer(answers, batch) {
                        Ok(value) => function.resume(value, writer),
                        Err(message) => {
                            function.resume(MontyException::new(ExcType::RuntimeError, Some(message)), writer)
                        }
                    },
                    Err(GateError::Tool(message) | GateError::NotGranted(message)) => {
                        function.resume(MontyException::new(ExcType::RuntimeError, Some(message)), writer)
                    }
                    Err(GateError::Fatal(error)) => {
                        let exception =
                            MontyException::new(ExcType::RuntimeError, Some(error.message.clone()));
                        function.abort(exception, writer)
                    }
                }
            }
            RunProgress::FunctionCall(function) => {
                let writer = PrintWriter::CollectString(stdout, max_output);
                let request = match tool_request(&function, &names) {
                    Ok(request) => request,
                    Err((exc_type, message)) => {
                        progress = function.resume(MontyException::new(exc_type, Some(message)), writer);
                        continue;
                    }
                };
                match gate.call(&request.0, request.1) {
                    Ok(value) => match json_to_monty(&value, 0) {
                        Ok(object) => function.resume(object, writer),
                        Err(message) => function.resume(
                            MontyException::new(
                                ExcType::RuntimeError,
                                Some(format!("the tool's result {message}")),
                            ),
                            writer,
                        ),
                    },
                    Err(GateError::Tool(message)) => {
                        function.resume(MontyException::new(ExcType::RuntimeError, Some(message)), writer)
                    }
                    Err(GateError::NotGranted(message)) => {
                        function.resume(MontyException::new(ExcType::PermissionError, Some(message)), writer)
                    }
                    Err(GateError::Fatal(error)) => {
                        let exception =
                            MontyException::new(ExcType::RuntimeError, Some(error.message.clone()));
                        function.abort(exception, writer)
                    }
                }
            }
            RunProgress::OsCall(os_call) => os_call.resume(
                MontyException::new(
                    ExcType::PermissionError,
                    Some(
                        "programs have no filesystem, network or OS access; use the granted tools".to_owned(),
                    ),
                ),
                PrintWriter::CollectString(stdout, max_output),
            ),
            RunProgress::ResolveFutures(futures) => futures.abort(
                MontyException::new(
                    ExcType::RuntimeError,
                    Some("async code is not supported; call tools directly, they return values".to_owned()),
                ),
                PrintWriter::CollectString(stdout, max_output),
            ),
        };
    }
}

/// The requests of a suspended `llm(...)` or `llm_batch(...)`, or why the call is wrong.
fn llm_requests(function: &monty::FunctionCall, batch: bool) -> Result<Vec<LlmRequest>, String> {
    let name = if batch { LLM_BATCH } else { LLM };
    let usage = if batch {
        "llm_batch(prompts, system=None, model=None, max_tokens=None) takes a list of prompts (strings, or \
         dicts with prompt, system, model, max_tokens)"
    } else {
        "llm(prompt, system=None, model=None, max_tokens=None) takes the prompt as a string"
    };
    let mut defaults = LlmRequest { prompt: String::new(), system: None, model: None, max_tokens: None };
    let positional_options = function.args.get(1..).unwrap_or_default();
    if positional_options.len() > 3 {
        return Err(format!("{name}() takes at most 4 arguments; {usage}"));
    }
    let option_names = ["system", "model", "max_tokens"];
    for (index, value) in positional_options.iter().enumerate() {
        set_option(&mut defaults, option_names[index], value, name)?;
    }
    for (key, value) in &function.kwargs {
        let MontyObject::String(key) = key else {
            return Err(format!("{name}(): keyword argument names must be strings"));
        };
        set_option(&mut defaults, key, value, name)?;
    }
    let first =
        function.args.first().ok_or_else(|| format!("{name}() is missing its first argument; {usage}"))?;
    if !batch {
        let MontyObject::String(prompt) = first else {
            return Err(format!("{name}(): the prompt must be a string; {usage}"));
        };
        return Ok(vec![LlmRequest { prompt: prompt.clone(), ..defaults }]);
    }
    let (MontyObject::List(items) | MontyObject::Tuple(items)) = first else {
        return Err(format!("{name}(): the prompts must be a list; {usage}"));
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| match item {
            MontyObject::String(prompt) => Ok(LlmRequest { prompt: prompt.clone(), ..defaults.clone() }),
            MontyObject::Dict(pairs) => {
                let mut request = defaults.clone();
                let mut prompt = None;
                for (key, value) in pairs.clone() {
                    match (key, value) {
                        (MontyObject::String(key), MontyObject::String(text)) if key == "prompt" => {
                            prompt = Some(text);
                        }
                        (MontyObject::String(key), value) if key != "prompt" => {
                            set_option(&mut request, &key, &value, name)?;
                        }
                        _ => return Err(format!("{name}(): prompt {index}: `prompt` must be a string")),
                    }
                }
                request.prompt =
                    prompt.ok_or_else(|| format!("{name}(): prompt {index} has no `prompt`; {usage}"))?;
                Ok(request)
            }
            _ => Err(format!("{name}(): prompt {index} is neither a string nor a dict; {usage}")),
        })
        .collect()
}

/// Sets `system`, `model` or `max_tokens` of a request from a program's value (`None`
/// leaves it unset).
fn set_option(request: &mut LlmRequest, key: &str, value: &MontyObject, name: &str) -> Result<(), String> {
    let text = |value: &MontyObject| match value {
        MontyObject::None => Ok(None),
        MontyObject::String(text) => Ok(Some(text.clone())),
        _ => Err(format!("{name}(): `{key}` must be a string or None")),
    };
    match key {
        "system" => request.system = text(value)?,
        "model" => request.model = text(value)?,
        "max_tokens" => {
            request.max_tokens = match value {
                MontyObject::None => None,
                MontyObject::Int(tokens) if *tokens > 0 => Some(u32::try_from(*tokens).unwrap_or(u32::MAX)),
                _ => return Err(format!("{name}(): `max_tokens` must be a positive int or None")),
            }
        }
        other => {
            return Err(format!(
                "{name}() got an unexpected keyword argument {other:?}; it takes system, model, max_tokens"
            ));
        }
    }
    Ok(())
}

/// The program's value for the answers: `llm` returns the text, `llm_batch` the list of
/// texts; a failed call raises (a batch names the first failed prompt).
fn llm_answer(answers: Vec<Result<String, String>>, batch: bool) -> Result<MontyObject, String> {
    let mut texts = Vec::with_capacity(answers.len());
    for (index, answer) in answers.into_iter().enumerate() {
        match answer {
            Ok(text) => texts.push(MontyObject::String(text)),
            Err(message) if batch => return Err(format!("llm_batch: prompt {index}: {message}")),
            Err(message) => return Err(message),
        }
    }
    if batch { Ok(MontyObject::List(texts)) } else { texts.pop().ok_or_else(|| "no answer".to_owned()) }
}

/// Turns a suspended call into a tool name and its JSON arguments.
fn tool_request(
    function: &monty::FunctionCall,
    names: &ToolNames,
) -> Result<(String, Value), (ExcType, String)> {
    let type_error = |message: String| (ExcType::TypeError, message);
    let (name, positional) = match function.object_id {
        Some(id) => {
            let prefix = names
                .handed_out
                .get(&id)
                .ok_or((ExcType::AttributeError, "unknown tool namespace".to_owned()))?;
            let path = format!("{prefix}.{}", function.function_name);
            let name = names.tools.get(&path).cloned().unwrap_or(path);
            (name, &function.args[..])
        }
        None if function.function_name == CALL_TOOL => match function.args.first() {
            Some(MontyObject::String(name)) => (name.clone(), &function.args[1..]),
            _ => {
                return Err(type_error(
                    "call_tool(name, args) needs the tool's name as its first argument".to_owned(),
                ));
            }
        },
        None => {
            let name = &function.function_name;
            let known = names.tools.contains_key(name) || names.tools.values().any(|tool| tool == name);
            if !known {
                return Err((ExcType::NameError, format!("name '{name}' is not defined")));
            }
            (name.clone(), &function.args[..])
        }
    };
    let mut args = serde_json::Map::new();
    match positional {
        [] => {}
        [MontyObject::Dict(pairs)] => {
            if let Value::Object(map) =
                monty_to_json(&MontyObject::Dict(pairs.clone()), 0).map_err(type_error)?
            {
                args = map;
            }
        }
        _ => {
            return Err(type_error(format!(
                "tool {name:?} takes keyword arguments or one dict, e.g. {name}(path=\"a.txt\")"
            )));
        }
    }
    for (key, value) in &function.kwargs {
        let MontyObject::String(key) = key else {
            return Err(type_error("keyword argument names must be strings".to_owned()));
        };
        args.insert(key.clone(), monty_to_json(value, 0).map_err(type_error)?);
    }
    Ok((name, Value::Object(args)))
}

/// Classifies an exception that ended the program.
fn classify(gate: &ToolGate<'_>, exception: &MontyException, stdout: &str, max_output: usize) -> ExecError {
    let message = exception.to_string();
    let summary = exception.message().unwrap_or_default();
    let kind = match exception.exc_type() {
        ExcType::SyntaxError => ExecErrorKind::Syntax,
        ExcType::RecursionError => ExecErrorKind::Recursion,
        ExcType::TimeoutError if summary.contains("time limit") => ExecErrorKind::Timeout,
        ExcType::MemoryError
            if stdout.len() >= max_output.saturating_sub(4096) && summary.contains("memory") =>
        {
            return ExecError::new(
                ExecErrorKind::OutputLimit,
                format!(
                    "the program printed more than {max_output} bytes; print less or raise max_output_bytes"
                ),
            );
        }
        ExcType::MemoryError => ExecErrorKind::Memory,
        _ => ExecErrorKind::Runtime,
    };
    let hint = match kind {
        ExecErrorKind::Timeout => {
            "\nthe program used up its interpreter time; make it do less work or raise the timeout"
        }
        ExecErrorKind::Recursion => "\nthe program recursed too deeply; recurse less or raise max_recursion",
        ExecErrorKind::Memory => "\nthe program needed too much memory; use less or raise memory_bytes",
        _ => "",
    };
    gate.classify(kind, format!("{}{hint}", message.trim_end()))
}

/// JSON → a monty value.
pub(crate) fn json_to_monty(value: &Value, depth: usize) -> Result<MontyObject, String> {
    if depth > MAX_VALUE_DEPTH {
        return Err(format!("nests deeper than {MAX_VALUE_DEPTH} levels"));
    }
    Ok(match value {
        Value::Null => MontyObject::None,
        Value::Bool(flag) => MontyObject::Bool(*flag),
        Value::Number(number) => match number.as_i64() {
            Some(int) => MontyObject::Int(int),
            None => MontyObject::Float(number.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(text) => MontyObject::String(text.clone()),
        Value::Array(items) => MontyObject::List(
            items.iter().map(|item| json_to_monty(item, depth + 1)).collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => MontyObject::Dict(
            map.iter()
                .map(|(key, item)| Ok((MontyObject::String(key.clone()), json_to_monty(item, depth + 1)?)))
                .collect::<Result<Vec<_>, String>>()?
                .into(),
        ),
    })
}

/// A monty value → JSON; values without a JSON form become their repr.
pub(crate) fn monty_to_json(value: &MontyObject, depth: usize) -> Result<Value, String> {
    if depth > MAX_VALUE_DEPTH {
        return Err(format!("nests deeper than {MAX_VALUE_DEPTH} levels"));
    }
    Ok(match value {
        MontyObject::None => Value::Null,
        MontyObject::Bool(flag) => Value::Bool(*flag),
        MontyObject::Int(int) => Value::from(*int),
        MontyObject::Float(float) => serde_json::Number::from_f64(*float).map_or(Value::Null, Value::Number),
        MontyObject::String(text) => Value::String(text.clone()),
        MontyObject::List(items)
        | MontyObject::Tuple(items)
        | MontyObject::Set(items)
        | MontyObject::FrozenSet(items)
        | MontyObject::NamedTuple { values: items, .. } => {
            Value::Array(items.iter().map(|item| monty_to_json(item, depth + 1)).collect::<Result<_, _>>()?)
        }
        MontyObject::Dict(pairs) => {
            let mut map = serde_json::Map::new();
            for (key, item) in pairs.clone() {
                let key = match key {
                    MontyObject::String(text) => text,
                    other => other.to_string(),
                };
                map.insert(key, monty_to_json(&item, depth + 1)?);
            }
            Value::Object(map)
        }
        other => Value::String(other.to_string()),
    })
}
