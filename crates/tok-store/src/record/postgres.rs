//! [`RecordSql`] of PostgreSQL.

use std::sync::LazyLock;

use super::{RecordSql, Statements};
use crate::sql::postgres::Postgres;

impl RecordSql for Postgres {
    const NOTIFY_WORK: &'static str = crate::fragments::postgres::notify_work!();

    fn statements() -> &'static Statements {
        static STATEMENTS: LazyLock<Statements> = LazyLock::new(Statements::of::<Postgres>);
        &STATEMENTS
    }
}
