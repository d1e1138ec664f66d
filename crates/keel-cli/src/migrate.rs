//! `keel migrate`: copy a store into another (an SQLite file into a new file, or into
//! Postgres) and prove the copy whole before anything
//! may use it.
//!
//! The steps, each refusing with what to do: the source must be a keel database no kernel
//! is using (its data directory's lock is taken), not the target, and not itself an
//! unverified copy; the target must be empty. The target is marked as an unfinished copy
//! (`keel_store::dump::MIGRATION_KEY`) before anything is copied, filled batch by batch
//! from the source's dump, then verified: both are dumped again and compared item by
//! item, and both audit chains must verify to the same head. Only then is the mark
//! replaced by a verified one; a kernel refuses to start on a store marked unfinished,
//! so a copy cut short or found different cannot be used by mistake.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use keel_kernel::{DataDir, LockedDataDir};
use keel_store::dump::{self, DumpItem};
use keel_store::{AuditVerify, SqliteStore, Store};
use serde_json::json;
use tokio::sync::mpsc;

use crate::store_url::{self, StoreUrl};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The store to copy: a keel SQLite database, as sqlite:PATH (a data directory's
    /// keel.db) or a plain path. No kernel may be using it.
    #[arg(long, value_name = "sqlite:PATH")]
    from: String,
    /// The empty store to copy into: sqlite:PATH (created if missing), or postgres://...
    #[arg(long, value_name = "URL")]
    to: String,
}

/// Items copied per kind, in the order the dump first sent each kind.
#[derive(Debug, Default)]
struct Counts {
    kinds: Vec<(&'static str, u64)>,
}

impl Counts {
    fn add(&mut self, item: &DumpItem) {
        let kind = item.kind();
        match self.kinds.iter_mut().find(|(counted, _)| *counted == kind) {
            Some((_, count)) => *count += 1,
            None => self.kinds.push((kind, 1)),
        }
    }

    fn total(&self) -> u64 {
        self.kinds.iter().map(|(_, count)| count).sum()
    }

    /// One line per kind, for the end of the copy.
    fn table(&self) -> String {
        let width = self.kinds.iter().map(|(kind, _)| kind.len()).max().unwrap_or(0);
        self.kinds.iter().map(|(kind, count)| format!("  {kind:<width$}  {count:>8}\n")).collect()
    }
}

/// Progress is reported on stderr each time this many more items are copied.
const PROGRESS_EVERY: u64 = 10_000;

pub async fn migrate(args: MigrateArgs) -> Result<ExitCode> {
    let from = StoreUrl::parse(&args.from).context("--from")?;
    let to = StoreUrl::parse(&args.to).context("--to")?;
    let StoreUrl::Sqlite(source_path) = &from else {
        bail!("--from {from}: keel migrate copies from an SQLite database (sqlite:PATH) only");
    };
    if !source_path.exists() {
        bail!(
            "--from {from}: no such file. Name a keel database, e.g. sqlite:$HOME/.local/share/keel/keel.db \
             (the keel.db of a data directory)"
        );
    }
    if source_path.is_dir() {
        bail!(
            "--from {from} is a directory; name the database inside it: sqlite:{}",
            source_path.join("keel.db").display()
        );
    }
    if let StoreUrl::Sqlite(target_path) = &to
        && same_file(source_path, target_path)
    {
        bail!("--from and --to both name {from}: copy into a new file or another store");
    }

    // The locks are held until the end: no kernel starts on either file meanwhile.
    let _source_lock = lock_data_dir_of(source_path, "the source")?;
    // A target beside the source is covered by the source's lock (a second lock of the
    // same directory would find the first one held).
    let _target_lock = match &to {
        StoreUrl::Sqlite(target_path)
            if !same_file(&directory_of(source_path), &directory_of(target_path)) =>
        {
            lock_data_dir_of(target_path, "the target")?
        }
        StoreUrl::Sqlite(_) | StoreUrl::Postgres(_) => None,
    };
    let opened = source_path.clone();
    let source: Arc<dyn Store> = Arc::new(
        tokio::task::spawn_blocking(move || SqliteStore::open_existing(&opened))
            .await
            .context("opening the source")?
            .with_context(|| format!("--from {from}"))?,
    );
    if let Some(why) = dump::migration_incomplete(&*source).await.context("reading the source")? {
        bail!("--from {from} cannot be copied: {why}");
    }
    let target = store_url::open_store(&args.to).await.with_context(|| format!("--to {to}"))?;
    if !target.is_empty().await.context("checking the target is empty")? {
        if dump::migration_incomplete(&*target).await.context("reading the target")?.is_some() {
            bail!(
                "--to {to} holds an unfinished copy from an earlier keel migrate; delete it (for SQLite \
                 the file with its -wal and -shm files) and run keel migrate again"
            );
        }
        bail!(
            "--to {to} already holds data: keel migrate copies only into an empty store, so nothing is \
             merged or overwritten. Name a new file (or an empty database)"
        );
    }

    let started_at_ms = crate::render::now_ms();
    let mark = |state: &str, extra: serde_json::Value| {
        let mut marker = json!({"state": state, "from": from.to_string(), "started_at_ms": started_at_ms});
        if let (Some(marker), serde_json::Value::Object(extra)) = (marker.as_object_mut(), extra) {
            marker.extend(extra);
        }
        marker
    };
    target
        .kv_put(dump::MIGRATION_SCOPE, dump::MIGRATION_KEY, mark("copying", json!({})))
        .await
        .context("marking the target as a copy in progress")?;

    eprintln!("keel: copying {from} into {to}");
    let counts = copy(&*source, &*target).await.with_context(|| {
        format!(
            "copying {from} into {to} failed; the copy must not be used (a kernel refuses to start on it)"
        )
    })?;
    eprint!("keel: copied {} items:\n{}", counts.total(), counts.table());

    eprintln!("keel: verifying the copy");
    let audit = verify(&*source, &*target).await.map_err(|difference| {
        anyhow::anyhow!(
            "the copy in {to} did not verify: {difference}. The copy must not be used (a kernel refuses \
             to start on it); delete it and run keel migrate again"
        )
    })?;
    let verified = json!({
        "items": counts.total(),
        "audit_entries": audit.entries,
        "audit_head": audit.head_hash,
        "verified_at_ms": crate::render::now_ms(),
    });
    target
        .kv_put(dump::MIGRATION_SCOPE, dump::MIGRATION_KEY, mark(dump::MIGRATION_VERIFIED, verified))
        .await
        .context("marking the verified copy")?;

    crate::outln!(
        "migrated {from} to {to}: {} items copied and verified; audit chain intact ({} entries, head {})",
        counts.total(),
        audit.entries,
        audit.head_hash
    )?;
    if let StoreUrl::Sqlite(path) = &to
        && path.file_name().is_some_and(|name| name == "keel.db")
    {
        crate::outln!("use it with: keel --data-dir {} serve", directory_of(path).display())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Streams the source's dump into the target, one `restore` per batch, and counts what
/// was copied. The source's own migration marker (it may be a verified copy) stays
/// behind: the target has its own.
async fn copy(source: &dyn Store, target: &dyn Store) -> Result<Counts> {
    let (sink, mut batches) = mpsc::channel::<Vec<DumpItem>>(2);
    let restoring = async {
        let mut counts = Counts::default();
        let mut reported = 0;
        while let Some(batch) = batches.recv().await {
            let batch: Vec<DumpItem> =
                batch.into_iter().filter(|item| !dump::is_migration_marker(item)).collect();
            batch.iter().for_each(|item| counts.add(item));
            if batch.is_empty() {
                continue;
            }
            target.restore(batch).await.context("writing into the target")?;
            if counts.total() / PROGRESS_EVERY > reported {
                reported = counts.total() / PROGRESS_EVERY;
                eprintln!("keel: copied {} items", counts.total());
            }
        }
        // Dropping the receiver on an error ends the dump early.
        anyhow::Ok(counts)
    };
    let (dumped, counts) = tokio::join!(source.dump(sink), restoring);
    let counts = counts?;
    dumped.context("reading the source")?;
    Ok(counts)
}

/// Dumps both stores and compares them, and verifies both audit chains: the copy's
/// verified audit chain, or what does not hold, in words.
async fn verify(source: &dyn Store, target: &dyn Store) -> Result<AuditVerify, String> {
    let failed = |what: &str, error: keel_store::Error| format!("{what} failed: {error}");
    let compared =
        dump::compare_stores(source, target).await.map_err(|e| failed("dumping both stores", e))?;
    compared?;
    let source_audit =
        source.audit_verify().await.map_err(|e| failed("verifying the source's audit chain", e))?;
    let target_audit =
        target.audit_verify().await.map_err(|e| failed("verifying the copy's audit chain", e))?;
    if let Some(broken) = &target_audit.broken {
        return Err(format!("the copy's audit chain is broken at entry {}: {}", broken.seq, broken.reason));
    }
    if let Some(broken) = &source_audit.broken {
        return Err(format!(
            "the source's own audit chain is broken at entry {}: {} (the copy has the same entries, but a \
             broken chain cannot be vouched for)",
            broken.seq, broken.reason
        ));
    }
    if (target_audit.entries, &target_audit.head_hash) != (source_audit.entries, &source_audit.head_hash) {
        return Err(format!(
            "the audit heads differ: the copy's is {} after {} entries, the source's {} after {}",
            target_audit.head_hash, target_audit.entries, source_audit.head_hash, source_audit.entries
        ));
    }
    Ok(target_audit)
}

/// Takes the lock of the data directory `database` is the `keel.db` of (its directory
/// holds `kernel.lock`), so that no kernel uses the store while it is copied; `None` for
/// a database outside a data directory.
fn lock_data_dir_of(database: &Path, role: &str) -> Result<Option<LockedDataDir>> {
    let dir = directory_of(database);
    let dir = dir.as_path();
    let data_dir = DataDir::new(dir);
    if !data_dir.lock_file().exists() {
        return Ok(None);
    }
    match data_dir.lock() {
        Ok(locked) => Ok(Some(locked)),
        Err(keel_kernel::Error::DataDirLocked { detail, .. }) => bail!(
            "{role} {} is in use by a running kernel: stop the kernel using it (data directory {}), then \
             run keel migrate again ({detail})",
            database.display(),
            dir.display()
        ),
        Err(error) => {
            Err(error).with_context(|| format!("taking the lock of data directory {}", dir.display()))
        }
    }
}

/// The directory a file is in (`.` for a bare file name).
fn directory_of(file: &Path) -> PathBuf {
    file.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_owned()
}

/// Whether two paths name one file (the second may not exist yet).
fn same_file(existing: &Path, other: &Path) -> bool {
    let resolve = |path: &Path| -> Option<PathBuf> {
        if let Ok(path) = path.canonicalize() {
            return Some(path);
        }
        Some(directory_of(path).canonicalize().ok()?.join(path.file_name()?))
    };
    matches!((resolve(existing), resolve(other)), (Some(a), Some(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_keep_the_dump_order_and_total() {
        let mut counts = Counts::default();
        let kv = DumpItem::Kv { scope: "s".into(), key: "k".into(), value: json!(1) };
        let delete =
            DumpItem::MemoryDelete { tenant: "t".into(), idempotency_key: "k".into(), deleted: true };
        for item in [&kv, &kv, &delete] {
            counts.add(item);
        }
        assert_eq!(counts.total(), 3);
        assert_eq!(counts.table(), "  kv value              2\n  memory delete         1\n");
    }

    /// A copy that differs from its source fails verification naming the first
    /// difference; an equal one passes with the source's audit head.
    #[tokio::test]
    async fn verification_names_the_first_difference() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| SqliteStore::open(&dir.path().join(name)).unwrap();
        let (source, copy) = (open("source.db"), open("copy.db"));
        for store in [&source, &copy] {
            store.kv_put("s", "a", json!(1)).await.unwrap();
        }
        copy.kv_put(dump::MIGRATION_SCOPE, dump::MIGRATION_KEY, json!({"state": "copying"})).await.unwrap();
        let audit = verify(&source, &copy).await.expect("equal but for the marker");
        assert_eq!((audit.entries, audit.broken), (0, None));
        source.kv_put("s", "b", json!(2)).await.unwrap();
        copy.kv_put("s", "b", json!("two")).await.unwrap();
        assert_eq!(verify(&source, &copy).await.unwrap_err(), "kv value \"b\" in scope \"s\": differs");
    }

    #[test]
    fn the_same_file_is_found_through_different_spellings() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keel.db");
        std::fs::write(&file, "").unwrap();
        assert!(same_file(&file, &dir.path().join("./keel.db")));
        assert!(!same_file(&file, &dir.path().join("new.db")));
    }
}
