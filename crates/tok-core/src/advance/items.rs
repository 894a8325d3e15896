//! How the decider forks a `for_each` step's items and joins them
//! ([`crate::for_each`] has the rules).

use super::{Decider, Env, Then, Transition};
use crate::definition::Step;
use crate::for_each::{self, ItemsJoin, Spec};
use crate::run::{NextJob, RunStatus, StepStatus};

impl Decider<'_> {
    /// The `for_each` step at the state's path begins: its items are
    /// published for their steps and its first `concurrency` items fork;
    /// with no item (or nothing to do) it completes at once.
    pub(super) fn fork_items(mut self, step: &Step, spec: Spec, env: &mut Env<'_>) -> Transition {
        let now = self.now_ms();
        let path = self.state.path.clone();
        let total = spec.items.len();
        if total == 0 || step.do_.is_empty() {
            let record = self.record(step, None, now);
            let outputs = for_each::joined(&mut self.state.context, &path, total, &[], &[]);
            let log = vec![format!("nothing to do for {total} items")];
            return self.completed(step, record, outputs, log, env);
        }
        let published = for_each::forked(&spec);
        if let Err(error) = self.state_fits(step, &published) {
            return self.step_failed(step, None, now, error, env);
        }
        self.state.context.publish(&step.id, &published);
        let forks = for_each::forks(&spec, &path);
        let mut record = self.record(step, None, now);
        record.status = StepStatus::Waiting;
        record.log.push(format!(
            "running {total} items, {} at once",
            spec.concurrency.min(total)
        ));
        self.push(record);
        let items = ItemsJoin {
            total,
            started: forks.len(),
            concurrency: spec.concurrency,
            need: spec.need().min(total),
            cancelled: Vec::new(),
        };
        let next = NextJob::Fork {
            path: path.to_string(),
            branches: forks,
            items: Some(items),
        };
        self.finish(RunStatus::Running, None, Then::Record(next))
    }

    /// The items of the `for_each` step at the state's path met its
    /// completion rule: the step completes with their results in item
    /// order.
    pub(super) fn items_joined(
        mut self,
        step: &Step,
        total: usize,
        done: &[usize],
        cancelled: &[usize],
        env: &mut Env<'_>,
    ) -> Transition {
        let now = self.now_ms();
        let path = self.state.path.clone();
        let outputs = for_each::joined(&mut self.state.context, &path, total, done, cancelled);
        let record = self.record(step, None, now);
        let mut line = format!("{} of {total} items done", done.len());
        if !cancelled.is_empty() {
            line.push_str(&format!("; {} cancelled", cancelled.len()));
        }
        self.completed(step, record, outputs, vec![line], env)
    }
}
