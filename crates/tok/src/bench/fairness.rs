//! `fairness`: a small tenant's run latency while a large tenant has a
//! flood of runs queued, against the same small tenant alone.
//!
//! The small tenant's runs are a `set`, a `bench/noop` and a `set`: the
//! first runs in the dispatch, the second goes through the worker pool
//! like any step that needs a worker (a claim, or a slot the dispatch hands
//! it) and the third is chained in its record. A run of `set` steps only
//! would be complete at dispatch and never meet the large tenant's queue.
//!
//! The small tenant sends 50 webhooks at about 20/s; a run's latency is from
//! the 202 of its event (the bench's clock) to the run's `finished_at` (the
//! server's clock, the same machine). First alone, then right after the
//! large tenant has had 50,000 webhooks (scaled) accepted as fast as the
//! senders go. The figure is the ratio of the two p99s.
//!
//! The large tenant's runs are ten `bench/noop` steps each (a claim and a
//! record per step), so they cannot finish as fast as their webhooks are
//! accepted and most of them are still queued when the small tenant starts
//! again. With less than half of them queued then, the figure says it was
//! not measured: the small tenant had no backlog to get past.
//!
//! Then the same flood again, its runs split over [`api::SHARDS`] keys
//! (`flow.throttle` keyed on the body's `shard`, far above the flood's
//! rate: each event goes through its key's row, none is held back), and
//! the small tenant once more: `fairness_split` is the ratio of its p99
//! under the split flood to its p99 under the unsplit one, measured one
//! after the other in one run. Fairness is per tenant first, so a tenant
//! gains nothing by splitting its backlog over keys.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use anyhow::Context as _;

use super::api::{self, Api, Tenant};
use super::report::{Figure, Target, ms, percentile};
use super::steps::{self, Kind};
use super::{Bench, NOOP_STEP, Server};

const NAME: &str = "fairness";

/// The small tenant's webhooks per phase, and their rate.
pub(super) const SMALL_EVENTS: usize = 50;
pub(super) const SMALL_RATE: f64 = 20.0;

/// Longest wait for the small tenant's runs under the flood.
const TIME_LIMIT: Duration = Duration::from_secs(1800);

/// A short automation: a `set`, a step for a worker, a `set`.
pub(super) fn short_steps() -> Vec<Value> {
    vec![
        json!({ "id": "s1", "type": "set", "config": { "values": { "v1": "{{n}}" } } }),
        json!({ "id": "s2", "type": NOOP_STEP, "config": {} }),
        json!({ "id": "s3", "type": "set", "config": { "values": { "v3": "{{s1.v1}}" } } }),
    ]
}

pub(crate) async fn run(bench: &Bench) -> anyhow::Result<Vec<Figure>> {
    let mut server = bench.server(NAME, None).await?;
    let measured = measure(bench, &mut server).await;
    bench.release(NAME, server).await;
    measured
}

/// Latencies of one phase of the small tenant, sorted; and what went wrong.
pub(super) struct Phase {
    pub(super) latencies: Vec<Duration>,
    pub(super) problems: Vec<String>,
    pub(super) started_ms: i64,
}

impl Phase {
    pub(super) fn p(&self, p: f64) -> f64 {
        ms(percentile(&self.latencies, p))
    }
}

/// [`SMALL_EVENTS`] runs of an automation `label` of `tenant` with
/// `steps`, at [`SMALL_RATE`]: their latencies, from the event's 202 to
/// the run's end. (`figure` names the figure in the progress lines.)
pub(super) async fn small_phase(
    bench: &Bench,
    api: &Api,
    tenant: &Tenant,
    (label, steps): (&str, Vec<Value>),
    limit: Duration,
    figure: &str,
) -> anyhow::Result<Phase> {
    let source = api.source(tenant, label).await?;
    let automation = api.automation(tenant, label, &source, steps).await?;
    let progress = (&bench.progress, figure);
    let started_ms = api::epoch_ms();
    let sent = api::send_open_loop(
        &bench.http,
        &source.url,
        &format!("{}-{label}", bench.nonce),
        SMALL_EVENTS,
        SMALL_RATE,
        true,
        progress,
    )
    .await;
    let finished = api
        .wait_runs(tenant, Some(&automation), sent.accepted, limit, progress)
        .await?;
    let accepted_at: HashMap<&str, i64> = sent
        .events
        .iter()
        .map(|(id, at)| (id.as_str(), *at))
        .collect();
    let mut latencies: Vec<Duration> = finished
        .completed()
        .filter_map(|run| {
            let accepted = accepted_at.get(run.event_id.as_str())?;
            let done = run.finished_at?;
            Some(Duration::from_millis((done - accepted).max(0) as u64))
        })
        .collect();
    latencies.sort();
    let mut problems = Vec::new();
    if sent.errors() > 0 {
        problems.push(sent.error_text());
    }
    let issue = finished.problems();
    if !issue.is_empty() {
        problems.push(issue);
    }
    Ok(Phase {
        latencies,
        problems,
        started_ms,
    })
}

/// One flood of the large tenant and the small tenant's phase under it:
/// what the flood sent, its backlog when the small tenant began, and the
/// small tenant's latencies.
struct Flooded {
    sent: api::Sent,
    flood: usize,
    backlog: usize,
    under: Phase,
}

/// Floods the large tenant's automation `label` (its runs started under
/// `flow`), then runs the small tenant's phase `under-{label}`; waits for
/// the flood to drain before it returns, so the next phase starts clean.
async fn flood_then_small(
    bench: &Bench,
    server: &mut Server,
    large: &Tenant,
    small: &Tenant,
    label: &str,
    flow: Option<Value>,
) -> anyhow::Result<Flooded> {
    let api = &server.api.clone();
    let flood_source = api.source(large, label).await?;
    let flood_automation = api
        .automation_with_flow(
            large,
            label,
            &flood_source,
            steps::steps(Kind::Queued),
            flow,
        )
        .await
        .with_context(super::noop::not_registered)?;
    let flood = bench.scaled(50_000, 500);
    bench.progress.line(
        NAME,
        &format!("large tenant ({label}): {flood} webhooks as fast as possible"),
    );
    let sent = api::send_closed_loop(
        &bench.http,
        &flood_source.url,
        &format!("{}-{label}", bench.nonce),
        flood,
        bench.options().senders,
        false,
        (&bench.progress, NAME),
    )
    .await;
    server.check_alive()?;
    bench.progress.line(
        NAME,
        &format!(
            "flood accepted in {:.1} s; small tenant again: {SMALL_EVENTS} webhooks at {SMALL_RATE:.0}/s",
            sent.elapsed.as_secs_f64()
        ),
    );
    let under = small_phase(
        bench,
        api,
        small,
        (&format!("under-{label}"), short_steps()),
        TIME_LIMIT,
        NAME,
    )
    .await?;
    server.check_alive()?;
    // How many of the large tenant's runs were still to finish when the
    // small tenant began: the backlog it had to get past.
    let large_runs = api.all_runs(large, Some(&flood_automation)).await?;
    let backlog = sent.accepted
        - large_runs
            .iter()
            .filter(|r| r.finished_at.is_some_and(|f| f <= under.started_ms))
            .count()
            .min(sent.accepted);
    bench
        .progress
        .line(NAME, &format!("waiting for the {label} flood to drain"));
    api.wait_runs(
        large,
        Some(&flood_automation),
        sent.accepted,
        TIME_LIMIT,
        (&bench.progress, NAME),
    )
    .await?;
    Ok(Flooded {
        sent,
        flood,
        backlog,
        under,
    })
}

async fn measure(bench: &Bench, server: &mut Server) -> anyhow::Result<Vec<Figure>> {
    let api = &server.api.clone();
    let large = api
        .tenant(&format!("bench fairness large {}", bench.nonce))
        .await?;
    let small = api
        .tenant(&format!("bench fairness small {}", bench.nonce))
        .await?;

    bench.progress.line(
        NAME,
        &format!("small tenant alone: {SMALL_EVENTS} webhooks at {SMALL_RATE:.0}/s"),
    );
    let alone = small_phase(
        bench,
        api,
        &small,
        ("alone", short_steps()),
        Duration::from_secs(120),
        NAME,
    )
    .await?;
    let one = flood_then_small(bench, server, &large, &small, "flood", None).await?;
    // The same flood split over the shards' keys: a key's throttle far
    // above what the flood sends, so every event goes through its key's
    // row and none is held back.
    let split_flow = json!({ "throttle": { "key": "{{shard}}", "limit": 10_000, "period": "1s", "burst": 10_000 } });
    let split = flood_then_small(bench, server, &large, &small, "split", Some(split_flow)).await?;
    let mut figures = vec![figure(&alone, &one, "")];
    let split_shown = figure(&alone, &split, &format!(" over {} keys", api::SHARDS));
    // The split's own figure: its small tenant against the unsplit one's,
    // side by side in one run.
    let split_figure = match (p99(&one), p99(&split)) {
        (Some(a), Some(b)) => {
            let ratio = b / a.max(1.0);
            Figure::new(SPLIT, (ratio * 100.0).round() / 100.0, "× p99")
                .target(Target::AtMost(1.5))
                .notes(format!(
                    "small tenant's p99 under the large tenant's flood split over {} flow keys ÷ under the same flood unsplit: {b} / {a} ms; {}",
                    api::SHARDS,
                    split_shown.notes
                ))
                .details(split_shown.details)
        }
        _ => Figure::missing(SPLIT, "×", split_shown.notes).details(split_shown.details),
    };
    figures.push(split_figure);
    Ok(figures)
}

const SPLIT: &str = "fairness_split";

/// The small tenant's p99 under a flood that queued up, if it did.
fn p99(flooded: &Flooded) -> Option<f64> {
    let queued = flooded.backlog * 2 >= flooded.sent.accepted;
    (queued && !flooded.under.latencies.is_empty()).then(|| flooded.under.p(99.0))
}

/// The `fairness` figure of one flood: the small tenant's p99 under it ÷
/// alone.
fn figure(alone: &Phase, flooded: &Flooded, split: &str) -> Figure {
    let Flooded {
        sent,
        flood,
        backlog,
        under,
    } = flooded;
    let mut problems: Vec<String> = alone
        .problems
        .iter()
        .map(|p| format!("alone: {p}"))
        .chain(under.problems.iter().map(|p| format!("under flood: {p}")))
        .collect();
    if sent.errors() > 0 {
        problems.push(format!("flood: {}", sent.error_text()));
    }
    let notes = format!(
        "small tenant, {SMALL_EVENTS} runs of `set`, `{NOOP_STEP}`, `set` at {SMALL_RATE:.0}/s, event accepted → run finished: \
         alone p50 {} / p99 {} ms; with {backlog} of {} large-tenant runs (10 `{NOOP_STEP}` steps each{split}) unfinished: p50 {} / p99 {} ms{}",
        alone.p(50.0),
        alone.p(99.0),
        sent.accepted,
        under.p(50.0),
        under.p(99.0),
        if problems.is_empty() {
            String::new()
        } else {
            format!("; {}", problems.join("; "))
        }
    );
    let details = json!({
        "alone": { "p50_ms": alone.p(50.0), "p99_ms": alone.p(99.0), "runs": alone.latencies.len() },
        "under_flood": { "p50_ms": under.p(50.0), "p99_ms": under.p(99.0), "runs": under.latencies.len() },
        "flood": { "sent": flood, "accepted": sent.accepted, "seconds": sent.elapsed.as_secs_f64(), "backlog_at_start": backlog },
    });
    if alone.latencies.is_empty() || under.latencies.is_empty() {
        return Figure::missing(NAME, "×", format!("no runs finished: {notes}")).details(details);
    }
    if backlog * 2 < sent.accepted {
        return Figure::missing(
            NAME,
            "×",
            format!("not measured: the large tenant's runs did not queue up; {notes}"),
        )
        .details(details);
    }
    let ratio = under.p(99.0) / alone.p(99.0).max(1.0);
    Figure::new(NAME, (ratio * 100.0).round() / 100.0, "× p99")
        .target(Target::AtMost(2.0))
        .notes(notes)
        .details(details)
}
