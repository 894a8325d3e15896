//! Retention as a client sees it: a successful step's long input and
//! output come back truncated (size, SHA-256, first 512 bytes) while the
//! next step read them whole; a failed step and an automation with
//! `keepStepData` keep everything; `PATCH /api/tenants/{id}` changes a
//! tenant's retention (admin only, checked). And `GET /metrics` shows the
//! metric of each of the six questions after some runs.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tower::ServiceExt;

use crate::helpers::{TestApp, run};

tok_store::backend_tests!(
    run;
    a_successful_steps_long_data_is_stored_truncated_and_the_next_step_read_it_whole,
    a_failed_step_and_keep_step_data_keep_everything,
    the_admin_changes_a_tenants_retention,
    metrics_answer_the_six_questions,
);

fn long_text() -> String {
    "lorem ipsum ".repeat(100)
}

fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn step<'a>(run: &'a Value, id: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step_id"] == id)
        .unwrap_or_else(|| panic!("no step {id}: {run:#}"))
}

fn copying(settings: Value) -> Value {
    json!({
        "name": "Copy",
        "trigger": { "kind": "manual" },
        "steps": [
            { "id": "st_big", "type": "set", "config": { "values": { "body": "{{text}}" } } },
            { "id": "st_copy", "type": "set", "config": { "values": { "copy": "{{st_big.body}}" } } },
            { "id": "st_small", "type": "set", "config": { "values": { "n": "1" } } }
        ],
        "settings": settings
    })
}

async fn a_successful_steps_long_data_is_stored_truncated_and_the_next_step_read_it_whole(
    app: &TestApp,
) {
    let tenant = app.create_tenant("Acme").await;
    let automation = app.create_automation(&tenant, &copying(json!({}))).await;
    let text = long_text();
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": { "text": text } }))
        .await;
    let run = app.wait_for_final(&tenant, &run).await;
    assert_eq!(run["status"], "completed", "{run:#}");

    let big = &step(&run, "st_big")["output"];
    let whole = json!({ "body": text }).to_string();
    assert_eq!(big["_truncated"], true, "{big:#}");
    assert_eq!(big["bytes"], whole.len());
    assert_eq!(big["sha256"], sha256(&whole));
    assert_eq!(big["head"].as_str().unwrap(), &whole[..512]);

    // The next step read the whole body: its copy (stored truncated too)
    // has the hash of the whole text, and the run's context has it whole.
    let copy = &step(&run, "st_copy")["output"];
    assert_eq!(copy["sha256"], sha256(&json!({ "copy": text }).to_string()));
    assert_eq!(
        run["context"]["st_copy"]["copy"], text,
        "{:#}",
        run["context"]
    );

    // A short value is stored as it is.
    assert_eq!(step(&run, "st_small")["output"], json!({ "n": "1" }));
}

async fn a_failed_step_and_keep_step_data_keep_everything(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let text = long_text();
    let failing = app
        .create_automation(
            &tenant,
            &json!({
                "name": "Fails",
                "trigger": { "kind": "manual" },
                "steps": [
                    { "id": "st_bad", "type": "http",
                      "config": { "method": "POST", "url": "not a url {{text}}" } }
                ]
            }),
        )
        .await;
    let run = app
        .start_run(&tenant, &failing, &json!({ "input": { "text": text } }))
        .await;
    let run = app.wait_for_final(&tenant, &run).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    let bad = step(&run, "st_bad");
    assert_eq!(bad["status"], "failed");
    assert!(bad["input"].get("_truncated").is_none(), "{bad:#}");
    assert!(bad["input"].to_string().contains(&text), "{bad:#}");

    let kept = app
        .create_automation(&tenant, &copying(json!({ "keepStepData": true })))
        .await;
    let run = app
        .start_run(&tenant, &kept, &json!({ "input": { "text": text } }))
        .await;
    let run = app.wait_for_final(&tenant, &run).await;
    assert_eq!(step(&run, "st_big")["output"], json!({ "body": text }));
    assert_eq!(step(&run, "st_copy")["output"], json!({ "copy": text }));
}

async fn the_admin_changes_a_tenants_retention(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let uri = format!("/api/tenants/{}", tenant.id);
    let changed = app
        .patch(
            &app.admin_key,
            &uri,
            &json!({ "settings": { "retention": { "traceDays": 120 } } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(changed["id"], tenant.id);
    assert_eq!(
        changed["settings"]["retention"],
        json!({ "stepDataDays": 30, "runsDays": 365, "traceDays": 120, "inboxDays": 30,
                 "auditDays": 365 })
    );
    // A second change keeps what the first set.
    let changed = app
        .patch(
            &app.admin_key,
            &uri,
            &json!({ "settings": { "retention": { "stepDataDays": 7 } } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(changed["settings"]["retention"]["traceDays"], 120);
    assert_eq!(changed["settings"]["retention"]["stepDataDays"], 7);

    for (body, says) in [
        (json!({ "stepDataDays": 0 }), "retention.stepDataDays"),
        (json!({ "stepDataDays": 400 }), "longer than runsDays"),
        (json!({ "stepDays": 3 }), "stepDays"),
        (json!({ "runsDays": "a year" }), "runsDays"),
        (json!({ "auditDays": 0 }), "retention.auditDays"),
    ] {
        let error = app
            .patch(
                &app.admin_key,
                &uri,
                &json!({ "settings": { "retention": body } }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_settings");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    let unchanged = app
        .patch(&app.admin_key, &uri, &json!({}))
        .await
        .expect(StatusCode::OK);
    assert_eq!(unchanged["settings"]["retention"]["stepDataDays"], 7);

    let own = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "settings": { "retention": { "runsDays": 3650 } } }),
        )
        .await;
    assert_eq!(own.status, StatusCode::FORBIDDEN, "{:#}", own.body);
    app.patch(&app.admin_key, "/api/tenants/ten_nope", &json!({}))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}

/// The process's one metrics recorder (a recorder is global), its metrics
/// described as `tok serve` describes them.
pub(crate) fn recorder() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("install the metrics recorder");
            tok_server::describe_metrics();
            handle
        })
        .clone()
}

/// The metric families of a Prometheus text exposition that lack a
/// `# HELP` or a `# TYPE` line (Prometheus's linter refuses them).
pub(crate) fn undescribed(text: &str) -> Vec<String> {
    let mut described = std::collections::BTreeSet::new();
    let mut typed = std::collections::BTreeMap::new();
    let mut sampled = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            described.insert(rest.split(' ').next().unwrap_or_default().to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            typed.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            sampled.insert(line.split(['{', ' ']).next().unwrap_or_default().to_owned());
        }
    }
    let mut missing: Vec<String> = sampled
        .into_iter()
        .map(|sample| {
            ["_sum", "_count", "_bucket"]
                .iter()
                .find_map(|suffix| {
                    let base = sample.strip_suffix(suffix)?;
                    matches!(
                        typed.get(base).map(String::as_str),
                        Some("summary" | "histogram")
                    )
                    .then(|| base.to_owned())
                })
                .unwrap_or(sample)
        })
        .filter(|family| !described.contains(family) || !typed.contains_key(family))
        .collect();
    missing.dedup();
    missing
}

async fn metrics_text(app: &TestApp) -> String {
    let router = tok_server::app(app.state.clone().with_metrics(recorder()));
    let request = Request::get("/metrics")
        .header("authorization", format!("Bearer {}", app.admin_key))
        .body(Body::empty())
        .unwrap();
    let reply = router.oneshot(request).await.unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let body = reply.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

async fn metrics_answer_the_six_questions(app: &TestApp) {
    recorder();
    let tenant = app.create_tenant("Acme").await;
    let automation = app.create_automation(&tenant, &copying(json!({}))).await;
    let run = app
        .start_run(&tenant, &automation, &json!({ "input": { "text": "t" } }))
        .await;
    app.wait_for_final(&tenant, &run).await;
    // An event through the inbox, for its lag.
    let source = app
        .create_source(&tenant, &json!({ "name": "shop", "params": [] }))
        .await;
    app.create_automation(
        &tenant,
        &json!({
            "name": "On order",
            "trigger": { "kind": "webhook", "source": source["id"] },
            "steps": [{ "id": "st_log", "type": "flow/log", "config": { "message": "hi" } }]
        }),
    )
    .await;
    app.webhook(source["token"].as_str().unwrap(), &json!({ "id": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);

    let wanted = [
        // Is it keeping up? / busy or stuck?
        "tok_queue_ready_jobs".to_owned(),
        "tok_queue_oldest_ready_seconds".to_owned(),
        // Where does it drag?
        "tok_step_duration_seconds{type=\"set\",quantile=\"0.95\"}".to_owned(),
        "tok_step_duration_seconds_count{type=\"set\"}".to_owned(),
        // What is broken? (finished runs by status; steps by status
        // include `retrying`)
        "tok_runs_finished_total{status=\"completed\"}".to_owned(),
        // Who is the noisy neighbour?
        format!(
            "tok_steps_total{{tenant=\"{}\",status=\"completed\"}}",
            tenant.id
        ),
        // Does the dispatcher keep up?
        "tok_inbox_lag_seconds_count".to_owned(),
        "tok_inbox_pending_events".to_owned(),
    ];
    let text = app
        .poll("every metric on /metrics", async || {
            let text = metrics_text(app).await;
            wanted
                .iter()
                .all(|name| text.contains(name.as_str()))
                .then_some(text)
                .ok_or(())
        })
        .await;
    for name in &wanted {
        assert!(text.contains(name.as_str()), "{name} missing:\n{text}");
    }
    // Every family says what it is (`# HELP`, `# TYPE`).
    let missing = undescribed(&text);
    assert!(
        missing.is_empty(),
        "families without HELP: {missing:?}\n{text}"
    );
}
