//! `/mcp`: the kernel as an MCP server (streamable HTTP), for any MCP client (Claude
//! Desktop, Cursor, another system's agent). The bearer token is the caller's API token,
//! the operator's or a tenant's, resolved to the same `Principal` the HTTP routes use, and
//! every tool calls the kernel method its route calls with it: a tenant's token acts only
//! within its tenant, and another tenant's run answers exactly like a missing one.
//!
//! Tools (schemas in `mcp/tools.rs`): `run_agent`, `list_runs`, `get_run`,
//! `get_run_logs`, `stop_run`, `pause_run`, `resume_run`, `answer`, `approve`, `deny`,
//! `send_message`, `search_memory`, `exec_code`. Arguments are checked against the tool's
//! schema, then read into typed arguments; a refusal is a tool result with `isError: true`
//! whose text names the argument and the rule, and nothing is started or changed.
//!
//! Resources: `keel://runs/{id}` (the run, as `get_run` answers it) and
//! `keel://runs/{id}/journal` (its journal and parked approvals); `resources/list` names
//! the principal's 100 newest runs. A URI naming nothing (or another tenant's run) is
//! MCP's `-32002` "resource not found".

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use keel_kernel::{Answer, Command, Principal};
use keel_mcp::{HostError, ResourceInfo, ResourceTemplateInfo, ResourceText, ToolHost, ToolInfo};
use keel_types::RunId;
use serde_json::{Value, json};

use crate::{ApiError, AppState, ListQuery, run_query};

mod tools;

use tools::{
    AnswerArgs, DecisionArgs, GetArgs, ListArgs, LogsArgs, MessageArgs, RunArgs, SearchArgs, StopArgs,
};

/// The router served at `/mcp` of the API listener.
pub(crate) fn router(state: AppState) -> axum::Router {
    keel_mcp::router(Arc::new(ApiHost(state)))
}

/// The most runs `resources/list` names (newest first); older ones are read by URI.
const LISTED_RUNS: usize = 100;

/// The default of `list_runs`'s `limit`, so a listing fits in a model's context.
const DEFAULT_LIST: usize = 50;

struct ApiHost(AppState);

impl ApiHost {
    async fn principal(&self, token: &str) -> Result<Principal, HostError> {
        match crate::principal_of(&self.0, token, &HeaderMap::new()).await {
            Ok(Some(principal)) => Ok(principal),
            Ok(None) => Err(HostError::Unauthorized(
                "not the operator's token nor a tenant's live one; the operator's is in <data dir>/api-token, \
                 a tenant's comes from `keel tenant token NAME`"
                    .to_owned(),
            )),
            Err(error) => Err(HostError::Failed(error.1.error.message)),
        }
    }

    async fn call_tool(&self, principal: &Principal, name: &str, args: Value) -> Result<Value, ApiError> {
        let kernel = &self.0.kernel;
        match name {
            "run_agent" => {
                let params = typed(args)?;
                Ok(view(kernel.create_run_for(principal, params).await?))
            }
            "list_runs" => {
                let args: ListArgs = typed(args)?;
                let query = ListQuery {
                    state: args.state,
                    limit: Some(args.limit.unwrap_or(DEFAULT_LIST)),
                    tenant: args.tenant,
                    q: args.q,
                    sort: args.sort,
                    offset: args.offset,
                };
                let runs = kernel.runs(principal, &run_query(query)?).await?;
                Ok(json!({ "runs": runs }))
            }
            "get_run" => {
                let args: GetArgs = typed(args)?;
                let run = run_id(&args.run_id)?;
                if args.journal {
                    Ok(view(kernel.inspect(principal, &run).await?))
                } else {
                    Ok(view(kernel.run(principal, &run).await?))
                }
            }
            "get_run_logs" => {
                let args: LogsArgs = typed(args)?;
                let run = self.own_run(principal, &args.run_id).await?;
                let page = kernel
                    .events_page(&run, args.after, args.limit.unwrap_or(1000), keel_protocol::EventKinds::ALL)
                    .await?;
                let next_after = page.events.last().map_or(args.after, |event| event.seq);
                let mut page = view(page);
                page["next_after"] = json!(next_after);
                Ok(page)
            }
            "stop_run" => {
                let args: StopArgs = typed(args)?;
                let run = self.own_run(principal, &args.run_id).await?;
                let grace = args.grace_secs.map(std::time::Duration::from_secs);
                Ok(view(kernel.execute(Command::Stop { run, grace }).await?))
            }
            "pause_run" | "resume_run" => {
                let args: RunArgs = typed(args)?;
                let run = self.own_run(principal, &args.run_id).await?;
                let command = if name == "pause_run" { Command::Pause(run) } else { Command::Resume(run) };
                Ok(view(kernel.execute(command).await?))
            }
            "answer" => {
                let args: AnswerArgs = typed(args)?;
                let answer = match (args.text, args.value) {
                    (Some(text), None) => Answer::Text(text),
                    (None, Some(value)) => Answer::Value(value),
                    (text, _) => {
                        let which = if text.is_some() { "both" } else { "neither" };
                        return Err(invalid(format!(
                            "the answer has {which} of `text` and `value`; send exactly one: `text` for a \
                             plain question, `value` for a question with a form"
                        )));
                    }
                };
                let run = self.own_run(principal, &args.run_id).await?;
                Ok(view(kernel.execute(Command::Answer { run, answer }).await?))
            }
            "approve" | "deny" => {
                let args: DecisionArgs = typed(args)?;
                let run = self.own_run(principal, &args.run_id).await?;
                let decide =
                    Command::Decide { run, call: args.call, approve: name == "approve", note: args.note };
                Ok(view(kernel.execute(decide).await?))
            }
            "send_message" => {
                let args: MessageArgs = typed(args)?;
                let to = run_id(&args.run_id)?;
                let mut send = json!({ "to": to.as_str(), "message": args.message, "wait": args.wait });
                if let Some(correlation_id) = args.correlation_id {
                    send["correlation_id"] = Value::String(correlation_id);
                }
                // As `POST /v1/runs/{id}/messages`: the operator's message goes as the run's
                // own tenant; a tenant's only to its own runs (the store answers another
                // tenant's run as missing).
                let tenant = match principal {
                    Principal::Admin => kernel.tenant_of(&to).await?,
                    Principal::Tenant(name) => name.clone(),
                };
                let sent = kernel.send_message(&tenant, send).await?;
                Ok(json!({ "seq": sent["seq"] }))
            }
            "search_memory" => {
                let args: SearchArgs = typed(args)?;
                let mut params = json!({ "namespace": args.namespace, "query": args.query });
                if let Some(limit) = args.limit {
                    params["limit"] = json!(limit);
                }
                if let Some(mode) = args.mode {
                    params["mode"] = json!(mode);
                }
                Ok(kernel.memory(principal.tenant(), "mem.search", params).await?)
            }
            "exec_code" => {
                let mut params: keel_protocol::api::ExecParams = typed(args)?;
                let tenant = principal.run_tenant(params.tenant.as_deref())?;
                kernel.admit_run(&tenant).await?;
                params.tenant = Some(tenant);
                Ok(view(kernel.exec(params).await?))
            }
            other => Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no tool {other:?}"))),
        }
    }

    /// The run `id` names, if the principal may act on it (as the routes' `own_run`).
    async fn own_run(&self, principal: &Principal, id: &str) -> Result<RunId, ApiError> {
        let run = run_id(id)?;
        self.0.kernel.authorize(principal, &run).await?;
        Ok(run)
    }
}

#[async_trait::async_trait]
impl ToolHost for ApiHost {
    async fn authenticate(&self, token: &str) -> Result<(), HostError> {
        self.principal(token).await.map(|_| ())
    }

    async fn list(&self, token: &str) -> Result<Vec<ToolInfo>, HostError> {
        self.principal(token).await?;
        Ok(tools::specs()
            .iter()
            .map(|spec| ToolInfo {
                name: spec.name.to_owned(),
                description: spec.description.to_owned(),
                input_schema: spec.schema.clone(),
            })
            .collect())
    }

    async fn call(&self, token: &str, name: &str, args: Value) -> Result<Value, HostError> {
        let principal = self.principal(token).await?;
        let Some(spec) = tools::spec(name) else {
            let names: Vec<&str> = tools::specs().iter().map(|spec| spec.name).collect();
            return Err(HostError::NotFound(format!("`{name}`; the tools are {}", names.join(", "))));
        };
        keel_tools::schema::validate(&spec.schema, &args)
            .map_err(|problem| HostError::InvalidParams(format!("{name}: {problem}")))?;
        self.call_tool(&principal, name, args).await.map_err(|error| tool_error(name, error))
    }

    fn instructions(&self) -> Option<String> {
        Some(
            "Keel runs agents as durable, governed processes. Start one with run_agent, follow it with \
             get_run and get_run_logs, and steer it with answer, approve/deny, send_message, pause_run, \
             resume_run and stop_run. Runs are also resources: keel://runs/{id} and keel://runs/{id}/journal."
                .to_owned(),
        )
    }

    fn resource_templates(&self) -> Vec<ResourceTemplateInfo> {
        vec![
            ResourceTemplateInfo {
                uri_template: "keel://runs/{id}".to_owned(),
                name: "run".to_owned(),
                description: "A run: state, wait reason, open question, output, usage and cost (JSON)."
                    .to_owned(),
                mime_type: Some(JSON.to_owned()),
            },
            ResourceTemplateInfo {
                uri_template: "keel://runs/{id}/journal".to_owned(),
                name: "run journal".to_owned(),
                description: "A run's journal: every syscall with its params and result, and the tool \
                              calls parked for approval (JSON)."
                    .to_owned(),
                mime_type: Some(JSON.to_owned()),
            },
        ]
    }

    async fn list_resources(&self, token: &str) -> Result<Vec<ResourceInfo>, HostError> {
        let principal = self.principal(token).await?;
        let query = keel_kernel::RunQuery { limit: Some(LISTED_RUNS), ..Default::default() };
        let runs =
            self.0.kernel.runs(&principal, &query).await.map_err(|e| resource_error(ApiError::from(e)))?;
        Ok(runs
            .into_iter()
            .map(|run| ResourceInfo {
                uri: format!("keel://runs/{}", run.run_id),
                description: Some(format!(
                    "{} run of tenant {}: {}",
                    run.state,
                    run.tenant,
                    run.command.join(" ")
                )),
                name: run.run_id,
                mime_type: Some(JSON.to_owned()),
            })
            .collect())
    }

    async fn read_resource(&self, token: &str, uri: &str) -> Result<ResourceText, HostError> {
        let principal = self.principal(token).await?;
        let (run, part) = parse_uri(uri)?;
        let kernel = &self.0.kernel;
        let value = match part {
            Part::Run => view(kernel.run(&principal, &run).await.map_err(|e| resource_error(e.into()))?),
            Part::Journal => {
                let inspected =
                    kernel.inspect(&principal, &run).await.map_err(|e| resource_error(e.into()))?;
                json!({ "run_id": run.as_str(), "journal": inspected.journal, "approvals": inspected.approvals })
            }
        };
        let text = serde_json::to_string_pretty(&value).map_err(|e| HostError::Failed(e.to_string()))?;
        Ok(ResourceText { uri: uri.to_owned(), mime_type: JSON.to_owned(), text })
    }
}

const JSON: &str = "application/json";

/// Which resource of a run a URI names.
#[derive(Debug, PartialEq, Eq)]
enum Part {
    Run,
    Journal,
}

/// `keel://runs/{id}` or `keel://runs/{id}/journal`; anything else names no resource.
fn parse_uri(uri: &str) -> Result<(RunId, Part), HostError> {
    let not_found = || {
        HostError::NotFound(format!(
            "no resource {uri:?}; this server reads keel://runs/{{id}} and keel://runs/{{id}}/journal"
        ))
    };
    let rest = uri.strip_prefix("keel://runs/").filter(|rest| !rest.is_empty()).ok_or_else(not_found)?;
    let (id, part) = match rest.split_once('/') {
        None => (rest, Part::Run),
        Some((id, "journal")) => (id, Part::Journal),
        Some(_) => return Err(not_found()),
    };
    let run = RunId::parse(id).map_err(|e| HostError::InvalidParams(format!("{uri:?}: {e}")))?;
    Ok((run, part))
}

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::parse(text).map_err(|e| invalid(format!("run_id: {e}")))
}

fn invalid(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
}

/// Arguments the schema accepted, read into their type (serde names what is still wrong).
fn typed<T: serde::de::DeserializeOwned>(args: Value) -> Result<T, ApiError> {
    serde_json::from_value(args).map_err(|e| invalid(e.to_string()))
}

/// A view as JSON (views always serialize).
fn view(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// The API's error as a tool result with `isError: true`: a refused argument says so; any
/// other names its kind (`not_found`, `conflict`, `forbidden`, `quota_exceeded`...) as
/// the HTTP API's body does.
fn tool_error(tool: &str, error: ApiError) -> HostError {
    let ApiError(status, body, retry_after) = error;
    let message = body.error.message;
    if status == StatusCode::BAD_REQUEST {
        return HostError::InvalidParams(format!("{tool}: {message}"));
    }
    let retry = retry_after.map(|secs| format!(" (retry after {secs} s)")).unwrap_or_default();
    HostError::Failed(format!("{}: {message}{retry}", body.error.kind))
}

fn resource_error(error: ApiError) -> HostError {
    let ApiError(status, body, _) = error;
    match status {
        StatusCode::NOT_FOUND => HostError::NotFound(body.error.message),
        StatusCode::BAD_REQUEST => HostError::InvalidParams(body.error.message),
        _ => HostError::Failed(format!("{}: {}", body.error.kind, body.error.message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_uris_name_a_run_or_its_journal_and_nothing_else() {
        let id = "run_00000000000000000000000000";
        let (run, part) = parse_uri(&format!("keel://runs/{id}")).ok().unwrap();
        assert_eq!((run.as_str(), part), (id, Part::Run));
        let (_, part) = parse_uri(&format!("keel://runs/{id}/journal")).ok().unwrap();
        assert_eq!(part, Part::Journal);
        for uri in
            ["keel://runs/", "file:///etc/passwd", &format!("keel://runs/{id}/secrets"), "keel://tenants/x"]
        {
            assert!(matches!(parse_uri(uri), Err(HostError::NotFound(_))), "{uri}");
        }
        let Err(HostError::InvalidParams(message)) = parse_uri("keel://runs/run_nope") else { panic!() };
        assert!(message.contains("run_nope"), "{message}");
    }

    #[test]
    fn api_errors_become_tool_errors_naming_their_kind() {
        let refused = tool_error("get_run", invalid("run_id: bad".to_owned()));
        assert_eq!(refused, HostError::InvalidParams("get_run: run_id: bad".to_owned()));
        let missing = ApiError::new(StatusCode::NOT_FOUND, "not_found", "no run run_x");
        assert_eq!(tool_error("get_run", missing), HostError::Failed("not_found: no run run_x".to_owned()));
    }
}
