//! The JavaScript engine: QuickJS (rquickjs) with tools as blocking host functions behind a
//! small JavaScript prelude that builds `call_tool`, the tool namespaces and `console`.

use std::{
    cell::RefCell,
    rc::Rc,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use rquickjs::{Context, Ctx, Exception, Function, Object, Promise, Runtime, Value as JsValue};
use serde_json::Value;

use crate::{
    ExecError, ExecErrorKind, ExecOutcome, Job,
    gate::{GateError, ToolGate},
};

/// Builds the program's view of the tools. Called once with the raw host functions and the
/// granted names; it keeps its own references to `JSON`, so a program that replaces
/// `JSON.parse` only breaks itself.
const PRELUDE: &str = r#"(function (raw, print, tools, rawLlm) {
  const parse = JSON.parse, stringify = JSON.stringify;
  const call_tool = function (name, args) {
    if (typeof name !== 'string') throw new TypeError('call_tool(name, args) needs the tool name as a string');
    const text = stringify(args === undefined ? {} : args);
    return parse(raw(name, text === undefined ? 'null' : text));
  };
  for (const tool of tools) {
    const path = tool.split(/[.:\/]/).map((segment) => segment.replace(/-/g, '_'));
    let target = globalThis;
    for (let i = 0; i < path.length - 1; i++) {
      const segment = path[i];
      if (typeof target[segment] !== 'object' || target[segment] === null) target[segment] = {};
      target = target[segment];
    }
    target[path[path.length - 1]] = function (args) { return call_tool(tool, args); };
  }
  globalThis.call_tool = call_tool;
  const options = function (name, given) {
    if (given === undefined || given === null) return {};
    if (typeof given !== 'object') throw new TypeError(name + '(): options must be an object {system, model, max_tokens}');
    return given;
  };
  const request = function (prompt, item, defaults) {
    const pick = (key) => (item[key] === undefined ? defaults[key] : item[key]);
    return { prompt: prompt, system: pick('system'), model: pick('model'), max_tokens: pick('max_tokens') };
  };
  const ask = function (requests) { return parse(rawLlm(stringify(requests))); };
  globalThis.llm = function (prompt, given) {
    if (typeof prompt !== 'string') throw new TypeError('llm(prompt, {system, model, max_tokens}) takes the prompt as a string');
    const answer = ask([request(prompt, options('llm', given), {})])[0];
    if (answer.err !== undefined) throw new Error(answer.err);
    return answer.ok;
  };
  globalThis.llm_batch = function (prompts, given) {
    if (!Array.isArray(prompts)) throw new TypeError('llm_batch(prompts, {system, model, max_tokens}) takes an array of prompts (strings, or objects with prompt, system, model, max_tokens)');
    const defaults = options('llm_batch', given);
    const requests = prompts.map(function (item, index) {
      if (typeof item === 'string') return request(item, {}, defaults);
      if (item !== null && typeof item === 'object' && typeof item.prompt === 'string') return request(item.prompt, item, defaults);
      throw new TypeError('llm_batch(): prompt ' + index + ' is neither a string nor an object with a string `prompt`');
    });
    if (requests.length === 0) return [];
    return ask(requests).map(function (answer, index) {
      if (answer.err !== undefined) throw new Error('llm_batch: prompt ' + index + ': ' + answer.err);
      return answer.ok;
    });
  };
  const show = (item) => {
    if (typeof item === 'string') return item;
    if (item !== null && typeof item === 'object') {
      try { return stringify(item); } catch (error) { return String(item); }
    }
    return String(item);
  };
  const log = function (...items) { print(items.map(show).join(' ') + '\n'); };
  globalThis.console = { log: log, info: log, warn: log, error: log, debug: log };
})"#;

/// State the interrupt handler reads from QuickJS's side (it must be `Send + 'static`).
struct Clock {
    started: Instant,
    budget: Duration,
    /// Microseconds spent waiting for tools, which the budget does not count.
    tool_us: AtomicU64,
    timed_out: AtomicBool,
    /// The job must end now (tool-call or output limit): interrupt whatever runs.
    stop: AtomicBool,
}

impl Clock {
    fn expired(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return true;
        }
        let waited = Duration::from_micros(self.tool_us.load(Ordering::Relaxed));
        if self.started.elapsed().saturating_sub(waited) > self.budget {
            self.timed_out.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// What the host functions share: the gate, the captured output and the clock.
struct Host {
    gate: ToolGate<'static>,
    stdout: String,
    max_output: usize,
    clock: Arc<Clock>,
}

/// A QuickJS runtime and a fresh context, created before the job so a worker can pay for
/// them while it waits to be claimed.
pub(crate) struct Engine {
    runtime: Runtime,
    context: Context,
}

impl Engine {
    pub(crate) fn new() -> Result<Engine, ExecError> {
        let runtime = Runtime::new().map_err(engine_error)?;
        let context = Context::full(&runtime).map_err(engine_error)?;
        Ok(Engine { runtime, context })
    }
}

fn engine_error(error: rquickjs::Error) -> ExecError {
    ExecError::new(ExecErrorKind::WorkerCrashed, format!("could not start the JavaScript engine: {error}"))
}

pub(crate) fn run(job: Job, call: &mut dyn FnMut(&str, Value) -> Result<Value, String>) -> ExecOutcome {
    run_on(Engine::new(), job, call)
}

/// Runs `job` on a prepared engine (used once, then dropped).
pub(crate) fn run_on(
    engine: Result<Engine, ExecError>,
    job: Job,
    call: &mut dyn FnMut(&str, Value) -> Result<Value, String>,
) -> ExecOutcome {
    let started = Instant::now();
    // SAFETY: the 'static lifetime is a lie told only to QuickJS's host functions, which
    // must be 'static. Every clone of `host` lives in `host` itself or in a host function
    // owned by `runtime`; both are dropped at the end of `run_with_host` below, before
    // this function returns and `call`'s real borrow ends. The check after that proves it.
    let call: &'static mut (dyn FnMut(&str, Value) -> Result<Value, String> + 'static) =
        unsafe { std::mem::transmute(call) };
    let clock = Arc::new(Clock {
        started,
        budget: job.limits.timeout,
        tool_us: AtomicU64::new(0),
        timed_out: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let host = Rc::new(RefCell::new(Host {
        gate: ToolGate::new(job.tools.clone(), &job.limits, call),
        stdout: String::new(),
        max_output: job.limits.max_output_bytes,
        clock: clock.clone(),
    }));
    let result = engine.and_then(|engine| run_with_host(engine, &job, &host, &clock));
    let Ok(host) = Rc::try_unwrap(host) else {
        // A host function outlived its runtime: the transmuted borrow could be used later.
        std::process::abort();
    };
    let host = host.into_inner();
    let llm_calls = host.gate.llm_calls;
    ExecOutcome {
        result,
        stdout: host.stdout,
        tool_calls: host.gate.records,
        llm_calls,
        duration: started.elapsed(),
    }
}

fn run_with_host(
    engine: Engine,
    job: &Job,
    host: &Rc<RefCell<Host>>,
    clock: &Arc<Clock>,
) -> Result<Value, ExecError> {
    let Engine { runtime, context } = engine;
    // The inputs live in QuickJS's heap too; they are the job's data, not its allocations.
    let memory = usize::try_from(job.limits.memory_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(crate::input_bytes(&job.inputs).saturating_mul(2));
    runtime.set_memory_limit(memory);
    let stack = (job.limits.max_recursion as usize).saturating_mul(4096).clamp(256 << 10, 8 << 20);
    runtime.set_max_stack_size(stack);
    let interrupt_clock = clock.clone();
    runtime.set_interrupt_handler(Some(Box::new(move || interrupt_clock.expired())));
    let result = context.with(|ctx| evaluate(&ctx, job, host));
    // A limit that ended the job wins even if the program caught the error it raised.
    let fatal = host.borrow().gate.fatal.clone();
    let result = match (result, fatal) {
        (_, Some(fatal)) => Err(fatal),
        (result, None) => result,
    };
    let result = result.map_err(|error| {
        let host = host.borrow();
        if let Some(fatal) = &host.gate.fatal {
            return fatal.clone();
        }
        if clock.timed_out.load(Ordering::Relaxed) {
            return ExecError::new(
                ExecErrorKind::Timeout,
                format!(
                    "the program ran longer than its {:?} of interpreter time and was stopped; make it do less \
                     work per job or raise the timeout",
                    job.limits.timeout
                ),
            );
        }
        host.gate.classify(error.kind, error.message)
    });
    drop(context);
    drop(runtime);
    result
}

fn evaluate<'js>(ctx: &Ctx<'js>, job: &Job, host: &Rc<RefCell<Host>>) -> Result<Value, ExecError> {
    let caught = |error: rquickjs::Error| describe(ctx, error);
    let globals = ctx.globals();
    for (name, value) in &job.inputs {
        let value = ctx.json_parse(value.to_string()).map_err(caught)?;
        globals.set(name.as_str(), value).map_err(caught)?;
    }
    let call_host = host.clone();
    let raw = Function::new(ctx.clone(), move |ctx: Ctx<'js>, name: String, args: String| {
        tool_call(&ctx, &call_host, &name, &args)
    })
    .map_err(caught)?;
    let print_host = host.clone();
    let print = Function::new(ctx.clone(), move |ctx: Ctx<'js>, text: String| {
        let mut host = print_host.borrow_mut();
        if host.stdout.len().saturating_add(text.len()) > host.max_output {
            let message = format!(
                "the program printed more than {} bytes; print less or raise max_output_bytes",
                host.max_output
            );
            host.gate.fatal = Some(ExecError::new(ExecErrorKind::OutputLimit, message.clone()));
            host.clock.stop.store(true, Ordering::Relaxed);
            return Err(Exception::throw_internal(&ctx, &message));
        }
        host.stdout.push_str(&text);
        Ok(())
    })
    .map_err(caught)?;
    let llm_host = host.clone();
    let raw_llm = Function::new(ctx.clone(), move |ctx: Ctx<'js>, requests: String| {
        llm_call(&ctx, &llm_host, &requests)
    })
    .map_err(caught)?;
    let prelude: Function = ctx.eval(PRELUDE).map_err(caught)?;
    let tools = job.tools.clone();
    prelude.call::<_, ()>((raw, print, tools, raw_llm)).map_err(caught)?;

    let mut value: JsValue = ctx.eval(job.code.as_bytes().to_vec()).map_err(caught)?;
    if value.is_promise() {
        let promise = Promise::from_value(value).map_err(caught)?;
        value = promise.finish::<JsValue>().map_err(|error| match error {
            rquickjs::Error::WouldBlock => ExecError::new(
                ExecErrorKind::Runtime,
                "the program's result is a promise that never settles (nothing left to run)",
            ),
            error => describe(ctx, error),
        })?;
    }
    let Some(text) = ctx.json_stringify(value).map_err(caught)? else {
        return Ok(Value::Null);
    };
    let text = text.to_string().map_err(caught)?;
    serde_json::from_str(&text).map_err(|error| {
        ExecError::new(ExecErrorKind::Runtime, format!("the program's result has no JSON form: {error}"))
    })
}

/// The `raw(name, argsJson)` host function behind every tool.
fn tool_call<'js>(
    ctx: &Ctx<'js>,
    host: &Rc<RefCell<Host>>,
    name: &str,
    args: &str,
) -> rquickjs::Result<String> {
    let args: Value = serde_json::from_str(args)
        .map_err(|error| Exception::throw_type(ctx, &format!("tool arguments are not JSON: {error}")))?;
    // The borrow is held across the tool call: nothing in this job runs meanwhile.
    let mut host = host.borrow_mut();
    let started = Instant::now();
    let outcome = host.gate.call(name, args);
    let waited = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    host.clock.tool_us.fetch_add(waited, Ordering::Relaxed);
    match outcome {
        Ok(value) => Ok(value.to_string()),
        Err(GateError::Tool(message) | GateError::NotGranted(message)) => {
            Err(Exception::throw_message(ctx, &message))
        }
        Err(GateError::Fatal(error)) => {
            host.clock.stop.store(true, Ordering::Relaxed);
            Err(Exception::throw_internal(ctx, &error.message))
        }
    }
}

/// The `rawLlm(requestsJson)` host function behind `llm` and `llm_batch`: the answers as
/// a JSON array of `{ok: text}` / `{err: message}`.
fn llm_call<'js>(ctx: &Ctx<'js>, host: &Rc<RefCell<Host>>, requests: &str) -> rquickjs::Result<String> {
    let requests: Vec<crate::LlmRequest> = serde_json::from_str(requests).map_err(|error| {
        Exception::throw_type(
            ctx,
            &format!("llm options: {error} (system and model are strings, max_tokens a positive integer)"),
        )
    })?;
    if requests.iter().any(|request| request.max_tokens == Some(0)) {
        return Err(Exception::throw_type(ctx, "llm options: max_tokens must be a positive integer"));
    }
    let mut host = host.borrow_mut();
    let started = Instant::now();
    let outcome = host.gate.llm(requests);
    let waited = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    host.clock.tool_us.fetch_add(waited, Ordering::Relaxed);
    match outcome {
        Ok(answers) => {
            let answers: Vec<Value> = answers
                .into_iter()
                .map(|answer| match answer {
                    Ok(text) => serde_json::json!({ "ok": text }),
                    Err(message) => serde_json::json!({ "err": message }),
                })
                .collect();
            Ok(Value::Array(answers).to_string())
        }
        Err(GateError::Tool(message) | GateError::NotGranted(message)) => {
            Err(Exception::throw_message(ctx, &message))
        }
        Err(GateError::Fatal(error)) => {
            host.clock.stop.store(true, Ordering::Relaxed);
            Err(Exception::throw_internal(ctx, &error.message))
        }
    }
}

/// Turns a QuickJS error (usually a thrown value) into a kind and message.
fn describe(ctx: &Ctx<'_>, error: rquickjs::Error) -> ExecError {
    if !matches!(error, rquickjs::Error::Exception) {
        return ExecError::new(ExecErrorKind::Runtime, error.to_string());
    }
    let thrown = ctx.catch();
    let Some(object) = thrown.as_object() else {
        let text = ctx
            .json_stringify(thrown.clone())
            .ok()
            .flatten()
            .and_then(|text| text.to_string().ok())
            .unwrap_or_else(|| "a non-JSON value".to_owned());
        let kind = if thrown.is_null() { ExecErrorKind::Memory } else { ExecErrorKind::Runtime };
        return ExecError::new(kind, format!("uncaught exception: {text}"));
    };
    let name: String =
        object.get::<_, Option<String>>("name").ok().flatten().unwrap_or_else(|| "Error".to_owned());
    let exception = Exception::from_object(Object::clone(object));
    let message = exception.as_ref().and_then(Exception::message).unwrap_or_default();
    let stack = exception.as_ref().and_then(Exception::stack).unwrap_or_default();
    let too_big = ["out of memory", "invalid string length", "invalid repeat count", "invalid array length"];
    let kind = if too_big.iter().any(|text| message.contains(text)) {
        ExecErrorKind::Memory
    } else if message.contains("stack overflow") || message.contains("Maximum call stack") {
        ExecErrorKind::Recursion
    } else if message == "interrupted" {
        ExecErrorKind::Timeout
    } else if name == "SyntaxError" && !stack.contains("(native)") {
        ExecErrorKind::Syntax
    } else {
        ExecErrorKind::Runtime
    };
    let stack = stack.trim_end();
    let text =
        if stack.is_empty() { format!("{name}: {message}") } else { format!("{name}: {message}\n{stack}") };
    ExecError::new(kind, text)
}
