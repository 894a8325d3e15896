//! Hostile webhooks: random and mutated bodies, headers, tokens and
//! signatures (of every sender tok knows: Standard Webhooks, Stripe,
//! GitHub, Shopify, Slack), sent through the router as a client's would
//! be. Whatever arrives, tok answers 2xx or 4xx and never panics; every
//! event it answered 202 is in its tenant's inbox, once, so no unsigned
//! body of a signed source reaches a run; a dry run (`?dry_run=true`)
//! adds nothing to it; and a case that knows its answer (a well-formed,
//! correctly signed webhook is 202, a body over the limit is 413, a
//! signature of another body is 401 `signature_invalid`, U+0000 is 400…)
//! gets exactly that answer.
//!
//! The cases are made from a seed, case `i` from `seed + i`, so a failure
//! names the one case that reproduces it. `TOK_FUZZ_CASES` sets how many
//! are sent (20,000 by default; the long run of docs/reliability.md sends
//! 1,000,000) and `TOK_FUZZ_SEED` the seed. The engine is stopped while the
//! cases are sent, so what was accepted stays pending in the inbox, where
//! `GET /api/dashboard/queue` counts it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use sha2::Sha256;
use tok_server::MAX_WEBHOOK_BYTES;
use tokio::task::JoinSet;

use crate::helpers::{Reply, TestApp, backend_tests, log_step, on_webhook, plain_source};

backend_tests!(
    crate::helpers::run;
    hostile_webhooks_are_answered_2xx_or_4xx_and_every_202_is_in_the_inbox,
    one_tenants_refused_bytes_fail_none_of_anothers_webhooks,
);

/// Cases sent by default: enough to reach every kind of case many times,
/// few enough for the normal suite.
const DEFAULT_CASES: u64 = 20_000;

const DEFAULT_SEED: u64 = 0x7_0c_f0_22;

/// Requests in flight at once, as concurrent senders would make them (and
/// so that the inbox's group commits write several events together).
const IN_FLIGHT: usize = 16;

/// Failures shown when the test fails; the first one reproduces alone.
const SHOWN_FAILURES: usize = 20;

/// A whole number from the environment (`_` allowed as a separator).
pub(crate) fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {value:?}")),
        Err(_) => default,
    }
}

/// The secret of the Standard Webhooks source, as a sender is given it.
fn secret() -> String {
    format!("whsec_{}", STANDARD.encode(b"the-fuzzed-senders-key"))
}

/// The senders the signed sources name (`verify.preset`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sender {
    Standard,
    Stripe,
    Github,
    Shopify,
    Slack,
}

impl Sender {
    const ALL: [Sender; 5] = [
        Sender::Standard,
        Sender::Stripe,
        Sender::Github,
        Sender::Shopify,
        Sender::Slack,
    ];

    fn preset(self) -> &'static str {
        match self {
            Sender::Standard => "standard",
            Sender::Stripe => "stripe",
            Sender::Github => "github",
            Sender::Shopify => "shopify",
            Sender::Slack => "slack",
        }
    }

    /// The secret the sender signs with.
    fn secret(self) -> String {
        match self {
            Sender::Standard => secret(),
            Sender::Stripe => "whsec_the_fuzzed_stripe_endpoint".into(),
            Sender::Github => "the fuzzed GitHub hook's secret".into(),
            Sender::Shopify => "shpss_the_fuzzed_shopify_app_secret".into(),
            Sender::Slack => "the-fuzzed-slack-signing-secret".into(),
        }
    }
}

/// A contract a sender's body must meet: `order.id` is required.
fn contract_source() -> Value {
    json!({
        "name": "orders",
        "params": [
            { "name": "orderId", "path": "order.id", "type": "string", "required": true },
            { "name": "total", "path": "order.total", "type": "number", "required": false },
            { "name": "sku", "path": "items.0.sku", "type": "string", "required": false }
        ]
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// No contract, no secret: any JSON is accepted.
    Plain,
    /// A params contract.
    Contract,
    /// A sender's signature is checked.
    Signed(Sender),
}

/// Which 429 a target may answer, once its token is known (the size
/// checks and the token lookup come first).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Gate {
    /// No rate limit, not critical: 429 `overloaded` while the queue is
    /// deeper than the backpressure threshold.
    Open,
    /// A rate limit of its own as well: 429 `rate_limited` past it.
    RateLimited,
    /// A critical source: accepted whatever the queue's depth.
    Critical,
}

/// A webhook the cases aim at, and the tenant that owns it.
struct Target {
    token: String,
    kind: Kind,
    tenant: usize,
    gate: Gate,
}

/// The rate limit of the rate-limited source, in requests per second: low
/// enough that the cases go past it, high enough that many pass.
const RATE_LIMIT: u64 = 100;

/// Cases sent between two changes of the queue depth the backpressure
/// reads: the depth is over the threshold for one block in five.
const BACKPRESSURE_BLOCK: u64 = 500;

/// The answer a case must get, when the case knows it.
#[derive(Clone, Debug)]
enum Expect {
    Accepted,
    Refused(StatusCode, &'static str),
    /// 200: a dry run's answer, nothing stored.
    DryRun,
    /// 200 with this challenge: Slack's `url_verification`.
    Challenge(String),
    /// Any 2xx or 4xx.
    Any,
}

struct Case {
    method: Method,
    uri: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Vec<u8>,
    /// The tenant whose inbox a 202 adds to (`None`: the token is not one).
    tenant: Option<usize>,
    /// The 429s the target may answer.
    gate: Gate,
    expect: Expect,
    /// What kind of case this is, for a failure's message.
    what: String,
    /// The sender of the signed source it is for, if it is for one.
    sender: Option<Sender>,
}

/// What one case was answered.
struct Outcome {
    index: u64,
    status: StatusCode,
    /// The sender of the signed source the case was for, if any.
    sender: Option<Sender>,
    accepted: Option<(usize, String)>,
    /// The error's code, of a 4xx.
    code: Option<String>,
    failure: Option<String>,
}

async fn hostile_webhooks_are_answered_2xx_or_4xx_and_every_202_is_in_the_inbox(app: &TestApp) {
    let cases = env_u64("TOK_FUZZ_CASES", DEFAULT_CASES);
    let seed = env_u64("TOK_FUZZ_SEED", DEFAULT_SEED);
    let fuzz = app.create_tenant("Fuzz").await;
    let signer = app.create_tenant("Signer").await;
    let tenants = [fuzz.clone(), signer.clone()];
    let plain = app.create_source(&fuzz, &plain_source("any")).await;
    let contract = app.create_source(&fuzz, &contract_source()).await;
    let limited = app
        .create_source(
            &fuzz,
            &json!({ "name": "limited", "params": [], "rate_limit": RATE_LIMIT }),
        )
        .await;
    let target = |source: &Value, kind, tenant, gate| Target {
        token: source["token"].as_str().unwrap().to_owned(),
        kind,
        tenant,
        gate,
    };
    let mut targets = vec![
        target(&plain, Kind::Plain, 0, Gate::Open),
        target(&contract, Kind::Contract, 0, Gate::Open),
        target(&limited, Kind::Plain, 0, Gate::RateLimited),
    ];
    for sender in Sender::ALL {
        let signed = app
            .create_source(
                &signer,
                &json!({
                    "name": format!("signed by {}", sender.preset()),
                    "params": [],
                    "verify": { "preset": sender.preset(), "secret": sender.secret() },
                    "critical": true,
                }),
            )
            .await;
        targets.push(target(&signed, Kind::Signed(sender), 1, Gate::Critical));
    }
    let targets = Arc::new(targets);
    // Nothing is dispatched: every accepted event stays pending.
    app.stop_engine().await;

    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    // Statuses answered to each sender's signed source.
    let mut by_sender: HashMap<&'static str, BTreeMap<u16, u64>> = HashMap::new();
    let mut accepted: Vec<HashSet<String>> = vec![HashSet::new(); tenants.len()];
    let mut failures: Vec<(u64, String)> = Vec::new();
    let mut in_flight = JoinSet::new();
    // Which case each task sends, for a task that panicked.
    let mut sending: HashMap<tokio::task::Id, (u64, String)> = HashMap::new();
    let started = std::time::Instant::now();
    for index in 0..=cases {
        while in_flight.len() >= IN_FLIGHT || (index == cases && !in_flight.is_empty()) {
            let outcome = match in_flight
                .join_next_with_id()
                .await
                .expect("a case in flight")
            {
                Ok((id, outcome)) => {
                    sending.remove(&id);
                    outcome
                }
                Err(e) => panicked(&mut sending, e),
            };
            *statuses.entry(outcome.status.as_u16()).or_default() += 1;
            if let Some(sender) = outcome.sender {
                *by_sender
                    .entry(sender.preset())
                    .or_default()
                    .entry(outcome.status.as_u16())
                    .or_default() += 1;
            }
            if let Some(code) = outcome.code {
                *codes.entry(code).or_default() += 1;
            }
            if let Some((tenant, id)) = outcome.accepted {
                accepted[tenant].insert(id);
            }
            if let Some(failure) = outcome.failure {
                failures.push((outcome.index, failure));
            }
        }
        if index == cases {
            break;
        }
        // Backpressure on and off, a block of cases at a time: the cases
        // in flight across a change may see either.
        if index % BACKPRESSURE_BLOCK == 0 {
            let overloaded = (index / BACKPRESSURE_BLOCK) % 5 == 4;
            app.state.record_queue_depth(if overloaded {
                tok_server::DEFAULT_BACKPRESSURE_DEPTH + 1
            } else {
                0
            });
        }
        let now = jiff::Timestamp::now().as_second();
        let case = make_case(
            &mut StdRng::seed_from_u64(seed.wrapping_add(index)),
            &targets,
            now,
        );
        let what = case.what.clone();
        let router = app.router.clone();
        let task = in_flight.spawn(answer(router, index, case));
        sending.insert(task.id(), (index, what));
    }
    let elapsed = started.elapsed();
    app.state.record_queue_depth(0);
    failures.sort_by_key(|(index, _)| *index);
    let shown: Vec<String> = failures
        .iter()
        .take(SHOWN_FAILURES)
        .map(|(index, failure)| format!("case {index}: {failure}"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed on {:?} (seed {seed}; TOK_FUZZ_SEED={} TOK_FUZZ_CASES=1 \
         sends the first alone):\n{}",
        failures.len(),
        app.backend,
        seed.wrapping_add(failures[0].0),
        shown.join("\n")
    );

    // Every 202 is one event in its tenant's inbox, and nothing else is.
    for (tenant, ids) in tenants.iter().zip(&accepted) {
        let queue = app
            .get(&tenant.key, "/api/dashboard/queue")
            .await
            .expect(StatusCode::OK);
        assert_eq!(
            queue["pending_events"],
            json!(ids.len()),
            "the events answered 202 for {} are not what its inbox holds: {queue:#}",
            tenant.id
        );
    }
    if cases >= 1_000 {
        for status in [200, 202, 400, 401, 404, 405, 413, 429] {
            assert!(
                statuses.contains_key(&status),
                "no case was answered {status}: the cases no longer reach it ({statuses:?})"
            );
        }
        // Every sender's source took signed bodies and refused the others.
        for sender in Sender::ALL {
            let answered = by_sender.get(sender.preset()).cloned().unwrap_or_default();
            for status in [200, 202, 401] {
                assert!(
                    answered.contains_key(&status),
                    "no case for the {} source was answered {status} ({answered:?})",
                    sender.preset()
                );
            }
        }
        for code in [
            "rate_limited",
            "overloaded",
            "signature_missing",
            "signature_invalid",
            "timestamp_out_of_range",
            "nul_in_json",
        ] {
            assert!(
                codes.contains_key(code),
                "no case was answered `{code}`: the cases no longer reach it ({codes:?})"
            );
        }
    }
    eprintln!(
        "webhook fuzzing on {:?}: {cases} cases (seed {seed}) in {:.1} s; answers by status {statuses:?}; \
         429s {}; events accepted {}; panics 0; 5xx 0",
        app.backend,
        elapsed.as_secs_f64(),
        format_args!(
            "rate_limited {}, overloaded {}",
            codes.get("rate_limited").unwrap_or(&0),
            codes.get("overloaded").unwrap_or(&0)
        ),
        accepted.iter().map(HashSet::len).sum::<usize>()
    );
}

/// The outcome of a case whose task panicked: a failure with the panic's
/// message.
fn panicked(
    sending: &mut HashMap<tokio::task::Id, (u64, String)>,
    e: tokio::task::JoinError,
) -> Outcome {
    let (index, what) = sending.remove(&e.id()).unwrap_or((u64::MAX, String::new()));
    let message = if e.is_panic() {
        let panic = e.into_panic();
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic".into())
    } else {
        e.to_string()
    };
    Outcome {
        index,
        status: StatusCode::INTERNAL_SERVER_ERROR,
        sender: None,
        accepted: None,
        code: None,
        failure: Some(format!("{what}: panicked: {message}")),
    }
}

/// Sends one case and checks its answer.
async fn answer(router: axum::Router, index: u64, case: Case) -> Outcome {
    let mut builder = Request::builder()
        .method(case.method.clone())
        .uri(&case.uri);
    for (name, value) in &case.headers {
        builder = builder.header(name, value);
    }
    let request = builder
        .body(Body::from(case.body))
        .expect("a valid request");
    let reply = crate::helpers::send(router, request).await;
    let failure = check(&case.expect, case.tenant, case.gate, &reply).map(|problem| {
        let mut body = reply.body.to_string();
        body.truncate(300);
        format!(
            "{} ({} {}): {problem}; answered {} {body}",
            case.what,
            case.method,
            short(&case.uri),
            reply.status
        )
    });
    let accepted = match (reply.status, case.tenant, reply.body["event_id"].as_str()) {
        (StatusCode::ACCEPTED, Some(tenant), Some(id)) if failure.is_none() => {
            Some((tenant, id.to_owned()))
        }
        _ => None,
    };
    Outcome {
        index,
        status: reply.status,
        sender: case.sender,
        accepted,
        code: reply.body["error"]["code"].as_str().map(str::to_owned),
        failure,
    }
}

fn short(text: &str) -> String {
    let mut text = text.to_owned();
    if text.len() > 80 {
        let mut end = 80;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// What is wrong with an answer, if anything.
fn check(expect: &Expect, tenant: Option<usize>, gate: Gate, reply: &Reply) -> Option<String> {
    let status = reply.status;
    if !(status.is_success() || status.is_client_error()) {
        return Some("not a 2xx or 4xx answer".into());
    }
    if status == StatusCode::ACCEPTED {
        if tenant.is_none() {
            return Some("202 for a token that is no webhook's".into());
        }
        if !reply.body["event_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("evt_"))
        {
            return Some("a 202 without an event_id".into());
        }
    }
    if status.is_client_error()
        && reply.body["error"]["message"]
            .as_str()
            .is_none_or(str::is_empty)
    {
        return Some("an error that is not JSON saying what was wrong".into());
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        return too_many(expect, tenant, gate, reply);
    }
    match expect {
        Expect::Any => None,
        Expect::Accepted => (status != StatusCode::ACCEPTED).then(|| "expected 202".into()),
        Expect::DryRun => (status != StatusCode::OK || reply.body["dry_run"] != true)
            .then(|| "expected a dry run's 200".into()),
        Expect::Challenge(challenge) => {
            let answered = &reply.body["challenge"];
            let dry = &reply.body["answer"]["challenge"];
            (status != StatusCode::OK || (answered != challenge && dry != challenge))
                .then(|| format!("expected 200 with the challenge {challenge}"))
        }
        Expect::Refused(want, code) => (status != *want || reply.body["error"]["code"] != *code)
            .then(|| format!("expected {want} {code}"))
            .or_else(|| {
                // A refused signature names the header it read.
                (*want == StatusCode::UNAUTHORIZED && !reply.body["error"]["header"].is_string())
                    .then(|| "a 401 that names no header".into())
            }),
    }
}

/// What is wrong with a 429, if anything: a webhook's token is looked up
/// after the size checks and before everything else (signature, JSON,
/// contract), so a case aimed at a webhook that would not be refused by
/// those first checks may instead be told to come back, with when.
fn too_many(expect: &Expect, tenant: Option<usize>, gate: Gate, reply: &Reply) -> Option<String> {
    let before_the_gate = matches!(
        expect,
        Expect::Refused(
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED,
            _
        )
    );
    if tenant.is_none() || before_the_gate {
        return Some("429 for a request refused before a webhook's limits are read".into());
    }
    let error = &reply.body["error"];
    let allowed = match error["code"].as_str() {
        Some("rate_limited") => gate == Gate::RateLimited,
        Some("overloaded") => gate != Gate::Critical,
        _ => false,
    };
    if !allowed {
        return Some(format!("a 429 this webhook ({gate:?}) may not answer"));
    }
    let retry = reply
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if error["retry_after_ms"].as_u64().is_none() || retry.is_none() {
        return Some("a 429 that does not say when to retry".into());
    }
    None
}

/// The `i`-th case: a webhook for one of the targets, mutated.
fn make_case(rng: &mut StdRng, targets: &[Target], now: i64) -> Case {
    // A case in four is for a signed source (one of the senders'), the
    // rest for the others alike: the rate-limited one gets enough cases a
    // second to pass its limit on a slow machine too.
    let unsigned = targets
        .iter()
        .take_while(|t| !matches!(t.kind, Kind::Signed(_)))
        .count();
    let t = if rng.random_range(0..4) == 3 {
        &targets[rng.random_range(unsigned..targets.len())]
    } else {
        &targets[rng.random_range(0..unsigned)]
    };
    let (mut body, mut expect, mut what) = make_body(rng, t.kind);
    let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
    let header = |name: &'static str, value: &str| {
        (
            HeaderName::from_static(name),
            HeaderValue::from_str(value).expect("a header value"),
        )
    };

    // Content type: the webhook reads bytes, whatever the label says.
    const TYPES: [&str; 8] = [
        "application/json",
        "application/json; charset=utf-8",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/xml",
        "",
        "nonsense",
    ];
    if rng.random_bool(0.9) {
        let kind = TYPES[rng.random_range(0..TYPES.len())];
        headers.push(header("content-type", kind));
    }

    // An idempotency key: none, one of a few (repeats), long, blank, not ASCII.
    match rng.random_range(0..20) {
        0..=9 => {}
        10..=13 => headers.push(header(
            "idempotency-key",
            &format!("k{}", rng.random_range(0..300)),
        )),
        14 => headers.push(header(
            "idempotency-key",
            &"x".repeat(rng.random_range(190..3000)),
        )),
        15 => headers.push(header("idempotency-key", "   ")),
        16 => headers.push((
            HeaderName::from_static("idempotency-key"),
            HeaderValue::from_bytes(&[b'k', 0xe9, 0xff, b'1']).expect("obs-text is allowed"),
        )),
        17 => headers.push(header(
            "webhook-id",
            &format!("msg_{}", rng.random_range(0..300)),
        )),
        _ => headers.push(header(
            "idempotency-key",
            &format!("u{}", rng.random::<u64>()),
        )),
    }

    // Slack checks a Request URL with a signed `url_verification`.
    if t.kind == Kind::Signed(Sender::Slack) && rng.random_bool(0.05) {
        let challenge = random_text(rng, 1..60, TOKEN_CHARS);
        body = serde_json::to_vec(&json!({
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "challenge": challenge,
            "type": "url_verification",
        }))
        .unwrap();
        expect = Expect::Challenge(challenge);
        what = "Slack's url_verification".into();
    }

    // A signature: right, or wrong in one way; a source that checks none
    // is sent one now and then, and ignores it.
    let sender = match t.kind {
        Kind::Signed(sender) => Some(sender),
        _ if rng.random_bool(0.05) => Some(Sender::ALL[rng.random_range(0..Sender::ALL.len())]),
        _ => None,
    };
    if let Some(sender) = sender {
        let (signature_headers, refused, how) = sign(rng, sender, &body, now);
        if sender == Sender::Standard {
            headers.retain(|(name, _)| name != "webhook-id");
        }
        headers.extend(signature_headers);
        if let (Kind::Signed(_), Some(code)) = (t.kind, refused) {
            expect = Expect::Refused(StatusCode::UNAUTHORIZED, code);
            what = format!("{what}, {} {how}", sender.preset());
        }
    }

    // A `Content-Length` that is absent, right, lying, too large or junk.
    let mut declared_too_large = false;
    match rng.random_range(0..40) {
        0..=3 => headers.push(header("content-length", &body.len().to_string())),
        4 => {
            let lie = rng.random_range(0..=MAX_WEBHOOK_BYTES);
            headers.push(header("content-length", &lie.to_string()));
        }
        5 => {
            let large = [
                (MAX_WEBHOOK_BYTES + 1).to_string(),
                u64::MAX.to_string(),
                "99999999999999999999999999".into(),
            ];
            let value = &large[rng.random_range(0..large.len())];
            declared_too_large = value.parse::<usize>().is_ok();
            headers.push(header("content-length", value));
            what = format!("{what}, content-length {value}");
        }
        6 => headers.push(header(
            "content-length",
            ["-1", "abc", "1e3", " "][rng.random_range(0..4)],
        )),
        _ => {}
    }

    // Size is checked first of all…
    if declared_too_large || body.len() > MAX_WEBHOOK_BYTES {
        expect = Expect::Refused(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    }
    // …once the path is one of a webhook: the target's, or a token that is
    // no webhook's.
    let mut tenant = Some(t.tenant);
    let mut token = t.token.clone();
    if rng.random_bool(0.08) {
        tenant = None;
        let (mutated, answer, how) = mutate_token(rng, &t.token);
        token = mutated;
        what = format!("{what}, {how}");
        expect = match (answer, &expect) {
            (Token::Unknown, Expect::Refused(StatusCode::PAYLOAD_TOO_LARGE, _)) => expect,
            (Token::Unknown, _) => Expect::Refused(StatusCode::NOT_FOUND, "unknown_webhook"),
            (Token::NamesNothing, _) => Expect::Refused(StatusCode::NOT_FOUND, "not_found"),
        };
    }

    let method = match rng.random_range(0..100) {
        0..=2 => {
            expect = Expect::Any;
            Method::GET
        }
        3 | 4 => {
            expect = if tenant.is_some() {
                Expect::Refused(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
            } else {
                Expect::Any
            };
            [Method::PUT, Method::DELETE, Method::PATCH][rng.random_range(0..3)].clone()
        }
        _ => Method::POST,
    };
    if method != Method::POST {
        tenant = None;
        if rng.random_bool(0.5) {
            body.clear();
        }
    }
    // A dry run of a signed source's webhook: checked alike, answered 200,
    // and nothing of it in the inbox.
    let mut query = "";
    if method == Method::POST && matches!(t.kind, Kind::Signed(_)) && rng.random_bool(0.04) {
        query = "?dry_run=true";
        what = format!("{what}, a dry run");
        expect = match expect {
            Expect::Accepted => Expect::DryRun,
            other => other,
        };
    }
    Case {
        method,
        uri: format!("/webhook/{token}{query}"),
        headers,
        body,
        tenant,
        gate: t.gate,
        expect,
        what,
        sender: match t.kind {
            Kind::Signed(sender) => Some(sender),
            _ => None,
        },
    }
}

/// How a token that is not a webhook's is answered.
enum Token {
    /// The webhook's checks run (size first), then 404 `unknown_webhook`.
    Unknown,
    /// The path names nothing (U+0000, not UTF-8, a path below a token):
    /// 404 `not_found` before any check of the request.
    NamesNothing,
}

/// A token that is not the target's.
fn mutate_token(rng: &mut StdRng, token: &str) -> (String, Token, &'static str) {
    use Token::*;
    match rng.random_range(0..9) {
        0 => (format!("{token}x"), Unknown, "a token with a letter more"),
        1 => (
            token[..token.len() - 1].to_owned(),
            Unknown,
            "a token with a letter less",
        ),
        2 => (
            random_text(rng, 1..40, TOKEN_CHARS),
            Unknown,
            "a random token",
        ),
        3 => (format!("{token}%00"), NamesNothing, "a token with U+0000"),
        4 => (
            format!("%00{}", &token[1..]),
            NamesNothing,
            "a token starting with U+0000",
        ),
        5 => (
            "x".repeat(rng.random_range(300..9000)),
            Unknown,
            "a very long token",
        ),
        6 => (
            format!("{token}%FF%FE"),
            NamesNothing,
            "a token that is not UTF-8",
        ),
        7 => (
            format!("{token}/more"),
            NamesNothing,
            "a path below a token",
        ),
        _ => (
            format!("{}%E2%82%AC%F0%9F%A6%80", &token[..8]),
            Unknown,
            "a token with non-ASCII letters",
        ),
    }
}

const TOKEN_CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~";

fn random_text(rng: &mut StdRng, len: std::ops::Range<usize>, chars: &[u8]) -> String {
    let n = rng.random_range(len);
    (0..n)
        .map(|_| chars[rng.random_range(0..chars.len())] as char)
        .collect()
}

/// Signature headers of `sender` for `body`: right (`None`), or wrong in
/// one way (`Some` of the code it must be refused with); and how.
fn sign(
    rng: &mut StdRng,
    sender: Sender,
    body: &[u8],
    now: i64,
) -> (
    Vec<(HeaderName, HeaderValue)>,
    Option<&'static str>,
    &'static str,
) {
    match sender {
        Sender::Standard => signature(rng, body, now),
        Sender::Stripe => stripe_signature(rng, body, now),
        Sender::Github | Sender::Shopify => body_signature(rng, sender, body),
        Sender::Slack => slack_signature(rng, body, now),
    }
}

/// HMAC-SHA256 of the concatenated `parts` under `key`.
fn hmac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

/// `text` with one hex digit (after `skip` characters) changed to another.
fn change_hex_digit(rng: &mut StdRng, text: &str, skip: usize) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let at = rng.random_range(skip..bytes.len());
    bytes[at] = if bytes[at] == b'a' { b'b' } else { b'a' };
    String::from_utf8(bytes).unwrap()
}

/// A timestamp out of the five minutes, or one that is not unix seconds.
fn far_timestamp(rng: &mut StdRng, now: i64) -> String {
    [
        i64::MIN.to_string(),
        i64::MAX.to_string(),
        // A minute past the five allowed: the server reads its clock
        // later than the case was made.
        (now - 360).to_string(),
        (now + 360).to_string(),
        "0".into(),
        "-1".into(),
    ][rng.random_range(0..6)]
    .clone()
}

fn not_unix_seconds(rng: &mut StdRng) -> &'static str {
    ["yesterday", "1.5", "1e9", "0x10", "99999999999999999999"][rng.random_range(0..5)]
}

fn named(pairs: Vec<(&'static str, String)>) -> Vec<(HeaderName, HeaderValue)> {
    pairs
        .into_iter()
        .map(|(name, value)| {
            (
                HeaderName::from_static(name),
                HeaderValue::from_str(&value).expect("a header value"),
            )
        })
        .collect()
}

/// `Stripe-Signature: t=…,v1=…` for `body`, right or wrong in one way.
fn stripe_signature(
    rng: &mut StdRng,
    body: &[u8],
    now: i64,
) -> (
    Vec<(HeaderName, HeaderValue)>,
    Option<&'static str>,
    &'static str,
) {
    let key = Sender::Stripe.secret().into_bytes();
    let sign = |t: &str, body: &[u8]| hex::encode(hmac(&key, &[t.as_bytes(), b".", body]));
    let t = (now + rng.random_range(-200..=200)).to_string();
    let header = |value: String| named(vec![("stripe-signature", value)]);
    let (value, refused, how) = match rng.random_range(0..20) {
        0..=12 => {
            let v1 = sign(&t, body);
            let value = match rng.random_range(0..3) {
                0 => format!("t={t},v1={v1}"),
                1 => format!("t={t},v1={},v1={v1}", "0".repeat(64)),
                _ => format!("t={t},v1={v1},v0={}", "f".repeat(64)),
            };
            return (header(value), None, "signed");
        }
        13 => {
            let other = hex::encode(hmac(b"whsec_another_endpoint", &[t.as_bytes(), b".", body]));
            (
                format!("t={t},v1={other}"),
                Some("signature_invalid"),
                "signed with another secret",
            )
        }
        14 => (
            format!("t={t},v1={}", change_hex_digit(rng, &sign(&t, body), 0)),
            Some("signature_invalid"),
            "a signature with a digit changed",
        ),
        15 => {
            let far = far_timestamp(rng, now);
            let v1 = sign(&far, body);
            (
                format!("t={far},v1={v1}"),
                Some("timestamp_out_of_range"),
                "a timestamp far from now",
            )
        }
        16 => {
            let bad = not_unix_seconds(rng);
            (
                format!("t={bad},v1={}", sign(bad, body)),
                Some("signature_invalid"),
                "a t that is not unix seconds",
            )
        }
        17 => (format!("t={t}"), Some("signature_missing"), "no v1"),
        18 => return (Vec::new(), Some("signature_missing"), "no Stripe-Signature"),
        _ => {
            let mut other = body.to_vec();
            other.push(b' ');
            (
                format!("t={t},v1={}", sign(&t, &other)),
                Some("signature_invalid"),
                "a signature of another body",
            )
        }
    };
    (header(value), refused, how)
}

/// GitHub's `X-Hub-Signature-256: sha256=<hex>` or Shopify's
/// `X-Shopify-Hmac-Sha256: <base64>` of `body`, with the delivery's id,
/// right or wrong in one way.
fn body_signature(
    rng: &mut StdRng,
    sender: Sender,
    body: &[u8],
) -> (
    Vec<(HeaderName, HeaderValue)>,
    Option<&'static str>,
    &'static str,
) {
    let key = sender.secret().into_bytes();
    let github = sender == Sender::Github;
    let encode = |mac: Vec<u8>| {
        if github {
            format!("sha256={}", hex::encode(mac))
        } else {
            STANDARD.encode(mac)
        }
    };
    let (signature_header, delivery_header, event_header) = if github {
        ("x-hub-signature-256", "x-github-delivery", "x-github-event")
    } else {
        (
            "x-shopify-hmac-sha256",
            "x-shopify-webhook-id",
            "x-shopify-topic",
        )
    };
    let mut pairs = Vec::new();
    if rng.random_bool(0.9) {
        pairs.push((delivery_header, format!("d-{}", rng.random_range(0..500))));
    }
    if rng.random_bool(0.9) {
        pairs.push((
            event_header,
            ["push", "orders/create", "ping"][rng.random_range(0..3)].to_owned(),
        ));
    }
    let good = encode(hmac(&key, &[body]));
    let (value, refused, how) = match rng.random_range(0..16) {
        0..=10 => (good, None, "signed"),
        11 => (
            encode(hmac(b"another hook's secret", &[body])),
            Some("signature_invalid"),
            "signed with another secret",
        ),
        12 => {
            let mut other = body.to_vec();
            other.push(b'\n');
            (
                encode(hmac(&key, &[&other])),
                Some("signature_invalid"),
                "a signature of another body",
            )
        }
        13 => (
            if github {
                "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59".into()
            } else {
                "!!not base64!!".into()
            },
            Some("signature_invalid"),
            "a malformed signature",
        ),
        14 if github => (
            change_hex_digit(rng, &good, 7),
            Some("signature_invalid"),
            "a signature with a digit changed",
        ),
        _ => {
            return (
                named(pairs),
                Some("signature_missing"),
                "no signature header",
            );
        }
    };
    pairs.push((signature_header, value));
    (named(pairs), refused, how)
}

/// Slack's `X-Slack-Signature: v0=<hex>` over `v0:{ts}:{body}` with
/// `X-Slack-Request-Timestamp`, right or wrong in one way.
fn slack_signature(
    rng: &mut StdRng,
    body: &[u8],
    now: i64,
) -> (
    Vec<(HeaderName, HeaderValue)>,
    Option<&'static str>,
    &'static str,
) {
    let key = Sender::Slack.secret().into_bytes();
    let sign = |ts: &str, body: &[u8]| {
        format!(
            "v0={}",
            hex::encode(hmac(&key, &[b"v0:", ts.as_bytes(), b":", body]))
        )
    };
    let mut ts = (now + rng.random_range(-200..=200)).to_string();
    let (signature, refused, how) = match rng.random_range(0..18) {
        0..=10 => (Some(sign(&ts, body)), None, "signed"),
        11 => (
            Some(format!(
                "v0={}",
                hex::encode(hmac(
                    b"another app's secret",
                    &[b"v0:", ts.as_bytes(), b":", body]
                ))
            )),
            Some("signature_invalid"),
            "signed with another secret",
        ),
        12 => (
            Some(change_hex_digit(rng, &sign(&ts, body), 3)),
            Some("signature_invalid"),
            "a signature with a digit changed",
        ),
        13 => {
            ts = far_timestamp(rng, now);
            (
                Some(sign(&ts, body)),
                Some("timestamp_out_of_range"),
                "a timestamp far from now",
            )
        }
        14 => {
            ts = not_unix_seconds(rng).to_owned();
            (
                Some(sign(&ts, body)),
                Some("signature_invalid"),
                "a timestamp that is not unix seconds",
            )
        }
        15 => (None, Some("signature_missing"), "no X-Slack-Signature"),
        16 => {
            let signed = sign(&ts, body);
            return (
                named(vec![("x-slack-signature", signed)]),
                Some("signature_missing"),
                "no X-Slack-Request-Timestamp",
            );
        }
        _ => {
            let mut other = body.to_vec();
            other.push(b' ');
            (
                Some(sign(&ts, &other)),
                Some("signature_invalid"),
                "a signature of another body",
            )
        }
    };
    let mut pairs = vec![("x-slack-request-timestamp", ts)];
    if let Some(signature) = signature {
        pairs.push(("x-slack-signature", signature));
    }
    (named(pairs), refused, how)
}

/// Standard Webhooks headers for `body`: right, or wrong in one way.
fn signature(
    rng: &mut StdRng,
    body: &[u8],
    now: i64,
) -> (
    Vec<(HeaderName, HeaderValue)>,
    Option<&'static str>,
    &'static str,
) {
    let id = format!("msg_{}", rng.random_range(0..500));
    let sign = |key: &[u8], id: &str, ts: &str, body: &[u8]| {
        format!(
            "v1,{}",
            STANDARD.encode(hmac(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]))
        )
    };
    let key = STANDARD
        .decode(secret().strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut ts = (now + rng.random_range(-200..=200)).to_string();
    let mut sig = sign(&key, &id, &ts, body);
    let mut sent_id = Some(id.clone());
    let (refused, how) = match rng.random_range(0..24) {
        0..=15 => {
            if rng.random_bool(0.2) {
                // A key rotation: a stale signature beside the right one.
                sig = format!("v1,bm90LXRoaXMtb25l {sig} v2,abc");
            }
            let headers = signature_headers(Some(&id), Some(&ts), Some(&sig));
            return (headers, None, "signed");
        }
        16 => {
            sig = sign(b"someone else's key", &id, &ts, body);
            ("signature_invalid", "signed with another key")
        }
        17 => {
            let mut bytes = sig.into_bytes();
            let at = rng.random_range(3..bytes.len());
            bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
            sig = String::from_utf8(bytes).unwrap();
            ("signature_invalid", "a signature with a letter changed")
        }
        18 => {
            ts = far_timestamp(rng, now);
            sig = sign(&key, &id, &ts, body);
            ("timestamp_out_of_range", "a timestamp far from now")
        }
        19 => {
            let blank = rng.random_bool(0.2);
            ts = if blank {
                String::new()
            } else {
                not_unix_seconds(rng).to_owned()
            };
            sig = sign(&key, &id, &ts, body);
            if blank {
                ("signature_missing", "a blank timestamp")
            } else {
                ("signature_invalid", "a timestamp that is not unix seconds")
            }
        }
        20 => {
            let (bad, code) = [
                ("", "signature_missing"),
                ("v1,", "signature_invalid"),
                ("v1,!!!not-base64!!!", "signature_invalid"),
                ("v2,abc", "signature_missing"),
                ("v1", "signature_missing"),
            ][rng.random_range(0..5)];
            sig = bad.to_owned();
            (code, "a malformed signature")
        }
        21 => {
            sent_id = None;
            ("signature_missing", "no webhook-id")
        }
        22 => {
            sig = sign(&key, "msg_other", &ts, body);
            ("signature_invalid", "a signature for another message id")
        }
        _ => {
            let mut other = body.to_vec();
            other.push(b' ');
            sig = sign(&key, &id, &ts, &other);
            ("signature_invalid", "a signature of another body")
        }
    };
    (
        signature_headers(sent_id.as_deref(), Some(&ts), Some(&sig)),
        Some(refused),
        how,
    )
}

fn signature_headers(
    id: Option<&str>,
    ts: Option<&str>,
    sig: Option<&str>,
) -> Vec<(HeaderName, HeaderValue)> {
    [
        ("webhook-id", id),
        ("webhook-timestamp", ts),
        ("webhook-signature", sig),
    ]
    .into_iter()
    .filter_map(|(name, value)| {
        Some((
            HeaderName::from_static(name),
            HeaderValue::from_str(value?).expect("a header value"),
        ))
    })
    .collect()
}

/// A body, what it must be answered when nothing else is wrong with the
/// request, and what kind of body it is.
fn make_body(rng: &mut StdRng, kind: Kind) -> (Vec<u8>, Expect, String) {
    let valid = |rng: &mut StdRng| valid_doc(rng, kind);
    let bytes = |value: &Value| serde_json::to_vec(value).unwrap();
    match rng.random_range(0..100) {
        0..=37 => (bytes(&valid(rng)), Expect::Accepted, "a valid body".into()),
        38..=52 => {
            let mut body = bytes(&valid(rng));
            for _ in 0..rng.random_range(1..=4) {
                mutate_bytes(rng, &mut body);
            }
            (body, Expect::Any, "a mutated body".into())
        }
        53..=59 => {
            let doc = valid(rng);
            let (body, at) = with_nul(rng, doc);
            (
                bytes(&body),
                Expect::Refused(StatusCode::BAD_REQUEST, "nul_in_json"),
                format!("U+0000 {at}"),
            )
        }
        60..=64 => {
            let text = object_text(&valid(rng));
            let bad: &[&[u8]] = &[
                b"\xff",
                b"\xc0\x80",
                b"\x80",
                b"\xed\xa0\x80",
                b"\xf4\x90\x80\x80",
            ];
            let bad = bad[rng.random_range(0..bad.len())];
            let mut body = b"{\"bad\":\"a".to_vec();
            body.extend_from_slice(bad);
            body.extend_from_slice(b"b\",");
            body.extend_from_slice(&text[1..]);
            (
                body,
                Expect::Refused(StatusCode::BAD_REQUEST, "invalid_json"),
                "a string that is not UTF-8".into(),
            )
        }
        65..=67 => {
            let text = object_text(&valid(rng));
            let raw: &[&[u8]] = &[
                b"\"a\x00b\"",
                b"\"\x01\"",
                b"\"\\ud800\"",
                b"\"\\udc00x\"",
                b"\"\\uZZZZ\"",
                b"\"\\x41\"",
            ];
            let raw = raw[rng.random_range(0..raw.len())];
            let mut body = b"{\"raw\":".to_vec();
            body.extend_from_slice(raw);
            body.push(b',');
            body.extend_from_slice(&text[1..]);
            (
                body,
                Expect::Refused(StatusCode::BAD_REQUEST, "invalid_json"),
                format!(
                    "a raw control character or a bad escape {}",
                    String::from_utf8_lossy(raw)
                ),
            )
        }
        68..=73 => {
            let depth = rng.random_range(1..400);
            let (open, close) = if rng.random_bool(0.5) {
                ("[", "]")
            } else {
                ("{\"a\":", "}")
            };
            let deep = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            let body = splice(&valid(rng), "deep", &deep);
            let expect = match depth {
                ..=100 => Expect::Accepted,
                140.. => Expect::Refused(StatusCode::BAD_REQUEST, "invalid_json"),
                _ => Expect::Any,
            };
            (body, expect, format!("nested {depth} deep"))
        }
        74..=79 => {
            let (literal, expect) = number_literal(rng);
            let body = splice(&valid(rng), "n", &literal);
            (body, expect, format!("the number {}", short(&literal)))
        }
        80..=84 => {
            let body = splice(
                &valid(rng),
                "dup",
                "1,\"dup\":{\"again\":[2]},\"dup\":\"last\"",
            );
            (body, Expect::Accepted, "duplicate keys".into())
        }
        85..=89 => {
            let around = [
                MAX_WEBHOOK_BYTES - 1,
                MAX_WEBHOOK_BYTES,
                MAX_WEBHOOK_BYTES + 1,
                rng.random_range(MAX_WEBHOOK_BYTES - 4096..MAX_WEBHOOK_BYTES + 4096),
                rng.random_range(MAX_WEBHOOK_BYTES..MAX_WEBHOOK_BYTES * 4),
            ];
            let size = around[rng.random_range(0..around.len())];
            let body = padded(&valid(rng), size);
            (body, Expect::Accepted, format!("a body of {size} bytes"))
        }
        90..=94 => {
            let junk: Vec<u8> = match rng.random_range(0..5) {
                0 => Vec::new(),
                1 => b" \n\t ".to_vec(),
                2 => b"a=1&b=2".to_vec(),
                3 => b"<order><id>1</id></order>".to_vec(),
                _ => (0..rng.random_range(1..300))
                    .map(|_| rng.random())
                    .collect(),
            };
            (junk, Expect::Any, "not JSON".into())
        }
        _ => {
            let top = [
                "null",
                "true",
                "0",
                "\"text\"",
                "[]",
                "{}",
                "[1,2,3]",
                "\"\\u00e9\\ud83e\\udd80\"",
            ][rng.random_range(0..8)];
            let expect = match kind {
                Kind::Plain | Kind::Signed(_) => Expect::Accepted,
                Kind::Contract => Expect::Refused(StatusCode::BAD_REQUEST, "missing_param"),
            };
            (top.as_bytes().to_vec(), expect, format!("the body {top}"))
        }
    }
}

/// A body the target accepts: any JSON for the plain and signed sources,
/// an object meeting the contract for the other one (with the params at
/// the right types).
fn valid_doc(rng: &mut StdRng, kind: Kind) -> Value {
    let mut value = random_value(rng, 0);
    if kind == Kind::Plain && rng.random_bool(0.3) {
        return value;
    }
    if !value.is_object() {
        value = json!({ "value": value });
    }
    if kind == Kind::Contract {
        let mut order = Map::new();
        order.insert("id".into(), json!(random_string(rng)));
        if rng.random_bool(0.5) {
            order.insert("total".into(), random_number(rng));
        }
        value["order"] = Value::Object(order);
        if rng.random_bool(0.5) {
            value["items"] = json!([{ "sku": random_string(rng) }]);
        } else if let Value::Object(map) = &mut value {
            map.remove("items");
        }
    }
    value
}

fn random_value(rng: &mut StdRng, depth: usize) -> Value {
    let scalar_only = depth >= 4;
    match rng.random_range(0..if scalar_only { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 => random_number(rng),
        3 | 4 => json!(random_string(rng)),
        5 => Value::Array(
            (0..rng.random_range(0..6))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.random_range(0..6))
                .map(|_| (random_string(rng), random_value(rng, depth + 1)))
                .collect(),
        ),
    }
}

fn random_number(rng: &mut StdRng) -> Value {
    match rng.random_range(0..8) {
        0 => json!(rng.random_range(-1000..1000)),
        1 => json!(rng.random::<i64>()),
        2 => json!(rng.random::<u64>()),
        3 => json!([i64::MIN, i64::MAX][rng.random_range(0..2)]),
        4 => json!(u64::MAX),
        5 => json!(f64::MAX * [1.0, -1.0][rng.random_range(0..2)]),
        6 => json!([f64::MIN_POSITIVE, 5e-324, -0.0, 1e-300][rng.random_range(0..4)]),
        _ => {
            let x = f64::from_bits(rng.random());
            if x.is_finite() { json!(x) } else { json!(1.5) }
        }
    }
}

/// Text of every kind JSON may carry, except U+0000.
fn random_string(rng: &mut StdRng) -> String {
    const PIECES: [&str; 16] = [
        "a",
        "order",
        "Z",
        " ",
        "é",
        "日本",
        "🦀",
        "\u{7f}",
        "\u{1}",
        "\n",
        "\t",
        "\"",
        "\\",
        "\u{FFFF}",
        "\u{10FFFF}",
        "\u{200B}",
    ];
    (0..rng.random_range(0..12))
        .map(|_| PIECES[rng.random_range(0..PIECES.len())])
        .collect()
}

/// `value` with U+0000 put in one string or key; says where.
fn with_nul(rng: &mut StdRng, value: Value) -> (Value, &'static str) {
    let mut value = if value.is_object() {
        value
    } else {
        json!({ "value": value })
    };
    match rng.random_range(0..4) {
        0 => {
            value["note"] = json!("before\u{0}after");
            (value, "in a string")
        }
        1 => {
            value["k\u{0}ey"] = json!(1);
            (value, "in a key")
        }
        2 => {
            value["nested"] = json!([{ "deeper": ["ok", "\u{0}"] }]);
            (value, "deep in a string")
        }
        _ => {
            value["long"] = json!(format!("{}\u{0}", "x".repeat(rng.random_range(0..20_000))));
            (value, "at the end of a long string")
        }
    }
}

/// A JSON number's text, and the answer it must get.
fn number_literal(rng: &mut StdRng) -> (String, Expect) {
    let exact: [&str; 12] = [
        "18446744073709551615",
        "-9223372036854775808",
        "18446744073709551616",
        "1.7976931348623157e308",
        "5e-324",
        "-0",
        "-0.0",
        "1E+2",
        "0.0000000000000000000000000000001",
        "123456789012345678901234567890",
        "1e-400",
        "0e99999",
    ];
    match rng.random_range(0..4) {
        0 | 1 => (
            exact[rng.random_range(0..exact.len())].to_owned(),
            Expect::Accepted,
        ),
        2 => (
            ["1e400", "-1e400", "1e309"][rng.random_range(0..3)].to_owned(),
            Expect::Refused(StatusCode::BAD_REQUEST, "invalid_json"),
        ),
        _ => (
            format!("1{}", "0".repeat(rng.random_range(20..1000))),
            Expect::Any,
        ),
    }
}

/// The text of `value` as an object (`{...}`).
fn object_text(value: &Value) -> Vec<u8> {
    let object = if value.is_object() {
        value.clone()
    } else {
        json!({ "value": value })
    };
    serde_json::to_vec(&object).unwrap()
}

/// `value` as an object with `"key": <raw>` put first, `raw` as it is.
fn splice(value: &Value, key: &str, raw: &str) -> Vec<u8> {
    let text = object_text(value);
    let mut body = format!("{{\"{key}\":{raw}").into_bytes();
    if text.len() > 2 {
        body.push(b',');
    }
    body.extend_from_slice(&text[1..]);
    body
}

/// `value` as an object padded with a long string to exactly `size` bytes
/// (or the smallest it can be).
fn padded(value: &Value, size: usize) -> Vec<u8> {
    let bare = splice(value, "pad", "\"\"").len();
    let pad = "p".repeat(size.saturating_sub(bare));
    let body = splice(value, "pad", &format!("\"{pad}\""));
    debug_assert!(body.len() == size.max(bare), "{} != {size}", body.len());
    body
}

/// One change of a JSON text's bytes.
fn mutate_bytes(rng: &mut StdRng, body: &mut Vec<u8>) {
    const INSERTS: [&[u8]; 16] = [
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b"\\",
        b",",
        b":",
        b"\xff",
        b"\xc0\x80",
        b"\x00",
        b"1e999",
        b"-",
        b"NaN",
        b"\\u0000",
        b"true",
    ];
    if body.is_empty() {
        body.push(b'{');
        return;
    }
    let at = rng.random_range(0..body.len());
    match rng.random_range(0..6) {
        0 => body[at] ^= 1 << rng.random_range(0..8),
        1 => body.insert(at, rng.random()),
        2 => {
            let end = (at + rng.random_range(1..16)).min(body.len());
            body.drain(at..end);
        }
        3 => {
            let end = (at + rng.random_range(1..64)).min(body.len());
            let copy = body[at..end].to_vec();
            body.splice(at..at, copy);
        }
        4 => body.truncate(at),
        _ => {
            let insert = INSERTS[rng.random_range(0..INSERTS.len())];
            body.splice(at..at, insert.iter().copied());
        }
    }
}

/// Tenant A's bodies with U+0000, which tok refuses, sent at the same time
/// as tenant B's well-formed webhooks: each of A's is refused with where
/// the character is, and every one of B's is accepted, in B's inbox and
/// run, whatever the group commit wrote them with.
async fn one_tenants_refused_bytes_fail_none_of_anothers_webhooks(app: &TestApp) {
    const EACH: usize = 120;
    let refused = app.create_tenant("Refused").await;
    let clean = app.create_tenant("Clean").await;
    let theirs = app.create_source(&refused, &plain_source("bytes")).await;
    let ours = app.create_source(&clean, &plain_source("orders")).await;
    let ours_id = ours["id"].as_str().unwrap();
    app.create_automation(
        &clean,
        &on_webhook("Log", ours_id, &json!([log_step("st_log", "order {{n}}")])),
    )
    .await;
    app.stop_engine().await;

    let mut requests = Vec::new();
    for n in 0..EACH {
        let bad = match n % 4 {
            0 => json!({ "n": n, "blob": "PK\u{3}\u{4}\u{0}\u{0}" }),
            1 => json!({ "n": n, "k\u{0}": true }),
            2 => json!({ "n": n, "deep": [[{ "x": "\u{0}" }]] }),
            _ => json!(format!("{n}\u{0}")),
        };
        requests.push((
            true,
            webhook_request(theirs["token"].as_str().unwrap(), &bad),
        ));
        let good = json!({ "n": n, "blob": "PK\\u0003\\u0004" });
        requests.push((
            false,
            webhook_request(ours["token"].as_str().unwrap(), &good),
        ));
    }
    let (kinds, requests): (Vec<bool>, Vec<_>) = requests.into_iter().unzip();
    let replies = app.send_together(requests).await;
    let mut ids = HashSet::new();
    for (is_refused, reply) in kinds.into_iter().zip(replies) {
        if is_refused {
            let error = reply.expect_error(StatusCode::BAD_REQUEST, "nul_in_json");
            assert!(error["path"].is_string(), "{error:#}");
        } else {
            let body = reply.expect(StatusCode::ACCEPTED);
            assert_eq!(body["duplicate"], false, "{body:#}");
            ids.insert(body["event_id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        ids.len(),
        EACH,
        "one event for each of the clean tenant's webhooks"
    );
    for (tenant, pending) in [(&refused, 0), (&clean, EACH)] {
        let queue = app
            .get(&tenant.key, "/api/dashboard/queue")
            .await
            .expect(StatusCode::OK);
        assert_eq!(queue["pending_events"], pending, "{}: {queue:#}", tenant.id);
    }

    app.start_engine().await;
    let runs = app.wait_for_runs(&clean, "", EACH).await;
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{runs:#?}");
    let none = app.get(&refused.key, "/api/dashboard/runs").await;
    assert_eq!(none.expect(StatusCode::OK)["items"], json!([]));
}

fn webhook_request(token: &str, body: &Value) -> Request<Body> {
    crate::helpers::json_request(Method::POST, &format!("/webhook/{token}"), &[], body)
}
