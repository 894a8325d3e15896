//! The audit row is written ahead of its change, so no crash loses the row
//! of a change that was made: a change whose row cannot be written is not
//! made (503 `audit_unavailable`); a change made whose row could not be
//! ended (its process stopped, its database failed) stays `pending` and
//! the scheduler says `unknown` of it past its grace; a change that fails
//! after its commit is `unknown`, never missing. The faults are a
//! database trigger that refuses a write, put there by the test.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};
use tok_engine::scheduler::{ManualClock, Scheduler, SchedulerConfig};
use tok_store::Backend;

use crate::helpers::{TestApp, backend_tests, plain_source};

backend_tests!(
    crate::helpers::run;
    a_change_whose_row_cannot_be_written_is_not_made,
    a_change_made_whose_row_was_not_ended_is_kept_unknown,
    a_change_that_fails_after_its_commit_is_kept_unknown,
);

/// A trigger that refuses every `event` (`INSERT` or `UPDATE`) on
/// `table` whose new row makes `when` true (SQL of the backend, over
/// `NEW`); [`lift`] takes it away.
async fn refuse(app: &TestApp, event: &str, table: &str, when: &str) {
    let sql = match app.backend {
        Backend::Sqlite => format!(
            "CREATE TRIGGER injected_fault BEFORE {event} ON {table}
             WHEN {when}
             BEGIN SELECT RAISE(ABORT, 'injected fault'); END;"
        ),
        Backend::Postgres => format!(
            "CREATE FUNCTION injected_fault() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF {when} THEN RAISE EXCEPTION 'injected fault'; END IF; RETURN NEW; END $$;
             CREATE TRIGGER injected_fault BEFORE {event} ON {table}
             FOR EACH ROW EXECUTE FUNCTION injected_fault();"
        ),
    };
    app.sql(&sql).await;
}

async fn lift(app: &TestApp, table: &str) {
    let sql = match app.backend {
        Backend::Sqlite => "DROP TRIGGER injected_fault;".to_owned(),
        Backend::Postgres => {
            format!("DROP TRIGGER injected_fault ON {table}; DROP FUNCTION injected_fault();")
        }
    };
    app.sql(&sql).await;
}

/// The rows of `action` the platform admin lists.
async fn rows(app: &TestApp, action: &str) -> Vec<Value> {
    let page = app
        .get(&app.admin_key, &format!("/api/audit?action={action}"))
        .await
        .expect(StatusCode::OK);
    page["items"].as_array().unwrap().clone()
}

async fn a_change_whose_row_cannot_be_written_is_not_made(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    refuse(app, "INSERT", "audit", "TRUE").await;
    app.post(&tenant.key, "/api/sources", &plain_source("orders"))
        .await
        .expect_error(StatusCode::SERVICE_UNAVAILABLE, "audit_unavailable");
    let sources = app
        .get(&tenant.key, "/api/sources")
        .await
        .expect(StatusCode::OK);
    assert_eq!(sources["items"], json!([]), "the change was not made");
    lift(app, "audit").await;
    app.create_source(&tenant, &plain_source("orders")).await;
    let made = rows(app, "source.created").await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["outcome"], "done");
}

async fn a_change_made_whose_row_was_not_ended_is_kept_unknown(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    // The row is written; its end is refused, as if the process died
    // right after the change committed.
    refuse(app, "UPDATE", "audit", "TRUE").await;
    let source = app.create_source(&tenant, &plain_source("orders")).await;
    let pending = rows(app, "source.created").await;
    assert_eq!(pending.len(), 1, "{pending:#?}");
    assert_eq!(pending[0]["outcome"], "pending");
    assert_eq!(pending[0]["tenant_id"], json!(tenant.id));
    assert_eq!(pending[0]["actor"]["kind"], "key");
    lift(app, "audit").await;

    // Within its grace the scheduler leaves it; past it, it says unknown.
    let store = app.state.engine.store().clone();
    let clock = Arc::new(ManualClock::at(tok_store::now_ms()));
    let scheduler = Scheduler::new(
        store,
        "audit-test",
        SchedulerConfig::default(),
        clock.clone(),
    );
    scheduler.watch(&[]).await.unwrap();
    assert_eq!(rows(app, "source.created").await[0]["outcome"], "pending");
    clock.advance(std::time::Duration::from_millis(
        tok_store::AUDIT_PENDING_GRACE_MS as u64 + 1_000,
    ));
    scheduler.watch(&[]).await.unwrap();
    let resolved = rows(app, "source.created").await;
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0]["outcome"], "unknown", "{resolved:#?}");
    // The change stands.
    app.get(
        &tenant.key,
        &format!("/api/sources/{}", source["id"].as_str().unwrap()),
    )
    .await
    .expect(StatusCode::OK);
}

async fn a_change_that_fails_after_its_commit_is_kept_unknown(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let uri = format!("/api/tenants/{}", tenant.id);
    // A rename and a retention in one PATCH: the rename commits, then the
    // retention's write fails.
    let has_retention = match app.backend {
        Backend::Sqlite => "json_extract(NEW.settings, '$.retention') IS NOT NULL",
        Backend::Postgres => "NEW.settings ? 'retention'",
    };
    refuse(app, "UPDATE", "tenants", has_retention).await;
    let reply = app
        .patch(
            &app.admin_key,
            &uri,
            &json!({ "name": "Acme Ltd", "settings": { "retention": { "runsDays": 30 } } }),
        )
        .await;
    assert!(
        reply.status.is_server_error(),
        "{:?} {:#}",
        reply.status,
        reply.body
    );
    lift(app, "tenants").await;
    let shown = app.get(&app.admin_key, &uri).await.expect(StatusCode::OK);
    assert_eq!(shown["name"], "Acme Ltd", "the rename was made");
    let row = rows(app, "tenant.updated").await;
    assert_eq!(row.len(), 1, "{row:#?}");
    assert_eq!(row[0]["outcome"], "unknown");
    assert_eq!(row[0]["target"]["id"], json!(tenant.id));
    assert!(
        row[0]["summary"]
            .as_str()
            .unwrap()
            .contains("may or may not"),
        "{:#}",
        row[0]
    );
}
