//! A2A push notifications: a task's webhooks (kept in kv, scope `a2a:push`, under the
//! task id) and the watcher that POSTs each change of the task to them, with the config's
//! token (`X-A2A-Notification-Token`) and credentials (`Authorization`). Best effort, as
//! A2A's push is: a failed POST is retried twice and logged; the watcher lives as long as
//! the kernel that started it.

use std::time::Duration;

use keel_protocol::a2a::{self as wire, PushConfig, StreamEvent};
use keel_store::RunRecord;
use keel_types::RunId;
use serde_json::Value;

use crate::{Kernel, Result};

/// Where push-notification configs are kept (kv scope; the key is the task id).
const PUSH_SCOPE: &str = "a2a:push";

impl Kernel {
    pub(super) async fn a2a_push_configs(&self, run: &RunId) -> Result<Vec<PushConfig>> {
        let stored = self.store().kv_get(PUSH_SCOPE, run.as_str()).await?;
        Ok(stored.and_then(|value| serde_json::from_value(value).ok()).unwrap_or_default())
    }

    pub(super) async fn a2a_push_store(&self, run: &RunId, configs: &[PushConfig]) -> Result<()> {
        let value = serde_json::to_value(configs).unwrap_or(Value::Null);
        Ok(self.store().kv_put(PUSH_SCOPE, run.as_str(), value).await?)
    }

    /// Stores a push-notification config (replacing one of the same id) and starts
    /// sending the task's changes to it.
    pub(super) async fn a2a_push_add(&self, record: &RunRecord, config: PushConfig) -> Result<()> {
        let mut configs = self.a2a_push_configs(&record.id).await?;
        configs.retain(|other| other.id != config.id);
        configs.push(config.clone());
        self.a2a_push_store(&record.id, &configs).await?;
        let mut stream = self.a2a_stream(record, wire::Version::V1, Value::Null, None, false);
        let kernel = self.clone();
        let run = record.id.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build();
            let Ok(client) = client else { return };
            let mut first = true;
            loop {
                let event = match stream.next_event().await {
                    Ok(Some(event)) => event,
                    Ok(None) => return,
                    Err(error) => {
                        tracing::warn!("A2A push notifications of task {run} stopped: {error}");
                        return;
                    }
                };
                // The config may have been deleted or replaced since.
                let current = kernel.a2a_push_configs(&run).await.unwrap_or_default();
                if !current.contains(&config) {
                    return;
                }
                let body = if std::mem::take(&mut first) {
                    match kernel.get(&run).await {
                        Ok(record) => match kernel.a2a_task(&record).await {
                            Ok(task) => wire::stream_event_json(&StreamEvent::Task(task), wire::Version::V1),
                            Err(_) => wire::stream_event_json(&event, wire::Version::V1),
                        },
                        Err(_) => wire::stream_event_json(&event, wire::Version::V1),
                    }
                } else {
                    wire::stream_event_json(&event, wire::Version::V1)
                };
                push(&client, &config, &body).await;
            }
        });
        Ok(())
    }
}

/// Sends one notification, retried twice; failures are logged (A2A's push is best effort).
async fn push(client: &reqwest::Client, config: &PushConfig, body: &Value) {
    for attempt in 0..3u64 {
        let mut request = client.post(&config.url).json(body);
        if let Some(token) = &config.token {
            request = request.header("X-A2A-Notification-Token", token);
        }
        if let Some(scheme) = &config.scheme {
            let credentials = config.credentials.as_deref().unwrap_or_default();
            request = request.header("Authorization", format!("{scheme} {credentials}"));
        }
        match request.send().await {
            Ok(answer) if answer.status().is_success() => return,
            Ok(answer) => tracing::warn!("A2A push to {} answered {}", config.url, answer.status()),
            Err(error) => tracing::warn!("A2A push to {} failed: {error}", config.url),
        }
        tokio::time::sleep(Duration::from_millis(500 * (attempt + 1))).await;
    }
}
