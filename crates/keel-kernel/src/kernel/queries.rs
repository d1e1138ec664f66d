//! What the listings of the kernel's public API ask for: runs and audit entries.

use keel_types::{RunId, RunState};

use crate::{Error, Result};

/// What a listing of runs asks for.
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    /// Only runs in these states (every state when empty).
    pub states: Vec<RunState>,
    /// At most this many, newest first.
    pub limit: Option<usize>,
    /// Only this tenant's runs: the operator may ask for any; a tenant's token gets its
    /// own whatever it asks (and is refused asking for another).
    pub tenant: Option<String>,
    /// Only runs whose id, tenant or command contains this text (ASCII case aside).
    pub text: Option<String>,
    /// The order (newest first by default).
    pub sort: RunSort,
    /// Skip this many runs of that order first (the next page).
    pub offset: usize,
}

/// The orders a listing of runs can take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RunSort {
    /// Newest first (by creation).
    #[default]
    Newest,
    /// Oldest first.
    Oldest,
    /// Costliest first (ties newest first).
    Costliest,
    /// Cheapest first (ties oldest first).
    Cheapest,
}

impl std::str::FromStr for RunSort {
    type Err = Error;

    fn from_str(text: &str) -> Result<RunSort> {
        match text {
            "newest" => Ok(RunSort::Newest),
            "oldest" => Ok(RunSort::Oldest),
            "costliest" => Ok(RunSort::Costliest),
            "cheapest" => Ok(RunSort::Cheapest),
            other => Err(Error::InvalidRequest(format!(
                "sort {other:?} is not known; use newest, oldest, costliest or cheapest"
            ))),
        }
    }
}

impl RunSort {
    pub(super) fn order(self) -> keel_store::RunOrder {
        match self {
            RunSort::Newest => keel_store::RunOrder::NewestFirst,
            RunSort::Oldest => keel_store::RunOrder::OldestFirst,
            RunSort::Costliest => keel_store::RunOrder::CostliestFirst,
            RunSort::Cheapest => keel_store::RunOrder::CheapestFirst,
        }
    }
}

/// What a page of the audit log asks for.
#[derive(Debug, Clone)]
pub struct AuditQuery {
    /// Only this run's entries.
    pub run: Option<RunId>,
    /// Only entries after this seq (0: from the first).
    pub after: u64,
    /// At most this many.
    pub limit: u32,
}
