//! `bulk`: a tenant's live run latency while a bulk retry of its failed
//! runs goes on, against the same tenant with no operation running.
//!
//! The tenant first has 1,500 runs (scaled) fail: one `bench/noop` step
//! that holds its worker 200 ms, like a call to a slow service, and fails.
//! Then, alone, 50 live runs (`set`, three `bench/noop`, `set`) started by
//! hand (`POST /api/automations/{id}/runs`) at about 20/s; a run's latency
//! is from the start's 201 to the run's `finished_at`. Then the bulk retry
//! of every failed run (`POST /api/runs/bulk`) and, at once, 50 live runs
//! again. The figure is the ratio of the two p95s: how much a bulk
//! operation slows its own tenant's live work. The retried runs outlast
//! the workers and queue up (they fail again). The live runs are manual
//! starts because their first job waits in the queue like the retried
//! runs' (a webhook's run may be handed to a free slot by the dispatch,
//! past the queue).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;

use super::api::{self, Api, Tenant};
use super::fairness::{Phase, SMALL_EVENTS, SMALL_RATE};
use super::report::Figure;
use super::report::Target;
use super::{Bench, NOOP_STEP, Server};

const NAME: &str = "bulk";

/// How long a failing run's step holds its worker, as a call to a slow
/// service would: the retried runs then queue up behind the workers.
const SLOW_MS: u64 = 200;

/// Longest wait for a phase's runs, and for the operation to end.
const TIME_LIMIT: Duration = Duration::from_secs(900);

/// A live run: a `set`, three steps for a worker, a `set`.
fn live_steps() -> Vec<serde_json::Value> {
    vec![
        json!({ "id": "s1", "type": "set", "config": { "values": { "v1": "{{n}}" } } }),
        json!({ "id": "s2", "type": NOOP_STEP, "config": {} }),
        json!({ "id": "s3", "type": NOOP_STEP, "config": {} }),
        json!({ "id": "s4", "type": NOOP_STEP, "config": {} }),
        json!({ "id": "s5", "type": "set", "config": { "values": { "v5": "{{s1.v1}}" } } }),
    ]
}

pub(crate) async fn run(bench: &Bench) -> anyhow::Result<Vec<Figure>> {
    let mut server = bench.server(NAME, None).await?;
    let measured = measure(bench, &mut server).await;
    bench.release(NAME, server).await;
    measured
}

async fn measure(bench: &Bench, server: &mut Server) -> anyhow::Result<Vec<Figure>> {
    let api = &server.api.clone();
    let tenant = api.tenant(&format!("bench bulk {}", bench.nonce)).await?;
    let failing = bench.scaled(1500, 100);
    let source = api.source(&tenant, "failing").await?;
    let flaky = api
        .automation(
            &tenant,
            "failing",
            &source,
            vec![json!({ "id": "s1", "type": NOOP_STEP, "config": { "sleepMs": SLOW_MS, "fail": "bench: a run to retry" } })],
        )
        .await
        .with_context(super::noop::not_registered)?;
    bench.progress.line(
        NAME,
        &format!("{failing} runs that fail, as fast as possible"),
    );
    let sent = api::send_closed_loop(
        &bench.http,
        &source.url,
        &format!("{}-failing", bench.nonce),
        failing,
        bench.options().senders,
        false,
        (&bench.progress, NAME),
    )
    .await;
    let failed = api
        .wait_runs(
            &tenant,
            Some(&flaky),
            sent.accepted,
            TIME_LIMIT,
            (&bench.progress, NAME),
        )
        .await?;
    let failed = failed.runs.iter().filter(|r| r.status == "failed").count();
    server.check_alive()?;

    bench.progress.line(
        NAME,
        &format!("live runs alone: {SMALL_EVENTS} manual starts at {SMALL_RATE:.0}/s"),
    );
    let alone = manual_phase(bench, api, &tenant, "alone").await?;

    let operation = retry_all(api, &tenant, &flaky).await?;
    let retry_started = Instant::now();
    bench.progress.line(
        NAME,
        &format!("bulk retry of {failed} failed runs ({operation}); live runs again"),
    );
    let during = manual_phase(bench, api, &tenant, "during").await?;
    server.check_alive()?;
    let retry_seconds = wait_operation(api, &tenant, &operation).await?;
    let retry_total = retry_started.elapsed().as_secs_f64().max(retry_seconds);
    Ok(vec![figure(&alone, &during, failed, retry_total)])
}

/// [`SMALL_EVENTS`] manual starts of a live automation `label`, at
/// [`SMALL_RATE`]: their latencies, from the start's answer to the run's
/// end.
async fn manual_phase(
    bench: &Bench,
    api: &Api,
    tenant: &Tenant,
    label: &str,
) -> anyhow::Result<Phase> {
    let definition =
        json!({ "name": label, "trigger": { "kind": "manual" }, "steps": live_steps() });
    let created = api
        .send(
            api.http
                .post(format!("{}/api/automations", api.base))
                .bearer_auth(&tenant.key)
                .json(&definition),
            &format!("create the automation `{label}`"),
        )
        .await?;
    let automation = created["id"]
        .as_str()
        .context("an automation without id")?
        .to_owned();
    let started_ms = api::epoch_ms();
    let gap = Duration::from_secs_f64(1.0 / SMALL_RATE);
    let mut started = HashMap::new();
    let mut problems = Vec::new();
    for n in 0..SMALL_EVENTS {
        let at = Instant::now();
        let answer = api
            .send(
                api.http
                    .post(format!("{}/api/automations/{automation}/runs", api.base))
                    .bearer_auth(&tenant.key)
                    .json(&json!({ "input": { "n": n } })),
                "start a live run",
            )
            .await;
        match answer {
            Ok(answer) => {
                let run = answer["run_id"].as_str().unwrap_or_default().to_owned();
                started.insert(run, api::epoch_ms());
            }
            Err(e) => problems.push(e.to_string()),
        }
        tokio::time::sleep(gap.saturating_sub(at.elapsed())).await;
    }
    let finished = api
        .wait_runs(
            tenant,
            Some(&automation),
            started.len(),
            TIME_LIMIT,
            (&bench.progress, NAME),
        )
        .await?;
    let mut latencies: Vec<Duration> = finished
        .completed()
        .filter_map(|run| {
            let accepted = started.get(run.id.as_str())?;
            let done = run.finished_at?;
            Some(Duration::from_millis((done - accepted).max(0) as u64))
        })
        .collect();
    latencies.sort();
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

/// Starts the bulk retry of the automation's failed runs; its id.
async fn retry_all(api: &Api, tenant: &Tenant, automation: &str) -> anyhow::Result<String> {
    let body = json!({
        "filter": { "status": "failed", "automation": automation },
        "action": "retry",
        "version": "original",
    });
    let response = api
        .http
        .post(format!("{}/api/runs/bulk", api.base))
        .bearer_auth(&tenant.key)
        .json(&body)
        .send()
        .await
        .context("start the bulk retry")?;
    let status = response.status();
    let answer: serde_json::Value = response.json().await.context("the bulk retry's answer")?;
    if !status.is_success() {
        anyhow::bail!("the bulk retry was refused ({status}): {answer}");
    }
    answer["operation_id"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("a bulk retry without id: {answer}"))
}

/// Waits for the operation to end; how long it ran, by its own row.
async fn wait_operation(api: &Api, tenant: &Tenant, id: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    loop {
        let operation: serde_json::Value = api
            .http
            .get(format!("{}/api/operations/{id}", api.base))
            .bearer_auth(&tenant.key)
            .send()
            .await
            .context("read the bulk retry")?
            .json()
            .await
            .context("the bulk retry's row")?;
        if operation["status"] != "running" {
            return Ok(started.elapsed().as_secs_f64());
        }
        if started.elapsed() > TIME_LIMIT {
            anyhow::bail!("the bulk retry was still running after {TIME_LIMIT:?}: {operation}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Live p95 during the retry ÷ alone.
fn figure(alone: &Phase, during: &Phase, retried: usize, seconds: f64) -> Figure {
    let problems: Vec<String> = alone
        .problems
        .iter()
        .map(|p| format!("alone: {p}"))
        .chain(during.problems.iter().map(|p| format!("during: {p}")))
        .collect();
    let notes = format!(
        "{SMALL_EVENTS} live runs of `set`, three `{NOOP_STEP}`, `set` started by hand at {SMALL_RATE:.0}/s, start answered → run finished: \
         alone p50 {} / p95 {} ms; during a bulk retry of {retried} runs of the same tenant \
         (done in {seconds:.1} s): p50 {} / p95 {} ms{}",
        alone.p(50.0),
        alone.p(95.0),
        during.p(50.0),
        during.p(95.0),
        if problems.is_empty() {
            String::new()
        } else {
            format!("; {}", problems.join("; "))
        }
    );
    let details = json!({
        "alone": { "p50_ms": alone.p(50.0), "p95_ms": alone.p(95.0), "runs": alone.latencies.len() },
        "during": { "p50_ms": during.p(50.0), "p95_ms": during.p(95.0), "runs": during.latencies.len() },
        "retry": { "runs": retried, "seconds": seconds },
    });
    if alone.latencies.is_empty() || during.latencies.is_empty() || retried == 0 {
        return Figure::missing(NAME, "×", format!("not measured: {notes}")).details(details);
    }
    let ratio = during.p(95.0) / alone.p(95.0).max(1.0);
    Figure::new(NAME, (ratio * 100.0).round() / 100.0, "× p95")
        .target(Target::AtMost(1.5))
        .notes(notes)
        .details(details)
}
