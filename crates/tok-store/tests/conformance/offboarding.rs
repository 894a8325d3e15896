//! Offboarding: a tenant being deleted has its keys revoked and leaves the
//! engine's list at once; its rows are erased in batches from every table
//! that has a `tenant_id` (on every database of a routed store), the other
//! tenants' rows untouched; an erasure cut short goes on from where it
//! stopped in a store opened afresh; the deletion ends with the tenant's
//! row gone and the platform's audit row of it, which names no tenant.
//!
//! The rows come from the store's own calls where that is easy (a source,
//! an automation, a run with its job, event and step, an audit row), and
//! for every other table from a row made from the database's catalog (a
//! value for each column that needs one), so that a table added later is
//! filled and checked without changing this test.

use tok_store::{ActorKind, AuditFilter, ERASED, Finished, NewAudit, StepStatus, Target};

use super::*;

backend_tests!(
    run_on_fresh_db;
    every_table_with_a_tenant_is_erased,
    a_deleted_tenant_leaves_no_row_and_the_others_keep_theirs,
    an_interrupted_deletion_goes_on_where_it_stopped,
    a_tenant_in_service_is_never_erased,
);

/// The databases of a test database: the one itself, and a routed one's
/// shared database too.
fn databases(db: &TestDb) -> Vec<String> {
    let mut urls = vec![db.url.clone()];
    urls.extend(db.shared_url().map(str::to_owned));
    urls
}

/// Rows of `sql` as text, on a connection of its own.
async fn texts(backend: Backend, url: &str, sql: &str) -> Vec<Vec<Option<String>>> {
    fn row_texts<R: sqlx::Row>(row: &R) -> Vec<Option<String>>
    where
        usize: sqlx::ColumnIndex<R>,
        for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        (0..row.len()).map(|i| row.get(i)).collect()
    }
    match backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            let rows = sqlx::query(sql).fetch_all(&mut conn).await.expect(sql);
            conn.close().await.expect("close");
            rows.iter().map(row_texts).collect()
        }
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(url).await.expect("connect");
            let rows = sqlx::query(sql).fetch_all(&mut conn).await.expect(sql);
            conn.close().await.expect("close");
            rows.iter().map(row_texts).collect()
        }
    }
}

/// Runs `sql` on a connection of its own.
async fn execute(backend: Backend, url: &str, sql: &str) {
    match backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query(sql).execute(&mut conn).await.expect(sql);
            conn.close().await.expect("close");
        }
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(url).await.expect("connect");
            sqlx::query(sql).execute(&mut conn).await.expect(sql);
            conn.close().await.expect("close");
        }
    }
}

/// The tables of the database with a `tenant_id` column (partitions left
/// out: their parent stands for them).
async fn tables_with_a_tenant(backend: Backend, url: &str) -> Vec<String> {
    let sql = match backend {
        Backend::Postgres => {
            "SELECT c.relname::text FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id'
                  AND NOT a.attisdropped
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
               AND NOT c.relispartition
             ORDER BY 1"
        }
        Backend::Sqlite => {
            "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) p
             WHERE m.type = 'table' AND p.name = 'tenant_id' ORDER BY 1"
        }
    };
    texts(backend, url, sql)
        .await
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect()
}

/// Rows of `tenant` in `table`, in every database of `db`.
async fn rows_of(db: &TestDb, table: &str, tenant: &TenantId) -> i64 {
    let mut total = 0;
    for url in databases(db) {
        let sql = format!(
            "SELECT CAST(COUNT(*) AS TEXT) FROM {table} WHERE tenant_id = '{}'",
            tenant.as_str()
        );
        let rows = texts(db.backend, &url, &sql).await;
        total += rows[0][0].as_deref().unwrap_or("0").parse::<i64>().unwrap();
    }
    total
}

/// Rows of `tenant` in each table of [`ERASED`], in every database.
async fn every_count(db: &TestDb, tenant: &TenantId) -> Vec<(&'static str, i64)> {
    let mut counts = Vec::new();
    for table in ERASED {
        counts.push((table.name, rows_of(db, table.name, tenant).await));
    }
    counts
}

/// A column as the filler sees it: its name, its type, and whether a row
/// needs a value for it.
struct Column {
    name: String,
    kind: String,
    needed: bool,
}

async fn columns(backend: Backend, url: &str, table: &str) -> Vec<Column> {
    let sql = match backend {
        Backend::Postgres => format!(
            "SELECT column_name::text, data_type::text,
                    CASE WHEN is_nullable = 'NO' AND column_default IS NULL
                          AND is_identity = 'NO' AND is_generated = 'NEVER'
                         THEN 'yes' ELSE 'no' END
             FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = '{table}'
             ORDER BY ordinal_position"
        ),
        // An INTEGER PRIMARY KEY alone is the rowid: SQLite numbers it.
        // Another key column may be null in SQLite, but is given a value.
        Backend::Sqlite => format!(
            "SELECT name, type,
                    CASE WHEN (\"notnull\" = 1 OR pk > 0) AND dflt_value IS NULL
                          AND NOT (pk = 1 AND upper(type) = 'INTEGER'
                                   AND (SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE pk > 0) = 1)
                         THEN 'yes' ELSE 'no' END
             FROM pragma_table_info('{table}')"
        ),
    };
    texts(backend, url, &sql)
        .await
        .into_iter()
        .map(|row| Column {
            name: row[0].clone().unwrap(),
            kind: row[1].clone().unwrap().to_lowercase(),
            needed: row[2].as_deref() == Some("yes"),
        })
        .collect()
}

/// Each foreign key of `table`: its column, and the table and column it
/// references.
async fn references(backend: Backend, url: &str, table: &str) -> Vec<(String, String, String)> {
    let sql = match backend {
        Backend::Postgres => format!(
            "SELECT a.attname::text, cf.relname::text, af.attname::text
             FROM pg_constraint c
             JOIN pg_class cf ON cf.oid = c.confrelid
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
             JOIN pg_attribute af ON af.attrelid = c.confrelid AND af.attnum = c.confkey[1]
             WHERE c.contype = 'f' AND c.conrelid = '{table}'::regclass"
        ),
        Backend::Sqlite => {
            format!("SELECT \"from\", \"table\", \"to\" FROM pragma_foreign_key_list('{table}')")
        }
    };
    texts(backend, url, &sql)
        .await
        .into_iter()
        .map(|row| {
            (
                row[0].clone().unwrap(),
                row[1].clone().unwrap(),
                row[2].clone().unwrap(),
            )
        })
        .collect()
}

/// Writes one row of `tenant` into `table` of the database at `url`, with
/// a value for every column that needs one: the tenant, a referenced
/// row's key of the same tenant, or a value of the column's type unique
/// to this row (`n`).
async fn fill(backend: Backend, url: &str, table: &str, tenant: &TenantId, n: u64) {
    let refs = references(backend, url, table).await;
    let mut names = Vec::new();
    let mut values = Vec::new();
    for column in columns(backend, url, table).await {
        let value = if column.name == "tenant_id" {
            format!("'{}'", tenant.as_str())
        } else if let Some((_, to_table, to_column)) =
            refs.iter().find(|(from, _, _)| *from == column.name)
        {
            let sql = format!(
                "SELECT CAST({to_column} AS TEXT) FROM {to_table} WHERE {} LIMIT 1",
                if to_table == "tenants" {
                    format!("id = '{}'", tenant.as_str())
                } else {
                    format!("tenant_id = '{}'", tenant.as_str())
                }
            );
            let found = texts(backend, url, &sql).await;
            let key = found
                .first()
                .and_then(|row| row[0].clone())
                .unwrap_or_else(|| panic!("{table}.{} needs a row of {to_table}", column.name));
            format!("'{key}'")
        } else if !column.needed {
            continue;
        } else {
            match column.kind.as_str() {
                "text" => format!("'{table}_{}_{n}'", column.name),
                "integer" | "bigint" | "smallint" => n.to_string(),
                "double precision" | "real" => format!("{n}.5"),
                "boolean" if backend == Backend::Postgres => "FALSE".into(),
                "boolean" => "0".into(),
                "json" | "jsonb" => "'{}'".into(),
                other => panic!("{table}.{}: no value for the type {other}", column.name),
            }
        };
        names.push(column.name);
        values.push(value);
    }
    let sql = format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        names.join(", "),
        values.join(", ")
    );
    execute(backend, url, &sql).await;
}

/// A tenant whose key is known.
async fn tenant_with_key(store: &dyn Store, name: &str) -> (TenantId, String) {
    let key = format!("tok_{}", tok_store::random_token());
    let tenant = store
        .create_tenant(name, &tok_store::hash_secret(&key))
        .await
        .expect("create tenant")
        .id;
    (tenant, key)
}

/// Gives `tenant` rows in every table of every database of `db`: some
/// through the store (a run recorded, a source, an audit row), then one
/// made from the catalog in each table still without one, parents first.
async fn fill_every_table(db: &TestDb, store: &dyn Store, tenant: &TenantId, seed: u64) {
    let src = source(store, tenant, "orders").await;
    webhook_automation(store, tenant, "On order", &src).await;
    store
        .accept_event(tenant, webhook_event(&src, "o1"))
        .await
        .expect("accept");
    let (_, job) = claimed_run(store, tenant).await;
    let mut record = finish(&job, RunStatus::Completed);
    record.steps = vec![step(&job.path, StepStatus::Completed, json!({ "ok": 1 }))];
    store.record(&job, record).await.expect("record");
    store
        .write_audit(NewAudit {
            tenant_id: Some(tenant.clone()),
            actor: tok_store::Actor {
                kind: ActorKind::Key,
                id: Some("key_x".into()),
                name: Some("x".into()),
            },
            action: "automation.created".into(),
            target: Target {
                kind: "automation".into(),
                id: Some("aut_x".into()),
            },
            summary: None,
        })
        .await
        .expect("audit");
    let mut n = seed;
    for url in databases(db) {
        if db.backend == Backend::Postgres {
            // The tenant's row, which the tables reference, on each database.
            execute(
                db.backend,
                &url,
                &format!(
                    "INSERT INTO tenants (id, name, settings, created_at)
                     VALUES ('{0}', '{0}', '{{}}', 1) ON CONFLICT (id) DO NOTHING",
                    tenant.as_str()
                ),
            )
            .await;
        }
        for table in ERASED.iter().rev() {
            let sql = format!(
                "SELECT CAST(COUNT(*) AS TEXT) FROM {} WHERE tenant_id = '{}'",
                table.name,
                tenant.as_str()
            );
            let held = texts(db.backend, &url, &sql).await[0][0].as_deref() != Some("0");
            if !held {
                n += 1;
                fill(db.backend, &url, table.name, tenant, n).await;
            }
        }
    }
}

/// Erases every row of `tenant`, `limit` at a time, table by table, as the
/// scheduler does; returns the batches it took.
async fn erase_all(store: &dyn Store, tenant: &TenantId, limit: u32) -> usize {
    let mut batches = 0;
    for table in ERASED {
        loop {
            let done = store
                .erase_tenant_rows(tenant, table.name, limit)
                .await
                .unwrap_or_else(|e| panic!("erase {}: {e}", table.name));
            assert!(done <= u64::from(limit), "{} took {done} rows", table.name);
            batches += 1;
            if done == 0 {
                break;
            }
        }
    }
    batches
}

fn erased_audit(tenant: &TenantId) -> NewAudit {
    NewAudit {
        tenant_id: None,
        actor: tok_store::Actor {
            kind: ActorKind::Platform,
            id: None,
            name: Some("tok".into()),
        },
        action: "tenant.erased".into(),
        target: Target {
            kind: "tenant".into(),
            id: Some(tenant.to_string()),
        },
        summary: Some("every row of the tenant erased".into()),
    }
}

async fn every_table_with_a_tenant_is_erased(db: &TestDb) {
    let _store = db.store().await;
    let erased: Vec<&str> = ERASED.iter().map(|t| t.name).collect();
    for url in databases(db) {
        let tables = tables_with_a_tenant(db.backend, &url).await;
        let missing: Vec<&String> = tables
            .iter()
            .filter(|t| !erased.contains(&t.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "tables with a tenant_id that a tenant's deletion does not erase: {missing:?}; \
             add them to tok_store::ERASED"
        );
        let unknown: Vec<&&str> = erased
            .iter()
            .filter(|t| !tables.iter().any(|x| x == *t))
            .collect();
        assert!(
            unknown.is_empty(),
            "ERASED names tables without a tenant_id: {unknown:?}"
        );
    }
}

async fn a_deleted_tenant_leaves_no_row_and_the_others_keep_theirs(db: &TestDb) {
    let store = db.store().await;
    let store = &*store;
    let (gone, gone_key) = tenant_with_key(store, "Gone").await;
    let (kept, kept_key) = tenant_with_key(store, "Kept").await;
    fill_every_table(db, store, &gone, 1_000).await;
    fill_every_table(db, store, &kept, 2_000).await;
    let before = every_count(db, &gone).await;
    let empty: Vec<&str> = before
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(t, _)| *t)
        .collect();
    assert!(
        empty.is_empty(),
        "the test left tables without a row: {empty:?}"
    );
    let kept_before = every_count(db, &kept).await;

    // Asked: its keys fail at once and it leaves the engine's list.
    let marked = store.begin_tenant_deletion(&gone).await.unwrap().unwrap();
    assert!(marked.deleting());
    let again = store.begin_tenant_deletion(&gone).await.unwrap().unwrap();
    assert_eq!(
        again.deleting_since, marked.deleting_since,
        "the first ask stands"
    );
    let hash = |key: &str| tok_store::hash_secret(key);
    assert!(store.key_by_hash(&hash(&gone_key)).await.unwrap().is_none());
    assert!(store.key_by_hash(&hash(&kept_key)).await.unwrap().is_some());
    assert_eq!(store.tenant_ids().await.unwrap(), vec![kept.clone()]);
    assert_eq!(store.deleting_tenants().await.unwrap(), vec![gone.clone()]);
    assert_eq!(
        store.tenant(&gone).await.unwrap().map(|t| t.deleting()),
        Some(true),
        "still shown while its rows go"
    );
    let left = store.tenant_rows_left(&gone, 1_000).await.unwrap();
    assert_eq!(left.len(), ERASED.len(), "{left:?}");

    // Not before every row is gone.
    assert_eq!(
        store
            .finish_tenant_deletion(&gone, erased_audit(&gone))
            .await
            .unwrap(),
        Finished::RowsLeft("jobs")
    );
    erase_all(store, &gone, 2).await;
    assert_eq!(store.tenant_rows_left(&gone, 1_000).await.unwrap(), vec![]);
    assert_eq!(
        store
            .finish_tenant_deletion(&gone, erased_audit(&gone))
            .await
            .unwrap(),
        Finished::Done
    );

    for (table, n) in every_count(db, &gone).await {
        assert_eq!(n, 0, "rows of the deleted tenant left in {table}");
    }
    assert_eq!(
        every_count(db, &kept).await,
        kept_before,
        "the other tenant's rows"
    );
    assert!(store.tenant(&gone).await.unwrap().is_none());
    assert!(store.tenant(&kept).await.unwrap().is_some());
    for url in databases(db) {
        let sql = format!("SELECT id FROM tenants WHERE id = '{}'", gone.as_str());
        assert!(
            texts(db.backend, &url, &sql).await.is_empty(),
            "its row in {url}"
        );
    }
    // The platform's row of it outlives it, and names no tenant.
    let rows = store
        .audit_everywhere(&AuditFilter::default(), 50, None)
        .await
        .unwrap()
        .items;
    let erased: Vec<_> = rows
        .iter()
        .filter(|r| r.action == "tenant.erased")
        .collect();
    assert_eq!(erased.len(), 1, "{rows:?}");
    assert_eq!(erased[0].tenant_id, None);
    assert_eq!(erased[0].target.id.as_deref(), Some(gone.as_str()));
    assert!(rows.iter().all(|r| r.tenant_id.as_ref() != Some(&gone)));
    assert_eq!(
        store
            .finish_tenant_deletion(&gone, erased_audit(&gone))
            .await
            .unwrap(),
        Finished::NotDeleting,
        "done once"
    );
}

async fn an_interrupted_deletion_goes_on_where_it_stopped(db: &TestDb) {
    let store = db.store().await;
    let (gone, _) = tenant_with_key(&*store, "Gone").await;
    let (kept, _) = tenant_with_key(&*store, "Kept").await;
    fill_every_table(db, &*store, &gone, 1_000).await;
    fill_every_table(db, &*store, &kept, 2_000).await;
    let kept_before = every_count(db, &kept).await;
    store.begin_tenant_deletion(&gone).await.unwrap();
    // Cut short half-way: some tables erased, the rest not.
    for table in &ERASED[..ERASED.len() / 2] {
        while store.erase_tenant_rows(&gone, table.name, 1).await.unwrap() > 0 {}
    }
    let left = every_count(db, &gone).await;
    assert!(
        left[..ERASED.len() / 2].iter().all(|(_, n)| *n == 0),
        "{left:?}"
    );
    assert!(
        left[ERASED.len() / 2..].iter().all(|(_, n)| *n > 0),
        "{left:?}"
    );
    drop(store);

    // A process started afresh finds the deletion and goes on.
    let store = db.store().await;
    assert_eq!(store.deleting_tenants().await.unwrap(), vec![gone.clone()]);
    erase_all(&*store, &gone, 1_000).await;
    assert_eq!(
        store
            .finish_tenant_deletion(&gone, erased_audit(&gone))
            .await
            .unwrap(),
        Finished::Done
    );
    for (table, n) in every_count(db, &gone).await {
        assert_eq!(n, 0, "rows of the deleted tenant left in {table}");
    }
    assert_eq!(every_count(db, &kept).await, kept_before);
    assert!(store.deleting_tenants().await.unwrap().is_empty());
}

async fn a_tenant_in_service_is_never_erased(db: &TestDb) {
    let store = db.store().await;
    let (kept, key) = tenant_with_key(&*store, "Kept").await;
    fill_every_table(db, &*store, &kept, 1_000).await;
    let before = every_count(db, &kept).await;
    for table in ERASED {
        let refused = store.erase_tenant_rows(&kept, table.name, 100).await;
        assert!(
            matches!(refused, Err(StoreError::InvalidState(ref m)) if m.contains("not being deleted")),
            "{}: {refused:?}",
            table.name
        );
    }
    let unknown = store.erase_tenant_rows(&kept, "tenants", 100).await;
    assert!(
        matches!(unknown, Err(StoreError::Invariant(_))),
        "{unknown:?}"
    );
    let nobody = TenantId::from("ten_nobody".to_owned());
    assert!(store.erase_tenant_rows(&nobody, "jobs", 100).await.is_err());
    assert!(
        store
            .begin_tenant_deletion(&nobody)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        store
            .finish_tenant_deletion(&kept, erased_audit(&kept))
            .await
            .unwrap(),
        Finished::NotDeleting
    );
    assert_eq!(every_count(db, &kept).await, before);
    assert!(
        store
            .key_by_hash(&tok_store::hash_secret(&key))
            .await
            .unwrap()
            .is_some()
    );
}
