//! Tool calls parked until an operator decides: tools whose policy is
//! `requires_approval`, and calls the kernel died in the middle of whose crash policy is
//! `ask`. The call's intent is journaled first; the decision is stored durably (the kv
//! space `approvals:<run>`) before it takes effect, so a decision made while the kernel
//! was down, or just before it died, is found again when the agent asks anew.

use keel_protocol::api::ApprovalView;
use tokio::sync::oneshot;

/// Why a call waits for an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApprovalKind {
    /// The tool's policy says a human approves each call.
    Required,
    /// The kernel died while the call ran, and the tool's crash policy is `ask`:
    /// approving runs it again (with the same idempotency key), denying fails it.
    RetryAfterCrash,
}

impl ApprovalKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::Required => "requires_approval",
            ApprovalKind::RetryAfterCrash => "retry_after_crash",
        }
    }
}

/// An operator's decision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    pub(crate) approve: bool,
    pub(crate) note: Option<String>,
}

pub(crate) struct PendingApproval {
    pub(crate) view: ApprovalView,
    pub(crate) reply: oneshot::Sender<Decision>,
}
