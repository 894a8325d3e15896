//! Parallel branches (docs/workflows.md, "`parallel`"): a `parallel` step
//! runs each of its `branches` as a chain of jobs of its own, so that
//! branches calling services call them at the same time, and goes on once
//! every branch is done.
//!
//! How the decider drives it: reaching a `parallel` step, it forks
//! ([`crate::run::NextJob::Fork`]): the step's job parks at the step and a
//! job starts each non-empty branch at `<path>.branches.<b>.0`. A branch's
//! job runs its steps like any job and, past its branch's last step
//! ([`crate::flow::Next::BranchDone`]), ends with
//! [`crate::run::NextJob::BranchDone`]; a step that fails for good inside a
//! branch ends the branch as failed instead of failing the run. The store
//! counts the branches done on the parked job
//! ([`crate::run::Resume::Branches`]) in the branches' record transactions,
//! which a run's lock serializes, so the join happens once: when the last
//! branch is done, or at the first failure (the other branches' jobs are
//! cancelled then). The parked job is claimed again, and the decider
//! completes the `parallel` step (`{branches: n}`) or fails it with
//! `branch_failed` and the branch's error.
//!
//! Branches publish their steps' outputs into the one context of the run;
//! the store writes a branch's publications over the run's current context
//! rather than its whole copy, so two branches recording at once lose
//! neither's outputs. Each branch's claim counts its steps from the
//! actions the run had when it was claimed, so branches that run at the
//! same time near the end of a run's `MAX_ACTIONS` can pass it by the
//! steps their claims run at once (at most the claims' chain limit each).

use serde_json::{Map, Value, json};

use crate::definition::Step;
use crate::path::{Branch, FlowPath};

/// The step type that runs its branches at the same time.
pub const PARALLEL: &str = "parallel";

/// The branches a `parallel` step at `path` starts: each non-empty
/// branch's index and the path of its first step.
pub fn forks(step: &Step, path: &FlowPath) -> Vec<(usize, String)> {
    step.branches
        .iter()
        .enumerate()
        .filter(|(_, steps)| !steps.is_empty())
        .map(|(b, _)| (b, path.child(Branch::Parallel(b), 0).to_string()))
        .collect()
}

/// What a joined `parallel` step publishes.
pub fn joined(total: usize) -> Map<String, Value> {
    Map::from_iter([("branches".to_owned(), json!(total))])
}

/// Whether a job's path runs inside a branch of a `parallel` step or an
/// item of a `for_each` step (the store merges such a job's publications
/// into the run's context). The compensation of a branch's step is not:
/// it runs on the run's one job, after the branches.
pub fn in_branch(path: &str) -> bool {
    (path.contains(".branches.") || path.contains(".items.")) && !path.contains(".compensate.")
}
