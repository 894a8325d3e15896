//! The outbound guard, the byte budget and credentials keeping to their
//! origin (docs/security.md), tried as a hostile tenant would: a widget or an
//! `http` step aimed at the server's own `/metrics` or at the cloud
//! metadata address is refused with an error naming the address and
//! `TOK_OUTBOUND_ALLOW`, and nothing reaches the target; a redirect from an
//! allowed service to a denied address is refused on its hop; a secret of
//! a connection never reaches another origin, whether the URL is written,
//! rendered from a webhook body, or reached by a redirect, or sent with a
//! `Host` header naming another virtual host of the same address (nor is a
//! `TRACE` sent, which would echo it back); a 50 MB answer fails its step
//! with the byte budget's error.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::{Value, json};
use tok_engine::OutboundAllow;
use tok_store::Backend;

use crate::helpers::{Tenant, TestApp, backend_tests, manual, on_webhook, plain_source};

backend_tests!(
    crate::helpers::run;
    the_servers_own_metrics_and_the_metadata_address_are_refused,
);

backend_tests!(
    run_two_origins;
    a_redirect_to_a_denied_address_is_refused_on_its_hop,
    a_literal_url_of_another_origin_is_refused_at_save,
    a_rendered_url_of_another_origin_is_an_origin_mismatch,
    a_redirect_off_the_origin_with_credentials_is_refused,
    a_50_mb_answer_fails_its_step_with_the_byte_budget,
    no_header_or_method_takes_credentials_elsewhere,
);

const SECRET: &str = "sk_live_never_leaves";
const METRICS: &str = "tok_jobs_total{tenant=\"t_other\"} 42\n";

/// An app whose guard opens one local service under two origins,
/// `http://127.0.0.1:P` (the connections' base URL) and `http://localhost:P`
/// (another origin, where an echo shows whatever reached it).
async fn run_two_origins(backend: Backend, test: impl AsyncFnOnce(&TestApp)) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let allow = OutboundAllow::parse(&format!("127.0.0.1:{port},localhost:{port}")).unwrap();
    crate::helpers::run_serving(backend, Some(listener), allow, test).await;
}

/// What reached a service: each request's path and headers.
#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<(String, HeaderMap)>>,
}

impl Seen {
    fn paths(&self) -> Vec<String> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|(p, _)| p.clone()).collect()
    }

    /// Requests whose headers carry the secret anywhere.
    fn with_secret(&self, path: &str) -> usize {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|(p, headers)| {
                p == path
                    && headers
                        .values()
                        .any(|v| v.to_str().is_ok_and(|v| v.contains(SECRET)))
            })
            .count()
    }
}

struct Service {
    seen: Seen,
    /// The port of this service (for redirects to its other origin).
    port: u16,
    /// A port the guard does not open (for a redirect to be refused).
    denied: u16,
}

async fn answer(State(service): State<Arc<Service>>, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path().to_owned();
    service
        .seen
        .requests
        .lock()
        .unwrap()
        .push((path.clone(), headers.clone()));
    let redirect = |to: String| {
        (
            StatusCode::FOUND,
            [(axum::http::header::LOCATION, to)],
            "moved",
        )
            .into_response()
    };
    match path.as_str() {
        "/metrics" => METRICS.into_response(),
        "/echo" => {
            let echoed: serde_json::Map<String, Value> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or_default())))
                .collect();
            axum::Json(Value::Object(echoed)).into_response()
        }
        "/bounce" => redirect(format!("http://localhost:{}/echo", service.port)),
        "/hop-internal" => redirect(format!("http://127.0.0.1:{}/metrics", service.denied)),
        "/hop-metadata" => redirect("http://169.254.169.254/latest/meta-data/".into()),
        "/big" | "/big-announced" => {
            // 50 MB in 800 chunks of 64 KiB, made as they are sent.
            let chunk = axum::body::Bytes::from(vec![b'x'; 64 * 1024]);
            let stream = futures_util::stream::iter(
                (0..800).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
            );
            let mut response = Body::from_stream(stream).into_response();
            if path == "/big-announced" {
                response.headers_mut().insert(
                    axum::http::header::CONTENT_LENGTH,
                    (800 * 64 * 1024).to_string().parse().unwrap(),
                );
            }
            response
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Serves `listener` as a [`Service`]; `denied` is a port the guard
/// refuses.
fn serve(listener: tokio::net::TcpListener, denied: u16) -> Arc<Service> {
    let port = listener.local_addr().unwrap().port();
    let service = Arc::new(Service {
        seen: Seen::default(),
        port,
        denied,
    });
    let app = Router::new()
        .route("/{*path}", any(answer))
        .with_state(service.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    service
}

/// A service on a loopback port the guard does not open: it stands for
/// the server's own `/metrics` (or any internal service).
async fn internal_service() -> (Arc<Service>, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (serve(listener, 0), addr)
}

/// The allowed service of [`run_two_origins`], beside an internal one.
async fn allowed_service(app: &TestApp) -> (Arc<Service>, SocketAddr, Arc<Service>) {
    let (internal, internal_addr) = internal_service().await;
    let listener = app.service_listener();
    let addr = listener.local_addr().unwrap();
    (serve(listener, internal_addr.port()), addr, internal)
}

fn http_step(id: &str, config: Value) -> Value {
    json!({ "id": id, "type": "http", "config": config })
}

/// Runs `steps` by hand and returns the finished run.
async fn run_steps(app: &TestApp, tenant: &Tenant, steps: Value) -> Value {
    let automation = app
        .create_automation(tenant, &manual("hostile", &steps))
        .await;
    let run = app
        .start_run(tenant, &automation, &json!({ "input": {} }))
        .await;
    app.wait_for_final(tenant, &run).await
}

/// The one failed step's error, after asserting it failed once (terminal:
/// never retried).
fn failed_once(run: &Value, step: &str) -> String {
    assert_eq!(run["status"], "failed", "{run:#}");
    let attempts: Vec<&Value> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["step_id"] == step)
        .collect();
    assert_eq!(attempts.len(), 1, "terminal, not retried: {run:#}");
    assert_eq!(attempts[0]["status"], "failed", "{run:#}");
    attempts[0]["error"].as_str().unwrap().to_owned()
}

async fn connection(app: &TestApp, tenant: &Tenant, addr: SocketAddr, credentials: Value) {
    app.post(
        &tenant.key,
        "/api/connections",
        &json!({
            "name": "shop",
            "service": "http",
            "base_url": format!("http://{addr}"),
            "credentials": credentials,
        }),
    )
    .await
    .expect(StatusCode::CREATED);
}

async fn the_servers_own_metrics_and_the_metadata_address_are_refused(app: &TestApp) {
    let (internal, addr) = internal_service().await;
    let tenant = app.create_tenant("Mallory").await;
    let metrics = format!("http://{addr}/metrics");
    let metadata = "http://169.254.169.254/latest/meta-data/";

    for (url, named) in [
        (metrics.as_str(), addr.to_string()),
        (metadata, "169.254.169.254:80".to_owned()),
    ] {
        let widget = app
            .post(
                &tenant.key,
                "/api/widgets",
                &json!({ "name": format!("peek {named}"), "request": { "url": url }, "ttlSec": 1 }),
            )
            .await
            .expect(StatusCode::CREATED);
        let reply = app
            .get(
                &tenant.key,
                &format!(
                    "/api/widgets/{}/data?refresh=true",
                    widget["id"].as_str().unwrap()
                ),
            )
            .await;
        let body = reply.body.to_string();
        let error = reply.expect_error(StatusCode::BAD_REQUEST, "outbound_refused");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(&named), "{message}");
        assert!(message.contains("TOK_OUTBOUND_ALLOW"), "{message}");
        assert!(
            !body.contains("tok_jobs_total"),
            "nothing of an answer: {body}"
        );

        let run = run_steps(
            app,
            &tenant,
            json!([http_step(
                "st_peek",
                json!({ "url": url, "timeoutMs": 3000 })
            )]),
        )
        .await;
        let error = failed_once(&run, "st_peek");
        assert!(error.starts_with("outbound_refused:"), "{error}");
        assert!(error.contains(&named), "{error}");
        assert!(error.contains("TOK_OUTBOUND_ALLOW"), "{error}");
        assert!(!run.to_string().contains("tok_jobs_total"), "{run:#}");
    }
    assert_eq!(
        internal.seen.paths(),
        Vec::<String>::new(),
        "nothing reached it"
    );
}

async fn a_redirect_to_a_denied_address_is_refused_on_its_hop(app: &TestApp) {
    let (service, addr, internal) = allowed_service(app).await;
    let tenant = app.create_tenant("Mallory").await;
    for (path, named) in [
        ("/hop-internal", format!("127.0.0.1:{}", service.denied)),
        ("/hop-metadata", "169.254.169.254:80".to_owned()),
    ] {
        let run = run_steps(
            app,
            &tenant,
            json!([http_step(
                "st_hop",
                json!({ "url": format!("http://{addr}{path}") })
            )]),
        )
        .await;
        let error = failed_once(&run, "st_hop");
        assert!(error.starts_with("outbound_refused:"), "{error}");
        assert!(error.contains(&named), "{error}");
        assert!(!run.to_string().contains("tok_jobs_total"), "{run:#}");
    }
    assert_eq!(
        service.seen.paths(),
        ["/hop-internal", "/hop-metadata"],
        "the allowed service was called"
    );
    assert_eq!(
        internal.seen.paths(),
        Vec::<String>::new(),
        "the hop was not"
    );
}

async fn a_literal_url_of_another_origin_is_refused_at_save(app: &TestApp) {
    let (service, addr, _) = allowed_service(app).await;
    let tenant = app.create_tenant("Mallory").await;
    connection(app, &tenant, addr, json!({ "bearer": SECRET })).await;
    let echo = format!("http://localhost:{}/echo", addr.port());

    let definition = manual(
        "exfiltrate",
        &json!([
            http_step("st_ok", json!({ "connection": "shop", "url": "/orders" })),
            { "id": "st_both", "type": "parallel", "branches": [
                [ http_step("st_fine", json!({ "connection": "shop",
                                               "url": format!("http://{addr}/orders") })) ],
                [ http_step("st_steal", json!({ "connection": "shop", "url": echo })) ]
            ] }
        ]),
    );
    let error = app
        .post(&tenant.key, "/api/automations", &definition)
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    let errors = error["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{error:#}");
    assert_eq!(
        errors[0]["path"], "steps.1.branches.1.0.config.url",
        "{error:#}"
    );
    let message = errors[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("http://localhost:{}", addr.port())),
        "{message}"
    );
    assert!(message.contains("connection `shop`"), "{message}");

    let widget = app
        .post(
            &tenant.key,
            "/api/widgets",
            &json!({ "name": "steal", "connection": "shop",
                     "request": { "url": echo }, "ttlSec": 1 }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert!(
        widget["message"]
            .as_str()
            .unwrap()
            .contains("connection `shop`"),
        "{widget:#}"
    );
    assert_eq!(
        service.seen.paths(),
        Vec::<String>::new(),
        "nothing was called"
    );
}

async fn a_rendered_url_of_another_origin_is_an_origin_mismatch(app: &TestApp) {
    let (service, addr, _) = allowed_service(app).await;
    let tenant = app.create_tenant("Acme").await;
    connection(app, &tenant, addr, json!({ "bearer": SECRET })).await;
    let source = app.create_source(&tenant, &plain_source("orders")).await;
    app.create_automation(
        &tenant,
        &on_webhook(
            "callback",
            source["id"].as_str().unwrap(),
            &json!([http_step(
                "st_callback",
                json!({ "connection": "shop", "method": "POST", "url": "{{_body.callback}}" })
            )]),
        ),
    )
    .await;
    // Whoever can post to the webhook names the callback.
    let echo = format!("http://localhost:{}/echo", addr.port());
    app.webhook(
        source["token"].as_str().unwrap(),
        &json!({ "callback": echo }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    let runs = app.wait_for_runs(&tenant, "", 1).await;
    let run = app
        .get(
            &tenant.key,
            &format!("/api/runs/{}", runs[0]["id"].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK);
    let error = failed_once(&run, "st_callback");
    assert!(error.starts_with("origin_mismatch:"), "{error}");
    assert!(
        error.contains(&format!("http://localhost:{}", addr.port())),
        "{error}"
    );
    assert!(!error.contains(SECRET), "{error}");
    assert_eq!(
        service.seen.paths(),
        Vec::<String>::new(),
        "the echo saw nothing"
    );
}

async fn a_redirect_off_the_origin_with_credentials_is_refused(app: &TestApp) {
    let (service, addr, _) = allowed_service(app).await;
    let tenant = app.create_tenant("Acme").await;
    connection(
        app,
        &tenant,
        addr,
        json!({ "headers": { "X-Api-Key": SECRET } }),
    )
    .await;
    let run = run_steps(
        app,
        &tenant,
        json!([http_step(
            "st_bounce",
            json!({ "connection": "shop", "url": "/bounce" })
        )]),
    )
    .await;
    let error = failed_once(&run, "st_bounce");
    assert!(error.starts_with("origin_mismatch:"), "{error}");
    assert!(error.contains("redirect"), "{error}");
    assert_eq!(
        service.seen.with_secret("/bounce"),
        1,
        "its own origin got it"
    );
    assert_eq!(
        service.seen.paths(),
        ["/bounce"],
        "the echo was never called"
    );
    assert_eq!(service.seen.with_secret("/echo"), 0);
    assert!(!run.to_string().contains(SECRET), "{run:#}");

    // Without credentials, the same redirect is followed (each hop judged).
    let open = app.create_tenant("Open").await;
    let run = run_steps(
        app,
        &open,
        json!([http_step(
            "st_open",
            json!({ "url": format!("http://{addr}/bounce") })
        )]),
    )
    .await;
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(service.seen.paths(), ["/bounce", "/bounce", "/echo"]);
}

async fn a_50_mb_answer_fails_its_step_with_the_byte_budget(app: &TestApp) {
    let (service, addr, _) = allowed_service(app).await;
    let tenant = app.create_tenant("Acme").await;
    for (path, size) in [
        ("/big", "more than 65536 bytes".to_owned()),
        (
            "/big-announced",
            format!("{} bytes (its Content-Length)", 800 * 64 * 1024),
        ),
    ] {
        let run = run_steps(
            app,
            &tenant,
            json!([http_step(
                "st_big",
                json!({ "url": format!("http://{addr}{path}") })
            )]),
        )
        .await;
        let error = failed_once(&run, "st_big");
        assert!(error.starts_with("output_too_large:"), "{error}");
        assert!(error.contains(&size), "{error}");
        assert!(error.contains("at most 65536 bytes"), "{error}");
    }
    assert_eq!(service.seen.paths(), ["/big", "/big-announced"]);
}

async fn no_header_or_method_takes_credentials_elsewhere(app: &TestApp) {
    let (service, addr, _) = allowed_service(app).await;
    let tenant = app.create_tenant("Mallory").await;
    connection(app, &tenant, addr, json!({ "bearer": SECRET })).await;
    let other_host = format!("localhost:{}", addr.port());
    // Written: refused at save, naming the header or the method.
    for (config, at) in [
        (
            json!({ "connection": "shop", "url": "/orders", "headers": { "Host": other_host } }),
            "steps.0.config.headers.Host",
        ),
        (
            json!({ "connection": "shop", "url": "{{_body.path}}",
                    "headers": { "x-forwarded-host": other_host } }),
            "steps.0.config.headers.x-forwarded-host",
        ),
        (
            json!({ "connection": "shop", "url": "/orders", "method": "TRACE" }),
            "steps.0.config.method",
        ),
    ] {
        let error = app
            .post(
                &tenant.key,
                "/api/automations",
                &manual("vhost", &json!([http_step("st_vhost", config)])),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
        assert_eq!(error["errors"][0]["path"], at, "{error:#}");
    }
    // Rendered from a webhook body: refused at the call, terminally.
    let source = app.create_source(&tenant, &plain_source("orders")).await;
    app.create_automation(
        &tenant,
        &on_webhook(
            "rendered",
            source["id"].as_str().unwrap(),
            &json!([http_step(
                "st_headers",
                json!({ "connection": "shop", "url": "{{_body.path}}",
                                                "headers": "{{_body.headers}}" })
            ),]),
        ),
    )
    .await;
    app.webhook(
        source["token"].as_str().unwrap(),
        &json!({ "path": "/orders", "headers": { "HOST": other_host } }),
    )
    .await
    .expect(StatusCode::ACCEPTED);
    let runs = app.wait_for_runs(&tenant, "", 1).await;
    let run = app
        .wait_for_final(&tenant, runs[0]["id"].as_str().unwrap())
        .await;
    let error = failed_once(&run, "st_headers");
    assert!(error.contains("`HOST` is not sent"), "{error}");
    assert!(!error.contains(SECRET), "{error}");
    assert_eq!(
        service.seen.paths(),
        Vec::<String>::new(),
        "nothing was sent, to either virtual host"
    );
}
