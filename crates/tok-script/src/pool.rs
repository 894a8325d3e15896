//! The worker's side: a small pool of sandbox child processes, and the
//! deadline that no script can outrun.
//!
//! [`ScriptPool::run`] waits for a free child (requests queue in order),
//! writes the request to the child's stdin and reads one response line from
//! its stdout, with a timer of the script's timeout plus a grace period.
//! The child's own interrupt handler normally answers at the timeout; a
//! script stuck inside one builtin never lets it run, and then the timer
//! fires: the child is killed (SIGKILL) on the spot and a replacement is
//! started in the background, so the slot comes back as soon as the new
//! process is up. A child that dies on its own (QuickJS aborting) is
//! replaced the same way. Nothing here blocks a runtime thread: the
//! children are driven with `tokio::process` and async pipes.
//!
//! Children get an empty environment and `/` as their working directory:
//! they need nothing from the worker's configuration, least of all its
//! database URL.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::error::{Result, ScriptError};
use crate::protocol::{FailureKind, Outcome, Request, Response};
use crate::sandbox::READY;

/// The hidden subcommand of the `tok` binary that runs
/// [`sandbox_main`](crate::sandbox_main).
pub const SANDBOX_SUBCOMMAND: &str = "script-sandbox";
/// Shortest timeout a step may ask for.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(50);
/// Longest timeout a step may ask for; a script is a transform, not a job.
pub const MAX_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a new child may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a retiring child may take to exit after its stdin closes.
const RETIRE_TIMEOUT: Duration = Duration::from_secs(1);

/// How the pool starts and limits its children.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The program to start as a child: normally the `tok` binary itself.
    pub program: PathBuf,
    /// Its arguments: normally [`SANDBOX_SUBCOMMAND`].
    pub args: Vec<OsString>,
    /// Children, that is scripts running at once. At least 2, so one
    /// runaway script being killed never stalls everyone else.
    pub size: usize,
    /// Timeout of a request that names none. 100 ms: scripts are small
    /// transforms, and a step's slot should not be held longer.
    pub default_timeout: Duration,
    /// How long past its timeout a child may take to answer before it is
    /// killed. The interrupt handler answers within a few milliseconds of
    /// the timeout; only a script inside one long builtin needs the kill.
    pub grace: Duration,
    /// QuickJS heap a script may use. 32 MiB is plenty for a transform of
    /// a 64 KiB context and keeps a pool of a few children small.
    pub memory_limit: usize,
    /// A compiled script's context is dropped and compiled again after
    /// this many runs, so state a script leaves on `globalThis` is bounded.
    pub context_uses: u32,
    /// A child process is replaced after this many scripts, so anything it
    /// leaked over time goes with it.
    pub process_scripts: u64,
    /// Largest output (as JSON) a script may return; the engine's step
    /// output cap.
    pub max_output_bytes: usize,
}

impl PoolConfig {
    /// Children started as `program args…`, with the default limits.
    pub fn new(
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            size: 2,
            default_timeout: Duration::from_millis(100),
            grace: Duration::from_millis(200),
            memory_limit: 32 * 1024 * 1024,
            context_uses: 100,
            process_scripts: 10_000,
            max_output_bytes: 64 * 1024,
        }
    }

    /// Children started as this very binary's [`SANDBOX_SUBCOMMAND`].
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(Self::new(std::env::current_exe()?, [SANDBOX_SUBCOMMAND]))
    }

    /// Checks the limits; the message says which one is off and why.
    pub fn validate(&self) -> Result<(), String> {
        if self.size == 0 {
            return Err("script pool size is 0; it needs at least 1 child (2 or more so a killed one never stalls the rest)".into());
        }
        check_timeout(self.default_timeout)?;
        if self.memory_limit < 1024 * 1024 || self.memory_limit > 1024 * 1024 * 1024 {
            return Err(format!(
                "script memory limit is {} bytes; it must be between 1 MiB and 1 GiB",
                self.memory_limit
            ));
        }
        if self.grace > Duration::from_secs(10) {
            return Err(format!(
                "script grace period is {:?}; more than 10 s would let a runaway script hold its child that long",
                self.grace
            ));
        }
        Ok(())
    }
}

/// Whether a script timeout is within the allowed range (50-1000 ms).
pub fn check_timeout(timeout: Duration) -> Result<(), String> {
    if timeout < MIN_TIMEOUT || timeout > MAX_TIMEOUT {
        return Err(format!(
            "script timeout is {} ms; it must be between {} and {} ms",
            timeout.as_millis(),
            MIN_TIMEOUT.as_millis(),
            MAX_TIMEOUT.as_millis()
        ));
    }
    Ok(())
}

/// One script to run.
#[derive(Debug, Clone)]
pub struct ScriptRequest {
    /// JavaScript defining `function main(input)` that returns an object.
    pub source: String,
    /// What `main` receives.
    pub input: Value,
    /// The pool's default when `None`; else within 50-1000 ms.
    pub timeout: Option<Duration>,
    /// Names the compiled script for reuse: one tenant's source (for
    /// example tenant id plus a hash of the source). Requests with the same
    /// key share a context, so never give two tenants the same key.
    pub cache_key: String,
}

/// What a script returned.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptOutput {
    /// The object `main` returned.
    pub value: Map<String, Value>,
    /// What it passed to `console.log`, capped at 50 lines.
    pub logs: Vec<String>,
}

/// What the pool has done so far; for tests and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Process ids of the children alive now: idle, busy, starting, or
    /// killed and not yet reaped.
    pub children: Vec<u32>,
    /// Children up and waiting for work.
    pub idle: usize,
    /// Children started, replacements included.
    pub spawned: u64,
    /// Children killed because a script overran its deadline.
    pub killed: u64,
    /// Children that died on their own while running a script.
    pub crashed: u64,
    /// Children retired after `process_scripts` scripts or a memory error.
    pub retired: u64,
    /// Scripts answered by a child (successfully or with a script error).
    pub scripts: u64,
    /// How long the last background replacement took to be ready.
    pub last_replacement: Option<Duration>,
}

/// A pool of sandbox children; cheap to clone (clones share the children).
#[derive(Clone)]
pub struct ScriptPool {
    inner: Arc<Inner>,
}

struct Inner {
    config: PoolConfig,
    /// Children that are up and free. A permit entitles its holder to take
    /// one, or to start one when none is free; a permit is given back only
    /// with its child returned here, so there are never more than `size`.
    idle: Mutex<Vec<Process>>,
    permits: Semaphore,
    live: Arc<Mutex<BTreeSet<u32>>>,
    spawned: AtomicU64,
    killed: AtomicU64,
    crashed: AtomicU64,
    retired: AtomicU64,
    scripts: AtomicU64,
    last_replacement: Mutex<Option<Duration>>,
}

impl ScriptPool {
    /// A pool with no children yet: they start on first use (or on
    /// [`ScriptPool::warm_up`]), so an API-only process never starts one.
    pub fn new(config: PoolConfig) -> Result<Self> {
        config.validate().map_err(ScriptError::InvalidRequest)?;
        Ok(Self {
            inner: Arc::new(Inner {
                permits: Semaphore::new(config.size),
                config,
                idle: Mutex::default(),
                live: Arc::default(),
                spawned: AtomicU64::new(0),
                killed: AtomicU64::new(0),
                crashed: AtomicU64::new(0),
                retired: AtomicU64::new(0),
                scripts: AtomicU64::new(0),
                last_replacement: Mutex::default(),
            }),
        })
    }

    pub fn config(&self) -> &PoolConfig {
        &self.inner.config
    }

    /// Starts children until `size` are up, so the first scripts do not pay
    /// for process start.
    pub async fn warm_up(&self) -> Result<()> {
        let mut held = Vec::new();
        while let Ok(permit) = self.inner.permits.try_acquire() {
            held.push(permit);
        }
        let missing = held.len().saturating_sub(lock(&self.inner.idle).len());
        for _ in 0..missing {
            let process = self.inner.spawn().await?;
            lock(&self.inner.idle).push(process);
        }
        Ok(())
    }

    pub fn stats(&self) -> PoolStats {
        let inner = &self.inner;
        PoolStats {
            children: lock(&inner.live).iter().copied().collect(),
            idle: lock(&inner.idle).len(),
            spawned: inner.spawned.load(Ordering::Relaxed),
            killed: inner.killed.load(Ordering::Relaxed),
            crashed: inner.crashed.load(Ordering::Relaxed),
            retired: inner.retired.load(Ordering::Relaxed),
            scripts: inner.scripts.load(Ordering::Relaxed),
            last_replacement: *lock(&inner.last_replacement),
        }
    }

    /// Runs one script in a free child, waiting for one if all are busy.
    ///
    /// Returns within the script's timeout plus the grace period once a
    /// child is free, whatever the script does. Every error but
    /// [`ScriptError::Sandbox`] is the script's doing.
    pub async fn run(&self, request: ScriptRequest) -> Result<ScriptOutput> {
        let config = &self.inner.config;
        let timeout = request.timeout.unwrap_or(config.default_timeout);
        check_timeout(timeout).map_err(ScriptError::InvalidRequest)?;
        let input = serde_json::to_string(&request.input)
            .map_err(|e| ScriptError::InvalidRequest(format!("input is not JSON: {e}")))?;
        let mut line = serde_json::to_string(&Request {
            source: request.source,
            input,
            timeout_ms: timeout.as_millis() as u64,
            memory_limit: config.memory_limit,
            cache_key: request.cache_key,
            recycle_after: config.context_uses,
            max_output_bytes: config.max_output_bytes,
        })
        .map_err(|e| ScriptError::Sandbox(format!("could not encode the request: {e}")))?;
        line.push('\n');

        let permit = self
            .inner
            .permits
            .acquire()
            .await
            .map_err(|_| ScriptError::Sandbox("the script pool is closed".into()))?;
        let idle = lock(&self.inner.idle).pop();
        let mut process = match idle {
            Some(process) => process,
            None => self.inner.spawn().await?,
        };
        let answer = tokio::time::timeout(timeout + config.grace, process.call(&line)).await;
        match answer {
            Ok(Ok(response)) => {
                process.served += 1;
                self.inner.scripts.fetch_add(1, Ordering::Relaxed);
                let result = response.into_result(timeout, config.memory_limit);
                // A child that hit the memory limit has freed the script's
                // heap, but the C allocator may keep the pages; a fresh
                // process gives them back to the system.
                let spent = matches!(result, Err(ScriptError::Memory { .. }));
                self.give_back(process, permit, spent);
                result
            }
            Ok(Err(e)) => {
                // The child closed its output or broke the pipe: it died.
                // The replacement starts before anything is awaited, so a
                // caller that gives up here cannot lose the slot.
                permit.forget();
                self.inner.crashed.fetch_add(1, Ordering::Relaxed);
                self.replace();
                let status = process.reap().await;
                tracing::warn!(pid = process.pid, error = %e, status = %status, "script sandbox died; replacing it");
                Err(ScriptError::Crashed(status))
            }
            Err(_) => {
                permit.forget();
                self.inner.killed.fetch_add(1, Ordering::Relaxed);
                let _ = process.child.start_kill();
                tracing::info!(
                    pid = process.pid,
                    timeout_ms = timeout.as_millis() as u64,
                    "script overran its deadline; killed its sandbox"
                );
                tokio::spawn(async move {
                    process.reap().await;
                });
                self.replace();
                Err(ScriptError::Timeout { limit: timeout })
            }
        }
    }

    /// Returns a healthy child to the idle list, or retires it when it has
    /// served its share or is `spent`.
    fn give_back(&self, process: Process, permit: SemaphorePermit<'_>, spent: bool) {
        if spent || process.served >= self.inner.config.process_scripts {
            permit.forget();
            self.inner.retired.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(process.retire());
            self.replace();
        } else {
            lock(&self.inner.idle).push(process);
            drop(permit);
        }
    }

    /// Starts a child in the background for a permit that was forgotten,
    /// and gives the permit back when it is up (or failed to start: the
    /// next user then tries itself and reports the error).
    fn replace(&self) {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            match inner.spawn().await {
                Ok(process) => {
                    *lock(&inner.last_replacement) = Some(started.elapsed());
                    lock(&inner.idle).push(process);
                }
                Err(e) => tracing::error!(error = %e, "could not replace a script sandbox"),
            }
            inner.permits.add_permits(1);
        });
    }
}

impl Inner {
    /// Starts a child and waits until it says it is ready.
    async fn spawn(&self) -> Result<Process> {
        let config = &self.config;
        let program = config.program.display();
        let mut child = Command::new(&config.program)
            .args(&config.args)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ScriptError::Sandbox(format!("could not start `{program}`: {e}")))?;
        let pid = child.id().unwrap_or_default();
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(ScriptError::Sandbox("the sandbox has no pipes".into()));
        };
        let mut process = Process {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            pid,
            served: 0,
            live: self.live.clone(),
        };
        lock(&self.live).insert(pid);
        self.spawned.fetch_add(1, Ordering::Relaxed);
        let mut hello = String::new();
        let said = tokio::time::timeout(START_TIMEOUT, process.stdout.read_line(&mut hello)).await;
        match said {
            Ok(Ok(_)) if hello.trim_end() == READY => Ok(process),
            Ok(_) => Err(ScriptError::Sandbox(format!(
                "`{program} {}` is not a script sandbox: it said {:?} instead of that it was ready",
                config
                    .args
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                hello.trim_end()
            ))),
            Err(_) => Err(ScriptError::Sandbox(format!(
                "`{program}` did not get ready within {START_TIMEOUT:?}"
            ))),
        }
    }
}

/// One child and its pipes. Dropping it kills the child.
struct Process {
    child: Child,
    /// `None` once closed to make the child exit.
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pid: u32,
    served: u64,
    live: Arc<Mutex<BTreeSet<u32>>>,
}

impl Process {
    async fn call(&mut self, line: &str) -> std::io::Result<Response> {
        let stdin = self.stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await?;
        let mut answer = String::new();
        if self.stdout.read_line(&mut answer).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        serde_json::from_str(&answer).map_err(std::io::Error::other)
    }

    /// Waits for the child to end (killing it if it does not within a
    /// second) and says how it ended.
    async fn reap(&mut self) -> String {
        let status = match tokio::time::timeout(RETIRE_TIMEOUT, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                let _ = self.child.start_kill();
                self.child.wait().await
            }
        };
        match status {
            Ok(status) => describe(status),
            Err(e) => format!("its status is unknown: {e}"),
        }
    }

    /// Closes stdin so the child exits by itself, and waits for it.
    async fn retire(mut self) {
        drop(self.stdin.take());
        self.reap().await;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        lock(&self.live).remove(&self.pid);
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(6)) => "aborted (SIGABRT)".into(),
        (None, Some(9)) => "killed (SIGKILL)".into(),
        (None, Some(11)) => "segmentation fault (SIGSEGV)".into(),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "unknown status".into(),
    }
}

impl Response {
    fn into_result(self, timeout: Duration, memory_limit: usize) -> Result<ScriptOutput> {
        match self.outcome {
            Outcome::Ok(value) => Ok(ScriptOutput {
                value,
                logs: self.logs,
            }),
            Outcome::Error(failure) => Err(match failure.kind {
                FailureKind::Script => ScriptError::Script {
                    message: failure.message,
                    line: failure.line,
                },
                FailureKind::Timeout => ScriptError::Timeout { limit: timeout },
                FailureKind::Memory => ScriptError::Memory {
                    limit_bytes: memory_limit,
                },
                FailureKind::InvalidOutput => ScriptError::InvalidOutput(failure.message),
                FailureKind::Protocol => ScriptError::Sandbox(failure.message),
            }),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_limits_are_checked() {
        let config = PoolConfig::new("/bin/true", [SANDBOX_SUBCOMMAND]);
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.size, 2);
        let bad = PoolConfig {
            default_timeout: Duration::from_millis(5000),
            ..config.clone()
        };
        assert_eq!(
            bad.validate().unwrap_err(),
            "script timeout is 5000 ms; it must be between 50 and 1000 ms"
        );
        assert!(PoolConfig { size: 0, ..config }.validate().is_err());
    }

    #[tokio::test]
    async fn a_program_that_is_no_sandbox_is_reported_as_unavailable() {
        let pool = ScriptPool::new(PoolConfig::new("/bin/echo", ["hello"])).unwrap();
        let e = pool
            .run(ScriptRequest {
                source: "function main() { return {} }".into(),
                input: Value::Null,
                timeout: None,
                cache_key: "k".into(),
            })
            .await
            .unwrap_err();
        assert!(!e.is_script_fault());
        assert!(e.to_string().contains("is not a script sandbox"), "{e}");
        let e = ScriptPool::new(PoolConfig::new("/nonexistent/tok", ["x"]))
            .unwrap()
            .run(ScriptRequest {
                source: String::new(),
                input: Value::Null,
                timeout: Some(Duration::from_millis(100)),
                cache_key: "k".into(),
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("could not start"), "{e}");
    }

    #[tokio::test]
    async fn timeouts_outside_the_range_are_refused_before_anything_runs() {
        let pool = ScriptPool::new(PoolConfig::new("/nonexistent/tok", ["x"])).unwrap();
        let e = pool
            .run(ScriptRequest {
                source: String::new(),
                input: Value::Null,
                timeout: Some(Duration::from_millis(10)),
                cache_key: "k".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(
            e,
            ScriptError::InvalidRequest(
                "script timeout is 10 ms; it must be between 50 and 1000 ms".into()
            )
        );
        assert_eq!(pool.stats().spawned, 0);
    }
}
