//! The kernel's `/v1/event-triggers` routes, for `keel event`.

use anyhow::Result;
use keel_protocol::triggers::{CreateEventTriggerParams, EventTriggerView};

use super::Client;

impl Client {
    pub async fn create_event_trigger(&self, params: &CreateEventTriggerParams) -> Result<EventTriggerView> {
        self.send(self.http.post(self.url("/v1/event-triggers")).json(params)).await
    }

    pub async fn event_triggers(&self) -> Result<Vec<EventTriggerView>> {
        self.send(self.http.get(self.url("/v1/event-triggers"))).await
    }

    pub async fn event_trigger(&self, name: &str) -> Result<EventTriggerView> {
        self.send(self.http.get(self.segments_url(&["event-triggers", name])?)).await
    }

    pub async fn delete_event_trigger(&self, name: &str) -> Result<EventTriggerView> {
        self.send(self.http.delete(self.segments_url(&["event-triggers", name])?)).await
    }

    /// `action` is `pause` or `resume`.
    pub async fn event_trigger_action(&self, name: &str, action: &str) -> Result<EventTriggerView> {
        self.send(self.http.post(self.segments_url(&["event-triggers", name, action])?)).await
    }
}
