//! The process fault suite: real `tok serve` processes under faults, and
//! one checker of the promises at the end of every scenario.
//!
//! On PostgreSQL the cluster is one `api` process and three `worker`
//! processes, on a PostgreSQL server of the suite's own (a cluster created
//! with `initdb` in a temporary directory, on a free port, so that it can be
//! restarted and cut off without touching anyone else's database), reached
//! through a TCP proxy the suite runs (so that it can stop forwarding bytes
//! without closing anything). On SQLite it is one process. Every run calls
//! an HTTP stub that logs each `Idempotency-Key` it receives.
//!
//! The scenarios: SIGKILL of a random worker every 5-15 s; SIGSTOP of a
//! worker for twice its lease, then SIGCONT (its late completions must be
//! rejected, and some must have been); PostgreSQL restarted in immediate
//! mode 5 times (each time the engine recovers within 10 s); the database
//! blackholed, then restored; one tenant's own database (a second cluster,
//! `TOK_TENANT_DATABASES`) blackholed and then stopped while another tenant
//! on the shared database goes on (no gap between its completions over 5 s);
//! and commit-then-error at the record and the
//! inbox (`TOK_FAULT_COMMIT_THEN_ERROR`, a hook of debug builds only: see
//! `tok-store/src/fault.rs`).
//!
//! The checker ([`check`]) asserts, in SQL and from the stub's log: every
//! event answered 202 is one run; every step is recorded once per attempt
//! and once completed; every external call's key was received at most once
//! per attempt and never after its step was recorded completed; no run is
//! left `running` without a job; the queue drains once the faults stop.
//!
//! The tests are `#[ignore]`d so the main suite skips them:
//! `cargo test --workspace --test chaos -- --ignored --test-threads=1 --nocapture`
//! (a few minutes). `TOK_CHAOS_LONG=1` runs the long version (100,000
//! steps under SIGKILL, a 30 s blackhole). Each scenario prints its
//! figures on one `chaos:` line. Timings here drive the faults; the only
//! time asserted is the recovery bound docs/reliability.md promises ("The
//! scenarios": a probe's run completes within 10 s of a restart).

#[path = "support/proxy.rs"]
mod proxy;
mod support;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};
use tok_store::Backend;
use tok_store::testing::TestDb;
use tokio::net::TcpListener;

use proxy::Proxy;
use support::{ADMIN_KEY, Api, Server, free_port};

/// A worker's lease (the shortest tok accepts); heartbeats every second.
const LEASE_SECS: u64 = 3;
/// Step rows of one run: set, http, loop, two lines, log.
const STEPS_PER_RUN: usize = 6;
/// The path of the run's external call.
const CALL_PATH: &str = "1";

fn long() -> bool {
    std::env::var("TOK_CHAOS_LONG").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A small random number source (xorshift), seeded from the clock: which
/// worker dies and when need not be reproducible, only varied.
struct Dice(u64);

impl Dice {
    fn new() -> Dice {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Dice(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

// ---------------------------------------------------------------------
// PostgreSQL of the suite's own

/// A PostgreSQL cluster in a temporary directory, on a free port; stopped
/// and removed when dropped.
struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

/// Runs a PostgreSQL tool as the `postgres` user when this is root
/// (`initdb` refuses root), as this user otherwise.
fn pg_tool(bin: &Path, tool: &str, args: &[&str]) -> std::process::Output {
    let path = bin.join(tool);
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let mut command = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&path);
        c
    } else {
        Command::new(&path)
    };
    let out = command
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl PgCluster {
    fn start() -> PgCluster {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's binaries in /usr/lib/postgresql/<version>/bin")
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin"))
            .filter(|p| p.join("initdb").exists())
            .max()
            .expect("an initdb under /usr/lib/postgresql");
        let dir = std::env::temp_dir().join(format!(
            "tok-chaos-pg-{}-{}",
            std::process::id(),
            Dice::new().below(1 << 30)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = Command::new("chown")
            .args(["postgres:postgres", dir.to_str().unwrap()])
            .status();
        let data = dir.join("data");
        let data = data.to_str().unwrap();
        pg_tool(
            &bin,
            "initdb",
            &["-D", data, "-U", "postgres", "--auth=trust", "-N"],
        );
        let port = free_port();
        // fsync off: the faults here kill PostgreSQL's processes, not the
        // machine; a commit is in the kernel's hands before it answers.
        let conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nmax_connections = 200\n",
            dir.display()
        );
        let conf_path = dir.join("data").join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).unwrap();
        text.push_str(&conf);
        std::fs::write(&conf_path, text).unwrap();
        let cluster = PgCluster { dir, bin, port };
        cluster.pg_ctl(&["start", "-w", "-l", &cluster.log()]);
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").to_str().unwrap().to_owned()
    }

    fn log(&self) -> String {
        self.dir.join("log").to_str().unwrap().to_owned()
    }

    fn pg_ctl(&self, args: &[&str]) {
        let data = self.data();
        let mut all = vec!["-D", data.as_str()];
        all.extend_from_slice(args);
        pg_tool(&self.bin, "pg_ctl", &all);
    }

    /// Restarts the server in immediate mode (its processes killed, crash
    /// recovery at the start), waiting until it accepts connections.
    fn restart_immediately(&self) {
        self.pg_ctl(&["restart", "-m", "immediate", "-w", "-l", &self.log()]);
    }

    fn url(&self, port: u16, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{db}")
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = std::panic::catch_unwind(|| {
            pg_tool(
                &self.bin,
                "pg_ctl",
                &["-D", &data, "stop", "-m", "immediate", "-w"],
            )
        });
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------
// The HTTP stub

/// Every call the stub received: its `Idempotency-Key` and when (ms).
type CallLog = Arc<Mutex<Vec<(String, i64)>>>;

struct Stub {
    base: String,
    log: CallLog,
}

async fn stub(delay: Duration) -> Stub {
    let log: CallLog = Arc::default();
    async fn call(
        State((log, delay)): State<(CallLog, Duration)>,
        headers: HeaderMap,
    ) -> axum::Json<Value> {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        log.lock().unwrap().push((key, tok_store::now_ms()));
        tokio::time::sleep(delay).await;
        axum::Json(json!({ "ok": true }))
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/call", post(call))
        .with_state((log.clone(), delay));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Stub { base, log }
}

// ---------------------------------------------------------------------
// The tok processes

/// The database the tok processes use and the checker reads.
enum Db {
    Postgres { cluster: PgCluster, proxy: Proxy },
    Sqlite(TestDb),
}

impl Db {
    async fn new(backend: Backend) -> Db {
        match backend {
            Backend::Sqlite => Db::Sqlite(TestDb::create(Backend::Sqlite).await),
            Backend::Postgres => {
                let cluster = tokio::task::spawn_blocking(PgCluster::start).await.unwrap();
                let admin = sqlx::PgPool::connect(&cluster.url(cluster.port, "postgres"))
                    .await
                    .expect("connect to the suite's PostgreSQL");
                sqlx::raw_sql("CREATE DATABASE tok")
                    .execute(&admin)
                    .await
                    .unwrap();
                admin.close().await;
                let proxy = Proxy::start(cluster.port).await;
                Db::Postgres { cluster, proxy }
            }
        }
    }

    /// The URL tok uses (through the proxy on PostgreSQL).
    fn tok_url(&self) -> String {
        match self {
            Db::Postgres { cluster, proxy } => cluster.url(proxy.port, "tok"),
            Db::Sqlite(db) => db.url.clone(),
        }
    }

    /// The checker's own connection (straight to the database).
    async fn raw(&self) -> Raw {
        match self {
            Db::Postgres { cluster, .. } => Raw::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .test_before_acquire(true)
                    .connect(&cluster.url(cluster.port, "tok"))
                    .await
                    .unwrap(),
            ),
            Db::Sqlite(db) => Raw::Sqlite(sqlx::SqlitePool::connect(&db.url).await.unwrap()),
        }
    }

    fn backend(&self) -> Backend {
        match self {
            Db::Postgres { .. } => Backend::Postgres,
            Db::Sqlite(_) => Backend::Sqlite,
        }
    }
}

enum Raw {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// Rows of `$sql` as `$ty` on either backend (`Err` when the database
/// cannot answer now).
macro_rules! fetch {
    ($raw:expr, $ty:ty, $sql:expr) => {
        match $raw {
            Raw::Postgres(pool) => sqlx::query_as::<_, $ty>($sql).fetch_all(pool).await,
            Raw::Sqlite(pool) => sqlx::query_as::<_, $ty>($sql).fetch_all(pool).await,
        }
    };
}

/// One scenario's processes: an api and three workers on PostgreSQL, one
/// process on SQLite (`workers` then holds it).
struct Tok {
    api: Option<Server>,
    api_port: u16,
    workers: Vec<Option<Server>>,
    url: String,
    env: Vec<(String, String)>,
    backend: Backend,
    /// Lines of processes that were killed.
    lines: Vec<String>,
}

impl Tok {
    fn worker_env(&self, i: usize) -> Vec<(String, String)> {
        let role = match self.backend {
            Backend::Postgres => "worker",
            Backend::Sqlite => "both",
        };
        let mut env = vec![
            ("TOK_ROLE".to_owned(), role.to_owned()),
            ("TOK_NODE_ID".to_owned(), format!("chaos-worker-{i}")),
        ];
        env.extend(self.env.iter().cloned());
        env
    }

    fn start_worker(&self, i: usize) -> Server {
        let env = self.worker_env(i);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        // On SQLite the one process serves the API too, on the API's port.
        let port = match self.backend {
            Backend::Sqlite => self.api_port,
            Backend::Postgres => free_port(),
        };
        Server::start(&self.url, port, &[], &env)
    }

    async fn start(db: &Db, extra: &[(&str, &str)]) -> Tok {
        let backend = db.backend();
        let mut env: Vec<(String, String)> = vec![
            ("TOK_CONCURRENCY".into(), "8".into()),
            ("TOK_LEASE_SECS".into(), LEASE_SECS.to_string()),
            ("TOK_SHUTDOWN_GRACE".into(), "1s".into()),
            ("RUST_LOG".into(), "warn".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut tok = Tok {
            api: None,
            api_port: free_port(),
            workers: Vec::new(),
            url: db.tok_url(),
            env,
            backend,
            lines: Vec::new(),
        };
        match backend {
            Backend::Postgres => {
                let mut env = vec![
                    ("TOK_ROLE".to_owned(), "api".to_owned()),
                    ("TOK_NODE_ID".to_owned(), "chaos-api".to_owned()),
                ];
                env.extend(tok.env.iter().cloned());
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                tok.api = Some(Server::start(&tok.url, tok.api_port, &[], &env));
            }
            Backend::Sqlite => tok.workers.push(Some(tok.start_worker(0))),
        }
        Api::new(tok.api_port).wait_ready().await;
        tok
    }

    /// The three workers (PostgreSQL), once the tenant and its automation
    /// exist (a worker reads the tenants as it starts).
    fn start_workers(&mut self) {
        if self.backend == Backend::Postgres {
            for i in 0..3 {
                let worker = self.start_worker(i);
                self.workers.push(Some(worker));
            }
        }
    }

    fn kill_worker(&mut self, i: usize) {
        if let Some(mut worker) = self.workers[i].take() {
            worker.kill();
            self.lines.extend(worker.take_lines());
        }
    }

    /// Every stdout line the processes printed so far.
    fn all_lines(&mut self) -> Vec<String> {
        let mut lines = std::mem::take(&mut self.lines);
        for server in self.api.iter().chain(self.workers.iter().flatten()) {
            lines.extend(server.take_lines());
        }
        self.lines.extend(lines.iter().cloned());
        lines
    }
}

// ---------------------------------------------------------------------
// The load

/// A tenant with one webhook source and one automation that calls the stub.
struct Setup {
    tenant: String,
    webhook: String,
}

async fn setup(api: &Api, stub: &Stub, name: &str) -> Setup {
    let tenant = api
        .post("/api/tenants", ADMIN_KEY, json!({ "name": name }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_owned();
    let source = api
        .post(
            "/api/sources",
            &key,
            json!({ "name": "eshop", "params": [
                { "name": "orderId", "path": "data.order.id", "type": "string", "required": true }
            ]}),
        )
        .await;
    api.post(
        "/api/connections",
        &key,
        json!({ "name": "stub", "service": "http", "base_url": stub.base, "rate": 100000, "burst": 10000 }),
    )
    .await;
    api.post(
        "/api/automations",
        &key,
        json!({
            "name": "Order",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "steps": [
                { "id": "st_mark", "type": "set", "config": { "values": { "order": "{{orderId}}" } } },
                { "id": "st_call", "type": "http",
                  "config": { "connection": "stub", "method": "POST", "url": "/call", "body": { "order": "{{order}}" } } },
                { "id": "st_each", "type": "loop", "config": { "items": ["a", "b"] },
                  "do": [{ "id": "st_line", "type": "flow/log", "config": { "message": "{{order}} {{item}}" } }] },
                { "id": "st_done", "type": "flow/log", "config": { "message": "order {{order}} done" } }
            ]
        }),
    )
    .await;
    Setup {
        tenant: tenant["id"].as_str().unwrap().to_owned(),
        webhook: source["url"].as_str().unwrap().to_owned(),
    }
}

/// Senders that send events `0..events`, paced over `over`, each until it
/// is answered 202 (a sender retrying through every fault).
struct Load {
    accepted: Arc<Mutex<HashMap<String, String>>>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    /// Answers other than 202 the senders got (5xx, timeouts), retried.
    retried: Arc<AtomicU64>,
}

const SENDERS: usize = 12;

/// Sends the event with `key` until answered 202; its event id.
async fn send(http: &reqwest::Client, url: &str, key: &str, retried: &AtomicU64) -> String {
    loop {
        let sent = http
            .post(url)
            .header("Idempotency-Key", key)
            .json(&json!({ "kind": "order.created", "data": { "order": { "id": key } } }))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(response) = sent {
            if response.status() == reqwest::StatusCode::ACCEPTED {
                let body: Value = response.json().await.unwrap();
                return body["event_id"].as_str().unwrap().to_owned();
            }
            assert!(
                response.status().is_server_error()
                    || response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS,
                "event {key}: unexpected answer {}",
                response.status()
            );
        }
        retried.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Load {
    fn start(http: &reqwest::Client, url: &str, events: usize, over: Duration) -> Load {
        let accepted: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let retried = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicUsize::new(0));
        let began = Instant::now();
        let senders = (0..SENDERS)
            .map(|_| {
                let (accepted, retried, next) = (accepted.clone(), retried.clone(), next.clone());
                let (http, url) = (http.clone(), url.to_owned());
                tokio::spawn(async move {
                    loop {
                        let n = next.fetch_add(1, Ordering::SeqCst);
                        if n >= events {
                            return;
                        }
                        let due = began + over.mul_f64(n as f64 / events as f64);
                        tokio::time::sleep_until(due.into()).await;
                        let key = format!("order-{n}");
                        let id = send(&http, &url, &key, &retried).await;
                        accepted.lock().unwrap().insert(key, id);
                    }
                })
            })
            .collect();
        Load {
            accepted,
            senders,
            retried,
        }
    }

    fn done(&self) -> bool {
        self.senders.iter().all(|s| s.is_finished())
    }

    async fn finish(self) -> (HashMap<String, String>, u64) {
        for sender in self.senders {
            sender.await.unwrap();
        }
        let accepted = self.accepted.lock().unwrap().clone();
        (accepted, self.retried.load(Ordering::Relaxed))
    }
}

/// Sends a probe event and waits for its run to complete: how long the
/// engine took to come back (both ingest and execution) after a fault.
async fn recovery(
    http: &reqwest::Client,
    setup: &Setup,
    raw: &Raw,
    probe: &str,
    accepted: &Mutex<HashMap<String, String>>,
) -> Duration {
    let began = Instant::now();
    let retried = AtomicU64::new(0);
    let id = send(http, &setup.webhook, probe, &retried).await;
    accepted
        .lock()
        .unwrap()
        .insert(probe.to_owned(), id.clone());
    let sql = format!(
        "SELECT status FROM runs WHERE tenant_id = '{}' AND event_id = '{id}'",
        setup.tenant
    );
    loop {
        if let Ok(rows) = fetch!(raw, (String,), &sql)
            && rows.iter().any(|(s,)| s == "completed")
        {
            return began.elapsed();
        }
        assert!(
            began.elapsed() < Duration::from_secs(120),
            "probe {probe} did not complete within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------
// The checker

/// What the checker found.
#[derive(Debug, Default)]
struct Figures {
    events: usize,
    runs: usize,
    steps: usize,
    calls: usize,
    drained_in: Duration,
}

/// What keeps the queue from draining: the jobs left, the runs not final
/// and the events not dispatched, as lines for the failure message.
async fn stuck(raw: &Raw, tenant: &str) -> String {
    let jobs = fetch!(
        raw,
        (
            i64,
            String,
            String,
            i64,
            i64,
            Option<String>,
            Option<i64>,
            bool
        ),
        &format!(
            "SELECT CAST(id AS BIGINT), run_id, path, CAST(attempts AS BIGINT), run_after, \
             locked_by, locked_until, held FROM jobs WHERE tenant_id = '{tenant}' ORDER BY id LIMIT 20"
        )
    );
    let runs = fetch!(
        raw,
        (String, String),
        &format!(
            "SELECT id, status FROM runs WHERE tenant_id = '{tenant}' \
             AND status NOT IN ('completed', 'failed', 'cancelled') ORDER BY id LIMIT 20"
        )
    );
    let pending = fetch!(
        raw,
        (String,),
        &format!(
            "SELECT id FROM event_inbox WHERE tenant_id = '{tenant}' AND status = 'pending' LIMIT 20"
        )
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "now (ms) {now}\njobs (id, run, path, attempts, run_after, locked_by, locked_until, held): \
         {jobs:#?}\nruns not final: {runs:#?}\nevents pending: {pending:#?}"
    )
}

/// Waits for the queue to drain (no pending event, no job, every run
/// final), then checks every promise; panics with what broke.
async fn check(
    raw: &Raw,
    setup: &Setup,
    accepted: &HashMap<String, String>,
    calls: &CallLog,
    what: &str,
    tok: &mut Tok,
) -> Figures {
    let tenant = &setup.tenant;
    let began = Instant::now();
    let limit = if long() { 900 } else { 180 };
    loop {
        let pending = fetch!(
            raw,
            (i64,),
            &format!(
                "SELECT COUNT(*) FROM event_inbox WHERE tenant_id = '{tenant}' AND status = 'pending'"
            )
        );
        let jobs = fetch!(
            raw,
            (i64,),
            &format!("SELECT COUNT(*) FROM jobs WHERE tenant_id = '{tenant}'")
        );
        let open = fetch!(
            raw,
            (i64,),
            &format!(
                "SELECT COUNT(*) FROM runs WHERE tenant_id = '{tenant}' \
                 AND status NOT IN ('completed', 'failed', 'cancelled')"
            )
        );
        if let (Ok(p), Ok(j), Ok(o)) = (pending, jobs, open)
            && p[0].0 + j[0].0 + o[0].0 == 0
        {
            break;
        }
        if began.elapsed() >= Duration::from_secs(limit) {
            let stuck = stuck(raw, tenant).await;
            let lines = tok.all_lines();
            let warnings: Vec<_> = lines
                .iter()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect();
            let tail = &warnings[warnings.len().saturating_sub(40)..];
            eprintln!("{what}: the processes' last warnings and errors:");
            for line in tail {
                eprintln!("  {line}");
            }
            panic!(
                "{what}: the queue did not drain within {limit} s after the faults stopped; \
                 what is left:\n{stuck}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained_in = began.elapsed();

    // Every event answered 202 is one run, and no run has no such event.
    let runs = fetch!(
        raw,
        (String, String, String, Option<String>),
        &format!("SELECT id, event_id, status, error FROM runs WHERE tenant_id = '{tenant}'")
    )
    .expect("runs");
    let mut per_event: HashMap<&str, usize> = HashMap::new();
    for (id, event, status, error) in &runs {
        assert_eq!(
            status, "completed",
            "{what}: run {id} ended {status}: {error:?}"
        );
        *per_event.entry(event.as_str()).or_default() += 1;
    }
    let events: HashSet<&str> = accepted.values().map(String::as_str).collect();
    assert_eq!(events.len(), accepted.len(), "{what}: one event id per key");
    let lost: Vec<_> = events
        .iter()
        .filter(|e| !per_event.contains_key(**e))
        .collect();
    assert!(
        lost.is_empty(),
        "{what}: events answered 202 without a run: {lost:?}"
    );
    let doubled: Vec<_> = per_event.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "{what}: events with more than one run: {doubled:?}"
    );
    let strays: Vec<_> = per_event.keys().filter(|e| !events.contains(**e)).collect();
    assert!(
        strays.is_empty(),
        "{what}: runs of events never answered 202: {strays:?}"
    );

    // Every step recorded once per attempt, once completed, all of them.
    let steps = fetch!(
        raw,
        (String, String, i64, String, i64),
        &format!(
            "SELECT run_id, path, CAST(attempt AS BIGINT), status, created_at \
             FROM run_steps WHERE tenant_id = '{tenant}'"
        )
    )
    .expect("steps");
    let mut rows: HashMap<(&str, &str, i64), usize> = HashMap::new();
    let mut completed: HashMap<(&str, &str), (i64, i64, usize)> = HashMap::new();
    for (run, path, attempt, status, created_at) in &steps {
        *rows.entry((run, path, *attempt)).or_default() += 1;
        if status == "completed" {
            let entry = completed
                .entry((run, path))
                .or_insert((*attempt, *created_at, 0));
            entry.2 += 1;
        }
    }
    let twice: Vec<_> = rows.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{what}: a (run, path, attempt) recorded twice: {twice:?}"
    );
    let completed_twice: Vec<_> = completed.iter().filter(|(_, c)| c.2 > 1).collect();
    assert!(
        completed_twice.is_empty(),
        "{what}: a step completed twice: {completed_twice:?}"
    );
    let mut per_run: HashMap<&str, usize> = HashMap::new();
    for (run, _) in completed.keys() {
        *per_run.entry(run).or_default() += 1;
    }
    for (id, ..) in &runs {
        assert_eq!(
            per_run.get(id.as_str()).copied().unwrap_or(0),
            STEPS_PER_RUN,
            "{what}: run {id} does not have its {STEPS_PER_RUN} steps completed"
        );
    }

    // Every external call: at most once per attempt, never after its step
    // was recorded completed.
    let calls = calls.lock().unwrap().clone();
    let mut per_key: HashMap<&str, Vec<i64>> = HashMap::new();
    for (key, at) in &calls {
        per_key.entry(key.as_str()).or_default().push(*at);
    }
    for (id, ..) in &runs {
        let key = format!("{id}:{CALL_PATH}");
        let received = per_key.remove(key.as_str()).unwrap_or_default();
        let (attempt, recorded_at, _) = completed[&(id.as_str(), CALL_PATH)];
        assert!(
            !received.is_empty() && received.len() as i64 <= attempt,
            "{what}: key {key} received {} times for a step completed at attempt {attempt}",
            received.len()
        );
        let late: Vec<_> = received.iter().filter(|at| **at > recorded_at).collect();
        assert!(
            late.is_empty(),
            "{what}: key {key} received at {late:?}, after its step was recorded completed at {recorded_at}"
        );
    }
    assert!(
        per_key.is_empty(),
        "{what}: calls with keys of no run: {:?}",
        per_key.keys()
    );

    // No run left running without a job (all are final, and no job is left).
    let orphans = fetch!(
        raw,
        (String,),
        &format!(
            "SELECT r.id FROM runs r WHERE r.tenant_id = '{tenant}' AND r.status = 'running' \
             AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.tenant_id = r.tenant_id AND j.run_id = r.id)"
        )
    )
    .expect("orphans");
    assert!(
        orphans.is_empty(),
        "{what}: runs running without a job: {orphans:?}"
    );

    Figures {
        events: accepted.len(),
        runs: runs.len(),
        steps: steps.len(),
        calls: calls.len(),
        drained_in,
    }
}

// ---------------------------------------------------------------------
// The scenarios

/// What a scenario does to the processes or the database while the load runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    SigKill,
    SigStop,
    PgRestart,
    Blackhole,
    CommitThenError,
}

async fn scenario(backend: Backend, fault: Fault) {
    let what = format!("{fault:?} on {backend:?}");
    let db = Db::new(backend).await;
    let delay = match fault {
        // Steps in flight in the stopped worker for all of its stop: at
        // 15 events a second spread over three workers, calls of 1.5 s
        // keep several in each worker at any moment (300 ms kept one or
        // two, and the scenario's "some were rejected" then hung on one).
        Fault::SigStop => Duration::from_millis(1_500),
        _ => Duration::from_millis(20),
    };
    let stub = stub(delay).await;
    let allow = support::allow(&stub.base);
    let mut extra = vec![("TOK_OUTBOUND_ALLOW", allow.as_str())];
    if fault == Fault::CommitThenError {
        extra.push(("TOK_FAULT_COMMIT_THEN_ERROR", "record:7,inbox:5"));
    }
    let mut tok = Tok::start(&db, &extra).await;
    let api = Api::new(tok.api_port);
    let setup = setup(&api, &stub, "Chaos").await;
    tok.start_workers();
    let raw = db.raw().await;
    let http = api.http.clone();

    let (events, over) = match (fault, long()) {
        // ~2,000 steps short, ~100,000 long.
        (Fault::SigKill, false) => (350, Duration::from_secs(40)),
        (Fault::SigKill, true) => (17_000, Duration::from_secs(900)),
        (Fault::SigStop, _) => (300, Duration::from_secs(20)),
        (Fault::PgRestart, _) => (300, Duration::from_secs(30)),
        (Fault::Blackhole, false) => (200, Duration::from_secs(25)),
        (Fault::Blackhole, true) => (400, Duration::from_secs(50)),
        (Fault::CommitThenError, false) => (200, Duration::from_secs(15)),
        (Fault::CommitThenError, true) => (2_000, Duration::from_secs(120)),
    };
    let load = Load::start(&http, &setup.webhook, events, over);
    let mut dice = Dice::new();
    let mut faults = 0;
    let mut recoveries: Vec<Duration> = Vec::new();
    let mut stale = 0;
    match fault {
        Fault::SigKill => {
            while !load.done() {
                let wait = Duration::from_millis(5_000 + dice.below(10_000));
                let until = Instant::now() + wait;
                while Instant::now() < until && !load.done() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if load.done() {
                    break;
                }
                let i = dice.below(tok.workers.len() as u64) as usize;
                tok.kill_worker(i);
                faults += 1;
                tok.workers[i] = Some(tok.start_worker(i));
                if backend == Backend::Sqlite {
                    api.wait_ready().await;
                }
            }
        }
        Fault::SigStop => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let worker = tok.workers[0].as_ref().unwrap();
            worker.signal("STOP");
            tokio::time::sleep(Duration::from_secs(2 * LEASE_SECS)).await;
            worker.signal("CONT");
            faults += 1;
        }
        Fault::PgRestart => {
            let Db::Postgres { cluster, .. } = &db else {
                unreachable!()
            };
            for i in 0..5 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                tokio::task::block_in_place(|| cluster.restart_immediately());
                faults += 1;
                let took =
                    recovery(&http, &setup, &raw, &format!("probe-{i}"), &load.accepted).await;
                assert!(
                    took <= Duration::from_secs(10),
                    "{what}: restart {i}: the engine took {took:?} to come back"
                );
                recoveries.push(took);
            }
        }
        Fault::Blackhole => {
            let Db::Postgres { proxy, .. } = &db else {
                unreachable!()
            };
            tokio::time::sleep(Duration::from_secs(5)).await;
            proxy.blackhole(true);
            let cut = if long() { 30 } else { 10 };
            tokio::time::sleep(Duration::from_secs(cut)).await;
            proxy.blackhole(false);
            faults += 1;
            let took = recovery(&http, &setup, &raw, "probe-blackhole", &load.accepted).await;
            recoveries.push(took);
        }
        Fault::CommitThenError => {}
    }
    let (accepted, retried) = load.finish().await;
    let figures = check(&raw, &setup, &accepted, &stub.log, &what, &mut tok).await;
    let lines = tok.all_lines();
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    stale += count("stale completion rejected");
    let injected = count("injected fault");
    if fault == Fault::SigStop {
        assert!(
            stale > 0,
            "{what}: the stopped worker's late completions were not seen rejected"
        );
    }
    if fault == Fault::CommitThenError {
        faults = injected;
        assert!(
            injected > 0,
            "{what}: no fault was injected (a debug build reads TOK_FAULT_COMMIT_THEN_ERROR)"
        );
    }
    println!(
        "chaos: {what}: events {}, runs {}, step rows {}, calls {}, faults {faults}, \
         stale completions rejected {stale}, sends retried {retried}, recoveries {recoveries:?}, \
         drained in {:?}, duplicates 0, lost 0",
        figures.events, figures.runs, figures.steps, figures.calls, figures.drained_in
    );
    drop(tok);
    if let Db::Sqlite(db) = db {
        db.cleanup().await;
    }
}

/// One tenant on a database of its own (a second cluster, behind a proxy
/// of its own) while another tenant stays on the shared one, both under
/// load: the tenant database is blackholed for a while, then stopped, then
/// started again. The shared tenant's runs go on with no gap between two
/// completions over [`MAX_GAP`]; the tenant apart is answered 503 (its
/// senders retry) and its runs resume once its database is back; the
/// checker finds nothing lost and nothing run twice, on each database.
async fn tenant_database_scenario() {
    let what = "a tenant database blackholed, then stopped, on Postgres";
    let db = Db::new(Backend::Postgres).await;
    let own = tokio::task::spawn_blocking(PgCluster::start).await.unwrap();
    let admin = sqlx::PgPool::connect(&own.url(own.port, "postgres"))
        .await
        .expect("connect to the tenant's PostgreSQL");
    sqlx::raw_sql("CREATE DATABASE tok")
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let own_proxy = Proxy::start(own.port).await;
    let (stub_shared, stub_apart) = (
        stub(Duration::from_millis(20)).await,
        stub(Duration::from_millis(20)).await,
    );
    let allow = format!(
        "{},{}",
        support::allow(&stub_shared.base),
        support::allow(&stub_apart.base)
    );
    let routes = format!("Apart={}", own.url(own_proxy.port, "tok"));
    let mut tok = Tok::start(
        &db,
        &[
            ("TOK_OUTBOUND_ALLOW", allow.as_str()),
            ("TOK_TENANT_DATABASES", routes.as_str()),
        ],
    )
    .await;
    let api = Api::new(tok.api_port);
    let shared = setup(&api, &stub_shared, "Shared").await;
    let apart = setup(&api, &stub_apart, "Apart").await;
    tok.start_workers();
    let raw = db.raw().await;
    let own_raw = Raw::Postgres(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .test_before_acquire(true)
            .connect(&own.url(own.port, "tok"))
            .await
            .unwrap(),
    );
    let http = api.http.clone();

    let (events, over) = if long() {
        (600, Duration::from_secs(60))
    } else {
        (300, Duration::from_secs(30))
    };
    let load = Load::start(&http, &shared.webhook, events, over);
    let apart_load = Load::start(&http, &apart.webhook, events / 2, over);
    let cut = if long() { 20 } else { 8 };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let began = tok_store::now_ms();
    own_proxy.blackhole(true);
    tokio::time::sleep(Duration::from_secs(cut)).await;
    // Stopped: the connections held by the blackhole close, new ones are
    // refused.
    tokio::task::block_in_place(|| own.pg_ctl(&["stop", "-m", "immediate", "-w"]));
    own_proxy.blackhole(false);
    tokio::time::sleep(Duration::from_secs(cut)).await;
    tokio::task::block_in_place(|| own.pg_ctl(&["start", "-w", "-l", &own.log()]));
    let restored = tok_store::now_ms();
    let took = recovery(&http, &apart, &own_raw, "probe-apart", &apart_load.accepted).await;

    let (accepted, retried) = load.finish().await;
    let (apart_accepted, apart_retried) = apart_load.finish().await;
    let figures = check(&raw, &shared, &accepted, &stub_shared.log, what, &mut tok).await;
    let apart_figures = check(
        &own_raw,
        &apart,
        &apart_accepted,
        &stub_apart.log,
        what,
        &mut tok,
    )
    .await;

    // The shared tenant's completions, in order, while the tenant database
    // was away and until it was back.
    let ends = fetch!(
        &raw,
        (i64,),
        &format!(
            "SELECT finished_at FROM runs WHERE tenant_id = '{}' ORDER BY finished_at",
            shared.tenant
        )
    )
    .expect("finished_at");
    let ends: Vec<i64> = ends.into_iter().map(|(at,)| at).collect();
    let during = ends
        .iter()
        .filter(|at| **at >= began && **at <= restored)
        .count();
    let gap = ends.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    assert!(
        during > 0,
        "{what}: no run of the shared tenant completed while the tenant database was away"
    );
    assert!(
        gap <= MAX_GAP.as_millis() as i64,
        "{what}: the shared tenant's runs stopped completing for {gap} ms"
    );
    println!(
        "chaos: {what}: shared tenant events {}, runs {}, step rows {}, calls {}, sends retried {retried}, \
         completed while away {during}, longest gap {gap} ms; tenant apart events {}, runs {}, \
         sends retried {apart_retried} (503 while away), resumed in {took:?} after its database was back; \
         drained in {:?} and {:?}, duplicates 0, lost 0",
        figures.events,
        figures.runs,
        figures.steps,
        figures.calls,
        apart_figures.events,
        apart_figures.runs,
        figures.drained_in,
        apart_figures.drained_in
    );
    drop(tok);
}

/// The longest the other tenants' runs may stop completing while one
/// tenant's database is away (its calls wait out one timeout, 3 s, before
/// it is marked away).
const MAX_GAP: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fault suite: cargo test --test chaos -- --ignored --test-threads=1"]
async fn a_tenant_database_down_stops_no_other_tenant_and_loses_nothing() {
    tenant_database_scenario().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fault suite: cargo test --test chaos -- --ignored --test-threads=1"]
async fn sigkill_of_a_random_worker_loses_nothing_on_postgres() {
    scenario(Backend::Postgres, Fault::SigKill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fault suite: cargo test --test chaos -- --ignored --test-threads=1"]
async fn sigkill_of_the_process_loses_nothing_on_sqlite() {
    scenario(Backend::Sqlite, Fault::SigKill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fault suite: cargo test --test chaos -- --ignored --test-threads=1"]
async fn a_worker_stopped_past_its_lease_has_its_late_completions_rejected() {
    scenario(Backend::Postgres, Fault::SigStop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fault suite: cargo test --test chaos -- --ignored --test-threads=1"]
async fn postgres_restarted_in_immediate_mode_five_times_loses_nothing() {
    scenario(Backend::Postgres, Fault::PgRestart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fault suite: cargo test --test chaos -- --ignored --test-threads=1"]
async fn a_blackholed_database_loses_nothing_once_restored() {
    scenario(Backend::Postgres, Fault::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fault suite: cargo test --test chaos -- --ignored --test-threads=1"]
async fn commit_then_error_at_the_record_and_the_inbox_loses_nothing() {
    scenario(Backend::Postgres, Fault::CommitThenError).await;
    scenario(Backend::Sqlite, Fault::CommitThenError).await;
}
