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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

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

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the batching task (it ends when the store is dropped), which
    /// keeps up to `parallel` transactions in flight: on PostgreSQL a batch
    /// runs while the one before waits for its commit; SQLite's one writer
    /// takes one at a time. A batch takes whatever waited while the writers
    /// were busy.
    pub(crate) fn spawn(write: WriteBatch<I, O>, parallel: usize) -> Self {
        let (sender, mut receiver) =
            mpsc::channel::<(I, oneshot::Sender<Result<O>>)>(MAX_BATCH * 8);
        let writers = Arc::new(Semaphore::new(parallel.max(1)));
        tokio::spawn(async move {
            loop {
                let Ok(writer) = writers.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = receiver.recv().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match receiver.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
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
