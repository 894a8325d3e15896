//! Counting the database statements a process executes, for `tok bench
//! --only db-cost` where PostgreSQL has no `pg_stat_statements`: with
//! `TOK_COUNT_STATEMENTS=1`, every statement sqlx runs (it reports each one
//! as an event of target `sqlx::query`) adds one to the counter
//! `tok_db_statements_total` of `/metrics`.
//!
//! Off by default: sqlx builds its report of a statement only when someone
//! listens, and that costs the process a little for each one.

use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{Filtered, Targets};
use tracing_subscriber::layer::Context;

/// Describes the counter: its `# HELP` in `/metrics`.
pub fn describe() {
    metrics::describe_counter!(
        "tok_db_statements_total",
        "Database statements this process executed (only with TOK_COUNT_STATEMENTS=1)"
    );
}

/// The counter, when `TOK_COUNT_STATEMENTS` is `1` or `true`.
pub fn layer<S: Subscriber>() -> Option<Filtered<Counter, Targets, S>> {
    let on = std::env::var("TOK_COUNT_STATEMENTS").is_ok_and(|v| matches!(v.trim(), "1" | "true"));
    on.then(|| {
        Counter.with_filter(Targets::new().with_target("sqlx::query", tracing::Level::DEBUG))
    })
}

/// Counts the events it is given: the filter gives it sqlx's statements.
pub struct Counter;

impl<S: Subscriber> Layer<S> for Counter {
    fn on_event(&self, _event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        metrics::counter!("tok_db_statements_total").increment(1);
    }
}
