//! `/healthz` answers as soon as the server listens; `/readyz` once the
//! process says it is ready and while the database answers; both answer
//! anyone. `/metrics` answers only the platform admin key or
//! `TOK_METRICS_TOKEN`.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::json;

use crate::helpers::{Reply, TestApp, backend_tests};

backend_tests!(crate::helpers::run;
    healthz_and_readyz,
    metrics_answer_only_the_admin_key_or_the_metrics_token,
    a_worker_node_serves_the_probes_only_and_is_ready_while_it_claims,
);

async fn healthz_and_readyz(app: &TestApp) {
    let health = app
        .request(Method::GET, "/healthz", None, &[], Body::empty())
        .await;
    assert_eq!(health.expect(StatusCode::OK), json!({ "status": "ok" }));

    let early = app
        .request(Method::GET, "/readyz", None, &[], Body::empty())
        .await;
    assert_eq!(
        early.expect(StatusCode::SERVICE_UNAVAILABLE),
        json!({ "status": "starting" })
    );

    app.state.set_ready();
    let ready = app
        .request(Method::GET, "/readyz", None, &[], Body::empty())
        .await;
    assert_eq!(ready.expect(StatusCode::OK), json!({ "status": "ready" }));
}

/// A worker node's router (`tok_server::probes`): the probes and
/// `/metrics`, a 404 for the API, and readiness that follows the worker
/// pool: 503 `not claiming` while it is stopped, 200 once it runs again.
async fn a_worker_node_serves_the_probes_only_and_is_ready_while_it_claims(app: &TestApp) {
    let state = app
        .state
        .clone()
        .with_metrics(crate::retention::recorder())
        .ready_when_claiming();
    state.set_ready();
    let router = tok_server::probes(state);
    let get = async |path: &str, key: Option<&str>| -> Reply {
        let mut request = Request::get(path);
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        crate::helpers::send(router.clone(), request.body(Body::empty()).unwrap()).await
    };
    assert_eq!(
        get("/healthz", None).await.expect(StatusCode::OK),
        json!({ "status": "ok" })
    );
    // The pool opens in its own task, soon after the engine started.
    let ready = app
        .poll("the worker pool to claim", async || {
            let reply = get("/readyz", None).await;
            (reply.status == StatusCode::OK).then_some(reply).ok_or(())
        })
        .await;
    assert_eq!(ready.body, json!({ "status": "ready" }));
    let metrics = get("/metrics", Some(&app.admin_key)).await;
    assert_eq!(metrics.status, StatusCode::OK, "{:#}", metrics.body);
    // What a worker node records (its queue gauges, sampled by its
    // engine), each family with its `# HELP`.
    let text = app
        .poll("the worker's gauges on /metrics", async || {
            let metrics = get("/metrics", Some(&app.admin_key)).await;
            let text = metrics.body.as_str().unwrap_or_default().to_owned();
            text.contains("tok_queue_ready_jobs")
                .then_some(text)
                .ok_or(())
        })
        .await;
    assert!(text.contains("# HELP tok_queue_ready_jobs "), "{text}");
    let missing = crate::retention::undescribed(&text);
    assert!(
        missing.is_empty(),
        "families without HELP: {missing:?}\n{text}"
    );
    get("/metrics", None)
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
    let api = get("/api/automations", Some(&app.admin_key))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    assert!(
        api["message"]
            .as_str()
            .unwrap()
            .contains("/api/automations"),
        "{api:#}"
    );

    app.stop_engine().await;
    assert_eq!(
        get("/readyz", None)
            .await
            .expect(StatusCode::SERVICE_UNAVAILABLE),
        json!({ "status": "not claiming" })
    );
    app.start_engine().await;
    app.poll("the worker pool to claim again", async || {
        let ready = get("/readyz", None).await.status == StatusCode::OK;
        ready.then_some(()).ok_or(())
    })
    .await;
}

async fn metrics_answer_only_the_admin_key_or_the_metrics_token(app: &TestApp) {
    let token = "metrics-scraper-token-0123456789";
    let state = app
        .state
        .clone()
        .with_metrics(crate::retention::recorder())
        .with_metrics_token(token);
    let router = tok_server::app(state);
    let tenant = app.create_tenant("Acme").await;
    let scrape = async |key: Option<&str>| -> Reply {
        let mut request = Request::get("/metrics");
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        crate::helpers::send(router.clone(), request.body(Body::empty()).unwrap()).await
    };
    for (who, key) in [
        ("no key", None),
        ("a tenant's key", Some(tenant.key.as_str())),
        ("a wrong token", Some("metrics-scraper-token-wrong")),
    ] {
        let error = scrape(key)
            .await
            .expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("admin key") && message.contains("TOK_METRICS_TOKEN"),
            "{who}: {message}"
        );
        assert!(!message.contains(&tenant.id), "{who}: {message}");
    }
    for (who, key) in [
        ("the admin key", app.admin_key.as_str()),
        ("TOK_METRICS_TOKEN", token),
    ] {
        let reply = scrape(Some(key)).await;
        assert_eq!(reply.status, StatusCode::OK, "{who}: {:#}", reply.body);
        assert!(
            reply.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain"),
            "{who}"
        );
    }
    // The health checks stay open to anyone.
    for uri in ["/healthz", "/readyz"] {
        let reply = crate::helpers::send(
            router.clone(),
            Request::get(uri).body(Body::empty()).unwrap(),
        )
        .await;
        assert_ne!(reply.status, StatusCode::UNAUTHORIZED, "{uri}");
    }
}
