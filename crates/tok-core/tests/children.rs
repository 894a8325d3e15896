//! The decider's tables for runs that start and wait for other runs: a
//! `run_workflow` step that starts a child and parks on it (or not), a
//! `wait_for_runs` step, the runs' ends resuming them, the nesting limit,
//! and the notice a child's end leaves for its parent. No database.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tok_core::advance::{
    Effect, Env, Input, ParentNotice, RunState, StepClass, Then, Transition, advance,
};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::ids::RunId;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, RunEnded, RunStatus, RunsMode, RunsWait};

const NOW_MS: i64 = 1_780_000_000_000;

fn kinds(kind: &str) -> StepClass {
    match kind {
        "run_workflow" | "ticket/upsert" => StepClass::InTransaction,
        _ => StepClass::External,
    }
}

fn tree(steps: Value) -> Automation {
    let json = json!({ "name": "Orders", "trigger": { "kind": "manual" }, "steps": steps });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

/// A run's state at `path`; `event` is its `_event`.
fn state(path: &str, event: Value) -> RunState {
    let context = Context::new(
        Map::from_iter([("orderId".to_owned(), json!("5001"))]),
        json!({ "orderId": "5001" }),
        event,
    );
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

/// The recorded steps, the run's status and the job's next move.
type Seen = (Vec<String>, RunStatus, String);

/// The recorded steps, the run's status and the job's next move, in words.
fn seen(t: &Transition) -> Seen {
    let records = t
        .records
        .iter()
        .map(|r| format!("{} {}", r.step_id, r.status))
        .collect();
    let then = match &t.then {
        Then::Execute(step) => format!("execute {} at {}", step.step_id, step.path),
        Then::Record(NextJob::WaitForRuns { path, wait }) => format!(
            "wait at {path} for {:?} of {}",
            wait.mode,
            wait.runs.join(", ")
        ),
        Then::Record(NextJob::Done) => "done".into(),
        Then::Record(other) => format!("{other:?}"),
    };
    (records, t.status, then)
}

fn started(run_id: &str, wait: bool) -> Input {
    Input::StepDone {
        outputs: Map::from_iter([("runId".to_owned(), json!(run_id))]),
        log: Vec::new(),
        input: Some(json!({ "automation": "Invoice", "wait": wait })),
        started_at: NOW_MS - 5,
    }
}

fn ended(run_id: &str, status: RunStatus, output: Value, error: Option<&str>) -> RunEnded {
    RunEnded {
        run_id: run_id.into(),
        status,
        output,
        error: error.map(str::to_owned),
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A parent: start the invoice child, then log what it returned.
fn parent_tree() -> Automation {
    tree(json!([
        { "id": "st_child", "type": "run_workflow",
          "config": { "automation": "Invoice", "input": { "orderId": "{{orderId}}" } } },
        { "id": "st_log", "type": "flow/log", "config": { "message": "child {{st_child.runId}}" } }
    ]))
}

#[test]
fn a_parent_starts_its_child_parks_on_it_and_goes_on_with_its_output() {
    let parent = parent_tree();
    let root = json!({ "type": "manual", "depth": 0 });
    let table: Vec<(&str, RunState, Input, Seen)> = vec![
        (
            "a start hands the run_workflow step to the record transaction",
            state("0", root.clone()),
            Input::Start,
            (vec![], RunStatus::Running, "execute st_child at 0".into()),
        ),
        (
            "the child started: the parent parks on it, holding no slot",
            state("0", root.clone()),
            started("run_c", true),
            (
                strings(&["st_child waiting"]),
                RunStatus::Waiting,
                "wait at 0 for All of run_c".into(),
            ),
        ),
        (
            "started without waiting: the parent goes on at once",
            state("0", root.clone()),
            started("run_c", false),
            (
                strings(&["st_child completed", "st_log completed"]),
                RunStatus::Completed,
                "done".into(),
            ),
        ),
        (
            "the child completed: its output is the step's and the parent goes on",
            state("0", root.clone()),
            Input::RunsEnded {
                ended: vec![ended(
                    "run_c",
                    RunStatus::Completed,
                    json!({ "number": "F-7" }),
                    None,
                )],
                timed_out: false,
            },
            (
                strings(&["st_child completed", "st_log completed"]),
                RunStatus::Completed,
                "done".into(),
            ),
        ),
        (
            "the child failed: the step fails for good with child_failed",
            state("0", root),
            Input::RunsEnded {
                ended: vec![ended(
                    "run_c",
                    RunStatus::Failed,
                    Value::Null,
                    Some("step `st_pdf` failed: HTTP 500"),
                )],
                timed_out: false,
            },
            (
                strings(&["st_child failed"]),
                RunStatus::Failed,
                "done".into(),
            ),
        ),
        (
            "a child at depth 3 may not start a fourth level",
            state(
                "0",
                json!({ "type": "parent", "depth": 3, "parentRunId": "run_p" }),
            ),
            Input::Start,
            (
                strings(&["st_child failed"]),
                RunStatus::Failed,
                "done".into(),
            ),
        ),
    ];
    for (what, state, input, expected) in table {
        assert_eq!(seen(&run(&parent, state, input)), expected, "{what}");
    }
}

#[test]
fn the_childs_output_reaches_the_next_step_and_its_failure_names_it() {
    let parent = parent_tree();
    let root = json!({ "type": "manual", "depth": 0 });
    let t = run(
        &parent,
        state("0", root.clone()),
        Input::RunsEnded {
            ended: vec![ended(
                "run_c",
                RunStatus::Completed,
                json!({ "number": "F-7" }),
                None,
            )],
            timed_out: false,
        },
    );
    assert_eq!(
        t.records[0].output,
        Some(json!({ "runId": "run_c", "status": "completed", "output": { "number": "F-7" } }))
    );
    assert_eq!(t.records[1].log, ["info: child run_c"]);
    assert_eq!(
        t.state.context.lookup("st_child.output.number").value(),
        Some(&json!("F-7")),
        "the next steps read the child's output"
    );

    let t = run(
        &parent,
        state("0", root),
        Input::RunsEnded {
            ended: vec![ended(
                "run_c",
                RunStatus::Cancelled,
                Value::Null,
                Some("the run was cancelled"),
            )],
            timed_out: false,
        },
    );
    assert_eq!(
        t.error.as_deref(),
        Some("step `st_child` failed: child_failed: run `run_c` cancelled: the run was cancelled")
    );
    assert!(
        t.records[0].log[0].contains("not retryable"),
        "{:?}",
        t.records[0].log
    );
    let t = run(&parent, state("0", json!({ "depth": 3 })), Input::Start);
    assert!(
        t.error
            .as_deref()
            .is_some_and(|e| e.contains("nesting_depth_exceeded")),
        "{:?}",
        t.error
    );
}

#[test]
fn a_waiting_step_records_the_child_it_waits_for() {
    let t = run(
        &parent_tree(),
        state("0", json!({ "depth": 0 })),
        started("run_c", true),
    );
    let record = &t.records[0];
    assert_eq!(record.output, Some(json!({ "runId": "run_c" })));
    assert_eq!(record.log, ["waiting for run run_c to end"]);
    let Then::Record(NextJob::WaitForRuns { wait, .. }) = &t.then else {
        panic!("parks: {:?}", t.then);
    };
    assert_eq!(
        wait,
        &RunsWait {
            runs: vec!["run_c".into()],
            mode: RunsMode::All,
            due_at: None
        }
    );
}

/// Two children started without waiting, then a wait for both (or either).
fn fan_out(mode: &str) -> Automation {
    tree(json!([
        { "id": "st_a", "type": "run_workflow", "config": { "automation": "A", "wait": false } },
        { "id": "st_b", "type": "run_workflow", "config": { "automation": "B", "wait": false } },
        { "id": "st_both", "type": "wait_for_runs",
          "config": { "runs": ["{{st_a.runId}}", "{{st_b.runId}}"], "mode": mode, "timeout": "1h" } }
    ]))
}

fn after_both_started() -> RunState {
    let mut s = state("1", json!({ "depth": 0 }));
    s.context.publish(
        "st_a",
        &Map::from_iter([("runId".to_owned(), json!("run_a"))]),
    );
    s
}

#[test]
fn wait_for_runs_parks_on_the_runs_and_publishes_how_they_ended() {
    let all = fan_out("all");
    let t = run(&all, after_both_started(), started("run_b", false));
    assert_eq!(
        seen(&t),
        (
            strings(&["st_b completed", "st_both waiting"]),
            RunStatus::Waiting,
            "wait at 2 for All of run_a, run_b".into()
        )
    );
    let Then::Record(NextJob::WaitForRuns { wait, .. }) = &t.then else {
        unreachable!()
    };
    assert_eq!(
        wait.due_at,
        Some(NOW_MS + 3_600_000),
        "the timeout is a due time"
    );
    assert_eq!(
        run(
            &fan_out("any"),
            after_both_started(),
            started("run_b", false)
        )
        .then,
        Then::Record(NextJob::WaitForRuns {
            path: "2".into(),
            wait: RunsWait {
                runs: vec!["run_a".into(), "run_b".into()],
                mode: RunsMode::Any,
                due_at: Some(NOW_MS + 3_600_000),
            }
        })
    );

    let both = vec![
        ended("run_b", RunStatus::Completed, json!(2), None),
        ended("run_a", RunStatus::Completed, json!(1), None),
    ];
    let t = run(
        &all,
        state("2", json!({})),
        Input::RunsEnded {
            ended: both,
            timed_out: false,
        },
    );
    assert_eq!(t.status, RunStatus::Completed);
    assert_eq!(
        t.records[0].output,
        Some(json!({ "timedOut": false, "runs": [
            { "runId": "run_b", "status": "completed", "output": 2 },
            { "runId": "run_a", "status": "completed", "output": 1 }
        ] }))
    );

    let t = run(
        &all,
        state("2", json!({})),
        Input::RunsEnded {
            ended: vec![ended("run_a", RunStatus::Completed, json!(1), None)],
            timed_out: true,
        },
    );
    assert_eq!(
        t.status,
        RunStatus::Completed,
        "a timeout is an outcome, not a failure"
    );
    assert_eq!(
        t.records[0].output.as_ref().unwrap()["timedOut"],
        json!(true)
    );

    let t = run(
        &all,
        state("2", json!({})),
        Input::RunsEnded {
            ended: vec![ended("run_b", RunStatus::Failed, Value::Null, Some("boom"))],
            timed_out: false,
        },
    );
    assert_eq!(t.status, RunStatus::Failed);
    assert!(
        t.error
            .unwrap()
            .contains("child_failed: run `run_b` failed: boom")
    );
}

#[test]
fn wait_for_runs_without_runs_fails_and_says_what_is_missing() {
    let automation = tree(json!([
        { "id": "st_w", "type": "wait_for_runs", "config": { "runs": "{{nothing}}" } }
    ]));
    let t = run(&automation, state("0", json!({})), Input::Start);
    assert_eq!(t.status, RunStatus::Failed);
    assert!(
        t.error.as_deref().is_some_and(|e| e.contains("st_w")),
        "{:?}",
        t.error
    );
}

#[test]
fn a_child_that_ends_leaves_a_notice_for_its_parent_and_a_root_run_none() {
    let child = tree(json!([
        { "id": "st_make", "type": "set", "config": { "values": { "number": "F-{{orderId}}" } } },
        { "id": "st_end", "type": "end", "config": { "output": { "number": "{{st_make.number}}" } } }
    ]));
    let as_child = json!({ "type": "parent", "depth": 1, "parentRunId": "run_p" });
    let t = run(&child, state("0", as_child.clone()), Input::Start);
    assert_eq!(t.status, RunStatus::Completed);
    assert_eq!(
        t.effects,
        vec![Effect::NotifyParent(ParentNotice {
            parent_run_id: RunId::from("run_p"),
            status: RunStatus::Completed,
            output: json!({ "number": "F-5001" }),
            error: None,
        })]
    );
    assert_eq!(t.state.context.output(), json!({ "number": "F-5001" }));

    let failing = tree(json!([{ "id": "st_pdf", "type": "http", "config": {} }]));
    let t = run(
        &failing,
        state("0", as_child),
        Input::StepFailed {
            error: tok_core::error::StepError::terminal("HTTP 400"),
            input: None,
            started_at: NOW_MS,
        },
    );
    assert_eq!(t.status, RunStatus::Failed);
    let notices: Vec<&ParentNotice> = t
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::NotifyParent(n) => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(notices.len(), 1, "{:?}", t.effects);
    assert_eq!(notices[0].status, RunStatus::Failed);
    assert_eq!(
        notices[0].error.as_deref(),
        Some("step `st_pdf` failed: HTTP 400")
    );

    let t = run(
        &child,
        state("0", json!({ "type": "manual" })),
        Input::Start,
    );
    assert_eq!(t.status, RunStatus::Completed);
    assert!(t.effects.is_empty(), "a run nobody started notifies nobody");
}

#[test]
fn a_resume_with_runs_at_a_step_that_does_not_wait_on_runs_changes_nothing() {
    let automation = tree(json!([
        { "id": "st_call", "type": "http", "config": {} }
    ]));
    let t = run(
        &automation,
        state("0", json!({})),
        Input::RunsEnded {
            ended: vec![],
            timed_out: true,
        },
    );
    assert_eq!(seen(&t).2, "execute st_call at 0");
}
