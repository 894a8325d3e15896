//! Hostile JSON Schemas: made from a seed, each of one kind — subschemas
//! nested deep, `$ref` fan-out (each definition naming the one before
//! several times), a huge `enum`, huge or catastrophic patterns, many
//! `patternProperties` regexes, recursion through `$ref` (in place, which
//! never ends, or through the body with fan-out), nested
//! `unevaluatedProperties` — saved as a source's schema through `POST
//! /api/sources` as a tenant's client would. Each is either refused at save
//! (400 `invalid_schema` naming `field: schema` and a `path`) or kept; a
//! kept one is sent hostile bodies (deep, wide, long strings), each
//! answered 202, 400 `schema_violation` or 400 `schema_too_costly`: never
//! a 5xx, never a panic, and the check's work is bounded by its budget
//! (`body_schema::cost`), so the suite's own time stays small.
//!
//! Like `fuzz`, case `i` is made from `seed + i`, so a failure names the
//! one case that reproduces it; `TOK_FUZZ_SCHEMAS` sets how many are sent
//! (60 by default) and `TOK_FUZZ_SEED` the seed.

use axum::http::StatusCode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

use crate::fuzz::env_u64;
use crate::helpers::{Reply, TestApp, backend_tests};

backend_tests!(
    crate::helpers::run;
    hostile_schemas_are_refused_at_save_or_checked_within_bounds,
);

const DEFAULT_CASES: u64 = 60;

const DEFAULT_SEED: u64 = 0x5c_4e_3a;

/// The kinds of hostile schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Nesting,
    FanOut,
    HugeEnum,
    HugePattern,
    PatternProperties,
    InPlaceCycle,
    Recursion,
    Unevaluated,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Nesting,
        Kind::FanOut,
        Kind::HugeEnum,
        Kind::HugePattern,
        Kind::PatternProperties,
        Kind::InPlaceCycle,
        Kind::Recursion,
        Kind::Unevaluated,
    ];
}

/// A hostile schema of `kind`, and whether it must be refused at save
/// (`Some(true)`), kept (`Some(false)`) or either (`None`).
fn schema(rng: &mut StdRng, kind: Kind) -> (Value, Option<bool>) {
    match kind {
        Kind::Nesting => {
            let depth = rng.random_range(1..=60);
            let mut schema = json!({ "type": "string" });
            for _ in 0..depth {
                schema = match rng.random_range(0..4) {
                    0 => json!({ "properties": { "a": schema } }),
                    1 => json!({ "allOf": [schema] }),
                    2 => json!({ "items": schema }),
                    _ => json!({ "anyOf": [{ "type": "null" }, schema] }),
                };
            }
            // Past 32 levels of nesting a schema is refused.
            (schema, Some(depth > 32))
        }
        Kind::FanOut => {
            let fan = rng.random_range(2..=5);
            let levels = rng.random_range(1..=14);
            let mut defs = Map::new();
            defs.insert("d_0".into(), json!({ "type": "object" }));
            for i in 1..=levels {
                let before = json!({ "$ref": format!("#/$defs/d_{}", i - 1) });
                let keyword = ["allOf", "anyOf", "oneOf"][rng.random_range(0..3)];
                defs.insert(format!("d_{i}"), json!({ keyword: vec![before; fan] }));
            }
            let schema = json!({ "$defs": defs, "$ref": format!("#/$defs/d_{levels}") });
            // d_i is itself and `fan` subschemas naming d_(i-1); the root
            // names d_levels.
            let fan_f = fan as f64;
            let expanded = (0..levels).fold(1f64, |size, _| size * fan_f + fan_f + 1.0) + 1.0;
            let refused = if expanded > 20_000.0 {
                Some(true)
            } else if expanded < 5_000.0 {
                Some(false)
            } else {
                None
            };
            (schema, refused)
        }
        Kind::HugeEnum => {
            let n = rng.random_range(100..8_000);
            let values: Vec<Value> = (0..n).map(|i| json!(format!("v{i:05}"))).collect();
            // Over 64 KiB of JSON is refused for its size.
            let size = json!({ "enum": values }).to_string().len();
            (json!({ "enum": values }), Some(size > 64 * 1024))
        }
        Kind::HugePattern => {
            let pattern = match rng.random_range(0..5) {
                0 => "(a{1,1000}){1,1000}".to_owned(),
                1 => "^(a+)+$".to_owned(),
                2 => "(\\w{1,200}){1,50}".to_owned(),
                3 => format!(
                    "^({})$",
                    (0..2000)
                        .map(|i| format!("w{i}"))
                        .collect::<Vec<_>>()
                        .join("|")
                ),
                _ => "(a)\\1".to_owned(),
            };
            (json!({ "type": "string", "pattern": pattern }), None)
        }
        Kind::PatternProperties => {
            let n = rng.random_range(1..300);
            let patterns: Map<String, Value> = (0..n)
                .map(|i| (format!("^(x|y)*{i}(a+)+$"), json!({ "type": "integer" })))
                .collect();
            let schema = json!({ "patternProperties": patterns, "additionalProperties": false });
            (schema, Some(n > 128))
        }
        Kind::InPlaceCycle => {
            let n = rng.random_range(1..6);
            let mut defs = Map::new();
            for i in 0..n {
                let next = format!("#/$defs/c_{}", (i + 1) % n);
                defs.insert(
                    format!("c_{i}"),
                    json!({ "anyOf": [{ "type": "null" }, { "$ref": next }] }),
                );
            }
            (json!({ "$defs": defs, "$ref": "#/$defs/c_0" }), Some(true))
        }
        Kind::Recursion => {
            let fan = rng.random_range(1..=4);
            let branches: Vec<Value> = (0..fan)
                .map(|_| match rng.random_range(0..3) {
                    0 => json!({ "items": { "$ref": "#" } }),
                    1 => json!({ "additionalProperties": { "$ref": "#" } }),
                    _ => json!({ "properties": { "next": { "$ref": "#" } } }),
                })
                .collect();
            (json!({ "allOf": branches }), Some(false))
        }
        Kind::Unevaluated => {
            let depth = rng.random_range(1..=24);
            let mut schema = json!({ "type": "string" });
            for _ in 0..depth {
                schema = json!({
                    "properties": { "a": schema },
                    "allOf": [{ "properties": { "b": true } }],
                    "unevaluatedProperties": false
                });
            }
            (schema, None)
        }
    }
}

/// Bodies sent to a kept schema: deep, wide, long.
fn bodies(rng: &mut StdRng) -> Vec<Value> {
    let depth = rng.random_range(10..=120);
    let mut deep_array = json!("x");
    let mut deep_object = json!("x");
    for _ in 0..depth {
        deep_array = json!([deep_array]);
        deep_object = json!({ "a": deep_object, "next": {} });
    }
    let wide: Map<String, Value> = (0..rng.random_range(100..2_000))
        .map(|i| (format!("x{i}aaaa"), json!(i)))
        .collect();
    let long = "a".repeat(rng.random_range(1_000..120_000));
    vec![
        deep_array,
        deep_object,
        Value::Object(wide),
        json!({ "a": long, "b": [long] }),
    ]
}

async fn hostile_schemas_are_refused_at_save_or_checked_within_bounds(app: &TestApp) {
    let cases = env_u64("TOK_FUZZ_SCHEMAS", DEFAULT_CASES);
    let seed = env_u64("TOK_FUZZ_SEED", DEFAULT_SEED);
    let tenant = app.create_tenant("Mallory").await;
    app.stop_engine().await;
    let mut failures = Vec::new();
    let mut seen = std::collections::HashMap::<(Kind, bool), u64>::new();
    for i in 0..cases {
        let mut rng = StdRng::seed_from_u64(seed + i);
        let kind = Kind::ALL[(i as usize) % Kind::ALL.len()];
        let (schema, refused) = schema(&mut rng, kind);
        let reply = app
            .post(
                &tenant.key,
                "/api/sources",
                &json!({ "name": format!("case {i}"), "schema": schema }),
            )
            .await;
        let case = format!("case {i} (seed {}, {kind:?})", seed + i);
        let kept = match reply.status {
            StatusCode::CREATED => true,
            StatusCode::BAD_REQUEST => {
                let error = &reply.body["error"];
                if error["code"] != "invalid_schema"
                    || error["field"] != "schema"
                    || !error["path"].is_string()
                    || error["message"].as_str().is_none_or(|m| m.len() <= 20)
                {
                    failures.push(format!(
                        "{case}: a refusal must name the schema and where: {error}"
                    ));
                }
                false
            }
            status => {
                failures.push(format!("{case}: {status} {}", reply.body));
                continue;
            }
        };
        *seen.entry((kind, kept)).or_default() += 1;
        if let Some(refused) = refused
            && refused == kept
        {
            failures.push(format!(
                "{case}: {} but it must be {}: {}",
                if kept { "kept" } else { "refused" },
                if refused { "refused" } else { "kept" },
                reply.body
            ));
        }
        if !kept {
            continue;
        }
        let token = reply.body["token"].as_str().unwrap().to_owned();
        for (n, body) in bodies(&mut rng).into_iter().enumerate() {
            let reply: Reply = app.webhook(&token, &body).await;
            let fine = match reply.status {
                StatusCode::ACCEPTED => true,
                StatusCode::BAD_REQUEST => matches!(
                    reply.body["error"]["code"].as_str(),
                    Some("schema_violation" | "schema_too_costly")
                ),
                _ => false,
            };
            if !fine {
                failures.push(format!("{case}, body {n}: {} {}", reply.status, reply.body));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Both answers were seen, so the cases reach both sides of the limits.
    for kind in [Kind::Nesting, Kind::FanOut, Kind::HugeEnum] {
        if cases >= 40 {
            assert!(seen.contains_key(&(kind, true)), "{kind:?} kept: {seen:?}");
            assert!(
                seen.contains_key(&(kind, false)),
                "{kind:?} refused: {seen:?}"
            );
        }
    }
}
