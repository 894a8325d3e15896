//! How one claim shares its slots between tenants: the claim's decision,
//! pure, over the claimable jobs the store read.
//!
//! **The share is per tenant first, then per key.**
//!
//! 1. Each tenant's jobs are ranked among themselves: higher `priority`
//!    first, then the earlier due, then the older job. `priority` orders a
//!    tenant's own jobs only (docs/workflows.md, "Priority": it orders
//!    work "within the tenant's share"): a tenant that sets 100 everywhere
//!    goes no sooner than one that sets nothing.
//! 2. The tenants go round robin by rank: every tenant's first job, then
//!    every tenant's second, and so on; within one rank the earlier due job
//!    goes first, whoever's it is.
//! 3. Walking that order, a job is skipped when this process runs it
//!    already, when its tenant's concurrency cap has no room left, or when
//!    another job of its queue key was picked before it in this claim.
//!    The walk stops at `limit` picks.
//!
//! So a queue key only ever drops a job, after the ranking: a tenant that
//! splits its backlog over a thousand keys has more of its own jobs as
//! candidates, never a turn more than a tenant with one keyless backlog.
//! A start control's key (`flow`) only says when a run's first job is due
//! and has no part here at all. A tenant with one queue key has one
//! claimable job at a time (the store reads no job behind an older due job
//! of its key): that is what its key asks for.
//!
//! The store reads, per tenant, its first `limit` claimable jobs in the
//! order of (1), and cuts the union at [`CANDIDATES_PER_SLOT`] × `limit`
//! rows in the order of (2) — a prefix of each tenant's ranking, so [`pick`]
//! ranks them again to the same ranks. The reserved slots, the dispatch's
//! offers and the crowding rules of the engine's `fairness.rs` come on top
//! of this, in each process.

use std::collections::{HashMap, HashSet};

/// How far below its run's priority a job a bulk operation queues ranks
/// (a bulk retry's first job): under every live job of its tenant, as run
/// priorities are -100..100, and in its run's order among the bulk's.
/// Bulk work yields to live work: such jobs also hold at most half a
/// process's slots ([`bulk_room`]), so a live job finds a free slot
/// while a bulk retry of slow runs goes on.
pub const BULK_BELOW: i64 = 201;

/// How many candidates a claim reads per job it may take: the surplus lets
/// jobs whose queue key another candidate holds, or whose tenant's cap is
/// full, be dropped without leaving slots idle.
pub const CANDIDATES_PER_SLOT: u32 = 2;

/// One claimable job, as the store read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: i64,
    pub tenant: String,
    /// The job's queue key (a ticket's), if any.
    pub queue_key: Option<String>,
    /// Higher goes first among the tenant's own jobs.
    pub priority: i64,
    /// When the job became due (ms since the epoch).
    pub run_after: i64,
}

/// A job the claim takes, with its key qualified by its tenant
/// (`tenant:key`), the name the store locks it under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picked {
    pub id: i64,
    pub key: Option<String>,
}

/// The jobs one claim takes of `candidates`, in the claim's order: at most
/// `limit`, none in `running`, none past its tenant's room in `room` (a
/// tenant absent from it has no cap; the room left is written back), one
/// per queue key.
pub fn pick(
    candidates: &[Candidate],
    room: &mut HashMap<String, i64>,
    running: &[i64],
    limit: usize,
) -> Vec<Picked> {
    pick_within(candidates, room, running, limit, usize::MAX)
}

/// Whether a job of this priority was queued by a bulk operation
/// ([`BULK_BELOW`] under a run's priority).
pub fn is_bulk(priority: i64) -> bool {
    priority < -100
}

/// How many bulk jobs a process with `slots` slots, `running_bulk` of
/// them running bulk jobs, may take now: bulk work holds at most half its
/// slots, so a live job always finds one soon.
pub fn bulk_room(slots: usize, running_bulk: usize) -> usize {
    slots.div_ceil(2).saturating_sub(running_bulk)
}

/// [`pick`], taking at most `bulk` jobs a bulk operation queued
/// ([`is_bulk`]); the walk goes on past the others.
pub fn pick_within(
    candidates: &[Candidate],
    room: &mut HashMap<String, i64>,
    running: &[i64],
    limit: usize,
    mut bulk: usize,
) -> Vec<Picked> {
    let mut picked = Vec::with_capacity(limit.min(candidates.len()));
    let mut keys = HashSet::new();
    for job in order(candidates) {
        if picked.len() == limit {
            break;
        }
        if running.contains(&job.id) {
            continue;
        }
        if is_bulk(job.priority) {
            if bulk == 0 {
                continue;
            }
            bulk -= 1;
        }
        let room = room.get_mut(&job.tenant);
        if room.as_deref().is_some_and(|left| *left <= 0) {
            continue;
        }
        let key = job
            .queue_key
            .as_ref()
            .map(|key| format!("{}:{key}", job.tenant));
        if let Some(key) = &key
            && !keys.insert(key.clone())
        {
            continue;
        }
        if let Some(room) = room {
            *room -= 1;
        }
        picked.push(Picked { id: job.id, key });
    }
    picked
}

/// The claim's order: each tenant's jobs ranked by (priority descending,
/// due time, id), then the ranks round robin, the earlier due first within
/// a rank.
fn order(candidates: &[Candidate]) -> Vec<&Candidate> {
    let mut by_tenant: HashMap<&str, Vec<&Candidate>> = HashMap::new();
    for job in candidates {
        by_tenant.entry(&job.tenant).or_default().push(job);
    }
    let mut ranked: Vec<(usize, &Candidate)> = Vec::with_capacity(candidates.len());
    for jobs in by_tenant.values_mut() {
        jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.run_after, j.id));
        ranked.extend(jobs.iter().enumerate().map(|(rank, job)| (rank, *job)));
    }
    ranked.sort_by_key(|(rank, j)| (*rank, j.run_after, j.id));
    ranked.into_iter().map(|(_, job)| job).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A tenant's backlog and the queue's state, as the store would read
    /// it: the tenant's first `limit` claimable jobs, none behind a
    /// running or older job of its key.
    struct Backlog {
        tenant: &'static str,
        /// (queue key, priority) of each job, oldest first.
        jobs: Vec<(Option<String>, i64)>,
        first_id: i64,
    }

    impl Backlog {
        fn new(tenant: &'static str, first_id: i64) -> Self {
            Self {
                tenant,
                jobs: Vec::new(),
                first_id,
            }
        }

        fn keyless(mut self, n: usize) -> Self {
            self.jobs.extend((0..n).map(|_| (None, 0)));
            self
        }

        fn keyed(mut self, n: usize, keys: usize) -> Self {
            self.jobs
                .extend((0..n).map(|i| (Some(format!("k{}", i % keys)), 0)));
            self
        }
    }

    /// A queue of several tenants' backlogs and the jobs running now.
    struct Queue {
        backlogs: Vec<Backlog>,
        /// Jobs taken and not finished yet: their keys are busy.
        running: HashSet<i64>,
        done: HashSet<i64>,
        taken: HashMap<&'static str, usize>,
    }

    impl Queue {
        fn new(backlogs: Vec<Backlog>) -> Self {
            Self {
                backlogs,
                running: HashSet::new(),
                done: HashSet::new(),
                taken: HashMap::new(),
            }
        }

        /// What the store's candidate query returns for a claim of `limit`.
        fn candidates(&self, limit: usize) -> Vec<Candidate> {
            let mut all = Vec::new();
            for backlog in &self.backlogs {
                let mut busy_keys = HashSet::new();
                let mut theirs = Vec::new();
                for (i, (key, priority)) in backlog.jobs.iter().enumerate() {
                    let id = backlog.first_id + i as i64;
                    if self.done.contains(&id) {
                        continue;
                    }
                    // A job of a key that has a running or older job is
                    // not claimable.
                    if let Some(key) = key
                        && !busy_keys.insert(key.clone())
                    {
                        continue;
                    }
                    if self.running.contains(&id) {
                        continue;
                    }
                    theirs.push(Candidate {
                        id,
                        tenant: backlog.tenant.to_string(),
                        queue_key: key.clone(),
                        priority: *priority,
                        run_after: 1_000 + i as i64,
                    });
                }
                theirs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.run_after, j.id));
                theirs.truncate(limit);
                all.extend(theirs);
            }
            // The store's cut: rounds of ranks, then due time.
            order(&all)
                .into_iter()
                .take(limit * CANDIDATES_PER_SLOT as usize)
                .cloned()
                .collect()
        }

        /// One claim of `limit` jobs; the running ones stay running.
        fn claim(&mut self, limit: usize, room: &mut HashMap<String, i64>) -> Vec<Picked> {
            let candidates = self.candidates(limit);
            let picked = pick(&candidates, room, &[], limit);
            for job in &picked {
                self.running.insert(job.id);
                let backlog = self
                    .backlogs
                    .iter()
                    .find(|b| (b.first_id..b.first_id + b.jobs.len() as i64).contains(&job.id))
                    .expect("a picked job is a candidate's");
                *self.taken.entry(backlog.tenant).or_default() += 1;
            }
            picked
        }

        /// Every running job finishes.
        fn finish_all(&mut self) {
            self.done.extend(self.running.drain());
        }

        /// `rounds` claims of `limit`, each after the last one's jobs
        /// finished; how many jobs each tenant got.
        fn rounds(mut self, rounds: usize, limit: usize) -> HashMap<&'static str, usize> {
            for _ in 0..rounds {
                self.claim(limit, &mut HashMap::new());
                self.finish_all();
            }
            self.taken
        }
    }

    #[test]
    fn a_backlog_split_over_a_thousand_keys_gets_the_share_of_one_keyless_backlog() {
        let keyless = Queue::new(vec![
            Backlog::new("split", 1).keyless(1_000),
            Backlog::new("other", 10_000).keyless(1_000),
        ])
        .rounds(50, 8);
        let split = Queue::new(vec![
            Backlog::new("split", 1).keyed(1_000, 1_000),
            Backlog::new("other", 10_000).keyless(1_000),
        ])
        .rounds(50, 8);
        assert_eq!(keyless["split"], 200, "half of 50 claims of 8");
        assert_eq!(split["split"], keyless["split"]);
        assert_eq!(split["other"], keyless["other"]);
    }

    #[test]
    fn a_tenant_with_one_key_runs_one_job_at_a_time_and_the_split_one_takes_the_rest() {
        let mut queue = Queue::new(vec![
            Backlog::new("split", 1).keyed(1_000, 1_000),
            Backlog::new("one", 10_000).keyed(1_000, 1),
        ]);
        for _ in 0..20 {
            queue.claim(8, &mut HashMap::new());
        }
        // The one-key tenant's first job runs; nothing of its key runs
        // beside it, however many claims pass. The split tenant fills the
        // slots its turn leaves: no slot idles while it has work.
        assert_eq!(queue.taken["one"], 1);
        assert_eq!(queue.taken["split"], 20 * 8 - 1);
        queue.finish_all();
        let picked = queue.claim(8, &mut HashMap::new());
        assert_eq!(
            picked.iter().filter(|p| p.id >= 10_000).count(),
            1,
            "the key's next job goes once the first has finished"
        );
    }

    #[test]
    fn many_tenants_each_get_a_turn_before_anyone_gets_a_second() {
        let backlogs = vec![
            Backlog::new("big", 1).keyed(1_000, 1_000),
            Backlog::new("a", 10_000).keyless(1),
            Backlog::new("b", 20_000).keyless(1),
            Backlog::new("c", 30_000).keyless(1),
        ];
        let mut queue = Queue::new(backlogs);
        queue.claim(4, &mut HashMap::new());
        for tenant in ["big", "a", "b", "c"] {
            assert_eq!(queue.taken[tenant], 1, "{tenant}");
        }
    }

    #[test]
    fn bulk_jobs_take_at_most_their_room_and_the_walk_goes_on_to_live_ones() {
        let job = |id: i64, priority: i64| Candidate {
            id,
            tenant: "acme".into(),
            queue_key: None,
            priority,
            run_after: id,
        };
        // Three bulk-retried jobs queued before two live ones: the live
        // ones rank first, and only one bulk job fits the room.
        let candidates = [
            job(1, -BULK_BELOW),
            job(2, -BULK_BELOW),
            job(3, 50 - BULK_BELOW),
            job(4, 0),
            job(5, -100),
        ];
        let picked = pick_within(&candidates, &mut HashMap::new(), &[], 4, 1);
        assert_eq!(
            picked.iter().map(|p| p.id).collect::<Vec<_>>(),
            vec![4, 5, 3],
            "the live jobs, then the highest of the bulk's, and no more"
        );
        assert!(is_bulk(-BULK_BELOW) && is_bulk(100 - BULK_BELOW) && !is_bulk(-100));
        // Half the slots, less the bulk jobs running.
        assert_eq!(bulk_room(8, 0), 4);
        assert_eq!(bulk_room(8, 3), 1);
        assert_eq!(bulk_room(8, 5), 0);
        assert_eq!(
            bulk_room(1, 0),
            1,
            "a process of one slot still does bulk work"
        );
    }

    #[test]
    fn priority_orders_a_tenants_own_jobs_never_its_turn_against_others() {
        // "loud" sets priority 100 on its newest job: that job takes loud's
        // turn ahead of loud's older ones, and the round goes by due time,
        // so quiet's first job, due before it, goes first.
        let mut loud = Backlog::new("loud", 1).keyless(3);
        loud.jobs[2].1 = 100;
        let quiet = Backlog::new("quiet", 10_000).keyless(3);
        let mut queue = Queue::new(vec![loud, quiet]);
        let picked = queue.claim(2, &mut HashMap::new());
        assert_eq!(
            picked.iter().map(|p| p.id).collect::<Vec<_>>(),
            vec![10_000, 3],
            "one job of each tenant: quiet's first, loud's priority-100 one"
        );
        // With everyone's jobs equally due, priority 100 on every job
        // still gives one job per round.
        let loud = Candidate {
            id: 1,
            tenant: "loud".into(),
            queue_key: None,
            priority: 100,
            run_after: 2_000,
        };
        let quiet = Candidate {
            id: 2,
            tenant: "quiet".into(),
            queue_key: None,
            priority: 0,
            run_after: 1_000,
        };
        let picked = pick(&[loud, quiet], &mut HashMap::new(), &[], 1);
        assert_eq!(
            picked[0].id, 2,
            "the earlier due wins the round, not the priority"
        );
    }

    #[test]
    fn a_capped_tenant_gets_its_cap_whatever_its_keys() {
        let mut queue = Queue::new(vec![
            Backlog::new("capped", 1).keyed(1_000, 1_000),
            Backlog::new("other", 10_000).keyless(1_000),
        ]);
        let mut room = HashMap::from([("capped".to_string(), 2)]);
        let picked = queue.claim(8, &mut room);
        assert_eq!(picked.len(), 8);
        assert_eq!(queue.taken["capped"], 2);
        assert_eq!(queue.taken["other"], 6);
        assert_eq!(room["capped"], 0, "the room left is written back");
    }

    #[test]
    fn a_job_running_here_or_sharing_a_picked_key_is_skipped() {
        let job = |id, key: Option<&str>| Candidate {
            id,
            tenant: "t".into(),
            queue_key: key.map(str::to_string),
            priority: 0,
            run_after: id,
        };
        let candidates = [
            job(1, None),
            job(2, Some("x")),
            job(3, Some("x")),
            job(4, None),
        ];
        let picked = pick(&candidates, &mut HashMap::new(), &[1], 10);
        assert_eq!(
            picked,
            vec![
                Picked {
                    id: 2,
                    key: Some("t:x".into())
                },
                Picked { id: 4, key: None },
            ]
        );
    }

    proptest! {
        /// Whatever the number of keys a tenant spreads its backlog over,
        /// and however large the claims, it gets what it gets keyless.
        #[test]
        fn splitting_never_buys_a_bigger_share(
            keys in 1usize..1_000,
            limit in 1usize..32,
            other in 1usize..400,
        ) {
            let n = 400;
            let shapes = |split: Backlog| Queue::new(vec![
                split,
                Backlog::new("other", 10_000).keyless(other),
            ])
            .rounds(10, limit);
            let keyless = shapes(Backlog::new("split", 1).keyless(n));
            let split = shapes(Backlog::new("split", 1).keyed(n, keys));
            prop_assert!(split.get("split").copied().unwrap_or(0) <= keyless["split"]);
            // What the split tenant's keys leave idle goes to the other.
            prop_assert!(split.get("other") >= keyless.get("other"));
        }
    }
}
