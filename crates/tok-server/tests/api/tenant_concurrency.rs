//! A tenant's concurrency cap as the platform admin sets it:
//! `PATCH /api/tenants/{id} {"settings":{"limits":{"concurrency": N}}}`
//! answers the tenant with its limits in force; a later change of other settings
//! keeps the cap, `null` removes it; a value that is no whole number from 1
//! to 10000, or a limit that does not exist, is a 400 naming the field and
//! what is expected, and writes nothing of the change; the tenant's own key
//! may not set it. (What the cap does to claims is the store's conformance
//! suite, `tenant_caps`, and the process test `tenant_concurrency`.)

use axum::http::StatusCode;
use serde_json::json;

use crate::helpers::{TestApp, backend_tests, run};

backend_tests!(run;
    the_admin_sets_and_removes_a_tenants_concurrency_cap,
    a_bad_concurrency_cap_is_refused_by_name_and_nothing_is_written,
);

async fn the_admin_sets_and_removes_a_tenants_concurrency_cap(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let uri = format!("/api/tenants/{}", tenant.id);
    let unset = app
        .patch(&app.admin_key, &uri, &json!({}))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        unset["settings"]["limits"]["concurrency"],
        json!(null),
        "{unset:#}"
    );

    let set = app
        .patch(
            &app.admin_key,
            &uri,
            &json!({ "settings": { "limits": { "concurrency": 2 } } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(set["settings"]["limits"]["concurrency"], json!(2));

    // Another setting changed keeps the cap.
    let other = app
        .patch(
            &app.admin_key,
            &uri,
            &json!({ "suspended": false, "settings": { "retention": { "traceDays": 60 } } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(other["settings"]["limits"]["concurrency"], json!(2));
    assert_eq!(other["settings"]["retention"]["traceDays"], 60);

    let removed = app
        .patch(
            &app.admin_key,
            &uri,
            &json!({ "settings": { "limits": { "concurrency": null } } }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        removed["settings"]["limits"]["concurrency"],
        json!(null),
        "{removed:#}"
    );

    let own = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "settings": { "limits": { "concurrency": 10000 } } }),
        )
        .await;
    assert_eq!(own.status, StatusCode::FORBIDDEN, "{:#}", own.body);
}

async fn a_bad_concurrency_cap_is_refused_by_name_and_nothing_is_written(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let uri = format!("/api/tenants/{}", tenant.id);
    app.patch(
        &app.admin_key,
        &uri,
        &json!({ "settings": { "limits": { "concurrency": 3 } } }),
    )
    .await
    .expect(StatusCode::OK);

    for bad in [
        json!(0),
        json!(-2),
        json!(2.5),
        json!("4"),
        json!(10001),
        json!({ "max": 4 }),
    ] {
        // Sent with another change: neither is written.
        let error = app
            .patch(
                &app.admin_key,
                &uri,
                &json!({ "suspended": true, "settings": { "limits": { "concurrency": bad } } }),
            )
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_settings");
        assert_eq!(error["field"], "settings.limits.concurrency", "{error:#}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("settings.limits.concurrency")
                && message.contains("whole number from 1 to 10000"),
            "{bad}: {message}"
        );
    }
    let unknown = app
        .patch(
            &app.admin_key,
            &uri,
            &json!({ "settings": { "limits": { "concurency": 4 } } }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_settings");
    assert_eq!(
        unknown["field"], "settings.limits.concurency",
        "{unknown:#}"
    );
    assert!(
        unknown["message"]
            .as_str()
            .unwrap()
            .contains("the limits are signalsPerSecond, streams, startsPerMinute, concurrency"),
        "{unknown:#}"
    );

    let tenants = app
        .get(&app.admin_key, "/api/tenants")
        .await
        .expect(StatusCode::OK);
    let shown = tenants["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == tenant.id)
        .cloned()
        .unwrap();
    assert_eq!(shown["suspended"], false, "a refused change wrote nothing");
    let unchanged = app
        .patch(&app.admin_key, &uri, &json!({}))
        .await
        .expect(StatusCode::OK);
    assert_eq!(unchanged["settings"]["limits"]["concurrency"], json!(3));
}
