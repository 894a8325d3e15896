//! Why a run waits (docs/workflows.md, "Why a run waits"): `GET
//! /api/runs/{id}` (and the runs listing) says what holds a run that is
//! neither running nor finished — a timer, a signal, a decision, its
//! connection's rate limit, its tenant's concurrency cap — with `until`
//! where it is known, and `null` once it runs or ends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::any;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::helpers::{Tenant, TestApp, backend_tests, log_step, manual};

backend_tests!(
    crate::helpers::run_with_service;
    a_waiting_run_says_what_holds_it_and_until_when,
    a_run_held_by_its_connections_rate_or_its_tenants_cap_says_so,
    a_tickets_second_run_is_held_by_the_first_on_the_tickets_queue,
);

async fn detail(app: &TestApp, tenant: &Tenant, run: &str) -> Value {
    app.get(&tenant.key, &format!("/api/runs/{run}"))
        .await
        .expect(StatusCode::OK)
}

/// Starts a run of `steps` and waits until `blocked_by` says `kind`.
async fn held(app: &TestApp, tenant: &Tenant, name: &str, steps: Value, kind: &str) -> Value {
    let automation = app.create_automation(tenant, &manual(name, &steps)).await;
    let run = app
        .start_run(tenant, &automation, &json!({ "input": {} }))
        .await;
    app.wait_for_run(tenant, &run, |r| r["blocked_by"]["kind"] == kind)
        .await
}

/// `until` as milliseconds, asserted to be within the next `within_ms`.
fn until_within(run: &Value, within_ms: i64) -> i64 {
    let until = run["blocked_by"]["until"]
        .as_str()
        .unwrap_or_else(|| panic!("no until: {run:#}"));
    let at: jiff::Timestamp = until.parse().unwrap();
    let left = at.as_millisecond() - jiff::Timestamp::now().as_millisecond();
    assert!(left > 0 && left <= within_ms, "until {until}: {run:#}");
    left
}

async fn a_waiting_run_says_what_holds_it_and_until_when(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let timer = held(
        app,
        &tenant,
        "Later",
        json!([{ "id": "st_wait", "type": "wait", "config": { "duration": "1h" } },
               log_step("st_after", "later")]),
        "timer",
    )
    .await;
    // The detail's reads are not one snapshot: the run's row may still say
    // `queued` while its job already waits; it says `waiting` at once after.
    let id = timer["id"].as_str().unwrap();
    let timer = app
        .wait_for_run(&tenant, id, |r| {
            r["status"] == "waiting" && r["blocked_by"]["kind"] == "timer"
        })
        .await;
    until_within(&timer, 3_600_000);
    // The runs listing says it too.
    let listed = app
        .get(
            &tenant.key,
            &format!(
                "/api/runs?automation={}",
                timer["automation_id"].as_str().unwrap()
            ),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        listed["items"][0]["blocked_by"], timer["blocked_by"],
        "{listed:#}"
    );

    let signal = held(
        app,
        &tenant,
        "Paid",
        json!([{ "id": "st_paid", "type": "wait_for_event",
                 "config": { "key": "order-1", "timeout": "2h" } }]),
        "signal",
    )
    .await;
    assert_eq!(
        signal["blocked_by"]["detail"]["key"], "order-1",
        "{signal:#}"
    );
    assert!(until_within(&signal, 7_200_000) > 3_600_000, "{signal:#}");
    // Signalled, it runs on and ends: nothing holds it.
    app.post(&tenant.key, "/api/signals", &json!({ "key": "order-1" }))
        .await
        .expect(StatusCode::ACCEPTED);
    let id = signal["id"].as_str().unwrap();
    let done = app.wait_for_final(&tenant, id).await;
    assert_eq!(done["blocked_by"], Value::Null, "{done:#}");

    app.create_group(&tenant, "Finance", &["Alice"]).await;
    let approval = held(
        app,
        &tenant,
        "Refund",
        json!([{ "id": "st_ok", "type": "approval",
                 "config": { "approvers": { "group": "Finance" }, "prompt": "Refund?" } }]),
        "approval",
    )
    .await;
    let pending = app
        .get(&tenant.key, "/api/approvals")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        approval["blocked_by"]["detail"]["approvalId"], pending["items"][0]["id"],
        "{approval:#}"
    );

    // The listing filtered by what holds the runs, a page at a time.
    let later = app
        .start_run(
            &tenant,
            timer["automation_id"].as_str().unwrap(),
            &json!({}),
        )
        .await;
    app.wait_for_run(&tenant, &later, |r| r["blocked_by"]["kind"] == "timer")
        .await;
    let by = async |query: &str| {
        app.get(&tenant.key, &format!("/api/runs?{query}"))
            .await
            .expect(StatusCode::OK)
    };
    let first = by("blocked_by=timer&limit=1").await;
    assert_eq!(
        first["items"][0]["id"],
        later.as_str(),
        "newest first: {first:#}"
    );
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let second = by(&format!("blocked_by=timer&limit=1&cursor={cursor}")).await;
    assert_eq!(second["items"][0]["id"], timer["id"], "{second:#}");
    let approvals = by("blocked_by=approval").await;
    assert_eq!(
        approvals["items"].as_array().unwrap().len(),
        1,
        "{approvals:#}"
    );
    assert_eq!(approvals["items"][0]["id"], approval["id"], "{approvals:#}");
    assert_eq!(
        by("blocked_by=signal").await["items"],
        json!([]),
        "the signalled run ended"
    );
    let error = app
        .get(&tenant.key, "/api/runs?blocked_by=weather")
        .await
        .expect_error(StatusCode::BAD_REQUEST, "bad_query");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("tenant_concurrency"),
        "{error:#}"
    );
}

/// The test's service: its address, the permits its answers wait for,
/// and how many calls reached it.
struct Gated {
    addr: SocketAddr,
    permits: Arc<Semaphore>,
    calls: Arc<AtomicUsize>,
}

async fn gated_service(app: &TestApp) -> Gated {
    let permits = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    let (gate, seen) = (permits.clone(), calls.clone());
    let service = Router::new().route(
        "/{*path}",
        any(async move || {
            seen.fetch_add(1, Ordering::SeqCst);
            gate.acquire().await.unwrap().forget();
            axum::Json(json!({ "ok": true }))
        }),
    );
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    Gated {
        addr,
        permits,
        calls,
    }
}

async fn a_run_held_by_its_connections_rate_or_its_tenants_cap_says_so(app: &TestApp) {
    let service = gated_service(app).await;
    service.permits.add_permits(1_000);
    let addr = service.addr;
    let tenant = app.create_tenant("Acme").await;
    // One call per 100 s: the first goes, the next waits for the bucket.
    app.post(
        &tenant.key,
        "/api/connections",
        &json!({ "name": "slow", "service": "http", "base_url": format!("http://{addr}"),
                 "rate": 0.01, "burst": 1 }),
    )
    .await
    .expect(StatusCode::CREATED);
    let call = json!([{ "id": "st_call", "type": "http",
                        "config": { "connection": "slow", "method": "POST", "url": "/orders" } }]);
    let first = app
        .create_automation(&tenant, &manual("First", &call))
        .await;
    let first = app.start_run(&tenant, &first, &json!({})).await;
    assert_eq!(
        app.wait_for_final(&tenant, &first).await["status"],
        "completed"
    );
    let rated = held(app, &tenant, "Second", call, "connection_rate").await;
    until_within(&rated, 100_000);
    assert!(
        rated["blocked_by"]["detail"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("connection `slow`") && r.contains("rate limit")),
        "{rated:#}"
    );

    // A tenant capped at one step in flight, whose one step hangs (the
    // same service, its permits used up).
    service.permits.forget_permits(usize::MAX);
    let capped = app.create_tenant("Capped").await;
    app.patch(
        &app.admin_key,
        &format!("/api/tenants/{}", capped.id),
        &json!({ "settings": { "limits": { "concurrency": 1 } } }),
    )
    .await
    .expect(StatusCode::OK);
    let hang = json!([{ "id": "st_call", "type": "http",
                        "config": { "method": "POST", "url": format!("http://{addr}/hang"),
                                    "timeoutMs": 60000 } }]);
    let automation = app
        .create_automation(&capped, &manual("Hangs", &hang))
        .await;
    let before = service.calls.load(Ordering::SeqCst);
    let running = app.start_run(&capped, &automation, &json!({})).await;
    app.poll("the first call in flight", async || {
        (service.calls.load(Ordering::SeqCst) > before)
            .then_some(())
            .ok_or(())
    })
    .await;
    let second = app.start_run(&capped, &automation, &json!({})).await;
    let waiting = app
        .wait_for_run(&capped, &second, |r| {
            r["blocked_by"]["kind"] == "tenant_concurrency"
        })
        .await;
    assert_eq!(
        waiting["blocked_by"]["detail"],
        json!({ "limit": 1, "running": 1 }),
        "{waiting:#}"
    );
    assert_eq!(
        detail(app, &capped, &running).await["blocked_by"],
        Value::Null,
        "the run in flight is not held"
    );
    service.permits.add_permits(2);
    for run in [running, second] {
        let done = app.wait_for_final(&capped, &run).await;
        assert_eq!(done["status"], "completed", "{done:#}");
        assert_eq!(done["blocked_by"], Value::Null, "{done:#}");
    }
}

/// Two automations run on one ticket's change: one step at a time per
/// ticket, so while the first run's call hangs, the other run is held by
/// the ticket's queue key and names the run ahead of it.
async fn a_tickets_second_run_is_held_by_the_first_on_the_tickets_queue(app: &TestApp) {
    let service = gated_service(app).await;
    let tenant = app.create_tenant("Acme").await;
    app.create_ticket_type(&tenant, "order", &["new", "shipped"])
        .await;
    let call = json!([{ "id": "st_call", "type": "http",
                        "config": { "method": "POST", "url": format!("http://{}/hook", service.addr),
                                    "timeoutMs": 60000 } }]);
    let mut automations = Vec::new();
    for name in ["Notify", "Invoice"] {
        let definition = json!({ "name": name,
                                 "trigger": { "kind": "event", "event": "ticket.updated" },
                                 "steps": call });
        automations.push(app.create_automation(&tenant, &definition).await);
    }
    let ticket = app
        .create_ticket(&tenant, &json!({ "external_id": "T-1", "type": "order" }))
        .await;
    let ticket = ticket["id"].as_str().unwrap().to_owned();
    app.patch(
        &tenant.key,
        &format!("/api/tickets/{ticket}"),
        &json!({ "status": "shipped" }),
    )
    .await
    .expect(StatusCode::OK);
    let runs: Vec<String> = app
        .poll("a run of each automation", async || {
            let mut ids = Vec::new();
            for automation in &automations {
                let page = app
                    .get(&tenant.key, &format!("/api/runs?automation={automation}"))
                    .await
                    .expect(StatusCode::OK);
                match page["items"][0]["id"].as_str() {
                    Some(id) => ids.push(id.to_owned()),
                    None => return Err(()),
                }
            }
            Ok(ids)
        })
        .await;
    // Whichever was claimed first calls and hangs; the other is held.
    let (held, ahead) = app
        .poll(
            "one run held by the other on the ticket's queue",
            async || {
                for (me, other) in [(&runs[0], &runs[1]), (&runs[1], &runs[0])] {
                    let run = detail(app, &tenant, me).await;
                    if run["blocked_by"]["kind"] == "queue_key" {
                        return Ok((run, other.clone()));
                    }
                }
                Err(())
            },
        )
        .await;
    assert_eq!(
        held["blocked_by"]["detail"],
        json!({ "key": format!("ticket:{ticket}"), "runId": ahead }),
        "{held:#}"
    );
    app.poll("the call of the run ahead", async || {
        (service.calls.load(Ordering::SeqCst) > 0)
            .then_some(())
            .ok_or(())
    })
    .await;
    let held_again = detail(app, &tenant, held["id"].as_str().unwrap()).await;
    assert_eq!(
        held_again["blocked_by"]["kind"], "queue_key",
        "{held_again:#}"
    );
    assert_eq!(
        service.calls.load(Ordering::SeqCst),
        1,
        "one call at a time on the ticket"
    );
    service.permits.add_permits(2);
    for run in &runs {
        let done = app.wait_for_final(&tenant, run).await;
        assert_eq!(done["status"], "completed", "{done:#}");
    }
}
