//! The stream relay: how processes sharing one PostgreSQL tell each other
//! what they committed, for the live stream (`GET /api/stream`).
//!
//! A process sends its committed events in batches on a connection of its
//! own ([`StreamRelay::send`], `NOTIFY` on [`STREAM_CHANNEL`]), never in a
//! record transaction; every process that serves the API listens on a
//! direct connection ([`Store::listen_stream`](crate::Store::listen_stream)).
//! `LISTEN` needs a session of its own, so this does not work through a
//! pooler in transaction mode. SQLite serves one process and has no relay.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool};

use crate::Result;

/// The channel stream events travel on.
pub const STREAM_CHANNEL: &str = "tok_stream";

/// What a listening process calls with each payload, in the order they
/// were sent, or with `None` after its connection was lost (payloads sent
/// meanwhile are gone: its clients should reload). Returning false ends
/// the listening.
pub type Heard = Arc<dyn Fn(Option<&str>) -> bool + Send + Sync>;

/// Sends a process's committed events to every listening process.
#[async_trait]
pub trait StreamRelay: Send {
    /// Sends `payloads` (each at most 8000 bytes), in order, in one
    /// transaction of the relay's own connection.
    async fn send(&mut self, payloads: &[String]) -> Result<()>;
}

/// The PostgreSQL relay: one connection outside the pool, opened again
/// when it was lost.
pub(crate) struct PgRelay {
    options: PgConnectOptions,
    conn: Option<PgConnection>,
}

impl PgRelay {
    pub(crate) fn new(pool: &PgPool) -> Self {
        Self {
            options: pool.connect_options().as_ref().clone(),
            conn: None,
        }
    }
}

#[async_trait]
impl StreamRelay for PgRelay {
    async fn send(&mut self, payloads: &[String]) -> Result<()> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self
                .conn
                .insert(PgConnection::connect_with(&self.options).await?),
        };
        let sent = async {
            let mut tx = conn.begin().await?;
            for payload in payloads {
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(STREAM_CHANNEL)
                    .bind(payload)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        }
        .await;
        if sent.is_err() {
            // Opened again for the next batch.
            self.conn = None;
        }
        Ok(sent?)
    }
}

/// Listens on [`STREAM_CHANNEL`] on a direct connection until `heard`
/// returns false.
pub(crate) async fn listen(pool: &PgPool, heard: Heard) -> Result<()> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(STREAM_CHANNEL).await?;
    tokio::spawn(async move {
        loop {
            // `try_recv` answers `None` once when the connection was lost,
            // and connects again on the next call.
            let go_on = match listener.try_recv().await {
                Ok(Some(n)) => heard(Some(n.payload())),
                Ok(None) => heard(None),
                Err(e) => {
                    tracing::warn!(error = %e, "listening for stream events failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    heard(None)
                }
            };
            if !go_on {
                return;
            }
        }
    });
    Ok(())
}
