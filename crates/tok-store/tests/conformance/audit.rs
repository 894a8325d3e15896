//! The audit log on every backend alike: rows are listed by their tenant
//! only, newest first in keyset pages, kept by each filter; the platform
//! admin's listing has every tenant's rows and the platform's own; a
//! tenant's rows expire by its retention and the platform's by theirs; a
//! row written ahead of its change is `pending` until it is ended `done`
//! or `unknown`, or dropped, and one left pending past its grace is said
//! `unknown`.

use tok_store::{
    AUDIT_PENDING_GRACE_MS, Actor, ActorKind, AuditEnd, AuditFilter, AuditOutcome, AuditRow,
    Expiring, NewAudit, Target, now_ms,
};

use super::*;

backend_tests!(
    run_on_fresh_db;
    rows_are_listed_per_tenant_newest_first_and_filtered,
    the_platform_lists_every_row_and_its_own,
    rows_expire_by_tenant_and_the_platforms_apart,
    rows_written_ahead_end_done_unknown_or_not_at_all,
);

fn by_key(id: &str) -> Actor {
    Actor {
        kind: ActorKind::Key,
        id: Some(id.into()),
        name: Some(format!("key {id}")),
    }
}

fn row(tenant: Option<&TenantId>, actor: Actor, action: &str, target: &str) -> NewAudit {
    NewAudit {
        tenant_id: tenant.cloned(),
        actor,
        action: action.into(),
        target: Target {
            kind: action.split('.').next().unwrap_or_default().into(),
            id: Some(target.into()),
        },
        summary: Some(format!("{action} of {target}")),
    }
}

fn actions(rows: &[AuditRow]) -> Vec<&str> {
    rows.iter().map(|r| r.action.as_str()).collect()
}

async fn rows_are_listed_per_tenant_newest_first_and_filtered(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let written = store
        .write_audit(row(
            Some(&a),
            by_key("key_1"),
            "automation.created",
            "aut_1",
        ))
        .await
        .unwrap();
    assert_eq!(written.tenant_id.as_ref(), Some(&a));
    assert!(
        written.at > 0 && written.id.starts_with("aud_"),
        "{written:?}"
    );
    for (actor, action, target) in [
        ("key_1", "automation.saved", "aut_1"),
        ("key_2", "automation.paused", "aut_1"),
        ("key_2", "source.created", "src_1"),
    ] {
        store
            .write_audit(row(Some(&a), by_key(actor), action, target))
            .await
            .unwrap();
    }
    store
        .write_audit(row(Some(&b), by_key("key_9"), "key.revoked", "key_8"))
        .await
        .unwrap();

    let all = AuditFilter::default();
    let listed = store.audit(&a, &all, 10, None).await.unwrap();
    assert_eq!(
        actions(&listed.items),
        [
            "source.created",
            "automation.paused",
            "automation.saved",
            "automation.created"
        ],
        "{backend:?}: newest first, only the tenant's"
    );
    assert_eq!(listed.next_cursor, None);
    assert_eq!(
        listed.items[3], written,
        "{backend:?}: read back as written"
    );

    // Keyset pages: two and two, then none.
    let first = store.audit(&a, &all, 2, None).await.unwrap();
    let cursor = first.next_cursor.clone().expect("a second page");
    let second = store
        .audit(&a, &all, 2, Some(cursor.parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        actions(&second.items),
        ["automation.saved", "automation.created"]
    );
    assert_eq!(second.next_cursor, None, "{backend:?}");

    let by = |actor: Option<&str>, action: Option<&str>, target: Option<&str>| AuditFilter {
        actor: actor.map(str::to_owned),
        action: action.map(str::to_owned),
        target: target.map(str::to_owned),
        since: None,
    };
    let of_key_2 = store
        .audit(&a, &by(Some("key_2"), None, None), 10, None)
        .await
        .unwrap();
    assert_eq!(
        actions(&of_key_2.items),
        ["source.created", "automation.paused"]
    );
    let saved = store
        .audit(&a, &by(None, Some("automation.saved"), None), 10, None)
        .await
        .unwrap();
    assert_eq!(actions(&saved.items), ["automation.saved"]);
    let of_aut_1 = store
        .audit(&a, &by(Some("key_1"), None, Some("aut_1")), 10, None)
        .await
        .unwrap();
    assert_eq!(
        actions(&of_aut_1.items),
        ["automation.saved", "automation.created"]
    );
    let later = AuditFilter {
        since: Some(now_ms() + 60_000),
        ..AuditFilter::default()
    };
    assert!(
        store
            .audit(&a, &later, 10, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let earlier = AuditFilter {
        since: Some(written.at),
        ..AuditFilter::default()
    };
    assert_eq!(
        store
            .audit(&a, &earlier, 10, None)
            .await
            .unwrap()
            .items
            .len(),
        4
    );

    // Another tenant's filters never reach `a`'s rows.
    let theirs = store
        .audit(&b, &by(Some("key_1"), None, None), 10, None)
        .await
        .unwrap();
    assert!(theirs.items.is_empty(), "{backend:?}: {theirs:?}");
    assert_eq!(
        actions(&store.audit(&b, &all, 10, None).await.unwrap().items),
        ["key.revoked"]
    );
}

async fn the_platform_lists_every_row_and_its_own(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let platform = Actor {
        kind: ActorKind::Platform,
        id: Some("key_admin".into()),
        name: Some("platform admin".into()),
    };
    store
        .write_audit(row(
            Some(&a),
            by_key("key_1"),
            "automation.created",
            "aut_1",
        ))
        .await
        .unwrap();
    store
        .write_audit(row(None, platform.clone(), "key.rotated", "key_admin"))
        .await
        .unwrap();
    store
        .write_audit(row(
            Some(&b),
            platform.clone(),
            "tenant.updated",
            b.as_str(),
        ))
        .await
        .unwrap();

    let all = AuditFilter::default();
    let everything = store.audit_everywhere(&all, 10, None).await.unwrap();
    assert_eq!(
        actions(&everything.items),
        ["tenant.updated", "key.rotated", "automation.created"],
        "{backend:?}"
    );
    assert_eq!(everything.items[1].tenant_id, None);
    assert_eq!(everything.items[1].actor, platform);
    let page = store.audit_everywhere(&all, 1, None).await.unwrap();
    let cursor = page.next_cursor.expect("more pages");
    let rest = store
        .audit_everywhere(&all, 5, Some(cursor.parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(actions(&rest.items), ["key.rotated", "automation.created"]);
    let of_platform = AuditFilter {
        actor: Some("key_admin".into()),
        ..AuditFilter::default()
    };
    assert_eq!(
        actions(
            &store
                .audit_everywhere(&of_platform, 10, None)
                .await
                .unwrap()
                .items
        ),
        ["tenant.updated", "key.rotated"]
    );
    // A tenant sees its own rows, the platform's change to it included,
    // never the platform's own.
    assert_eq!(
        actions(&store.audit(&b, &all, 10, None).await.unwrap().items),
        ["tenant.updated"],
        "{backend:?}"
    );
}

async fn rows_expire_by_tenant_and_the_platforms_apart(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let b = tenant(store, "b").await;
    let platform = Actor {
        kind: ActorKind::Platform,
        id: None,
        name: Some("tok".into()),
    };
    for t in [&a, &b] {
        store
            .write_audit(row(Some(t), by_key("key_1"), "source.created", "src_1"))
            .await
            .unwrap();
    }
    store
        .write_audit(row(None, platform, "key.rotated", "key_admin"))
        .await
        .unwrap();
    let all = AuditFilter::default();
    let future = now_ms() + 60_000;
    assert_eq!(
        store
            .expire(&a, Expiring::Audit, future, 100)
            .await
            .unwrap(),
        1,
        "{backend:?}"
    );
    assert!(
        store
            .audit(&a, &all, 10, None)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert_eq!(
        store.audit(&b, &all, 10, None).await.unwrap().items.len(),
        1
    );
    assert_eq!(
        store
            .audit_everywhere(&all, 10, None)
            .await
            .unwrap()
            .items
            .len(),
        2,
        "{backend:?}: the platform's own row is not a tenant's to expire"
    );
    assert_eq!(
        store
            .expire_platform_audit(now_ms() - 60_000, 100)
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.expire_platform_audit(future, 100).await.unwrap(), 1);
    assert_eq!(
        actions(&store.audit_everywhere(&all, 10, None).await.unwrap().items),
        ["source.created"]
    );
}

async fn rows_written_ahead_end_done_unknown_or_not_at_all(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let store = &*store;
    let a = tenant(store, "a").await;
    let all = AuditFilter::default();
    let outcomes = |rows: &[AuditRow]| -> Vec<(String, AuditOutcome)> {
        rows.iter().map(|r| (r.action.clone(), r.outcome)).collect()
    };

    // Written before the change: listed as pending.
    let made = store
        .begin_audit(row(Some(&a), by_key("key_1"), "source.created", "src_1"))
        .await
        .unwrap();
    assert_eq!(made.outcome, AuditOutcome::Pending);
    let refused = store
        .begin_audit(row(Some(&a), by_key("key_1"), "source.updated", "src_1"))
        .await
        .unwrap();
    let failed = store
        .begin_audit(row(Some(&a), by_key("key_1"), "source.deleted", "src_1"))
        .await
        .unwrap();
    let crashed = store
        .begin_audit(row(None, by_key("key_1"), "tenant.created", "ten_x"))
        .await
        .unwrap();
    assert_eq!(
        outcomes(&store.audit(&a, &all, 10, None).await.unwrap().items),
        [
            ("source.deleted".to_owned(), AuditOutcome::Pending),
            ("source.updated".to_owned(), AuditOutcome::Pending),
            ("source.created".to_owned(), AuditOutcome::Pending),
        ],
        "{backend:?}"
    );

    // Made: done, with what the change made known. Refused: gone. An
    // error that may have come after its commit: unknown.
    store
        .end_audit(
            &made,
            AuditEnd {
                outcome: AuditOutcome::Done,
                tenant_id: Some(a.clone()),
                target_id: Some("src_2".into()),
                summary: Some("orders".into()),
            },
        )
        .await
        .unwrap();
    store.drop_audit(&refused).await.unwrap();
    store
        .end_audit(
            &failed,
            AuditEnd {
                outcome: AuditOutcome::Unknown,
                tenant_id: Some(a.clone()),
                target_id: Some("src_1".into()),
                summary: None,
            },
        )
        .await
        .unwrap();
    let listed = store.audit(&a, &all, 10, None).await.unwrap().items;
    assert_eq!(
        outcomes(&listed),
        [
            ("source.deleted".to_owned(), AuditOutcome::Unknown),
            ("source.created".to_owned(), AuditOutcome::Done),
        ],
        "{backend:?}"
    );
    assert_eq!(listed[1].target.id.as_deref(), Some("src_2"));
    assert_eq!(listed[1].summary.as_deref(), Some("orders"));

    // Left pending by a process that stopped: unknown once past its grace,
    // not before.
    assert_eq!(
        store
            .resolve_pending_audit(crashed.at - 1, 100)
            .await
            .unwrap(),
        0
    );
    let everywhere = store.audit_everywhere(&all, 10, None).await.unwrap().items;
    assert_eq!(everywhere[0].id, crashed.id);
    assert_eq!(everywhere[0].outcome, AuditOutcome::Pending);
    assert_eq!(
        store
            .resolve_pending_audit(now_ms() + AUDIT_PENDING_GRACE_MS, 100)
            .await
            .unwrap(),
        1,
        "{backend:?}"
    );
    let everywhere = store.audit_everywhere(&all, 10, None).await.unwrap().items;
    assert_eq!(everywhere[0].outcome, AuditOutcome::Unknown);
    // Ended late, it still takes the outcome the change had.
    store
        .end_audit(
            &crashed,
            AuditEnd {
                outcome: AuditOutcome::Done,
                tenant_id: Some(a.clone()),
                target_id: Some("ten_x".into()),
                summary: None,
            },
        )
        .await
        .unwrap();
    let listed = store.audit(&a, &all, 10, None).await.unwrap().items;
    assert_eq!(listed[0].action, "tenant.created");
    assert_eq!(listed[0].outcome, AuditOutcome::Done);
    // A row written whole is done.
    let whole = store
        .write_audit(row(Some(&a), by_key("key_1"), "key.created", "key_2"))
        .await
        .unwrap();
    assert_eq!(whole.outcome, AuditOutcome::Done);
}
