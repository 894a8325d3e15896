//! What the machine says about the processes under load, from `/proc`
//! (Linux): resident memory of the server children, and CPU time of the
//! server, of the bench itself and of everything else (PostgreSQL's
//! backends, mostly) over a measured interval. Elsewhere every reading is
//! `None` and the figures say "not measured".

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

/// Busy ticks of the whole machine (all CPUs): everything but idle and iowait.
fn machine_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    Some(total - fields.get(3)? - fields.get(4)?)
}

/// CPU use over an interval, in cores (1.0 = one core busy all the time).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(crate) struct CpuUse {
    pub(crate) server: f64,
    pub(crate) bench: f64,
    /// The rest of the machine: PostgreSQL's processes, mostly.
    pub(crate) other: f64,
}

impl std::fmt::Display for CpuUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cpu cores: server {:.2}, bench {:.2}, other {:.2}",
            self.server, self.bench, self.other
        )
    }
}

/// Starts counting CPU time of the given server processes, of this process
/// and of the machine.
pub(crate) struct CpuMeter {
    started: Instant,
    pids: Vec<u32>,
    server: u64,
    bench: u64,
    machine: u64,
}

impl CpuMeter {
    pub(crate) fn start(pids: &[u32]) -> Self {
        Self {
            started: Instant::now(),
            pids: pids.to_vec(),
            server: Self::server_ticks(pids),
            bench: process_ticks("self").unwrap_or(0),
            machine: machine_busy_ticks().unwrap_or(0),
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
        let machine = machine_busy_ticks()?.saturating_sub(self.machine);
        let server = Self::server_ticks(&self.pids).saturating_sub(self.server);
        let bench = process_ticks("self")?.saturating_sub(self.bench);
        let cores = |ticks: u64| ticks as f64 / TICKS_PER_SEC / secs;
        Some(CpuUse {
            server: cores(server),
            bench: cores(bench),
            other: cores(machine.saturating_sub(server + bench)),
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
