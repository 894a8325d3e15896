//! What the machine says about the processes under load, from `/proc`
//! (Linux): resident memory of the server children, and CPU time of the
//! server, of the bench itself, of PostgreSQL and of everything else over a
//! measured interval. Elsewhere every reading is
//! `None` and the figures say "not measured".

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Clock ticks per second of `/proc/*/stat` (`USER_HZ`): 100 on every Linux
/// architecture tok runs on.
const TICKS_PER_SEC: f64 = 100.0;

fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Resident memory now, in KiB.
pub(crate) fn rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmRSS:")
}

/// The largest resident memory the process has had, in KiB.
pub(crate) fn peak_rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmHWM:")
}

/// User plus system CPU ticks of a process (`"self"` for this one).
fn process_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are fixed.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU ticks of each thread of a process, with the thread's name.
fn thread_ticks(pid: u32) -> HashMap<u32, (String, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    tasks
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
            let ticks = process_ticks(&format!("{pid}/task/{tid}"))?;
            Some((tid, (name.trim().to_owned(), ticks)))
        })
        .collect()
}

/// CPU ticks of every process named `postgres` (the server and its
/// backends; a backend that exits within the interval is missed).
fn postgres_ticks() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid = e.file_name().into_string().ok()?;
            pid.bytes().all(|b| b.is_ascii_digit()).then_some(pid)
        })
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .filter_map(|pid| process_ticks(&pid))
        .sum()
}

/// Ticks of the whole machine (all CPUs): (busy, waiting on IO). Busy is
/// everything but idle and iowait.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    let (idle, iowait) = (*fields.get(3)?, *fields.get(4)?);
    Some((total - idle - iowait, iowait))
}

fn machine_busy_ticks() -> Option<u64> {
    machine_ticks().map(|(busy, _)| busy)
}

/// CPU use over an interval, in cores (1.0 = one core busy all the time).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct CpuUse {
    /// `None` for a server the bench did not start (then it is in `other`).
    pub(crate) server: Option<f64>,
    pub(crate) bench: f64,
    /// PostgreSQL's processes (zero on SQLite).
    pub(crate) postgres: f64,
    /// Everything else on the machine: other work disturbs the figure.
    pub(crate) other: f64,
    /// CPUs idle while some process waited on the disk (fsync, mostly).
    pub(crate) iowait: f64,
    /// The server's busiest threads (name, cores): one thread near 1.0 is
    /// a bound even when the machine has idle cores.
    pub(crate) top_threads: Vec<(String, f64)>,
}

impl std::fmt::Display for CpuUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.server {
            Some(server) => write!(f, "cpu cores: server {server:.2}, ")?,
            None => write!(f, "cpu cores: ")?,
        }
        write!(
            f,
            "bench {:.2}, postgres {:.2}, other {:.2}{}, iowait {:.2}",
            self.bench,
            self.postgres,
            self.other,
            if self.server.is_none() {
                " (the server included)"
            } else {
                ""
            },
            self.iowait
        )?;
        if !self.top_threads.is_empty() {
            let threads: Vec<String> = self
                .top_threads
                .iter()
                .map(|(name, cores)| format!("{name} {cores:.2}"))
                .collect();
            write!(f, " (busiest server threads: {})", threads.join(", "))?;
        }
        Ok(())
    }
}

/// Starts counting CPU time of the given server processes, of this process
/// and of the machine.
pub(crate) struct CpuMeter {
    started: Instant,
    pids: Vec<u32>,
    server: u64,
    bench: u64,
    postgres: u64,
    machine: (u64, u64),
    threads: Vec<HashMap<u32, (String, u64)>>,
}

impl CpuMeter {
    pub(crate) fn start(pids: &[u32]) -> Self {
        Self {
            started: Instant::now(),
            pids: pids.to_vec(),
            server: Self::server_ticks(pids),
            bench: process_ticks("self").unwrap_or(0),
            postgres: postgres_ticks(),
            threads: pids.iter().map(|pid| thread_ticks(*pid)).collect(),
            machine: machine_ticks().unwrap_or((0, 0)),
        }
    }

    fn server_ticks(pids: &[u32]) -> u64 {
        pids.iter()
            .filter_map(|pid| process_ticks(&pid.to_string()))
            .sum()
    }

    /// The use since [`CpuMeter::start`]; `None` without `/proc`.
    pub(crate) fn finish(&self) -> Option<CpuUse> {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let (busy, iowait) = machine_ticks()?;
        let machine = busy.saturating_sub(self.machine.0);
        let iowait = iowait.saturating_sub(self.machine.1);
        let server = Self::server_ticks(&self.pids).saturating_sub(self.server);
        let bench = process_ticks("self")?.saturating_sub(self.bench);
        let postgres = postgres_ticks().saturating_sub(self.postgres);
        let cores = |ticks: u64| ticks as f64 / TICKS_PER_SEC / secs;
        let mut top_threads: Vec<(String, f64)> = self
            .pids
            .iter()
            .zip(&self.threads)
            .flat_map(|(pid, before)| {
                thread_ticks(*pid)
                    .into_iter()
                    .map(|(tid, (name, ticks))| {
                        let start = before.get(&tid).map_or(0, |(_, t)| *t);
                        (name, cores(ticks.saturating_sub(start)))
                    })
                    .collect::<Vec<_>>()
            })
            .filter(|(_, c)| *c >= 0.05)
            .collect();
        top_threads.sort_by(|a, b| b.1.total_cmp(&a.1));
        top_threads.truncate(3);
        Some(CpuUse {
            top_threads,
            server: (!self.pids.is_empty()).then(|| cores(server)),
            bench: cores(bench),
            postgres: cores(postgres),
            other: cores(machine.saturating_sub(server + bench + postgres)),
            iowait: cores(iowait),
        })
    }
}

/// The file system a path lives on (`ext4`, `tmpfs`, …): on `tmpfs` an
/// fsync costs nothing and durable figures mean little.
pub(crate) fn file_system(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _device = fields.next()?;
            let point = fields.next()?;
            let kind = fields.next()?;
            path.starts_with(point)
                .then(|| (point.len(), kind.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, kind)| kind)
}

/// The median time of a 4 KiB write plus fsync in `dir`: what one durable
/// commit costs on this disk at the least.
pub(crate) fn fsync_median(dir: &Path) -> Option<Duration> {
    use std::io::Write as _;
    let path = dir.join("fsync-probe");
    let mut file = std::fs::File::create(&path).ok()?;
    let block = [7u8; 4096];
    let mut times = Vec::with_capacity(30);
    for _ in 0..30 {
        let started = Instant::now();
        file.write_all(&block).ok()?;
        file.sync_data().ok()?;
        times.push(started.elapsed());
    }
    let _ = std::fs::remove_file(&path);
    times.sort();
    times.get(times.len() / 2).copied()
}

/// How many cores the machine keeps busy over `window` without the bench
/// doing anything: other work that would disturb the figures.
pub(crate) async fn background_load(window: Duration) -> Option<f64> {
    let before = machine_busy_ticks()?;
    tokio::time::sleep(window).await;
    let busy = machine_busy_ticks()?.saturating_sub(before);
    Some(busy as f64 / TICKS_PER_SEC / window.as_secs_f64())
}

/// The `postgres` processes serving one database, by their process title
/// (`postgres: 15/main: user <database> host(port) state`, and
/// `autovacuum worker <database>`), with their CPU ticks.
fn database_backends(database: &str, except: Option<u32>) -> Vec<(u32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok()?.parse::<u32>().ok())
        .filter(|pid| Some(*pid) != except)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|title| {
                String::from_utf8_lossy(&title)
                    .split(|c: char| c.is_whitespace() || c == '\0')
                    .any(|word| word == database)
            })
        })
        .filter_map(|pid| Some((pid, process_ticks(&pid.to_string())?)))
        .collect()
}

/// CPU time of the PostgreSQL processes of one database (its backends and
/// autovacuum workers), sampled every 100 ms so that a backend which exits
/// within the interval is counted up to its last sample. The server's
/// shared processes (WAL writer, checkpointer, background writer) serve
/// every database and are not in it.
pub(crate) struct DatabaseCpu {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: std::thread::JoinHandle<HashMap<u32, (u64, u64)>>,
    started: Instant,
}

impl DatabaseCpu {
    /// Starts counting; `except` is a backend not to count (the bench's own).
    pub(crate) fn start(database: &str, except: Option<u32>) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let first: HashMap<u32, (u64, u64)> = database_backends(database, except)
            .into_iter()
            .map(|(pid, ticks)| (pid, (ticks, ticks)))
            .collect();
        let (stopping, database) = (stop.clone(), database.to_owned());
        let task = std::thread::spawn(move || {
            let mut seen = first;
            loop {
                let done = stopping.load(Ordering::SeqCst);
                for (pid, ticks) in database_backends(&database, except) {
                    // A process born within the interval started at zero.
                    seen.entry(pid).or_insert((0, 0)).1 = ticks;
                }
                if done {
                    return seen;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self {
            stop,
            task,
            started: Instant::now(),
        }
    }

    /// CPU seconds of the database's processes since the start, the
    /// interval's length in seconds, and how many processes were seen.
    pub(crate) fn finish(self) -> (f64, f64, usize) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let seconds = self.started.elapsed().as_secs_f64();
        let seen = self.task.join().unwrap_or_default();
        let ticks: u64 = seen.values().map(|(a, b)| b.saturating_sub(*a)).sum();
        (ticks as f64 / TICKS_PER_SEC, seconds, seen.len())
    }
}
