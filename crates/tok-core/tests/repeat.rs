//! The decider's tables for `repeat`: iterations run until `until` holds
//! (or while `while` holds), `every` apart as a durable wait, at most
//! `maxIterations` times (`repeat_limit_exceeded`), every step counting
//! toward `MAX_ACTIONS`. No database.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tok_core::advance::{Env, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::limits::MAX_ACTIONS;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, RunStatus};

const NOW_MS: i64 = 1_780_000_000_000;

fn kinds(_: &str) -> StepClass {
    StepClass::External
}

fn tree(steps: Value) -> Automation {
    let json = json!({ "name": "Poll", "trigger": { "kind": "manual" }, "steps": steps });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

fn state(path: &str, actions: i32) -> RunState {
    let context = Context::new(Map::new(), json!({}), json!({}));
    RunState::at(
        path.parse::<FlowPath>().expect("a path"),
        1,
        context,
        actions,
    )
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

fn then(t: &Transition) -> String {
    match &t.then {
        Then::Execute(step) => format!("execute {} at {}", step.step_id, step.path),
        Then::Record(NextJob::Step { path, delay_ms }) => format!("step {path} in {delay_ms} ms"),
        Then::Record(NextJob::Done) => "done".into(),
        Then::Record(other) => format!("{other:?}"),
    }
}

fn records(t: &Transition) -> Vec<String> {
    t.records
        .iter()
        .map(|r| format!("{} {} {}", r.path, r.step_id, r.status))
        .collect()
}

fn status(value: &str) -> Input {
    Input::StepDone {
        outputs: Map::from_iter([("state".to_owned(), json!(value))]),
        log: Vec::new(),
        input: None,
        started_at: NOW_MS,
    }
}

/// A case: what it shows, the state, the input, the records seen, the
/// run's status and the job's next move.
type Row = (
    &'static str,
    RunState,
    Input,
    Vec<&'static str>,
    RunStatus,
    &'static str,
);

/// Polls an export every 30 s until it is ready, at most 3 times.
fn poll() -> Automation {
    tree(json!([
        { "id": "st_poll", "type": "repeat",
          "config": { "until": { "rules": [{ "field": "st_check.state", "operator": "eq", "value": "ready" }] },
                      "maxIterations": 3, "every": "30s" },
          "do": [
            { "id": "st_note", "type": "flow/log", "config": { "message": "try {{index}}" } },
            { "id": "st_check", "type": "http", "config": { "url": "https://export" } }
          ] },
        { "id": "st_after", "type": "flow/log", "config": { "message": "took {{st_poll.iterations}}" } }
    ]))
}

#[test]
fn a_repeat_runs_its_iterations_every_so_often_until_its_condition_holds() {
    let poll = poll();
    let table: Vec<Row> = vec![
        (
            "entering runs the first iteration's steps",
            state("0", 0),
            Input::Start,
            vec!["0.do.0.0 st_note completed"],
            RunStatus::Running,
            "step 0.do.0.1 in 0 ms",
        ),
        (
            "not ready: the next iteration is a durable wait away",
            state("0.do.0.1", 2),
            status("pending"),
            vec!["0.do.0.1 st_check completed"],
            RunStatus::Waiting,
            "step 0.do.1.0 in 30000 ms",
        ),
        (
            "ready: the repeat is recorded with its iterations and the run goes on",
            state("0.do.1.1", 5),
            status("ready"),
            vec![
                "0.do.1.1 st_check completed",
                "0 st_poll completed",
                "1 st_after completed",
            ],
            RunStatus::Completed,
            "done",
        ),
        (
            "still not ready after the last allowed iteration: repeat_limit_exceeded",
            state("0.do.2.1", 8),
            status("pending"),
            vec!["0.do.2.1 st_check completed", "0 st_poll failed"],
            RunStatus::Failed,
            "done",
        ),
    ];
    for (what, state, input, expected, run_status, next) in table {
        let t = run(&poll, state, input);
        assert_eq!(
            (records(&t), t.status, then(&t)),
            (
                expected.iter().map(|s| (*s).to_owned()).collect(),
                run_status,
                next.to_owned()
            ),
            "{what}"
        );
    }
}

#[test]
fn the_repeat_publishes_its_iterations_and_the_limit_says_so() {
    let poll = poll();
    let t = run(&poll, state("0.do.1.1", 5), status("ready"));
    assert_eq!(t.records[1].output, Some(json!({ "iterations": 2 })));
    assert_eq!(t.records[2].log, ["info: took 2"]);
    assert_eq!(t.records[0].log.len(), 0);
    let t = run(&poll, state("0.do.0.0", 0), Input::Start);
    assert_eq!(
        t.records[0].log,
        ["info: try 0"],
        "`index` is the iteration"
    );

    let t = run(&poll, state("0.do.2.1", 8), status("pending"));
    let error = t.error.unwrap();
    assert!(
        error.starts_with("step `st_poll` failed: repeat_limit_exceeded")
            && error.contains("3 times"),
        "{error}"
    );
}

#[test]
fn a_while_that_does_not_hold_skips_the_repeat_and_one_that_stops_holding_ends_it() {
    let automation = tree(json!([
        { "id": "st_init", "type": "set", "config": { "values": { "more": false } } },
        { "id": "st_more", "type": "repeat",
          "config": { "while": { "rules": [{ "field": "st_init.more", "operator": "eq", "value": true }] } },
          "do": [ { "id": "st_x", "type": "flow/log", "config": { "message": "x" } } ] }
    ]));
    let t = run(&automation, state("0", 0), Input::Start);
    assert_eq!(
        records(&t),
        ["0 st_init completed", "1 st_more completed"],
        "never entered"
    );
    assert_eq!(t.records[1].output, Some(json!({ "iterations": 0 })));
    assert_eq!(t.status, RunStatus::Completed);
}

#[test]
fn iterations_count_toward_the_runs_actions() {
    let automation = tree(json!([
        { "id": "st_spin", "type": "repeat",
          "config": { "until": { "rules": [{ "field": "never", "operator": "eq", "value": true }] },
                      "maxIterations": 1000 },
          "do": [ { "id": "st_x", "type": "flow/log", "config": { "message": "x" } } ] }
    ]));
    let t = run(&automation, state("0", 0), Input::Start);
    assert_eq!(t.status, RunStatus::Failed);
    assert_eq!(t.state.actions, MAX_ACTIONS as i32);
    assert!(
        t.error
            .as_deref()
            .is_some_and(|e| e.contains(&MAX_ACTIONS.to_string())),
        "{:?}",
        t.error
    );
}
