//! Many nodes on one Postgres database, at the store: node ids, leases that move only
//! when a heartbeat lapses, writes fenced by the epoch a node holds, wake-ups and the
//! shared secret. Each node is a `PgStore` of its own, as in separate processes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_store::cluster::{Cluster, NodeInfo};
use keel_store::{Error, EventRecord, NewEvent, PgNode, PgStore, RunPatch, Store};
use keel_types::{RunId, RunState};
use serde_json::json;

use crate::new_run;
use crate::pg_database::TestDatabase;

/// Short, so a lapse is quick; heartbeats below come every quarter of it, far inside it even
/// on a loaded machine.
const TTL: Duration = Duration::from_millis(1500);

async fn node(db: &TestDatabase, id: &str) -> (PgStore, PgNode) {
    let store = PgStore::connect(db.url()).await.expect("connect");
    let node = store.node(id).expect("a valid node id");
    node.join(info(id), &format!("key of {id}"), TTL).await.expect("join");
    (store, node)
}

fn info(id: &str) -> NodeInfo {
    NodeInfo { id: id.to_owned(), addr: format!("127.0.0.1:{}", 7000 + id.len()), version: "test".to_owned() }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn event(kind: &str) -> NewEvent {
    NewEvent { ts_ms: now_ms(), kind: kind.to_owned(), data: json!({}) }
}

fn entry(method: &str) -> keel_store::NewEntry {
    crate::pending_entry(method, json!({}), 1)
}

async fn events(store: &PgStore, run: &RunId) -> Vec<EventRecord> {
    store.events(run, 0, 100).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_node_keeps_its_id_and_a_bad_id_is_refused() {
    let db = TestDatabase::create().await;
    let (_a, first) = node(&db, "a").await;
    let second = PgStore::connect(db.url()).await.unwrap();
    let twin = second.node("a").unwrap();
    let refused = twin.join(info("a"), "another key", TTL).await;
    assert!(
        matches!(&refused, Err(Error::Refused(why)) if why.contains("in use by a live node") && why.contains("--node-id")),
        "{refused:?}"
    );
    // The same node restarted (its key) takes the id back at once, heartbeat live or not.
    let (_restarted, again) = node(&db, "a").await;
    assert!(again.nodes().await.unwrap()[0].live);
    // Once it leaves, the id is free for anyone.
    first.leave().await.unwrap();
    twin.join(info("a"), "another key", TTL).await.expect("the id of a node that left");
    for bad in ["", "a b", "n/1", &"x".repeat(65)] {
        assert!(matches!(second.node(bad), Err(Error::Refused(_))), "{bad:?}");
    }
    // One store is one node.
    assert!(matches!(second.node("b"), Err(Error::Refused(why)) if why.contains("already joined")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_moves_only_after_its_heartbeat_lapses_and_the_old_owner_is_fenced() {
    let db = TestDatabase::create().await;
    let (a_store, a) = node(&db, "a").await;
    let (b_store, b) = node(&db, "b").await;
    let mut a_lost = a.lost();
    let run = a_store.create_run(new_run(now_ms())).await.unwrap().id;
    assert_eq!(a.acquire(&run).await.unwrap(), Some(1));
    assert!(a.holds(&run));
    // Held by a live node: b may neither take it nor write for it.
    assert_eq!(b.acquire(&run).await.unwrap(), None);
    assert!(b.claim_orphans(10).await.unwrap().is_empty());
    let refused = b_store.append_events(&run, &[event("from b")]).await;
    assert!(matches!(&refused, Err(Error::Refused(why)) if why.contains("node a")), "{refused:?}");
    let refused = b_store.append_entry(&run, &entry("from.b")).await;
    assert!(matches!(&refused, Err(Error::Refused(why)) if why.contains("node a")), "{refused:?}");
    a_store.append_events(&run, &[event("from a")]).await.expect("the owner writes");
    assert_eq!(a_store.append_entry(&run, &entry("from.a")).await.unwrap(), 1);
    // a keeps its lease alive past several ttls by its heartbeat alone...
    for _ in 0..3 {
        tokio::time::sleep(TTL / 4).await;
        assert!(a.heartbeat().await.unwrap().is_empty());
        b.heartbeat().await.unwrap();
        assert!(b.claim_orphans(10).await.unwrap().is_empty(), "taken while its node was live");
    }
    // ... and loses it once the heartbeat lapses: b claims it at the next epoch.
    tokio::time::sleep(TTL + Duration::from_millis(200)).await;
    b.heartbeat().await.unwrap();
    assert_eq!(b.claim_orphans(10).await.unwrap(), vec![run.clone()]);
    let lease = a.owner(&run).await.unwrap().expect("a lease");
    assert_eq!((lease.node.as_str(), lease.epoch, lease.live), ("b", 2, true));
    // a's late writes are refused and write nothing; a hears it lost the run.
    let before = events(&a_store, &run).await.len();
    let fenced = a_store.append_events(&run, &[event("late")]).await;
    assert!(matches!(&fenced, Err(Error::Fenced { epoch: 1, .. })), "{fenced:?}");
    let patched = a_store
        .update_run(&run, None, RunPatch { state: Some(RunState::Failed), ..RunPatch::default() })
        .await;
    assert!(matches!(patched, Err(Error::Fenced { .. }) | Err(Error::Refused(_))), "{patched:?}");
    assert_eq!(events(&a_store, &run).await.len(), before);
    let late = a_store.append_entry(&run, &entry("late")).await;
    assert!(matches!(late, Err(Error::Fenced { .. }) | Err(Error::Refused(_))), "{late:?}");
    let journal = a_store.journal(&run, 0).await.unwrap();
    assert_eq!(
        journal.iter().map(|e| e.method.as_str()).collect::<Vec<_>>(),
        ["from.a"],
        "refused writes wrote nothing"
    );
    assert_eq!(a_lost.recv().await.unwrap(), run);
    assert!(!a.holds(&run));
    b_store.append_events(&run, &[event("from b")]).await.expect("the new owner writes");
    // b ends the run and gives the lease up; nobody claims an ended run.
    b_store
        .update_run(&run, None, RunPatch { state: Some(RunState::Succeeded), ..RunPatch::default() })
        .await
        .unwrap();
    b.release(&run).await.unwrap();
    assert_eq!(b.owner(&run).await.unwrap(), None);
    tokio::time::sleep(TTL * 2).await;
    assert!(a.claim_orphans(10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_finds_leases_taken_while_the_node_was_away() {
    let db = TestDatabase::create().await;
    let (a_store, a) = node(&db, "a").await;
    let (_b_store, b) = node(&db, "b").await;
    let run = a_store.create_run(new_run(now_ms())).await.unwrap().id;
    a.acquire(&run).await.unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(200)).await;
    b.heartbeat().await.unwrap();
    assert_eq!(b.claim_orphans(10).await.unwrap(), vec![run.clone()]);
    // a comes back (a paused process resumed): its first heartbeat names the lost run.
    assert_eq!(a.heartbeat().await.unwrap(), vec![run.clone()]);
    assert!(a.heartbeat().await.unwrap().is_empty(), "reported once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_without_a_lease_are_claimed_only_once_they_are_old() {
    let db = TestDatabase::create().await;
    let (store, a) = node(&db, "a").await;
    let old = store.create_run(new_run(now_ms() - 60_000)).await.unwrap().id;
    let fresh = store.create_run(new_run(now_ms())).await.unwrap().id;
    let ended = store.create_run(new_run(now_ms() - 60_000)).await.unwrap().id;
    store
        .update_run(
            &ended,
            None,
            RunPatch {
                state: Some(RunState::Succeeded),
                updated_at_ms: Some(now_ms() - 60_000),
                ..RunPatch::default()
            },
        )
        .await
        .unwrap();
    store
        .update_run(&old, None, RunPatch { updated_at_ms: Some(now_ms() - 60_000), ..RunPatch::default() })
        .await
        .unwrap();
    assert_eq!(a.claim_orphans(10).await.unwrap(), vec![old.clone()]);
    assert!(a.holds(&old) && !a.holds(&fresh) && !a.holds(&ended));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_listed_and_share_wake_ups_and_a_secret() {
    let db = TestDatabase::create().await;
    let (store, a) = node(&db, "a").await;
    let (_b_store, b) = node(&db, "b").await;
    let run = store.create_run(new_run(now_ms())).await.unwrap().id;
    a.acquire(&run).await.unwrap();
    let nodes = b.nodes().await.unwrap();
    let listed: Vec<(&str, bool, u64)> =
        nodes.iter().map(|n| (n.info.id.as_str(), n.live, n.leases)).collect();
    assert_eq!(listed, [("a", true, 1), ("b", true, 0)]);
    assert_eq!(nodes[0].info.addr, "127.0.0.1:7001");
    let secret = a.secret().await.unwrap();
    assert!(secret.len() >= 32);
    assert_eq!(b.secret().await.unwrap(), secret);
    // A wake-up from a reaches b (LISTEN/NOTIFY); the listener may still be connecting.
    let mut wakes = b.wakes();
    let woken = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            a.wake(&run).await.unwrap();
            if let Ok(Ok(woken)) = tokio::time::timeout(Duration::from_millis(200), wakes.recv()).await {
                return woken;
            }
        }
    })
    .await
    .expect("a wake-up within 10 s");
    assert_eq!(woken, run);
    a.set_draining(true).await.unwrap();
    a.leave().await.unwrap();
    let nodes = b.nodes().await.unwrap();
    assert!(nodes[0].draining && !nodes[0].live, "{nodes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_takes_its_own_runs_back_and_never_a_lease_it_is_taking() {
    let db = TestDatabase::create().await;
    let (store, first_life) = node(&db, "a").await;
    let run = store.create_run(new_run(now_ms())).await.unwrap().id;
    assert_eq!(first_life.acquire(&run).await.unwrap(), Some(1));
    // Taking a lease it already holds changes nothing (a relaunch after a swap-out).
    assert_eq!(first_life.acquire(&run).await.unwrap(), Some(1));
    assert!(first_life.claim_orphans(10).await.unwrap().is_empty(), "its own live lease is no orphan");
    // Killed: its heartbeat lapses, and the same id joins again from a new process.
    drop(first_life);
    tokio::time::sleep(TTL + Duration::from_millis(200)).await;
    let (store, second_life) = node(&db, "a").await;
    let fresh = store.create_run(new_run(now_ms())).await.unwrap().id;
    assert_eq!(second_life.acquire(&fresh).await.unwrap(), Some(1));
    assert_eq!(
        second_life.claim_orphans(10).await.unwrap(),
        vec![run.clone()],
        "only the previous life's run"
    );
    assert_eq!(second_life.owner(&run).await.unwrap().unwrap().epoch, 2);
    assert!(second_life.claim_orphans(10).await.unwrap().is_empty());
    store.append_events(&fresh, &[event("still ours")]).await.expect("the lease it took stays its own");
}

/// The admission ledger: decisions from several nodes at once are serialized (a cap of
/// five is never exceeded however the submissions interleave), and an ended run's row is
/// dropped by the next decision anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_decisions_are_serialized_across_nodes() {
    use keel_core::placement::{Placement, Slot};
    use keel_core::sched::{Caps, Priority, Ticket, Weights};
    use std::sync::Arc;

    let db = TestDatabase::create().await;
    let placement = Placement {
        caps: Caps { global: Some(5), per_tenant: None, per_agent: None, queue: 100 },
        weights: Weights::default(),
        aging_ms: 0,
        node_cap: None,
    };
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        let (store, node) = node(&db, id).await;
        nodes.push((store, Arc::new(node)));
    }
    let mut submissions = tokio::task::JoinSet::new();
    for (_, node) in &nodes {
        for _ in 0..8 {
            let (placement, node) = (placement.clone(), Arc::clone(node));
            submissions.spawn(async move {
                let ticket = Ticket {
                    run: RunId::generate(now_ms()).to_string(),
                    tenant: "t".to_owned(),
                    agent: "agent".to_owned(),
                    priority: Priority::Normal,
                    submitted_ms: now_ms(),
                };
                let mut started = false;
                node.admission(&mut |ledger: &[Slot]| {
                    let decision = placement
                        .submit(ledger, node.node_id(), ticket.clone(), now_ms(), true, false)
                        .unwrap();
                    started = decision.start_here.contains(&ticket.run);
                    decision.changes
                })
                .await
                .unwrap();
                started
            });
        }
    }
    let started = submissions.join_all().await;
    assert_eq!(started.iter().filter(|s| **s).count(), 5, "{started:?}");
    let mut seen = Vec::new();
    nodes[0]
        .1
        .admission(&mut |ledger: &[Slot]| {
            seen = ledger.to_vec();
            Vec::new()
        })
        .await
        .unwrap();
    assert_eq!(seen.len(), 24);
    assert_eq!(seen.iter().filter(|slot| slot.node.is_some()).count(), 5);

    // A run that ended: its row goes at the next decision, whoever takes it.
    let live = seen.iter().find(|slot| slot.node.is_some()).unwrap().ticket.run.clone();
    let mut run = new_run(now_ms());
    run.id = RunId::parse(&live).unwrap();
    run.state = RunState::Succeeded;
    nodes[1].0.create_run(run).await.unwrap();
    nodes[2]
        .1
        .admission(&mut |ledger: &[Slot]| {
            seen = ledger.to_vec();
            Vec::new()
        })
        .await
        .unwrap();
    assert_eq!(seen.len(), 23);
    assert!(seen.iter().all(|slot| slot.ticket.run != live), "{seen:?}");
}

/// `next_lapse`: when the next other live node's heartbeat runs out, by the database's
/// clock; none once no other node is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_lapse_is_the_soonest_other_heartbeats_expiry() {
    let db = TestDatabase::create().await;
    let (_a, a) = node(&db, "a").await;
    assert_eq!(a.next_lapse().await.unwrap(), None, "alone: nobody else's heartbeat to wait for");
    let (_b, b) = node(&db, "b").await;
    let lapse = a.next_lapse().await.unwrap().expect("b is live");
    assert!(lapse <= TTL, "{lapse:?}");
    b.leave().await.unwrap();
    assert_eq!(a.next_lapse().await.unwrap(), None, "b left");
}
