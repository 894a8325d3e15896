//! A TCP proxy in front of a database that a test can cut off: while
//! blackholed it forwards nothing (bytes read are held, nothing is closed,
//! new connections wait), like a network that drops packets; while refusing
//! it closes every connection at once and every new one as it arrives, like
//! a server that is down. Used by the fault suite and the tenant database
//! tests.
#![allow(dead_code)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the bytes it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Flowing,
    Blackholed,
    Refusing,
}

/// Forwards 127.0.0.1:`port` to 127.0.0.1:`upstream`; stops when dropped.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(crate) async fn start(upstream: u16) -> Proxy {
        Proxy::start_in(upstream, Mode::Flowing).await
    }

    pub(crate) async fn start_in(upstream: u16, mode: Mode) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mode, watching) = watch::channel(mode);
        let task = tokio::spawn(async move {
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    continue;
                };
                let mut mode = watching.clone();
                tokio::spawn(async move {
                    if !passes(&mut mode).await {
                        return;
                    }
                    let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (down_read, down_write) = down.into_split();
                    let (up_read, up_write) = up.into_split();
                    let mut refused = mode.clone();
                    tokio::select! {
                        _ = pipe(down_read, up_write, mode.clone()) => {}
                        _ = pipe(up_read, down_write, mode) => {}
                        _ = refused.wait_for(|m| *m == Mode::Refusing) => {}
                    }
                });
            }
        });
        Proxy { port, mode, task }
    }

    pub(crate) fn set(&self, mode: Mode) {
        let _ = self.mode.send(mode);
    }

    pub(crate) fn blackhole(&self, on: bool) {
        self.set(if on { Mode::Blackholed } else { Mode::Flowing });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits while blackholed; whether the bytes may flow (false: refusing).
async fn passes(mode: &mut watch::Receiver<Mode>) -> bool {
    match mode.wait_for(|m| *m != Mode::Blackholed).await {
        Ok(m) => *m == Mode::Flowing,
        Err(_) => false,
    }
}

/// Copies bytes from `from` to `to`, holding them while blackholed; ends
/// (closing both) when either side does or the proxy refuses.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !passes(&mut mode).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
