//! The `llm.chat` effect: the loop detector, a worst-case budget reservation before the
//! intent is journaled, the provider call in the caller's place in its queue, and the
//! settlement after.

use std::sync::Arc;

use keel_llm::Provider;
use keel_protocol::rpc::{ErrorKind, LlmChatParams};
use keel_store::Seq;
use keel_types::Usage;
use serde_json::{Value, json};

use crate::Kernel;
use crate::lock;

use super::dispatch::Listener;
use super::journal::{self, Effect, Journaling};
use super::{Reply, SyscallError, internal};

/// A provider failure as the agent sees it; `data` carries the class, the upstream status
/// and any retry-after, so the compatibility endpoints can answer with the right status.
fn provider_error(err: &keel_llm::Error) -> SyscallError {
    let mut error = SyscallError::new(ErrorKind::ProviderError, err.to_string());
    if let Some(class) = err.class() {
        error = error.with("class", class.as_str()).with("status", class.http_status());
    }
    if let Some(after) = err.retry_after() {
        error = error.with("retry_after_ms", after.as_millis() as u64);
    }
    error
}

/// Runs an LLM call, and says how long it waited in its model's queue for the provider's
/// capacity (see `keel_llm::ratelimit::QUEUE_WAIT`).
async fn queue_wait<T>(call: impl std::future::Future<Output = T>) -> (T, std::time::Duration) {
    let total = std::cell::Cell::new(std::time::Duration::ZERO);
    keel_llm::ratelimit::QUEUE_WAIT
        .scope(total, async {
            let outcome = call.await;
            (outcome, keel_llm::ratelimit::QUEUE_WAIT.with(std::cell::Cell::get))
        })
        .await
}

impl Kernel {
    /// `llm.chat`: the loop detector, then a worst-case budget reservation before the
    /// intent is journaled, so spend never exceeds the budget however many calls are in
    /// flight; the provider call in the caller's place in its queue; settlement after.
    pub(super) async fn llm_chat(
        &self,
        journal: journal::Call<'_>,
        how: Journaling,
        request: LlmChatParams,
        mut listener: Listener,
    ) -> Reply {
        let live = journal.live;
        let provider: Arc<dyn Provider> = live
            .provider
            .clone()
            .ok_or_else(|| SyscallError::new(ErrorKind::NoProvider, keel_llm::router::NO_PROVIDER_HELP))?;
        if journal.reuse.is_none() {
            self.check_loop(live, &journal.hash).await?;
        }
        let input = keel_llm::estimate_input_tokens(&request);
        let model = request.model.as_deref();
        let max_output = request.max_tokens.map_or(keel_llm::DEFAULT_MAX_OUTPUT_TOKENS, u64::from);
        let worst = Usage {
            input_tokens: input,
            output_tokens: max_output,
            llm_calls: 1,
            tool_calls: 0,
            cost_micro_usd: (provider.worst_case_cost_usd(model, input, max_output) * 1_000_000.0).ceil()
                as u64,
        };
        // A prompt bigger than the whole budget would park the run for good: refuse it now,
        // saying why, before anything is journaled.
        let input_only = Usage {
            input_tokens: input,
            cost_micro_usd: (provider.worst_case_cost_usd(model, input, 0) * 1_000_000.0).ceil() as u64,
            ..Usage::default()
        };
        let limits = lock(&live.budget.account).limits();
        if let Some(never) = keel_core::budget::never_fits(&limits, &input_only) {
            // `never_fits` tells it apart from a call that merely does not fit now.
            return Err(SyscallError::new(
                ErrorKind::BudgetExhausted,
                crate::budget::never_fits_message(&never),
            )
            .with("never_fits", true)
            .with("needs", never.needs)
            .with("limit", never.limit));
        }
        let reservation = self.reserve(live, worst).await?;
        let effect = |seq: Option<Seq>| async move {
            if let Some(seq) = seq {
                listener.journaled(seq);
            }
            // A run someone follows as AG-UI streams its calls to them (`crate::deltas`).
            let stream = self.inner.live_deltas.sink(&live.id, seq, listener.deltas);
            let started = std::time::Instant::now();
            // Calls waiting for the provider's capacity go in priority and fair-share
            // order between tenants; the run shows its place in `keel ps`.
            let caller = keel_llm::ratelimit::Caller {
                tenant: live.tenant.clone(),
                priority: live.priority,
                run: Some(live.id.to_string()),
            };
            let chat = provider.chat(&request, stream.sink());
            let (outcome, queue_wait) = queue_wait(keel_llm::ratelimit::CALLER.scope(caller, chat)).await;
            stream.finish().await;
            let mut effect = match outcome {
                Ok(served) => {
                    let usage = Usage {
                        input_tokens: served.response.usage.input_tokens,
                        output_tokens: served.response.usage.output_tokens,
                        llm_calls: 1,
                        tool_calls: 0,
                        cost_micro_usd: (served.response.cost_usd * 1_000_000.0).round() as u64,
                    };
                    self.inner.metrics.llm_served(&live.tenant, &served.meta, &usage, queue_wait);
                    match serde_json::to_value(&served.response) {
                        Ok(response) => {
                            // The reply: the result itself for a caller that takes it
                            // typed (see `Listener::result`), else a copy of its JSON.
                            let reply = match listener.result.take() {
                                Some(typed) => {
                                    let _ = typed.send(served.response);
                                    Value::Null
                                }
                                None => response.clone(),
                            };
                            // Built from the parts, not with `json!`, which would copy each
                            // through serde (the meta is moved).
                            let record = Value::Object(serde_json::Map::from_iter([
                                ("response".to_owned(), response),
                                ("provider".to_owned(), served.meta),
                            ]));
                            let mut effect = Effect::reply(Ok(reply)).usage(usage);
                            effect.record = Some(record);
                            effect.served = true;
                            effect
                        }
                        Err(err) => Effect::reply(Err(internal(err))).usage(usage),
                    }
                }
                Err(err) => {
                    self.inner.metrics.llm_failed(&err);
                    Effect::reply(Err(provider_error(&err))).usage(Usage { llm_calls: 1, ..Usage::default() })
                }
            };
            self.settle_budget(live, reservation, effect.usage);
            effect.event = json!({
                "input_tokens": effect.usage.input_tokens, "output_tokens": effect.usage.output_tokens,
                "duration_ms": started.elapsed().as_millis() as u64,
            });
            effect
        };
        let done = self.journaled(journal, how, effect).await;
        if done.seq.is_none() {
            self.release_budget(live, reservation); // The intent failed: the call never ran.
        }
        done.reply
    }
}
