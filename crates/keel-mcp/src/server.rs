//! The MCP server: serve a [`ToolHost`]'s tools (and resources, when it has any) over
//! streamable HTTP, behind a bearer token.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate, ServerCapabilities, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;

use crate::names::{kernel_name, served_name};

/// A tool as the kernel serves it; `name` is the kernel's name (it is mapped with
/// [`served_name`] on the wire).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    /// A JSON Schema object; `"type": "object"` is added when missing, and anything that is
    /// not an object is served as `{"type": "object"}`.
    pub input_schema: Value,
}

/// Why the host refused or failed a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The bearer token is unknown or expired: HTTP 401 at the door.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// No such tool for this token; served as a tool result with `isError: true`.
    #[error("no such tool: {0}")]
    NotFound(String),
    /// Policy denied the call; served as a tool result with `isError: true`.
    #[error("denied: {0}")]
    Denied(String),
    /// The tool ran and failed; served as a tool result with `isError: true`.
    #[error("{0}")]
    Failed(String),
    /// The arguments do not match the tool's input schema (or a rule its description
    /// states); served as a tool result with `isError: true`, or for a resource read as
    /// JSON-RPC `-32602`.
    #[error("invalid arguments: {0}")]
    InvalidParams(String),
}

/// A concrete resource a host lists (`resources/list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceInfo {
    pub uri: String,
    pub name: String,
    pub description: Option<String>,
    pub mime_type: Option<String>,
}

/// A family of resources a host can read (`resources/templates/list`), as an RFC 6570 URI
/// template such as `keel://runs/{id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceTemplateInfo {
    pub uri_template: String,
    pub name: String,
    pub description: String,
    pub mime_type: Option<String>,
}

/// What a resource read answers: one text content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceText {
    pub uri: String,
    pub mime_type: String,
    pub text: String,
}

/// The tools one endpoint serves, looked up per bearer token (a token names a run's grant).
///
/// Contract: every method may be called concurrently, from any session. Dropping the future
/// of [`Self::call`] means the client cancelled the request (`notifications/cancelled`) or
/// went away; the host should stop the tool and must not count the call as answered.
#[async_trait::async_trait]
pub trait ToolHost: Send + Sync + 'static {
    /// Decide whether `token` may use this endpoint at all. Runs on every HTTP request before
    /// any MCP processing; an `Err` is an HTTP 401. The default asks [`Self::list`]; override
    /// it when listing is expensive.
    async fn authenticate(&self, token: &str) -> Result<(), HostError> {
        self.list(token).await.map(|_| ())
    }

    /// The tools `token` may see, with kernel names.
    async fn list(&self, token: &str) -> Result<Vec<ToolInfo>, HostError>;

    /// Run the tool with the kernel name `name`. `args` is the call's `arguments` object
    /// (`{}` when the client sent none).
    async fn call(&self, token: &str, name: &str, args: Value) -> Result<Value, HostError>;

    /// What the server tells a client in `initialize` (`instructions`): how to use it.
    fn instructions(&self) -> Option<String> {
        None
    }

    /// The resource templates this host reads. A host with none (the default) serves no
    /// resources and does not announce the capability.
    fn resource_templates(&self) -> Vec<ResourceTemplateInfo> {
        Vec::new()
    }

    /// The concrete resources `token` may read now (`resources/list`).
    async fn list_resources(&self, _token: &str) -> Result<Vec<ResourceInfo>, HostError> {
        Ok(Vec::new())
    }

    /// Read the resource `uri` for `token`. [`HostError::NotFound`] is JSON-RPC `-32002`
    /// (the spec's "resource not found"), [`HostError::InvalidParams`] `-32602`.
    async fn read_resource(&self, _token: &str, uri: &str) -> Result<ResourceText, HostError> {
        Err(HostError::NotFound(format!("no resource {uri:?}")))
    }
}

/// The bearer token of the HTTP request being served, put in the request's extensions by the
/// auth middleware after [`ToolHost::authenticate`] accepted it.
#[derive(Debug, Clone)]
struct BearerToken(String);

/// An axum router serving the MCP streamable HTTP transport at `/` (the kernel nests it at
/// `/mcp`). Requests without a bearer token that [`ToolHost::authenticate`] accepts get HTTP
/// 401 before any MCP processing. A client's `DELETE` of its session is answered `204 No
/// Content`, as the MCP specification's clients expect (rmcp says `202`, which the Python
/// SDK 2.x reports as "Session termination failed").
pub fn router(host: Arc<dyn ToolHost>) -> axum::Router {
    let handler_host = host.clone();
    let service = StreamableHttpService::new(
        move || Ok(HostHandler { host: handler_host.clone() }),
        Arc::new(LocalSessionManager::default()),
        // The bearer token, checked on every request, is what keeps other web pages out; the
        // `Host` allowlist (against DNS rebinding to a tokenless localhost server) would
        // instead refuse the names under which sandboxes reach the kernel.
        StreamableHttpServerConfig::default().disable_allowed_hosts(),
    );
    axum::Router::new()
        .route_service("/", service)
        .layer(axum::middleware::from_fn(session_deleted_is_no_content))
        .layer(axum::middleware::from_fn_with_state(host, require_bearer_token))
}

/// rmcp answers a session `DELETE` with `202 Accepted`; the streamable HTTP transport's
/// clients take only `200`/`204` as "terminated" (and `405` as "not allowed"), so a closed
/// session is answered `204` with no body. Any other answer (404 for an unknown session,
/// 400 without a session id) passes unchanged.
async fn session_deleted_is_no_content(request: Request, next: Next) -> Response {
    let delete = request.method() == axum::http::Method::DELETE;
    let response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        return StatusCode::NO_CONTENT.into_response();
    }
    response
}

async fn require_bearer_token(
    State(host): State<Arc<dyn ToolHost>>,
    mut request: Request,
    next: Next,
) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
        .map(|token| token.trim().to_owned())
        .filter(|token| !token.is_empty());
    let Some(token) = token else {
        return unauthorized("missing bearer token: send `Authorization: Bearer <token>`");
    };
    match host.authenticate(&token).await {
        Ok(()) => {
            request.extensions_mut().insert(BearerToken(token));
            next.run(request).await
        }
        Err(HostError::Unauthorized(message)) => unauthorized(&format!("invalid bearer token: {message}")),
        Err(other) => unauthorized(&format!("invalid bearer token: {other}")),
    }
}

fn unauthorized(message: &str) -> Response {
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], message.to_owned()).into_response()
}

/// The rmcp handler of one MCP session; it only forwards to the host.
#[derive(Clone)]
struct HostHandler {
    host: Arc<dyn ToolHost>,
}

impl HostHandler {
    fn token(context: &RequestContext<RoleServer>) -> Result<String, ErrorData> {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<BearerToken>())
            .map(|token| token.0.clone())
            // The middleware inserts the token before rmcp sees the request, so this is only
            // reachable if the router is assembled differently.
            .ok_or_else(|| ErrorData::invalid_request("unauthorized: no bearer token on this request", None))
    }
}

impl rmcp::ServerHandler for HostHandler {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        let capabilities = if self.host.resource_templates().is_empty() {
            ServerCapabilities::builder().enable_tools().build()
        } else {
            ServerCapabilities::builder().enable_tools().enable_resources().build()
        };
        let mut info = rmcp::model::ServerConfig::new(capabilities);
        info.server_info = Implementation::new("keel", env!("CARGO_PKG_VERSION"));
        info.instructions = self.host.instructions();
        info
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let token = Self::token(&context)?;
        let resources = self.host.list_resources(&token).await.map_err(resource_error)?;
        Ok(ListResourcesResult::with_all_items(
            resources
                .into_iter()
                .map(|info| {
                    let mut resource = Resource::new(info.uri, info.name);
                    resource.description = info.description;
                    resource.mime_type = info.mime_type;
                    resource
                })
                .collect(),
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Self::token(&context)?;
        Ok(ListResourceTemplatesResult::with_all_items(
            self.host
                .resource_templates()
                .into_iter()
                .map(|info| {
                    let mut template = ResourceTemplate::new(info.uri_template, info.name)
                        .with_description(info.description);
                    template.mime_type = info.mime_type;
                    template
                })
                .collect(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let token = Self::token(&context)?;
        let read = self.host.read_resource(&token, &request.uri).await.map_err(resource_error)?;
        let contents = ResourceContents::text(read.text, read.uri).with_mime_type(read.mime_type);
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let token = Self::token(&context)?;
        let tools = self.host.list(&token).await.map_err(host_error_as_protocol_error)?;
        Ok(ListToolsResult::with_all_items(tools.into_iter().map(served_tool).collect()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let token = Self::token(&context)?;
        let Some(name) = kernel_name(&request.name) else {
            return Ok(tool_error(format!("no such tool: `{}`", request.name)).into());
        };
        let args = Value::Object(request.arguments.unwrap_or_default());
        let outcome = tokio::select! {
            outcome = self.host.call(&token, &name, args) => outcome,
            () = context.ct.cancelled() => {
                return Err(ErrorData::invalid_request("the request was cancelled", None));
            }
        };
        match outcome {
            Ok(value) => Ok(tool_success(value).into()),
            Err(HostError::Unauthorized(message)) => {
                Err(host_error_as_protocol_error(HostError::Unauthorized(message)))
            }
            Err(error) => Ok(tool_error(error.to_string()).into()),
        }
    }
}

fn served_tool(tool: ToolInfo) -> Tool {
    // MCP requires `inputSchema` to be an object schema with `"type": "object"`.
    let mut input_schema = match tool.input_schema {
        Value::Object(schema) => schema,
        _ => serde_json::Map::new(),
    };
    input_schema.entry("type").or_insert_with(|| Value::String("object".to_owned()));
    Tool::new(served_name(&tool.name), tool.description, Arc::new(input_schema))
}

fn tool_success(value: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
    if value.is_object() {
        result.structured_content = Some(value);
    }
    result
}

fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

fn host_error_as_protocol_error(error: HostError) -> ErrorData {
    ErrorData::invalid_request(error.to_string(), None)
}

/// A failed resource request in MCP's own error shape: `-32002` for a resource that does
/// not exist (or that the token may not see), `-32602` for a malformed URI.
fn resource_error(error: HostError) -> ErrorData {
    match error {
        HostError::NotFound(message) => ErrorData::resource_not_found(message, None),
        HostError::InvalidParams(message) => ErrorData::invalid_params(message, None),
        HostError::Failed(message) => ErrorData::internal_error(message, None),
        other => host_error_as_protocol_error(other),
    }
}
