//! The kernel's `/v1/schedules` routes, for `keel schedule`.

use anyhow::Result;
use keel_protocol::api::RunView;
use keel_protocol::triggers::{CreateScheduleParams, ScheduleView};

use super::Client;

impl Client {
    pub async fn create_schedule(&self, params: &CreateScheduleParams) -> Result<ScheduleView> {
        self.send(self.http.post(self.url("/v1/schedules")).json(params)).await
    }

    pub async fn schedules(&self) -> Result<Vec<ScheduleView>> {
        self.send(self.http.get(self.url("/v1/schedules"))).await
    }

    pub async fn schedule(&self, name: &str) -> Result<ScheduleView> {
        self.send(self.http.get(self.segments_url(&["schedules", name])?)).await
    }

    pub async fn delete_schedule(&self, name: &str) -> Result<ScheduleView> {
        self.send(self.http.delete(self.segments_url(&["schedules", name])?)).await
    }

    /// `action` is `pause`, `resume` or `run`.
    pub async fn schedule_action<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
        action: &str,
    ) -> Result<T> {
        self.send(self.http.post(self.segments_url(&["schedules", name, action])?)).await
    }

    pub async fn run_schedule_now(&self, name: &str) -> Result<RunView> {
        self.schedule_action(name, "run").await
    }
}
