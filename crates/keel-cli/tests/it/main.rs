//! End-to-end tests of the real `keel` binary: runs, operator controls, crash recovery
//! with SIGKILL, bad input, the HTTP API, and memory. Agents are the Python programs in
//! `tests/agents`, and one Node program on the TypeScript SDK (`ts_agent.js`).

mod a2a;
mod a2a_client;
mod agui;
mod api;
mod audit;
mod bad_input;
mod budgets;
mod cluster;
mod cluster_admission;
mod cluster_faults;
mod console;
mod control;
mod crash;
mod events;
mod exec_inputs;
mod frameworks;
mod gateway;
mod harness;
mod hooks;
mod ipc;
mod mcp;
mod mcp_server;
mod memory;
mod metrics;
mod migrate;
mod otel;
mod pipe;
mod procs;
mod responses;
mod runs;
mod sandbox;
mod sandbox_escape;
mod scheduler;
mod schedules;
mod status;
mod swap;
mod tenants;
mod tools;
mod top;
mod typescript;
mod ui;
