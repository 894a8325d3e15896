//! Every rule that keeps one tenant from crowding out the others, in one
//! place, as plain values the pool and the dispatcher consult.
//!
//! - **Reserved slots** ([`reserved_slots`], [`Slots`]): an eighth of the
//!   worker slots is kept for tenants that hold none of the others, so one
//!   tenant's burst cannot hold every slot while another's job waits.
//! - **Handing slots to a dispatch** ([`Offer`]): a dispatch may start the
//!   runs it creates in free slots at once, general ones first, reserved ones
//!   only for tenants holding no general slot.
//! - **The backlog** ([`Backlog`], [`filled_by`]): while one tenant's
//!   events fill whole dispatches, other tenants' new events are dispatched
//!   apart, in the writer's urgent lane.
//! - **Crowding** ([`Crowding`]): a tenant with [`DISPATCH_CROWDING`] or
//!   more of a dispatch's events waits for one dispatch of the others'.
//! - **Chains** ([`Fairness`]): how many steps one claim may record, and run
//!   back to back on one lease, before its job queues again like everyone
//!   else's; and how many control steps a dispatch runs for a new run.
//!
//! - **The claim** ([`tok_core::fairness`]): which of the claimable jobs
//!   one claim takes — each tenant's ranked by its own priority, the
//!   tenants round robin, then caps and queue keys drop jobs, never add
//!   turns. Pure, and tested there without a database.
//!
//! **The share is per tenant first, then per key.** Every rule here counts
//! a tenant's slots, events and claims, and the claim ranks each tenant's
//! jobs among themselves before it goes round robin between tenants; a
//! queue key (a ticket's) only drops a job whose key another job holds,
//! after that ranking, and a start control's key (`flow`) only says when a
//! run's first job is due. So a tenant that splits its backlog over a
//! thousand keys holds the share it would hold with one keyless backlog:
//! more keys let more of its own jobs be candidates, never more than its
//! turn. `tok bench --only fairness` measures it end to end
//! (`fairness_split`). (The dispatch's round robin between tenants' events
//! is the store's dispatch query.)

use std::collections::{HashMap, HashSet};

use tok_core::ids::{JobId, TenantId};

/// The chain limits; part of [`crate::EngineConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fairness {
    /// Steps one record transaction may chain before the run's rest goes
    /// to a new job: a long loop of `set` steps cannot hold the writer long.
    pub chain_limit: usize,
    /// Claims a run may continue on one lease (its next step due at once)
    /// before it queues again; keeps a busy run's latency low without
    /// letting it keep a slot for ever.
    pub continue_limit: u32,
    /// Control steps a dispatch runs for a new run before a worker takes
    /// over (they run while the dispatch holds SQLite's one writer).
    pub dispatch_chain_limit: usize,
}

impl Default for Fairness {
    fn default() -> Self {
        Self {
            chain_limit: 64,
            continue_limit: 16,
            dispatch_chain_limit: 16,
        }
    }
}

/// Slots kept for tenants holding no other slot: an eighth of the slots
/// (none below four slots, at least one from four on).
pub fn reserved_slots(concurrency: usize) -> usize {
    if concurrency < 4 {
        0
    } else {
        (concurrency / 8).max(1)
    }
}

/// The pool's slots: the jobs in flight in this process, and the slots a
/// dispatch in progress was promised for the runs it starts itself.
#[derive(Default)]
pub(crate) struct Slots {
    /// Whether the pool runs (and a dispatch may hand it jobs).
    pub(crate) open: bool,
    /// Why the pool's last claim failed, until one succeeds again: a
    /// worker node is ready (`/readyz`) while its claims reach the queue.
    pub(crate) claim_failing: Option<String>,
    /// By claim (the job and the token it was claimed under): its tenant,
    /// and whether it holds a reserved slot. Keyed by the claim, not the
    /// job alone: an execution whose lease was lost may still be running
    /// when its job is claimed again, and each frees its own slot.
    pub(crate) jobs: HashMap<(JobId, String), (TenantId, bool)>,
    /// By claim: how long its lease is known to last ([`crate::Lease`]).
    pub(crate) leases: HashMap<(JobId, String), crate::registry::Lease>,
    pub(crate) promised_general: usize,
    pub(crate) promised_reserved: usize,
}

impl Slots {
    /// Busy general and reserved slots, promised ones included.
    pub(crate) fn busy(&self) -> (usize, usize) {
        let reserved = self.jobs.values().filter(|(_, r)| *r).count();
        (
            self.jobs.len() - reserved + self.promised_general,
            reserved + self.promised_reserved,
        )
    }

    /// General slots running a job (not promised ones).
    pub(crate) fn running_general(&self) -> usize {
        self.jobs.values().filter(|(_, reserved)| !reserved).count()
    }

    /// Tenants holding a general slot: the reserved slots are for the others.
    pub(crate) fn holding_general(&self) -> HashSet<TenantId> {
        self.jobs
            .values()
            .filter(|(_, reserved)| !reserved)
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// The jobs running in this process, each once.
    pub(crate) fn job_ids(&self) -> Vec<JobId> {
        let mut ids: Vec<JobId> = self.jobs.keys().map(|(id, _)| *id).collect();
        ids.sort_unstable_by_key(|id| id.0);
        ids.dedup();
        ids
    }

    /// The claims running in this process: each job with its claim token.
    pub(crate) fn claims(&self) -> Vec<(JobId, String)> {
        let mut claims: Vec<(JobId, String)> = self.jobs.keys().cloned().collect();
        claims.sort_unstable_by(|a, b| (a.0.0, &a.1).cmp(&(b.0.0, &b.1)));
        claims
    }

    /// Whether nothing runs and nothing is promised.
    pub(crate) fn idle(&self) -> bool {
        self.jobs.is_empty() && self.promised_general + self.promised_reserved == 0
    }
}

/// The free slots a dispatch may fill with the runs it creates, so that a
/// run whose first step is due starts without waiting for a claim — above
/// all a tenant's first run while another tenant's backlog holds the
/// general slots. The slots stay promised until the pool accepts the
/// offer's jobs ([`Offer::settle`]).
pub(crate) struct Offer {
    general: usize,
    reserved: usize,
    general_left: usize,
    reserved_left: usize,
    /// Free slots of both kinds, promised or not ([`Offer::free`]).
    free: usize,
    holding_general: HashSet<TenantId>,
    /// Reserved slots taken, by tenant.
    took_reserved: HashMap<TenantId, usize>,
}

impl Offer {
    /// The slots free now among `concurrency` (at most `limit` general
    /// ones, and reserved ones up to `limit` or half of them unless
    /// `all_reserved`), promised to the dispatch; `None` when there are none
    /// or the pool does not run.
    pub(crate) fn new(
        slots: &mut Slots,
        concurrency: usize,
        limit: usize,
        all_reserved: bool,
    ) -> Option<Self> {
        if !slots.open {
            return None;
        }
        let concurrency = concurrency.max(1);
        let reserved_total = reserved_slots(concurrency);
        let (general_busy, reserved_busy) = slots.busy();
        let general = (concurrency - reserved_total)
            .saturating_sub(general_busy)
            .min(limit);
        let share = match all_reserved {
            true => reserved_total,
            false => reserved_total / 2,
        };
        let reserved_free = reserved_total.saturating_sub(reserved_busy).min(limit);
        let reserved = reserved_free.min(share);
        if general == 0 && reserved == 0 {
            return None;
        }
        slots.promised_general += general;
        slots.promised_reserved += reserved;
        Some(Self {
            general,
            reserved,
            free: general + reserved_free,
            general_left: general,
            reserved_left: reserved,
            holding_general: slots.holding_general(),
            took_reserved: HashMap::new(),
        })
    }

    /// How many slots were free when it was made, those kept back from
    /// it among them: a dispatch takes as many events, so a burst of
    /// webhooks is dispatched in one transaction whoever runs its runs.
    pub(crate) fn free(&self) -> usize {
        self.free
    }

    /// Whether a new run of `tenant` takes a slot: a general one while any
    /// is free, else a reserved one if the tenant holds no general slot.
    pub(crate) fn take(&mut self, tenant: &TenantId) -> bool {
        if self.general_left > 0 {
            self.general_left -= 1;
            self.holding_general.insert(tenant.clone());
            true
        } else if self.reserved_left > 0 && !self.holding_general.contains(tenant) {
            self.reserved_left -= 1;
            *self.took_reserved.entry(tenant.clone()).or_default() += 1;
            true
        } else {
            false
        }
    }

    /// Frees what the offer promised; returns, for the jobs the dispatch
    /// wrote claimed (by tenant), whether each holds a reserved slot.
    pub(crate) fn settle<'t>(
        mut self,
        slots: &mut Slots,
        tenants: impl Iterator<Item = &'t TenantId>,
    ) -> Vec<bool> {
        slots.promised_general -= self.general;
        slots.promised_reserved -= self.reserved;
        tenants
            .map(|tenant| match self.took_reserved.get_mut(tenant) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            })
            .collect()
    }
}

/// What the urgent dispatcher is for: while one tenant's backlog fills
/// the dispatches, another tenant's new event would wait for the batch in
/// progress and the claims and records queued at SQLite's one writer. The
/// urgent dispatcher takes such events apart, in the writer's urgent lane.
/// Only events accepted by this process are known here; the others are
/// dispatched in turn, which is always correct.
#[derive(Default)]
pub(crate) struct Backlog {
    /// Tenants whose events filled a full dispatch since the backlog began:
    /// the bulk dispatches', and any that filled an urgent one (a second
    /// flood must not take the urgent lane).
    crowding: HashSet<TenantId>,
    /// Other tenants with events accepted since the urgent dispatcher looked.
    pub(crate) waiting: HashSet<TenantId>,
}

impl Backlog {
    /// Notes a new event of `tenant`; whether it is one for the urgent
    /// dispatcher.
    pub(crate) fn note(&mut self, tenant: &TenantId) -> bool {
        if self.crowding.is_empty() || self.crowding.contains(tenant) {
            return false;
        }
        self.waiting.insert(tenant.clone());
        true
    }

    /// Whether a tenant's backlog fills the bulk dispatches now.
    pub(crate) fn active(&self) -> bool {
        !self.crowding.is_empty()
    }

    /// An urgent dispatch of `tenants` took a full batch: they may have
    /// more, unless one of them filled it (`crowding`), which goes in turn
    /// from now on like the first flood.
    pub(crate) fn urgent_full(&mut self, tenants: Vec<TenantId>, crowding: Option<TenantId>) {
        if let Some(flood) = crowding {
            self.crowding.insert(flood);
        }
        for tenant in tenants {
            if !self.crowding.contains(&tenant) {
                self.waiting.insert(tenant);
            }
        }
    }

    /// What the last bulk dispatch found: with no tenant crowding it, every
    /// event is dispatched in turn again.
    pub(crate) fn bulk_found(&mut self, crowding: Option<TenantId>) {
        match crowding {
            Some(tenant) => {
                self.crowding.insert(tenant);
            }
            None => {
                self.crowding.clear();
                self.waiting.clear();
            }
        }
    }
}

/// A tenant with this many events in one dispatch's batch crowds it
/// ([`Crowding`]).
pub const DISPATCH_CROWDING: usize = 4;

/// Others first: when one tenant has [`DISPATCH_CROWDING`] or more of the
/// events a dispatch selected and other tenants have some too, that
/// dispatch takes only the others' (a short transaction, so their runs do
/// not wait behind the crowd's); the next bulk dispatch takes its batch in
/// order, so the crowding tenant waits for at most one. (A dispatch that
/// rolls back leaves the mark: the next one then goes in order, which is
/// always safe.)
#[derive(Debug, Default)]
pub(crate) struct Crowding {
    /// The last bulk dispatch left a crowding tenant's events for later.
    others_went_first: bool,
}

impl Crowding {
    /// The tenant whose events a dispatch that selected events of `owners`
    /// (in order) leaves pending, if any. Only bulk dispatches alternate:
    /// an urgent one takes other tenants' events out of turn anyway.
    pub(crate) fn leave(&mut self, owners: &[&TenantId], bulk: bool) -> Option<TenantId> {
        let crowd = match self.others_went_first {
            true => None,
            false => crowding(owners),
        };
        if bulk {
            self.others_went_first = crowd.is_some();
        }
        crowd
    }
}

/// The tenant with [`DISPATCH_CROWDING`] or more of `owners` while another
/// tenant has some too.
fn crowding(owners: &[&TenantId]) -> Option<TenantId> {
    let (top, n, tenants) = busiest(owners)?;
    (tenants >= 2 && n >= DISPATCH_CROWDING).then(|| top.clone())
}

/// The tenant whose events filled three quarters or more of a full batch
/// (`owners` selected of `limit` asked for): it has a backlog
/// ([`Backlog`]).
pub(crate) fn filled_by(owners: &[&TenantId], limit: usize) -> Option<TenantId> {
    if owners.len() != limit || limit == 0 {
        return None;
    }
    let (top, n, _) = busiest(owners)?;
    (n * 4 >= owners.len() * 3).then(|| top.clone())
}

/// The tenant with the most of `owners`, how many it has, and how many
/// tenants there are.
fn busiest<'a>(owners: &[&'a TenantId]) -> Option<(&'a TenantId, usize, usize)> {
    let mut counts: HashMap<&TenantId, usize> = HashMap::new();
    for owner in owners {
        *counts.entry(owner).or_default() += 1;
    }
    let tenants = counts.len();
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(top, n)| (top, n, tenants))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        TenantId::from(name.to_string())
    }

    fn slots(general_jobs: &[(&str, i64)]) -> Slots {
        let mut slots = Slots {
            open: true,
            ..Slots::default()
        };
        for (t, id) in general_jobs {
            slots
                .jobs
                .insert((JobId(*id), format!("token-{id}")), (tenant(t), false));
        }
        slots
    }

    #[test]
    fn an_eighth_of_the_slots_is_reserved_from_four_on() {
        let table = [(1, 0), (3, 0), (4, 1), (8, 1), (16, 2), (32, 4)];
        for (concurrency, reserved) in table {
            assert_eq!(reserved_slots(concurrency), reserved, "{concurrency} slots");
        }
    }

    #[test]
    fn an_offer_fills_general_slots_first_then_reserved_ones_for_other_tenants() {
        // 8 slots: 7 general (6 busy with `big`), 1 reserved.
        let mut slots = slots(&[
            ("big", 1),
            ("big", 2),
            ("big", 3),
            ("big", 4),
            ("big", 5),
            ("big", 6),
        ]);
        let mut offer = Offer::new(&mut slots, 8, 64, true).expect("free slots");
        assert_eq!(offer.free(), 2);
        assert!(offer.take(&tenant("big")), "the free general slot");
        assert!(!offer.take(&tenant("big")), "big holds general slots");
        assert!(offer.take(&tenant("small")), "the reserved slot");
        assert!(!offer.take(&tenant("third")), "every slot taken");
        assert_eq!(slots.busy(), (7, 1), "promised until settled");
        let reserved = offer.settle(&mut slots, [tenant("big"), tenant("small")].iter());
        assert_eq!(reserved, [false, true]);
        assert_eq!(slots.busy(), (6, 0));
    }

    #[test]
    fn a_tenant_given_a_general_slot_by_this_offer_does_not_take_a_reserved_one() {
        let mut slots = slots(&[("x", 1), ("x", 2), ("x", 3), ("x", 4), ("x", 5), ("x", 6)]);
        let mut offer = Offer::new(&mut slots, 8, 64, true).expect("free slots");
        assert!(offer.take(&tenant("a")));
        assert!(!offer.take(&tenant("a")), "a now holds a general slot");
        assert!(offer.take(&tenant("b")));
    }

    #[test]
    fn a_bulk_dispatch_keeps_half_the_reserved_slots_for_the_urgent_one() {
        let mut slots = slots(&[]);
        // 32 slots: 28 general, 4 reserved; a limit of 64 leaves them all.
        let offer = Offer::new(&mut slots, 32, 64, false).expect("free slots");
        assert_eq!(slots.busy(), (28, 2));
        offer.settle(&mut slots, std::iter::empty());
        assert!(slots.idle());
        slots.open = false;
        assert!(
            Offer::new(&mut slots, 32, 64, true).is_none(),
            "no pool, no offer"
        );
    }

    #[test]
    fn only_other_tenants_events_go_urgent_while_one_tenant_has_a_backlog() {
        let (big, small, second) = (tenant("big"), tenant("small"), tenant("second"));
        let mut backlog = Backlog::default();
        assert!(
            !backlog.note(&small),
            "no backlog: every event goes in turn"
        );
        backlog.bulk_found(Some(big.clone()));
        assert!(!backlog.note(&big), "the backlog's own events go in turn");
        assert!(backlog.note(&small));
        assert_eq!(backlog.waiting.iter().collect::<Vec<_>>(), vec![&small]);
        // A second tenant that filled an urgent dispatch goes in turn too;
        // the other tenant of that dispatch stays urgent.
        backlog.waiting.clear();
        backlog.urgent_full(vec![second.clone(), small.clone()], Some(second.clone()));
        assert_eq!(backlog.waiting.iter().collect::<Vec<_>>(), vec![&small]);
        backlog.bulk_found(Some(big.clone()));
        assert!(!backlog.note(&second), "still part of the backlog");
        backlog.bulk_found(None);
        assert!(
            backlog.waiting.is_empty() && !backlog.note(&small),
            "the backlog is gone: nothing is urgent"
        );
    }

    fn owners(spec: &str) -> Vec<TenantId> {
        spec.chars().map(|c| tenant(&c.to_string())).collect()
    }

    #[test]
    fn a_crowding_tenant_waits_for_one_bulk_dispatch_of_the_others() {
        // (selected events by tenant, bulk?, the tenant left pending)
        let table: [(&str, bool, Option<&str>); 7] = [
            ("aaaaaaaabbcc", true, Some("a")), // a crowds: b and c go first
            ("aaaaaaaabbcc", true, None),      // the next one goes in order
            ("aaaaaaaabbcc", true, Some("a")), // and the one after alternates again
            ("aaaabbcc", false, None),         // urgent: read the mark, leave it
            ("aaaabbcc", true, None),          // the mark is still set
            ("aaaa", true, None),              // nobody else: nobody to let first
            ("aaabbb", true, None),            // three of each: nobody crowds
        ];
        let mut crowding = Crowding::default();
        for (i, (spec, bulk, left)) in table.into_iter().enumerate() {
            let owners = owners(spec);
            let refs: Vec<&TenantId> = owners.iter().collect();
            assert_eq!(
                crowding.leave(&refs, bulk),
                left.map(tenant),
                "row {i}: {spec}, bulk {bulk}"
            );
        }
    }

    #[test]
    fn a_full_batch_three_quarters_of_one_tenants_names_its_backlog() {
        // (selected events by tenant, batch asked for, the backlog)
        let table: [(&str, usize, Option<&str>); 6] = [
            ("aaaa", 4, Some("a")),
            ("aaab", 4, Some("a")),
            ("aabb", 4, None),
            ("aaa", 4, None), // not full: everything pending was taken
            ("aaaaaaab", 8, Some("a")),
            ("", 0, None),
        ];
        for (spec, limit, backlog) in table {
            let owners = owners(spec);
            let refs: Vec<&TenantId> = owners.iter().collect();
            assert_eq!(
                filled_by(&refs, limit),
                backlog.map(tenant),
                "{spec} of {limit}"
            );
        }
    }
}
