//! Group commit for the inbox: concurrent webhooks share one transaction.
//!
//! Every accepted webhook must be durable before its 202, which costs a
//! commit (an fsync with the durable settings). Requests that arrive while a
//! commit is in flight wait in a channel; the next transaction takes all of
//! them (up to [`MAX_BATCH`]) and commits once, and each caller is answered
//! only after that commit. Under load, many webhooks share one fsync; alone,
//! a webhook waits for nothing but its own commit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tok_core::ids::{EventId, TenantId};
use tokio::sync::{mpsc, oneshot};

use crate::{Accepted, NewEvent, Result, StoreError};

/// Most events one inbox transaction takes.
pub(crate) const MAX_BATCH: usize = 256;

type Reply = oneshot::Sender<Result<(EventId, Accepted)>>;
type Request = (TenantId, NewEvent, Reply);

/// Writes a batch of events in one transaction, answers in order.
pub(crate) type AcceptBatch = Arc<
    dyn Fn(
            Vec<(TenantId, NewEvent)>,
        ) -> Pin<Box<dyn Future<Output = Result<Vec<(EventId, Accepted)>>> + Send>>
        + Send
        + Sync,
>;

pub(crate) struct EventBatcher {
    sender: mpsc::Sender<Request>,
}

impl EventBatcher {
    /// Starts the batching task (it ends when the store is dropped).
    pub(crate) fn spawn(accept: AcceptBatch) -> Self {
        let (sender, mut receiver) = mpsc::channel::<Request>(MAX_BATCH * 8);
        tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match receiver.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let (items, replies): (Vec<_>, Vec<_>) =
                    batch.into_iter().map(|(t, e, r)| ((t, e), r)).unzip();
                match accept(items).await {
                    Ok(results) => {
                        for (reply, result) in replies.into_iter().zip(results) {
                            let _ = reply.send(Ok(result));
                        }
                    }
                    Err(e) => {
                        let message = e.to_string();
                        for reply in replies {
                            let _ = reply.send(Err(StoreError::Unavailable(message.clone())));
                        }
                    }
                }
            }
        });
        Self { sender }
    }

    /// Queues one event and waits until the transaction that wrote it committed.
    pub(crate) async fn accept(
        &self,
        tenant: &TenantId,
        event: NewEvent,
    ) -> Result<(EventId, Accepted)> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send((tenant.clone(), event, reply))
            .await
            .map_err(|_| StoreError::Unavailable("the inbox writer has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the inbox writer has stopped".into()))?
    }
}
