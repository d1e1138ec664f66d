//! What the Postgres cases of the store benches share (included by `journal.rs` and
//! `cluster.rs` with `#[path]`): a schema of their own, a plain driver connection, and the
//! floor a journaled step is compared with: a raw INSERT and UPDATE, two commits, on the
//! same server with the same driver.

use std::time::{Duration, Instant};

use keel_types::RunId;

/// A schema `<prefix>_<pid>` on the server, and the URL that puts a store in it.
pub struct BenchSchema {
    admin: tokio_postgres::Client,
    pub name: String,
    pub url: String,
    pub version: String,
}

impl BenchSchema {
    pub async fn create(server_url: &str, prefix: &str) -> BenchSchema {
        let name = format!("{prefix}_{}", std::process::id());
        let admin = raw_postgres(server_url).await;
        admin.batch_execute(&format!("CREATE SCHEMA {name}")).await.expect("creating the bench schema");
        let separator = if server_url.contains('?') { '&' } else { '?' };
        let url = format!("{server_url}{separator}options=-csearch_path%3D{name}");
        let version: String =
            admin.query_one("SHOW server_version", &[]).await.expect("reading the server version").get(0);
        BenchSchema { admin, name, url, version }
    }

    pub async fn drop(self) {
        self.admin
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name))
            .await
            .expect("dropping the bench schema");
    }
}

/// A plain driver connection, its connection task spawned.
pub async fn raw_postgres(url: &str) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connecting to Postgres");
    tokio::spawn(connection);
    client
}

/// The floor: a journal-shaped table written with one INSERT (the intent) and one UPDATE
/// (the result) per step, each its own commit.
pub struct Floor {
    client: tokio_postgres::Client,
    insert: tokio_postgres::Statement,
    update: tokio_postgres::Statement,
    run: RunId,
}

impl Floor {
    pub async fn new(url: &str) -> Floor {
        let client = raw_postgres(url).await;
        client
            .batch_execute(
                "CREATE TABLE floor_journal (
                     run_id TEXT NOT NULL, seq BIGINT NOT NULL, method TEXT NOT NULL,
                     params_hash TEXT NOT NULL, params BYTEA NOT NULL, status TEXT NOT NULL,
                     result BYTEA, attempt BIGINT NOT NULL, started_at_ms BIGINT NOT NULL,
                     finished_at_ms BIGINT, PRIMARY KEY (run_id, seq))",
            )
            .await
            .expect("creating the floor table");
        let insert = client
            .prepare(
                "INSERT INTO floor_journal (run_id, seq, method, params_hash, params, status, attempt, \
                 started_at_ms) VALUES ($1, $2, 'llm.chat', 'hash', $3, 'pending', 1, $2)",
            )
            .await
            .expect("preparing the floor insert");
        let update = client
            .prepare(
                "UPDATE floor_journal SET status = 'ok', result = $3, finished_at_ms = $2 \
                 WHERE run_id = $1 AND seq = $2",
            )
            .await
            .expect("preparing the floor update");
        Floor { client, insert, update, run: RunId::generate(0) }
    }

    /// One step (`step` is its seq); how long its two commits took.
    pub async fn step(&self, step: usize, params: &[u8], result: &[u8]) -> Duration {
        let seq = step as i64;
        let started = Instant::now();
        self.client.execute(&self.insert, &[&self.run.as_str(), &seq, &params]).await.expect("floor insert");
        self.client.execute(&self.update, &[&self.run.as_str(), &seq, &result]).await.expect("floor update");
        started.elapsed()
    }
}
