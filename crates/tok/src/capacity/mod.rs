//! `tok capacity`: the capacity model of `docs/capacity.md`. From the
//! database's measured cost per event and per step (`tok bench --only
//! db-cost`; the figures measured on the project's machine are built in,
//! from `costs.json`), it simulates scenario B, the load tok is built to
//! serve (450 k events a day of 10 steps each, peaks of 200-400 steps/s),
//! on one PostgreSQL node, and a multiple of it on a fleet of PostgreSQL
//! databases with Zipf-sized tenants spread by `db_for`, and prints per
//! node the CPU at the peak, WAL and rows a day, storage by month under the
//! default retention (docs/operations.md, "How long data lives"), and what
//! bounds a node. Arithmetic only: it starts nothing and connects to
//! nothing.

pub mod model;

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use serde_json::{Value, json};

use model::{Costs, Curve, Fleet, Node, NodeDay, Retention, Scenario};

/// The costs measured on the project's machine (`tok bench --only db-cost
/// --database-url …`, the figure's details), used without `--costs`.
pub const MEASURED: &str = include_str!("costs.json");

/// `tok capacity`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityOptions {
    /// A `tok bench` JSON file with a `db-cost` figure (or its details
    /// alone); without it, the costs measured on the project's machine.
    #[arg(long)]
    pub costs: Option<PathBuf>,
    /// Scenario B's events a day (450,000).
    #[arg(long, default_value_t = 450_000.0)]
    pub events_per_day: f64,
    /// Steps per event (scenario B: 10).
    #[arg(long, default_value_t = 10.0)]
    pub steps_per_event: f64,
    /// Tenants of scenario B (150 clients).
    #[arg(long, default_value_t = 150)]
    pub tenants: usize,
    /// The fleet's multiple of scenario B (load and tenants).
    #[arg(long, default_value_t = 100.0)]
    pub fleet: f64,
    /// Tenant sizes: the i-th largest sends ∝ 1 / i^s.
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// Cores of a PostgreSQL node.
    #[arg(long, default_value_t = 8.0)]
    pub cores: f64,
    /// The share of the cores PostgreSQL may use at the peak minute.
    #[arg(long, default_value_t = 0.7)]
    pub max_utilisation: f64,
    /// A node's disk for data, GB.
    #[arg(long, default_value_t = 4000.0)]
    pub disk_gb: f64,
    /// A node's sustained WAL write bandwidth, MB/s.
    #[arg(long, default_value_t = 200.0)]
    pub wal_mb_per_sec: f64,
    /// A node's ceiling in steps/s besides CPU and WAL, such as a claim
    /// that serializes processes (the claim of one advisory lock per
    /// database that tok had before claims stopped sharing a lock did
    /// 4,000-8,000 `steps-queued` steps/s on the project's 2 cores,
    /// docs/performance.md).
    /// Default: none (claims share no lock, so they scale with the cores).
    #[arg(long)]
    pub claim_steps_per_sec: Option<f64>,
    /// Days kept of step data, runs and inbox events (docs/operations.md,
    /// "How long data lives").
    #[arg(long, default_value_t = 30.0)]
    pub step_data_days: f64,
    #[arg(long, default_value_t = 365.0)]
    pub runs_days: f64,
    #[arg(long, default_value_t = 30.0)]
    pub inbox_days: f64,
    /// Where to write the results as JSON.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs `tok capacity`: the report on stdout, the JSON with `--out`.
pub fn run(options: CapacityOptions) -> anyhow::Result<()> {
    let text = match &options.costs {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("could not read {}", path.display()))?,
        None => MEASURED.to_owned(),
    };
    let document: Value = serde_json::from_str(&text).context("the costs are not JSON")?;
    let costs = Costs::from_json(&document).map_err(anyhow::Error::msg)?;
    for (name, v) in [
        ("--events-per-day", options.events_per_day),
        ("--steps-per-event", options.steps_per_event),
        ("--fleet", options.fleet),
        ("--cores", options.cores),
        ("--disk-gb", options.disk_gb),
        ("--wal-mb-per-sec", options.wal_mb_per_sec),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            anyhow::bail!("{name} must be a positive number (got {v})");
        }
    }
    if !(options.max_utilisation > 0.0 && options.max_utilisation <= 1.0) {
        anyhow::bail!("--max-utilisation must be in (0, 1], like 0.7");
    }
    let (report, json) = simulate(&costs, &options);
    print!("{report}");
    if let Some(out) = &options.out {
        std::fs::write(out, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("could not write {}", out.display()))?;
        eprintln!("results written to {}", out.display());
    }
    Ok(())
}

/// The report and its JSON.
pub fn simulate(costs: &Costs, options: &CapacityOptions) -> (String, Value) {
    let claim = options.claim_steps_per_sec.filter(|v| *v > 0.0);
    let node = Node {
        cores: options.cores,
        max_utilisation: options.max_utilisation,
        disk_gb: options.disk_gb,
        wal_mb_per_sec: options.wal_mb_per_sec,
        claim_steps_per_sec: claim,
    };
    let retention = Retention {
        step_data_days: options.step_data_days,
        runs_days: options.runs_days,
        inbox_days: options.inbox_days,
        ..Retention::default()
    };
    let curve = Curve::default();
    let b = Scenario {
        name: "B".into(),
        events_per_day: options.events_per_day,
        steps_per_event: options.steps_per_event,
        tenants: options.tenants,
        zipf_s: options.zipf,
    };
    let fleet_scenario = Scenario {
        name: format!("{}×B", options.fleet),
        events_per_day: options.events_per_day * options.fleet,
        tenants: ((options.tenants as f64) * options.fleet).round() as usize,
        ..b
    };
    let one = model::simulate_node(
        costs,
        &node,
        &curve,
        &retention,
        b.events_per_day,
        b.steps_per_event,
        b.tenants,
    );
    let fleet = model::spread(costs, &node, &curve, &retention, &fleet_scenario);
    let bounds = model::bounds(costs, &node, b.steps_per_event);
    let per_step = model::per_step_with_event(costs, b.steps_per_event);

    let mut out = String::new();
    let _ = writeln!(out, "Costs ({})", costs.source);
    let cost = |c: &model::Cost| {
        format!(
            "PostgreSQL CPU {:.0} µs, WAL {:.0} B, {:.1} rows written, {:.2} commits",
            c.pg_cpu_us, c.wal_bytes, c.rows_written, c.commits
        )
    };
    let _ = writeln!(
        out,
        "  an event (inbox, key, dispatch):     {}",
        cost(&costs.event)
    );
    let _ = writeln!(
        out,
        "  a step of scenario B beyond it:      {}",
        cost(&costs.step)
    );
    if let Some(noop) = &costs.noop_step {
        let _ = writeln!(out, "  a no-op step (steps-queued), beside: {}", cost(noop));
    }
    let _ = writeln!(
        out,
        "  a step with its share of the event:  {}",
        cost(&per_step)
    );
    let _ = writeln!(
        out,
        "  kept: {:.0} B per run_steps row, {:.0} B per run (its context included), {:.0} B per inbox row, {:.0} B per idempotency key",
        costs.step_row_bytes, costs.run_row_bytes, costs.inbox_row_bytes, costs.key_row_bytes
    );
    if let Some(rate) = costs.measured_steps_per_sec {
        let _ = writeln!(
            out,
            "  the bench's machine drained {rate:.0} such steps/s (2 cores shared with the server and other work)"
        );
    }
    let _ = writeln!(
        out,
        "\nA node: {} cores (PostgreSQL at most {:.0} % of them at the peak minute), {:.0} GB of disk, {:.0} MB/s of WAL",
        node.cores,
        node.max_utilisation * 100.0,
        node.disk_gb,
        node.wal_mb_per_sec
    );
    let _ = writeln!(
        out,
        "  steps/s it takes: CPU {:.0}, WAL {:.0}, claim {} → {:.0}, bound by {}",
        bounds.cpu_steps_per_sec,
        bounds.wal_steps_per_sec,
        bounds
            .claim_steps_per_sec
            .map(|c| format!("{c:.0} (given)"))
            .unwrap_or_else(|| "not a bound".into()),
        bounds.steps_per_sec,
        bounds.bound
    );
    let _ = writeln!(
        out,
        "  storage bounds it at {:.0} M steps/day (steady state with the retention)",
        node.disk_gb / (one.storage_gb_steady / one.steps_per_day) / 1e6
    );
    let _ = writeln!(
        out,
        "\nScenario B on one node: {:.0} events/day × {} steps = {:.2} M steps/day, {} tenants",
        b.events_per_day,
        b.steps_per_event,
        one.steps_per_day / 1e6,
        b.tenants
    );
    describe(&mut out, &one);
    let _ = writeln!(
        out,
        "\n{} on a fleet: {:.1} M events/day, {:.0} M steps/day, {} tenants (Zipf s = {}), spread by db_for",
        fleet_scenario.name,
        fleet_scenario.events_per_day / 1e6,
        fleet_scenario.events_per_day * fleet_scenario.steps_per_event / 1e6,
        fleet_scenario.tenants,
        fleet_scenario.zipf_s
    );
    describe_fleet(&mut out, &fleet);
    let json = json!({
        "costs": costs,
        "per_step_with_event": per_step,
        "node": node,
        "bounds": bounds,
        "retention": retention,
        "curve": curve,
        "scenario_b": { "scenario": b, "node": one },
        "fleet": { "scenario": fleet_scenario, "result": fleet },
    });
    (out, json)
}

fn describe(out: &mut String, day: &NodeDay) {
    let _ = writeln!(
        out,
        "  steps/s: peak minute {:.0}, peak hour {:.0}, mean {:.0}",
        day.peak_steps_per_sec, day.peak_hour_steps_per_sec, day.mean_steps_per_sec
    );
    let _ = writeln!(
        out,
        "  PostgreSQL CPU at the peak: {:.2} cores, {:.1} % of the node (day's mean {:.1} %); {:.0} commits/s",
        day.peak_cores,
        day.peak_utilisation * 100.0,
        day.mean_utilisation * 100.0,
        day.commits_per_sec_peak
    );
    if day.max_backlog_steps > 0.0 {
        let _ = writeln!(
            out,
            "  over its bound: up to {:.0} steps wait, {:.0} s at the worst",
            day.max_backlog_steps, day.max_wait_sec
        );
    }
    let _ = writeln!(
        out,
        "  WAL {:.1} GB/day ({:.1} MB/s at the peak); {:.1} M rows written/day",
        day.wal_gb_per_day,
        day.peak_wal_mb_per_sec,
        day.rows_per_day / 1e6
    );
    let months: Vec<String> = [1usize, 2, 3, 6, 12]
        .iter()
        .map(|m| format!("month {m}: {:.0}", day.storage_gb_by_month[m - 1]))
        .collect();
    let _ = writeln!(
        out,
        "  storage held (GB): {}; steady {:.0}; written {:.0} GB/month",
        months.join(", "),
        day.storage_gb_steady,
        day.storage_gb_written_per_month
    );
    let _ = writeln!(
        out,
        "  fits one node: {}",
        if day.fits { "yes" } else { "NO" }
    );
}

fn describe_fleet(out: &mut String, fleet: &Fleet) {
    let nodes = &fleet.nodes;
    let _ = writeln!(
        out,
        "  nodes needed: {} (each bound at {:.0} steps/s by {}, and by its disk)",
        nodes.len(),
        fleet.bounds.steps_per_sec,
        fleet.bounds.bound
    );
    let _ = writeln!(
        out,
        "  the largest tenant: {:.1} % of the load, {:.0} steps/s at its peak{}",
        fleet.largest_tenant_share * 100.0,
        fleet.largest_tenant_peak_steps_per_sec,
        if fleet.tenants_too_large > 0 {
            format!(
                "; {} tenant(s) larger than one node alone, each on a node of its own that does not hold it (the first rows; a tenant is never split: a bigger node or a shorter retention for them)",
                fleet.tenants_too_large
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "  {:>4}  {:>7}  {:>10}  {:>9}  {:>6}  {:>8}  {:>9}  {:>10}  fits",
        "node", "tenants", "M steps/d", "peak st/s", "CPU %", "WAL GB/d", "M rows/d", "storage GB"
    );
    let shown: Vec<(usize, &NodeDay)> = if nodes.len() <= 12 {
        nodes.iter().enumerate().collect()
    } else {
        let mut v: Vec<(usize, &NodeDay)> = nodes.iter().enumerate().take(8).collect();
        v.extend(nodes.iter().enumerate().skip(nodes.len() - 2));
        v
    };
    let mut last = None;
    for (i, n) in shown {
        if last.is_some_and(|l: usize| i > l + 1) {
            let _ = writeln!(out, "  {:>4}", "…");
        }
        last = Some(i);
        let _ = writeln!(
            out,
            "  {:>4}  {:>7}  {:>10.1}  {:>9.0}  {:>6.1}  {:>8.1}  {:>9.1}  {:>10.0}  {}",
            i + 1,
            n.tenants,
            n.steps_per_day / 1e6,
            n.peak_steps_per_sec,
            n.peak_utilisation * 100.0,
            n.wal_gb_per_day,
            n.rows_per_day / 1e6,
            n.storage_gb_steady,
            if n.fits { "yes" } else { "NO" }
        );
    }
    let total = |f: fn(&NodeDay) -> f64| nodes.iter().map(f).sum::<f64>();
    let _ = writeln!(
        out,
        "  fleet: WAL {:.0} GB/day, {:.0} M rows/day, storage {:.1} TB steady ({:.1} TB after month 1, {:.1} TB after month 3)",
        total(|n| n.wal_gb_per_day),
        total(|n| n.rows_per_day) / 1e6,
        total(|n| n.storage_gb_steady) / 1e3,
        total(|n| n.storage_gb_by_month[0]) / 1e3,
        total(|n| n.storage_gb_by_month[2]) / 1e3,
    );
}

#[cfg(test)]
mod tests {
    use super::model::Costs;

    /// The built-in costs are the bench's JSON shape and hold every input.
    #[test]
    fn the_measured_costs_are_read() {
        let document = serde_json::from_str(super::MEASURED).unwrap();
        let costs = Costs::from_json(&document).unwrap();
        assert!(costs.step.pg_cpu_us > 0.0 && costs.step.wal_bytes > 0.0);
        assert!(costs.event.rows_written > 0.0);
        assert!(costs.run_row_bytes > 0.0 && costs.step_row_bytes > 0.0);
    }

    #[test]
    fn a_bench_file_without_db_cost_is_refused_with_the_command() {
        let document = serde_json::json!({ "figures": [{ "name": "steps", "details": {} }] });
        let e = Costs::from_json(&document).unwrap_err();
        assert!(e.contains("tok bench --only db-cost"), "{e}");
    }
}
