//! Black-box tests of tok's HTTP API: one module per feature, every test on
//! SQLite and on PostgreSQL (`<test>::sqlite`, `<test>::postgres`). Tests
//! assert on what a client sees — status codes and JSON bodies (docs/api.md) —
//! and reach the engine only through the API.

mod helpers;

mod approvals;
mod audit;
mod audit_ahead;
mod authorization;
mod automations;
mod blocked;
mod branches;
mod budgets;
mod bulk;
mod children;
mod compensation;
mod connections;
mod dashboard;
mod desk;
mod dry_run;
mod errors;
mod escalations;
mod flow;
mod flow_every_start;
mod for_each;
mod fuzz;
mod fuzz_definitions;
mod fuzz_nul;
mod fuzz_schemas;
mod fuzz_templates;
mod health;
mod incidents;
mod intake;
mod isolation;
mod keys;
mod lifecycle;
mod limits;
mod openapi;
mod outbound;
mod pages;
mod platform_incidents;
mod quotas;
mod repeat;
mod replay;
mod retention;
mod run_control;
mod runs;
mod schedules;
mod search;
mod senders;
mod set_aside;
mod several_waits;
mod signals;
mod signatures;
mod signed_only;
mod source_schemas;
mod state_limits;
mod tenant_concurrency;
mod tenants;
mod ticket_deletes;
mod ticket_outcomes;
mod versions;
mod waits;
mod webhook;
mod widgets;
