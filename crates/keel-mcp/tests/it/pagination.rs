//! `tools/list` pagination: `Client::connect` follows `nextCursor` to the last page.

use std::sync::Arc;
use std::time::Duration;

use keel_mcp::{Client, ServerConfig, Transport};
use rmcp::model::{ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};

/// Serves tools `t0`..`t4` two per page; the cursor is the index of the next tool.
#[derive(Clone)]
struct PagedServer;

impl ServerHandler for PagedServer {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        rmcp::model::ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let start: usize =
            request.and_then(|request| request.cursor).map_or(0, |cursor| cursor.parse().unwrap());
        let end = (start + 2).min(5);
        let schema = Arc::new(serde_json::Map::from_iter([("type".to_owned(), "object".into())]));
        let tools =
            (start..end).map(|index| Tool::new(format!("t{index}"), "paged", schema.clone())).collect();
        let mut page = ListToolsResult::with_all_items(tools);
        page.next_cursor = (end < 5).then(|| end.to_string());
        Ok(page)
    }
}

#[tokio::test]
async fn connect_follows_next_cursor_to_the_last_page() {
    let service = StreamableHttpService::new(
        || Ok(PagedServer),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new().route_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let config = ServerConfig {
        name: "paged".to_owned(),
        transport: Transport::Http { url: format!("http://{address}/mcp"), headers: Default::default() },
        timeout: Duration::from_secs(10),
    };
    let client = Client::connect(&config).await.unwrap();
    let names: Vec<&str> = client.tools().iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["t0", "t1", "t2", "t3", "t4"]);
    client.close().await;
}
