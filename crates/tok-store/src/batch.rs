//! Group commit: writes that arrive while a commit is in flight share the
//! next transaction.
//!
//! Every accepted webhook must be durable before its 202, and every step's
//! record before the next step starts, which costs a commit (an fsync with
//! the durable settings) each. Requests wait in a channel; the next
//! transaction takes all waiting ones (up to [`MAX_BATCH`]) and commits
//! once, and each caller is answered only after that commit. Under load many
//! writes share one fsync; alone, a write waits for nothing but its own
//! commit. Where the store has one writer (SQLite), a transaction takes its
//! writes only once it has the writer, so those that arrive while another
//! transaction holds it go along. One item's refusal (a lost lease, text
//! that cannot be stored) does not fail the others, nor does a row the
//! database refuses: the batch is then written again item by item, in the
//! same turn at the writer, and only that item fails (`storable.rs`). A
//! database that cannot take the write fails the whole batch, and every
//! caller hears it.
//!
//! Fair between tenants: when one tenant's writes crowd the queue, the
//! other tenants' waiting writes go in a small transaction of their own, in
//! the writer's urgent lane (`gate.rs`), instead of at the back of that
//! tenant's large one: they wait neither for the bulk transactions in
//! flight nor, on SQLite, for the claims and dispatches queued for the one
//! writer. The lanes alternate under contention, so the crowding tenant
//! waits for at most one small commit at a time. On SQLite an urgent write
//! still waits for the bulk transaction in flight, so while other tenants'
//! writes go urgent, bulk transactions stay small.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tok_core::ids::TenantId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::gate::{Lane, Turn, WriteGate};

use crate::{Result, StoreError};

/// Most writes one transaction takes.
pub(crate) const MAX_BATCH: usize = 256;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Writes a batch in one transaction, in the given lane, holding the
/// writer's turn when the store has a gate; one answer per item, in order.
pub(crate) type WriteBatch<I, O> =
    Arc<dyn Fn(Vec<I>, Lane, Option<Turn>) -> BoxFuture<Result<Vec<Result<O>>>> + Send + Sync>;

pub(crate) struct Batcher<I, O> {
    sender: mpsc::Sender<(I, oneshot::Sender<Result<O>>)>,
}

/// A tenant with this many writes waiting crowds the queue.
const CROWDING: usize = 8;

/// Most writes a bulk transaction takes on a store with one writer while
/// other tenants' writes went urgent in the last [`MAKING_WAY_FOR`]: an
/// urgent write waits for the bulk transaction in flight, so that stays
/// short while other tenants are about.
const MAKING_WAY_BATCH: usize = 16;
/// How long after another tenant's urgent write the crowd makes way.
const MAKING_WAY_FOR: Duration = Duration::from_millis(100);

type Waiting<I, O> = (I, oneshot::Sender<Result<O>>);

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the batching task (it ends when the store is dropped), which
    /// keeps up to `parallel` transactions in flight in the bulk lane (on
    /// PostgreSQL a batch runs while the one before waits for its commit;
    /// SQLite's one writer takes one at a time) and one in the urgent lane:
    /// when a tenant crowds the queue, the other tenants' writes go there
    /// at once, without waiting for the bulk transactions in flight. A
    /// batch takes whatever waited while the writers were busy; `tenant`
    /// says whose a write is.
    ///
    /// With a `gate` (SQLite), a bulk batch is taken only once the writer's
    /// turn is granted: the writes that arrive while the writer commits
    /// someone else's transaction (a dispatch, a claim) join it, instead of
    /// a batch of the one or two that came first waiting at the gate while
    /// the rest queue behind it for a transaction of their own.
    pub(crate) fn spawn(
        write: WriteBatch<I, O>,
        parallel: usize,
        tenant: fn(&I) -> &TenantId,
        gate: Option<WriteGate>,
    ) -> Self {
        let (sender, mut receiver) = mpsc::channel::<Waiting<I, O>>(MAX_BATCH * 8);
        let bulk = Arc::new(Semaphore::new(parallel.max(1)));
        let urgent = Arc::new(Semaphore::new(1));
        tokio::spawn(async move {
            let mut queue: VecDeque<Waiting<I, O>> = VecDeque::new();
            // The tenant that filled the last bulk transaction.
            let mut in_flight: Option<TenantId> = None;
            // A bulk writer waiting for its turn at the gate.
            let mut next_turn: Option<BoxFuture<(OwnedSemaphorePermit, Option<Turn>)>> = None;
            // When other tenants' writes last went urgent.
            let mut went_urgent: Option<Instant> = None;
            loop {
                let crowd = crowd_of(&queue, |(item, _)| tenant(item), in_flight.as_ref());
                // Wait for a writer; a write arriving meanwhile may change
                // what goes where.
                tokio::select! {
                    biased;
                    permit = urgent.clone().acquire_owned(), if crowd.is_some() => {
                        let Ok(permit) = permit else { return };
                        if let Some(crowd) = &crowd {
                            let others = others_first(&mut queue, |(item, _)| tenant(item), crowd);
                            went_urgent = Some(Instant::now());
                            let (write, gate) = (write.clone(), gate.clone());
                            tokio::spawn(async move {
                                let turn = enter(gate, Lane::Urgent).await;
                                commit(write, others, Lane::Urgent, turn, permit).await;
                            });
                        }
                    }
                    (permit, turn) = async { next_turn.as_mut().expect("guarded").await },
                        if next_turn.is_some() =>
                    {
                        next_turn = None;
                        // Everything waiting now, up to a batch (none when
                        // the urgent lane took it all).
                        while let Ok(next) = receiver.try_recv() {
                            queue.push_back(next);
                        }
                        let making_way = gate.is_some()
                            && went_urgent.is_some_and(|at| at.elapsed() < MAKING_WAY_FOR);
                        let most = if making_way { MAKING_WAY_BATCH } else { MAX_BATCH };
                        let n = queue.len().min(most);
                        let batch: Vec<_> = queue.drain(..n).collect();
                        in_flight = filled_by(&batch, |(item, _)| tenant(item));
                        if !batch.is_empty() {
                            tokio::spawn(commit(write.clone(), batch, Lane::Bulk, turn, permit));
                        }
                    }
                    permit = bulk.clone().acquire_owned(),
                        if next_turn.is_none() && !queue.is_empty() =>
                    {
                        let Ok(permit) = permit else { return };
                        let gate = gate.clone();
                        next_turn = Some(Box::pin(async move {
                            (permit, enter(gate, Lane::Bulk).await)
                        }));
                    }
                    next = receiver.recv() => {
                        let Some(next) = next else { return };
                        queue.push_back(next);
                        while let Ok(next) = receiver.try_recv() {
                            queue.push_back(next);
                        }
                    }
                }
            }
        });
        Self { sender }
    }

    /// Queues one write and waits until the transaction that made it committed.
    pub(crate) async fn submit(&self, item: I) -> Result<O> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the store's writer has stopped".into());
        self.sender
            .send((item, reply))
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// The writer's turn in `lane`, where the store has a gate.
async fn enter(gate: Option<WriteGate>, lane: Lane) -> Option<Turn> {
    match gate {
        Some(gate) => Some(gate.enter(lane).await),
        None => None,
    }
}

/// Writes one batch and answers its callers; frees its writer after.
async fn commit<I, O>(
    write: WriteBatch<I, O>,
    batch: Vec<Waiting<I, O>>,
    lane: Lane,
    turn: Option<Turn>,
    writer: OwnedSemaphorePermit,
) {
    let (items, replies): (Vec<I>, Vec<_>) = batch.into_iter().unzip();
    match write(items, lane, turn).await {
        Ok(results) => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
        Err(e) => {
            let message = e.to_string();
            for reply in replies {
                let _ = reply.send(Err(StoreError::Unavailable(message.clone())));
            }
        }
    }
    drop(writer);
}

/// The tenant with the most of `tenants`, with its count and how many
/// tenants there are.
fn busiest<'a, K: Eq + Hash + ?Sized>(
    tenants: impl IntoIterator<Item = &'a K>,
) -> Option<(&'a K, usize, usize)> {
    let mut counts: HashMap<&K, usize> = HashMap::new();
    for tenant in tenants {
        *counts.entry(tenant).or_default() += 1;
    }
    let distinct = counts.len();
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(tenant, n)| (tenant, n, distinct))
}

/// The tenant crowding a queue of writes (given by their tenants): one
/// with at least `at_least` of them while another tenant has some too.
fn crowding<'a, K: Eq + Hash + ?Sized>(
    tenants: impl IntoIterator<Item = &'a K>,
    at_least: usize,
) -> Option<&'a K> {
    busiest(tenants)
        .filter(|(_, n, distinct)| *distinct >= 2 && *n >= at_least)
        .map(|(tenant, _, _)| tenant)
}

/// The tenant whose writes make way: one crowding the queue, else the one
/// that filled the last bulk transaction (`in_flight`: its writes are in
/// that transaction, so few of them wait) — as long as another tenant's
/// write waits.
fn crowd_of<T>(
    queue: &VecDeque<T>,
    tenant: impl Fn(&T) -> &TenantId,
    in_flight: Option<&TenantId>,
) -> Option<TenantId> {
    if let Some(crowd) = crowding(queue.iter().map(&tenant), CROWDING) {
        return Some(crowd.clone());
    }
    let filled = in_flight?;
    queue
        .iter()
        .any(|item| tenant(item) != filled)
        .then(|| filled.clone())
}

/// The tenant with three quarters or more of a batch of `len` items (given
/// by their tenants), with its count.
fn three_quarters<'a, K: Eq + Hash + ?Sized>(
    tenants: impl IntoIterator<Item = &'a K>,
    len: usize,
) -> Option<(&'a K, usize)> {
    busiest(tenants)
        .filter(|(_, n, _)| n * 4 >= len * 3)
        .map(|(top, n, _)| (top, n))
}

/// The tenant that filled a bulk transaction: at least [`CROWDING`] of its
/// writes and three quarters of them.
fn filled_by<T>(batch: &[T], tenant: impl Fn(&T) -> &TenantId) -> Option<TenantId> {
    three_quarters(batch.iter().map(tenant), batch.len())
        .filter(|(_, n)| *n >= CROWDING)
        .map(|(top, _)| top.clone())
}

/// Takes out the writes of tenants other than `crowd` (in order, up to a
/// batch) for a transaction that goes first.
fn others_first<T>(
    queue: &mut VecDeque<T>,
    tenant: impl Fn(&T) -> &TenantId,
    crowd: &TenantId,
) -> Vec<T> {
    let mut others = Vec::new();
    let mut rest = VecDeque::with_capacity(queue.len());
    for item in queue.drain(..) {
        if others.len() < MAX_BATCH && tenant(&item) != crowd {
            others.push(item);
        } else {
            rest.push_back(item);
        }
    }
    *queue = rest;
    others
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::tests::settle;

    fn queue(tenants: &[&str]) -> VecDeque<(TenantId, usize)> {
        tenants
            .iter()
            .enumerate()
            .map(|(i, t)| (TenantId::from(t.to_string()), i))
            .collect()
    }

    fn order(items: &[(TenantId, usize)]) -> Vec<usize> {
        items.iter().map(|(_, i)| *i).collect()
    }

    #[test]
    fn a_crowding_tenants_writes_let_the_others_go_first() {
        let mut tenants = vec!["big"; 10];
        tenants.insert(3, "small");
        tenants.push("other");
        let mut q = queue(&tenants);
        let crowd = crowd_of(&q, |(t, _)| t, None).expect("a crowd");
        assert_eq!(crowd.as_str(), "big");
        let first = others_first(&mut q, |(t, _)| t, &crowd);
        assert_eq!(order(&first), vec![3, 11]);
        assert_eq!(q.len(), 10);
        assert!(q.iter().all(|(t, _)| t.as_str() == "big"));
    }

    #[tokio::test]
    async fn a_small_tenants_write_does_not_wait_for_the_crowding_tenants_commit() {
        // Bulk transactions block until told to go; urgent ones commit at once.
        let go = Arc::new(tokio::sync::Notify::new());
        // Each transaction's lane and tenants, in the order they began.
        type Began = std::sync::Mutex<Vec<(Lane, Vec<String>)>>;
        let lanes: Arc<Began> = Arc::default();
        let write: WriteBatch<TenantId, ()> = {
            let (go, lanes) = (go.clone(), lanes.clone());
            Arc::new(move |items: Vec<TenantId>, lane, _turn| {
                let (go, lanes) = (go.clone(), lanes.clone());
                Box::pin(async move {
                    let names = items.iter().map(|t| t.to_string()).collect();
                    lanes.lock().unwrap().push((lane, names));
                    if lane == Lane::Bulk {
                        go.notified().await;
                    }
                    Ok(items.iter().map(|_| Ok(())).collect())
                })
            })
        };
        let batcher = Arc::new(Batcher::spawn(write, 1, |t| t, None));
        let first = submit(&batcher, "big");
        while lanes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // The first bulk commit is in flight; the big tenant queues more.
        let mut waiting: Vec<_> = (0..CROWDING).map(|_| submit(&batcher, "big")).collect();
        let small = submit(&batcher, "small");
        tokio::time::timeout(std::time::Duration::from_secs(5), small)
            .await
            .expect("the small tenant's write committed while the bulk one was in flight")
            .unwrap()
            .unwrap();
        assert_eq!(
            lanes.lock().unwrap()[1],
            (Lane::Urgent, vec!["small".to_string()])
        );
        go.notify_one();
        first.await.unwrap().unwrap();
        go.notify_one();
        for write in waiting.drain(..) {
            write.await.unwrap().unwrap();
        }
        let lanes = lanes.lock().unwrap();
        assert_eq!(lanes.len(), 3, "one more bulk commit took the rest");
        assert_eq!(lanes[2].0, Lane::Bulk);
        assert_eq!(lanes[2].1.len(), CROWDING);
    }

    /// Each transaction's lane, size, and whether it held the writer's turn.
    type Written = Arc<std::sync::Mutex<Vec<(Lane, usize, bool)>>>;

    /// A batcher on `gate` whose transactions only note what they wrote.
    fn noting_batcher(gate: &WriteGate) -> (Arc<Batcher<TenantId, ()>>, Written) {
        let written: Written = Arc::default();
        let write: WriteBatch<TenantId, ()> = {
            let written = written.clone();
            Arc::new(move |items: Vec<TenantId>, lane, turn| {
                let written = written.clone();
                Box::pin(async move {
                    written
                        .lock()
                        .unwrap()
                        .push((lane, items.len(), turn.is_some()));
                    Ok(items.iter().map(|_| Ok(())).collect())
                })
            })
        };
        let batcher = Batcher::spawn(write, 1, |t| t, Some(gate.clone()));
        (Arc::new(batcher), written)
    }

    fn submit(
        batcher: &Arc<Batcher<TenantId, ()>>,
        tenant: &str,
    ) -> tokio::task::JoinHandle<Result<()>> {
        let (batcher, tenant) = (batcher.clone(), TenantId::from(tenant.to_string()));
        tokio::spawn(async move { batcher.submit(tenant).await })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_bulk_batch_is_taken_when_the_writer_is_free_not_before() {
        let gate = WriteGate::default();
        let (batcher, written) = noting_batcher(&gate);
        // Another transaction (a dispatch, say) has the writer.
        let held = gate.enter(Lane::Bulk).await;
        let mut writes = vec![submit(&batcher, "a")];
        settle().await;
        writes.extend((0..5).map(|_| submit(&batcher, "a")));
        settle().await;
        assert!(
            written.lock().unwrap().is_empty(),
            "nothing written while the writer is taken"
        );
        drop(held);
        for write in writes {
            tokio::time::timeout(std::time::Duration::from_secs(5), write)
                .await
                .expect("committed")
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            *written.lock().unwrap(),
            vec![(Lane::Bulk, 6, true)],
            "the writes that came while the first waited for the writer share its transaction"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn while_others_go_urgent_the_crowds_transactions_stay_small() {
        // The clock stands still: the others went urgent "just now".
        tokio::time::pause();
        let gate = WriteGate::default();
        let (batcher, written) = noting_batcher(&gate);
        let held = gate.enter(Lane::Bulk).await;
        let mut writes: Vec<_> = (0..40).map(|_| submit(&batcher, "big")).collect();
        settle().await;
        writes.push(submit(&batcher, "small"));
        settle().await;
        drop(held);
        for write in writes {
            write.await.unwrap().unwrap();
        }
        assert_eq!(
            *written.lock().unwrap(),
            vec![
                (Lane::Urgent, 1, true),
                (Lane::Bulk, MAKING_WAY_BATCH, true),
                (Lane::Bulk, MAKING_WAY_BATCH, true),
                (Lane::Bulk, 8, true),
            ],
            "the small tenant first, then the big one's 40 writes at most 16 at a time"
        );
    }

    #[test]
    fn a_queue_nobody_crowds_goes_in_order() {
        let one = queue(&["a"; 20]);
        assert!(crowd_of(&one, |(t, _)| t, None).is_none(), "one tenant");
        let even = queue(&["a", "b", "a", "b", "a", "b"]);
        assert!(crowd_of(&even, |(t, _)| t, None).is_none(), "no crowd");
    }

    #[test]
    fn the_tenant_that_filled_the_transaction_in_flight_makes_way() {
        let mut batch = vec!["big"; 10];
        batch.push("small");
        let filled = filled_by(queue(&batch).make_contiguous(), |(t, _)| t).expect("filled by big");
        assert_eq!(filled.as_str(), "big");
        assert!(
            filled_by(queue(&["a"; 7]).make_contiguous(), |(t, _)| t).is_none(),
            "too few"
        );
        let shared = [vec!["a"; 10], vec!["b"; 10]].concat();
        assert!(
            filled_by(queue(&shared).make_contiguous(), |(t, _)| t).is_none(),
            "shared"
        );

        // Few of its writes wait: the small tenant's still goes first.
        let waiting = queue(&["big", "small", "big"]);
        let crowd = crowd_of(&waiting, |(t, _)| t, Some(&filled)).expect("a crowd");
        assert_eq!(crowd.as_str(), "big");
        let only_big = queue(&["big", "big"]);
        assert!(
            crowd_of(&only_big, |(t, _)| t, Some(&filled)).is_none(),
            "nobody else waits"
        );
    }
}
