//! The kernel's in-process test suite: a real kernel on a temporary data directory, the
//! scripted LLM provider and the `none` sandbox tier, driven through the Rust SDK by the
//! test itself (see `harness.rs`). Where a kernel bug gets its regression test; fast by
//! design (no sleeps but short polls, no timing assertions).

mod approvals;
mod budgets;
mod event_triggers;
mod exec_llm;
mod faults;
mod gateway;
mod governance;
mod harness;
mod hooks;
mod ipc;
mod lifecycle;
mod replay;
mod shape;
mod swapping;
mod ui;
