#!/usr/bin/env python3
"""How long SQLite schema version 10 (`V10` in src/sqlite/schema.rs) takes to migrate a
version-9 database: it rebuilds `journal` and `message_chain`.

    python3 crates/keel-store/benches/schema10_migration.py [ENTRIES] [NODES]

Writes a database of the version-9 shape (1,000 runs, ENTRIES journal entries, default
1,000,000, and NODES message chain nodes, default 200,000) in a temporary directory, then
runs V10's SQL, read from schema.rs, in one transaction with foreign keys on, as the store
does, and prints the time and the sizes. Python's own sqlite3 runs it, not the store's
bundled SQLite: the same SQL, a slightly older engine.
"""

import hashlib
import os
import re
import sqlite3
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
V9_TABLES = """
CREATE TABLE runs (id TEXT PRIMARY KEY NOT NULL, tenant TEXT NOT NULL, cost_micro_usd INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL, ended_at_ms INTEGER);
CREATE INDEX runs_by_cost ON runs (cost_micro_usd, created_at_ms, id);
CREATE INDEX runs_by_tenant_cost ON runs (tenant, cost_micro_usd, created_at_ms, id);
CREATE TABLE blobs (hash TEXT PRIMARY KEY NOT NULL, size INTEGER NOT NULL, bytes BLOB NOT NULL);
CREATE TABLE journal (run_id TEXT NOT NULL REFERENCES runs (id), seq INTEGER NOT NULL, method TEXT NOT NULL,
    params_hash TEXT NOT NULL, params_blob TEXT NOT NULL REFERENCES blobs (hash), status TEXT NOT NULL,
    result_blob TEXT REFERENCES blobs (hash), error_blob TEXT REFERENCES blobs (hash), attempt INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL, finished_at_ms INTEGER, input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0, llm_calls INTEGER NOT NULL DEFAULT 0,
    tool_calls INTEGER NOT NULL DEFAULT 0, cost_micro_usd INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
CREATE INDEX journal_by_method ON journal (run_id, method, seq);
CREATE INDEX journal_by_time ON journal (method, started_at_ms);
CREATE TABLE message_chain (hash TEXT PRIMARY KEY NOT NULL, prev TEXT,
    message_blob TEXT NOT NULL REFERENCES blobs (hash)) WITHOUT ROWID;
"""


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def main():
    entries = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    schema = open(os.path.join(HERE, "..", "src", "sqlite", "schema.rs")).read()
    v10 = re.search(r'const V10: &str = "(.*?)";', schema, re.S).group(1)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "keel.db")
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        db.executescript(V9_TABLES)
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO runs VALUES (?, 't', ?, ?, ?)",
            ((f"run_{r:06}", r, r, r if r % 2 else None) for r in range(1000)),
        )
        db.execute("INSERT INTO blobs VALUES ('p', 2, '{}')")
        db.executemany(
            "INSERT INTO journal (run_id, seq, method, params_hash, params_blob, status, result_blob, "
            "attempt, started_at_ms) VALUES (?, ?, ?, ?, 'p', 'ok', 'p', 1, ?)",
            (
                (f"run_{i % 1000:06}", i // 1000 + 1, "llm.chat" if i % 3 == 0 else "tool.call", sha(str(i)), i)
                for i in range(entries)
            ),
        )
        db.executemany(
            "INSERT INTO message_chain VALUES (?, ?, 'p')",
            ((sha(f"m{i}"), sha(f"m{i - 1}")) for i in range(nodes)),
        )
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        before = os.path.getsize(path)
        db.execute("PRAGMA synchronous = FULL")
        db.execute("PRAGMA foreign_keys = ON")
        started = time.monotonic()
        db.execute("BEGIN IMMEDIATE")
        for statement in (s for s in v10.split(";") if s.strip()):
            db.execute(statement)
        db.execute("COMMIT")
        took = time.monotonic() - started
        wal = os.path.getsize(path + "-wal")
        print(f"SQLite {sqlite3.sqlite_version}: {entries} journal entries, {nodes} chain nodes, "
              f"a {before / 1e6:.0f} MB database")
        print(f"V10 migration: {took:.2f} s; the WAL grew to {wal / 1e6:.0f} MB (the store truncates it after)")


if __name__ == "__main__":
    main()
