//! `steps` and `steps-queued`: durable steps per second end to end — events
//! sent as webhooks, each starting a run of ten steps that do no IO, until
//! every run has completed.
//!
//! `steps` uses `set`, a built-in the worker may chain inside one record
//! transaction; `steps-queued` uses `bench/noop`, an external handler, so
//! every step goes through its own claim and record. The clock starts when
//! the first webhook is sent and stops at the latest `finished_at` of the
//! runs (the server's clock, the same machine), so polling for completion
//! adds nothing to the time.

use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::api::{self, Api, Finished, Source, Tenant};
use super::report::{Figure, Progress, Target};
use super::sys::{CpuMeter, CpuUse};
use super::{BackendKind, Bench, NOOP_STEP, Server};

/// Steps per run.
pub(crate) const STEPS_PER_RUN: usize = 10;

/// Longest wait for the runs of one load.
const TIME_LIMIT: Duration = Duration::from_secs(900);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `set` steps.
    Internal,
    /// `bench/noop` steps: one claim and one record each.
    Queued,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Internal => "steps",
            Kind::Queued => "steps-queued",
        }
    }
}

/// Ten steps of the kind.
pub(crate) fn steps(kind: Kind) -> Vec<Value> {
    (1..=STEPS_PER_RUN)
        .map(|i| match kind {
            Kind::Internal => json!({
                "id": format!("s{i}"), "type": "set",
                "config": { "values": { format!("v{i}"): "{{n}}" } }
            }),
            Kind::Queued => json!({ "id": format!("s{i}"), "type": NOOP_STEP, "config": {} }),
        })
        .collect()
}

/// Creates the automation, with a hint when the server lacks `bench/noop`.
pub(crate) async fn automation(
    api: &Api,
    tenant: &Tenant,
    source: &Source,
    kind: Kind,
) -> anyhow::Result<String> {
    let created = api
        .automation(tenant, kind.name(), source, steps(kind))
        .await;
    match kind {
        Kind::Internal => created,
        Kind::Queued => created.with_context(super::noop::not_registered),
    }
}

/// One load's outcome.
pub(crate) struct Load {
    pub(crate) events: usize,
    pub(crate) finished: Finished,
    /// From the first webhook sent to the last run finished.
    pub(crate) seconds: f64,
    /// How long sending the webhooks took.
    pub(crate) sending: f64,
    /// Runs that had finished when the last webhook was answered.
    pub(crate) done_while_sending: usize,
    pub(crate) sent_errors: String,
    pub(crate) cpu: Option<CpuUse>,
}

impl Load {
    pub(crate) fn steps_per_sec(&self) -> f64 {
        (self.finished.completed().count() * STEPS_PER_RUN) as f64 / self.seconds
    }

    pub(crate) fn events_per_sec(&self) -> f64 {
        self.finished.completed().count() as f64 / self.seconds
    }

    /// Steps per second after the last webhook was answered: the workers
    /// without ingest competing for the database.
    pub(crate) fn steps_per_sec_after_sending(&self) -> Option<f64> {
        let rest = self.finished.completed().count() - self.done_while_sending;
        let secs = self.seconds - self.sending;
        (rest > 0 && secs > 0.05).then(|| (rest * STEPS_PER_RUN) as f64 / secs)
    }

    /// The notes every steps-like figure shares.
    pub(crate) fn describe(&self, what: &str) -> String {
        let problems = self.finished.problems();
        format!(
            "{} events × {what} in {:.1} s: {:.0} events/s; webhooks sent in {:.1} s ({}), {} runs done by then{}{}{}",
            self.events,
            self.seconds,
            self.events_per_sec(),
            self.sending,
            self.sent_errors,
            self.done_while_sending,
            self.steps_per_sec_after_sending()
                .map(|r| format!(", {r:.0} steps/s after"))
                .unwrap_or_default(),
            if problems.is_empty() {
                String::new()
            } else {
                format!("; {problems}")
            },
            self.cpu
                .as_ref()
                .map(|c| format!("; {c}"))
                .unwrap_or_default(),
        )
    }

    pub(crate) fn details(&self) -> Value {
        json!({
            "events": self.events,
            "completed_runs": self.finished.completed().count(),
            "failed_runs": self.finished.failed,
            "steps_per_run": STEPS_PER_RUN,
            "seconds": self.seconds,
            "sending_seconds": self.sending,
            "runs_done_while_sending": self.done_while_sending,
            "steps_per_sec_after_sending": self.steps_per_sec_after_sending(),
            "steps_per_sec": self.steps_per_sec(),
            "events_per_sec": self.events_per_sec(),
            "cpu": self.cpu,
        })
    }
}

/// Sends `events` webhooks to `source` as fast as `--senders` allow and
/// waits for the automation's runs.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn load(
    bench: &Bench,
    api: &Api,
    tenant: &Tenant,
    source: &Source,
    automation: &str,
    events: usize,
    pids: &[u32],
    progress: (&Progress, &str),
) -> anyhow::Result<Load> {
    let start_ms = api::epoch_ms();
    let cpu = CpuMeter::start(pids);
    let sent = api::send_closed_loop(
        &bench.http,
        &source.url,
        &format!("{}-{automation}", bench.nonce),
        events,
        bench.options().senders,
        false,
        progress,
    )
    .await;
    let finished = api
        .wait_runs(
            tenant,
            Some(automation),
            sent.accepted,
            TIME_LIMIT,
            progress,
        )
        .await?;
    let cpu = cpu.finish();
    let end_ms = finished.last_finished_ms().unwrap_or_else(api::epoch_ms);
    let sent_ms = start_ms + sent.elapsed.as_millis() as i64;
    let done_while_sending = finished
        .completed()
        .filter(|r| r.finished_at.is_some_and(|f| f <= sent_ms))
        .count();
    Ok(Load {
        done_while_sending,
        events,
        seconds: ((end_ms - start_ms) as f64 / 1000.0).max(1e-3),
        sending: sent.elapsed.as_secs_f64(),
        sent_errors: sent.error_text(),
        finished,
        cpu,
    })
}

pub(crate) async fn run(bench: &Bench, kind: Kind) -> anyhow::Result<Vec<Figure>> {
    let name = kind.name();
    let mut server = bench.server(name, None).await?;
    let measured = measure(bench, &mut server, kind).await;
    bench.release(name, server).await;
    measured
}

async fn measure(bench: &Bench, server: &mut Server, kind: Kind) -> anyhow::Result<Vec<Figure>> {
    let name = kind.name();
    let api = &server.api.clone();
    let tenant = api.tenant(&format!("bench {name} {}", bench.nonce)).await?;
    let source = api.source(&tenant, name).await?;
    let automation = automation(api, &tenant, &source, kind).await?;
    let events = match kind {
        Kind::Internal => bench.scaled(5_000, 20),
        Kind::Queued => bench.scaled(2_000, 20),
    };
    bench.progress.line(
        name,
        &format!("{events} webhooks, each a run of {STEPS_PER_RUN} steps"),
    );
    let load = load(
        bench,
        api,
        &tenant,
        &source,
        &automation,
        events,
        &server.pids(),
        (&bench.progress, name),
    )
    .await?;
    server.check_alive()?;
    let target = match (kind, bench.backend()) {
        (Kind::Internal, BackendKind::Sqlite) => 20_000.0,
        (Kind::Internal, _) => 10_000.0,
        (Kind::Queued, _) => 5_000.0,
    };
    let what = match kind {
        Kind::Internal => "10 `set` steps",
        Kind::Queued => "10 `bench/noop` steps",
    };
    Ok(vec![
        Figure::new(name, load.steps_per_sec().round(), "steps/s")
            .target(Target::AtLeast(target))
            .notes(load.describe(what))
            .details(load.details()),
    ])
}
