//! The caps' queries, written once for both databases: they run in the
//! caller's transaction (a claim's or a dispatch's), whose database type
//! picks the driver, so the queue's and the dispatch's code still written
//! per backend calls them as they are.

use std::collections::HashMap;

use tok_core::ids::JobId;

use super::CapsSql;
use crate::Result;
use crate::sql::{Native, on};

/// The concurrency caps of those of `tenants` that have one.
pub(crate) async fn caps_of<DB: Native>(
    tx: &mut sqlx::Transaction<'_, DB>,
    tenants: &[&str],
) -> Result<HashMap<String, i64>>
where
    DB::Driver: CapsSql,
{
    if tenants.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = on("tenants", <DB::Driver as CapsSql>::CAPS_OF)
        .texts(tenants.iter().copied())
        .fetch_all::<DB::Driver>(&mut **tx)
        .await?;
    let mut caps = HashMap::new();
    for row in &rows {
        if let Some(cap) = row.opt_int("cap")? {
            caps.insert(row.text("id")?, cap);
        }
    }
    Ok(caps)
}

/// For each tenant of `caps` (its id and its cap), how many more of its
/// jobs may be leased in this transaction: its cap less its live leases
/// and the jobs of `running` (those the caller still runs although their
/// leases expired), none below 0; 0 for a tenant whose cap lock another
/// transaction holds.
pub(crate) async fn room_under_caps<DB: Native>(
    tx: &mut sqlx::Transaction<'_, DB>,
    caps: &HashMap<String, i64>,
    running: &[JobId],
) -> Result<HashMap<String, i64>>
where
    DB::Driver: CapsSql,
{
    if caps.is_empty() {
        return Ok(HashMap::new());
    }
    let mut tenants: Vec<&str> = caps.keys().map(String::as_str).collect();
    tenants.sort_unstable();
    let locks = <DB::Driver as CapsSql>::CAP_LOCKS;
    let locked: Vec<String> = if locks.is_empty() {
        tenants.iter().map(|t| (*t).to_owned()).collect()
    } else {
        on("tenants", locks)
            .texts(tenants.iter().copied())
            .fetch_all::<DB::Driver>(&mut **tx)
            .await?
            .iter()
            .map(|row| row.text("t"))
            .collect::<Result<_>>()?
    };
    let held: HashMap<String, i64> = if locked.is_empty() {
        HashMap::new()
    } else {
        on("jobs", <DB::Driver as CapsSql>::LEASES_HELD)
            .texts(locked.iter().map(String::as_str))
            .ints(running.iter().map(|j| j.0))
            .fetch_all::<DB::Driver>(&mut **tx)
            .await?
            .iter()
            .map(|row| Ok((row.text("tenant_id")?, row.int("held")?)))
            .collect::<Result<_>>()?
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
