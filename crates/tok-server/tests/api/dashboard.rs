//! The dashboard's page and the reads it needs: `/` serves the page and its
//! assets from the binary; a key learns who it is; the admin lists tenants
//! to pick one (a tenant's key may not); a tenant's queue right now and
//! over the last minutes (the samples the scheduler keeps); any saved
//! version of an automation. And the live stream's promise to a slow
//! client: it is told to reload, the engine never waits for it.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use tok_core::ids::TenantId;
use tok_engine::stream::Kind;
use tower::ServiceExt;

use crate::helpers::{TestApp, backend_tests, log_step, manual};

backend_tests!(
    crate::helpers::run;
    the_page_and_its_assets_are_served_from_the_binary,
    a_key_learns_who_it_is_and_only_the_admin_lists_tenants,
    the_queue_and_every_saved_version_are_readable,
    the_queue_history_answers_the_tenants_stored_samples,
    a_client_that_falls_behind_the_stream_is_told_to_reload,
);

async fn the_page_and_its_assets_are_served_from_the_binary(app: &TestApp) {
    let page = app
        .request(Method::GET, "/", None, &[], Body::empty())
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    let html = page.body.as_str().expect("the page is HTML, not JSON");
    assert!(html.contains("/dashboard/app.js") && html.contains("/dashboard/app.css"));
    assert!(html.contains("Sign in"));
    for (path, kind) in [
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/app.css", "text/css"),
    ] {
        let asset = app
            .request(Method::GET, path, None, &[], Body::empty())
            .await;
        assert_eq!(asset.status, StatusCode::OK, "{path}");
        assert!(
            asset.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind)
        );
    }
}

async fn a_key_learns_who_it_is_and_only_the_admin_lists_tenants(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let me = app
        .get(&acme.key, "/api/dashboard/session")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        me,
        json!({ "kind": "tenant", "tenant": { "id": acme.id, "name": "Acme" },
                "name": "first key", "scopes": ["admin"] })
    );
    let admin = app
        .get(&app.admin_key, "/api/dashboard/session")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        admin,
        json!({ "kind": "admin", "tenant": null, "name": "platform admin", "scopes": ["admin"] })
    );
    app.get("not-a-key", "/api/dashboard/session")
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");

    let tenants = app
        .get(&app.admin_key, "/api/tenants")
        .await
        .expect(StatusCode::OK);
    let mut listed = tenants["items"].clone();
    let created = listed[0]
        .as_object_mut()
        .and_then(|t| t.remove("created_at"));
    assert!(
        created.as_ref().and_then(crate::helpers::ms).is_some(),
        "created_at, RFC 3339: {tenants:#}"
    );
    assert_eq!(
        listed,
        json!([{ "id": acme.id, "name": "Acme", "suspended": false, "status": "active" }])
    );
    app.get(&acme.key, "/api/tenants")
        .await
        .expect_error(StatusCode::FORBIDDEN, "admin_only");
}

async fn the_queue_and_every_saved_version_are_readable(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let queue = app
        .get(&acme.key, "/api/dashboard/queue")
        .await
        .expect(StatusCode::OK);
    for key in ["ready", "scheduled", "running", "pending_events"] {
        assert_eq!(queue[key], 0, "{key}: {queue:#}");
    }
    assert!(queue["oldest_ready_s"].is_null() && queue["sampled_at"].is_string());

    let first = manual("Greet", &json!([log_step("st_hello", "hello")]));
    let id = app.create_automation(&acme, &first).await;
    let second = manual("Greet", &json!([log_step("st_hello", "hello again")]));
    app.put(&acme.key, &format!("/api/automations/{id}"), &second)
        .await
        .expect(StatusCode::OK);
    let v1 = app
        .get(&acme.key, &format!("/api/automations/{id}/versions/1"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(v1["version"], 1);
    assert_eq!(v1["definition"]["steps"][0]["config"]["message"], "hello");
    let v2 = app
        .get(&acme.key, &format!("/api/automations/{id}/versions/2"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        v2["definition"]["steps"][0]["config"]["message"],
        "hello again"
    );
    app.get(&acme.key, &format!("/api/automations/{id}/versions/3"))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let other = app.create_tenant("Other").await;
    app.get(&other.key, &format!("/api/automations/{id}/versions/1"))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}

async fn the_queue_history_answers_the_tenants_stored_samples(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    let greet = manual("Greet", &json!([log_step("st_hello", "hello")]));
    let id = app.create_automation(&acme, &greet).await;
    let run = app.start_run(&acme, &id, &json!({ "input": {} })).await;
    app.wait_for_final(&acme, &run).await;

    // Samples as the scheduler's holder keeps them, both tenants at once.
    let store = app.state.engine.store();
    let tenants = [
        TenantId::from(acme.id.as_str()),
        TenantId::from(other.id.as_str()),
    ];
    let now = tok_store::now_ms();
    let times = [now - 2 * 3600 * 1000, now - 10 * 60 * 1000, now];
    for at in times {
        assert_eq!(store.sample_queue(&tenants, at, 60_000).await.unwrap(), 2);
    }
    let mine = |history: &serde_json::Value| -> Vec<serde_json::Value> {
        // The engine's own sampler may add one of its own meanwhile.
        history["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| times.contains(&crate::helpers::ms(&s["at"]).unwrap()))
            .cloned()
            .collect()
    };
    let history = app
        .get(&acme.key, "/api/dashboard/queue/history")
        .await
        .expect(StatusCode::OK);
    assert_eq!(history["tenant_id"], acme.id.as_str());
    assert_eq!(history["minutes"], 60);
    assert_eq!(history["sample_every_s"], 30.0);
    let hour = mine(&history);
    assert_eq!(hour.len(), 2, "the last hour's, oldest first: {history:#}");
    assert_eq!(crate::helpers::ms(&hour[0]["at"]), Some(times[1]));
    let last = &hour[1];
    assert_eq!(
        (
            last["ready"].clone(),
            last["running"].clone(),
            last["oldest_ready_s"].clone()
        ),
        (json!(0), json!(0), json!(null)),
        "{last:#}"
    );
    assert_eq!(last["window_s"], 60.0);
    assert!(
        last["steps_completed"].as_i64().unwrap() >= 1
            && last["steps_per_s"].as_f64().unwrap() > 0.0,
        "the run's step is counted: {last:#}"
    );
    let day = app
        .get(&acme.key, "/api/dashboard/queue/history?minutes=1440")
        .await
        .expect(StatusCode::OK);
    assert_eq!(mine(&day).len(), 3, "{day:#}");
    let theirs = app
        .get(&other.key, "/api/dashboard/queue/history?minutes=180")
        .await
        .expect(StatusCode::OK);
    assert_eq!(theirs["tenant_id"], other.id.as_str());
    let theirs = mine(&theirs);
    assert_eq!(theirs.len(), 3);
    assert!(
        theirs.iter().all(|s| s["steps_completed"] == 0),
        "another tenant's steps are not counted: {theirs:#?}"
    );

    for bad in [
        "minutes=0",
        "minutes=1441",
        "minutes=-5",
        "minutes=an-hour",
        "hours=1",
    ] {
        let error = app
            .get(&acme.key, &format!("/api/dashboard/queue/history?{bad}"))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "bad_query");
        assert_eq!(error["expected"], "minutes=1..1440", "{bad}: {error:#}");
    }
}

async fn a_client_that_falls_behind_the_stream_is_told_to_reload(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let request = Request::get("/api/stream")
        .header("authorization", format!("Bearer {}", acme.key))
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // The client reads nothing while far more events commit than its
    // buffer holds; publishing never waits for it.
    let stream = app.state.engine.stream();
    let tenant = TenantId::from(acme.id.as_str());
    for n in 0..3000 {
        stream.publish(
            &tenant,
            Kind::RunUpdated,
            json!({ "run_id": n, "status": "running" }),
        );
    }
    let frame = body.frame().await.unwrap().unwrap();
    let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    assert!(text.starts_with("event: reload\n"), "{text}");
    assert!(text.contains("missed"), "{text}");
    // After the reload it goes on with the newest events.
    let frame = body.frame().await.unwrap().unwrap();
    let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    assert!(
        text.contains("event: run.updated") && text.contains("id: "),
        "{text}"
    );
}
