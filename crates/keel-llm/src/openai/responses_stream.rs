//! The Responses API's streamed event sequence, as the official clients parse it:
//! `response.created`, `response.in_progress`, then for each output item
//! `response.output_item.added`, its content (`response.content_part.added`,
//! `response.output_text.delta`... `.done`, `response.content_part.done` for a message;
//! `response.function_call_arguments.delta` / `.done` for a function call),
//! `response.output_item.done`, and last `response.completed` with the whole response.
//! Every event carries a `sequence_number`.
//!
//! [`ResponseStream`] is a pure state machine: live deltas open and extend items as they
//! arrive; [`ResponseStream::finish`] closes what is open from the complete result and
//! sends every item that was not streamed whole, so a call answered from the journal
//! (which has no deltas) is rendered as the same sequence of event types.

use keel_protocol::rpc::LlmChatResult;
use serde_json::{Value, json};

use super::responses::{
    call_item_id, finish_object, message_item, message_item_id, output_items, output_text,
};
use crate::Delta;

/// One server-sent event: its name (the `event:` line, also its `type`) and data.
pub type StreamEvent = (String, Value);

/// Which item of the final output an emitted item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Message,
    Call(u32),
    Reasoning(usize),
}

#[derive(Debug)]
enum Open {
    Text { output_index: usize, text: String },
    Call { output_index: usize, tool_index: u32, arguments: String },
}

#[derive(Debug)]
pub struct ResponseStream {
    id: String,
    skeleton: Value,
    sequence: u64,
    /// The items sent so far, in output order.
    emitted: Vec<Slot>,
    open: Option<Open>,
    /// Call ids and names from the first fragment of each streamed call.
    calls: Vec<(u32, String, String)>,
}

impl ResponseStream {
    /// A stream for the response `id`; `skeleton` is the in-progress response object
    /// (see `responses::response_skeleton`).
    pub fn new(id: &str, skeleton: Value) -> ResponseStream {
        ResponseStream {
            id: id.to_owned(),
            skeleton,
            sequence: 0,
            emitted: Vec::new(),
            open: None,
            calls: Vec::new(),
        }
    }

    fn event(&mut self, name: &str, mut data: Value) -> StreamEvent {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (name.to_owned(), data)
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<StreamEvent> {
        let response = self.skeleton.clone();
        vec![
            self.event("response.created", json!({ "response": response })),
            self.event("response.in_progress", json!({ "response": self.skeleton.clone() })),
        ]
    }

    /// The events of one live delta.
    pub fn delta(&mut self, delta: &Delta) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        match delta {
            Delta::Text(piece) => {
                if !matches!(self.open, Some(Open::Text { .. })) {
                    if self.emitted.contains(&Slot::Message) {
                        // Text after the message was closed (it never happens with the
                        // providers Keel has) is sent with the final message instead.
                        return events;
                    }
                    events.extend(self.close(None));
                    events.extend(self.open_message());
                }
                if let Some(Open::Text { output_index, text }) = &mut self.open {
                    text.push_str(piece);
                    let output_index = *output_index;
                    let item_id = message_item_id(&self.id);
                    events.push(self.event(
                        "response.output_text.delta",
                        json!({ "item_id": item_id, "output_index": output_index, "content_index": 0, "delta": piece, "logprobs": [] }),
                    ));
                }
            }
            Delta::ToolCall { index, id, name, arguments } => {
                let same = matches!(self.open, Some(Open::Call { tool_index, .. }) if tool_index == *index);
                if !same {
                    if self.emitted.contains(&Slot::Call(*index)) {
                        return events;
                    }
                    events.extend(self.close(None));
                    let call_id = id.clone().unwrap_or_default();
                    let name = name.clone().unwrap_or_default();
                    self.calls.push((*index, call_id.clone(), name.clone()));
                    let output_index = self.emitted.len();
                    self.emitted.push(Slot::Call(*index));
                    self.open =
                        Some(Open::Call { output_index, tool_index: *index, arguments: String::new() });
                    let item = json!({
                        "type": "function_call", "id": call_item_id(&self.id, *index as usize),
                        "call_id": call_id, "name": name, "arguments": "", "status": "in_progress",
                    });
                    events.push(self.event(
                        "response.output_item.added",
                        json!({ "output_index": output_index, "item": item }),
                    ));
                }
                if let Some(Open::Call { output_index, arguments: so_far, .. }) = &mut self.open
                    && !arguments.is_empty()
                {
                    so_far.push_str(arguments);
                    let output_index = *output_index;
                    let item_id = call_item_id(&self.id, *index as usize);
                    events.push(self.event(
                        "response.function_call_arguments.delta",
                        json!({ "item_id": item_id, "output_index": output_index, "delta": arguments }),
                    ));
                }
            }
        }
        events
    }

    fn open_message(&mut self) -> Vec<StreamEvent> {
        let output_index = self.emitted.len();
        self.emitted.push(Slot::Message);
        self.open = Some(Open::Text { output_index, text: String::new() });
        let item_id = message_item_id(&self.id);
        let mut item = message_item(&item_id, "", "in_progress");
        item["content"] = json!([]);
        vec![
            self.event("response.output_item.added", json!({ "output_index": output_index, "item": item })),
            self.event(
                "response.content_part.added",
                json!({ "item_id": item_id, "output_index": output_index, "content_index": 0, "part": output_text("") }),
            ),
        ]
    }

    /// Closes the open item, with its final form from `finals` when known (else what
    /// was streamed).
    fn close(&mut self, finals: Option<&[(Slot, Value)]>) -> Vec<StreamEvent> {
        let Some(open) = self.open.take() else { return Vec::new() };
        let final_of = |slot: Slot| {
            finals.and_then(|f| f.iter().find(|(s, _)| *s == slot)).map(|(_, item)| item.clone())
        };
        match open {
            Open::Text { output_index, text } => {
                let item_id = message_item_id(&self.id);
                let item =
                    final_of(Slot::Message).unwrap_or_else(|| message_item(&item_id, &text, "completed"));
                let text =
                    item.pointer("/content/0/text").and_then(Value::as_str).unwrap_or(&text).to_owned();
                vec![
                    self.event(
                        "response.output_text.done",
                        json!({ "item_id": item_id, "output_index": output_index, "content_index": 0, "text": text, "logprobs": [] }),
                    ),
                    self.event(
                        "response.content_part.done",
                        json!({ "item_id": item_id, "output_index": output_index, "content_index": 0, "part": output_text(&text) }),
                    ),
                    self.event("response.output_item.done", json!({ "output_index": output_index, "item": item })),
                ]
            }
            Open::Call { output_index, tool_index, arguments } => {
                let item_id = call_item_id(&self.id, tool_index as usize);
                let item = final_of(Slot::Call(tool_index)).unwrap_or_else(|| {
                    let (call_id, name) = self
                        .calls
                        .iter()
                        .find(|(index, ..)| *index == tool_index)
                        .map(|(_, id, name)| (id.clone(), name.clone()))
                        .unwrap_or_default();
                    json!({ "type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments, "status": "completed" })
                });
                let arguments =
                    item.get("arguments").and_then(Value::as_str).unwrap_or(&arguments).to_owned();
                vec![
                    self.event(
                        "response.function_call_arguments.done",
                        json!({ "item_id": item_id, "output_index": output_index, "arguments": arguments }),
                    ),
                    self.event(
                        "response.output_item.done",
                        json!({ "output_index": output_index, "item": item }),
                    ),
                ]
            }
        }
    }

    /// The events that end a stream with `result`: the open item closed, every item not
    /// yet sent sent whole, then `response.completed` (or `response.incomplete`, when the
    /// output limit cut the answer short). Also returns the finished response object,
    /// its output in the order it was sent, which is what the kernel keeps.
    pub fn finish(&mut self, result: &LlmChatResult) -> (Vec<StreamEvent>, Value) {
        let finals = self.finals(result);
        let mut events = self.close(Some(&finals));
        for (slot, item) in &finals {
            if self.emitted.contains(slot) {
                continue;
            }
            let output_index = self.emitted.len();
            self.emitted.push(*slot);
            events.extend(self.whole_item(output_index, item));
        }
        let output: Vec<Value> = self
            .emitted
            .iter()
            .filter_map(|slot| finals.iter().find(|(s, _)| s == slot).map(|(_, item)| item.clone()))
            .collect();
        let response = finish_object(self.skeleton.clone(), result, output);
        let name =
            if response["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
        events.push(self.event(name, json!({ "response": response.clone() })));
        (events, response)
    }

    /// The final output items of `result`, each with its slot.
    fn finals(&self, result: &LlmChatResult) -> Vec<(Slot, Value)> {
        let mut reasoning = 0;
        let mut calls = 0;
        output_items(&self.id, result)
            .into_iter()
            .map(|item| {
                let slot = match item.get("type").and_then(Value::as_str) {
                    Some("message") => Slot::Message,
                    Some("function_call") => {
                        calls += 1;
                        Slot::Call(calls - 1)
                    }
                    _ => {
                        reasoning += 1;
                        Slot::Reasoning(reasoning - 1)
                    }
                };
                (slot, item)
            })
            .collect()
    }

    /// Every event of an item sent at once: added, its content whole, done.
    fn whole_item(&mut self, output_index: usize, item: &Value) -> Vec<StreamEvent> {
        let item_id = item.get("id").cloned().unwrap_or(Value::Null);
        let mut events = Vec::new();
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let text =
                    item.pointer("/content/0/text").and_then(Value::as_str).unwrap_or_default().to_owned();
                let mut added = item.clone();
                added["status"] = json!("in_progress");
                added["content"] = json!([]);
                events.push(self.event(
                    "response.output_item.added",
                    json!({ "output_index": output_index, "item": added }),
                ));
                let part = |text: &str| json!({ "item_id": item_id, "output_index": output_index, "content_index": 0, "part": output_text(text) });
                events.push(self.event("response.content_part.added", part("")));
                events.push(self.event(
                    "response.output_text.delta",
                    json!({ "item_id": item_id, "output_index": output_index, "content_index": 0, "delta": text, "logprobs": [] }),
                ));
                events.push(self.event(
                    "response.output_text.done",
                    json!({ "item_id": item_id, "output_index": output_index, "content_index": 0, "text": text, "logprobs": [] }),
                ));
                events.push(self.event("response.content_part.done", part(&text)));
            }
            Some("function_call") => {
                let arguments = item.get("arguments").cloned().unwrap_or(json!(""));
                let mut added = item.clone();
                added["status"] = json!("in_progress");
                added["arguments"] = json!("");
                events.push(self.event(
                    "response.output_item.added",
                    json!({ "output_index": output_index, "item": added }),
                ));
                events.push(self.event(
                    "response.function_call_arguments.delta",
                    json!({ "item_id": item_id, "output_index": output_index, "delta": arguments }),
                ));
                events.push(self.event(
                    "response.function_call_arguments.done",
                    json!({ "item_id": item_id, "output_index": output_index, "arguments": arguments }),
                ));
            }
            _ => {
                events.push(self.event(
                    "response.output_item.added",
                    json!({ "output_index": output_index, "item": item }),
                ));
            }
        }
        events.push(
            self.event("response.output_item.done", json!({ "output_index": output_index, "item": item })),
        );
        events
    }

    /// The event that ends a stream whose call failed: `error`, with OpenAI's error shape
    /// under `error` too, so the official clients raise it as an API error.
    pub fn failed(&mut self, code: &str, message: &str) -> Vec<StreamEvent> {
        vec![self.event(
            "error",
            json!({ "code": code, "message": message, "param": null,
                    "error": { "type": code, "code": code, "message": message, "param": null } }),
        )]
    }
}
