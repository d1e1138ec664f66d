//! A fresh Postgres database per test, on the server `KEEL_TEST_POSTGRES_URL` names.
//! Self-contained (only `tokio-postgres`), so another crate's tests can copy this file.
//!
//! Tests that need Postgres never skip: without the variable, or with the server
//! unreachable, they fail saying what to set or start.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The variable naming the test server (any database on it; tests create their own).
pub const URL_VARIABLE: &str = "KEEL_TEST_POSTGRES_URL";

/// A database `keel_test_<unique>` created for one test and dropped (`WITH (FORCE)`, so
/// connections a test left open do not stop it) when this is dropped.
pub struct TestDatabase {
    server_url: String,
    name: String,
    url: String,
}

impl TestDatabase {
    /// Creates the database. Panics, saying what to do, when `KEEL_TEST_POSTGRES_URL` is
    /// unset or the server cannot be reached.
    pub async fn create() -> TestDatabase {
        let server_url = server_url();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |t| t.subsec_nanos());
        let name =
            format!("keel_test_{}_{}_{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        execute_on_server(&server_url, &format!("CREATE DATABASE {name}")).await;
        let url = url_of_database(&name);
        TestDatabase { server_url, name, url }
    }

    /// The URL of the test's database (same server, user and options as the variable's).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL of the test's database with `query` (e.g. `options=...`) added.
    pub fn url_with(&self, query: &str) -> String {
        let separator = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{separator}{query}", self.url)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let server_url = self.server_url.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        // Drop cannot await, and may run inside a runtime: a thread of its own with a
        // runtime of its own does the async work.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("starting a runtime to drop a test database");
            runtime.block_on(execute_on_server(&server_url, &sql));
        })
        .join();
        if dropped.is_err() && !std::thread::panicking() {
            panic!("dropping test database {} failed (see the panic above)", self.name);
        }
    }
}

/// The server URL from `KEEL_TEST_POSTGRES_URL`, or a panic saying to set it.
pub fn server_url() -> String {
    std::env::var(URL_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{URL_VARIABLE} is not set: these tests need a Postgres server. Set it to a URL of a \
             role that may create databases, e.g. {URL_VARIABLE}=postgres://postgres@127.0.0.1:5432/postgres"
        )
    })
}

/// The URL of database `database` on the test server (which need not exist).
pub fn url_of_database(database: &str) -> String {
    with_database(&server_url(), database)
}

async fn execute_on_server(server_url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(server_url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|error| {
            panic!("cannot reach the Postgres server named by {URL_VARIABLE} ({server_url}): {error}; is it running?")
        });
    let connection = tokio::spawn(connection);
    client.batch_execute(sql).await.unwrap_or_else(|error| panic!("{sql}: {error}"));
    drop(client);
    let _ = connection.await;
}

/// `url` with its database (the path of a URL) replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let authority = url.find("://").map_or(0, |scheme| scheme + 3);
    let path_start = url[authority..].find(['/', '?']).map_or(url.len(), |at| authority + at);
    let path_end = url[path_start..].find('?').map_or(url.len(), |at| path_start + at);
    format!("{}/{database}{}", &url[..path_start], &url[path_end..])
}

#[test]
fn database_names_replace_the_path() {
    assert_eq!(with_database("postgres://u@h:5/test", "x"), "postgres://u@h:5/x");
    assert_eq!(with_database("postgres://u@h/test?a=b", "x"), "postgres://u@h/x?a=b");
    assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
    assert_eq!(with_database("postgres://u@h?a=b", "x"), "postgres://u@h/x?a=b");
}
