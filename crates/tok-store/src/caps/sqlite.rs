//! The caps' statements on SQLite.

use super::CapsSql;
use crate::fragments::sqlite::*;
use crate::sql::sqlite::Sqlite;

impl CapsSql for Sqlite {
    const CAPS_OF: &'static str = concat!(
        "SELECT tn.id, ",
        tenant_cap!(),
        " AS cap FROM tenants tn WHERE tn.id ",
        any_of!(1)
    );

    const CAP_LOCKS: &'static str = CLAIM_TENANTS;

    const LEASES_HELD: &'static str = concat!(
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
    );
}
