//! The [`Driver`] of PostgreSQL: each [`Arg`] bound as its type, each
//! [`Kind`] decoded from the column (a JSON column from `jsonb` or `json`).

use std::future::Future;

use serde_json::Value;
use sqlx::postgres::{PgArguments, PgConnection, PgRow};
use sqlx::query::Query;
use sqlx::types::Json;
use sqlx::{Row as _, ValueRef as _};

use super::{Arg, Cell, Conn, Driver, Kind, Statement};

/// PostgreSQL, as the shared queries see it.
pub(crate) struct Postgres;

fn bound<'q>(statement: Statement<'q>) -> Query<'q, sqlx::Postgres, PgArguments> {
    let mut query = sqlx::query(statement.sql);
    for arg in statement.args {
        query = match arg {
            Arg::Text(v) => query.bind(v),
            Arg::Int(v) => query.bind(v),
            Arg::Int32(v) => query.bind(v),
            Arg::Bool(v) => query.bind(v),
            Arg::Float(v) => query.bind(v),
            Arg::Json(v) => query.bind(v.map(Json)),
            Arg::Texts(v) => query.bind(v),
            Arg::Ints(v) => query.bind(v),
        };
    }
    query
}

impl Driver for Postgres {
    type Db = sqlx::Postgres;

    const LOCK_ROWS: &'static str = "FOR UPDATE";

    const DB_NOW: &'static str = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT";

    const ADMIN_KEY_LOCK: Option<(&'static str, i64)> = Some((
        "SELECT pg_advisory_xact_lock($1)",
        crate::postgres::ADMIN_KEY_LOCK,
    ));

    fn any_of(n: usize) -> String {
        format!("= ANY(${n})")
    }

    fn fetch_all<'c>(
        conn: &'c mut PgConnection,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<Vec<PgRow>>> + Send + 'c {
        bound(statement).fetch_all(conn)
    }

    fn fetch_optional<'c>(
        conn: &'c mut Conn<Self>,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<Option<PgRow>>> + Send + 'c {
        bound(statement).fetch_optional(conn)
    }

    fn execute<'c>(
        conn: &'c mut Conn<Self>,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send + 'c {
        let query = bound(statement);
        async move { Ok(query.execute(conn).await?.rows_affected()) }
    }

    fn read(row: &PgRow, column: &str, kind: Kind) -> sqlx::Result<Cell> {
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

    const LOCK_ROWS_SKIP_LOCKED: &'static str = "FOR UPDATE SKIP LOCKED";

    const MIGRATION_LOCK: Option<(&'static str, i64)> = Some((
        "SELECT pg_advisory_xact_lock($1)",
        crate::postgres::MIGRATION_LOCK,
    ));
}
