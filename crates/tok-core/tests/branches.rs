//! The decider's tables for parallel branches: a `parallel` step forks a
//! job per branch and parks; a branch's job runs its steps and ends its
//! branch past the last one; a branch step that fails for good fails its
//! branch, not the run; the join completes the step or fails it with
//! `branch_failed`. No database.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tok_core::advance::{Effect, Env, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, RunStatus};

const NOW_MS: i64 = 1_780_000_000_000;

fn kinds(_: &str) -> StepClass {
    StepClass::External
}

fn tree(steps: Value) -> Automation {
    let json = json!({ "name": "Orders", "trigger": { "kind": "manual" }, "steps": steps });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

fn state(path: &str) -> RunState {
    let context = Context::new(Map::new(), json!({}), json!({ "type": "manual" }));
    RunState::at(path.parse::<FlowPath>().expect("a path"), 1, context, 0)
}

fn run(automation: &Automation, state: RunState, input: Input) -> Transition {
    let mut rng = StdRng::seed_from_u64(7);
    let mut env = Env {
        now: Timestamp::from_millisecond(NOW_MS).expect("a time"),
        kinds: &kinds,
        rng: &mut rng,
        retries: &|_| None,
    };
    advance(automation, state, input, &mut env)
}

type Seen = (Vec<String>, RunStatus, String);

fn seen(t: &Transition) -> Seen {
    let records = t
        .records
        .iter()
        .map(|r| format!("{} {}", r.step_id, r.status))
        .collect();
    let then = match &t.then {
        Then::Execute(step) => format!("execute {} at {}", step.step_id, step.path),
        Then::Record(NextJob::Fork { path, branches, .. }) => {
            let starts: Vec<&str> = branches.iter().map(|(_, p)| p.as_str()).collect();
            format!("park at {path}, start {}", starts.join(" "))
        }
        Then::Record(NextJob::BranchDone {
            parallel,
            branch,
            failed,
        }) => match failed {
            None => format!("branch {branch} of {parallel} done"),
            Some(e) => format!("branch {branch} of {parallel} failed: {e}"),
        },
        Then::Record(NextJob::Step { path, .. }) => format!("step {path}"),
        Then::Record(NextJob::Done) => "done".into(),
        Then::Record(other) => format!("{other:?}"),
    };
    (records, t.status, then)
}

fn done() -> Input {
    Input::StepDone {
        outputs: Map::from_iter([("status".to_owned(), json!(200))]),
        log: Vec::new(),
        input: None,
        started_at: NOW_MS - 5,
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Two calls at once, then a log line: branch 0 logs and calls the shop,
/// branch 1 calls the warehouse, branch 2 is empty.
fn order() -> Automation {
    tree(json!([
        { "id": "st_both", "type": "parallel", "branches": [
            [
                { "id": "st_note", "type": "flow/log", "config": { "message": "shop" } },
                { "id": "st_shop", "type": "http", "config": { "url": "https://shop" } }
            ],
            [ { "id": "st_stock", "type": "http", "config": { "url": "https://stock" } } ],
            []
        ] },
        { "id": "st_after", "type": "flow/log", "config": { "message": "both {{st_shop.status}} {{st_stock.status}}" } }
    ]))
}

#[test]
fn a_parallel_step_forks_its_branches_and_each_branch_ends_on_its_own() {
    let order = order();
    let table: Vec<(&str, RunState, Input, Seen)> = vec![
        (
            "the parallel step parks and starts a job per non-empty branch",
            state("0"),
            Input::Start,
            (
                strings(&["st_both waiting"]),
                RunStatus::Running,
                "park at 0, start 0.branches.0.0 0.branches.1.0".into(),
            ),
        ),
        (
            "a branch runs its control steps and hands out its call",
            state("0.branches.0.0"),
            Input::Start,
            (
                strings(&["st_note completed"]),
                RunStatus::Running,
                "step 0.branches.0.1".into(),
            ),
        ),
        (
            "past its last step a branch is done, and nothing after the parallel step runs",
            state("0.branches.0.1"),
            done(),
            (
                strings(&["st_shop completed"]),
                RunStatus::Running,
                "branch 0 of 0 done".into(),
            ),
        ),
        (
            "a branch step that fails for good fails the branch, not the run",
            state("0.branches.1.0"),
            Input::StepFailed {
                error: StepError::terminal("HTTP 404"),
                input: None,
                started_at: NOW_MS,
            },
            (
                strings(&["st_stock failed"]),
                RunStatus::Running,
                "branch 1 of 0 failed: step `st_stock` failed: HTTP 404".into(),
            ),
        ),
        (
            "the join of every branch completes the step and the run goes on",
            {
                let mut s = state("0");
                s.context.publish(
                    "st_shop",
                    &Map::from_iter([("status".to_owned(), json!(200))]),
                );
                s.context.publish(
                    "st_stock",
                    &Map::from_iter([("status".to_owned(), json!(201))]),
                );
                s
            },
            Input::BranchesJoined {
                total: 2,
                failed: None,
                done: vec![],
                cancelled: vec![],
            },
            (
                strings(&["st_both completed", "st_after completed"]),
                RunStatus::Completed,
                "done".into(),
            ),
        ),
        (
            "a failed branch fails the parallel step and the run",
            state("0"),
            Input::BranchesJoined {
                total: 2,
                failed: Some("branch 1 failed: step `st_stock` failed: HTTP 404".into()),
                done: vec![],
                cancelled: vec![],
            },
            (
                strings(&["st_both failed"]),
                RunStatus::Failed,
                "done".into(),
            ),
        ),
    ];
    for (what, state, input, expected) in table {
        assert_eq!(seen(&run(&order, state, input)), expected, "{what}");
    }
}

#[test]
fn a_branch_failure_raises_no_incident_until_the_parallel_step_fails() {
    let order = order();
    let t = run(
        &order,
        state("0.branches.1.0"),
        Input::StepFailed {
            error: StepError::terminal("HTTP 404"),
            input: None,
            started_at: NOW_MS,
        },
    );
    assert!(t.effects.is_empty(), "{:?}", t.effects);
    assert_eq!(t.error, None);

    let t = run(
        &order,
        state("0"),
        Input::BranchesJoined {
            total: 2,
            failed: Some("branch 1 failed: HTTP 404".into()),
            done: vec![],
            cancelled: vec![],
        },
    );
    let [Effect::RunFailed(failure)] = t.effects.as_slice() else {
        panic!("one incident: {:?}", t.effects);
    };
    assert_eq!(failure.step_id, "st_both");
    assert_eq!(failure.message, "branch_failed: branch 1 failed: HTTP 404");
    assert_eq!(
        t.error.as_deref(),
        Some("step `st_both` failed: branch_failed: branch 1 failed: HTTP 404")
    );
}

#[test]
fn a_retryable_failure_in_a_branch_retries_in_the_branch() {
    let t = run(
        &order(),
        state("0.branches.1.0"),
        Input::StepFailed {
            error: StepError::retryable("HTTP 503"),
            input: None,
            started_at: NOW_MS,
        },
    );
    assert_eq!(t.status, RunStatus::Running);
    assert!(
        matches!(&t.then, Then::Record(NextJob::Retry { path, .. }) if path == "0.branches.1.0"),
        "{:?}",
        t.then
    );
}

#[test]
fn nested_parallel_steps_and_loops_end_their_own_branch() {
    let automation = tree(json!([
        { "id": "outer", "type": "parallel", "branches": [
            [
                { "id": "inner", "type": "parallel", "branches": [
                    [ { "id": "a", "type": "flow/log", "config": { "message": "a" } } ]
                ] },
                { "id": "after_inner", "type": "flow/log", "config": { "message": "x" } }
            ],
            [
                { "id": "each", "type": "loop", "config": { "items": [1, 2] },
                  "do": [ { "id": "b", "type": "flow/log", "config": { "message": "{{item}}" } } ] }
            ]
        ] }
    ]));
    let cases: Vec<(&str, Input, Seen)> = vec![
        (
            "0.branches.0.0",
            Input::Start,
            (
                strings(&["inner waiting"]),
                RunStatus::Running,
                "park at 0.branches.0.0, start 0.branches.0.0.branches.0.0".into(),
            ),
        ),
        (
            "0.branches.0.0.branches.0.0",
            Input::Start,
            (
                strings(&["a completed"]),
                RunStatus::Running,
                "branch 0 of 0.branches.0.0 done".into(),
            ),
        ),
        (
            "0.branches.0.0",
            Input::BranchesJoined {
                total: 1,
                failed: None,
                done: vec![],
                cancelled: vec![],
            },
            (
                strings(&["inner completed", "after_inner completed"]),
                RunStatus::Running,
                "branch 0 of 0 done".into(),
            ),
        ),
        (
            "0.branches.1.0",
            Input::Start,
            (
                strings(&["each completed", "b completed", "b completed"]),
                RunStatus::Running,
                "branch 1 of 0 done".into(),
            ),
        ),
        (
            "0.branches.0.0",
            Input::BranchesJoined {
                total: 1,
                failed: Some("boom".into()),
                done: vec![],
                cancelled: vec![],
            },
            (
                strings(&["inner failed"]),
                RunStatus::Running,
                "branch 0 of 0 failed: step `inner` failed: branch_failed: boom".into(),
            ),
        ),
    ];
    for (path, input, expected) in cases {
        assert_eq!(
            seen(&run(&automation, state(path), input)),
            expected,
            "at {path}"
        );
    }
}

#[test]
fn a_parallel_step_of_empty_branches_completes_at_once() {
    let automation = tree(json!([
        { "id": "p", "type": "parallel", "branches": [[], []] },
        { "id": "z", "type": "flow/log", "config": { "message": "z" } }
    ]));
    let t = run(&automation, state("0"), Input::Start);
    assert_eq!(
        seen(&t),
        (
            strings(&["p completed", "z completed"]),
            RunStatus::Completed,
            "done".into()
        )
    );
    assert_eq!(t.records[0].output, Some(json!({ "branches": 0 })));
}
