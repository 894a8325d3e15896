//! Hostile templates: configs made from a seed that render what a sender
//! controls over and over — a field repeated up to thousands of times,
//! structures nested deep with placeholders at their leaves, lone
//! placeholders of big values (`"{{_body}}"`, `"{{_body.rows}}"`) in big
//! arrays — placed in every templated step type (`flow/log`, `set`,
//! `loop`, `end`, `condition`, `http`, `emit`) and in what the dispatcher
//! renders itself (a trigger filter, a flow key), then started by a webhook
//! (the dispatcher runs the leading control steps) or by hand (a worker
//! does), against bodies of up to 100 KB strings, 140 KB arrays and deep
//! objects.
//!
//! Every case must end in a completed run, or in a failed run whose error
//! names a byte budget: `render_budget_exceeded` (the rendering's), or a
//! step's output or state limit. Memory stays bounded, which the answers
//! show: a budget error says how far rendering had come when it stopped
//! (never more than the budget and one piece past it, where an unbounded
//! rendering would reach 100 MB), every log line and error the run's page
//! serves is within its budget, and every step the page serves is within
//! a config's, an output's and a log's budgets together.
//!
//! Case `i` is made from `seed + i`, so a failure names the one case that
//! reproduces it; `TOK_FUZZ_TEMPLATES` sets how many are sent (20 by
//! default) and `TOK_FUZZ_SEED` the seed.

use std::net::SocketAddr;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::any;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use tok_core::limits::{
    MAX_ERROR_BYTES, MAX_LOG_LINE_BYTES, MAX_OUTPUT_BYTES, MAX_RENDERED_CONFIG_BYTES,
    MAX_RENDERED_VALUE_BYTES, MAX_STEP_LOG_BYTES,
};

use crate::fuzz::env_u64;
use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual, on_webhook, plain_source};

backend_tests!(
    crate::helpers::run_with_service;
    hostile_templates_end_in_a_completed_run_or_a_budget_error,
);

const DEFAULT_CASES: u64 = 20;

const DEFAULT_SEED: u64 = 0x7e3_91a7;

/// Where a case puts its hostile template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Place {
    Log,
    Set,
    Loop,
    End,
    Condition,
    Http,
    Emit,
    Filter,
    FlowKey,
}

impl Place {
    const ALL: [Place; 9] = [
        Place::Log,
        Place::Set,
        Place::Loop,
        Place::End,
        Place::Condition,
        Place::Http,
        Place::Emit,
        Place::Filter,
        Place::FlowKey,
    ];

    /// Only a webhook's event goes through a filter or a flow key.
    fn needs_webhook(self) -> bool {
        matches!(self, Place::Filter | Place::FlowKey)
    }
}

/// Paths to values a sender controls, the big ones first.
const BIG: [&str; 4] = ["_body", "_body.rows", "_body.b", "_body.deep"];
const SMALL: [&str; 3] = ["_body.id", "_body.rows.0", "_body.deep.d.d"];

fn path(rng: &mut StdRng) -> &'static str {
    match rng.random_bool(0.8) {
        true => BIG[rng.random_range(0..BIG.len())],
        false => SMALL[rng.random_range(0..SMALL.len())],
    }
}

/// A string that repeats placeholders, with text between them now and then.
fn repeated(rng: &mut StdRng, most: usize) -> String {
    let times = rng.random_range(1..=most);
    let p = path(rng);
    let between = ["", " ", "-", "x{{_body.id}}"][rng.random_range(0..4)];
    let mut out = String::from("log ");
    for _ in 0..times {
        out.push_str("{{");
        out.push_str(p);
        out.push_str("}}");
        out.push_str(between);
    }
    out
}

/// A hostile value for a config: repetition, nesting, or lone placeholders
/// of big values in a big structure.
fn hostile(rng: &mut StdRng, depth: usize) -> Value {
    match rng.random_range(0..4) {
        // Thousands of repetitions at the top, a few deeper down.
        0 => json!(repeated(rng, if depth == 0 { 1500 } else { 8 })),
        1 if depth < 6 => {
            let width = rng.random_range(1..=4);
            match rng.random_bool(0.5) {
                true => Value::Array((0..width).map(|_| hostile(rng, depth + 1)).collect()),
                false => Value::Object(
                    (0..width)
                        .map(|i| (format!("k{i}"), hostile(rng, depth + 1)))
                        .collect::<Map<_, _>>(),
                ),
            }
        }
        2 => {
            let count = rng.random_range(1..=60);
            let p = path(rng);
            Value::Array((0..count).map(|_| json!(format!("{{{{{p}}}}}"))).collect())
        }
        _ => json!(format!("{{{{{}}}}}", path(rng))),
    }
}

/// A string form of a hostile template (where only a string fits).
fn hostile_text(rng: &mut StdRng) -> String {
    match rng.random_bool(0.7) {
        true => repeated(rng, 1500),
        false => format!("{{{{{}}}}}", path(rng)),
    }
}

/// A body a sender controls, within a webhook's 256 KiB: a string of up
/// to 100 KB, an array of up to 1,400 rows of about 100 bytes, an object
/// 40 levels deep.
fn body(rng: &mut StdRng, n: u64) -> Value {
    let rows: Vec<Value> = (0..rng.random_range(0..=1400))
        .map(|i| json!({ "n": i, "pad": "p".repeat(80) }))
        .collect();
    let mut deep = json!("bottom");
    for _ in 0..40 {
        deep = json!({ "d": deep, "s": "s".repeat(200) });
    }
    json!({
        "id": n,
        "b": "A".repeat(rng.random_range(1..=100_000)),
        "rows": rows,
        "deep": deep,
    })
}

/// The automation of a case: its steps, and what goes beside them.
fn automation(rng: &mut StdRng, place: Place, service: SocketAddr, source: Option<&str>) -> Value {
    let definition = |steps: Value| match source {
        Some(source) => on_webhook("hostile", source, &steps),
        None => manual("hostile", &steps),
    };
    let tail = log_step("st_after", "after {{_body.id}}");
    match place {
        Place::Log => definition(json!([
            { "id": "st_h", "type": "flow/log", "config": { "message": hostile_text(rng) } }, tail
        ])),
        Place::Set => definition(json!([
            { "id": "st_h", "type": "set", "config": { "values": { "h": hostile(rng, 0) } } }, tail
        ])),
        Place::Loop => definition(json!([
            { "id": "st_h", "type": "loop", "config": { "items": [hostile(rng, 0)] },
              "do": [log_step("st_each", "item")] }, tail
        ])),
        Place::End => definition(json!([
            { "id": "st_h", "type": "end", "config": { "output": hostile(rng, 0) } }
        ])),
        Place::Condition => {
            let rules: Vec<Value> = (0..rng.random_range(1..=50))
                .map(|i| json!({ "field": path(rng), "operator": "neq", "value": hostile(rng, i) }))
                .collect();
            definition(json!([
                { "id": "st_h", "type": "condition", "match": "any", "rules": rules,
                  "then": [log_step("st_then", "then")], "else": [log_step("st_else", "else")] },
                tail
            ]))
        }
        Place::Http => definition(json!([
            { "id": "st_h", "type": "http", "config": {
                "method": "POST", "url": format!("http://{service}/echo"), "timeoutMs": 5000,
                "body": hostile(rng, 0) } },
            tail
        ])),
        Place::Emit => definition(json!([
            { "id": "st_h", "type": "emit", "config": { "event": "fuzz.emitted", "payload": { "h": hostile(rng, 0) } } },
            tail
        ])),
        Place::Filter => {
            let mut d = definition(json!([tail]));
            let rules: Vec<Value> = (0..rng.random_range(1..=50))
                .map(|i| json!({ "field": path(rng), "operator": "eq", "value": hostile(rng, i) }))
                .chain([json!({ "field": "_body.id", "operator": "isNotEmpty" })])
                .collect();
            d["trigger"]["filter"] = json!({ "match": "any", "rules": rules });
            d
        }
        Place::FlowKey => {
            let mut d = definition(json!([tail]));
            d["flow"] = json!({ "singleton": { "key": hostile_text(rng), "mode": "skip" },
                                "priority": hostile_text(rng) });
            d
        }
    }
}

/// What a case ended in.
#[derive(Debug, Default)]
struct Tally {
    completed: usize,
    over_budget: usize,
    over_output: usize,
}

/// The answer's run is one a case may end in, and everything it serves is
/// within its budgets; `Err` says what is wrong.
fn judge(run: &Value, tally: &mut Tally) -> Result<(), String> {
    let error = run["error"].as_str().unwrap_or_default();
    match run["status"].as_str() {
        Some("completed") => tally.completed += 1,
        Some("failed") if error.contains("render_budget_exceeded") => {
            tally.over_budget += 1;
            // "… the budget of …, at N bytes": how far rendering went.
            let reached: usize = error
                .split(", at ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("a budget error without its size: {error}"))?;
            if reached > MAX_RENDERED_CONFIG_BYTES + MAX_RENDERED_VALUE_BYTES {
                return Err(format!("rendering went on to {reached} bytes: {error}"));
            }
        }
        Some("failed")
            if error.contains("bytes of output; at most") || error.contains("state_too_large") =>
        {
            tally.over_output += 1
        }
        other => return Err(format!("ended {other:?}: {error:.500}")),
    }
    if error.len() > MAX_ERROR_BYTES + 256 {
        return Err(format!("an error of {} bytes", error.len()));
    }
    for step in run["steps"].as_array().into_iter().flatten() {
        let log = step["log"].as_array().cloned().unwrap_or_default();
        let lines: Vec<&str> = log.iter().filter_map(Value::as_str).collect();
        if let Some(long) = lines.iter().find(|l| l.len() > MAX_LOG_LINE_BYTES) {
            return Err(format!("a log line of {} bytes", long.len()));
        }
        let total: usize = lines.iter().map(|l| l.len()).sum();
        if total > MAX_STEP_LOG_BYTES {
            return Err(format!("{total} bytes of log in step {}", step["step_id"]));
        }
        let served = step.to_string().len();
        let most = MAX_RENDERED_CONFIG_BYTES + MAX_OUTPUT_BYTES + MAX_STEP_LOG_BYTES + 64 * 1024;
        if served > most {
            return Err(format!("step {} served {served} bytes", step["step_id"]));
        }
    }
    Ok(())
}

/// Answers every request with a small JSON body.
async fn serve(app: &TestApp) -> SocketAddr {
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let router = Router::new().route("/{*path}", any(async || axum::Json(json!({ "ok": true }))));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Starts case `i`; the run's id.
async fn start(
    app: &TestApp,
    tenant: &Tenant,
    rng: &mut StdRng,
    place: Place,
    service: SocketAddr,
    i: u64,
) -> String {
    let by_webhook = place.needs_webhook() || rng.random_bool(0.5);
    let payload = body(rng, i);
    // A definition within the 256 KiB a definition may have: drawn again
    // (from the same generator, so still from the seed) until it fits.
    let fitting = |rng: &mut StdRng, source: Option<&str>| loop {
        let definition = automation(rng, place, service, source);
        if definition.to_string().len() < 250_000 {
            return definition;
        }
    };
    if !by_webhook {
        let definition = fitting(rng, None);
        let id = app.create_automation(tenant, &definition).await;
        return app
            .start_run(tenant, &id, &json!({ "input": payload }))
            .await;
    }
    let source = app
        .create_source(tenant, &plain_source(&format!("src{i}")))
        .await;
    let definition = fitting(rng, source["id"].as_str());
    app.create_automation(tenant, &definition).await;
    let token = source["token"].as_str().unwrap();
    let accepted = app
        .webhook(token, &payload)
        .await
        .expect(StatusCode::ACCEPTED);
    let event = accepted["event_id"].as_str().unwrap().to_owned();
    let uri = format!("/api/events/{event}");
    app.poll(&format!("a run of event {event}"), async || {
        let event = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
        let runs = event["runs"].as_array().cloned().unwrap_or_default();
        match runs.first() {
            Some(run) => Ok(run["id"].as_str().unwrap().to_owned()),
            None => Err(()),
        }
    })
    .await
}

async fn hostile_templates_end_in_a_completed_run_or_a_budget_error(app: &TestApp) {
    let cases = env_u64("TOK_FUZZ_TEMPLATES", DEFAULT_CASES);
    let seed = env_u64("TOK_FUZZ_SEED", DEFAULT_SEED);
    let service = serve(app).await;
    let tenant = app.create_tenant("Mallory").await;
    let bystander = app.create_tenant("Bystander").await;
    let bystander_automation = app
        .create_automation(
            &bystander,
            &manual("plain", &json!([log_step("st", "fine")])),
        )
        .await;

    let mut started = Vec::new();
    let mut places = std::collections::HashSet::new();
    for i in 0..cases {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i));
        let place = Place::ALL[(i as usize + rng.random_range(0..2)) % Place::ALL.len()];
        places.insert(place);
        let run = start(app, &tenant, &mut rng, place, service, i).await;
        started.push((i, place, run));
    }
    // Another tenant's run, started while they all render.
    let bystander_run = app
        .start_run(&bystander, &bystander_automation, &json!({ "input": {} }))
        .await;

    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for (i, place, run) in &started {
        let run = app.wait_for_final(&tenant, run).await;
        if let Err(wrong) = judge(&run, &mut tally) {
            failures.push(format!(
                "case {i} (TOK_FUZZ_SEED={} TOK_FUZZ_TEMPLATES=1), {place:?}: {wrong}",
                seed.wrapping_add(*i)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases ended wrongly; the first:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "fuzz_templates ({:?}): {cases} cases: {tally:?}",
        app.backend
    );
    let done = app.wait_for_final(&bystander, &bystander_run).await;
    assert_eq!(done["status"], "completed", "{done:#}");
    if cases >= DEFAULT_CASES {
        assert_eq!(places.len(), Place::ALL.len(), "every place was tried");
        assert!(
            tally.completed > 0 && tally.over_budget > 0,
            "cases of both ends: {tally:?}"
        );
    }
}
