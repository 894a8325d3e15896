//! tok's sandbox for tenant JavaScript: small transforms
//! `function main(input) { return {...} }` run on QuickJS (`rquickjs`).
//!
//! Data flows engine → [`ScriptPool::run`] (in the worker, async) → a line
//! of JSON on a sandbox child's stdin → [`sandbox_main`] in that child
//! (QuickJS, synchronous) → a line of JSON back → [`ScriptOutput`] or
//! [`ScriptError`].
//!
//! Why child processes: QuickJS's interrupt handler stops `while (true)`
//! between instructions, but nothing inside the process can stop one long
//! builtin call such as `new Array(1e9).join()` or
//! `Array.prototype.indexOf.call({length: 2**32 - 1}, 1)`. A separate
//! process can always be killed, so the worker enforces a hard deadline
//! (timeout plus grace) by killing the child and starting another. It also
//! keeps scripts off the async runtime's threads, out of the API process,
//! and away from the worker's memory: a script that makes QuickJS abort
//! takes down only its child.
//!
//! Inside the child each script gets a heap limit, a stack limit, a
//! deadline, and a context of its own per cache key with only the standard
//! JavaScript builtins (no `std`/`os` modules, no network, no files) plus a
//! `console.log` that is captured.

mod error;
mod pool;
mod protocol;
mod sandbox;

pub use error::{Result, ScriptError};
pub use pool::{
    MAX_TIMEOUT, MIN_TIMEOUT, PoolConfig, PoolStats, SANDBOX_SUBCOMMAND, ScriptOutput, ScriptPool,
    ScriptRequest, check_timeout,
};
pub use sandbox::sandbox_main;
