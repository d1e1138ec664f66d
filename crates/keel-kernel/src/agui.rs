//! A run as AG-UI events: the pure state machine that turns a run's stored events (with
//! the journal entries their syscalls name) and the deltas of its live LLM calls into
//! the AG-UI event sequence. No IO: `kernel/agui.rs` feeds it.
//!
//! The mapping:
//! - the first step opens the stream with `RUN_STARTED`;
//! - an `llm.chat` whose start this stream saw streams live: its text deltas become
//!   `TEXT_MESSAGE_START`/`CONTENT`, its tool-call deltas `TOOL_CALL_START`/`ARGS`, and
//!   its journaled completion closes them (`..._END`). A call the stream did not see
//!   start (history, or a stream that joined mid-call) is rendered whole from its
//!   journaled result when it completes, so a message is never shown half;
//! - a `tool.call` becomes `TOOL_CALL_RESULT` of the model's matching proposed call
//!   (same tool name and arguments), or a whole `START`/`ARGS`/`END`/`RESULT` of its own;
//! - a `state.checkpoint` becomes `STATE_SNAPSHOT`; questions, answers, approvals,
//!   decisions, `ui.show` blocks and `run.emit` events become `CUSTOM` (`keel.question`...);
//! - the final state becomes `RUN_FINISHED` (succeeded: the output as `result`;
//!   cancelled: the `cancelled` outcome) or `RUN_ERROR` (failed), after closing whatever
//!   is open. Calls answered from the journal on replay were shown once already and are
//!   skipped.

use std::collections::{BTreeMap, HashSet};

use keel_llm::Delta;
use keel_protocol::agui::{AGUI_PROTOCOL_VERSION, AguiEvent, AguiEventBody};
use keel_protocol::api::{EventView, JournalEntryView};
use keel_store::Seq;
use serde_json::{Value, json};

/// One thing that happened to the run, in the order the stream learns of it.
pub(crate) enum Step<'a> {
    /// A stored event. For a `syscall` event of `llm.chat`, `tool.call` or
    /// `state.checkpoint`: its journal entry. For the final `state` event: the run's output.
    Event { event: &'a EventView, entry: Option<&'a JournalEntryView>, output: Option<&'a Value> },
    /// An `llm.chat` of the run was journaled and goes to the provider now (live only).
    CallBegun(Seq),
    /// A delta of that call's streamed response.
    Delta(Seq, &'a Delta),
    /// The run's event log ended without a final state.
    Ended,
}

/// The methods whose `syscall` events the mapper needs the journal entry of.
pub(crate) fn needs_entry(event: &EventView) -> Option<Seq> {
    if event.kind != keel_protocol::EventKind::Syscall.as_str() || event.data["replayed"] == true {
        return None;
    }
    match event.data["method"].as_str()? {
        "llm.chat" | "tool.call" | "state.checkpoint" => event.data["seq"].as_u64(),
        _ => None,
    }
}

/// Whether `event` is the run's final state (the driver reads the output for it).
pub(crate) fn is_final_state(event: &EventView) -> bool {
    event.kind == keel_protocol::EventKind::State.as_str()
        && event.data["state"]
            .as_str()
            .and_then(|s| s.parse::<keel_types::RunState>().ok())
            .is_some_and(|s| s.is_terminal())
}

/// An `llm.chat` streaming live.
#[derive(Default)]
struct LiveCall {
    /// How many text messages this call opened (text after a tool call opens another).
    parts: u32,
    text_open: bool,
    /// The tool call whose arguments are streaming: (index, id).
    tool_open: Option<(u32, String)>,
    /// Tool calls seen but not started yet (their name has not arrived): id, name, args.
    waiting: BTreeMap<u32, (Option<String>, Option<String>, String)>,
    /// Indices started (and maybe closed): later fragments of a closed one are dropped.
    started: HashSet<u32>,
}

/// A tool call the model proposed, not yet matched to the agent's `tool.call`.
struct Proposed {
    id: String,
    name: String,
    args: Value,
}

pub(crate) struct AguiMapper {
    /// AG-UI's thread and run ids (a frontend's own for `POST /v1/agui`).
    thread_id: String,
    run_id: String,
    /// Keel's run id: the prefix of message and tool-call ids, unique across runs.
    keel_run: String,
    started: bool,
    finished: bool,
    live: BTreeMap<Seq, LiveCall>,
    /// Calls completed (or rendered): their late deltas are dropped.
    settled: HashSet<Seq>,
    proposed: Vec<Proposed>,
}

impl AguiMapper {
    pub(crate) fn new(thread_id: String, run_id: String, keel_run: String) -> AguiMapper {
        AguiMapper {
            thread_id,
            run_id,
            keel_run,
            started: false,
            finished: false,
            live: BTreeMap::new(),
            settled: HashSet::new(),
            proposed: Vec::new(),
        }
    }

    /// True once `RUN_FINISHED` or `RUN_ERROR` was produced: nothing follows it.
    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// The AG-UI events `step` adds, in order.
    pub(crate) fn step(&mut self, step: Step<'_>) -> Vec<AguiEvent> {
        let mut out = Out::default();
        if self.finished {
            return out.0;
        }
        if !self.started {
            self.started = true;
            out.push(
                AguiEventBody::RunStarted {
                    thread_id: self.thread_id.clone(),
                    run_id: self.run_id.clone(),
                    protocol_version: AGUI_PROTOCOL_VERSION.into(),
                },
                None,
            );
        }
        match step {
            Step::CallBegun(seq) => {
                if !self.settled.contains(&seq) {
                    self.live.entry(seq).or_default();
                }
            }
            Step::Delta(seq, delta) => self.delta(seq, delta, &mut out),
            Step::Event { event, entry, output } => self.event(event, entry, output, &mut out),
            Step::Ended => {
                self.close_all(&mut out, None);
                self.finished = true;
                out.push(
                    AguiEventBody::RunError {
                        message: "the run's event stream ended before the run did; read the run again".into(),
                        code: Some("stream_ended".into()),
                    },
                    None,
                );
            }
        }
        out.0
    }

    fn message_id(&self, seq: Seq, part: u32) -> String {
        message_id(&self.keel_run, seq, part)
    }

    fn delta(&mut self, seq: Seq, delta: &Delta, out: &mut Out) {
        let keel_run = self.keel_run.as_str();
        let Some(call) = self.live.get_mut(&seq) else { return };
        match delta {
            Delta::Text(text) => {
                if text.is_empty() {
                    return;
                }
                if let Some((_, id)) = call.tool_open.take() {
                    out.push(AguiEventBody::ToolCallEnd { tool_call_id: id }, None);
                }
                if !call.text_open {
                    call.text_open = true;
                    call.parts += 1;
                    let message_id = message_id(keel_run, seq, call.parts);
                    out.push(AguiEventBody::TextMessageStart { message_id, role: "assistant".into() }, None);
                }
                let message_id = message_id(keel_run, seq, call.parts);
                out.push(AguiEventBody::TextMessageContent { message_id, delta: text.clone() }, None);
            }
            Delta::ToolCall { index, id, name, arguments } => {
                if call.text_open {
                    call.text_open = false;
                    out.push(
                        AguiEventBody::TextMessageEnd { message_id: message_id(keel_run, seq, call.parts) },
                        None,
                    );
                }
                if let Some((open, tool_call_id)) = &call.tool_open
                    && open == index
                {
                    if !arguments.is_empty() {
                        let tool_call_id = tool_call_id.clone();
                        out.push(
                            AguiEventBody::ToolCallArgs { tool_call_id, delta: arguments.clone() },
                            None,
                        );
                    }
                    return;
                }
                if call.started.contains(index) {
                    return; // A fragment of a call already closed: nothing can carry it.
                }
                let waiting = call.waiting.entry(*index).or_default();
                waiting.0 = waiting.0.take().or_else(|| id.clone());
                waiting.1 = waiting.1.take().or_else(|| name.clone());
                waiting.2.push_str(arguments);
                if waiting.1.is_none() {
                    return; // No name yet: AG-UI cannot open a call without one.
                }
                let Some((id, name, args)) = call.waiting.remove(index) else { return };
                if let Some((_, open)) = call.tool_open.take() {
                    out.push(AguiEventBody::ToolCallEnd { tool_call_id: open }, None);
                }
                let tool_call_id = id.unwrap_or_else(|| format!("{keel_run}-m{seq}-call{index}"));
                call.started.insert(*index);
                call.tool_open = Some((*index, tool_call_id.clone()));
                let parent = (call.parts > 0).then(|| message_id(keel_run, seq, call.parts));
                out.push(
                    AguiEventBody::ToolCallStart {
                        tool_call_id: tool_call_id.clone(),
                        tool_call_name: name.unwrap_or_default(),
                        parent_message_id: parent,
                    },
                    None,
                );
                if !args.is_empty() {
                    out.push(AguiEventBody::ToolCallArgs { tool_call_id, delta: args }, None);
                }
            }
        }
    }

    /// Closes what a live call has open (text, a tool call), at its end or the run's.
    fn close(&mut self, seq: Seq, out: &mut Out, ts: Option<u64>) {
        let Some(mut call) = self.live.remove(&seq) else { return };
        if call.text_open {
            out.push(AguiEventBody::TextMessageEnd { message_id: self.message_id(seq, call.parts) }, ts);
        }
        if let Some((_, tool_call_id)) = call.tool_open.take() {
            out.push(AguiEventBody::ToolCallEnd { tool_call_id }, ts);
        }
        self.settled.insert(seq);
    }

    fn close_all(&mut self, out: &mut Out, ts: Option<u64>) {
        let open: Vec<Seq> = self.live.keys().copied().collect();
        for seq in open {
            self.close(seq, out, ts);
        }
    }

    fn event(
        &mut self,
        event: &EventView,
        entry: Option<&JournalEntryView>,
        output: Option<&Value>,
        out: &mut Out,
    ) {
        let ts = Some(event.ts);
        let custom = |name: &str| AguiEventBody::Custom { name: name.into(), value: event.data.clone() };
        match event.kind.as_str() {
            "question" => out.push(custom("keel.question"), ts),
            "answer" => out.push(custom("keel.answer"), ts),
            "approval" => out.push(custom("keel.approval"), ts),
            "decision" => out.push(custom("keel.decision"), ts),
            "ui" => out.push(custom("keel.ui"), ts),
            "emit" => out.push(custom("keel.emit"), ts),
            "state" if is_final_state(event) => self.final_state(event, output, out),
            "syscall" => {
                let (Some(seq), Some(entry)) = (needs_entry(event), entry) else { return };
                match event.data["method"].as_str() {
                    Some("llm.chat") => self.llm_done(seq, entry, out, ts),
                    Some("tool.call") => self.tool_done(seq, entry, out, ts),
                    Some("state.checkpoint") if entry.status == "ok" => {
                        out.push(AguiEventBody::StateSnapshot { snapshot: entry.params["state"].clone() }, ts)
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn llm_done(&mut self, seq: Seq, entry: &JournalEntryView, out: &mut Out, ts: Option<u64>) {
        let streamed = self.live.contains_key(&seq);
        self.close(seq, out, ts);
        if !self.settled.insert(seq) && !streamed {
            return; // Rendered already (an event seen twice).
        }
        // The journal keeps `{response, provider}`; the agent got `response`.
        let Some(message) =
            entry.result.as_ref().filter(|_| entry.status == "ok").map(|r| &r["response"]["message"])
        else {
            return;
        };
        let message_id = self.message_id(seq, 0);
        let calls = message["tool_calls"].as_array().cloned().unwrap_or_default();
        if !streamed {
            let text = message["content"].as_str().unwrap_or_default();
            if !text.is_empty() {
                out.push(
                    AguiEventBody::TextMessageStart {
                        message_id: message_id.clone(),
                        role: "assistant".into(),
                    },
                    ts,
                );
                out.push(
                    AguiEventBody::TextMessageContent { message_id: message_id.clone(), delta: text.into() },
                    ts,
                );
                out.push(AguiEventBody::TextMessageEnd { message_id: message_id.clone() }, ts);
            }
            for (index, call) in calls.iter().enumerate() {
                let id = tool_call_id(call, &message_id, index);
                out.push(
                    AguiEventBody::ToolCallStart {
                        tool_call_id: id.clone(),
                        tool_call_name: call["function"]["name"].as_str().unwrap_or_default().into(),
                        parent_message_id: (!text.is_empty()).then(|| message_id.clone()),
                    },
                    ts,
                );
                let args = arguments_text(&call["function"]["arguments"]);
                if !args.is_empty() {
                    out.push(AguiEventBody::ToolCallArgs { tool_call_id: id.clone(), delta: args }, ts);
                }
                out.push(AguiEventBody::ToolCallEnd { tool_call_id: id }, ts);
            }
        }
        for (index, call) in calls.iter().enumerate() {
            let args = arguments_text(&call["function"]["arguments"]);
            self.proposed.push(Proposed {
                id: tool_call_id(call, &message_id, index),
                name: call["function"]["name"].as_str().unwrap_or_default().into(),
                args: serde_json::from_str(&args).unwrap_or(Value::String(args)),
            });
        }
    }

    fn tool_done(&mut self, seq: Seq, entry: &JournalEntryView, out: &mut Out, ts: Option<u64>) {
        let name = entry.params["name"].as_str().unwrap_or_default().to_owned();
        let args = entry.params.get("args").cloned().unwrap_or_else(|| json!({}));
        // The journal keeps the reply, `{result}`: the tool's own result is inside.
        let result = entry.result.as_ref().map(|r| r.get("result").unwrap_or(r));
        let content = match (result, &entry.error) {
            (Some(Value::String(text)), _) if entry.status == "ok" => text.clone(),
            (Some(result), _) if entry.status == "ok" => result.to_string(),
            (_, error) => json!({ "error": error.clone().unwrap_or(Value::Null) }).to_string(),
        };
        let matched = self.proposed.iter().position(|p| p.name == name && p.args == args);
        let tool_call_id = match matched {
            Some(index) => self.proposed.remove(index).id,
            None => {
                let id = format!("{}-c{seq}", self.keel_run);
                out.push(
                    AguiEventBody::ToolCallStart {
                        tool_call_id: id.clone(),
                        tool_call_name: name,
                        parent_message_id: None,
                    },
                    ts,
                );
                out.push(
                    AguiEventBody::ToolCallArgs { tool_call_id: id.clone(), delta: args.to_string() },
                    ts,
                );
                out.push(AguiEventBody::ToolCallEnd { tool_call_id: id.clone() }, ts);
                id
            }
        };
        let message_id = format!("{}-t{seq}", self.keel_run);
        out.push(
            AguiEventBody::ToolCallResult { message_id, tool_call_id, content, role: "tool".into() },
            ts,
        );
    }

    fn final_state(&mut self, event: &EventView, output: Option<&Value>, out: &mut Out) {
        let ts = Some(event.ts);
        self.close_all(out, ts);
        self.finished = true;
        let (thread_id, run_id) = (self.thread_id.clone(), self.run_id.clone());
        let body = match event.data["state"].as_str() {
            Some("succeeded") => {
                AguiEventBody::RunFinished { thread_id, run_id, result: output.cloned(), outcome: None }
            }
            Some("cancelled") => AguiEventBody::RunFinished {
                thread_id,
                run_id,
                result: None,
                outcome: Some(json!({ "type": "cancelled" })),
            },
            _ => {
                let mut message = event.data["error"].as_str().unwrap_or("the run failed").to_owned();
                if let Some(code) = event.data["exit_code"].as_i64() {
                    message.push_str(&format!(" (exit code {code})"));
                }
                AguiEventBody::RunError { message, code: Some("failed".into()) }
            }
        };
        out.push(body, ts);
    }
}

/// The id of the text message `part` of the `llm.chat` at `seq` (part 0 and 1 are the
/// same: the first message, whether streamed or rendered whole).
fn message_id(keel_run: &str, seq: Seq, part: u32) -> String {
    match part {
        0 | 1 => format!("{keel_run}-m{seq}"),
        part => format!("{keel_run}-m{seq}-{part}"),
    }
}

/// The model's id for a proposed call, else one made from its message and position.
fn tool_call_id(call: &Value, message_id: &str, index: usize) -> String {
    call["id"]
        .as_str()
        .filter(|id| !id.is_empty())
        .map_or_else(|| format!("{message_id}-call{index}"), str::to_owned)
}

/// A tool call's arguments as JSON text (providers send text; a script may send JSON).
fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[derive(Default)]
struct Out(Vec<AguiEvent>);

impl Out {
    fn push(&mut self, body: AguiEventBody, ts: Option<u64>) {
        self.0.push(AguiEvent::new(body, ts));
    }
}

#[cfg(test)]
#[path = "agui/tests.rs"]
mod tests;
