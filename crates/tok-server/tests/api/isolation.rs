//! Tenant isolation and authentication: another tenant's ids answer 404
//! exactly like ids that do not exist, listings show only the caller's
//! records, keys are required (401), tenants are the admin's (403), and the
//! admin acts for a tenant only with `X-Tok-Tenant`.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{
    Tenant, TestApp, backend_tests, ids, log_step, manual, on_webhook, plain_source,
};

backend_tests!(
    crate::helpers::run;
    another_tenants_records_answer_404,
    listings_show_only_the_callers_records,
    missing_or_invalid_key_is_401,
    tenant_key_cannot_create_tenants,
    admin_acts_for_a_tenant_with_x_tok_tenant,
);

/// Tenant A with a source, a webhook automation and one finished run.
struct Owned {
    tenant: Tenant,
    source: String,
    automation: String,
    run: String,
}

async fn tenant_with_a_run(app: &TestApp, name: &str) -> Owned {
    let tenant = app.create_tenant(name).await;
    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let source_id = source["id"].as_str().unwrap().to_owned();
    let automation = app
        .create_automation(
            &tenant,
            &on_webhook(
                "Hook",
                &source_id,
                &json!([log_step("st_a", "for {{who}}")]),
            ),
        )
        .await;
    app.webhook(source["token"].as_str().unwrap(), &json!({ "who": name }))
        .await
        .expect(StatusCode::ACCEPTED);
    let runs = app.wait_for_runs(&tenant, "", 1).await;
    let run = runs[0]["id"].as_str().unwrap().to_owned();
    Owned {
        tenant,
        source: source_id,
        automation,
        run,
    }
}

async fn another_tenants_records_answer_404(app: &TestApp) {
    let a = tenant_with_a_run(app, "Acme").await;
    let b = app.create_tenant("Beta").await;

    for uri in [
        format!("/api/runs/{}", a.run),
        format!("/api/automations/{}", a.automation),
        format!("/api/sources/{}", a.source),
    ] {
        let theirs = app
            .get(&b.key, &uri)
            .await
            .expect_error(StatusCode::NOT_FOUND, "not_found");
        let gone = app
            .get(&b.key, &format!("{uri}x"))
            .await
            .expect_error(StatusCode::NOT_FOUND, "not_found");
        assert_eq!(
            theirs, gone,
            "another tenant's id must look like one that does not exist ({uri})"
        );
        app.get(&a.tenant.key, &uri).await.expect(StatusCode::OK);
    }

    let automation = format!("/api/automations/{}", a.automation);
    let definition = manual("Hijack", &json!([log_step("st_x", "x")]));
    app.put(&b.key, &automation, &definition)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    for action in ["pause", "resume"] {
        let reply = app
            .post(&b.key, &format!("{automation}/{action}"), &json!({}))
            .await;
        reply.expect_error(StatusCode::NOT_FOUND, "not_found");
    }
    let reply = app
        .post(
            &b.key,
            &format!("{automation}/runs"),
            &json!({ "input": {} }),
        )
        .await;
    reply.expect_error(StatusCode::NOT_FOUND, "not_found");

    // None of it touched A's automation.
    let shown = app
        .get(&a.tenant.key, &automation)
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        (&shown["version"], &shown["status"], &shown["name"]),
        (&json!(1), &json!("active"), &json!("Hook"))
    );
    let runs = app
        .get(&a.tenant.key, "/api/dashboard/runs")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        ids(runs["items"].as_array().unwrap()),
        [a.run.as_str()],
        "{runs:#}"
    );
}

async fn listings_show_only_the_callers_records(app: &TestApp) {
    let a = tenant_with_a_run(app, "Acme").await;
    let b = tenant_with_a_run(app, "Beta").await;

    for (mine, theirs) in [(&a, &b), (&b, &a)] {
        let key = &mine.tenant.key;
        let runs = app
            .get(key, "/api/dashboard/runs")
            .await
            .expect(StatusCode::OK);
        assert_eq!(
            ids(runs["items"].as_array().unwrap()),
            [mine.run.as_str()],
            "{runs:#}"
        );
        let filtered = app
            .get(
                key,
                &format!("/api/dashboard/runs?automation={}", theirs.automation),
            )
            .await;
        assert_eq!(filtered.expect(StatusCode::OK)["items"], json!([]));

        let automations = app
            .get(key, "/api/automations")
            .await
            .expect(StatusCode::OK);
        assert_eq!(
            ids(automations["items"].as_array().unwrap()),
            [mine.automation.as_str()]
        );
        let sources = app.get(key, "/api/sources").await.expect(StatusCode::OK);
        assert_eq!(
            ids(sources["items"].as_array().unwrap()),
            [mine.source.as_str()]
        );
    }

    // Each run saw only its own tenant's event.
    let run = app
        .get(&b.tenant.key, &format!("/api/runs/{}", b.run))
        .await
        .expect(StatusCode::OK);
    assert_eq!(run["steps"][0]["log"], json!(["info: for Beta"]));
}

async fn missing_or_invalid_key_is_401(app: &TestApp) {
    let a = tenant_with_a_run(app, "Acme").await;
    let routes: [(Method, String); 5] = [
        (Method::GET, "/api/dashboard/runs".into()),
        (Method::GET, format!("/api/runs/{}", a.run)),
        (Method::GET, "/api/automations".into()),
        (Method::POST, "/api/sources".into()),
        (Method::POST, "/api/tenants".into()),
    ];
    let wrong = format!("{}x", a.tenant.key);
    let not_bearer = format!("Basic {}", a.tenant.key);
    for (method, uri) in &routes {
        let body = || Body::from(json!({ "name": "x" }).to_string());
        let json = ("content-type", "application/json");
        let none = app
            .request(method.clone(), uri, None, &[json], body())
            .await;
        none.expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
        let invalid = app
            .request(method.clone(), uri, Some(&wrong), &[json], body())
            .await;
        invalid.expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
        let scheme = app
            .request(
                method.clone(),
                uri,
                None,
                &[json, ("authorization", &not_bearer)],
                body(),
            )
            .await;
        scheme.expect_error(StatusCode::UNAUTHORIZED, "unauthorized");
    }
}

async fn tenant_key_cannot_create_tenants(app: &TestApp) {
    let a = app.create_tenant("Acme").await;
    let reply = app
        .post(&a.key, "/api/tenants", &json!({ "name": "Mallory" }))
        .await;
    reply.expect_error(StatusCode::FORBIDDEN, "admin_only");
    let created = app
        .post(&app.admin_key, "/api/tenants", &json!({ "name": "  " }))
        .await;
    created.expect_error(StatusCode::BAD_REQUEST, "invalid_body");
}

async fn admin_acts_for_a_tenant_with_x_tok_tenant(app: &TestApp) {
    let a = tenant_with_a_run(app, "Acme").await;
    let b = app.create_tenant("Beta").await;
    let admin = app.admin_key.as_str();
    let as_a = [("x-tok-tenant", a.tenant.id.as_str())];

    let run = app
        .request(
            Method::GET,
            &format!("/api/runs/{}", a.run),
            Some(admin),
            &as_a,
            Body::empty(),
        )
        .await;
    assert_eq!(run.expect(StatusCode::OK)["id"], a.run.as_str());
    let as_b = [("x-tok-tenant", b.id.as_str())];
    let run = app
        .request(
            Method::GET,
            &format!("/api/runs/{}", a.run),
            Some(admin),
            &as_b,
            Body::empty(),
        )
        .await;
    run.expect_error(StatusCode::NOT_FOUND, "not_found");

    // Writes land in the tenant the header names.
    let source = app
        .post_with(admin, "/api/sources", &as_b, &plain_source("made by admin"))
        .await
        .expect(StatusCode::CREATED);
    let listed = app.get(&b.key, "/api/sources").await.expect(StatusCode::OK);
    assert_eq!(listed["items"][0]["id"], source["id"], "{listed:#}");
    let theirs = app
        .get(&a.tenant.key, "/api/sources")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        ids(theirs["items"].as_array().unwrap()),
        [a.source.as_str()]
    );

    let no_header = app.get(admin, "/api/dashboard/runs").await;
    let error = no_header.expect_error(StatusCode::BAD_REQUEST, "tenant_required");
    assert!(
        error["message"].as_str().unwrap().contains("X-Tok-Tenant"),
        "{error:#}"
    );
    let unknown = [("x-tok-tenant", "ten_nonexistent")];
    let reply = app
        .request(
            Method::GET,
            "/api/dashboard/runs",
            Some(admin),
            &unknown,
            Body::empty(),
        )
        .await;
    reply.expect_error(StatusCode::NOT_FOUND, "not_found");

    // A tenant key ignores the header: it never reaches another tenant.
    let sneaky = app
        .request(
            Method::GET,
            "/api/dashboard/runs",
            Some(&b.key),
            &as_a,
            Body::empty(),
        )
        .await;
    assert_eq!(sneaky.expect(StatusCode::OK)["items"], json!([]));
}
