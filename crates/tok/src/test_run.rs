//! `tok test FILE --event EVENT.json [--responses R.json] [--record]
//! [--arrivals A.json]`: one run of an automation on the real engine,
//! start to end, in seconds.
//!
//! What runs is what `tok serve` runs: the same engine, decider, step
//! handlers and HTTP API, on a SQLite store of its own in a temporary
//! directory (in memory where `/dev/shm` is), removed at the end. FILE is
//! applied as `tok apply` applies it, through the API. Only two things
//! differ from a server:
//!
//! - **The clock is virtual.** When nothing is left to do but wait (no
//!   event undispatched, no job held by a worker, the next job due later),
//!   the store's clock and the process's move to that job's due time
//!   (`SqliteStore::advance_clock`): a `wait` of three days, a retry's
//!   backoff, a wait's timeout and its escalations pass at once, in the
//!   order and with the times a server would give them.
//! - **Connector calls can be answered from a file.** With `--responses`,
//!   each `http` call and `mcp` tool call is answered by the recording
//!   ([`tok_engine::recorded`]); a call it has no answer for fails its
//!   step. With `--record` too, the services are called (through the
//!   outbound guard, `TOK_OUTBOUND_ALLOW` applies) and what they answered
//!   is written to that file.
//! - **What arrives while it waits can be said.** With `--arrivals`, signals
//!   and approval decisions come at times of the run's clock, or as soon
//!   as the run waits for them ([`arrivals`]), through the test's own API.
//!
//! The run starts as its trigger would start it: a webhook automation
//! from an event accepted for its source (the source's params extracted
//! from EVENT as the webhook does); any other by hand, with EVENT as its
//! input. Each step is printed with its status, error, output and log;
//! the exit code is 0 when the run completed and 1 otherwise.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use serde_json::Value;
use tok_core::ids::{RunId, SourceId, TenantId};
use tok_engine::recorded::{Answers, Recording};
use tok_engine::{Engine, EngineConfig, OutboundAllow, Registry};
use tok_server::AppState;
use tok_store::{
    DefinitionStore as _, InboxStore as _, NewEvent, RunFilter, RunStore as _, SqliteStore,
    StepRow, Store, hash_secret, random_token,
};

use crate::AbortOnDrop;
use crate::cli::{ApplyOptions, Client, Target};
use crate::logs::escape_controls;

mod arrivals;

use arrivals::Arrivals;

/// What `tok test` was asked for.
#[derive(Debug, Clone, clap::Args)]
pub struct TestOptions {
    /// The automation, and what it uses (sources, connections, groups,
    /// ticket types): a file or a directory, as `tok apply -f` reads it.
    pub file: PathBuf,
    /// The event that starts the run: a JSON file (a webhook's body, or a
    /// manual run's input).
    #[arg(long, value_name = "EVENT.json")]
    pub event: PathBuf,
    /// Answer the `http` steps' calls from this file instead of calling the
    /// services; with `--record`, the file to write.
    #[arg(long, value_name = "R.json")]
    pub responses: Option<PathBuf>,
    /// Call the real services once and write their answers to the
    /// `--responses` file.
    #[arg(long, requires = "responses")]
    pub record: bool,
    /// Signals and approval decisions that arrive while the run waits, at
    /// times of the run's clock or as soon as it waits for them
    /// (docs/workflows.md, "Testing an automation").
    #[arg(long, value_name = "A.json")]
    pub arrivals: Option<PathBuf>,
    /// Which automation to run, when FILE holds more than one.
    #[arg(long)]
    pub automation: Option<String>,
    /// Wall-clock time the run may take before the test gives up.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    tok_core::duration::parse_duration(text).map_err(|e| e.to_string())
}

/// How long the loop sleeps while the engine has something to do.
const BUSY_PAUSE: Duration = Duration::from_millis(10);

/// Runs the test; `Ok(true)` when the run completed. What it prints goes
/// to `out`.
pub async fn run(
    options: &TestOptions,
    registry: Registry,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let event = read_event(&options.event)?;
    let mut arrivals = match &options.arrivals {
        Some(path) => Arrivals::load(path)?,
        None => Arrivals::default(),
    };
    let answers = match (&options.responses, options.record) {
        (Some(_), true) => Answers::Record(Arc::new(Recording::new())),
        (Some(path), false) => {
            Answers::Replay(Arc::new(Recording::load(path).map_err(|e| anyhow!(e))?))
        }
        (None, _) => Answers::Live,
    };
    let outbound = match std::env::var("TOK_OUTBOUND_ALLOW") {
        Ok(text) => OutboundAllow::parse(&text).map_err(|e| anyhow!("TOK_OUTBOUND_ALLOW: {e}"))?,
        Err(_) => OutboundAllow::default(),
    };
    let dir = Scratch::new()?;
    let url = format!("sqlite://{}", dir.0.join("tok.db").display());
    let sqlite = Arc::new(
        SqliteStore::open(&url)
            .await
            .context("could not open the test's own SQLite store")?,
    );
    let store: Arc<dyn Store> = sqlite.clone();
    store.migrate().await.context("migrations failed")?;
    let api_key = format!("tok_{}", random_token());
    let tenant = store
        .create_tenant("tok test", &hash_secret(&api_key))
        .await?
        .id;

    let mut registry = registry;
    registry.add_answered_connectors(store.clone(), &outbound, answers.clone());
    let engine = Engine::new(
        store.clone(),
        registry,
        EngineConfig {
            node_id: "tok-test".into(),
            poll_interval: BUSY_PAUSE,
            // Every step's input and output is kept, to be printed.
            step_sample: 1.0,
            outbound: outbound.clone(),
            ..EngineConfig::default()
        },
    );
    let running = engine.start(true).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let state = AppState::new(engine.clone(), &base);
    state.set_ready();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, tok_server::app(state)).await;
    });
    let _server = AbortOnDrop(server);

    let client = Client::new(&Target {
        url: base,
        api_key,
        tenant: None,
    })?;
    let mut applied = Vec::new();
    let apply = ApplyOptions {
        path: options.file.clone(),
        dry_run: false,
        prune: false,
        secrets: false,
    };
    crate::cli::apply(&client, &apply, &mut applied)
        .await
        .with_context(|| format!("{} could not be applied", options.file.display()))?;
    engine.refresh_tenants().await?;

    let automation = pick(&*store, &tenant, options.automation.as_deref()).await?;
    let definitions: Vec<Value> = store
        .automations(&tenant)
        .await?
        .into_iter()
        .map(|a| a.definition)
        .collect();
    arrivals.check_steps(&definitions)?;
    let started_wall = Instant::now();
    let started_clock = tok_store::now_ms();
    let run_id = start(&engine, &sqlite, &tenant, &automation, event).await?;
    let outcome = follow(
        &sqlite,
        &*store,
        &Followed {
            tenant: &tenant,
            run_id: &run_id,
            started_ms: started_clock,
            client: &client,
        },
        &mut arrivals,
        options.timeout,
    )
    .await;
    running.shutdown().await;
    let detail = store
        .run(&tenant, &run_id)
        .await?
        .ok_or_else(|| anyhow!("run {run_id} is gone"))?;
    let virtual_ms = tok_store::now_ms() - started_clock;
    writeln!(
        out,
        "run {run_id} of \"{}\" (version {}): {}",
        automation.name, detail.run.version, detail.run.status
    )?;
    for step in &detail.steps {
        print_step(out, step)?;
    }
    if let Some(error) = &detail.run.error {
        writeln!(out, "error: {}", escape_controls(error))?;
    }
    writeln!(
        out,
        "{} of wall time, {} on the run's clock",
        shown(started_wall.elapsed().as_millis() as i64),
        shown(virtual_ms)
    )?;
    let (arrived, all_taken) = arrivals.report(&detail);
    for line in arrived {
        writeln!(out, "{}", escape_controls(&line))?;
    }
    if let Some(note) = outcome? {
        writeln!(out, "{}", escape_controls(&note))?;
    }
    if let (Answers::Record(recording), Some(path)) = (&answers, &options.responses) {
        recording.save(path).map_err(|e| anyhow!(e))?;
        writeln!(
            out,
            "recorded {} answer(s) to {}",
            recording.len(),
            path.display()
        )?;
    }
    Ok(detail.run.status == "completed" && all_taken)
}

fn read_event(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the event file {}", path.display()))?;
    let event: Value = serde_json::from_str(&text).map_err(|e| {
        anyhow!(
            "{} is not JSON: {e} (line {}, column {})",
            path.display(),
            e.line(),
            e.column()
        )
    })?;
    if !event.is_object() {
        bail!(
            "{} holds {}, not a JSON object: an event is an object (a webhook's body, or a \
             manual run's input)",
            path.display(),
            tok_core::builtin::json_kind(&event)
        );
    }
    Ok(event)
}

/// The automation to run: the one FILE holds, or the one `--automation`
/// names.
async fn pick(
    store: &dyn Store,
    tenant: &TenantId,
    name: Option<&str>,
) -> anyhow::Result<tok_store::AutomationRow> {
    let mut automations = store.automations(tenant).await?;
    let names = || {
        automations
            .iter()
            .map(|a| format!("\"{}\"", a.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(name) => match automations.iter().position(|a| a.name == name) {
            Some(i) => Ok(automations.swap_remove(i)),
            None => bail!(
                "--automation \"{name}\": the file holds no automation of that name (it holds {})",
                names()
            ),
        },
        None if automations.len() == 1 => Ok(automations.remove(0)),
        None if automations.is_empty() => bail!("the file holds no automation to test"),
        None => bail!(
            "the file holds {} automations ({}): name the one to test with --automation",
            automations.len(),
            names()
        ),
    }
}

/// Starts the run as its trigger would: a webhook's from an event accepted
/// for its source, any other by hand.
async fn start(
    engine: &Engine,
    store: &SqliteStore,
    tenant: &TenantId,
    automation: &tok_store::AutomationRow,
    event: Value,
) -> anyhow::Result<RunId> {
    let trigger = &automation.definition["trigger"];
    if trigger["kind"] != "webhook" {
        return Ok(engine
            .start_run(tenant, &automation.id, event, None)
            .await?);
    }
    let source_id = SourceId::from(trigger["source"].as_str().unwrap_or_default().to_owned());
    let source = store
        .source(tenant, &source_id)
        .await?
        .ok_or_else(|| anyhow!("the automation's source {source_id} does not exist"))?;
    let declared: Vec<tok_core::contract::Param> =
        serde_json::from_value(source.params.clone()).unwrap_or_default();
    let params = tok_core::contract::extract(&declared, &event).map_err(|e| {
        anyhow!(
            "the event does not match source \"{}\"'s params: {e}",
            source.name
        )
    })?;
    let (event_id, _) = store
        .accept_event(
            tenant,
            NewEvent {
                source_id: Some(source.id.clone()),
                source_kind: "webhook".into(),
                idempotency_key: format!("tok-test:{}", random_token()),
                payload: event,
                params: Value::Object(params),
                ..NewEvent::default()
            },
        )
        .await?;
    engine.event_accepted(tenant);
    // The dispatcher starts the run (or, when the trigger's filter or the
    // flow control says so, does not).
    let deadline = Instant::now() + Duration::from_secs(10);
    let filter = RunFilter {
        event_id: Some(event_id.to_string()),
        automation_id: Some(automation.id.to_string()),
        ..RunFilter::default()
    };
    loop {
        // What is left is read before the runs: an event found dispatched
        // has its run (written in the same transaction) seen below.
        let left = store.work_left(tenant).await?;
        let page = store.runs(tenant, &filter, 1, None).await?;
        if let Some(run) = page.items.into_iter().next() {
            return Ok(run.id);
        }
        if !left.busy || Instant::now() > deadline {
            bail!(
                "the event started no run of \"{}\": its trigger's filter or flow control kept \
                 it out",
                automation.name
            );
        }
        tokio::time::sleep(BUSY_PAUSE).await;
    }
}

/// The run a test follows, and how it reaches the test's API.
struct Followed<'a> {
    tenant: &'a TenantId,
    run_id: &'a RunId,
    /// The run's start on its clock: what an arrival's `at` counts from.
    started_ms: i64,
    client: &'a Client,
}

/// Waits for the run to end, moving the clock whenever waiting is all that
/// is left, and sending the arrivals as they come. `Ok(Some(note))`: it
/// did not end, and why.
async fn follow(
    sqlite: &SqliteStore,
    store: &dyn Store,
    followed: &Followed<'_>,
    arrivals: &mut Arrivals,
    timeout: Duration,
) -> anyhow::Result<Option<String>> {
    let Followed {
        tenant,
        run_id,
        started_ms,
        client,
    } = *followed;
    let deadline = Instant::now() + timeout;
    loop {
        // What is left is read before the run: a run found waiting when
        // nothing was left to do is still waiting (nothing moves it), so
        // what it waits for is what arrives next.
        let left = sqlite.work_left(tenant).await?;
        let run = store
            .run(tenant, run_id)
            .await?
            .ok_or_else(|| anyhow!("run {run_id} is gone"))?;
        if matches!(
            run.run.status.as_str(),
            "completed" | "failed" | "cancelled" | "refused"
        ) {
            return Ok(None);
        }
        if Instant::now() > deadline {
            return Ok(Some(format!(
                "the run did not end within {} of wall time (--timeout)",
                shown(timeout.as_millis() as i64)
            )));
        }
        // Settled: nothing in flight, nothing due now. Only then may
        // something arrive, or the clock move.
        let settled = !left.busy && left.next_due_ms.is_none_or(|due| due > left.now_ms);
        if !settled {
            tokio::time::sleep(BUSY_PAUSE).await;
            continue;
        }
        let now = left.now_ms - started_ms;
        let sent = arrivals.deliver(client, &run, now).await?;
        if arrivals.refused() {
            return Ok(Some(
                "an arrival was refused (said above); the test stops there".to_owned(),
            ));
        }
        if sent > 0 {
            // The engine takes what came before anything else happens.
            tokio::time::sleep(BUSY_PAUSE).await;
            continue;
        }
        let next_arrival = arrivals.next_at().map(|at| at + started_ms);
        match [left.next_due_ms, next_arrival].into_iter().flatten().min() {
            Some(next) => {
                sqlite.advance_clock(next - left.now_ms).await?;
            }
            None => {
                let waits: Vec<String> = run
                    .waits
                    .iter()
                    .map(|w| format!("{} `{}` at step {}", w.kind, w.key, w.path))
                    .collect();
                let pending = arrivals.pending();
                let nothing_comes = if arrivals.is_empty() {
                    "a signal or an approval would move it (--arrivals says what arrives)"
                        .to_owned()
                } else if pending.is_empty() {
                    "every arrival of --arrivals came".to_owned()
                } else {
                    format!(
                        "what is still to arrive does not match what it waits for: {}",
                        pending.join("; ")
                    )
                };
                return Ok(Some(format!(
                    "the run is {} and nothing it waits for has a deadline ({}): {nothing_comes}",
                    run.run.status,
                    if waits.is_empty() {
                        "no wait recorded".to_owned()
                    } else {
                        waits.join("; ")
                    }
                )));
            }
        }
    }
}

fn print_step(out: &mut impl Write, step: &StepRow) -> anyhow::Result<()> {
    let attempt = if step.attempt > 1 {
        format!(", attempt {}", step.attempt)
    } else {
        String::new()
    };
    writeln!(
        out,
        "  {:<10} {} {} ({}{attempt})",
        step.status, step.path, step.step_id, step.kind
    )?;
    if let Some(error) = &step.error {
        writeln!(out, "      error: {}", escape_controls(error))?;
    }
    if let Some(output) = step.output.as_ref().filter(|o| !o.is_null()) {
        writeln!(out, "      output: {}", clipped(&output.to_string(), 400))?;
    }
    let lines: Vec<String> = match &step.log {
        Value::Array(lines) => lines
            .iter()
            .map(|l| l.as_str().map_or_else(|| l.to_string(), str::to_owned))
            .collect(),
        Value::Null => Vec::new(),
        other => vec![other.to_string()],
    };
    for line in lines {
        writeln!(out, "      log: {}", escape_controls(&clipped(&line, 400)))?;
    }
    Ok(())
}

fn clipped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// `3d 0h`, `2m 5s`, `340 ms`: a span a person reads at a glance.
fn shown(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        _ if ms < 1000 => format!("{ms} ms"),
        _ if s < 60 => format!("{}.{} s", s, (ms % 1000) / 100),
        _ if s < 3600 => format!("{}m {}s", s / 60, s % 60),
        _ if s < 86_400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// The test's own directory, removed when it ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Self> {
        let shm = Path::new("/dev/shm");
        let root = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = root.join(format!("tok-test-{}", &random_token()[..12]));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the test's directory {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_at_a_glance() {
        assert_eq!(shown(340), "340 ms");
        assert_eq!(shown(2_500), "2.5 s");
        assert_eq!(shown(125_000), "2m 5s");
        assert_eq!(shown(3 * 86_400_000 + 1), "3d 0h");
    }

    #[test]
    fn an_event_that_is_not_an_object_is_refused_with_what_it_is() {
        let dir = std::env::temp_dir().join(format!("tok-event-{}", &random_token()[..8]));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("event.json");
        std::fs::write(&path, "[1, 2]").unwrap();
        let error = read_event(&path).unwrap_err().to_string();
        assert!(
            error.contains("holds an array, not a JSON object"),
            "{error}"
        );
        std::fs::write(&path, "{\"a\": ").unwrap();
        let error = read_event(&path).unwrap_err().to_string();
        assert!(error.contains("is not JSON"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
