//! The capacity model's arithmetic, pure: measured costs in, a day of load
//! minute by minute on each PostgreSQL node out, with the default retention
//! (docs/operations.md, "How long data lives") for what is kept.

use serde::Serialize;
use serde_json::Value;

/// What one unit of work costs the database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Cost {
    /// PostgreSQL CPU, µs.
    pub pg_cpu_us: f64,
    /// WAL bytes.
    pub wal_bytes: f64,
    /// Rows inserted + updated + deleted.
    pub rows_written: f64,
    /// Transactions committed.
    pub commits: f64,
}

impl Cost {
    fn of(per: &Value) -> Option<Cost> {
        Some(Cost {
            pg_cpu_us: per["pg_cpu_us"].as_f64()?,
            wal_bytes: per["wal_bytes"].as_f64()?,
            rows_written: per["rows_written"].as_f64()?,
            commits: per["commits"].as_f64().unwrap_or(0.0),
        })
    }

    /// `(self − base) / n`: the cost of one of the `n` parts a unit adds to
    /// `base`.
    fn marginal(self, base: Cost, n: f64) -> Cost {
        Cost {
            pg_cpu_us: (self.pg_cpu_us - base.pg_cpu_us) / n,
            wal_bytes: (self.wal_bytes - base.wal_bytes) / n,
            rows_written: (self.rows_written - base.rows_written) / n,
            commits: (self.commits - base.commits) / n,
        }
    }
}

/// The model's inputs from `tok bench --only db-cost`.
#[derive(Debug, Clone, Serialize)]
pub struct Costs {
    /// An event: its inbox row, key and dispatch (`ingest`).
    pub event: Cost,
    /// A step of scenario B beyond its event (`steps-b-peak`, or
    /// `steps-b` without it): claim, record, the run's context rewritten.
    pub step: Cost,
    /// A no-op step beyond its event (`steps-queued`), for comparison.
    pub noop_step: Option<Cost>,
    /// Bytes kept per `run_steps` row, per `runs` row (context included)
    /// and per event (`event_inbox` and `event_keys` rows).
    pub step_row_bytes: f64,
    pub run_row_bytes: f64,
    pub inbox_row_bytes: f64,
    pub key_row_bytes: f64,
    /// Steps/s the bench's machine drained (`steps-b`), for reference: on
    /// a shared 2-core machine, not a node's ceiling.
    pub measured_steps_per_sec: Option<f64>,
    /// Which shape the step cost comes from, the claim, and when.
    pub source: String,
}

impl Costs {
    /// Reads the `db-cost` figure's details: either a whole `tok bench`
    /// JSON file or the details alone.
    pub fn from_json(document: &Value) -> Result<Costs, String> {
        let details = match document.get("figures").and_then(Value::as_array) {
            Some(figures) => figures
                .iter()
                .find(|f| f["name"] == "db-cost")
                .map(|f| &f["details"])
                .ok_or("the bench JSON has no `db-cost` figure: run `tok bench --only db-cost --database-url postgres://…`")?,
            None => document,
        };
        let shapes = &details["shapes"];
        let shape = |name: &str| -> Result<&Value, String> {
            let shape = &shapes[name];
            if shape.is_object() {
                Ok(shape)
            } else {
                Err(format!("the costs have no `{name}` shape (shapes.{name})"))
            }
        };
        let ingest = shape("ingest")?;
        let event = Cost::of(&ingest["per_event"])
            .ok_or("shapes.ingest.per_event lacks pg_cpu_us, wal_bytes or rows_written")?;
        let (step_name, step_shape) = match shape("steps-b-peak") {
            Ok(s) => ("steps-b-peak", s),
            Err(_) => ("steps-b", shape("steps-b")?),
        };
        let per_event = |s: &Value, name: &str| {
            Cost::of(&s["per_event"]).ok_or(format!(
                "shapes.{name}.per_event lacks pg_cpu_us, wal_bytes or rows_written"
            ))
        };
        let steps_of = |s: &Value| s["steps_per_event"].as_f64().filter(|n| *n > 0.0);
        let n = steps_of(step_shape).ok_or(format!("shapes.{step_name}.steps_per_event"))?;
        let step = per_event(step_shape, step_name)?.marginal(event, n);
        let noop_step = shapes.get("steps-queued").and_then(|s| {
            Some(
                per_event(s, "steps-queued")
                    .ok()?
                    .marginal(event, steps_of(s)?),
            )
        });
        // A row as stored and its index entries (free space left by updates is
        // used again in a steady state).
        let kept = |s: &Value, table: &str| {
            let t = &s["kept"][table];
            t["kept_bytes_per_row"]
                .as_f64()
                .or(t["bytes_per_row"].as_f64())
        };
        let b = shape("steps-b").unwrap_or(step_shape);
        Ok(Costs {
            event,
            step,
            noop_step,
            step_row_bytes: kept(step_shape, "run_steps")
                .ok_or(format!("shapes.{step_name}.kept.run_steps"))?,
            run_row_bytes: kept(step_shape, "runs")
                .ok_or(format!("shapes.{step_name}.kept.runs"))?,
            inbox_row_bytes: kept(ingest, "event_inbox").ok_or("shapes.ingest.kept.event_inbox")?,
            key_row_bytes: kept(ingest, "event_keys").unwrap_or(0.0),
            measured_steps_per_sec: b["steps_per_sec"].as_f64(),
            source: format!(
                "steps from `{step_name}`, measured {} with {}",
                details["date"].as_str().unwrap_or("(no date)"),
                details["claim"].as_str().unwrap_or("(claim not recorded)")
            ),
        })
    }
}

/// One PostgreSQL node.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    pub cores: f64,
    /// The share of the cores PostgreSQL may use at the peak minute.
    pub max_utilisation: f64,
    /// Disk for the data, GB (10^9 bytes).
    pub disk_gb: f64,
    /// Sustained WAL write bandwidth, MB/s.
    pub wal_mb_per_sec: f64,
    /// A ceiling in steps/s that is neither CPU nor WAL (a what-if: claims
    /// share no lock, so none is set by default).
    pub claim_steps_per_sec: Option<f64>,
}

/// What bounds a node, and where.
#[derive(Debug, Clone, Serialize)]
pub struct Bounds {
    /// Steps/s of scenario-B steps at `max_utilisation` of the cores.
    pub cpu_steps_per_sec: f64,
    pub wal_steps_per_sec: f64,
    pub claim_steps_per_sec: Option<f64>,
    /// The least of the three, and its name.
    pub steps_per_sec: f64,
    pub bound: &'static str,
}

/// The retention (docs/operations.md, "How long data lives"), in days,
/// and how PostgreSQL expires.
#[derive(Debug, Clone, Serialize)]
pub struct Retention {
    pub step_data_days: f64,
    pub runs_days: f64,
    pub inbox_days: f64,
    /// Idempotency keys (`event_keys`): the 24 h window.
    pub key_days: f64,
    /// `run_steps` and `event_inbox` go by whole monthly partitions: a row
    /// is kept up to this many days past its retention.
    pub partition_days: f64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            step_data_days: 30.0,
            runs_days: 365.0,
            inbox_days: 30.0,
            key_days: 1.0,
            partition_days: 31.0,
        }
    }
}

/// A day's load.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    pub events_per_day: f64,
    pub steps_per_event: f64,
    pub tenants: usize,
    /// Tenant sizes: the i-th largest sends ∝ 1 / i^s.
    pub zipf_s: f64,
}

/// The daily curve: each hour's share of the day, and the first minutes of
/// each hour busier than the rest (`burst` × the hour's mean for
/// `burst_minutes`), so the peak minute is above the peak hour.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub hourly: [f64; 24],
    pub burst: f64,
    pub burst_minutes: usize,
}

impl Default for Curve {
    /// Most of the traffic in an 8-hour business window (08-16 h, 86 % of
    /// the day) with a morning and an afternoon hump, quiet nights: an
    /// 8-hour window, uneven within. Scenario B's peak hour is then 209
    /// steps/s and its peak minute 397.
    fn default() -> Self {
        Self {
            hourly: [
                0.15, 0.15, 0.15, 0.15, 0.15, 0.15, 0.15, 1.0, 5.0, 9.0, 12.0, 8.0, 5.0, 8.0, 9.0,
                6.0, 3.0, 1.5, 1.0, 0.7, 0.5, 0.4, 0.3, 0.2,
            ],
            burst: 1.9,
            burst_minutes: 6,
        }
    }
}

impl Curve {
    /// The share of the day's load in each of its 1,440 minutes (sums to 1).
    pub fn minutes(&self) -> Vec<f64> {
        let total: f64 = self.hourly.iter().sum();
        let b = self.burst_minutes.min(60) as f64;
        // The rest of the hour takes what the burst leaves of the mean.
        let rest = if b < 60.0 {
            (60.0 - self.burst * b) / (60.0 - b)
        } else {
            1.0
        };
        let mut out = Vec::with_capacity(24 * 60);
        for weight in self.hourly {
            for minute in 0..60 {
                let factor = if (minute as f64) < b {
                    self.burst
                } else {
                    rest
                };
                out.push(weight / total / 60.0 * factor);
            }
        }
        out
    }
}

/// The i-th tenant's share of the load (largest first).
pub fn zipf_shares(tenants: usize, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=tenants).map(|i| 1.0 / (i as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// A node's bounds for scenario-B steps (each with its share of an event).
pub fn bounds(costs: &Costs, node: &Node, steps_per_event: f64) -> Bounds {
    let per_step = per_step_with_event(costs, steps_per_event);
    let cpu = node.cores * node.max_utilisation * 1e6 / per_step.pg_cpu_us;
    let wal = node.wal_mb_per_sec * 1e6 / per_step.wal_bytes;
    let mut best = (cpu, "PostgreSQL CPU");
    if wal < best.0 {
        best = (wal, "WAL bandwidth");
    }
    if let Some(claim) = node.claim_steps_per_sec
        && claim < best.0
    {
        best = (claim, "the claim ceiling given");
    }
    Bounds {
        cpu_steps_per_sec: cpu,
        wal_steps_per_sec: wal,
        claim_steps_per_sec: node.claim_steps_per_sec,
        steps_per_sec: best.0,
        bound: best.1,
    }
}

/// A step's cost with its share of its event's.
pub fn per_step_with_event(costs: &Costs, steps_per_event: f64) -> Cost {
    let n = steps_per_event.max(1e-9);
    Cost {
        pg_cpu_us: costs.step.pg_cpu_us + costs.event.pg_cpu_us / n,
        wal_bytes: costs.step.wal_bytes + costs.event.wal_bytes / n,
        rows_written: costs.step.rows_written + costs.event.rows_written / n,
        commits: costs.step.commits + costs.event.commits / n,
    }
}

/// One node's day and what it keeps.
#[derive(Debug, Clone, Serialize)]
pub struct NodeDay {
    pub tenants: usize,
    pub events_per_day: f64,
    pub steps_per_day: f64,
    pub peak_steps_per_sec: f64,
    pub peak_hour_steps_per_sec: f64,
    pub mean_steps_per_sec: f64,
    /// PostgreSQL cores busy at the peak minute, and that over the cores.
    pub peak_cores: f64,
    pub peak_utilisation: f64,
    pub mean_utilisation: f64,
    /// Steps waiting at the worst minute when the peak is over the node's
    /// bound, and the longest a step then waits, in seconds.
    pub max_backlog_steps: f64,
    pub max_wait_sec: f64,
    pub wal_gb_per_day: f64,
    pub peak_wal_mb_per_sec: f64,
    pub rows_per_day: f64,
    pub commits_per_sec_peak: f64,
    /// Data held at the end of months 1..=12 (GB), the most it holds once
    /// every retention is full, and what it writes per month.
    pub storage_gb_by_month: Vec<f64>,
    pub storage_gb_steady: f64,
    pub storage_gb_written_per_month: f64,
    /// Whether the node holds its load: peak within the bound, storage
    /// within the disk.
    pub fits: bool,
}

/// Simulates one node's day, minute by minute, with a fluid queue: what
/// the node cannot take in a minute waits for the next.
pub fn simulate_node(
    costs: &Costs,
    node: &Node,
    curve: &Curve,
    retention: &Retention,
    events_per_day: f64,
    steps_per_event: f64,
    tenants: usize,
) -> NodeDay {
    let steps_per_day = events_per_day * steps_per_event;
    let per_step = per_step_with_event(costs, steps_per_event);
    let bound = bounds(costs, node, steps_per_event);
    let minutes = curve.minutes();
    let (mut backlog, mut max_backlog, mut max_wait) = (0.0f64, 0.0f64, 0.0f64);
    let mut peak = 0.0f64;
    for share in &minutes {
        let offered = steps_per_day * share / 60.0;
        peak = peak.max(offered);
        let capacity = bound.steps_per_sec * 60.0;
        backlog = (backlog + offered * 60.0 - capacity).max(0.0);
        max_backlog = max_backlog.max(backlog);
        max_wait = max_wait.max(backlog / bound.steps_per_sec.max(1e-9));
    }
    let total: f64 = curve.hourly.iter().sum();
    let peak_hour =
        curve.hourly.iter().copied().fold(0.0, f64::max) / total * steps_per_day / 3600.0;
    let cores_at = |steps_per_sec: f64| steps_per_sec * per_step.pg_cpu_us / 1e6;
    let mean = steps_per_day / 86_400.0;
    let day = |bytes_per_row_per_day: f64| bytes_per_row_per_day / 1e9;
    let step_rows_gb = day(steps_per_day * costs.step_row_bytes);
    let run_rows_gb = day(events_per_day * costs.run_row_bytes);
    let inbox_gb = day(events_per_day * costs.inbox_row_bytes);
    let keys_gb = day(events_per_day * costs.key_row_bytes);
    // Held after `d` days: each kind up to its retention (plus a partition
    // month where expiry drops whole months; the most, just before a drop).
    let held = |d: f64| {
        let partitioned = |days: f64| d.min(days + retention.partition_days);
        step_rows_gb * partitioned(retention.step_data_days)
            + inbox_gb * partitioned(retention.inbox_days)
            + run_rows_gb * d.min(retention.runs_days)
            + keys_gb * d.min(retention.key_days)
    };
    let storage_gb_by_month: Vec<f64> = (1..=12).map(|m| held(m as f64 * 30.4)).collect();
    let storage_gb_steady = held(
        retention
            .runs_days
            .max(retention.step_data_days.max(retention.inbox_days) + retention.partition_days),
    );
    NodeDay {
        tenants,
        events_per_day,
        steps_per_day,
        peak_steps_per_sec: peak,
        peak_hour_steps_per_sec: peak_hour,
        mean_steps_per_sec: mean,
        peak_cores: cores_at(peak),
        peak_utilisation: cores_at(peak) / node.cores,
        mean_utilisation: cores_at(mean) / node.cores,
        max_backlog_steps: max_backlog,
        max_wait_sec: max_wait,
        wal_gb_per_day: steps_per_day * per_step.wal_bytes / 1e9,
        peak_wal_mb_per_sec: peak * per_step.wal_bytes / 1e6,
        rows_per_day: steps_per_day * per_step.rows_written,
        commits_per_sec_peak: peak * per_step.commits,
        storage_gb_by_month,
        storage_gb_steady,
        storage_gb_written_per_month: (step_rows_gb + run_rows_gb + inbox_gb + keys_gb) * 30.4,
        fits: peak <= bound.steps_per_sec && storage_gb_steady <= node.disk_gb,
    }
}

/// A fleet: tenants spread over PostgreSQL databases by `db_for`.
#[derive(Debug, Clone, Serialize)]
pub struct Fleet {
    pub nodes: Vec<NodeDay>,
    pub bounds: Bounds,
    /// The largest tenant's share of the whole load and its peak steps/s:
    /// a tenant is never split (nothing joins two tenants), so this is
    /// the least a node must take.
    pub largest_tenant_share: f64,
    pub largest_tenant_peak_steps_per_sec: f64,
    /// Tenants larger than a node alone: each on a node of its own that
    /// does not hold it (first in `nodes`).
    pub tenants_too_large: usize,
}

/// Spreads the scenario's tenants (Zipf-sized, largest first) over as few
/// nodes as hold them, first fit decreasing: each tenant goes to the first
/// node where its peak and its storage still fit, a new node when none
/// has room. All tenants follow the same daily curve (one time zone: the
/// peaks add up).
pub fn spread(
    costs: &Costs,
    node: &Node,
    curve: &Curve,
    retention: &Retention,
    scenario: &Scenario,
) -> Fleet {
    let shares = zipf_shares(scenario.tenants.max(1), scenario.zipf_s);
    let bound = bounds(costs, node, scenario.steps_per_event);
    let one = simulate_node(
        costs,
        node,
        curve,
        retention,
        scenario.events_per_day,
        scenario.steps_per_event,
        scenario.tenants,
    );
    // Peak and storage scale with the share of the load.
    let peak_of = |share: f64| one.peak_steps_per_sec * share;
    let storage_of = |share: f64| one.storage_gb_steady * share;
    let mut nodes: Vec<(f64, usize)> = Vec::new();
    // A tenant larger than a node alone gets a node of its own all the
    // same, which does not fit (`fits: false`): it needs a bigger node or
    // a shorter retention.
    let mut alone: Vec<f64> = Vec::new();
    for share in &shares {
        if peak_of(*share) > bound.steps_per_sec || storage_of(*share) > node.disk_gb {
            alone.push(*share);
            continue;
        }
        match nodes.iter_mut().find(|(s, _)| {
            peak_of(s + share) <= bound.steps_per_sec && storage_of(s + share) <= node.disk_gb
        }) {
            Some((s, n)) => {
                *s += share;
                *n += 1;
            }
            None => nodes.push((*share, 1)),
        }
    }
    let tenants_too_large = alone.len();
    let placed = alone.into_iter().map(|s| (s, 1)).chain(nodes);
    Fleet {
        nodes: placed
            .map(|(share, tenants)| {
                simulate_node(
                    costs,
                    node,
                    curve,
                    retention,
                    scenario.events_per_day * share,
                    scenario.steps_per_event,
                    tenants,
                )
            })
            .collect(),
        bounds: bound,
        largest_tenant_share: shares.first().copied().unwrap_or(0.0),
        largest_tenant_peak_steps_per_sec: peak_of(shares.first().copied().unwrap_or(0.0)),
        tenants_too_large,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> Costs {
        Costs {
            event: Cost {
                pg_cpu_us: 100.0,
                wal_bytes: 1000.0,
                rows_written: 3.0,
                commits: 0.1,
            },
            step: Cost {
                pg_cpu_us: 200.0,
                wal_bytes: 5000.0,
                rows_written: 4.0,
                commits: 0.2,
            },
            noop_step: None,
            step_row_bytes: 1000.0,
            run_row_bytes: 10_000.0,
            inbox_row_bytes: 500.0,
            key_row_bytes: 100.0,
            measured_steps_per_sec: None,
            source: "test".into(),
        }
    }

    fn node() -> Node {
        Node {
            cores: 8.0,
            max_utilisation: 0.5,
            disk_gb: 10_000.0,
            wal_mb_per_sec: 100.0,
            claim_steps_per_sec: None,
        }
    }

    #[test]
    fn a_flat_day_costs_its_steps_times_their_cost() {
        let curve = Curve {
            hourly: [1.0; 24],
            burst: 1.0,
            burst_minutes: 0,
        };
        let minutes = curve.minutes();
        assert_eq!(minutes.len(), 1440);
        assert!((minutes.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        // 864,000 events of 10 steps a day: 100 steps/s all day; a step
        // with its tenth of an event is 210 µs, 5,100 B of WAL, 4.3 rows.
        let day = simulate_node(
            &costs(),
            &node(),
            &curve,
            &Retention::default(),
            864_000.0,
            10.0,
            1,
        );
        assert!((day.peak_steps_per_sec - 100.0).abs() < 1e-6);
        assert!((day.peak_cores - 0.021).abs() < 1e-9, "{}", day.peak_cores);
        assert!((day.wal_gb_per_day - 8_640_000.0 * 5_100.0 / 1e9).abs() < 1e-6);
        assert!((day.rows_per_day - 8_640_000.0 * 4.3).abs() < 1e-3);
        assert_eq!(day.max_backlog_steps, 0.0);
        // Storage: step rows 8.64 GB/day for 30 + 31 days, runs 8.64 GB/day
        // for 365, inbox 0.432 GB/day for 61, keys 0.0864 GB/day for 1.
        let steady = 8.64 * 61.0 + 8.64 * 365.0 + 0.432 * 61.0 + 0.0864;
        assert!(
            (day.storage_gb_steady - steady).abs() < 1e-6,
            "{}",
            day.storage_gb_steady
        );
        let first_month = 8.64 * 30.4 + 8.64 * 30.4 + 0.432 * 30.4 + 0.0864;
        assert!((day.storage_gb_by_month[0] - first_month).abs() < 1e-6);
    }

    #[test]
    fn the_burst_keeps_each_hour_whole_and_a_node_past_its_bound_queues() {
        let curve = Curve::default();
        let minutes = curve.minutes();
        let total: f64 = curve.hourly.iter().sum();
        let hour10: f64 = minutes[600..660].iter().sum();
        assert!((hour10 - 12.0 / total).abs() < 1e-12);
        assert!((minutes[600] / minutes[659] - 1.9 / ((60.0 - 1.9 * 6.0) / 54.0)).abs() < 1e-9);
        // A bound of 50 steps/s under a peak of 100 (flat day): the queue
        // grows by 3,000 steps a minute, all day.
        let flat = Curve {
            hourly: [1.0; 24],
            burst: 1.0,
            burst_minutes: 0,
        };
        let slow = Node {
            claim_steps_per_sec: Some(50.0),
            ..node()
        };
        let day = simulate_node(
            &costs(),
            &slow,
            &flat,
            &Retention::default(),
            864_000.0,
            10.0,
            1,
        );
        assert!(!day.fits);
        assert!((day.max_backlog_steps - 3_000.0 * 1440.0).abs() < 1e-3);
    }

    #[test]
    fn tenants_are_spread_without_splitting_one() {
        let shares = zipf_shares(100, 1.0);
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((shares[0] / shares[9] - 10.0).abs() < 1e-9);
        // CPU bound: 8 cores × 0.5 / 210 µs = 19,048 steps/s per node; a
        // flat day of 100 × 100 steps/s... needs ceil(peak / bound) nodes
        // at least, and the largest tenant fits one.
        let flat = Curve {
            hourly: [1.0; 24],
            burst: 1.0,
            burst_minutes: 0,
        };
        let scenario = Scenario {
            name: "t".into(),
            events_per_day: 864_000.0 * 500.0,
            steps_per_event: 10.0,
            tenants: 100,
            zipf_s: 1.0,
        };
        let roomy = Node {
            disk_gb: 1e12,
            ..node()
        };
        let fleet = spread(&costs(), &roomy, &flat, &Retention::default(), &scenario);
        let bound = fleet.bounds.steps_per_sec;
        assert!((bound - 8.0 * 0.5 * 1e6 / 210.0).abs() < 1e-6);
        let least = (50_000.0 / bound).ceil() as usize;
        assert!(fleet.nodes.len() >= least, "{} nodes", fleet.nodes.len());
        assert_eq!(fleet.nodes.iter().map(|n| n.tenants).sum::<usize>(), 100);
        assert!(
            fleet
                .nodes
                .iter()
                .all(|n| n.peak_steps_per_sec <= bound + 1e-6)
        );
        let steps: f64 = fleet.nodes.iter().map(|n| n.steps_per_day).sum();
        assert!((steps - 864_000.0 * 500.0 * 10.0).abs() < 1.0);
        assert_eq!(fleet.tenants_too_large, 0);

        // With a disk that holds a tenth of the storage, the largest
        // tenant (19 %) is over one node alone and has a node of its own.
        let total = simulate_node(
            &costs(),
            &roomy,
            &flat,
            &Retention::default(),
            scenario.events_per_day,
            10.0,
            100,
        )
        .storage_gb_steady;
        let small = Node {
            disk_gb: total / 10.0,
            ..node()
        };
        let fleet = spread(&costs(), &small, &flat, &Retention::default(), &scenario);
        assert!(fleet.tenants_too_large >= 1);
        assert!(!fleet.nodes[0].fits && fleet.nodes[0].tenants == 1);
        assert_eq!(fleet.nodes.iter().map(|n| n.tenants).sum::<usize>(), 100);
        assert!(
            fleet
                .nodes
                .iter()
                .skip(fleet.tenants_too_large)
                .all(|n| n.fits)
        );
    }
}
