//! How far a run is (`progress: {done, total?}` on runs): the steps it has
//! executed, and the steps it will execute in all where its tree fixes
//! that number.
//!
//! A tree fixes its total when every step of its top-level list runs once:
//! no condition, loop, `repeat`, `parallel`, `for_each` or `end` (which
//! decide at run time how many steps follow), and no escalations (whose
//! steps run only while a wait lasts). Elsewhere `total` is absent, and
//! `done` alone counts up. Compensations (undoing a cancelled run) are not
//! part of the total: `done` stops at it.

use serde::Serialize;

use crate::definition::Step;

/// A run's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Steps executed (loop iterations count, as toward
    /// [`crate::limits::MAX_ACTIONS`]).
    pub done: u32,
    /// Steps the run executes in all; absent when its tree decides at run
    /// time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u32>,
}

/// The step types after which the number of steps to come is decided at
/// run time.
const DECIDING: &[&str] = &["condition", "loop", "repeat", "parallel", "for_each", "end"];

/// The steps a run of `steps` executes in all, when the tree fixes it.
pub fn total(steps: &[Step]) -> Option<u32> {
    let fixed = steps.iter().all(|step| {
        !DECIDING.contains(&step.kind.as_str())
            && step.then.is_empty()
            && step.else_.is_empty()
            && step.do_.is_empty()
            && step.branches.is_empty()
            && step.escalations.is_empty()
    });
    fixed.then_some(steps.len() as u32)
}

/// The progress of a run of `steps` that executed `actions` steps.
pub fn of(steps: &[Step], actions: i32) -> Progress {
    let done = actions.max(0) as u32;
    match total(steps) {
        Some(total) => Progress {
            done: done.min(total),
            total: Some(total),
        },
        None => Progress { done, total: None },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn steps(value: serde_json::Value) -> Vec<Step> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_straight_tree_fixes_its_total() {
        let straight = steps(json!([
            {"id": "a", "type": "http", "config": {}},
            {"id": "b", "type": "set", "config": {"values": {}}},
            {"id": "c", "type": "wait_for_event", "config": {"key": "k"}},
        ]));
        assert_eq!(
            of(&straight, 0),
            Progress {
                done: 0,
                total: Some(3)
            }
        );
        assert_eq!(
            of(&straight, 2),
            Progress {
                done: 2,
                total: Some(3)
            }
        );
        // Compensations after a cancel do not pass the total.
        assert_eq!(
            of(&straight, 5),
            Progress {
                done: 3,
                total: Some(3)
            }
        );
    }

    #[test]
    fn a_tree_that_decides_at_run_time_has_no_total() {
        for decider in [
            json!({"id": "c", "type": "condition", "match": "all", "rules": [], "then": [{"id": "t", "type": "set"}]}),
            json!({"id": "l", "type": "loop", "config": {"items": "{{xs}}"}, "do": [{"id": "d", "type": "set"}]}),
            json!({"id": "p", "type": "parallel", "branches": [[{"id": "x", "type": "set"}]]}),
            json!({"id": "e", "type": "end"}),
        ] {
            let tree = steps(json!([{"id": "a", "type": "http"}, decider]));
            assert_eq!(
                of(&tree, 4),
                Progress {
                    done: 4,
                    total: None
                },
                "{tree:?}"
            );
        }
    }
}
