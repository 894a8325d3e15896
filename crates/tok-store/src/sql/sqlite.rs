//! The [`Driver`] of SQLite: each [`Arg`] bound as its type (a JSON
//! document as its text), each [`Kind`] decoded from the column (a JSON
//! column from its text).

use std::future::Future;

use serde_json::Value;
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::types::Json;
use sqlx::{Row as _, ValueRef as _};

use super::{Arg, Cell, Driver, Kind, Statement};

/// SQLite, as the shared queries see it.
pub(crate) struct Sqlite;

fn bound<'q>(statement: Statement<'q>) -> Query<'q, sqlx::Sqlite, SqliteArguments<'q>> {
    let mut query = sqlx::query(statement.sql);
    for arg in statement.args {
        query = match arg {
            Arg::Text(v) => query.bind(v),
            Arg::Int(v) => query.bind(v),
            Arg::Int32(v) => query.bind(v),
            Arg::Bool(v) => query.bind(v),
            Arg::Float(v) => query.bind(v),
            Arg::Json(v) => query.bind(v.map(Json)),
            Arg::Texts(v) => query.bind(serde_json::to_string(&v).unwrap_or_else(|_| "[]".into())),
            Arg::Ints(v) => query.bind(serde_json::to_string(&v).unwrap_or_else(|_| "[]".into())),
        };
    }
    query
}

impl Driver for Sqlite {
    type Db = sqlx::Sqlite;

    const LOCK_ROWS: &'static str = "";

    const DB_NOW: &'static str = "(CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) \
         + (SELECT offset_ms FROM clock_offset))";

    const ADMIN_KEY_LOCK: Option<(&'static str, i64)> = None;

    fn any_of(n: usize) -> String {
        format!("IN (SELECT value FROM json_each(${n}))")
    }

    fn fetch_all<'c>(
        conn: &'c mut SqliteConnection,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<Vec<SqliteRow>>> + Send + 'c {
        bound(statement).fetch_all(conn)
    }

    fn fetch_optional<'c>(
        conn: &'c mut SqliteConnection,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<Option<SqliteRow>>> + Send + 'c {
        bound(statement).fetch_optional(conn)
    }

    fn execute<'c>(
        conn: &'c mut SqliteConnection,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send + 'c {
        let query = bound(statement);
        async move { Ok(query.execute(conn).await?.rows_affected()) }
    }

    fn read(row: &SqliteRow, column: &str, kind: Kind) -> sqlx::Result<Cell> {
        if row.try_get_raw(column)?.is_null() {
            return Ok(Cell::Null);
        }
        Ok(match kind {
            Kind::Text => Cell::Text(row.try_get(column)?),
            Kind::Int => Cell::Int(row.try_get(column)?),
            Kind::Int32 => Cell::Int32(row.try_get(column)?),
            Kind::Bool => Cell::Bool(row.try_get(column)?),
            Kind::Float => Cell::Float(row.try_get(column)?),
            Kind::Json => Cell::Json(row.try_get::<Json<Value>, _>(column)?.0),
        })
    }

    const LOCK_ROWS_SKIP_LOCKED: &'static str = "";

    const MIGRATION_LOCK: Option<(&'static str, i64)> = None;
}
