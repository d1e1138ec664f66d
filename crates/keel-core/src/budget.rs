//! Budget accounting (DESIGN.md section 5) as pure bookkeeping: reserve the worst case of a
//! call before it is dispatched, settle the actual usage after, carve slices for child runs,
//! and detect an agent that keeps sending the same request.
//!
//! The one promise this module makes is that, as long as every call comes back within what
//! was reserved for it, `spent + reserved` never exceeds a limit in any dimension, whatever
//! the order in which reservations are made, settled and released. The kernel may have many
//! calls in flight at once; because each one holds its worst case until it settles, a call
//! that would not fit is refused before anything is sent, so the budget cannot be
//! overshot. The only ways past a limit are the ones the caller is told about: a provider
//! that bills more than was reserved ([`Settled::overran`]), usage recorded without a
//! reservation ([`Account::record`]), and a child run that returns more than its slice.
//!
//! Cost is counted in micro-dollars so that sums are exact; tokens are input plus output.

use std::collections::BTreeMap;
use std::fmt;

use keel_types::Usage;

/// Limits per dimension; `None` means unlimited. Cost is in micro-USD.
///
/// The same type says how much to add in [`Account::top_up`] and how big a child's slice is
/// in [`Account::carve`]; there `None` means "nothing in this dimension".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub cost_micro_usd: Option<u64>,
    /// Input plus output tokens.
    pub tokens: Option<u64>,
    pub llm_calls: Option<u64>,
    pub tool_calls: Option<u64>,
}

impl Limits {
    /// No limit in any dimension (the same as `Limits::default()`).
    pub const UNLIMITED: Limits =
        Limits { cost_micro_usd: None, tokens: None, llm_calls: None, tool_calls: None };

    /// The limit in one dimension.
    pub fn get(&self, dimension: Dimension) -> Option<u64> {
        match dimension {
            Dimension::CostUsd => self.cost_micro_usd,
            Dimension::Tokens => self.tokens,
            Dimension::LlmCalls => self.llm_calls,
            Dimension::ToolCalls => self.tool_calls,
        }
    }

    fn get_mut(&mut self, dimension: Dimension) -> &mut Option<u64> {
        match dimension {
            Dimension::CostUsd => &mut self.cost_micro_usd,
            Dimension::Tokens => &mut self.tokens,
            Dimension::LlmCalls => &mut self.llm_calls,
            Dimension::ToolCalls => &mut self.tool_calls,
        }
    }

    /// The limits as an amount to hold: `None` holds nothing, and tokens, which a slice does
    /// not split into input and output, are counted as input tokens.
    fn as_amount(&self) -> Amount {
        Usage {
            input_tokens: self.tokens.unwrap_or(0),
            output_tokens: 0,
            llm_calls: self.llm_calls.unwrap_or(0),
            tool_calls: self.tool_calls.unwrap_or(0),
            cost_micro_usd: self.cost_micro_usd.unwrap_or(0),
        }
    }
}

/// Worst-case or actual consumption of one call. Budgets count `input_tokens +
/// output_tokens` as tokens, plus `llm_calls`, `tool_calls` and `cost_micro_usd`.
pub type Amount = Usage;

/// Names one reservation (a call in flight or a child's slice) in one [`Account`]. Ids are
/// never reused within an account, so a stale id cannot release someone else's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReservationId(pub u64);

/// One budgeted quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    /// Money, in micro-USD.
    CostUsd,
    /// Input plus output tokens.
    Tokens,
    LlmCalls,
    ToolCalls,
}

impl Dimension {
    /// Every dimension, in the order in which they are checked and reported: when a call
    /// fails in several dimensions at once, the first one here is named.
    pub const ALL: [Dimension; 4] =
        [Dimension::CostUsd, Dimension::Tokens, Dimension::LlmCalls, Dimension::ToolCalls];

    /// How much of this dimension an amount uses.
    pub fn amount(self, usage: &Usage) -> u64 {
        match self {
            Dimension::CostUsd => usage.cost_micro_usd,
            Dimension::Tokens => usage.input_tokens.saturating_add(usage.output_tokens),
            Dimension::LlmCalls => usage.llm_calls,
            Dimension::ToolCalls => usage.tool_calls,
        }
    }

    /// The `keel budget RUN` flag that tops this dimension up.
    pub fn top_up_flag(self) -> &'static str {
        match self {
            Dimension::CostUsd => "--add-usd",
            Dimension::Tokens => "--add-tokens",
            Dimension::LlmCalls => "--add-llm-calls",
            Dimension::ToolCalls => "--add-tool-calls",
        }
    }

    /// A quantity of this dimension for people: `$0.5000` for cost, a plain count otherwise.
    pub fn format(self, quantity: u64) -> String {
        match self {
            Dimension::CostUsd => format_usd(quantity),
            _ => quantity.to_string(),
        }
    }

    /// A quantity as the `keel budget` flag takes it: dollars without the `$` for cost.
    fn format_flag_value(self, quantity: u64) -> String {
        match self {
            Dimension::CostUsd => format_usd_number(quantity),
            _ => quantity.to_string(),
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dimension::CostUsd => "cost",
            Dimension::Tokens => "tokens",
            Dimension::LlmCalls => "LLM calls",
            Dimension::ToolCalls => "tool calls",
        })
    }
}

/// Formats micro-USD as dollars with at least four decimals: `$0.5000`, `$12.0000`. Digits
/// beyond the fourth are shown when they are not zero (`$0.000012`), so the text is always
/// exact and a message never rounds an amount over a limit down to the limit.
pub fn format_usd(micro: u64) -> String {
    format!("${}", format_usd_number(micro))
}

fn format_usd_number(micro: u64) -> String {
    let dollars = micro / 1_000_000;
    let fraction = format!("{:06}", micro % 1_000_000);
    let shown = fraction.trim_end_matches('0').len().max(4);
    format!("{dollars}.{}", &fraction[..shown])
}

/// A reservation did not fit: in `dimension`, `spent + reserved + requested` would exceed
/// `limit`. Quantities are in the dimension's unit (micro-USD for cost).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "budget exhausted: {dimension} would reach {would_reach} of a {limit_text} limit ({spent_text} spent, \
     {reserved_text} reserved by calls in flight); top it up with `keel budget RUN {flag} {shortfall}` or more",
    would_reach = .dimension.format(self.would_reach()),
    limit_text = .dimension.format(*.limit),
    spent_text = .dimension.format(*.spent),
    reserved_text = .dimension.format(*.reserved),
    flag = .dimension.top_up_flag(),
    shortfall = .dimension.format_flag_value(self.shortfall()),
)]
pub struct Exhausted {
    pub dimension: Dimension,
    pub limit: u64,
    /// Already spent when the reservation was refused.
    pub spent: u64,
    /// Held by other reservations (calls and child slices in flight) at that moment.
    pub reserved: u64,
    /// What the refused reservation asked for.
    pub requested: u64,
}

impl Exhausted {
    /// `spent + reserved + requested`, saturating at `u64::MAX`.
    pub fn would_reach(&self) -> u64 {
        self.spent.saturating_add(self.reserved).saturating_add(self.requested)
    }

    /// The smallest top-up in this dimension after which the refused reservation fits,
    /// given what is spent and reserved now.
    pub fn shortfall(&self) -> u64 {
        self.would_reach().saturating_sub(self.limit)
    }
}

/// A call whose input alone is more than a whole limit: no reservation can ever fit it
/// short of a top-up, so it is refused up front instead of parking the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeverFits {
    pub dimension: Dimension,
    /// What the call's input alone needs (its estimate), in the dimension's unit.
    pub needs: u64,
    pub limit: u64,
}

/// Whether a call that needs `input` (its input tokens, and their cost in micro-USD,
/// before any output) exceeds a whole limit of `limits`: the first such dimension, in
/// [`Dimension::ALL`] order.
pub fn never_fits(limits: &Limits, input: &Amount) -> Option<NeverFits> {
    Dimension::ALL.into_iter().find_map(|dimension| {
        let limit = limits.get(dimension)?;
        let needs = dimension.amount(input);
        (needs > limit).then_some(NeverFits { dimension, needs, limit })
    })
}

/// The outcome of [`Account::settle`] and [`Account::return_slice`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// The first dimension (in [`Dimension::ALL`] order) in which the actual usage exceeded
    /// what was reserved, limited or not; except that a child using a dimension its slice
    /// left unlimited is not an overrun where this account is unlimited too. The usage is recorded anyway, since the money is
    /// gone; if the dimension is limited, the account may now be over its limit, and then
    /// every later reservation is refused until a top-up.
    pub overran: Option<Dimension>,
}

/// A run's budget: its limits, what it has spent, and what calls and child slices in flight
/// hold. See the module docs for the invariant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Account {
    limits: Limits,
    spent: Usage,
    /// Outstanding reservations, calls and child slices alike: both are settled the same
    /// way, by replacing what they hold with what was used.
    reservations: BTreeMap<ReservationId, Reservation>,
    next_id: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Reservation {
    holds: Amount,
    /// For a child's slice, the slice as carved: a dimension it left unlimited held nothing
    /// and does not count as overrun where this account is unlimited too.
    slice: Option<Limits>,
}

impl Account {
    pub fn new(limits: Limits) -> Account {
        Account { limits, ..Account::default() }
    }

    /// Reserves the worst case of a call before it is dispatched. Fails, reserving nothing,
    /// if in any limited dimension `spent + reserved + amount` would exceed the limit; the
    /// error names the first such dimension in [`Dimension::ALL`] order.
    ///
    /// An account already over a limit (after an overrun or [`Account::record`]) refuses
    /// every reservation, even one that asks for nothing in that dimension: the run is over
    /// budget and should park until topped up.
    pub fn reserve(&mut self, amount: Amount) -> Result<ReservationId, Exhausted> {
        self.hold(Reservation { holds: amount, slice: None })
    }

    fn hold(&mut self, reservation: Reservation) -> Result<ReservationId, Exhausted> {
        self.check_fits(&reservation.holds)?;
        let id = ReservationId(self.next_id);
        // Ids come from a u64 counter bumped once per reservation; it cannot wrap in practice.
        self.next_id += 1;
        self.reservations.insert(id, reservation);
        Ok(id)
    }

    /// Replaces a reservation with the actual usage of the call, which counts as spent.
    ///
    /// If the actual exceeds the reservation in some dimension (a provider returned more
    /// than `max_tokens`), it is still recorded, since it was billed, and the result says so.
    /// Settling an id this account does not hold (already settled or released, or from
    /// another account) is a no-op that returns `Settled { overran: None }`: recording the
    /// usage again would count one call twice.
    pub fn settle(&mut self, id: ReservationId, actual: Amount) -> Settled {
        let Some(reservation) = self.reservations.remove(&id) else {
            return Settled::default();
        };
        add_saturating(&mut self.spent, &actual);
        let overran = Dimension::ALL.into_iter().find(|&dimension| {
            let unbounded_here = reservation.slice.is_some_and(|slice| slice.get(dimension).is_none())
                && self.limits.get(dimension).is_none();
            !unbounded_here && dimension.amount(&actual) > dimension.amount(&reservation.holds)
        });
        Settled { overran }
    }

    /// Drops a reservation with no usage (the call failed before anything was billed).
    /// Releasing an id this account does not hold is a no-op.
    pub fn release(&mut self, id: ReservationId) {
        self.reservations.remove(&id);
    }

    /// Adds to the limits. A dimension that is unlimited stays unlimited, and `None` in
    /// `more` adds nothing to that dimension. Sums saturate at `u64::MAX`.
    pub fn top_up(&mut self, more: Limits) {
        for dimension in Dimension::ALL {
            if let (Some(limit), Some(extra)) = (self.limits.get_mut(dimension), more.get(dimension)) {
                *limit = limit.saturating_add(extra);
            }
        }
    }

    /// Everything settled, returned by children and recorded so far.
    pub fn spent(&self) -> Usage {
        self.spent
    }

    /// The sum of the outstanding reservations. A child slice's tokens are counted as input
    /// tokens, since a slice does not split them.
    pub fn reserved(&self) -> Usage {
        let mut total = Usage::default();
        for reservation in self.reservations.values() {
            add_saturating(&mut total, &reservation.holds);
        }
        total
    }

    /// What one outstanding reservation holds, or `None` if the id is not outstanding.
    pub fn reservation(&self, id: ReservationId) -> Option<Amount> {
        self.reservations.get(&id).map(|reservation| reservation.holds)
    }

    /// How many reservations (calls and child slices) are outstanding.
    pub fn outstanding(&self) -> usize {
        self.reservations.len()
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Headroom per dimension, `limit - spent - reserved` (zero when over), or `None` if the
    /// dimension is unlimited.
    pub fn remaining(&self) -> Limits {
        let reserved = self.reserved();
        let mut remaining = Limits::UNLIMITED;
        for dimension in Dimension::ALL {
            *remaining.get_mut(dimension) = self.limits.get(dimension).map(|limit| {
                let used =
                    u128::from(dimension.amount(&self.spent)) + u128::from(dimension.amount(&reserved));
                // The difference is at most `limit`, so it fits in a u64.
                u64::try_from(u128::from(limit).saturating_sub(used)).unwrap_or(0)
            });
        }
        remaining
    }

    /// Records usage that did not go through a reservation (for instance history replayed
    /// at recovery); it counts as spent and may take the account over a limit.
    pub fn record(&mut self, actual: Amount) {
        add_saturating(&mut self.spent, &actual);
    }

    /// Carves a slice for a child run out of this account's headroom; the slice is held as a
    /// reservation until the child returns it. Fails like [`Account::reserve`].
    ///
    /// `None` in a dimension of the slice holds nothing there: the child is unlimited in
    /// that dimension and whatever it uses is charged only when it returns. That is sound
    /// only where this account is unlimited too; in a limited dimension give the child a
    /// limited slice, or its return may overrun this account (and is reported as an
    /// overrun whenever it uses anything there).
    pub fn carve(&mut self, slice: Limits) -> Result<ReservationId, Exhausted> {
        self.hold(Reservation { holds: slice.as_amount(), slice: Some(slice) })
    }

    /// The child finished having spent `used`: the slice's reservation is replaced by `used`
    /// as spent, and the rest of the slice returns to this account's headroom. Behaves like
    /// [`Account::settle`], including for unknown ids and a child that used more than its
    /// slice.
    pub fn return_slice(&mut self, id: ReservationId, used: Amount) -> Settled {
        self.settle(id, used)
    }

    fn check_fits(&self, amount: &Amount) -> Result<(), Exhausted> {
        let reserved = self.reserved();
        for dimension in Dimension::ALL {
            let Some(limit) = self.limits.get(dimension) else { continue };
            let spent = dimension.amount(&self.spent);
            let held = dimension.amount(&reserved);
            let requested = dimension.amount(amount);
            // In u128 so that no sum of three u64s can wrap around and look small.
            if u128::from(spent) + u128::from(held) + u128::from(requested) > u128::from(limit) {
                return Err(Exhausted { dimension, limit, spent, reserved: held, requested });
            }
        }
        Ok(())
    }
}

fn add_saturating(total: &mut Usage, more: &Usage) {
    total.input_tokens = total.input_tokens.saturating_add(more.input_tokens);
    total.output_tokens = total.output_tokens.saturating_add(more.output_tokens);
    total.llm_calls = total.llm_calls.saturating_add(more.llm_calls);
    total.tool_calls = total.tool_calls.saturating_add(more.tool_calls);
    total.cost_micro_usd = total.cost_micro_usd.saturating_add(more.cost_micro_usd);
}

/// Detects an agent stuck sending the same request: [`LoopDetector::observe`] returns true
/// once the same key has been observed `threshold` times in a row, and keeps returning true
/// while it repeats, until a different key or [`LoopDetector::reset`]. A threshold of 0 or 1
/// disables detection (the default), since one call is not a loop.
///
/// The key is whatever identifies "the same request" to the kernel, typically the replay
/// key (method plus params hash), which is short; only the last distinct key is stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopDetector {
    threshold: u32,
    last_key: Option<String>,
    repeats: u32,
}

impl LoopDetector {
    pub fn new(threshold: u32) -> Self {
        LoopDetector { threshold, last_key: None, repeats: 0 }
    }

    /// Notes one request; true if it is the `threshold`-th (or later) identical request in
    /// a row.
    pub fn observe(&mut self, key: &str) -> bool {
        if self.threshold < 2 {
            return false;
        }
        if self.last_key.as_deref() == Some(key) {
            self.repeats = self.repeats.saturating_add(1);
        } else {
            self.last_key = Some(key.to_owned());
            self.repeats = 1;
        }
        self.repeats >= self.threshold
    }

    /// Forgets the run of repeats, for instance when a parked run is resumed by an operator
    /// who wants it to try again.
    pub fn reset(&mut self) {
        self.last_key = None;
        self.repeats = 0;
    }
}

#[cfg(test)]
mod never_fits_tests {
    use super::*;

    #[test]
    fn a_call_whose_input_alone_passes_a_whole_limit_never_fits() {
        let limits = Limits { tokens: Some(1000), cost_micro_usd: Some(50), ..Limits::UNLIMITED };
        let input = |tokens, cost| Usage { input_tokens: tokens, cost_micro_usd: cost, ..Usage::default() };
        assert_eq!(never_fits(&limits, &input(1000, 50)), None, "exactly the limit fits");
        assert_eq!(
            never_fits(&limits, &input(1001, 0)),
            Some(NeverFits { dimension: Dimension::Tokens, needs: 1001, limit: 1000 })
        );
        assert_eq!(never_fits(&limits, &input(5000, 60)).map(|n| n.dimension), Some(Dimension::CostUsd));
        assert_eq!(never_fits(&Limits::UNLIMITED, &input(u64::MAX, u64::MAX)), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// One LLM call's worth of usage.
    fn llm(cost_micro_usd: u64, input_tokens: u64, output_tokens: u64) -> Amount {
        Usage { input_tokens, output_tokens, llm_calls: 1, tool_calls: 0, cost_micro_usd }
    }

    fn tool_call() -> Amount {
        Usage { tool_calls: 1, ..Usage::default() }
    }

    fn cost(cost_micro_usd: u64) -> Amount {
        Usage { cost_micro_usd, ..Usage::default() }
    }

    fn usd_limit(cost_micro_usd: u64) -> Limits {
        Limits { cost_micro_usd: Some(cost_micro_usd), ..Limits::default() }
    }

    fn all_limits(cost_micro_usd: u64, tokens: u64, llm_calls: u64, tool_calls: u64) -> Limits {
        Limits {
            cost_micro_usd: Some(cost_micro_usd),
            tokens: Some(tokens),
            llm_calls: Some(llm_calls),
            tool_calls: Some(tool_calls),
        }
    }

    // Limits and Dimension

    #[test]
    fn unlimited_is_the_default_and_get_reads_each_dimension() {
        assert_eq!(Limits::UNLIMITED, Limits::default());
        let limits = all_limits(1, 2, 3, 4);
        let read: Vec<_> = Dimension::ALL.into_iter().map(|dimension| limits.get(dimension)).collect();
        assert_eq!(read, [Some(1), Some(2), Some(3), Some(4)]);
    }

    #[test]
    fn dimensions_measure_usage_with_tokens_as_input_plus_output() {
        let usage =
            Usage { input_tokens: 10, output_tokens: 5, llm_calls: 2, tool_calls: 3, cost_micro_usd: 7 };
        let measured: Vec<_> = Dimension::ALL.into_iter().map(|dimension| dimension.amount(&usage)).collect();
        assert_eq!(measured, [7, 15, 2, 3]);
        let huge = Usage { input_tokens: u64::MAX, output_tokens: 1, ..Usage::default() };
        assert_eq!(Dimension::Tokens.amount(&huge), u64::MAX, "saturates rather than wrapping to 0");
    }

    #[test]
    fn dimensions_have_names_flags_and_units() {
        let names: Vec<_> = Dimension::ALL.into_iter().map(|dimension| dimension.to_string()).collect();
        assert_eq!(names, ["cost", "tokens", "LLM calls", "tool calls"]);
        let flags: Vec<_> = Dimension::ALL.into_iter().map(Dimension::top_up_flag).collect();
        assert_eq!(flags, ["--add-usd", "--add-tokens", "--add-llm-calls", "--add-tool-calls"]);
        assert_eq!(Dimension::CostUsd.format(1_500_000), "$1.5000");
        assert_eq!(Dimension::Tokens.format(1_500_000), "1500000");
        assert_eq!(Dimension::CostUsd.format_flag_value(12_000), "0.0120");
        assert_eq!(Dimension::LlmCalls.format_flag_value(3), "3");
    }

    // format_usd

    #[test]
    fn format_usd_shows_four_decimals_and_more_only_when_they_matter() {
        let cases = [
            (0, "$0.0000"),
            (1, "$0.000001"),
            (10, "$0.00001"),
            (100, "$0.0001"),
            (12_000, "$0.0120"),
            (500_000, "$0.5000"),
            (512_345, "$0.512345"),
            (1_000_000, "$1.0000"),
            (12_340_000, "$12.3400"),
            (1_234_567, "$1.234567"),
            (u64::MAX, "$18446744073709.551615"),
        ];
        for (micro, text) in cases {
            assert_eq!(format_usd(micro), text, "format_usd({micro})");
        }
    }

    // reserve

    #[test]
    fn a_new_account_has_spent_and_reserved_nothing() {
        let limits = all_limits(500_000, 1_000, 10, 10);
        let account = Account::new(limits);
        assert_eq!(account.limits(), limits);
        assert_eq!(account.spent(), Usage::default());
        assert_eq!(account.reserved(), Usage::default());
        assert_eq!(account.remaining(), limits);
        assert_eq!(account.outstanding(), 0);
    }

    #[test]
    fn an_unlimited_account_accepts_anything() {
        let mut account = Account::default();
        let everything = Usage {
            input_tokens: u64::MAX,
            output_tokens: u64::MAX,
            llm_calls: u64::MAX,
            tool_calls: u64::MAX,
            cost_micro_usd: u64::MAX,
        };
        account.reserve(everything).unwrap();
        account.reserve(everything).unwrap();
        assert_eq!(account.remaining(), Limits::UNLIMITED);
        assert_eq!(account.reserved().cost_micro_usd, u64::MAX, "sums saturate");
    }

    #[test]
    fn reserve_holds_the_worst_case_and_shrinks_the_headroom() {
        let mut account = Account::new(all_limits(500_000, 1_000, 10, 10));
        let id = account.reserve(llm(20_000, 300, 200)).unwrap();
        assert_eq!(account.reservation(id), Some(llm(20_000, 300, 200)));
        assert_eq!(account.reserved(), llm(20_000, 300, 200));
        assert_eq!(account.spent(), Usage::default());
        assert_eq!(account.remaining(), all_limits(480_000, 500, 9, 10));
    }

    #[test]
    fn reserve_fits_exactly_up_to_the_limit_and_not_one_unit_more() {
        let mut account = Account::new(usd_limit(500_000));
        account.reserve(cost(300_000)).unwrap();
        account.reserve(cost(200_000)).unwrap();
        assert_eq!(account.remaining().cost_micro_usd, Some(0));
        let refused = account.reserve(cost(1)).unwrap_err();
        assert_eq!(
            refused,
            Exhausted {
                dimension: Dimension::CostUsd,
                limit: 500_000,
                spent: 0,
                reserved: 500_000,
                requested: 1
            }
        );
        // A reservation of nothing still fits in a full (not overdrawn) account.
        account.reserve(Usage::default()).unwrap();
    }

    #[test]
    fn a_refused_reservation_changes_nothing() {
        let mut account = Account::new(all_limits(100_000, 1_000, 2, 2));
        let held = account.reserve(llm(60_000, 100, 100)).unwrap();
        account.settle(held, llm(50_000, 100, 50));
        account.reserve(llm(10_000, 100, 100)).unwrap();
        let before = account.clone();
        account.reserve(llm(50_000, 1, 1)).unwrap_err();
        assert_eq!(account, before);
        // Not even the id counter moved: the next id is the one the refused call would have had.
        let next = account.reserve(tool_call()).unwrap();
        let mut replay = before;
        assert_eq!(replay.reserve(tool_call()).unwrap(), next);
    }

    #[test]
    fn each_dimension_refuses_on_its_own() {
        let limits = all_limits(100, 100, 1, 1);
        let over = [
            (Dimension::CostUsd, cost(101)),
            (Dimension::Tokens, Usage { input_tokens: 60, output_tokens: 41, ..Usage::default() }),
            (Dimension::LlmCalls, Usage { llm_calls: 2, ..Usage::default() }),
            (Dimension::ToolCalls, Usage { tool_calls: 2, ..Usage::default() }),
        ];
        for (dimension, amount) in over {
            let error = Account::new(limits).reserve(amount).unwrap_err();
            assert_eq!(error.dimension, dimension);
            assert_eq!(error.requested, dimension.amount(&amount));
            assert_eq!(error.limit, limits.get(dimension).unwrap());
        }
    }

    #[test]
    fn the_first_failing_dimension_is_reported() {
        let mut account = Account::new(all_limits(100, 100, 1, 1));
        let everything_over =
            Usage { input_tokens: 101, output_tokens: 0, llm_calls: 2, tool_calls: 2, cost_micro_usd: 101 };
        assert_eq!(account.reserve(everything_over).unwrap_err().dimension, Dimension::CostUsd);
        let all_but_cost = Usage { cost_micro_usd: 0, ..everything_over };
        assert_eq!(account.reserve(all_but_cost).unwrap_err().dimension, Dimension::Tokens);
        let calls_only = Usage { llm_calls: 2, tool_calls: 2, ..Usage::default() };
        assert_eq!(account.reserve(calls_only).unwrap_err().dimension, Dimension::LlmCalls);
    }

    #[test]
    fn tokens_are_limited_as_input_plus_output() {
        let mut account = Account::new(Limits { tokens: Some(100), ..Limits::default() });
        account.reserve(Usage { input_tokens: 60, output_tokens: 40, ..Usage::default() }).unwrap();
        let error = account.reserve(Usage { input_tokens: 1, ..Usage::default() }).unwrap_err();
        assert_eq!((error.dimension, error.reserved, error.requested), (Dimension::Tokens, 100, 1));
    }

    #[test]
    fn unlimited_dimensions_are_not_checked() {
        let mut account = Account::new(usd_limit(100));
        account.reserve(llm(100, u64::MAX, u64::MAX)).unwrap();
        account.reserve(Usage { llm_calls: u64::MAX, tool_calls: u64::MAX, ..Usage::default() }).unwrap();
        assert_eq!(account.remaining(), usd_limit(0));
    }

    #[test]
    fn huge_amounts_cannot_wrap_around_the_check() {
        let mut account = Account::new(usd_limit(u64::MAX));
        account.reserve(cost(u64::MAX)).unwrap();
        let error = account.reserve(cost(u64::MAX)).unwrap_err();
        assert_eq!(error.would_reach(), u64::MAX);
        assert_eq!(error.shortfall(), 0, "saturated: nothing can be added to a u64::MAX limit");
        account.reserve(cost(1)).unwrap_err();
    }

    #[test]
    fn reservation_ids_are_distinct_and_never_reused() {
        let mut account = Account::default();
        let first = account.reserve(tool_call()).unwrap();
        account.release(first);
        let second = account.reserve(tool_call()).unwrap();
        let third = account.carve(Limits::default()).unwrap();
        assert!(first < second && second < third);
        // The stale id does not touch the newer reservation.
        account.release(first);
        assert_eq!(account.outstanding(), 2);
    }

    // settle

    #[test]
    fn settle_replaces_the_reservation_with_the_actual_usage() {
        let mut account = Account::new(all_limits(500_000, 1_000, 10, 10));
        let id = account.reserve(llm(20_000, 300, 200)).unwrap();
        let settled = account.settle(id, llm(12_000, 280, 90));
        assert_eq!(settled, Settled { overran: None });
        assert_eq!(account.spent(), llm(12_000, 280, 90));
        assert_eq!(account.reserved(), Usage::default());
        assert_eq!(account.reservation(id), None);
        // What was reserved and not used is headroom again.
        assert_eq!(account.remaining(), all_limits(488_000, 630, 9, 10));
    }

    #[test]
    fn settle_compares_tokens_as_a_total() {
        // The input estimate was low and the output short: still within the reservation.
        let mut account = Account::new(Limits { tokens: Some(1_000), ..Limits::default() });
        let id = account.reserve(llm(0, 300, 200)).unwrap();
        assert_eq!(account.settle(id, llm(0, 450, 50)), Settled { overran: None });
        assert_eq!(account.spent().input_tokens, 450);
    }

    #[test]
    fn an_overrun_is_recorded_reported_and_blocks_the_next_reservation() {
        let mut account = Account::new(all_limits(100_000, 1_000, 10, 10));
        let id = account.reserve(llm(50_000, 400, 500)).unwrap();
        let _in_flight = account.reserve(llm(40_000, 0, 0)).unwrap();
        // The provider ignored max_tokens.
        let settled = account.settle(id, llm(70_000, 400, 700));
        assert_eq!(settled.overran, Some(Dimension::CostUsd), "cost is reported before tokens");
        assert_eq!(account.spent(), llm(70_000, 400, 700), "the money is spent regardless");
        assert_eq!(account.remaining().cost_micro_usd, Some(0), "remaining saturates at zero");
        assert_eq!(account.remaining().tokens, Some(0));
        let error = account.reserve(tool_call()).unwrap_err();
        assert_eq!(
            error,
            Exhausted {
                dimension: Dimension::CostUsd,
                limit: 100_000,
                spent: 70_000,
                reserved: 40_000,
                requested: 0
            }
        );
        account.top_up(Limits { cost_micro_usd: Some(20_000), tokens: Some(200), ..Limits::default() });
        account.reserve(tool_call()).unwrap();
    }

    #[test]
    fn an_overrun_in_an_unlimited_dimension_is_still_reported() {
        let mut account = Account::new(usd_limit(100_000));
        let id = account.reserve(llm(10_000, 100, 100)).unwrap();
        assert_eq!(account.settle(id, llm(10_000, 100, 150)), Settled { overran: Some(Dimension::Tokens) });
        let id = account.reserve(tool_call()).unwrap();
        let two_calls = Usage { tool_calls: 2, ..Usage::default() };
        assert_eq!(account.settle(id, two_calls), Settled { overran: Some(Dimension::ToolCalls) });
        let id = account.reserve(Usage::default()).unwrap();
        assert_eq!(account.settle(id, llm(0, 0, 0)), Settled { overran: Some(Dimension::LlmCalls) });
    }

    #[test]
    fn settling_an_unknown_or_settled_id_is_a_no_op() {
        let mut account = Account::new(usd_limit(100_000));
        let id = account.reserve(cost(50_000)).unwrap();
        account.settle(id, cost(30_000));
        let before = account.clone();
        assert_eq!(account.settle(id, cost(30_000)), Settled { overran: None }, "settled twice");
        assert_eq!(account.settle(ReservationId(999), cost(99_000_000)), Settled { overran: None });
        assert_eq!(account, before);
        assert_eq!(account.spent(), cost(30_000), "counted once");
    }

    // release

    #[test]
    fn release_frees_the_reservation_without_spending() {
        let mut account = Account::new(usd_limit(100_000));
        let id = account.reserve(cost(80_000)).unwrap();
        account.reserve(cost(30_000)).unwrap_err();
        account.release(id);
        assert_eq!(account.spent(), Usage::default());
        assert_eq!(account.reserved(), Usage::default());
        account.reserve(cost(100_000)).unwrap();
    }

    #[test]
    fn releasing_an_unknown_or_settled_id_is_a_no_op() {
        let mut account = Account::new(usd_limit(100_000));
        let settled = account.reserve(cost(10_000)).unwrap();
        account.settle(settled, cost(10_000));
        account.reserve(cost(20_000)).unwrap();
        let before = account.clone();
        account.release(settled);
        account.release(ReservationId(999));
        assert_eq!(account, before, "a release after settle does not undo the spend");
    }

    // top_up

    #[test]
    fn top_up_adds_to_limited_dimensions_only() {
        let mut account =
            Account::new(Limits { cost_micro_usd: Some(100), tokens: Some(10), ..Limits::default() });
        account.top_up(Limits {
            cost_micro_usd: Some(50),
            tokens: None,
            llm_calls: Some(5),
            tool_calls: None,
        });
        assert_eq!(
            account.limits(),
            Limits { cost_micro_usd: Some(150), tokens: Some(10), llm_calls: None, tool_calls: None },
            "None adds nothing; an unlimited dimension stays unlimited"
        );
        account.top_up(Limits::default());
        assert_eq!(account.limits().cost_micro_usd, Some(150));
        account.top_up(usd_limit(u64::MAX));
        assert_eq!(account.limits().cost_micro_usd, Some(u64::MAX), "saturates");
    }

    #[test]
    fn top_up_lets_the_refused_call_through() {
        // The park-and-resume flow: the call that was refused is retried after a top-up.
        let mut account = Account::new(usd_limit(500_000));
        let id = account.reserve(cost(490_000)).unwrap();
        account.settle(id, cost(490_000));
        let error = account.reserve(cost(20_000)).unwrap_err();
        let mut more = Limits::default();
        *more.get_mut(error.dimension) = Some(error.shortfall());
        account.top_up(more);
        account.reserve(cost(20_000)).unwrap();
        assert_eq!(account.remaining().cost_micro_usd, Some(0));
    }

    // record

    #[test]
    fn record_counts_as_spent_and_may_overdraw() {
        let mut account = Account::new(all_limits(100_000, 1_000, 10, 10));
        account.record(llm(30_000, 100, 100));
        assert_eq!(account.spent(), llm(30_000, 100, 100));
        assert_eq!(account.remaining(), all_limits(70_000, 800, 9, 10));
        account.record(llm(80_000, 0, 0));
        assert_eq!(account.remaining().cost_micro_usd, Some(0));
        assert_eq!(account.reserve(Usage::default()).unwrap_err().spent, 110_000);
    }

    // carve and return_slice

    #[test]
    fn carve_holds_the_slice_in_the_parent() {
        let mut parent = Account::new(all_limits(1_000_000, 10_000, 20, 20));
        let slice = Limits {
            cost_micro_usd: Some(200_000),
            tokens: Some(3_000),
            llm_calls: Some(5),
            tool_calls: None,
        };
        let id = parent.carve(slice).unwrap();
        assert_eq!(
            parent.reserved(),
            Usage {
                input_tokens: 3_000,
                output_tokens: 0,
                llm_calls: 5,
                tool_calls: 0,
                cost_micro_usd: 200_000
            },
            "a slice's tokens are counted as input tokens"
        );
        assert_eq!(parent.remaining(), all_limits(800_000, 7_000, 15, 20));
        assert_eq!(parent.reservation(id).map(|held| held.cost_micro_usd), Some(200_000));
    }

    #[test]
    fn carve_fails_like_reserve_and_changes_nothing() {
        let mut parent = Account::new(usd_limit(500_000));
        parent.reserve(cost(400_000)).unwrap();
        let before = parent.clone();
        let error = parent.carve(usd_limit(200_000)).unwrap_err();
        assert_eq!(
            error,
            Exhausted {
                dimension: Dimension::CostUsd,
                limit: 500_000,
                spent: 0,
                reserved: 400_000,
                requested: 200_000
            }
        );
        assert_eq!(parent, before);
        parent.carve(usd_limit(100_000)).unwrap();
    }

    #[test]
    fn return_slice_spends_what_the_child_used_and_frees_the_rest() {
        let mut parent = Account::new(Limits {
            cost_micro_usd: Some(1_000_000),
            llm_calls: Some(10),
            ..Limits::default()
        });
        let slice = Limits { cost_micro_usd: Some(400_000), llm_calls: Some(5), ..Limits::default() };
        let id = parent.carve(slice).unwrap();

        // The child runs under its own account with the slice as its limits.
        let mut child = Account::new(slice);
        for _ in 0..4 {
            let call = child.reserve(llm(100_000, 500, 500)).unwrap();
            child.settle(call, llm(90_000, 400, 300));
        }
        child.reserve(llm(100_000, 500, 500)).unwrap_err();

        let settled = parent.return_slice(id, child.spent());
        assert_eq!(settled, Settled { overran: None });
        assert_eq!(parent.spent(), child.spent());
        assert_eq!(parent.reserved(), Usage::default());
        assert_eq!(parent.remaining().cost_micro_usd, Some(640_000));
        assert_eq!(parent.remaining().llm_calls, Some(6));
        // Returning twice does not charge twice.
        assert_eq!(parent.return_slice(id, child.spent()), Settled { overran: None });
        assert_eq!(parent.spent(), child.spent());
    }

    #[test]
    fn a_child_that_used_more_than_its_slice_is_reported() {
        let mut parent = Account::new(usd_limit(1_000_000));
        let id = parent.carve(usd_limit(100_000)).unwrap();
        assert_eq!(parent.return_slice(id, cost(150_000)).overran, Some(Dimension::CostUsd));
        assert_eq!(parent.spent(), cost(150_000));
    }

    #[test]
    fn an_unlimited_slice_dimension_holds_nothing_and_is_charged_on_return() {
        let mut parent = Account::new(Limits {
            cost_micro_usd: Some(1_000_000),
            tokens: Some(1_000),
            ..Limits::default()
        });
        let id = parent.carve(usd_limit(100_000)).unwrap();
        assert_eq!(parent.remaining().tokens, Some(1_000), "no tokens held for the child");
        let settled = parent.return_slice(id, llm(50_000, 900, 300));
        assert_eq!(settled.overran, Some(Dimension::Tokens), "the parent's token limit was not held");
        assert_eq!(parent.remaining().tokens, Some(0));
        // Where the parent is unlimited too (LLM calls here), using it is no overrun.
        parent.top_up(Limits { tokens: Some(1_000), ..Limits::default() });
        let id = parent.carve(usd_limit(100_000)).unwrap();
        assert_eq!(parent.return_slice(id, llm(50_000, 0, 0)), Settled { overran: None });
    }

    // Exhausted messages

    #[test]
    fn the_cost_message_names_the_amounts_and_the_top_up() {
        let error = Exhausted {
            dimension: Dimension::CostUsd,
            limit: 500_000,
            spent: 490_000,
            reserved: 20_000,
            requested: 2_000,
        };
        assert_eq!(
            error.to_string(),
            "budget exhausted: cost would reach $0.5120 of a $0.5000 limit ($0.4900 spent, $0.0200 reserved \
             by calls in flight); top it up with `keel budget RUN --add-usd 0.0120` or more"
        );
        assert_eq!((error.would_reach(), error.shortfall()), (512_000, 12_000));
    }

    #[test]
    fn the_cost_message_never_rounds_an_overshoot_away() {
        let error = Exhausted {
            dimension: Dimension::CostUsd,
            limit: 500_000,
            spent: 500_000,
            reserved: 0,
            requested: 1,
        };
        assert_eq!(
            error.to_string(),
            "budget exhausted: cost would reach $0.500001 of a $0.5000 limit ($0.5000 spent, $0.0000 reserved \
             by calls in flight); top it up with `keel budget RUN --add-usd 0.000001` or more"
        );
    }

    #[test]
    fn the_count_messages_use_plain_numbers_and_their_own_flags() {
        let tokens = Exhausted {
            dimension: Dimension::Tokens,
            limit: 100_000,
            spent: 90_000,
            reserved: 8_000,
            requested: 4_096,
        };
        assert_eq!(
            tokens.to_string(),
            "budget exhausted: tokens would reach 102096 of a 100000 limit (90000 spent, 8000 reserved by calls \
             in flight); top it up with `keel budget RUN --add-tokens 2096` or more"
        );
        let llm_calls =
            Exhausted { dimension: Dimension::LlmCalls, limit: 50, spent: 48, reserved: 2, requested: 1 };
        assert_eq!(
            llm_calls.to_string(),
            "budget exhausted: LLM calls would reach 51 of a 50 limit (48 spent, 2 reserved by calls in flight); \
             top it up with `keel budget RUN --add-llm-calls 1` or more"
        );
        let tool_calls =
            Exhausted { dimension: Dimension::ToolCalls, limit: 0, spent: 0, reserved: 0, requested: 1 };
        assert_eq!(
            tool_calls.to_string(),
            "budget exhausted: tool calls would reach 1 of a 0 limit (0 spent, 0 reserved by calls in flight); \
             top it up with `keel budget RUN --add-tool-calls 1` or more"
        );
    }

    #[test]
    fn a_refused_reserve_produces_the_message_for_the_account_state() {
        let mut account = Account::new(usd_limit(500_000));
        let done = account.reserve(cost(490_000)).unwrap();
        account.settle(done, cost(490_000));
        // Two calls of $0.01 in flight would overshoot; the first fits, the second does not.
        account.reserve(cost(10_000)).unwrap();
        let message = account.reserve(cost(10_000)).unwrap_err().to_string();
        assert!(
            message.starts_with("budget exhausted: cost would reach $0.5100 of a $0.5000 limit"),
            "{message}"
        );
        assert!(message.contains("($0.4900 spent, $0.0100 reserved by calls in flight)"), "{message}");
        assert!(message.ends_with("`keel budget RUN --add-usd 0.0100` or more"), "{message}");
    }

    // Many calls in flight

    #[test]
    fn twenty_concurrent_calls_against_a_budget_for_five_send_exactly_five() {
        let per_call = llm(100_000, 1_000, 4_096);
        let mut account = Account::new(usd_limit(5 * 100_000));
        let attempts: Vec<_> = (0..20).map(|_| account.reserve(per_call)).collect();
        let sent: Vec<_> = attempts.iter().filter_map(|attempt| attempt.as_ref().ok().copied()).collect();
        assert_eq!(sent.len(), 5);
        assert!(attempts[..5].iter().all(Result::is_ok), "the first five in line get through");
        for refused in attempts[5..].iter() {
            assert_eq!(
                refused.as_ref().unwrap_err(),
                &Exhausted {
                    dimension: Dimension::CostUsd,
                    limit: 500_000,
                    spent: 0,
                    reserved: 500_000,
                    requested: 100_000
                }
            );
        }
        for id in &sent {
            assert_eq!(account.settle(*id, per_call), Settled { overran: None });
        }
        assert_eq!(account.spent().cost_micro_usd, 500_000);
        account.reserve(per_call).unwrap_err();
        // The run parks; a top-up for five more lets exactly five more through.
        account.top_up(usd_limit(5 * 100_000));
        let resumed = (0..15).filter(|_| account.reserve(per_call).is_ok()).count();
        assert_eq!(resumed, 5);
    }

    #[test]
    fn twenty_concurrent_calls_against_a_token_budget_for_five_send_exactly_five() {
        // max_tokens 4096 plus an input estimate of 1000: the budget fits five worst cases.
        let mut account =
            Account::new(Limits { tokens: Some(5 * 5_096), llm_calls: Some(100), ..Limits::default() });
        let sent = (0..20).filter(|_| account.reserve(llm(0, 1_000, 4_096)).is_ok()).count();
        assert_eq!(sent, 5);
        assert_eq!(account.remaining().tokens, Some(0));
    }

    // LoopDetector

    #[test]
    fn the_loop_detector_fires_on_the_threshold_th_repeat_and_after() {
        let mut detector = LoopDetector::new(3);
        let seen: Vec<_> = ["a", "a", "a", "a"].into_iter().map(|key| detector.observe(key)).collect();
        assert_eq!(seen, [false, false, true, true]);
        assert!(!detector.observe("b"), "a different request breaks the run");
        assert!(!detector.observe("a"));
        assert!(!detector.observe("a"));
        assert!(detector.observe("a"));
    }

    #[test]
    fn the_loop_detector_ignores_alternating_requests() {
        let mut detector = LoopDetector::new(2);
        for key in ["a", "b", "a", "b", "a", "b"] {
            assert!(!detector.observe(key), "{key}");
        }
        assert!(detector.observe("b"));
    }

    #[test]
    fn the_loop_detector_reset_starts_counting_again() {
        let mut detector = LoopDetector::new(2);
        assert!(!detector.observe("a"));
        assert!(detector.observe("a"));
        detector.reset();
        assert!(!detector.observe("a"));
        assert!(detector.observe("a"));
    }

    #[test]
    fn a_loop_detector_with_threshold_zero_or_one_never_fires() {
        for threshold in [0, 1] {
            let mut detector = LoopDetector::new(threshold);
            assert!((0..10).all(|_| !detector.observe("same")), "threshold {threshold}");
        }
        let mut default = LoopDetector::default();
        assert!(!default.observe("same") && !default.observe("same"));
    }

    #[test]
    fn the_loop_detector_compares_whole_keys() {
        let mut detector = LoopDetector::new(2);
        assert!(!detector.observe("llm.chat:abc"));
        assert!(!detector.observe("llm.chat:abcd"));
        assert!(!detector.observe(""));
        assert!(detector.observe(""));
    }

    // Properties

    /// One step of a random schedule. `pick` chooses among the reservations outstanding (or
    /// already finished) at that moment, modulo their number; `percent` scales each field of
    /// the reservation into the actual usage.
    #[derive(Debug, Clone)]
    enum Step {
        Reserve(Amount),
        Settle {
            pick: usize,
            percent: [u64; 5],
        },
        Release {
            pick: usize,
        },
        TopUp(Limits),
        Carve(Limits),
        ReturnSlice {
            pick: usize,
            percent: [u64; 5],
        },
        /// Settle, release or return an id that is no longer outstanding.
        Stale {
            pick: usize,
            actual: Amount,
        },
        Record(Amount),
    }

    fn amount() -> impl Strategy<Value = Amount> {
        (0..300_000u64, 0..4_000u64, 0..4_000u64, 0..3u64, 0..3u64).prop_map(
            |(cost_micro_usd, input_tokens, output_tokens, llm_calls, tool_calls)| Usage {
                input_tokens,
                output_tokens,
                llm_calls,
                tool_calls,
                cost_micro_usd,
            },
        )
    }

    fn limits(cost: u64, tokens: u64, calls: u64) -> impl Strategy<Value = Limits> {
        (
            proptest::option::of(0..cost),
            proptest::option::of(0..tokens),
            proptest::option::of(0..calls),
            proptest::option::of(0..calls),
        )
            .prop_map(|(cost_micro_usd, tokens, llm_calls, tool_calls)| Limits {
                cost_micro_usd,
                tokens,
                llm_calls,
                tool_calls,
            })
    }

    /// Schedules whose settles stay within their reservations and that record nothing, so
    /// the invariant must hold after every step. With `overruns`, settles and returns may use
    /// up to twice what was reserved and usage may be recorded outside reservations.
    fn steps(overruns: bool) -> impl Strategy<Value = Vec<Step>> {
        let max_percent: u64 = if overruns { 200 } else { 100 };
        let percent = move || proptest::array::uniform5(0..=max_percent);
        let step = prop_oneof![
            4 => amount().prop_map(Step::Reserve),
            3 => (any::<usize>(), percent()).prop_map(|(pick, percent)| Step::Settle { pick, percent }),
            1 => any::<usize>().prop_map(|pick| Step::Release { pick }),
            1 => limits(500_000, 10_000, 5).prop_map(Step::TopUp),
            1 => limits(600_000, 12_000, 6).prop_map(Step::Carve),
            1 => (any::<usize>(), percent()).prop_map(|(pick, percent)| Step::ReturnSlice { pick, percent }),
            1 => (any::<usize>(), amount()).prop_map(|(pick, actual)| Step::Stale { pick, actual }),
            (if overruns { 1 } else { 0 }) => amount().prop_map(Step::Record),
        ];
        proptest::collection::vec(step, 1..80)
    }

    fn scale(reserved: &Amount, percent: [u64; 5]) -> Amount {
        Usage {
            input_tokens: reserved.input_tokens * percent[0] / 100,
            output_tokens: reserved.output_tokens * percent[1] / 100,
            llm_calls: reserved.llm_calls * percent[2] / 100,
            tool_calls: reserved.tool_calls * percent[3] / 100,
            cost_micro_usd: reserved.cost_micro_usd * percent[4] / 100,
        }
    }

    fn sum<'a>(amounts: impl IntoIterator<Item = &'a Amount>) -> Amount {
        let mut total = Usage::default();
        for amount in amounts {
            add_saturating(&mut total, amount);
        }
        total
    }

    /// An independent model of the account: a plain list of what each outstanding
    /// reservation holds, and the limits as they should be after the top-ups so far.
    #[derive(Debug, Default)]
    struct Model {
        limits: Limits,
        calls: Vec<(ReservationId, Amount)>,
        slices: Vec<(ReservationId, Amount)>,
        /// The slice each carve asked for, by id.
        carved: BTreeMap<ReservationId, Limits>,
        finished: Vec<ReservationId>,
        settled: Vec<Amount>,
        recorded: Vec<Amount>,
    }

    impl Model {
        fn reserved(&self) -> Amount {
            sum(self.calls.iter().chain(&self.slices).map(|(_, amount)| amount))
        }

        fn spent(&self) -> Amount {
            sum(self.settled.iter().chain(&self.recorded))
        }

        /// The first limited dimension the amount would take past its limit.
        fn first_misfit(&self, amount: &Amount) -> Option<Dimension> {
            let (spent, reserved) = (self.spent(), self.reserved());
            Dimension::ALL.into_iter().find(|&dimension| {
                self.limits.get(dimension).is_some_and(|limit| {
                    dimension.amount(&spent) + dimension.amount(&reserved) + dimension.amount(amount) > limit
                })
            })
        }
    }

    /// Runs a schedule against an account and the model, checking after every step that they
    /// agree, that a refused reservation changed nothing, and, while every settle stayed
    /// within its reservation and nothing was recorded, that no limit was exceeded.
    fn check_schedule(initial: Limits, schedule: &[Step]) -> Result<(), TestCaseError> {
        let mut account = Account::new(initial);
        let mut model = Model { limits: initial, ..Model::default() };
        let mut within_reservations = true;
        for step in schedule {
            match step {
                Step::Reserve(_) | Step::Carve(_) => {
                    let before = account.clone();
                    let (amount, result) = match step {
                        Step::Carve(slice) => (slice.as_amount(), account.carve(*slice)),
                        Step::Reserve(amount) => (*amount, account.reserve(*amount)),
                        _ => unreachable!("the outer arm matched Reserve or Carve"),
                    };
                    let misfit = model.first_misfit(&amount);
                    match (&result, misfit) {
                        (Ok(id), None) => {
                            if let Step::Carve(slice) = step {
                                model.carved.insert(*id, *slice);
                                model.slices.push((*id, amount));
                            } else {
                                model.calls.push((*id, amount));
                            }
                            // A reservation never takes the account past a limit itself.
                            for dimension in Dimension::ALL {
                                if let Some(limit) = account.limits().get(dimension) {
                                    let used = dimension.amount(&account.spent())
                                        + dimension.amount(&account.reserved());
                                    prop_assert!(
                                        used <= limit,
                                        "{dimension} at {used} of {limit} after {step:?}"
                                    );
                                }
                            }
                        }
                        (Err(error), Some(dimension)) => {
                            prop_assert_eq!(&account, &before, "a refused reservation changed the account");
                            let expected = Exhausted {
                                dimension,
                                limit: model.limits.get(dimension).unwrap_or(0),
                                spent: dimension.amount(&model.spent()),
                                reserved: dimension.amount(&model.reserved()),
                                requested: dimension.amount(&amount),
                            };
                            prop_assert_eq!(error, &expected);
                        }
                        (result, misfit) => {
                            return Err(TestCaseError::fail(format!(
                                "{step:?} gave {result:?} but the model expected a misfit in {misfit:?}"
                            )));
                        }
                    }
                }
                Step::Settle { pick, percent } | Step::ReturnSlice { pick, percent } => {
                    let list = if matches!(step, Step::Settle { .. }) {
                        &mut model.calls
                    } else {
                        &mut model.slices
                    };
                    if list.is_empty() {
                        continue;
                    }
                    let (id, reserved) = list.remove(pick % list.len());
                    let actual = scale(&reserved, *percent);
                    let settled = match step {
                        Step::Settle { .. } => account.settle(id, actual),
                        _ => account.return_slice(id, actual),
                    };
                    let overran = Dimension::ALL.into_iter().find(|&dimension| {
                        let unbounded_here =
                            model.carved.get(&id).is_some_and(|slice| slice.get(dimension).is_none())
                                && model.limits.get(dimension).is_none();
                        !unbounded_here && dimension.amount(&actual) > dimension.amount(&reserved)
                    });
                    prop_assert_eq!(settled, Settled { overran });
                    within_reservations &= overran.is_none();
                    model.settled.push(actual);
                    model.finished.push(id);
                }
                Step::Release { pick } => {
                    // Calls and slices alike: a child that never started gives its slice back whole.
                    let outstanding = model.calls.len() + model.slices.len();
                    if outstanding == 0 {
                        continue;
                    }
                    let pick = pick % outstanding;
                    let (id, _) = if pick < model.calls.len() {
                        model.calls.remove(pick)
                    } else {
                        model.slices.remove(pick - model.calls.len())
                    };
                    account.release(id);
                    model.finished.push(id);
                }
                Step::TopUp(more) => {
                    account.top_up(*more);
                    for dimension in Dimension::ALL {
                        if let (Some(limit), Some(extra)) =
                            (model.limits.get_mut(dimension), more.get(dimension))
                        {
                            *limit += extra;
                        }
                    }
                }
                Step::Stale { pick, actual } => {
                    let id = if model.finished.is_empty() {
                        ReservationId(u64::MAX)
                    } else {
                        model.finished[pick % model.finished.len()]
                    };
                    let before = account.clone();
                    prop_assert_eq!(account.settle(id, *actual), Settled { overran: None });
                    prop_assert_eq!(account.return_slice(id, *actual), Settled { overran: None });
                    account.release(id);
                    prop_assert_eq!(&account, &before, "a stale id changed the account");
                }
                Step::Record(actual) => {
                    account.record(*actual);
                    model.recorded.push(*actual);
                    within_reservations = false;
                }
            }

            // Totals are conserved: spent is exactly what was settled, returned and recorded,
            // and reserved is exactly what the outstanding reservations hold.
            prop_assert_eq!(account.spent(), model.spent());
            prop_assert_eq!(account.reserved(), model.reserved());
            prop_assert_eq!(account.limits(), model.limits);
            prop_assert_eq!(account.outstanding(), model.calls.len() + model.slices.len());
            for (id, amount) in model.calls.iter().chain(&model.slices) {
                prop_assert_eq!(account.reservation(*id), Some(*amount));
            }
            let remaining = account.remaining();
            for dimension in Dimension::ALL {
                let used = dimension.amount(&account.spent()) + dimension.amount(&account.reserved());
                let limit = model.limits.get(dimension);
                prop_assert_eq!(remaining.get(dimension), limit.map(|limit| limit.saturating_sub(used)));
                if within_reservations && let Some(limit) = limit {
                    prop_assert!(used <= limit, "{dimension}: {used} of {limit} after {step:?}");
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        #[test]
        fn spend_plus_reserved_never_exceeds_a_limit(
            initial in limits(2_000_000, 40_000, 20),
            schedule in steps(false),
        ) {
            check_schedule(initial, &schedule)?;
        }

        #[test]
        fn overruns_and_records_are_counted_and_never_let_a_reservation_overshoot(
            initial in limits(2_000_000, 40_000, 20),
            schedule in steps(true),
        ) {
            check_schedule(initial, &schedule)?;
        }

        /// Twenty calls, each reserving and then settling exactly its worst case, run in any
        /// interleaving against a budget for five: exactly five are sent, whatever the order.
        #[test]
        fn twenty_interleaved_calls_against_a_budget_for_five_send_exactly_five(
            order in Just((0..20usize).flat_map(|call| [call, call]).collect::<Vec<_>>()).prop_shuffle(),
            tight in any::<bool>(),
        ) {
            let per_call = llm(37_000, 1_200, 800);
            // Tight: the budget is exactly five calls; otherwise one micro-dollar short of six.
            let limit = if tight { 5 * 37_000 } else { 6 * 37_000 - 1 };
            let mut account = Account::new(usd_limit(limit));
            let mut in_flight: Vec<Option<ReservationId>> = vec![None; 20];
            let mut attempted = [false; 20];
            let mut sent = 0;
            for call in order {
                if !attempted[call] {
                    attempted[call] = true;
                    if let Ok(id) = account.reserve(per_call) {
                        in_flight[call] = Some(id);
                        sent += 1;
                    }
                } else if let Some(id) = in_flight[call].take() {
                    prop_assert_eq!(account.settle(id, per_call), Settled { overran: None });
                }
                let used = account.spent().cost_micro_usd + account.reserved().cost_micro_usd;
                prop_assert!(used <= limit);
            }
            prop_assert_eq!(sent, 5);
            prop_assert_eq!(account.spent(), sum(&[per_call; 5]));
        }
    }
}
