//! Stdio specifics: spawn failures, handshake timeouts, the scrubbed environment.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keel_mcp::{Client, Error, ServerConfig, Transport};

fn stdio(command: &[&str], env: &[(&str, &str)], timeout: Duration) -> ServerConfig {
    ServerConfig {
        name: "probe".to_owned(),
        transport: Transport::Stdio {
            command: command.iter().map(|part| part.to_string()).collect(),
            env: env
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect::<BTreeMap<_, _>>(),
            cwd: None,
        },
        timeout,
    }
}

#[tokio::test]
async fn a_missing_program_is_named_in_the_error() {
    let config = stdio(&["/nonexistent/mcp-server", "--flag"], &[], Duration::from_secs(5));
    let error = Client::connect(&config).await.unwrap_err();
    let Error::Connect(message) = &error else { panic!("{error:?}") };
    assert!(
        message.contains("`probe`") && message.contains("could not spawn `/nonexistent/mcp-server`"),
        "{message}"
    );
}

#[tokio::test]
async fn an_empty_command_is_refused() {
    let error = Client::connect(&stdio(&[], &[], Duration::from_secs(5))).await.unwrap_err();
    assert!(error.to_string().contains("command is empty"), "{error}");
}

#[tokio::test]
async fn a_silent_server_times_out_the_handshake_and_the_error_quotes_its_stderr_and_env() {
    let started = Instant::now();
    let config = stdio(
        &["sh", "-c", "env >&2; echo still-starting >&2; exec sleep 30"],
        &[("KEEL_MCP_PROBE", "yes")],
        Duration::from_millis(700),
    );
    let error = Client::connect(&config).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    let Error::Connect(message) = &error else { panic!("{error:?}") };
    assert!(message.contains("handshake timed out") && message.contains("still-starting"), "{message}");
    // Only PATH, HOME, LANG and the configured env reach the child (`sh` adds PWD/SHLVL/_).
    assert!(message.contains("KEEL_MCP_PROBE=yes"), "{message}");
    assert!(message.lines().any(|line| line.starts_with("PATH=")), "{message}");
    let leaked: Vec<&str> = message
        .lines()
        .filter(|line| line.contains('='))
        .map(|line| line.split('=').next().unwrap_or_default())
        .filter(|key| !["PATH", "HOME", "LANG", "KEEL_MCP_PROBE", "PWD", "SHLVL", "_"].contains(key))
        .filter(|key| key.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .collect();
    assert!(leaked.is_empty(), "kernel env leaked into the server: {leaked:?}");
}

#[tokio::test]
async fn a_server_that_exits_at_once_reports_its_stderr() {
    let config = stdio(&["sh", "-c", "echo 'fatal: no config' >&2; exit 3"], &[], Duration::from_secs(10));
    let error = Client::connect(&config).await.unwrap_err();
    let Error::Connect(message) = &error else { panic!("{error:?}") };
    assert!(message.contains("probably exited") && message.contains("fatal: no config"), "{message}");
}
