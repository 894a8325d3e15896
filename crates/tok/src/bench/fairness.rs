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
const SMALL_EVENTS: usize = 50;
const SMALL_RATE: f64 = 20.0;

/// Longest wait for the small tenant's runs under the flood.
const TIME_LIMIT: Duration = Duration::from_secs(1800);

/// A short automation: a `set`, a step for a worker, a `set`.
fn short_steps() -> Vec<Value> {
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
struct Phase {
    latencies: Vec<Duration>,
    problems: Vec<String>,
    started_ms: i64,
}

impl Phase {
    fn p(&self, p: f64) -> f64 {
        ms(percentile(&self.latencies, p))
    }
}

async fn small_phase(
    bench: &Bench,
    api: &Api,
    tenant: &Tenant,
    label: &str,
    limit: Duration,
) -> anyhow::Result<Phase> {
    let source = api.source(tenant, label).await?;
    let automation = api
        .automation(tenant, label, &source, short_steps())
        .await?;
    let progress = (&bench.progress, NAME);
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

async fn measure(bench: &Bench, server: &mut Server) -> anyhow::Result<Vec<Figure>> {
    let api = &server.api.clone();
    let large = api
        .tenant(&format!("bench fairness large {}", bench.nonce))
        .await?;
    let small = api
        .tenant(&format!("bench fairness small {}", bench.nonce))
        .await?;
    let flood_source = api.source(&large, "flood").await?;
    let flood_automation = api
        .automation(&large, "flood", &flood_source, steps::steps(Kind::Queued))
        .await
        .with_context(super::noop::not_registered)?;

    bench.progress.line(
        NAME,
        &format!("small tenant alone: {SMALL_EVENTS} webhooks at {SMALL_RATE:.0}/s"),
    );
    let alone = small_phase(bench, api, &small, "alone", Duration::from_secs(120)).await?;

    let flood = bench.scaled(50_000, 500);
    bench.progress.line(
        NAME,
        &format!("large tenant: {flood} webhooks as fast as possible"),
    );
    let sent = api::send_closed_loop(
        &bench.http,
        &flood_source.url,
        &format!("{}-flood", bench.nonce),
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
    let under = small_phase(bench, api, &small, "under-flood", TIME_LIMIT).await?;
    server.check_alive()?;

    // How many of the large tenant's runs were still to finish when the
    // small tenant began: the backlog it had to get past.
    let large_runs = api.all_runs(&large, Some(&flood_automation)).await?;
    let backlog = sent.accepted
        - large_runs
            .iter()
            .filter(|r| r.finished_at.is_some_and(|f| f <= under.started_ms))
            .count()
            .min(sent.accepted);
    if server.is_external() {
        bench.progress.line(
            NAME,
            "waiting for the flood to drain from the external server",
        );
        api.wait_runs(
            &large,
            Some(&flood_automation),
            sent.accepted,
            TIME_LIMIT,
            (&bench.progress, NAME),
        )
        .await?;
    }

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
         alone p50 {} / p99 {} ms; with {backlog} of {} large-tenant runs (10 `{NOOP_STEP}` steps each) unfinished: p50 {} / p99 {} ms{}",
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
        return Ok(vec![
            Figure::missing(NAME, "×", format!("no runs finished: {notes}")).details(details),
        ]);
    }
    if backlog * 2 < sent.accepted {
        return Ok(vec![
            Figure::missing(
                NAME,
                "×",
                format!("not measured: the large tenant's runs did not queue up; {notes}"),
            )
            .details(details),
        ]);
    }
    let ratio = under.p(99.0) / alone.p(99.0).max(1.0);
    Ok(vec![
        Figure::new(NAME, (ratio * 100.0).round() / 100.0, "× p99")
            .target(Target::AtMost(2.0))
            .notes(notes)
            .details(details),
    ])
}
