//! Group commit: writes that arrive while a commit is in flight share the
//! next transaction.
//!
//! Every accepted webhook must be durable before its 202, and every step's
//! record before the next step starts, which costs a commit (an fsync with
//! the durable settings) each. Requests wait in a channel; the next
//! transaction takes all waiting ones (up to [`MAX_BATCH`]) and commits
//! once, and each caller is answered only after that commit. Under load many
//! writes share one fsync; alone, a write waits for nothing but its own
//! commit. One item's refusal (a lost lease) does not fail the others; a
//! database error fails the whole batch, and every caller hears it.
//!
//! Fair between tenants: when one tenant's writes crowd the queue, the
//! other tenants' waiting writes go first, in a small transaction of their
//! own, instead of at the back of that tenant's large one. The next
//! transaction then takes the queue in order, so the crowding tenant waits
//! for at most one small commit.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;

use tok_core::ids::TenantId;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::{Result, StoreError};

/// Most writes one transaction takes.
pub(crate) const MAX_BATCH: usize = 256;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Writes a batch in one transaction; one answer per item, in order.
pub(crate) type WriteBatch<I, O> =
    Arc<dyn Fn(Vec<I>) -> BoxFuture<Result<Vec<Result<O>>>> + Send + Sync>;

pub(crate) struct Batcher<I, O> {
    sender: mpsc::Sender<(I, oneshot::Sender<Result<O>>)>,
}

/// A tenant with this many writes waiting crowds the queue.
const CROWDING: usize = 8;

type Waiting<I, O> = (I, oneshot::Sender<Result<O>>);

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the batching task (it ends when the store is dropped), which
    /// keeps up to `parallel` transactions in flight: on PostgreSQL a batch
    /// runs while the one before waits for its commit; SQLite's one writer
    /// takes one at a time. A batch takes whatever waited while the writers
    /// were busy; `tenant` says whose a write is.
    pub(crate) fn spawn(
        write: WriteBatch<I, O>,
        parallel: usize,
        tenant: fn(&I) -> &TenantId,
    ) -> Self {
        let (sender, mut receiver) = mpsc::channel::<Waiting<I, O>>(MAX_BATCH * 8);
        let writers = Arc::new(Semaphore::new(parallel.max(1)));
        tokio::spawn(async move {
            let mut queue: VecDeque<Waiting<I, O>> = VecDeque::new();
            let mut ahead = false;
            loop {
                let Ok(writer) = writers.clone().acquire_owned().await else {
                    return;
                };
                if queue.is_empty() {
                    let Some(first) = receiver.recv().await else {
                        return;
                    };
                    queue.push_back(first);
                }
                while let Ok(next) = receiver.try_recv() {
                    queue.push_back(next);
                }
                // After the others went ahead once, the queue goes in order.
                let others = if ahead {
                    None
                } else {
                    others_first(&mut queue, |(item, _)| tenant(item))
                };
                let batch = match others {
                    Some(others) => {
                        ahead = true;
                        others
                    }
                    None => {
                        ahead = false;
                        let n = queue.len().min(MAX_BATCH);
                        queue.drain(..n).collect()
                    }
                };
                let write = write.clone();
                tokio::spawn(async move {
                    let (items, replies): (Vec<I>, Vec<_>) = batch.into_iter().unzip();
                    match write(items).await {
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
                });
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

/// The tenant crowding a queue of writes (or a dispatch's events, given by
/// their tenants): one with at least `at_least` of them while another
/// tenant has some too.
pub(crate) fn crowding<'a, K: Eq + Hash + ?Sized>(
    tenants: impl IntoIterator<Item = &'a K>,
    at_least: usize,
) -> Option<&'a K> {
    let mut counts: HashMap<&K, usize> = HashMap::new();
    for tenant in tenants {
        *counts.entry(tenant).or_default() += 1;
    }
    if counts.len() < 2 {
        return None;
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .filter(|(_, n)| *n >= at_least)
        .map(|(tenant, _)| tenant)
}

/// When one tenant crowds the queue, takes out the other tenants' writes
/// (in order, up to a batch) for a transaction that goes first.
fn others_first<T>(queue: &mut VecDeque<T>, tenant: impl Fn(&T) -> &TenantId) -> Option<Vec<T>> {
    let crowding = crowding(queue.iter().map(&tenant), CROWDING)?.clone();
    let mut others = Vec::new();
    let mut rest = VecDeque::with_capacity(queue.len());
    for item in queue.drain(..) {
        if others.len() < MAX_BATCH && tenant(&item) != &crowding {
            others.push(item);
        } else {
            rest.push_back(item);
        }
    }
    *queue = rest;
    Some(others)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let first = others_first(&mut q, |(t, _)| t).expect("split");
        assert_eq!(order(&first), vec![3, 11]);
        assert_eq!(q.len(), 10);
        assert!(q.iter().all(|(t, _)| t.as_str() == "big"));
    }

    #[test]
    fn a_queue_nobody_crowds_goes_in_order() {
        let mut one = queue(&["a"; 20]);
        assert!(others_first(&mut one, |(t, _)| t).is_none(), "one tenant");
        let mut even = queue(&["a", "b", "a", "b", "a", "b"]);
        assert!(others_first(&mut even, |(t, _)| t).is_none(), "no crowd");
        assert_eq!(even.len(), 6);
    }
}
