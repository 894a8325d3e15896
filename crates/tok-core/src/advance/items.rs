//! How the decider forks a `for_each` step's items and joins them
//! ([`crate::for_each`] has the rules).

use serde_json::{Map, Value};

use super::{Decider, Env, Then, Transition};
use crate::definition::Step;
use crate::flow;
use crate::for_each::{self, ItemsJoin, Spec};
use crate::path::Branch;
use crate::run::{NextJob, RunStatus, StepRecord, StepStatus};

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
        for_each::clear_items(&mut self.state.context, &path);
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
        let path = self.state.path.clone();
        let context = &mut self.state.context;
        if let Some(first) = for_each::begin_undo(context, &path, total, done, cancelled) {
            // The cancelled items' steps are undone first.
            self.state.path = first.child(Branch::Compensate, 0);
            self.state.attempt = 1;
            return self.chain(env);
        }
        let (record, outputs, log) = self.item_results(step, total, done, cancelled);
        self.completed(step, record, outputs, log, env)
    }

    /// The record, outputs and log line of the `for_each` `step` at the
    /// state's path whose items joined.
    fn item_results(
        &mut self,
        step: &Step,
        total: usize,
        done: &[usize],
        cancelled: &[usize],
    ) -> (StepRecord, Map<String, Value>, Vec<String>) {
        let path = self.state.path.clone();
        let outputs = for_each::joined(&mut self.state.context, &path, total, done, cancelled);
        let record = self.record(step, None, self.now_ms());
        let mut line = format!("{} of {total} items done", done.len());
        if !cancelled.is_empty() {
            line.push_str(&format!("; {} cancelled", cancelled.len()));
        }
        (record, outputs, vec![line])
    }

    /// A completed step of a cancelled item is undone: the next one is,
    /// or the `for_each` step completes and the run goes on after it.
    pub(super) fn undo_next_item(mut self, env: &mut Env<'_>) -> Result<Self, Box<Transition>> {
        if let Some(next) = for_each::next_undo(&mut self.state.context) {
            self.state.path = next.child(Branch::Compensate, 0);
            self.state.attempt = 1;
            return Ok(self);
        }
        let automation = self.automation;
        let ended = for_each::end_undo(&mut self.state.context);
        let Some((at, total, done, cancelled)) = ended else {
            return Err(Box::new(self.fail(
                "the for_each step undoing its cancelled items was lost".to_owned(),
            )));
        };
        let Some(step) = flow::step_at(&automation.steps, &at) else {
            return Err(Box::new(
                self.fail(format!("the run's version has no step at `{at}`")),
            ));
        };
        self.state.path = at;
        self.state.attempt = 1;
        let (record, outputs, log) = self.item_results(step, total, &done, &cancelled);
        if let Err(error) = self.state_fits(step, &outputs) {
            let started_at = record.started_at;
            return Err(Box::new(
                self.step_failed(step, None, started_at, error, env),
            ));
        }
        let next = self.publish(step, record, outputs, log);
        self.follow(next, env)
    }
}
