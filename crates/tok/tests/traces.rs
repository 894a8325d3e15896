//! Traces over OTLP/HTTP, with a real `tok serve` and a local OTLP
//! receiver (protobuf, `/v1/traces`, as an OpenTelemetry collector takes
//! it): a webhook sent with a `traceparent` starts a run of three steps
//! (a `set`, an `http` call to a local service, a log); the receiver gets
//! the run's span as a child of the sender's span, in the sender's trace,
//! and one span per step as children of the run's, each with the tenant,
//! automation, run and step ids; the service is called with a
//! `traceparent` of that trace whose parent is a span the receiver got.
//! A webhook without one gets a trace of its own, and the same holds in
//! it: the run's and steps' spans, the worker's claim and execute spans
//! and the call's `traceparent` are one trace. On each backend.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;
use serde_json::{Value, json};
use tok_store::testing::{TestDb, backends};

use support::{ADMIN_KEY, Api, Server, free_port};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN: &str = "00f067aa0ba902b7";

/// A span as the receiver got it, ids in hex.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: Vec<(String, String)>,
}

impl Got {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

type Spans = Arc<Mutex<Vec<Got>>>;

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

async fn receive(State(spans): State<Spans>, body: Bytes) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf request");
    let mut got = spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref()))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                got.push(Got {
                    service: service.clone(),
                    name: span.name.clone(),
                    trace: hex::encode(&span.trace_id),
                    id: hex::encode(&span.span_id),
                    parent: hex::encode(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                        .collect(),
                });
            }
        }
    }
    ""
}

/// The local OTLP receiver: its base URL and what it received.
async fn receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let base = support::serve(
        Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone()),
    )
    .await;
    (base, spans)
}

type Seen = Arc<Mutex<Vec<String>>>;

async fn service_call(State(seen): State<Seen>, headers: HeaderMap) -> axum::Json<Value> {
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    seen.lock().unwrap().push(traceparent);
    axum::Json(json!({ "ok": true }))
}

/// The service the run calls: the `traceparent` of each call.
async fn service() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let base = support::serve(
        Router::new()
            .route("/hook", post(service_call))
            .with_state(seen.clone()),
    )
    .await;
    (base, seen)
}

/// The spans of run `run` once its run span arrived (30 s at most).
async fn spans_of(spans: &Spans, run: &str) -> Vec<Got> {
    for _ in 0..300 {
        {
            let got = spans.lock().unwrap();
            if got
                .iter()
                .any(|s| s.name == "run" && s.attribute("tok.run_id") == Some(run))
            {
                let run_span = got
                    .iter()
                    .find(|s| s.name == "run" && s.attribute("tok.run_id") == Some(run))
                    .unwrap();
                let trace = run_span.trace.clone();
                return got.iter().filter(|s| s.trace == trace).cloned().collect();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no span of run {run} reached the OTLP receiver within 30 s");
}

/// The spans of trace `trace` once `complete` holds for them (30 s at
/// most): the live spans of a claim are batched apart from the run's.
async fn spans_until(spans: &Spans, trace: &str, complete: impl Fn(&[Got]) -> bool) -> Vec<Got> {
    for _ in 0..300 {
        let got: Vec<Got> = {
            let got = spans.lock().unwrap();
            got.iter().filter(|s| s.trace == trace).cloned().collect()
        };
        if complete(&got) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = spans.lock().unwrap().clone();
    panic!("the spans of trace {trace} did not all arrive within 30 s; the receiver got: {got:#?}");
}

async fn webhook(api: &Api, url: &str, traceparent: Option<&str>, order: &str) -> String {
    let mut request = api
        .http
        .post(url)
        .json(&json!({ "order": { "id": order } }));
    if let Some(tp) = traceparent {
        request = request.header("traceparent", tp);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 202, "{body:#}");
    body["event_id"].as_str().unwrap().to_owned()
}

/// The run the event started, once it has finished.
async fn run_of(api: &Api, key: &str, automation: &str, event: &str) -> Value {
    for _ in 0..300 {
        let runs = api
            .get(&format!("/api/runs?automation={automation}"), key)
            .await;
        let items = runs["items"].as_array().cloned().unwrap_or_default();
        if let Some(run) = items.iter().find(|r| r["event_id"] == event) {
            let id = run["id"].as_str().unwrap();
            return api.final_run(key, id).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("event {event} started no run within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhooks_trace_becomes_its_runs_with_a_span_per_step_and_traceparent_on_the_call() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let (otlp, spans) = receiver().await;
        let (base, seen) = service().await;
        let allow = support::allow(&base);
        let port = free_port();
        let _server = Server::start(
            &db.url,
            port,
            &[],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
                ("OTEL_SERVICE_NAME", "tok-traces-test"),
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
                ("TOK_OUTBOUND_ALLOW", allow.as_str()),
            ],
        );
        let api = Api::new(port);
        api.wait_ready().await;
        let tenant = api
            .post("/api/tenants", ADMIN_KEY, json!({ "name": "Traced" }))
            .await;
        let key = tenant["api_key"].as_str().unwrap().to_owned();
        let source = api
            .post("/api/sources", &key, json!({ "name": "shop" }))
            .await;
        api.post(
            "/api/connections",
            &key,
            json!({ "name": "service", "service": "http", "base_url": base }),
        )
        .await;
        let automation = api
            .post(
                "/api/automations",
                &key,
                json!({
                    "name": "Traced",
                    "trigger": { "kind": "webhook", "source": source["id"] },
                    "steps": [
                        { "id": "st_mark", "type": "set", "config": { "values": { "order": "{{_body.order.id}}" } } },
                        { "id": "st_call", "type": "http",
                          "config": { "connection": "service", "method": "POST", "url": "/hook", "body": { "order": "{{order}}" } } },
                        { "id": "st_done", "type": "flow/log", "config": { "message": "order {{order}} done" } }
                    ]
                }),
            )
            .await;
        let url = source["url"].as_str().unwrap();
        let sent = format!("00-{TRACE}-{SENDER_SPAN}-01");
        let event = webhook(&api, url, Some(&sent), "o-1").await;
        let run = run_of(&api, &key, automation["id"].as_str().unwrap(), &event).await;
        assert_eq!(run["status"], "completed", "{run:#}");
        let run_id = run["id"].as_str().unwrap();

        let got = spans_of(&spans, run_id).await;
        let run_span = got.iter().find(|s| s.name == "run").unwrap();
        assert_eq!(
            run_span.trace, TRACE,
            "the run continues the sender's trace"
        );
        assert_eq!(
            run_span.parent, SENDER_SPAN,
            "the run's parent is the sender's span"
        );
        assert_eq!(run_span.service, "tok-traces-test", "OTEL_SERVICE_NAME");
        assert_eq!(run_span.attribute("tok.tenant_id"), tenant["id"].as_str());
        assert_eq!(
            run_span.attribute("tok.automation_id"),
            automation["id"].as_str()
        );
        assert_eq!(run_span.attribute("tok.run.status"), Some("completed"));
        let mut steps: Vec<&Got> = got
            .iter()
            .filter(|s| s.name == "step" && s.parent == run_span.id)
            .collect();
        steps.sort_by_key(|s| s.attribute("tok.step.path").map(str::to_owned));
        let ids: Vec<_> = steps.iter().map(|s| s.attribute("tok.step_id")).collect();
        assert_eq!(
            ids,
            vec![Some("st_mark"), Some("st_call"), Some("st_done")],
            "one span per step, children of the run's: {got:#?}"
        );
        for step in &steps {
            assert_eq!(step.attribute("tok.run_id"), Some(run_id));
            assert_eq!(step.attribute("tok.tenant_id"), tenant["id"].as_str());
            assert_eq!(
                step.attribute("tok.automation_id"),
                automation["id"].as_str()
            );
            assert_eq!(step.attribute("tok.step.status"), Some("completed"));
        }

        // The service saw the trace: its parent is the call's span (the
        // live span of the step's work, a child of the step's span).
        let calls = seen.lock().unwrap().clone();
        assert_eq!(calls.len(), 1, "{calls:?}");
        let parts: Vec<&str> = calls[0].split('-').collect();
        assert_eq!(parts.len(), 4, "a traceparent: {:?}", calls[0]);
        assert_eq!(parts[1], TRACE, "the call carries the run's trace");
        let call_span = got.iter().find(|s| s.id == parts[2]).unwrap_or_else(|| {
            panic!("the call's parent span {} was exported: {got:#?}", parts[2])
        });
        let http_step = steps[1];
        assert!(
            call_span.id == http_step.id || call_span.parent == http_step.id,
            "the call's span is the http step's or its child: {call_span:?}"
        );
        // The worker's claims are children of the run's span.
        let run_span_id = run_span.id.clone();
        spans_until(&spans, TRACE, |got| {
            got.iter()
                .any(|s| s.name == "claim" && s.parent == run_span_id)
        })
        .await;

        // Without a traceparent: a trace of the run's own, the run its
        // root, and everything of the run in it.
        let event = webhook(&api, url, None, "o-2").await;
        let run = run_of(&api, &key, automation["id"].as_str().unwrap(), &event).await;
        let run_id = run["id"].as_str().unwrap();
        let got = spans_of(&spans, run_id).await;
        let run_span = got.iter().find(|s| s.name == "run").unwrap().clone();
        assert_ne!(run_span.trace, TRACE);
        assert_eq!(
            run_span.parent, "",
            "a run without a sender's trace is a root span"
        );
        let steps: Vec<Got> = got
            .iter()
            .filter(|s| s.name == "step" && s.parent == run_span.id)
            .cloned()
            .collect();
        assert_eq!(steps.len(), 3, "{got:#?}");
        let http_step = steps
            .iter()
            .find(|s| s.attribute("tok.step_id") == Some("st_call"))
            .unwrap();
        let calls = seen.lock().unwrap().clone();
        assert_eq!(calls.len(), 2, "{calls:?}");
        let parts: Vec<&str> = calls[1].split('-').collect();
        assert_eq!(parts.len(), 4, "a traceparent: {:?}", calls[1]);
        assert_eq!(
            parts[1], run_span.trace,
            "the call carries the trace of the run's exported spans"
        );
        let call_parent = parts[2].to_owned();
        let got = spans_until(&spans, &run_span.trace, |got| {
            got.iter().any(|s| s.id == call_parent)
                && got
                    .iter()
                    .any(|s| s.name == "claim" && s.parent == run_span.id)
                && got
                    .iter()
                    .any(|s| s.name == "execute" && s.parent == http_step.id)
        })
        .await;
        let call_span = got.iter().find(|s| s.id == call_parent).unwrap();
        assert!(
            call_span.id == http_step.id || call_span.parent == http_step.id,
            "the call's span is the http step's or its child: {call_span:?}"
        );

        // A run of control steps only ends in the dispatch that starts it,
        // and is exported from there.
        let pure = api
            .post(
                "/api/automations",
                &key,
                json!({
                    "name": "Pure",
                    "trigger": { "kind": "webhook", "source": source["id"] },
                    "steps": [{ "id": "st_note", "type": "set", "config": { "values": { "seen": true } } }]
                }),
            )
            .await;
        let event = webhook(&api, url, Some(&sent), "o-3").await;
        let run = run_of(&api, &key, pure["id"].as_str().unwrap(), &event).await;
        let pure_run = run["id"].as_str().unwrap();
        // The sender's trace holds the other runs it started too.
        let got = spans_of(&spans, pure_run).await;
        let run_span = got
            .iter()
            .find(|s| s.name == "run" && s.attribute("tok.run_id") == Some(pure_run))
            .unwrap();
        assert_eq!(run_span.trace, TRACE, "{run_span:?}");
        assert_eq!(
            got.iter()
                .filter(|s| s.name == "step" && s.parent == run_span.id)
                .count(),
            1,
            "{got:#?}"
        );

        // A manual start sent with a traceparent continues it too.
        let quick = api
            .post(
                "/api/automations",
                &key,
                json!({
                    "name": "Quick",
                    "trigger": { "kind": "manual" },
                    "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "quick" } }]
                }),
            )
            .await;
        let other_trace = "0af7651916cd43dd8448eb211c80319c";
        let started: Value = api
            .http
            .post(format!(
                "{}/api/automations/{}/runs",
                api.base,
                quick["id"].as_str().unwrap()
            ))
            .bearer_auth(&key)
            .header(
                "traceparent",
                format!("00-{other_trace}-b7ad6b7169203331-01"),
            )
            .json(&json!({ "input": {} }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let quick_run = started["run_id"].as_str().unwrap();
        let got = spans_of(&spans, quick_run).await;
        let run_span = got.iter().find(|s| s.name == "run").unwrap();
        assert_eq!(run_span.trace, other_trace, "{run_span:?}");
        assert_eq!(run_span.parent, "b7ad6b7169203331", "{run_span:?}");
        assert_eq!(run_span.attribute("tok.trigger"), Some("manual"));

        // A run cancelled through the API is exported when the cancel ends it.
        let waits = api
            .post(
                "/api/automations",
                &key,
                json!({
                    "name": "Waits",
                    "trigger": { "kind": "manual" },
                    "steps": [{ "id": "st_wait", "type": "wait_for_event",
                                "config": { "key": "never", "timeout": "1h" } }]
                }),
            )
            .await;
        let started = api
            .post(
                &format!("/api/automations/{}/runs", waits["id"].as_str().unwrap()),
                &key,
                json!({ "input": {} }),
            )
            .await;
        let waiting = started["run_id"].as_str().unwrap().to_owned();
        for _ in 0..300 {
            let run = api.get(&format!("/api/runs/{waiting}"), &key).await;
            if run["status"] == "waiting" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let cancelled = api
            .post(&format!("/api/runs/{waiting}/cancel"), &key, json!({}))
            .await;
        assert_eq!(cancelled["status"], "cancelled", "{cancelled:#}");
        let got = spans_of(&spans, &waiting).await;
        let run_span = got.iter().find(|s| s.name == "run").unwrap();
        assert_eq!(run_span.attribute("tok.run.status"), Some("cancelled"));
        drop(_server);
        db.cleanup().await;
    }
}
