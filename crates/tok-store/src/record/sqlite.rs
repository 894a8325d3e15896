//! [`RecordSql`] of SQLite.

use std::sync::LazyLock;

use super::{RecordSql, Statements};
use crate::sql::sqlite::Sqlite;

impl RecordSql for Sqlite {
    const NOTIFY_WORK: &'static str = crate::fragments::sqlite::notify_work!();

    fn statements() -> &'static Statements {
        static STATEMENTS: LazyLock<Statements> = LazyLock::new(Statements::of::<Sqlite>);
        &STATEMENTS
    }
}
