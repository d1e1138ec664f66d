//! The kernel's `/v1/hooks` routes, for `keel hook`.

use anyhow::Result;
use keel_protocol::triggers::{CreateHookParams, HookView};

use super::Client;

impl Client {
    pub async fn create_hook(&self, params: &CreateHookParams) -> Result<HookView> {
        self.send(self.http.post(self.url("/v1/hooks")).json(params)).await
    }

    pub async fn hooks(&self) -> Result<Vec<HookView>> {
        self.send(self.http.get(self.url("/v1/hooks"))).await
    }

    pub async fn hook(&self, name: &str) -> Result<HookView> {
        self.send(self.http.get(self.segments_url(&["hooks", name])?)).await
    }

    pub async fn delete_hook(&self, name: &str) -> Result<HookView> {
        self.send(self.http.delete(self.segments_url(&["hooks", name])?)).await
    }
}
