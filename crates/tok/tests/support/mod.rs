//! What the tests of the `tok` binary share: a real `tok serve` process on
//! a free port (killed when dropped) and a small HTTP client for its API.
//! Each test binary uses a part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

/// The platform admin key every test server is started with.
pub(crate) const ADMIN_KEY: &str = "tok-test-admin-key";

/// Serves `app` on a free local port (a service a test's runs call, a
/// collector it exports to); returns its base URL.
pub(crate) async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `TOK_OUTBOUND_ALLOW` entry that opens the outbound guard to the
/// local service at `url` (its `host:port`), and to nothing else.
pub(crate) fn allow(url: &str) -> String {
    let url = reqwest::Url::parse(url).expect("a service URL");
    format!(
        "{}:{}",
        url.host_str().expect("a host"),
        url.port_or_known_default().expect("a port")
    )
}

/// A running `tok serve`; killed when dropped, so a failing assertion
/// leaves no process behind.
pub(crate) struct Server {
    child: Child,
    /// Lines the process printed to stdout, read by a thread that keeps
    /// draining the pipe so the server never blocks on a full one.
    lines: Receiver<String>,
}

impl Server {
    /// Starts `tok serve` with `args` on the database `url` and `port`;
    /// `env` adds or overrides variables.
    pub(crate) fn start(url: &str, port: u16, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tok"));
        command
            .arg("serve")
            .args(args)
            .env("TOK_DATABASE_URL", url)
            .env("TOK_LISTEN", format!("127.0.0.1:{port}"))
            .env("TOK_PUBLIC_URL", format!("http://localhost:{port}/"))
            .env("TOK_ADMIN_KEY", ADMIN_KEY)
            .env("TOK_NODE_ID", "tok-test-node")
            .env("TOK_CONCURRENCY", "4")
            .env("RUST_LOG", "warn");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tok serve");
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        Server { child, lines }
    }

    /// The process id (for signals a test sends itself).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} failed");
    }

    /// The stdout lines printed since the last call (none are waited for).
    pub(crate) fn take_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Kills the process with SIGKILL and waits for it to end.
    pub(crate) fn kill(&mut self) {
        self.child.kill().expect("SIGKILL tok serve");
        let _ = self.child.wait();
    }

    /// The next stdout line `wanted` accepts, with the lines before it;
    /// panics after 30 s.
    pub(crate) fn line_where(&self, wanted: impl Fn(&str) -> bool) -> (String, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if wanted(&line) => return (line, seen),
                Ok(line) => seen.push(line),
                Err(e) => panic!("no such line on stdout ({e:?}); it printed: {seen:#?}"),
            }
        }
    }

    /// Sends SIGTERM, as a process manager stopping the node does.
    pub(crate) fn terminate(&self) {
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
    }

    /// Waits up to `limit` for the process to end; its exit status, or
    /// `None` if it still runs.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for tok serve") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The stdout lines up to the one that says the server listens.
    pub(crate) fn lines_until_listening(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with("tok listening on ") => return seen,
                Ok(line) => seen.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("tok serve printed no `tok listening` line; it printed: {seen:#?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("tok serve ended before it listened; it printed: {seen:#?}")
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `--demo` printed: `export NAME=value` lines.
pub(crate) fn exports(lines: &[String]) -> HashMap<String, String> {
    lines
        .iter()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

pub(crate) struct Api {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
}

impl Api {
    /// A client for the server on `port` (reqwest here is built with rustls
    /// and no default crypto provider, so this installs one).
    pub(crate) fn new(port: u16) -> Api {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Api {
            http: reqwest::Client::new(),
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    pub(crate) async fn wait_ready(&self) {
        for _ in 0..600 {
            if let Ok(r) = self.http.get(format!("{}/readyz", self.base)).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("tok serve did not become ready within 30 s");
    }

    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        tenant: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(tenant) = tenant {
            request = request.header("X-Tok-Tenant", tenant);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        if text.is_empty() {
            return (status, Value::Null);
        }
        let body = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("{path} answered {status} with a body that is not JSON ({e}): {text}")
        });
        (status, body)
    }

    /// A GET that must succeed, as the tenant of `key`.
    pub(crate) async fn get(&self, path: &str, key: &str) -> Value {
        self.get_as(path, key, None).await
    }

    /// A GET that must succeed; `tenant` sends `X-Tok-Tenant` (the admin).
    pub(crate) async fn get_as(&self, path: &str, key: &str, tenant: Option<&str>) -> Value {
        let (status, body) = self
            .call(reqwest::Method::GET, path, key, tenant, None)
            .await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }

    pub(crate) async fn post(&self, path: &str, key: &str, body: Value) -> Value {
        let (status, answer) = self
            .call(reqwest::Method::POST, path, key, None, Some(body))
            .await;
        assert!(status.is_success(), "POST {path}: {status} {answer}");
        answer
    }

    /// The run `run` of the tenant of `key` once it has completed or
    /// failed (a bounded poll: the test fails after 60 s).
    pub(crate) async fn final_run(&self, key: &str, run: &str) -> Value {
        for _ in 0..1200 {
            let detail = self.get(&format!("/api/runs/{run}"), key).await;
            if matches!(detail["status"].as_str(), Some("completed" | "failed")) {
                return detail;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("run {run} did not finish within 60 s");
    }

    /// Every item of a listing, all pages.
    pub(crate) async fn all(&self, path: &str, key: &str, tenant: Option<&str>) -> Vec<Value> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page_path = match &cursor {
                Some(c) => format!("{path}?limit=500&cursor={c}"),
                None => format!("{path}?limit=500"),
            };
            let page = self.get_as(&page_path, key, tenant).await;
            items.extend(
                page["items"]
                    .as_array()
                    .expect("a listing has items")
                    .clone(),
            );
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return items,
            }
        }
    }
}
