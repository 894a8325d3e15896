//! The decider's tables for compensation: a cancel, or a failure with
//! `settings.compensateOnFailure`, undoes the run's completed steps, the
//! most recently completed first, each `compensate` step an ordinary step
//! (executed, retried, recorded) at `<step>.compensate.<i>`, the run
//! `compensating` meanwhile and then `cancelled` or `failed`. No database.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tok_core::advance::{Effect, Env, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::compensation::{self, COMPENSABLE_KEY};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, RunStatus};

const NOW_MS: i64 = 1_780_000_000_000;

fn kinds(_: &str) -> StepClass {
    StepClass::External
}

fn tree(steps: Value, settings: Value) -> Automation {
    let json = json!({
        "name": "Booking",
        "trigger": { "kind": "manual" },
        "steps": steps,
        "settings": settings
    });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

fn http(id: &str, url: &str) -> Value {
    json!({ "id": id, "type": "http", "config": { "method": "POST", "url": url } })
}

/// An `http` step undone by another `http` step (`undo_<id>`).
fn undoable(id: &str) -> Value {
    let mut step = http(id, &format!("https://shop/{id}"));
    step["compensate"] = json!([http(
        &format!("undo_{id}"),
        &format!("https://shop/{id}/undo")
    )]);
    step
}

/// Books a flight, a hotel and a car, then waits for the customer.
fn booking(settings: Value) -> Automation {
    tree(
        json!([
            undoable("flight"),
            undoable("hotel"),
            http("mail", "https://mail"),
            undoable("car"),
            { "id": "confirm", "type": "wait_for_event", "config": { "key": "confirm" } }
        ]),
        settings,
    )
}

/// A context in which the steps at `completed` completed, in that order.
fn context(completed: &[&str]) -> Context {
    let mut context = Context::new(Map::new(), json!({}), json!({ "type": "manual" }));
    let paths: Vec<Value> = completed.iter().map(|p| json!(p)).collect();
    if !paths.is_empty() {
        context.set_reserved(COMPENSABLE_KEY, Some(Value::Array(paths)));
    }
    context
}

fn state(path: &str, context: Context) -> RunState {
    RunState::at(path.parse::<FlowPath>().expect("a path"), 1, context, 5)
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

/// What a person would read of a transition: the recorded steps (path, id,
/// status), the run's status and error, and the job's next move.
fn seen(t: &Transition) -> (Vec<String>, RunStatus, Option<String>, String) {
    let records = t
        .records
        .iter()
        .map(|r| format!("{} {} {}", r.path, r.step_id, r.status))
        .collect();
    let then = match &t.then {
        Then::Execute(step) => format!("execute {} at {}", step.step_id, step.path),
        Then::Record(NextJob::Step { path, delay_ms }) => format!("step {path} in {delay_ms} ms"),
        Then::Record(NextJob::Retry { path, attempts, .. }) => {
            format!("retry {path} after {attempts} attempts")
        }
        Then::Record(NextJob::Wait { path, wait }) => format!("wait at {path} for {}", wait.key),
        Then::Record(NextJob::Done) => "done".into(),
        Then::Record(other) => format!("{other:?}"),
    };
    (records, t.status, t.error.clone(), then)
}

fn done() -> Input {
    Input::StepDone {
        outputs: Map::from_iter([("status".to_owned(), json!(200))]),
        log: Vec::new(),
        input: None,
        started_at: NOW_MS - 5,
    }
}

fn failed(error: StepError) -> Input {
    Input::StepFailed {
        error,
        input: None,
        started_at: NOW_MS - 5,
    }
}

/// The claim after `t`: its job's path, attempt one, nothing recorded yet.
fn next_claim(t: &Transition) -> RunState {
    let Then::Record(NextJob::Step { path, .. } | NextJob::Retry { path, .. }) = &t.then else {
        panic!("no next claim after {:?}", t.then);
    };
    let mut state = t.state.clone();
    state.path = path.parse().expect("a path");
    state.recorded = 0;
    if let Then::Record(NextJob::Retry { attempts, .. }) = &t.then {
        state.attempt = *attempts as u32 + 1;
    }
    state
}

/// The same state after its executor ran the step it was handed.
fn executing(t: &Transition) -> RunState {
    assert!(matches!(t.then, Then::Execute(_)), "{:?}", t.then);
    t.state.clone()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn a_cancel_with_nothing_to_undo_ends_the_run_cancelled() {
    let automation = booking(json!({}));
    let t = run(
        &automation,
        state("4", context(&[])),
        Input::Cancel { error: None },
    );
    assert_eq!(
        seen(&t),
        (vec![], RunStatus::Cancelled, None, "done".into())
    );
    assert!(t.effects.is_empty());

    // Taken along by its parent's cancel: it says so, and tells the parent.
    let mut child = context(&[]);
    child.set_reserved(
        "_event",
        Some(json!({ "type": "parent", "parentRunId": "run_parent" })),
    );
    let why = "cancelled with the run run_parent that waited for it";
    let t = run(
        &automation,
        state("4", child),
        Input::Cancel {
            error: Some(why.into()),
        },
    );
    assert_eq!(
        seen(&t),
        (
            vec![],
            RunStatus::Cancelled,
            Some(why.into()),
            "done".into()
        )
    );
    let [Effect::NotifyParent(notice)] = &t.effects[..] else {
        panic!("the parent learns how its child ended: {:?}", t.effects);
    };
    assert_eq!(notice.status, RunStatus::Cancelled);
    assert_eq!(notice.error.as_deref(), Some(why));
}

#[test]
fn a_cancel_with_one_completed_step_undoes_it_and_ends_cancelled() {
    let automation = booking(json!({}));
    let table = [
        (
            "the cancel moves the job to the compensation of the one completed step",
            state("2", context(&["0"])),
            Input::Cancel { error: None },
            (
                vec![],
                RunStatus::Compensating,
                None,
                "step 0.compensate.0 in 0 ms",
            ),
        ),
        (
            "the compensation is an ordinary step for an executor",
            state("0.compensate.0", {
                let mut c = context(&[]);
                compensation::begin(&mut c, RunStatus::Cancelled, None);
                c
            }),
            Input::Start,
            (
                vec![],
                RunStatus::Compensating,
                None,
                "execute undo_flight at 0.compensate.0",
            ),
        ),
    ];
    for (what, state, input, (records, status, error, then)) in table {
        let t = run(&automation, state, input);
        assert_eq!(
            seen(&t),
            (strings(&records), status, error, then.to_owned()),
            "{what}"
        );
    }
    // Driven on: the undo done, the run is cancelled, nothing left.
    let t = run(
        &automation,
        state("2", context(&["0"])),
        Input::Cancel { error: None },
    );
    let t = run(&automation, next_claim(&t), Input::Start);
    let t = run(&automation, executing(&t), done());
    assert_eq!(
        seen(&t),
        (
            strings(&["0.compensate.0 undo_flight completed"]),
            RunStatus::Cancelled,
            None,
            "done".into()
        )
    );
    assert_eq!(t.state.context.reserved(COMPENSABLE_KEY), None);
    assert_eq!(t.state.context.reserved("_compensating"), None);
}

#[test]
fn a_cancel_undoes_three_completed_steps_most_recent_first() {
    let automation = booking(json!({}));
    // The run got as far as its wait: flight, hotel, mail and car done.
    let mut t = run(&automation, state("0", context(&[])), Input::Start);
    for _ in 0..4 {
        t = run(&automation, executing(&t), done());
        if matches!(t.then, Then::Record(NextJob::Step { .. })) {
            t = run(&automation, next_claim(&t), Input::Start);
        }
    }
    assert_eq!(seen(&t).3, "wait at 4 for confirm");
    assert_eq!(
        compensation::pending(&t.state.context),
        ["3", "1", "0"],
        "the completed steps that have compensations, the last first"
    );
    let waiting = t.state;

    let mut seen_all = Vec::new();
    let mut t = run(&automation, waiting, Input::Cancel { error: None });
    seen_all.push(seen(&t));
    while t.status == RunStatus::Compensating {
        t = match &t.then {
            Then::Execute(_) => run(&automation, executing(&t), done()),
            Then::Record(_) => run(&automation, next_claim(&t), Input::Start),
        };
        seen_all.push(seen(&t));
    }
    let c = RunStatus::Compensating;
    assert_eq!(
        seen_all,
        vec![
            (vec![], c, None, "step 3.compensate.0 in 0 ms".into()),
            (vec![], c, None, "execute undo_car at 3.compensate.0".into()),
            (
                strings(&["3.compensate.0 undo_car completed"]),
                c,
                None,
                "step 1.compensate.0 in 0 ms".into()
            ),
            (
                vec![],
                c,
                None,
                "execute undo_hotel at 1.compensate.0".into()
            ),
            (
                strings(&["1.compensate.0 undo_hotel completed"]),
                c,
                None,
                "step 0.compensate.0 in 0 ms".into()
            ),
            (
                vec![],
                c,
                None,
                "execute undo_flight at 0.compensate.0".into()
            ),
            (
                strings(&["0.compensate.0 undo_flight completed"]),
                RunStatus::Cancelled,
                None,
                "done".into()
            ),
        ]
    );
}

#[test]
fn a_failure_compensates_only_with_compensate_on_failure_and_keeps_its_error() {
    let terminal = || failed(StepError::terminal("HTTP 400: no rooms"));
    let error = "step `hotel` failed: HTTP 400: no rooms";

    let plain = booking(json!({}));
    let t = run(&plain, state("1", context(&["0"])), terminal());
    assert_eq!(
        seen(&t),
        (
            strings(&["1 hotel failed"]),
            RunStatus::Failed,
            Some(error.into()),
            "done".into()
        ),
        "without compensateOnFailure a failed run ends at once"
    );

    let undoing = booking(json!({ "compensateOnFailure": true }));
    let t = run(&undoing, state("1", context(&["0"])), terminal());
    assert_eq!(
        seen(&t),
        (
            strings(&["1 hotel failed"]),
            RunStatus::Compensating,
            Some(error.into()),
            "step 0.compensate.0 in 0 ms".into()
        ),
        "with it the completed flight is undone; the failed hotel is not"
    );
    assert!(
        matches!(&t.effects[..], [Effect::RunFailed(f)] if f.step_id == "hotel"),
        "the incident of the failure opens at once: {:?}",
        t.effects
    );
    let t = run(&undoing, next_claim(&t), Input::Start);
    assert_eq!(
        seen(&t).2.as_deref(),
        Some(error),
        "the error stays meanwhile"
    );
    let t = run(&undoing, executing(&t), done());
    assert_eq!(
        seen(&t),
        (
            strings(&["0.compensate.0 undo_flight completed"]),
            RunStatus::Failed,
            Some(error.into()),
            "done".into()
        ),
        "the run ends failed with the error it failed with"
    );

    let t = run(&undoing, state("0", context(&[])), terminal());
    assert_eq!(
        (t.status, seen(&t).3),
        (RunStatus::Failed, "done".into()),
        "nothing completed, nothing to undo"
    );
}

#[test]
fn a_compensation_that_fails_is_retried_then_reported_and_the_others_still_run() {
    let automation = tree(
        json!([
            undoable("flight"),
            {
                "id": "hotel", "type": "http", "config": { "url": "https://hotel" },
                "compensate": [
                    { "id": "undo_hotel", "type": "http", "config": { "url": "https://hotel/undo" } },
                    { "id": "note_hotel", "type": "flow/log", "config": { "message": "hotel undone" } }
                ]
            },
            { "id": "confirm", "type": "wait_for_event", "config": { "key": "confirm" } }
        ]),
        json!({ "retry": { "max_attempts": 2, "backoff": ["30s"] } }),
    );
    let t = run(
        &automation,
        state("2", context(&["0", "1"])),
        Input::Cancel { error: None },
    );
    let t = run(&automation, next_claim(&t), Input::Start);
    let t = run(
        &automation,
        executing(&t),
        failed(StepError::retryable("HTTP 503")),
    );
    assert_eq!(
        seen(&t),
        (
            strings(&["1.compensate.0 undo_hotel retrying"]),
            RunStatus::Compensating,
            None,
            "retry 1.compensate.0 after 1 attempts".into()
        ),
        "a compensation step is retried like any step"
    );
    let t = run(&automation, next_claim(&t), Input::Start);
    let t = run(
        &automation,
        executing(&t),
        failed(StepError::retryable("HTTP 503")),
    );
    assert_eq!(
        seen(&t),
        (
            strings(&["1.compensate.0 undo_hotel failed"]),
            RunStatus::Compensating,
            None,
            "step 0.compensate.0 in 0 ms".into()
        ),
        "after its retries the rest of the hotel's compensation is skipped, the flight's runs"
    );
    let [Effect::CompensationFailed(failure)] = &t.effects[..] else {
        panic!(
            "an incident says which compensation failed: {:?}",
            t.effects
        );
    };
    assert_eq!(failure.step_id, "undo_hotel");
    assert_eq!(failure.path, "1.compensate.0");
    assert_eq!(
        failure.message,
        "compensation `undo_hotel` of step `hotel` failed: HTTP 503"
    );
    let t = run(&automation, next_claim(&t), Input::Start);
    let t = run(&automation, executing(&t), done());
    assert_eq!(
        seen(&t),
        (
            strings(&["0.compensate.0 undo_flight completed"]),
            RunStatus::Cancelled,
            Some(
                "the run was cancelled, but not all of it was undone: \
                 compensation `undo_hotel` of step `hotel` failed: HTTP 503"
                    .into()
            ),
            "done".into()
        ),
        "the run still ends cancelled, and says what was not undone"
    );
}

#[test]
fn control_compensations_chain_and_a_cancel_clears_the_waits_escalations() {
    let automation = tree(
        json!([
            {
                "id": "tag", "type": "set", "config": { "values": { "tagged": true } },
                "compensate": [
                    { "id": "untag", "type": "set", "config": { "values": { "tagged": false } } },
                    { "id": "note", "type": "flow/log", "config": { "message": "untagged" } }
                ]
            },
            { "id": "confirm", "type": "wait_for_event", "config": { "key": "confirm" },
              "escalations": [{ "after": "1h", "steps": [
                  { "id": "remind", "type": "flow/log", "config": { "message": "still waiting" } }
              ] }] }
        ]),
        json!({}),
    );
    let t = run(&automation, state("0", context(&[])), Input::Start);
    assert_eq!(seen(&t).3, "wait at 1 for confirm");
    assert!(t.state.context.reserved("_escalations").is_some());
    let t = run(&automation, t.state, Input::Cancel { error: None });
    assert!(t.state.context.reserved("_escalations").is_none());
    let t = run(&automation, next_claim(&t), Input::Start);
    assert_eq!(
        seen(&t),
        (
            strings(&[
                "0.compensate.0 untag completed",
                "0.compensate.1 note completed"
            ]),
            RunStatus::Cancelled,
            None,
            "done".into()
        ),
        "steps the decider runs itself undo in the same claim"
    );
    assert_eq!(t.state.context.as_value()["untag"]["tagged"], json!(false));
}

#[test]
fn each_completed_iteration_of_a_loop_or_repeat_is_undone_with_its_own_item() {
    let automation = tree(
        json!([
            { "id": "each", "type": "loop", "config": { "items": ["a", "b", "c"] }, "do": [
                { "id": "reserve", "type": "http", "config": { "url": "https://stock/{{item}}" },
                  "compensate": [
                      { "id": "release", "type": "http", "config": { "url": "https://stock/{{item}}/release" } }
                  ] }
            ] },
            { "id": "again", "type": "repeat", "config": { "maxIterations": 3,
                "until": { "rules": [{ "field": "ping.status", "operator": "eq", "value": 200 }] } },
              "do": [
                { "id": "ping", "type": "http", "config": { "url": "https://ping/{{index}}" },
                  "compensate": [
                      { "id": "unping", "type": "http", "config": { "url": "https://ping/{{index}}/undo" } }
                  ] }
            ] },
            { "id": "confirm", "type": "wait_for_event", "config": { "key": "confirm" } }
        ]),
        json!({}),
    );
    let mut t = run(&automation, state("0", context(&[])), Input::Start);
    while !matches!(t.then, Then::Record(NextJob::Wait { .. })) {
        t = match &t.then {
            // The first ping is not answered yet: the repeat goes round again.
            Then::Execute(step) if step.path.to_string() == "1.do.0.0" => {
                let outputs = Map::from_iter([("status".to_owned(), json!(202))]);
                let input = Input::StepDone {
                    outputs,
                    log: Vec::new(),
                    input: None,
                    started_at: NOW_MS,
                };
                run(&automation, executing(&t), input)
            }
            Then::Execute(_) => run(&automation, executing(&t), done()),
            _ => run(&automation, next_claim(&t), Input::Start),
        };
    }
    assert_eq!(
        compensation::pending(&t.state.context),
        ["1.do.1.0", "1.do.0.0", "0.do.2.0", "0.do.1.0", "0.do.0.0"],
        "every iteration's step, the last first"
    );
    let mut t = run(&automation, t.state, Input::Cancel { error: None });
    let mut calls = Vec::new();
    while t.status == RunStatus::Compensating {
        t = match &t.then {
            Then::Execute(step) => {
                calls.push(format!(
                    "{} {}",
                    step.path,
                    step.config["url"].as_str().unwrap()
                ));
                run(&automation, executing(&t), done())
            }
            _ => run(&automation, next_claim(&t), Input::Start),
        };
    }
    assert_eq!(t.status, RunStatus::Cancelled);
    assert_eq!(
        calls,
        [
            "1.do.1.0.compensate.0 https://ping/1/undo",
            "1.do.0.0.compensate.0 https://ping/0/undo",
            "0.do.2.0.compensate.0 https://stock/c/release",
            "0.do.1.0.compensate.0 https://stock/b/release",
            "0.do.0.0.compensate.0 https://stock/a/release",
        ]
    );
}

#[test]
fn steps_in_branches_are_undone_in_the_order_their_records_reached_the_run() {
    let automation = tree(
        json!([
            { "id": "both", "type": "parallel", "branches": [
                [ undoable("flight") ],
                [ undoable("hotel") ]
            ] },
            { "id": "confirm", "type": "wait_for_event", "config": { "key": "confirm" } }
        ]),
        json!({}),
    );
    let forked = run(&automation, state("0", context(&[])), Input::Start);
    let run_context = forked.state.context;
    let branch = |path: &str| {
        let t = run(&automation, state(path, run_context.clone()), Input::Start);
        let t = run(&automation, executing(&t), done());
        assert!(
            matches!(
                t.then,
                Then::Record(NextJob::BranchDone { failed: None, .. })
            ),
            "{:?}",
            t.then
        );
        t.state.context
    };
    // The hotel's branch records first, then the flight's: the store merges
    // each branch's record into the run's context as it comes.
    let mut merged = run_context.clone();
    compensation::merge(&mut merged, branch("0.branches.1.0").as_value());
    compensation::merge(&mut merged, branch("0.branches.0.0").as_value());
    let joined = run(
        &automation,
        state("0", merged),
        Input::BranchesJoined {
            total: 2,
            failed: None,
            done: vec![],
            cancelled: vec![],
        },
    );
    assert_eq!(seen(&joined).3, "wait at 1 for confirm");
    assert_eq!(
        compensation::pending(&joined.state.context),
        ["0.branches.0.0", "0.branches.1.0"]
    );
    let t = run(&automation, joined.state, Input::Cancel { error: None });
    assert_eq!(seen(&t).3, "step 0.branches.0.0.compensate.0 in 0 ms");
    let t = run(&automation, next_claim(&t), Input::Start);
    assert_eq!(
        seen(&t).3,
        "execute undo_flight at 0.branches.0.0.compensate.0",
        "a branch step's compensation runs on the run's one job"
    );
    let t = run(&automation, executing(&t), done());
    assert_eq!(seen(&t).3, "step 0.branches.1.0.compensate.0 in 0 ms");
}
