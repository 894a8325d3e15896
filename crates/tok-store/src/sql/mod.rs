//! How the store's shared code talks to either database: a statement with
//! its arguments ([`Statement`]), run by a small trait each backend
//! implements once ([`Driver`]), and the row it returns read by column name
//! ([`Row`]), every failure to read a column a [`StoreError::Decode`] that
//! names the table and the column.
//!
//! Most of tok's SQL is the same text on PostgreSQL and SQLite (both take
//! `$1`-style parameters), so a trait's queries are written once, in plain
//! `async fn`s generic over `D: Driver` (`effects/queries.rs` is the
//! smallest example). Why a trait of our own rather than functions generic
//! over `sqlx::Database`: such a function must repeat, for every type it
//! binds or reads, bounds like `for<'q> &'q str: Encode<'q, DB> + Type<DB>`,
//! and Rust does not carry them over from a trait's where-clause, so each
//! query would open with a dozen lines of bounds. Here the arguments are a
//! closed set of values ([`Arg`]) and the columns a closed set of kinds
//! ([`Cell`]), each bound or decoded once per backend in `postgres.rs` and
//! `sqlite.rs` of this folder: what differs per backend is ordinary code an
//! editor can follow, and what is shared is checked once.
//!
//! Where the SQL itself differs (the database clock, how a list is bound,
//! row locking), the backend's [`Driver`] has the fragment as a constant
//! named for what it means, and a query that needs one is built per backend
//! (see `docs/architecture.md`, "The store").

pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::future::Future;

use serde::de::DeserializeOwned;
use serde_json::Value;

use tok_core::ids::TenantId;

use crate::routed::database::Database;
use crate::{Result, StoreError};

/// One value bound to a statement's parameter. A `None` keeps its type, so
/// that PostgreSQL knows what `$n IS NULL` compares.
#[derive(Debug, Clone)]
pub(crate) enum Arg<'q> {
    Text(Option<&'q str>),
    Int(Option<i64>),
    /// A 32-bit integer, for an `INTEGER` column (PostgreSQL's `int4`).
    Int32(Option<i32>),
    Bool(Option<bool>),
    // Kept for the traits still in `*_sql.rs` macros: none moved binds or
    // reads this kind yet.
    #[allow(dead_code)]
    Float(Option<f64>),
    /// A JSON document (`jsonb` on PostgreSQL, text on SQLite).
    Json(Option<&'q Value>),
    /// A list of texts, for [`Driver::any_of`]: an array on PostgreSQL, a
    /// JSON array on SQLite (which has no arrays).
    Texts(Vec<&'q str>),
    /// A list of integers, for [`Driver::any_of`] (as [`Arg::Texts`]).
    Ints(Vec<i64>),
}

/// A statement to run: its SQL, the table it reads (for the errors of its
/// rows) and its arguments in the order of its parameters.
#[derive(Debug, Clone)]
pub(crate) struct Statement<'q> {
    pub(crate) table: &'static str,
    pub(crate) sql: &'q str,
    pub(crate) args: Vec<Arg<'q>>,
}

/// A statement on `table` (the table whose columns its rows hold, named
/// in the error of a column that cannot be read).
pub(crate) fn on<'q>(table: &'static str, sql: &'q str) -> Statement<'q> {
    Statement {
        table,
        sql,
        args: Vec::new(),
    }
}

impl<'q> Statement<'q> {
    pub(crate) fn text(mut self, value: &'q str) -> Self {
        self.args.push(Arg::Text(Some(value)));
        self
    }

    pub(crate) fn opt_text(mut self, value: Option<&'q str>) -> Self {
        self.args.push(Arg::Text(value));
        self
    }

    pub(crate) fn int(mut self, value: i64) -> Self {
        self.args.push(Arg::Int(Some(value)));
        self
    }

    pub(crate) fn opt_int(mut self, value: Option<i64>) -> Self {
        self.args.push(Arg::Int(value));
        self
    }

    /// A 32-bit integer, for an `INTEGER` column (PostgreSQL's `int4`).
    pub(crate) fn int32(mut self, value: i32) -> Self {
        self.args.push(Arg::Int32(Some(value)));
        self
    }

    pub(crate) fn opt_int32(mut self, value: Option<i32>) -> Self {
        self.args.push(Arg::Int32(value));
        self
    }

    pub(crate) fn opt_bool(mut self, value: Option<bool>) -> Self {
        self.args.push(Arg::Bool(value));
        self
    }

    pub(crate) fn bool(mut self, value: bool) -> Self {
        self.args.push(Arg::Bool(Some(value)));
        self
    }

    // Kept for the traits still in `*_sql.rs` macros: none moved binds or
    // reads this kind yet.
    #[allow(dead_code)]
    pub(crate) fn float(mut self, value: f64) -> Self {
        self.args.push(Arg::Float(Some(value)));
        self
    }

    pub(crate) fn opt_float(mut self, value: Option<f64>) -> Self {
        self.args.push(Arg::Float(value));
        self
    }

    pub(crate) fn json(mut self, value: &'q Value) -> Self {
        self.args.push(Arg::Json(Some(value)));
        self
    }

    // Kept for the traits still in `*_sql.rs` macros: none moved binds or
    // reads this kind yet.
    #[allow(dead_code)]
    pub(crate) fn opt_json(mut self, value: Option<&'q Value>) -> Self {
        self.args.push(Arg::Json(value));
        self
    }

    /// A list, read in the SQL with [`Driver::any_of`].
    pub(crate) fn texts(mut self, values: impl IntoIterator<Item = &'q str>) -> Self {
        self.args.push(Arg::Texts(values.into_iter().collect()));
        self
    }

    /// A list of integers, read in the SQL with [`Driver::any_of`].
    pub(crate) fn ints(mut self, values: impl IntoIterator<Item = i64>) -> Self {
        self.args.push(Arg::Ints(values.into_iter().collect()));
        self
    }

    /// The rows it returns.
    pub(crate) async fn fetch_all<D: Driver>(self, conn: &mut Conn<D>) -> Result<Vec<Row<D>>> {
        let table = self.table;
        let rows = D::fetch_all(conn, self).await?;
        Ok(rows.into_iter().map(|row| Row { row, table }).collect())
    }

    /// Its one row, if any.
    pub(crate) async fn fetch_optional<D: Driver>(
        self,
        conn: &mut Conn<D>,
    ) -> Result<Option<Row<D>>> {
        let table = self.table;
        Ok(D::fetch_optional(conn, self)
            .await?
            .map(|row| Row { row, table }))
    }

    /// Its one row; [`StoreError::NotFound`] (the table) when there is none.
    pub(crate) async fn fetch_one<D: Driver>(self, conn: &mut Conn<D>) -> Result<Row<D>> {
        let table = self.table;
        self.fetch_optional(conn)
            .await?
            .ok_or(StoreError::NotFound(table))
    }

    /// Runs it; how many rows it changed.
    pub(crate) async fn execute<D: Driver>(self, conn: &mut Conn<D>) -> Result<u64> {
        Ok(D::execute(conn, self).await?)
    }
}

/// A connection of driver `D`'s database (a pool's connection and an open
/// transaction both dereference to one).
pub(crate) type Conn<D> = <<D as Driver>::Db as sqlx::Database>::Connection;

/// A write transaction of store `S`'s database (what `S::writer().begin()`
/// gives), for the queries still written once per backend that take one.
pub(crate) type Tx<S> = sqlx::Transaction<'static, <<S as SqlStore>::Driver as Driver>::Db>;

/// What one column of a row held, as the store reads it.
#[derive(Debug)]
pub(crate) enum Cell {
    Null,
    Text(String),
    Int(i64),
    Int32(i32),
    Bool(bool),
    #[allow(dead_code)]
    Float(f64),
    Json(Value),
}

/// The kind of value a column is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Text,
    Int,
    /// A 32-bit integer (PostgreSQL's `int4`, which does not decode as
    /// [`Kind::Int`]).
    Int32,
    Bool,
    #[allow(dead_code)]
    Float,
    Json,
}

/// What a backend does for the shared queries: run a statement, and read
/// one column of a row as a [`Kind`]. Implemented by [`postgres::Postgres`]
/// and [`sqlite::Sqlite`].
pub(crate) trait Driver: Send + Sync + 'static {
    type Db: sqlx::Database;

    /// Locks the rows a `SELECT` reads until the transaction ends (empty
    /// where the one writer at a time needs no lock).
    const LOCK_ROWS: &'static str;

    /// The database clock in Unix milliseconds: leases and due times use
    /// it, so that processes on machines whose clocks differ agree (on
    /// SQLite it adds the offset `tok test` moves, table `clock_offset`).
    const DB_NOW: &'static str;

    /// The statement that serializes rotations of the platform admin key
    /// until the transaction ends, and the lock key it binds at `$1`
    /// (`None` where the one writer serializes them).
    const ADMIN_KEY_LOCK: Option<(&'static str, i64)>;

    /// "Is one of the list bound at `$n`" ([`Statement::texts`]).
    fn any_of(n: usize) -> String;

    fn fetch_all<'c>(
        conn: &'c mut Conn<Self>,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<Vec<<Self::Db as sqlx::Database>::Row>>> + Send + 'c;

    fn fetch_optional<'c>(
        conn: &'c mut Conn<Self>,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<Option<<Self::Db as sqlx::Database>::Row>>> + Send + 'c;

    fn execute<'c>(
        conn: &'c mut Conn<Self>,
        statement: Statement<'c>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send + 'c;

    /// Column `column` of `row` read as `kind` (`Cell::Null` when NULL).
    fn read(
        row: &<Self::Db as sqlx::Database>::Row,
        column: &str,
        kind: Kind,
    ) -> sqlx::Result<Cell>;

    /// Locks the rows a `SELECT` reads until the transaction ends, but
    /// skips those another transaction holds (empty where the one writer
    /// at a time needs no lock).
    const LOCK_ROWS_SKIP_LOCKED: &'static str;

    /// The statement that takes the lock the migrations take, until the
    /// transaction ends, and the lock key it binds at `$1`: for what must
    /// not run twice at once beside them, the resealing of stored secrets
    /// (`None` where the one writer serializes it).
    const MIGRATION_LOCK: Option<(&'static str, i64)>;
}

/// A row a [`Statement`] returned, read by column name.
pub(crate) struct Row<D: Driver> {
    row: <D::Db as sqlx::Database>::Row,
    table: &'static str,
}

impl<D: Driver> Row<D> {
    /// A row sqlx returned for a statement on `table`, read by name from
    /// then on (for the queries still written with sqlx directly).
    pub(crate) fn new(row: <D::Db as sqlx::Database>::Row, table: &'static str) -> Self {
        Self { row, table }
    }

    fn cell(&self, column: &'static str, kind: Kind) -> Result<Cell> {
        D::read(&self.row, column, kind).map_err(|e| self.undecodable(column, e.to_string()))
    }

    fn undecodable(&self, column: &'static str, cause: String) -> StoreError {
        StoreError::Decode {
            table: self.table,
            column,
            cause,
        }
    }

    fn required<T>(&self, column: &'static str, value: Option<T>) -> Result<T> {
        value.ok_or_else(|| self.undecodable(column, "it is NULL".into()))
    }

    pub(crate) fn opt_text(&self, column: &'static str) -> Result<Option<String>> {
        match self.cell(column, Kind::Text)? {
            Cell::Text(text) => Ok(Some(text)),
            _ => Ok(None),
        }
    }

    pub(crate) fn text(&self, column: &'static str) -> Result<String> {
        let value = self.opt_text(column)?;
        self.required(column, value)
    }

    pub(crate) fn opt_int(&self, column: &'static str) -> Result<Option<i64>> {
        match self.cell(column, Kind::Int)? {
            Cell::Int(int) => Ok(Some(int)),
            _ => Ok(None),
        }
    }

    pub(crate) fn int(&self, column: &'static str) -> Result<i64> {
        let value = self.opt_int(column)?;
        self.required(column, value)
    }

    pub(crate) fn opt_int32(&self, column: &'static str) -> Result<Option<i32>> {
        match self.cell(column, Kind::Int32)? {
            Cell::Int32(int) => Ok(Some(int)),
            _ => Ok(None),
        }
    }

    /// An `INTEGER` column (PostgreSQL's `int4`).
    pub(crate) fn int32(&self, column: &'static str) -> Result<i32> {
        let value = self.opt_int32(column)?;
        self.required(column, value)
    }

    pub(crate) fn bool(&self, column: &'static str) -> Result<bool> {
        let value = match self.cell(column, Kind::Bool)? {
            Cell::Bool(b) => Some(b),
            _ => None,
        };
        self.required(column, value)
    }

    // Kept for the traits still in `*_sql.rs` macros: none moved binds or
    // reads this kind yet.
    #[allow(dead_code)]
    pub(crate) fn opt_float(&self, column: &'static str) -> Result<Option<f64>> {
        match self.cell(column, Kind::Float)? {
            Cell::Float(float) => Ok(Some(float)),
            _ => Ok(None),
        }
    }

    pub(crate) fn float(&self, column: &'static str) -> Result<f64> {
        let value = self.opt_float(column)?;
        self.required(column, value)
    }

    /// A JSON column as `T`; `None` when NULL.
    pub(crate) fn opt_json<T: DeserializeOwned>(&self, column: &'static str) -> Result<Option<T>> {
        match self.cell(column, Kind::Json)? {
            Cell::Json(value) => serde_json::from_value(value)
                .map(Some)
                .map_err(|e| self.undecodable(column, e.to_string())),
            _ => Ok(None),
        }
    }

    pub(crate) fn json<T: DeserializeOwned>(&self, column: &'static str) -> Result<T> {
        let value = self.opt_json(column)?;
        self.required(column, value)
    }
}

/// The [`Driver`] of a sqlx database: for the queries still written with
/// sqlx directly, to read their rows as [`Row`]s.
pub(crate) trait Native: sqlx::Database {
    type Driver: Driver<Db = Self>;
}

impl Native for sqlx::Postgres {
    type Driver = postgres::Postgres;
}

impl Native for sqlx::Sqlite {
    type Driver = sqlite::Sqlite;
}

/// A store on one database of driver [`SqlStore::Driver`]: what the shared
/// trait implementations need of `PgStore` and `SqliteStore`.
pub(crate) trait SqlStore: Send + Sync + 'static {
    type Driver: Driver;

    /// The pool reads go to.
    fn reader(&self) -> &sqlx::Pool<<Self::Driver as Driver>::Db>;

    /// The pool writes go to, once it is this writer's turn (SQLite has one
    /// writer at a time; PostgreSQL takes them all at once).
    fn writer(
        &self,
    ) -> impl Future<Output = crate::gate::Writer<'_, <Self::Driver as Driver>::Db>> + Send;

    /// The keys that seal and open the credentials and signing secrets it
    /// stores (`secrets/`).
    fn keys(&self) -> &crate::secrets::Keyring;

    /// The database, as what the store reports names it: its file, or its
    /// URL without the password.
    fn name(&self) -> &str;
}

/// How a store reaches the database of one tenant: the one step every
/// method about one tenant takes first (`let db = self.db_for(tenant)`),
/// then runs its statements on `db` within [`Reach::call`]. `PgStore` and
/// `SqliteStore` are their own tenants' database; the routed store
/// (`routed/`) finds the tenant's, and bounds the call by that database's
/// timeout, so a trait whose methods each name one tenant is written once
/// for all three stores and the routed store repeats none of it.
pub(crate) trait Route: Send + Sync + 'static {
    type Store: SqlStore;

    fn db_for(
        &self,
        tenant: &TenantId,
    ) -> impl Future<Output = Result<Reach<'_, Self::Store>>> + Send;
}

/// The driver of the stores a [`Route`] reaches.
pub(crate) type DriverOf<R> = <<R as Route>::Store as SqlStore>::Driver;

/// The database of one tenant, as [`Route::db_for`] found it.
pub(crate) struct Reach<'a, S> {
    store: &'a S,
    /// The routed store's database, whose calls are bounded and which a
    /// call that gets no answer marks away; none on a store of one database.
    database: Option<&'a Database>,
}

impl<'a, S: SqlStore> Reach<'a, S> {
    /// A store that is its tenants' one database.
    pub(crate) fn direct(store: &'a S) -> Self {
        Self {
            store,
            database: None,
        }
    }

    /// The statements of one call on this database: on a routed tenant's
    /// database, they fail at once while it is away and are bounded by its
    /// timeout (see `routed/database.rs`).
    pub(crate) async fn call<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        match self.database {
            None => call.await,
            Some(database) => database.call(call).await,
        }
    }
}

impl<'a> Reach<'a, crate::PgStore> {
    /// A tenant's database of the routed store.
    pub(crate) fn routed(database: &'a Database) -> Self {
        Self {
            store: &database.store,
            database: Some(database),
        }
    }
}

impl<S> std::ops::Deref for Reach<'_, S> {
    type Target = S;

    fn deref(&self) -> &S {
        self.store
    }
}
