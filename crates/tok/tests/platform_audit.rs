//! The operator's commands write the platform's audit rows (no tenant;
//! the actor names the command, the user and the host; never a secret):
//! `tok secrets rotate` on both backends, written ahead and ended `done`
//! with what it sealed; `tok tenant move` and `tok tenant forget` in the
//! shared database (`TOK_DATABASE_URL`), in the same transaction as what
//! they change when that is the shared database, and in the changed
//! database's own transaction when no shared database is given.

use std::process::Command;

use tok_store::testing::{TestDb, backends};
use tok_store::{ActorKind, AuditFilter, AuditOutcome, AuditRow, Backend, PgStore, Store};

/// `tok` with `args` and `env`; its stdout, once it succeeded.
fn tok(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tok"))
        .args(args)
        .env_remove("TOK_DATABASE_URL")
        .env_remove("TOK_SECRET_KEY")
        .env_remove("TOK_TENANT_DATABASES")
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tok");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tok {args:?} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The platform admin's listing of `action`.
async fn rows(store: &dyn tok_store::AuditStore, action: &str) -> Vec<AuditRow> {
    let filter = AuditFilter {
        action: Some(action.to_owned()),
        ..AuditFilter::default()
    };
    store
        .audit_everywhere(&filter, 50, None)
        .await
        .unwrap()
        .items
}

fn platform_row(row: &AuditRow, command: &str) {
    assert_eq!(row.tenant_id, None, "{row:?}");
    assert_eq!(row.actor.kind, ActorKind::Platform, "{row:?}");
    assert!(
        row.actor
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(&format!("`{command}` run by "))),
        "{row:?}"
    );
    assert_eq!(row.outcome, AuditOutcome::Done, "{row:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tok_secrets_rotate_writes_the_platforms_row() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let (keys, text) = tok_store::Keyring::generate();
        let newest = keys.ids()[0].to_owned();
        let said = tok(
            &["secrets", "rotate"],
            &[("TOK_DATABASE_URL", &db.url), ("TOK_SECRET_KEY", &text)],
        );
        assert!(said.contains(&newest), "{said}");
        let rotated = rows(&*store, "secret_key.rotated").await;
        assert_eq!(rotated.len(), 1, "{backend:?}: {rotated:?}");
        platform_row(&rotated[0], "tok secrets rotate");
        assert_eq!(rotated[0].target.id.as_deref(), Some(newest.as_str()));
        assert!(
            rotated[0]
                .summary
                .as_deref()
                .is_some_and(|s| s.contains(&format!("under key {newest}"))),
            "{rotated:?}"
        );
        assert!(
            !format!("{rotated:?}").contains(&text),
            "no secret in the log"
        );
        drop(store);
        db.cleanup().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tok_tenant_move_and_forget_write_the_platforms_rows() {
    if !backends().contains(&Backend::Postgres) {
        return;
    }
    let shared = TestDb::create(Backend::Postgres).await;
    let own = TestDb::create(Backend::Postgres).await;
    let store = shared.store().await;
    let tenant = store
        .create_tenant("Mover", &tok_store::hash_secret("tok_x"))
        .await
        .unwrap()
        .id;
    Store::migrate(&PgStore::connect(&own.url, 2).await.unwrap())
        .await
        .unwrap();
    let with_shared = [("TOK_DATABASE_URL", shared.url.as_str())];

    // The copy changes the tenant's own database: its row is written
    // ahead in the shared one.
    tok(
        &[
            "tenant",
            "move",
            tenant.as_str(),
            "--from",
            &shared.url,
            "--to",
            &own.url,
        ],
        &with_shared,
    );
    let moved = rows(&*store, "tenant.moved").await;
    assert_eq!(moved.len(), 1, "{moved:?}");
    platform_row(&moved[0], "tok tenant move");
    assert_eq!(moved[0].target.id.as_deref(), Some(tenant.as_str()));
    assert!(
        moved[0]
            .summary
            .as_deref()
            .is_some_and(|s| s.contains("copied")),
        "{moved:?}"
    );

    // Forgetting changes the shared database: its row is in the same
    // transaction.
    tok(
        &[
            "tenant",
            "forget",
            tenant.as_str(),
            "--database",
            &shared.url,
        ],
        &with_shared,
    );
    let forgotten = rows(&*store, "tenant.forgotten").await;
    assert_eq!(forgotten.len(), 1, "{forgotten:?}");
    platform_row(&forgotten[0], "tok tenant forget");
    assert!(
        forgotten[0]
            .summary
            .as_deref()
            .is_some_and(|s| s.contains("rows)")),
        "{forgotten:?}"
    );

    // Without a shared database, the changed database's own log keeps it,
    // and the command says so.
    let said = tok(
        &["tenant", "forget", tenant.as_str(), "--database", &own.url],
        &[],
    );
    assert!(said.contains("own log"), "{said}");
    let own_store = PgStore::connect(&own.url, 2).await.unwrap();
    let there = rows(&own_store, "tenant.forgotten").await;
    assert_eq!(there.len(), 1, "{there:?}");
    platform_row(&there[0], "tok tenant forget");
    assert_eq!(rows(&*store, "tenant.forgotten").await.len(), 1);

    drop((store, own_store));
    shared.cleanup().await;
    own.cleanup().await;
}
