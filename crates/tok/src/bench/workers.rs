//! `workers` (PostgreSQL only): one `TOK_ROLE=api` process takes the
//! webhooks, and one, two, then four `TOK_ROLE=worker` processes of 32
//! slots each (each with its own `TOK_NODE_ID`) share the queue, first
//! under a `steps-queued` load (the queue's own cost), then under an `io`
//! load (http calls to a stub answering in 20 ms: what slots waiting on
//! services gain from more processes; four should give three times one).
//! Afterwards every run of every phase is read back: a completed run must
//! have exactly ten step rows, one per path — a step recorded twice would
//! mean two workers ran it. The same step rows' times tell where each
//! load's slots spent their time: in the steps' handlers, or between one
//! step's end and its run's next step's start (the record's commit, the
//! lease kept or a claim).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use super::api::{Api, RunRow, Tenant};
use super::report::{Figure, Target};
use super::server::{ChildSpec, Database};
use super::steps::{self, Kind, STEPS_PER_RUN};
use super::{BackendKind, Bench};

const NAME: &str = "workers";

/// The worker processes of each phase, and the slots of each.
const WORKERS: [usize; 3] = [1, 2, 4];
const SLOTS: usize = 32;

/// What each phase's steps do.
#[derive(Clone, Copy, PartialEq)]
enum Load {
    /// `bench/noop` steps: the queue's own cost.
    Queued,
    /// `http` calls to a stub answering in 20 ms: slots waiting on IO.
    Io,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Queued => "steps-queued",
            Load::Io => "io",
        }
    }

    fn steps(self) -> &'static str {
        match self {
            Load::Queued => "`bench/noop` steps",
            Load::Io => "http steps to a stub answering in 20 ms",
        }
    }
}

pub(crate) async fn run(bench: &Bench) -> anyhow::Result<Vec<Figure>> {
    if bench.backend() != BackendKind::Postgres {
        return Ok(vec![Figure::missing(
            NAME,
            "steps/s",
            "PostgreSQL only: run with --database-url postgres://…",
        )]);
    }
    let Some(backend) = bench.own_backend() else {
        return Ok(vec![Figure::missing(
            NAME,
            "steps/s",
            "needs the bench's own processes (not --url)",
        )]);
    };
    let database = Database::create(backend).await?;
    let measured = measure(bench, &database).await;
    database.remove().await;
    measured
}

async fn measure(bench: &Bench, database: &Database) -> anyhow::Result<Vec<Figure>> {
    let mut children = Vec::new();
    let result = phases(bench, database, &mut children).await;
    for child in children {
        bench.keep_report(NAME, child.stop());
    }
    result
}

async fn phases(
    bench: &Bench,
    database: &Database,
    children: &mut Vec<super::server::Child>,
) -> anyhow::Result<Vec<Figure>> {
    bench.progress.update(NAME, "starting TOK_ROLE=api");
    let api_child = bench
        .start_child(
            database,
            ChildSpec {
                role: "api",
                node_id: "bench-api".into(),
                concurrency: None,
                count_statements: false,
            },
        )
        .await?;
    let api = bench.api(api_child.base.as_deref().unwrap_or_default());
    children.push(api_child);
    // The tenant exists before any worker starts: a worker reads the list
    // of tenants at start (and then only every few seconds).
    let tenant = api
        .tenant(&format!("bench workers {}", bench.nonce))
        .await?;
    let events = bench.scaled(2_000, 20);
    let stub = super::io::Stub::start().await?;
    let mut figures = Vec::new();
    let mut automations = Vec::new();
    for kind in [Load::Queued, Load::Io] {
        let mut workers: Vec<super::server::Child> = Vec::new();
        let mut one_worker = None;
        for n in WORKERS {
            let label = format!("{NAME}-{}-{n}", kind.name());
            let source = api.source(&tenant, &label).await?;
            let automation = match kind {
                Load::Queued => steps::automation(&api, &tenant, &source, Kind::Queued).await?,
                Load::Io => {
                    api.automation(&tenant, &label, &source, stub.calls())
                        .await?
                }
            };
            while workers.len() < n {
                let i = workers.len() + 1;
                bench
                    .progress
                    .update(NAME, &format!("starting TOK_ROLE=worker #{i}"));
                let worker = bench
                    .start_child(
                        database,
                        ChildSpec {
                            role: "worker",
                            node_id: format!("bench-worker-{}-{i}", kind.name()),
                            concurrency: Some(SLOTS),
                            count_statements: false,
                        },
                    )
                    .await?;
                bench.progress.line(
                    NAME,
                    &format!("tok serve (TOK_ROLE=worker) #{i} pid {}", worker.pid),
                );
                workers.push(worker);
            }
            bench.progress.line(
                NAME,
                &format!(
                    "{n} worker process(es) of {SLOTS} slots: {events} webhooks, each a run of {STEPS_PER_RUN} {}",
                    kind.steps()
                ),
            );
            let pids: Vec<u32> = children.iter().chain(&workers).map(|c| c.pid).collect();
            let load = steps::load(
                bench,
                &api,
                &tenant,
                &source,
                &automation,
                events,
                &pids,
                (&bench.progress, NAME),
            )
            .await?;
            for child in children.iter_mut().chain(workers.iter_mut()) {
                child.check_alive()?;
            }
            let rate = load.steps_per_sec();
            let versus = match one_worker {
                Some(one) => format!("{:.2}× one worker; ", rate / one),
                None => String::new(),
            };
            let one = *one_worker.get_or_insert(rate);
            let mut figure = Figure::new(&label, rate.round(), "steps/s")
                .notes(format!(
                    "TOK_ROLE=api + {n} TOK_ROLE=worker of {SLOTS} slots; {versus}{}",
                    load.describe(kind.steps())
                ))
                .details(load.details());
            if kind == Load::Io && n == 4 {
                figure = figure.target(Target::AtLeast((3.0 * one).round()));
            }
            automations.push((figures.len(), load.finished.runs));
            figures.push(figure);
        }
        // The next load starts again from one worker.
        for worker in workers {
            bench.keep_report(NAME, worker.stop());
        }
    }
    let runs: Vec<RunRow> = automations
        .iter()
        .flat_map(|(_, runs)| runs.iter().cloned())
        .filter(|r| r.status == "completed")
        .collect();
    bench.progress.line(
        NAME,
        &format!("checking the step rows of {} completed runs", runs.len()),
    );
    let (checked, wrong, example, times) = check_steps(&api, &tenant, &runs, bench).await?;
    for (figure, runs) in &automations {
        let mut load = StepTimes::default();
        for run in runs {
            if let Some(run) = times.get(&run.id) {
                load.add(run);
            }
        }
        let figure = &mut figures[*figure];
        figure.notes.push_str(&load.describe());
        if let serde_json::Value::Object(details) = &mut figure.details {
            details.insert("step_times".into(), load.details());
        }
    }
    figures.push(
        Figure::new("workers-duplicates", wrong as f64, "runs")
            .target(Target::AtMost(0.0))
            .notes(format!(
                "completed runs without exactly {STEPS_PER_RUN} step rows, one per path, of {checked} checked{}",
                example.map(|e| format!("; e.g. {e}")).unwrap_or_default()
            ))
            .details(json!({ "checked": checked, "wrong": wrong })),
    );
    Ok(figures)
}

/// Where a load's steps spent their slots' time, from the step rows'
/// times: in the step itself (its handler, `started_at` to `finished_at`),
/// and between one step's end and its run's next step's start (the
/// record's commit, the lease kept or a claim).
#[derive(Debug, Default, Clone, Copy)]
struct StepTimes {
    steps: u64,
    in_steps_ms: i64,
    gaps: u64,
    between_ms: i64,
}

impl StepTimes {
    /// A run's steps, in the order they ran.
    fn of_run(mut steps: Vec<(i64, i64)>) -> Self {
        steps.sort_unstable();
        let mut times = Self::default();
        for (i, (started, finished)) in steps.iter().enumerate() {
            times.steps += 1;
            times.in_steps_ms += finished - started;
            if let Some((next, _)) = steps.get(i + 1) {
                times.gaps += 1;
                times.between_ms += next - finished;
            }
        }
        times
    }

    fn add(&mut self, other: &Self) {
        self.steps += other.steps;
        self.in_steps_ms += other.in_steps_ms;
        self.gaps += other.gaps;
        self.between_ms += other.between_ms;
    }

    fn mean(total: i64, count: u64) -> f64 {
        if count == 0 {
            return 0.0;
        }
        total as f64 / count as f64
    }

    fn describe(&self) -> String {
        format!(
            "; a step took {:.1} ms in its handler, and {:.1} ms passed from its end to its run's next step's start (step rows' times, {} steps)",
            Self::mean(self.in_steps_ms, self.steps),
            Self::mean(self.between_ms, self.gaps),
            self.steps
        )
    }

    fn details(&self) -> serde_json::Value {
        json!({
            "steps": self.steps,
            "mean_in_step_ms": Self::mean(self.in_steps_ms, self.steps),
            "mean_between_steps_ms": Self::mean(self.between_ms, self.gaps),
        })
    }
}

/// What [`check_steps`] found: runs checked, runs wrong, an example of a
/// wrong one, and each run's step times by run id.
type Checked = (usize, usize, Option<String>, HashMap<String, StepTimes>);

/// Reads every run's steps, 16 requests at a time.
async fn check_steps(
    api: &Api,
    tenant: &Tenant,
    runs: &[RunRow],
    bench: &Bench,
) -> anyhow::Result<Checked> {
    let ids: Arc<Vec<String>> = Arc::new(runs.iter().map(|r| r.id.clone()).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for _ in 0..16 {
        let (api, tenant, ids, next) = (api.clone(), tenant.clone(), ids.clone(), next.clone());
        readers.push(tokio::spawn(async move {
            let mut problems = Vec::new();
            let mut times = HashMap::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else {
                    return Ok::<_, anyhow::Error>((problems, times));
                };
                let detail = api.run(&tenant, id).await?;
                let steps = detail["steps"].as_array().cloned().unwrap_or_default();
                let at = |step: &serde_json::Value, field: &str| {
                    step[field]
                        .as_str()
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .map(|t| t.as_millisecond())
                };
                let spans = steps
                    .iter()
                    .filter_map(|s| Some((at(s, "started_at")?, at(s, "finished_at")?)))
                    .collect();
                times.insert(id.clone(), StepTimes::of_run(spans));
                let mut paths: Vec<&str> =
                    steps.iter().filter_map(|s| s["path"].as_str()).collect();
                paths.sort_unstable();
                let rows = paths.len();
                paths.dedup();
                if rows != STEPS_PER_RUN || paths.len() != STEPS_PER_RUN {
                    problems.push(format!(
                        "run {id} has {rows} step rows on {} paths",
                        paths.len()
                    ));
                }
            }
        }));
    }
    let mut problems = Vec::new();
    let mut times = HashMap::new();
    for reader in readers {
        while !reader.is_finished() {
            let done = next.load(Ordering::Relaxed).min(ids.len());
            bench
                .progress
                .update(NAME, &format!("checked {done} of {} runs", ids.len()));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let (found, timed) = reader.await??;
        problems.extend(found);
        times.extend(timed);
    }
    Ok((
        ids.len(),
        problems.len(),
        problems.into_iter().next(),
        times,
    ))
}

#[cfg(test)]
mod tests {
    use super::StepTimes;

    #[test]
    fn a_runs_step_times_split_into_its_steps_and_the_gaps_between_them() {
        // Read back in any order: 50-70, then 100-120, then 125-150.
        let run = StepTimes::of_run(vec![(100, 120), (125, 150), (50, 70)]);
        assert_eq!((run.steps, run.in_steps_ms), (3, 65));
        assert_eq!((run.gaps, run.between_ms), (2, 35));
        let mut load = StepTimes::default();
        load.add(&run);
        load.add(&StepTimes::of_run(vec![(0, 10)]));
        assert_eq!(
            load.describe(),
            "; a step took 18.8 ms in its handler, and 17.5 ms passed from its end to its \
             run's next step's start (step rows' times, 4 steps)"
        );
    }
}
