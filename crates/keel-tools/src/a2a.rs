//! Remote A2A agents as governed tools (`[[tools.a2a]]`): the agent card read and its
//! JSON-RPC interface picked the way the official SDK's client picks one, one tool per
//! skill (`a2a:<agent>/<skill id>`), and a call as a blocking `SendMessage`.
//!
//! A call's message id and context id come from its idempotency key (the run and the
//! seq of the call's journal entry: `keel-<run>-<seq>`), so a call cut off by a kernel
//! crash can be found at the remote afterwards. On recovery ([`Client::call`] with
//! `recovering`) the client looks first: the task in the call's context (`ListTasks`),
//! or, for an answer to an input-required task, that task's history (`GetTask`), and
//! waits for what it finds. Only a remote that has no trace of the message is sent it.
//! A remote that cannot be asked (0.3 has no `ListTasks`) gets an error instead of a
//! second message.
//!
//! Here are the pure parts (card, interface, message, result); `client.rs` is the HTTP
//! side, [`Client`].

mod client;

use std::time::Duration;

use keel_protocol::a2a::{Message, Part, Task, TaskState, Version, parse_message, parse_task, part_json};
use serde_json::{Map, Value, json};

pub use client::Client;

use crate::{CrashPolicy, Policy, RateLimit, ToolDef, ToolKind};

/// Where an agent serves its card, below its base URL.
pub const CARD_PATH: &str = ".well-known/agent-card.json";

/// A remote A2A agent whose skills appear as `a2a:<name>/<skill id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aAgentDef {
    pub name: String,
    /// The agent's base URL.
    pub url: String,
    /// Where its card is read (`<url>/.well-known/agent-card.json` unless configured).
    pub card_url: String,
    /// The variable of the kernel's environment holding the bearer token sent to it.
    pub token_env: Option<String>,
    /// Patterns over skill ids whose calls need approval; `["*"]` for all.
    pub requires_approval: Vec<String>,
    pub crash: CrashPolicy,
    /// Per skill.
    pub rate_limit: Option<RateLimit>,
    pub timeout: Duration,
}

impl A2aAgentDef {
    /// The policy of the skill `skill` (before `[tools.policy]` overrides). A remote
    /// agent's skill is never read-only: Keel cannot know what it does.
    pub fn policy_for(&self, skill: &str) -> Policy {
        Policy {
            requires_approval: self.requires_approval.iter().any(|p| crate::grant::matches(p, skill)),
            crash: self.crash,
            read_only: false,
            rate_limit: self.rate_limit,
            timeout: self.timeout,
        }
    }

    /// The name agents see for the skill `skill`.
    pub fn tool_name(&self, skill: &str) -> String {
        format!("a2a:{}/{skill}", self.name)
    }

    /// The bearer token, read from the kernel's environment now (`None`: no token
    /// configured).
    pub fn token(&self) -> Result<Option<String>, String> {
        let Some(name) = &self.token_env else { return Ok(None) };
        match std::env::var(name) {
            Ok(token) if !token.is_empty() => Ok(Some(token)),
            _ => Err(format!(
                "A2A agent {:?}: its token_env {name} is not set in the kernel's environment; set it where `keel serve` starts",
                self.name
            )),
        }
    }
}

/// Splits `a2a:<agent>/<skill>`.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix("a2a:")?.split_once('/')
}

/// The card's default URL below an agent's base URL (as the SDK's resolver builds it).
pub fn card_url(base: &str) -> String {
    format!("{}/{CARD_PATH}", base.trim_end_matches('/'))
}

// ---- The card ------------------------------------------------------------------------

/// Where calls go: a JSON-RPC endpoint and the protocol version it speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
    pub version: Version,
    /// Sent as `tenant` in every 1.0 request when the interface names one.
    pub tenant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub id: String,
    pub name: String,
    pub description: String,
    pub examples: Vec<String>,
}

/// What Keel reads of an agent card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    pub name: String,
    pub description: String,
    pub endpoint: Endpoint,
    pub skills: Vec<Skill>,
}

fn string<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(Value::as_str).map(str::trim).filter(|text| !text.is_empty())
}

/// A protocol version's (major, minor).
type VersionNumber = (u64, u64);

/// `"1.0"`, `"1.0.0"`, `"0.3"`, `"1"` as (major, minor).
fn version_number(text: &str) -> Option<VersionNumber> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = match parts.next() {
        None => 0,
        Some(minor) => minor.parse().ok()?,
    };
    Some((major, minor))
}

/// An interface's URL, absolute; a path is taken relative to the card's origin.
fn absolute(url: &str, card_url: &str) -> Result<String, String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(url.to_owned());
    }
    if url.starts_with('/') {
        let scheme_end = card_url.find("://").map(|at| at + 3).unwrap_or(0);
        let origin_end = card_url[scheme_end..].find('/').map(|at| at + scheme_end).unwrap_or(card_url.len());
        return Ok(format!("{}{url}", &card_url[..origin_end]));
    }
    Err(format!("the interface URL {url:?} is not an http:// or https:// URL"))
}

/// Picks the interface a call uses, as the A2A SDK's client does: among those whose
/// `protocolBinding` is `JSONRPC`, protocol 1.0 first, then a later one, then 0.3 or
/// later (spoken as 0.3), then one that names no version (spoken as 1.0). A card with
/// no `supportedInterfaces` is a 0.3 card: its top-level `url`, `preferredTransport`
/// and `protocolVersion` (0.3 unless it says otherwise) name the endpoint.
pub fn select_interface(card: &Map<String, Value>, card_url: &str) -> Result<Endpoint, String> {
    let interfaces: Vec<&Map<String, Value>> = card
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .collect();
    if interfaces.is_empty() {
        return legacy_interface(card, card_url);
    }
    // (interface, its version: None when it names none); an unreadable version is skipped.
    let jsonrpc: Vec<(&Map<String, Value>, Option<VersionNumber>)> = interfaces
        .iter()
        .filter(|interface| string(interface, "protocolBinding") == Some("JSONRPC"))
        .filter_map(|interface| match string(interface, "protocolVersion") {
            None => Some((*interface, None)),
            Some(text) => version_number(text).map(|number| (*interface, Some(number))),
        })
        .collect();
    let first = |wanted: &dyn Fn(Option<VersionNumber>) -> bool| jsonrpc.iter().find(|(_, v)| wanted(*v));
    let chosen = first(&|v| v == Some((1, 0)))
        .or_else(|| first(&|v| v.is_some_and(|(major, _)| major >= 1)))
        .or_else(|| first(&|v| v.is_some_and(|(major, minor)| major == 0 && minor >= 3)))
        .or_else(|| first(&|v| v.is_none()));
    let Some((interface, number)) = chosen else {
        let offered: Vec<String> = interfaces
            .iter()
            .map(|i| {
                format!(
                    "{} {}",
                    string(i, "protocolBinding").unwrap_or("(no binding)"),
                    string(i, "protocolVersion").unwrap_or("(no version)")
                )
            })
            .collect();
        return Err(format!(
            "the card offers no JSON-RPC interface Keel speaks (A2A 1.0 or 0.3 with protocolBinding \"JSONRPC\"); it offers: {}",
            offered.join(", ")
        ));
    };
    let Some(url) = string(interface, "url") else {
        return Err("the card's JSON-RPC interface has no `url`".into());
    };
    let version = match number {
        Some((0, _)) => Version::V03,
        _ => Version::V1,
    };
    Ok(Endpoint {
        url: absolute(url, card_url)?,
        version,
        tenant: string(interface, "tenant").map(str::to_owned),
    })
}

fn legacy_interface(card: &Map<String, Value>, card_url: &str) -> Result<Endpoint, String> {
    let Some(url) = string(card, "url") else {
        return Err(
            "the card names no endpoint: it has neither `supportedInterfaces` (A2A 1.0) nor `url` (A2A 0.3)"
                .into(),
        );
    };
    let version = match version_number(string(card, "protocolVersion").unwrap_or("0.3.0")) {
        Some((major, _)) if major >= 1 => Version::V1,
        _ => Version::V03,
    };
    let url = match string(card, "preferredTransport").unwrap_or("JSONRPC") {
        "JSONRPC" => url,
        other => card
            .get("additionalInterfaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
            .find(|interface| string(interface, "transport") == Some("JSONRPC"))
            .and_then(|interface| string(interface, "url"))
            .ok_or_else(|| {
                format!(
                    "the card's transport is {other:?} and it offers no JSONRPC one, the binding Keel speaks"
                )
            })?,
    };
    Ok(Endpoint { url: absolute(url, card_url)?, version, tenant: None })
}

/// Reads an agent card: its name, skills and the endpoint calls go to.
pub fn parse_card(value: &Value, card_url: &str) -> Result<Card, String> {
    let Some(card) = value.as_object() else {
        return Err("the card is not a JSON object".into());
    };
    let endpoint = select_interface(card, card_url)?;
    let mut skills: Vec<Skill> = Vec::new();
    let raw_skills = card.get("skills").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for (index, skill) in raw_skills.iter().enumerate() {
        let Some(skill) = skill.as_object() else {
            return Err(format!("skills[{index}] is not an object"));
        };
        let Some(id) = string(skill, "id") else {
            return Err(format!("skills[{index}] has no `id`"));
        };
        if skills.iter().any(|known| known.id == id) {
            return Err(format!("skills[{index}]: the id {id:?} is used twice"));
        }
        skills.push(Skill {
            id: id.to_owned(),
            name: string(skill, "name").unwrap_or(id).to_owned(),
            description: string(skill, "description").unwrap_or_default().to_owned(),
            examples: skill
                .get("examples")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        });
    }
    Ok(Card {
        name: string(card, "name").unwrap_or("an A2A agent").to_owned(),
        description: string(card, "description").unwrap_or_default().to_owned(),
        endpoint,
        skills,
    })
}

/// A skill's arguments: the text of the message, structured data sent with it, and the
/// task an answer is for.
pub fn input_schema(skill: &Skill) -> Value {
    let mut text = json!({
        "type": "string",
        "description": "The message to the agent.",
    });
    if !skill.examples.is_empty() {
        text["examples"] = json!(skill.examples);
    }
    json!({
        "type": "object",
        "required": ["text"],
        "additionalProperties": false,
        "properties": {
            "text": text,
            "data": {"type": "object", "description": "Structured input, sent as a data part with the text."},
            "task_id": {
                "type": "string",
                "minLength": 1,
                "description": "To answer the agent's question: the task_id of an earlier result whose state is input-required."
            }
        }
    })
}

/// The tools of an agent: one per skill of its card.
pub fn tools(def: &A2aAgentDef, card: &Card) -> Vec<ToolDef> {
    card.skills
        .iter()
        .map(|skill| {
            let mut description = format!("{} (A2A agent {:?}", skill.name, card.name);
            if !card.description.is_empty() {
                description.push_str(&format!(": {}", card.description));
            }
            description.push(')');
            if !skill.description.is_empty() {
                description.push_str(&format!(": {}", skill.description));
            }
            if !skill.examples.is_empty() {
                let examples: Vec<String> = skill.examples.iter().map(|e| format!("{e:?}")).collect();
                description.push_str(&format!(" Examples: {}.", examples.join(", ")));
            }
            description.push_str(
                " Returns {task_id, context_id, state, text, artifacts, question}; state input-required means the agent asks `question`: answer with the same tool and task_id.",
            );
            ToolDef {
                name: def.tool_name(&skill.id),
                description,
                input_schema: input_schema(skill),
                kind: ToolKind::A2a { agent: def.name.clone(), skill: skill.id.clone() },
                policy: def.policy_for(&skill.id),
            }
        })
        .collect()
}

// ---- A call --------------------------------------------------------------------------

/// The message and context id of the call with idempotency key `key` (`<run>:<seq>`).
pub fn call_id(key: &str) -> String {
    format!("keel-{}", key.replace(':', "-"))
}

/// The message a call sends: its text, its data as a data part, `{"skill": id}` as
/// metadata. A new task gets the call's own context; an answer goes to its task, in the
/// task's context.
pub fn message_for(skill: &str, args: &Value, key: &str) -> Result<Message, String> {
    let Some(text) = args.get("text").and_then(Value::as_str) else {
        return Err("`text` is required: the message to the agent".into());
    };
    let mut parts = vec![Part::Text(text.to_owned())];
    if let Some(data) = args.get("data").filter(|data| !data.is_null()) {
        parts.push(Part::Data(data.clone()));
    }
    let task_id = args.get("task_id").and_then(Value::as_str).filter(|id| !id.is_empty()).map(str::to_owned);
    let id = call_id(key);
    Ok(Message {
        message_id: id.clone(),
        role: keel_protocol::a2a::Role::User,
        parts,
        context_id: task_id.is_none().then_some(id),
        task_id,
        metadata: Some(json!({ "skill": skill })),
    })
}

/// What a send answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Task(Task),
    /// The agent answered without a task.
    Message(Message),
}

/// A `SendMessage` (`message/send`) result: 1.0 wraps it (`{"task": ...}` or
/// `{"message": ...}`), 0.3 tags it with `kind` (or, lacking that, a message has a
/// `messageId`).
pub fn parse_send_result(value: &Value, version: Version) -> Result<Answer, String> {
    let message = |value: &Value| parse_message(Some(value)).map(Answer::Message).map_err(|e| e.message);
    match version {
        Version::V1 => match (value.get("task"), value.get("message")) {
            (Some(task), _) => parse_task(task, version).map(Answer::Task),
            (None, Some(reply)) => message(reply),
            (None, None) => Err(format!("a SendMessage result holds a `task` or a `message`, not {value}")),
        },
        Version::V03 => match value.get("kind").and_then(Value::as_str) {
            Some("message") => message(value),
            None if value.get("messageId").is_some() => message(value),
            _ => parse_task(value, version).map(Answer::Task),
        },
    }
}

fn joined_text(parts: &[Part]) -> Vec<&str> {
    parts
        .iter()
        .filter_map(|part| match part {
            Part::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// A task the agent is done with for now, as the tool's result: `{task_id, context_id,
/// state, text (every artifact's text), artifacts, question}`. A task that failed, was
/// rejected or canceled, or needs authorization the tool cannot give is an error with
/// the agent's word.
pub fn task_result(task: &Task) -> Result<Value, String> {
    let said = task.status.message.as_ref().map(Message::text).filter(|text| !text.is_empty());
    let state = task.status.state;
    match state {
        TaskState::Failed | TaskState::Rejected | TaskState::Canceled | TaskState::AuthRequired => {
            return Err(format!(
                "the agent's task {} is {}: {}",
                task.id,
                state.v03(),
                said.as_deref().unwrap_or("it gave no reason")
            ));
        }
        TaskState::Completed | TaskState::InputRequired | TaskState::Submitted | TaskState::Working => {}
    }
    let text: Vec<&str> = task.artifacts.iter().flat_map(|artifact| joined_text(&artifact.parts)).collect();
    let artifacts: Vec<Value> = task
        .artifacts
        .iter()
        .map(|artifact| {
            json!({
                "artifact_id": artifact.artifact_id,
                "name": artifact.name,
                "parts": artifact.parts.iter().map(|part| part_json(part, Version::V1)).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json!({
        "task_id": task.id,
        "context_id": task.context_id,
        "state": state.v03(),
        "text": text.join("\n"),
        "artifacts": artifacts,
        "question": if state == TaskState::InputRequired { said.map(Value::String) } else { None },
    }))
}

/// An answer without a task, as the tool's result: `{context_id, text}`, and `data` when
/// the message has a data part.
pub fn message_result(message: &Message) -> Value {
    let mut out = json!({ "context_id": message.context_id, "text": message.text() });
    if let Some(data) = message.data() {
        out["data"] = data.clone();
    }
    out
}

#[cfg(test)]
mod tests {
    use keel_protocol::a2a::{Artifact, Role, TaskStatus, message_json};

    use super::*;

    const CARD: &str = "http://agent.test:9999/.well-known/agent-card.json";

    fn endpoint(card: Value) -> Result<Endpoint, String> {
        select_interface(card.as_object().unwrap(), CARD)
    }

    fn interface(url: &str, binding: &str, version: Option<&str>) -> Value {
        let mut interface = json!({ "url": url, "protocolBinding": binding });
        if let Some(version) = version {
            interface["protocolVersion"] = json!(version);
        }
        interface
    }

    #[test]
    fn the_interface_is_picked_as_the_sdk_client_picks_it() {
        let v1 = |url: &str| Endpoint { url: url.into(), version: Version::V1, tenant: None };
        let v03 = |url: &str| Endpoint { url: url.into(), version: Version::V03, tenant: None };
        let cases = [
            (
                json!({"supportedInterfaces": [interface("http://a/1", "JSONRPC", Some("1.0"))]}),
                v1("http://a/1"),
            ),
            (json!({"supportedInterfaces": [interface("http://a/1", "JSONRPC", None)]}), v1("http://a/1")),
            (
                json!({"supportedInterfaces": [interface("http://a/1", "JSONRPC", Some("1.0.0"))]}),
                v1("http://a/1"),
            ),
            (
                json!({"supportedInterfaces": [
                    interface("http://a/03", "JSONRPC", Some("0.3")),
                    interface("http://a/1", "JSONRPC", Some("1.0")),
                ]}),
                v1("http://a/1"),
            ),
            (
                json!({"supportedInterfaces": [
                    interface("http://a/rest", "HTTP+JSON", Some("1.0")),
                    interface("http://a/03", "JSONRPC", Some("0.3")),
                ]}),
                v03("http://a/03"),
            ),
            (
                json!({"supportedInterfaces": [
                    interface("http://a/none", "JSONRPC", None),
                    interface("http://a/2", "JSONRPC", Some("2.1")),
                ]}),
                v1("http://a/2"),
            ),
            // Both: the 1.0 interface wins over the 0.3 fields.
            (
                json!({"url": "http://a/03", "protocolVersion": "0.3.0",
                    "supportedInterfaces": [interface("http://a/1", "JSONRPC", Some("1.0"))]}),
                v1("http://a/1"),
            ),
            // 0.3 cards.
            (json!({"name": "a", "url": "http://a/03"}), v03("http://a/03")),
            (json!({"url": "http://a/x", "protocolVersion": "1.0"}), v1("http://a/x")),
            (
                json!({"url": "http://a/grpc", "preferredTransport": "GRPC",
                    "additionalInterfaces": [{"url": "http://a/rpc", "transport": "JSONRPC"}]}),
                v03("http://a/rpc"),
            ),
            // A path is relative to the card's origin.
            (
                json!({"supportedInterfaces": [interface("/rpc", "JSONRPC", Some("1.0"))]}),
                v1("http://agent.test:9999/rpc"),
            ),
        ];
        for (card, wanted) in cases {
            assert_eq!(endpoint(card.clone()), Ok(wanted), "{card}");
        }
        let with_tenant = json!({"supportedInterfaces": [
            {"url": "http://a/1", "protocolBinding": "JSONRPC", "protocolVersion": "1.0", "tenant": "t1"}
        ]});
        assert_eq!(endpoint(with_tenant).unwrap().tenant.as_deref(), Some("t1"));
    }

    #[test]
    fn a_card_without_an_interface_keel_speaks_says_what_it_offers() {
        let cases = [
            (json!({"supportedInterfaces": [interface("http://a", "jsonrpc", Some("1.0"))]}), "jsonrpc 1.0"),
            (
                json!({"supportedInterfaces": [interface("http://a", "HTTP+JSON", Some("1.0")), interface("http://b", "GRPC", None)]}),
                "HTTP+JSON 1.0, GRPC (no version)",
            ),
            (json!({"supportedInterfaces": [interface("http://a", "JSONRPC", Some("0.2"))]}), "JSONRPC 0.2"),
            (json!({"name": "x"}), "names no endpoint"),
            (json!({"url": "http://a", "preferredTransport": "GRPC"}), "offers no JSONRPC"),
            (
                json!({"supportedInterfaces": [interface("ftp://a", "JSONRPC", Some("1.0"))]}),
                "not an http://",
            ),
            (json!({"supportedInterfaces": [{"protocolBinding": "JSONRPC"}]}), "has no `url`"),
        ];
        for (card, says) in cases {
            let error = endpoint(card.clone()).unwrap_err();
            assert!(error.contains(says), "{card}: {error}");
        }
    }

    fn def() -> A2aAgentDef {
        A2aAgentDef {
            name: "research".into(),
            url: "http://agent.test:9999/".into(),
            card_url: card_url("http://agent.test:9999/"),
            token_env: None,
            requires_approval: vec!["write*".into()],
            crash: CrashPolicy::Retry,
            rate_limit: Some("5/s".parse().unwrap()),
            timeout: Duration::from_secs(120),
        }
    }

    #[test]
    fn a_card_becomes_one_tool_per_skill() {
        assert_eq!(def().card_url, CARD);
        assert_eq!(card_url("http://h/base"), "http://h/base/.well-known/agent-card.json");
        // The card a2a-sdk 1.3.0 serves (SPEC section 2.2).
        let card = json!({"name":"Echo Agent","description":"Echoes text back as an artifact",
            "supportedInterfaces":[{"url":"http://127.0.0.1:8765/","protocolBinding":"JSONRPC","protocolVersion":"1.0"}],
            "version":"0.1.0","capabilities":{"streaming":true,"pushNotifications":true},
            "securitySchemes":{"bearer":{"httpAuthSecurityScheme":{"scheme":"Bearer","bearerFormat":"opaque"}}},
            "securityRequirements":[{"schemes":{"bearer":{}}}],
            "defaultInputModes":["text/plain"],"defaultOutputModes":["text/plain"],
            "skills":[{"id":"echo","name":"Echo","description":"Echo the input","tags":["echo"],"examples":["hello"]},
                      {"id":"write_report","name":"Report","description":"","tags":[]}]});
        let card = parse_card(&card, CARD).unwrap();
        assert_eq!(card.endpoint.url, "http://127.0.0.1:8765/");
        let tools = tools(&def(), &card);
        assert_eq!(tools.len(), 2);
        let echo = &tools[0];
        assert_eq!(echo.name, "a2a:research/echo");
        assert_eq!(echo.kind, ToolKind::A2a { agent: "research".into(), skill: "echo".into() });
        assert!(echo.description.starts_with("Echo (A2A agent \"Echo Agent\": Echoes text back as an artifact): Echo the input Examples: \"hello\"."), "{}", echo.description);
        crate::schema::check_schema(&echo.input_schema).unwrap();
        assert_eq!(echo.input_schema["properties"]["text"]["examples"], json!(["hello"]));
        assert!(!echo.policy.requires_approval && !echo.policy.read_only);
        assert_eq!(echo.policy.timeout, Duration::from_secs(120));
        assert!(tools[1].policy.requires_approval, "write* matches write_report");
        for (args, ok) in [
            (json!({"text": "hi"}), true),
            (json!({"text": "hi", "data": {"n": 1}, "task_id": "t"}), true),
            (json!({}), false),
            (json!({"text": 1}), false),
            (json!({"text": "hi", "data": [1]}), false),
            (json!({"text": "hi", "task_id": ""}), false),
            (json!({"text": "hi", "extra": 1}), false),
        ] {
            assert_eq!(crate::schema::validate(&echo.input_schema, &args).is_ok(), ok, "{args}");
        }
        assert_eq!(split_name("a2a:research/echo"), Some(("research", "echo")));
        assert_eq!(split_name("a2a:research/a/b"), Some(("research", "a/b")));
        assert_eq!(split_name("mcp:research/echo"), None);
    }

    #[test]
    fn bad_skills_are_named() {
        let with = |skills: Value| json!({"supportedInterfaces": [interface("http://a", "JSONRPC", None)], "skills": skills});
        for (card, says) in [
            (with(json!([{"name": "x"}])), "skills[0] has no `id`"),
            (with(json!([{"id": "a"}, {"id": "a"}])), "skills[1]: the id \"a\" is used twice"),
            (with(json!([3])), "skills[0] is not an object"),
            (json!("card"), "not a JSON object"),
        ] {
            let error = parse_card(&card, CARD).unwrap_err();
            assert!(error.contains(says), "{card}: {error}");
        }
        let none = parse_card(&with(json!(null)), CARD).unwrap();
        assert!(none.skills.is_empty());
    }

    #[test]
    fn a_calls_message_carries_ids_from_its_journal_entry() {
        let message = message_for("echo", &json!({"text": "hi", "data": {"n": 1}}), "01JRUN:7").unwrap();
        assert_eq!(message.message_id, "keel-01JRUN-7");
        assert_eq!(message.context_id.as_deref(), Some("keel-01JRUN-7"));
        assert_eq!(message.task_id, None);
        assert_eq!(message.parts, [Part::Text("hi".into()), Part::Data(json!({"n": 1}))]);
        let wire = message_json(&message, Version::V1);
        assert_eq!(wire["metadata"], json!({"skill": "echo"}));
        assert_eq!(wire["role"], "ROLE_USER");
        // An answer goes to its task, in the task's own context.
        let answer = message_for("echo", &json!({"text": "1999", "task_id": "t1"}), "01JRUN:9").unwrap();
        assert_eq!((answer.task_id.as_deref(), answer.context_id.as_deref()), (Some("t1"), None));
        assert!(message_for("echo", &json!({}), "r:1").is_err());
    }

    fn task(state: TaskState, said: Option<&str>) -> Task {
        Task {
            id: "t1".into(),
            context_id: "c1".into(),
            status: TaskStatus {
                state,
                message: said.map(|text| Message {
                    message_id: "s".into(),
                    role: Role::Agent,
                    parts: vec![Part::Text(text.into())],
                    context_id: None,
                    task_id: None,
                    metadata: None,
                }),
                timestamp_ms: None,
            },
            artifacts: vec![
                Artifact {
                    artifact_id: "a1".into(),
                    name: Some("answer".into()),
                    parts: vec![Part::Text("first".into()), Part::Data(json!({"n": 1}))],
                },
                Artifact { artifact_id: "a2".into(), name: None, parts: vec![Part::Text("second".into())] },
            ],
            history: vec![],
        }
    }

    #[test]
    fn results_join_the_artifacts_text_and_failures_are_errors() {
        let done = task_result(&task(TaskState::Completed, Some("done"))).unwrap();
        assert_eq!(done["task_id"], "t1");
        assert_eq!(done["context_id"], "c1");
        assert_eq!(done["state"], "completed");
        assert_eq!(done["text"], "first\nsecond");
        assert_eq!(done["question"], Value::Null);
        assert_eq!(
            done["artifacts"][0]["parts"][1],
            json!({"data": {"n": 1}, "mediaType": "application/json"})
        );
        assert_eq!(
            done["artifacts"][1],
            json!({"artifact_id": "a2", "name": null, "parts": [{"text": "second"}]})
        );
        let asking = task_result(&task(TaskState::InputRequired, Some("which year?"))).unwrap();
        assert_eq!(
            (asking["state"].as_str(), asking["question"].as_str()),
            (Some("input-required"), Some("which year?"))
        );
        for (state, says) in [
            (TaskState::Failed, "is failed: out of paper"),
            (TaskState::Rejected, "is rejected: out of paper"),
            (TaskState::Canceled, "is canceled"),
            (TaskState::AuthRequired, "is auth-required"),
        ] {
            let error = task_result(&task(state, Some("out of paper"))).unwrap_err();
            assert!(error.contains(says) && error.contains("t1"), "{error}");
        }
        let silent = task_result(&task(TaskState::Failed, None)).unwrap_err();
        assert!(silent.contains("gave no reason"), "{silent}");
    }

    #[test]
    fn send_results_are_read_in_both_versions() {
        let v1_task =
            json!({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"}}});
        assert!(matches!(parse_send_result(&v1_task, Version::V1), Ok(Answer::Task(t)) if t.id == "t"));
        let v1_message = json!({"message": {"messageId": "m", "contextId": "c", "role": "ROLE_AGENT", "parts": [{"text": "direct reply"}]}});
        let Ok(Answer::Message(reply)) = parse_send_result(&v1_message, Version::V1) else { panic!() };
        assert_eq!(message_result(&reply), json!({"context_id": "c", "text": "direct reply"}));
        let v03_task =
            json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "input-required"}});
        assert!(
            matches!(parse_send_result(&v03_task, Version::V03), Ok(Answer::Task(t)) if t.status.state == TaskState::InputRequired)
        );
        let v03_message = json!({"messageId": "m", "role": "agent", "parts": [{"kind": "text", "text": "x"}, {"kind": "data", "data": {"a": 1}}]});
        let Ok(Answer::Message(reply)) = parse_send_result(&v03_message, Version::V03) else { panic!() };
        assert_eq!(message_result(&reply), json!({"context_id": null, "text": "x", "data": {"a": 1}}));
        let error = parse_send_result(&json!({"other": 1}), Version::V1).unwrap_err();
        assert!(error.contains("`task` or a `message`"), "{error}");
    }

    #[test]
    fn a_token_is_read_from_the_kernels_environment_when_needed() {
        let mut def = def();
        assert_eq!(def.token(), Ok(None));
        def.token_env = Some("KEEL_TOOLS_A2A_TEST_UNSET_VARIABLE".into());
        let error = def.token().unwrap_err();
        assert!(
            error.contains("KEEL_TOOLS_A2A_TEST_UNSET_VARIABLE") && error.contains("\"research\""),
            "{error}"
        );
        def.token_env = Some("PATH".into());
        assert!(def.token().unwrap().is_some());
    }
}
