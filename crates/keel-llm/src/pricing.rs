//! Prices and estimates for budgets: the shipped default price table (USD per million
//! tokens), lookups that understand dated snapshots (`gpt-4o-mini-2024-07-18`) and route
//! prefixes (`openai/gpt-4o`), the cost of a served call, the worst case of a call about
//! to be sent, and the input-token over-estimate used for reservations.

use std::collections::{BTreeMap, HashMap};
use std::sync::{PoisonError, RwLock};

use keel_protocol::rpc::{LlmChatParams, TokenUsage};
use serde::Deserialize;

/// Output tokens assumed (reserved) for a call that sets no `max_tokens`. The providers
/// send this as the upstream `max_tokens` when the request has none, so the reservation is
/// a true upper bound.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 4096;

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

impl ModelPrice {
    pub const fn new(input_per_mtok: f64, output_per_mtok: f64) -> ModelPrice {
        ModelPrice { input_per_mtok, output_per_mtok }
    }

    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> f64 {
        (input_tokens as f64 * self.input_per_mtok + output_tokens as f64 * self.output_per_mtok)
            / 1_000_000.0
    }
}

/// DEFAULT PRICES, shipped so budgets mean something out of the box. They are list prices
/// (standard tier, no batch or cache discounts) as published by the providers in 2025 and
/// WILL go stale: override them in keel.toml (`[llm.prices."model"]`). A model name
/// matches an entry when it equals it or extends it with a `-suffix` (a dated snapshot
/// or `-latest`); the longest entry wins.
pub const DEFAULT_PRICES: &[(&str, ModelPrice)] = &[
    // OpenAI
    ("gpt-4o", ModelPrice::new(2.50, 10.00)),
    ("gpt-4o-mini", ModelPrice::new(0.15, 0.60)),
    ("gpt-4.1", ModelPrice::new(2.00, 8.00)),
    ("gpt-4.1-mini", ModelPrice::new(0.40, 1.60)),
    ("gpt-4.1-nano", ModelPrice::new(0.10, 0.40)),
    ("gpt-5", ModelPrice::new(1.25, 10.00)),
    ("gpt-5-mini", ModelPrice::new(0.25, 2.00)),
    ("gpt-5-nano", ModelPrice::new(0.05, 0.40)),
    ("o1", ModelPrice::new(15.00, 60.00)),
    ("o3", ModelPrice::new(2.00, 8.00)),
    ("o3-mini", ModelPrice::new(1.10, 4.40)),
    ("o4-mini", ModelPrice::new(1.10, 4.40)),
    // Anthropic
    ("claude-3-haiku", ModelPrice::new(0.25, 1.25)),
    ("claude-3-5-haiku", ModelPrice::new(0.80, 4.00)),
    ("claude-haiku-4-5", ModelPrice::new(1.00, 5.00)),
    ("claude-3-5-sonnet", ModelPrice::new(3.00, 15.00)),
    ("claude-3-7-sonnet", ModelPrice::new(3.00, 15.00)),
    ("claude-sonnet-4", ModelPrice::new(3.00, 15.00)),
    ("claude-sonnet-4-5", ModelPrice::new(3.00, 15.00)),
    ("claude-3-opus", ModelPrice::new(15.00, 75.00)),
    ("claude-opus-4", ModelPrice::new(15.00, 75.00)),
    ("claude-opus-4-1", ModelPrice::new(15.00, 75.00)),
    ("claude-opus-4-5", ModelPrice::new(5.00, 25.00)),
];

/// Model name → price. Keys are bare model names (`gpt-4o`) or routes (`openai/gpt-4o`);
/// a route key wins over a bare one.
#[derive(Debug)]
pub struct PriceTable {
    entries: BTreeMap<String, ModelPrice>,
    /// [`PriceTable::routed`]'s answers, by `provider/model` (a provider's name has no
    /// `/`): every LLM call asks for its route's price two or three times (the
    /// reservation's worst case, the input-only part, the served cost), and a lookup scans
    /// the whole table. At most [`ROUTED_MEMO_LIMIT`] routes are remembered (the model
    /// names come from agents), past which lookups are simply not remembered.
    routed: RwLock<HashMap<String, Option<ModelPrice>>>,
}

/// How many (provider, model) prices [`PriceTable::routed`] remembers.
const ROUTED_MEMO_LIMIT: usize = 1024;

impl Clone for PriceTable {
    fn clone(&self) -> PriceTable {
        PriceTable::from_entries(self.entries.clone())
    }
}

impl PartialEq for PriceTable {
    fn eq(&self, other: &PriceTable) -> bool {
        self.entries == other.entries
    }
}

impl Default for PriceTable {
    /// The shipped defaults (see [`DEFAULT_PRICES`]).
    fn default() -> PriceTable {
        PriceTable::from_entries(
            DEFAULT_PRICES.iter().map(|(name, price)| ((*name).to_owned(), *price)).collect(),
        )
    }
}

impl PriceTable {
    pub fn empty() -> PriceTable {
        PriceTable::from_entries(BTreeMap::new())
    }

    fn from_entries(entries: BTreeMap<String, ModelPrice>) -> PriceTable {
        PriceTable { entries, routed: RwLock::default() }
    }

    /// The defaults with `overrides` on top (new models added, listed ones replaced).
    pub fn with_overrides<'a>(
        overrides: impl IntoIterator<Item = (&'a String, &'a ModelPrice)>,
    ) -> PriceTable {
        let mut entries = PriceTable::default().entries;
        for (name, price) in overrides {
            entries.insert(name.clone(), *price);
        }
        PriceTable::from_entries(entries)
    }

    /// The price of `model` asked of `provider`: what `lookup("{provider}/{model}")`
    /// gives (a route key first, then the bare model), remembered, so that a call's
    /// repeated asks do not scan the table again.
    pub fn routed(&self, provider: &str, model: &str) -> Option<ModelPrice> {
        let mut route = String::with_capacity(provider.len() + 1 + model.len());
        for part in [provider, "/", model] {
            route.push_str(part);
        }
        if let Some(price) = self.routed.read().unwrap_or_else(PoisonError::into_inner).get(&route) {
            return *price;
        }
        let price = self.lookup(&route);
        let mut memo = self.routed.write().unwrap_or_else(PoisonError::into_inner);
        if memo.len() < ROUTED_MEMO_LIMIT {
            memo.insert(route, price);
        }
        price
    }

    /// The price of `model` (`gpt-4o-mini-2024-07-18`, `openai/gpt-4o`, `claude-3-5-haiku-latest`).
    pub fn lookup(&self, model: &str) -> Option<ModelPrice> {
        self.longest_match(model).or_else(|| {
            let (_, bare) = model.split_once('/')?;
            self.lookup(bare)
        })
    }

    fn longest_match(&self, model: &str) -> Option<ModelPrice> {
        self.entries
            .iter()
            .filter(|(name, _)| {
                model == name.as_str()
                    || model.strip_prefix(name.as_str()).is_some_and(|rest| rest.starts_with(['-', ':', '@']))
            })
            .max_by_key(|(name, _)| name.len())
            .map(|(_, price)| *price)
    }

    /// The cost of a served call; 0 for a model without a price (local models, or one
    /// the table does not know: add it under `[llm.prices]`).
    pub fn price(&self, model: &str, usage: TokenUsage) -> f64 {
        self.lookup(model).map_or(0.0, |p| p.cost(usage.input_tokens, usage.output_tokens))
    }

    /// The most a call of `model`, asked of `provider`, can cost: the input estimate plus
    /// every allowed output token (see [`PriceTable::routed`]).
    pub fn worst_case_cost(&self, provider: &str, model: &str, input_estimate: u64, max_tokens: u64) -> f64 {
        self.routed(provider, model).map_or(0.0, |p| p.cost(input_estimate, max_tokens))
    }
}

/// A deliberate over-estimate of a request's input tokens, for budget reservations (the
/// real count comes back with the response and settles the reservation): one token per 3
/// bytes of text (real tokenizers average about 4 for English, fewer bytes per token only
/// for unusual text) plus 8 tokens of framing per message, and the tool schemas' and tool
/// calls' JSON counted the same way.
pub fn estimate_input_tokens(request: &LlmChatParams) -> u64 {
    let text: usize = request
        .messages
        .iter()
        .map(|m| {
            m.content.as_deref().map_or(0, str::len)
                + m.tool_calls.as_ref().map_or(0, |calls| calls.iter().map(|c| c.to_string().len()).sum())
        })
        .sum();
    let tools: usize =
        request.tools.as_ref().map_or(0, |tools| tools.iter().map(|t| t.to_string().len()).sum());
    ((text + tools) as u64).div_ceil(3) + 8 * request.messages.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::rpc::{ChatMessage, ChatRole};

    #[test]
    fn lookups_understand_snapshots_aliases_and_routes() {
        let table = PriceTable::default();
        let price = |m: &str| table.lookup(m).map(|p| (p.input_per_mtok, p.output_per_mtok));
        assert_eq!(price("gpt-4o"), Some((2.5, 10.0)));
        assert_eq!(price("gpt-4o-mini"), Some((0.15, 0.6)));
        assert_eq!(price("gpt-4o-mini-2024-07-18"), Some((0.15, 0.6)), "the longest entry wins");
        assert_eq!(price("gpt-4o-2024-08-06"), Some((2.5, 10.0)));
        assert_eq!(price("openai/gpt-4.1-nano"), Some((0.1, 0.4)));
        assert_eq!(price("o3-mini-2025-01-31"), Some((1.1, 4.4)));
        assert_eq!(price("o3"), Some((2.0, 8.0)));
        assert_eq!(price("claude-3-5-haiku-latest"), Some((0.8, 4.0)));
        assert_eq!(price("claude-sonnet-4-20250514"), Some((3.0, 15.0)));
        assert_eq!(price("anthropic/claude-opus-4-1-20250805"), Some((15.0, 75.0)));
        assert_eq!(price("claude-opus-4-5"), Some((5.0, 25.0)));
        assert_eq!(price("o3x"), None, "a prefix must end at a separator");
        assert_eq!(price("gpt-4"), None);
        assert_eq!(price("llama3.1:8b"), None);
    }

    #[test]
    fn overrides_replace_and_add_and_routes_win() {
        let overrides = BTreeMap::from([
            ("gpt-4o".to_owned(), ModelPrice::new(1.0, 2.0)),
            ("llama3.1".to_owned(), ModelPrice::new(0.0, 0.0)),
            ("openrouter/gpt-4o".to_owned(), ModelPrice::new(3.0, 12.0)),
        ]);
        let table = PriceTable::with_overrides(&overrides);
        assert_eq!(table.lookup("gpt-4o"), Some(ModelPrice::new(1.0, 2.0)));
        assert_eq!(table.lookup("openai/gpt-4o"), Some(ModelPrice::new(1.0, 2.0)));
        assert_eq!(table.lookup("openrouter/gpt-4o"), Some(ModelPrice::new(3.0, 12.0)));
        assert_eq!(table.lookup("llama3.1:8b"), Some(ModelPrice::new(0.0, 0.0)));
        assert_eq!(
            table.lookup("gpt-4o-mini"),
            Some(ModelPrice::new(0.15, 0.6)),
            "others keep their default"
        );
    }

    #[test]
    fn a_routed_price_is_the_routes_lookup_asked_again_or_not() {
        let overrides = BTreeMap::from([
            ("openrouter/gpt-4o".to_owned(), ModelPrice::new(3.0, 12.0)),
            ("llama3.1".to_owned(), ModelPrice::new(0.0, 0.0)),
        ]);
        let table = PriceTable::with_overrides(&overrides);
        let cases = [
            ("openai", "gpt-4o-mini-2024-07-18"),
            ("openrouter", "gpt-4o"),
            ("openrouter", "gpt-4o-2024-08-06"),
            ("openai", "gpt-4o"),
            ("ollama", "llama3.1:8b"),
            ("openrouter", "anthropic/claude-opus-4-1"),
            ("openai", "no-such-model"),
            ("anthropic", "claude-sonnet-4-5"),
        ];
        for _ in 0..3 {
            for (provider, model) in cases {
                assert_eq!(
                    table.routed(provider, model),
                    table.lookup(&format!("{provider}/{model}")),
                    "{provider}/{model}"
                );
            }
        }
        // Models named by agents are remembered only up to the limit; past it, the
        // answers stay right.
        for i in 0..ROUTED_MEMO_LIMIT + 100 {
            assert_eq!(table.routed("openai", &format!("gpt-4o-{i}")), Some(ModelPrice::new(2.5, 10.0)));
        }
        assert_eq!(table.routed.read().unwrap().len(), ROUTED_MEMO_LIMIT);
        assert_eq!(table.routed("openai", "gpt-4o-mini-x"), Some(ModelPrice::new(0.15, 0.6)));
        assert_eq!(table.routed("openrouter", "gpt-4o"), Some(ModelPrice::new(3.0, 12.0)));
        assert_eq!(table.clone(), table, "a clone has the same prices, remembered or not");
    }

    #[test]
    fn costs() {
        let table = PriceTable::default();
        let usage = TokenUsage { input_tokens: 1_000_000, output_tokens: 500_000 };
        assert!((table.price("gpt-4o-mini", usage) - 0.45).abs() < 1e-12);
        assert_eq!(table.price("unknown-model", usage), 0.0);
        assert!(
            (table.worst_case_cost("anthropic", "claude-sonnet-4-5", 2000, 4096) - (0.006 + 0.06144)).abs()
                < 1e-12
        );
        assert_eq!(PriceTable::empty().worst_case_cost("openai", "gpt-4o", 10, 10), 0.0);
    }

    #[test]
    fn the_input_estimate_over_counts() {
        let message = |role, text: &str| ChatMessage {
            role,
            content: Some(text.to_owned()),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning: None,
        };
        let request = LlmChatParams {
            messages: vec![
                message(ChatRole::System, "be brief"),
                message(ChatRole::User, &"word ".repeat(300)),
            ],
            ..LlmChatParams::default()
        };
        // 1508 bytes / 3 = 503, + 2 messages * 8. A real tokenizer gives about 310 here.
        assert_eq!(estimate_input_tokens(&request), 503 + 16);
        assert_eq!(estimate_input_tokens(&LlmChatParams::default()), 0);
    }
}
