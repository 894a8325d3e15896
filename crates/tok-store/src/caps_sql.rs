//! Tenants' concurrency caps (`settings.limits.concurrency`, `docs/security.md`, "Tenant quotas")
//! for both backends (see `rows.rs` for why a macro): how many more jobs a
//! claim or a dispatch may lease to a capped tenant.
//!
//! A tenant's steps in flight are its jobs with a live lease, counted in
//! the jobs' rows (`jobs_leased_by_tenant`), not kept in a count of their
//! own: every end of a lease (a record, a release, a node's restart, an
//! expiry, a cancel deleting the job) gives its slot back by itself, and no
//! count can drift from the leases. A record that continues on its lease
//! keeps its one slot; a `parallel` step's branches are new jobs, leased by
//! claims like any other.
//!
//! Two transactions counting one tenant's leases at once would each see
//! room for the same slots: on PostgreSQL each first takes the tenant's
//! cap lock (`CLAIM_TENANTS`, a try-lock held to the commit) and counts in
//! a statement after it; one that misses the lock leases nothing of that
//! tenant this time. No transaction waits for the lock, so it adds no edge
//! to the store's lock order (runs before jobs). SQLite's one writer
//! serializes them.

macro_rules! impl_caps {
    (
        store = $store:ty,
        db = $db:ty,
    ) => {
        /// The concurrency caps of those of `tenants` that have one.
        async fn caps_of(
            tx: &mut sqlx::Transaction<'_, $db>,
            tenants: &[&str],
        ) -> Result<std::collections::HashMap<String, i64>> {
            if tenants.is_empty() {
                return Ok(Default::default());
            }
            let rows = sqlx::query(concat!(
                "SELECT tn.id, ",
                tenant_cap!(),
                " AS cap FROM tenants tn WHERE tn.id ",
                any_of!(1)
            ))
            .bind(list(tenants.iter().copied()))
            .fetch_all(&mut **tx)
            .await?;
            Ok(rows
                .iter()
                .filter_map(|r| Some((r.get::<String, _>("id"), r.get::<Option<i64>, _>("cap")?)))
                .collect())
        }

        /// For each tenant of `caps` (its id and its cap), how many more of
        /// its jobs may be leased in this transaction: its cap less its live
        /// leases and the jobs of `running` (those the caller still runs
        /// although their leases expired), none below 0; 0 for a tenant
        /// whose cap lock another transaction holds.
        async fn room_under_caps(
            tx: &mut sqlx::Transaction<'_, $db>,
            caps: &std::collections::HashMap<String, i64>,
            running: &[JobId],
        ) -> Result<std::collections::HashMap<String, i64>> {
            if caps.is_empty() {
                return Ok(Default::default());
            }
            let mut tenants: Vec<&str> = caps.keys().map(String::as_str).collect();
            tenants.sort_unstable();
            let locked: Vec<String> = if CLAIM_TENANTS.is_empty() {
                tenants.iter().map(|t| (*t).to_owned()).collect()
            } else {
                sqlx::query_scalar(CLAIM_TENANTS)
                    .bind(list(tenants.iter().copied()))
                    .fetch_all(&mut **tx)
                    .await?
            };
            let held: std::collections::HashMap<String, i64> = if locked.is_empty() {
                Default::default()
            } else {
                sqlx::query(concat!(
                    "SELECT tenant_id, COUNT(*) AS held FROM jobs
                     WHERE tenant_id ",
                    any_of!(1),
                    " AND locked_by IS NOT NULL
                       AND (locked_until >= ",
                    db_now!(),
                    " OR id ",
                    any_of!(2),
                    ")
                     GROUP BY tenant_id"
                ))
                .bind(list(locked.iter().map(String::as_str)))
                .bind(list(running.iter().map(|j| j.0)))
                .fetch_all(&mut **tx)
                .await?
                .iter()
                .map(|r| (r.get::<String, _>("tenant_id"), r.get::<i64, _>("held")))
                .collect()
            };
            Ok(caps
                .iter()
                .map(|(tenant, cap)| {
                    let room = if locked.contains(tenant) {
                        (cap - held.get(tenant).copied().unwrap_or(0)).max(0)
                    } else {
                        0
                    };
                    (tenant.clone(), room)
                })
                .collect())
        }
    };
}

pub(crate) use impl_caps;
