//! The writer's gate: SQLite has one writer connection, and this decides
//! who gets it next.
//!
//! A pool of one connection serves its waiters first come, first served. A
//! small tenant's record then waits behind whatever is queued: a large
//! tenant's claim, its dispatch, its group commit. The gate has two lanes:
//! an urgent one (the group commits of tenants that do not crowd the queue,
//! see `batch.rs`) goes before the bulk one, so such a write waits only for
//! the transaction in progress. The lanes alternate while both have
//! waiters, so the bulk lane waits for at most one urgent transaction.
//!
//! Hand-written: no async lock with priority lanes is in a well-kept crate,
//! and the rule (alternate under contention) is the product's own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Which lane a write waits in, where the store has one writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Writes of tenants that do not crowd the queue.
    Urgent,
    /// Everything else: claims, dispatches, the crowding tenant's commits.
    Bulk,
}

/// Urgent turns that may go in a row while a bulk write waits. (Two in a
/// row, so that a small tenant's consecutive writes need not wait for a
/// bulk turn in between, measured worse: see docs/performance.md.)
const URGENT_RUN: usize = 1;

#[derive(Clone, Default)]
pub(crate) struct WriteGate {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    busy: bool,
    /// Urgent turns in a row while a bulk waiter waited.
    urgent_run: usize,
    urgent: VecDeque<oneshot::Sender<()>>,
    bulk: VecDeque<oneshot::Sender<()>>,
}

/// The writer is the holder's until this is dropped.
pub(crate) struct Turn {
    gate: WriteGate,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.gate.pass_on();
    }
}

/// A waiter dropped after its turn was handed to it passes the turn on.
struct Waiting {
    gate: WriteGate,
    answer: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut answer) = self.answer.take() {
            answer.close();
            if answer.try_recv().is_ok() {
                self.gate.pass_on();
            }
        }
    }
}

impl WriteGate {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the writer in `lane`.
    pub(crate) async fn enter(&self, lane: Lane) -> Turn {
        let answer = {
            let mut state = self.state();
            if !state.busy {
                state.busy = true;
                return Turn { gate: self.clone() };
            }
            let (tell, answer) = oneshot::channel();
            match lane {
                Lane::Urgent => state.urgent.push_back(tell),
                Lane::Bulk => state.bulk.push_back(tell),
            }
            answer
        };
        let mut waiting = Waiting {
            gate: self.clone(),
            answer: Some(answer),
        };
        if let Some(answer) = waiting.answer.as_mut() {
            // The sender is only dropped unanswered with the gate itself,
            // which this waiter holds: the answer always comes.
            let _ = answer.await;
        }
        waiting.answer = None;
        Turn { gate: self.clone() }
    }

    /// Hands the writer to the next waiter: urgent first, but a bulk
    /// waiter goes after [`URGENT_RUN`] urgent turn(s) in a row.
    fn pass_on(&self) {
        let mut state = self.state();
        loop {
            let lane = match (state.urgent.is_empty(), state.bulk.is_empty()) {
                (true, true) => {
                    state.busy = false;
                    state.urgent_run = 0;
                    return;
                }
                (false, false) if state.urgent_run >= URGENT_RUN => Lane::Bulk,
                (false, _) => Lane::Urgent,
                (true, false) => Lane::Bulk,
            };
            let next = match lane {
                Lane::Urgent => state.urgent.pop_front(),
                Lane::Bulk => state.bulk.pop_front(),
            };
            // A waiter that gave up has dropped its receiver: try the next.
            if let Some(next) = next
                && next.send(()).is_ok()
            {
                state.urgent_run = match lane {
                    Lane::Urgent if !state.bulk.is_empty() => state.urgent_run + 1,
                    _ => 0,
                };
                return;
            }
        }
    }
}

/// The writer pool, held for one turn: statements and transactions run on
/// it as on the pool (it derefs to it), and the turn ends when it is
/// dropped. Bind it to a name that outlives the transaction begun on it.
pub(crate) struct Writer<'a, DB: sqlx::Database> {
    pool: &'a sqlx::Pool<DB>,
    turn: Option<Turn>,
}

impl<'a, DB: sqlx::Database> Writer<'a, DB> {
    /// A pool that needs no gate (PostgreSQL: many writers).
    pub(crate) fn ungated(pool: &'a sqlx::Pool<DB>) -> Self {
        Self { pool, turn: None }
    }

    pub(crate) async fn gated(pool: &'a sqlx::Pool<DB>, gate: &WriteGate, lane: Lane) -> Self {
        Self::holding(pool, Some(gate.enter(lane).await))
    }

    /// The pool for a turn already taken at its gate (or none: ungated).
    pub(crate) fn holding(pool: &'a sqlx::Pool<DB>, turn: Option<Turn>) -> Self {
        Self { pool, turn }
    }

    /// The turn, for a transaction begun on the pool that outlives this
    /// borrow of it (hold it until the transaction ends).
    pub(crate) fn into_turn(self) -> Option<Turn> {
        self.turn
    }
}

impl<DB: sqlx::Database> std::ops::Deref for Writer<'_, DB> {
    type Target = sqlx::Pool<DB>;

    fn deref(&self) -> &Self::Target {
        self.pool
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// Queues a waiter that records its name once it has the writer, then
    /// holds it until told to go.
    fn waiter(
        gate: &WriteGate,
        lane: Lane,
        name: &'static str,
        order: &Arc<Mutex<Vec<&'static str>>>,
    ) -> tokio::task::JoinHandle<()> {
        let (gate, order) = (gate.clone(), order.clone());
        tokio::spawn(async move {
            let _turn = gate.enter(lane).await;
            order.lock().unwrap().push(name);
        })
    }

    /// Lets spawned tasks (waiters at the gate, a batcher and its writes)
    /// run as far as they can.
    pub(crate) async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_urgent_write_goes_before_the_queued_bulk_ones_and_the_lanes_alternate() {
        let gate = WriteGate::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = gate.enter(Lane::Bulk).await;
        let mut tasks = vec![
            waiter(&gate, Lane::Bulk, "bulk 1", &order),
            waiter(&gate, Lane::Bulk, "bulk 2", &order),
        ];
        settle().await;
        for name in ["urgent 1", "urgent 2"] {
            tasks.push(waiter(&gate, Lane::Urgent, name, &order));
        }
        settle().await;
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            vec!["urgent 1", "bulk 1", "urgent 2", "bulk 2"]
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_waiter_that_gives_up_does_not_keep_the_writer() {
        let gate = WriteGate::default();
        let held = gate.enter(Lane::Bulk).await;
        let gave_up = tokio::time::timeout(Duration::from_millis(10), gate.enter(Lane::Urgent));
        assert!(gave_up.await.is_err(), "the writer was held");
        drop(held);
        let turn = tokio::time::timeout(Duration::from_secs(5), gate.enter(Lane::Bulk)).await;
        assert!(turn.is_ok(), "the writer was free again");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_turn_handed_to_a_waiter_dropped_before_it_woke_goes_on() {
        let gate = WriteGate::default();
        let held = gate.enter(Lane::Bulk).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = waiter(&gate, Lane::Bulk, "first", &order);
        settle().await;
        let second = waiter(&gate, Lane::Bulk, "second", &order);
        settle().await;
        // The turn goes to `first`, which is cancelled before it runs again
        // (one thread: nothing runs between these two lines).
        drop(held);
        first.abort();
        tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the second waiter got the writer")
            .unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["second"]);
    }
}
