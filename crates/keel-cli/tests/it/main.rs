//! End-to-end tests of the real `keel` binary: runs, operator controls, crash recovery
//! with SIGKILL, bad input, and the HTTP API. Agents are the Python programs in
//! `tests/agents`.

mod api;
mod bad_input;
mod control;
mod crash;
mod harness;
mod runs;
