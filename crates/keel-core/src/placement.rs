//! Admission across several kernel nodes: the scheduler's caps count every node's live
//! runs, and a queued run is started by whichever node has a free slot of its own.
//!
//! The shared state is a ledger of slots (one row per run that holds a live slot or waits
//! for one), kept by the store; each decision reads the whole ledger under a lock every
//! node takes, rebuilds an [`Admitter`] from it, decides with the same policy a single
//! kernel uses (priorities with aging, weighted fair share, the same caps), and writes
//! back the changes. This module is that decision, without IO.

use crate::sched::{Admission, Admitter, Caps, Ticket, Weights};

/// One row of the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub ticket: Ticket,
    /// The node whose live slot the run holds; `None` while it waits.
    pub node: Option<String>,
    /// For a waiting run only that node may start (a swapped-out run, whose lease its
    /// node keeps): that node.
    pub home: Option<String>,
    /// Whether a node may start the waiting run now: its record exists and waits in
    /// `queued` (a row is written before its run's record), or it has a home.
    pub ready: bool,
}

/// A change to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Insert or replace the run's row.
    Put(Slot),
    /// Delete the run's row.
    Remove(String),
}

/// What a decision did: the ledger changes to write, and the runs this node starts now
/// (each already counted live on it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub changes: Vec<Change>,
    pub start_here: Vec<String>,
}

/// The cluster-wide policy: the caps of `[scheduler]` (the same on every node) and this
/// node's own cap on its live runs.
#[derive(Debug, Clone)]
pub struct Placement {
    pub caps: Caps,
    pub weights: Weights,
    pub aging_ms: u64,
    /// Live runs this node may hold (`keel serve --max-live`); `None`: no cap of its own.
    pub node_cap: Option<u32>,
}

impl Placement {
    /// The admitter the ledger describes: live rows count against the caps, waiting rows
    /// queue in submission order.
    pub fn admitter(&self, ledger: &[Slot]) -> Admitter {
        let live = ledger.iter().filter(|slot| slot.node.is_some()).map(|slot| slot.ticket.clone());
        let mut waiting: Vec<&Slot> = ledger.iter().filter(|slot| slot.node.is_none()).collect();
        waiting.sort_by(|a, b| {
            (a.ticket.submitted_ms, &a.ticket.run).cmp(&(b.ticket.submitted_ms, &b.ticket.run))
        });
        let waiting = waiting.into_iter().map(|slot| slot.ticket.clone());
        Admitter::restored(self.caps, self.weights.clone(), self.aging_ms, live, waiting)
    }

    /// Free live slots of `node`'s own (`usize::MAX` without a cap).
    fn room(&self, ledger: &[Slot], node: &str) -> usize {
        let Some(cap) = self.node_cap else { return usize::MAX };
        let live = ledger.iter().filter(|slot| slot.node.as_deref() == Some(node)).count();
        (cap as usize).saturating_sub(live)
    }

    /// A run asks for a slot on `node`: it starts there now when the decision's
    /// `start_here` names it; otherwise it waits (for a slot anywhere, or only on `node` with `home`), `Err` a full queue (as
    /// [`Admission::Rejected`]). `may_reject` false: never refused (a swapped-out run whose
    /// wait is over, a run recovered after a crash).
    pub fn submit(
        &self,
        ledger: &[Slot],
        node: &str,
        ticket: Ticket,
        now_ms: u64,
        may_reject: bool,
        home: bool,
    ) -> Result<Decision, Admission> {
        let current = ledger.iter().find(|slot| slot.ticket.run == ticket.run);
        let start = match current.and_then(|slot| slot.node.as_deref()) {
            // Already live here.
            Some(owner) if owner == node => {
                return Ok(Decision { changes: Vec::new(), start_here: vec![ticket.run] });
            }
            // Live on a node that died, and this one recovers it: it moves here.
            Some(_) => true,
            None => {
                // A run waiting already is decided afresh, as if it were not in line.
                let others: Vec<Slot> =
                    ledger.iter().filter(|slot| slot.ticket.run != ticket.run).cloned().collect();
                let mut admitter = self.admitter(&others);
                let answer = if may_reject {
                    admitter.submit(ticket.clone(), now_ms)
                } else {
                    admitter.resume(ticket.clone(), now_ms)
                };
                match answer {
                    Admission::Start => self.room(ledger, node) > 0,
                    Admission::Queued { .. } => false,
                    rejected @ Admission::Rejected { .. } => return Err(rejected),
                }
            }
        };
        let slot = Slot {
            ticket,
            node: start.then(|| node.to_owned()),
            home: (!start && home).then(|| node.to_owned()),
            ready: true,
        };
        let run = slot.ticket.run.clone();
        let mut decision = Decision { changes: vec![Change::Put(slot)], start_here: Vec::new() };
        if start {
            decision.start_here.push(run);
        }
        Ok(decision)
    }

    /// `run` is live on `node` (recovered after a restart, or taken over from a dead
    /// node): it counts there, over the caps if need be.
    pub fn restore_live(&self, node: &str, ticket: Ticket) -> Decision {
        Decision {
            changes: vec![Change::Put(Slot { ticket, node: Some(node.to_owned()), home: None, ready: true })],
            start_here: Vec::new(),
        }
    }

    /// `run` gives its slot back on `node` (it ended, swapped out, or could not start
    /// there): its row goes, unless it now belongs to another node (live there, or a
    /// waiting run homed there). Either way, the waiting runs this node may start are
    /// started (see [`Placement::pull`]).
    pub fn release(&self, ledger: &[Slot], node: &str, run: &str, now_ms: u64) -> Decision {
        let mine = |slot: &Slot| match (&slot.node, &slot.home) {
            (Some(owner), _) => owner == node,
            (None, Some(home)) => home == node,
            (None, None) => true,
        };
        let mut ledger: Vec<Slot> = ledger.to_vec();
        let mut changes = Vec::new();
        if let Some(index) = ledger.iter().position(|slot| slot.ticket.run == run && mine(slot)) {
            ledger.remove(index);
            changes.push(Change::Remove(run.to_owned()));
        }
        let mut decision = self.pull(&ledger, node, now_ms);
        changes.append(&mut decision.changes);
        decision.changes = changes;
        decision
    }

    /// The waiting runs `node` starts now: as many as it has room for, best first, among
    /// those the caps allow, that are ready, and that no other node must start.
    pub fn pull(&self, ledger: &[Slot], node: &str, now_ms: u64) -> Decision {
        let room = self.room(ledger, node);
        if room == 0 {
            return Decision::default();
        }
        let eligible: std::collections::HashSet<&str> = ledger
            .iter()
            .filter(|slot| {
                slot.node.is_none() && slot.ready && slot.home.as_deref().is_none_or(|home| home == node)
            })
            .map(|slot| slot.ticket.run.as_str())
            .collect();
        let mut admitter = self.admitter(ledger);
        let started = admitter.start_ready(now_ms, room, |ticket| eligible.contains(ticket.run.as_str()));
        let changes = started
            .iter()
            .filter_map(|run| ledger.iter().find(|slot| slot.ticket.run == *run))
            .map(|slot| Change::Put(Slot { node: Some(node.to_owned()), home: None, ..slot.clone() }))
            .collect();
        Decision { changes, start_here: started }
    }

    /// A waiting run that could start under the caps now on a node with room for it (to
    /// tell the other nodes, when this one cannot take it). `admitter` is this ledger's
    /// (`Placement::admitter`).
    pub fn startable_elsewhere(&self, ledger: &[Slot], admitter: &Admitter) -> Option<String> {
        ledger
            .iter()
            .find(|slot| {
                slot.node.is_none() && slot.ready && admitter.fits(&slot.ticket.tenant, &slot.ticket.agent)
            })
            .map(|slot| slot.ticket.run.clone())
    }
}

/// The ledger after `changes`, as the store writes them.
pub fn apply(ledger: &[Slot], changes: &[Change]) -> Vec<Slot> {
    let mut ledger = ledger.to_vec();
    for change in changes {
        match change {
            Change::Put(slot) => match ledger.iter_mut().find(|s| s.ticket.run == slot.ticket.run) {
                // The store keeps a row's ticket and changes where it stands.
                Some(row) => (row.node, row.home) = (slot.node.clone(), slot.home.clone()),
                None => ledger.push(slot.clone()),
            },
            Change::Remove(run) => ledger.retain(|s| s.ticket.run != *run),
        }
    }
    ledger
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::Priority;

    fn ticket(run: &str, tenant: &str, priority: Priority, submitted_ms: u64) -> Ticket {
        Ticket {
            run: run.to_owned(),
            tenant: tenant.to_owned(),
            agent: "agent".to_owned(),
            priority,
            submitted_ms,
        }
    }

    fn placement(global: Option<u32>, node_cap: Option<u32>) -> Placement {
        Placement {
            caps: Caps { global, per_tenant: None, per_agent: None, queue: 3 },
            weights: Weights::default(),
            aging_ms: 0,
            node_cap,
        }
    }

    fn apply(ledger: &mut Vec<Slot>, decision: &Decision) {
        *ledger = super::apply(ledger, &decision.changes);
    }

    fn submit(p: &Placement, ledger: &mut Vec<Slot>, node: &str, t: Ticket) -> Result<bool, Admission> {
        let run = t.run.clone();
        let decision = p.submit(ledger, node, t, 0, true, false)?;
        apply(ledger, &decision);
        Ok(decision.start_here.contains(&run))
    }

    fn live_on(ledger: &[Slot], node: &str) -> usize {
        ledger.iter().filter(|s| s.node.as_deref() == Some(node)).count()
    }

    #[test]
    fn the_global_cap_counts_every_nodes_runs_and_a_full_queue_refuses() {
        let p = placement(Some(2), None);
        let mut ledger = Vec::new();
        assert_eq!(submit(&p, &mut ledger, "n1", ticket("a", "t", Priority::Normal, 1)), Ok(true));
        assert_eq!(submit(&p, &mut ledger, "n2", ticket("b", "t", Priority::Normal, 2)), Ok(true));
        // Two live in all, on two nodes: the third waits, wherever it was submitted.
        assert_eq!(submit(&p, &mut ledger, "n3", ticket("c", "t", Priority::Normal, 3)), Ok(false));
        for (i, run) in ["d", "e"].into_iter().enumerate() {
            assert_eq!(
                submit(&p, &mut ledger, "n1", ticket(run, "t", Priority::Normal, 4 + i as u64)),
                Ok(false)
            );
        }
        assert!(matches!(
            submit(&p, &mut ledger, "n2", ticket("f", "t", Priority::Normal, 9)),
            Err(Admission::Rejected { .. })
        ));
        // n2's run ends: n2 starts the oldest waiting run, though n3 queued it.
        let decision = p.release(&ledger, "n2", "b", 10);
        assert_eq!(decision.start_here, vec!["c".to_owned()]);
        apply(&mut ledger, &decision);
        assert_eq!((live_on(&ledger, "n1"), live_on(&ledger, "n2")), (1, 1));
    }

    #[test]
    fn a_node_at_its_own_cap_leaves_runs_for_nodes_with_room_highest_priority_first() {
        let p = placement(None, Some(1));
        let mut ledger = Vec::new();
        assert_eq!(submit(&p, &mut ledger, "n1", ticket("a", "t", Priority::Normal, 1)), Ok(true));
        // n1 is full: these wait although no cluster cap holds them.
        assert_eq!(submit(&p, &mut ledger, "n1", ticket("low", "t", Priority::Low, 2)), Ok(false));
        assert_eq!(submit(&p, &mut ledger, "n1", ticket("high", "t", Priority::High, 3)), Ok(false));
        assert_eq!(p.startable_elsewhere(&ledger, &p.admitter(&ledger)), Some("low".to_owned()));
        // n2 has room for one: it takes the high-priority run.
        let decision = p.pull(&ledger, "n2", 4);
        assert_eq!(decision.start_here, vec!["high".to_owned()]);
        apply(&mut ledger, &decision);
        assert!(p.pull(&ledger, "n2", 5).start_here.is_empty(), "n2 is at its cap now");
        assert!(p.pull(&ledger, "n1", 5).start_here.is_empty(), "n1 still is");
        let decision = p.release(&ledger, "n1", "a", 6);
        assert_eq!(decision.start_here, vec!["low".to_owned()]);
    }

    #[test]
    fn a_waiting_run_with_a_home_or_no_record_yet_is_not_started_elsewhere() {
        let p = placement(Some(1), None);
        let mut ledger = vec![Slot {
            ticket: ticket("a", "t", Priority::Normal, 1),
            node: Some("n1".into()),
            home: None,
            ready: true,
        }];
        // A swapped-out run of n1 asks back while the one slot is taken: it waits, homed on n1.
        let decision = p.submit(&ledger, "n1", ticket("s", "t", Priority::High, 2), 2, false, true).unwrap();
        assert!(decision.start_here.is_empty());
        apply(&mut ledger, &decision);
        // A run whose record is not written yet.
        ledger.push(Slot {
            ticket: ticket("new", "t", Priority::High, 3),
            node: None,
            home: None,
            ready: false,
        });
        // The slot frees on n2's side of things: neither may start there.
        let mut freed = ledger.clone();
        freed.retain(|s| s.ticket.run != "a");
        assert!(p.pull(&freed, "n2", 4).start_here.is_empty());
        // n1 releases: its homed run starts there.
        let decision = p.release(&ledger, "n1", "a", 4);
        assert_eq!(decision.start_here, vec!["s".to_owned()]);
    }

    #[test]
    fn release_keeps_a_row_that_now_belongs_to_another_node() {
        let p = placement(Some(5), None);
        let ledger = vec![Slot {
            ticket: ticket("a", "t", Priority::Normal, 1),
            node: Some("n2".into()),
            home: None,
            ready: true,
        }];
        // n1 lost the run to n2, which restored it live there: n1's release changes nothing.
        assert_eq!(p.release(&ledger, "n1", "a", 2), Decision::default());
        assert_eq!(p.release(&ledger, "n2", "a", 2).changes, vec![Change::Remove("a".to_owned())]);
    }

    #[test]
    fn a_run_recovered_from_a_dead_node_moves_over_even_at_the_cap() {
        let p = placement(Some(1), Some(1));
        let ledger = vec![
            Slot {
                ticket: ticket("mine", "t", Priority::Normal, 1),
                node: Some("n2".into()),
                home: None,
                ready: true,
            },
            Slot {
                ticket: ticket("dead", "t", Priority::Normal, 2),
                node: Some("n1".into()),
                home: None,
                ready: true,
            },
        ];
        let decision =
            p.submit(&ledger, "n2", ticket("dead", "t", Priority::Normal, 2), 3, false, false).unwrap();
        assert_eq!(decision.start_here, vec!["dead".to_owned()], "it held a slot already");
    }

    #[test]
    fn a_waiting_run_decided_again_starts_when_it_fits() {
        let p = placement(Some(1), None);
        let waiting =
            Slot { ticket: ticket("q", "t", Priority::Normal, 1), node: None, home: None, ready: true };
        let decision =
            p.submit(std::slice::from_ref(&waiting), "n1", waiting.ticket.clone(), 2, false, false).unwrap();
        assert_eq!(decision.start_here, vec!["q".to_owned()], "its own place in line does not hold it back");
    }
}
