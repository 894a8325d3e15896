//! The decider's table for escalations of a waiting step: the parked job
//! is due at the first level, not the timeout; claimed then, the level's
//! steps run as a side chain (the waiting step gets no record) and the
//! step waits again for the same key until its next level or its own
//! timeout; each level fires once, in order; a level due after the
//! timeout never fires; the signal ends the wait and its pending levels.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, json};
use tok_core::advance::{Env, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, RunStatus, StepStatus};

const NOW_MS: i64 = 1_780_000_000_000;
const MIN: i64 = 60_000;

fn kinds(_: &str) -> StepClass {
    StepClass::InTransaction
}

fn tree(timeout: &str) -> Automation {
    let json = json!({ "name": "Orders", "trigger": { "kind": "manual" }, "steps": [
        { "id": "st_paid", "type": "wait_for_event",
          "config": { "key": "order:paid", "timeout": timeout },
          "escalations": [
            { "after": "10m", "steps": [
                { "id": "st_note", "type": "flow/log", "config": { "message": "late" } },
                { "id": "st_incident", "type": "incident/create", "config": { "title": "Order not paid" } } ] },
            { "after": "30m", "steps": [
                { "id": "st_again", "type": "flow/log", "config": { "message": "later" } } ] }
          ] },
        { "id": "st_after", "type": "flow/log", "config": { "message": "paid" } }
    ] });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

fn run(automation: &Automation, state: RunState, input: Input, now: i64) -> Transition {
    let mut rng = StdRng::seed_from_u64(7);
    let mut env = Env {
        now: Timestamp::from_millisecond(now).unwrap(),
        kinds: &kinds,
        rng: &mut rng,
        retries: &|_| None,
    };
    advance(automation, state, input, &mut env)
}

fn start() -> RunState {
    let context = Context::new(Map::new(), json!({}), json!({ "type": "manual" }));
    RunState::at("0".parse::<FlowPath>().unwrap(), 1, context, 0)
}

/// The job's next move: the path it parks at and when it is due.
fn parked_until(t: &Transition) -> (String, Option<i64>) {
    match &t.then {
        Then::Record(NextJob::Wait { path, wait }) => (path.clone(), wait.due_at),
        other => panic!("not parked: {other:?}"),
    }
}

fn claimed(t: &Transition) -> RunState {
    let path = match &t.then {
        Then::Record(NextJob::Wait { path, .. }) => path.parse().unwrap(),
        other => panic!("{other:?}"),
    };
    RunState::at(path, 1, t.state.context.clone(), t.state.actions)
}

fn records(t: &Transition) -> Vec<(String, String, StepStatus)> {
    t.records
        .iter()
        .map(|r| (r.step_id.clone(), r.path.clone(), r.status))
        .collect()
}

#[test]
fn levels_fire_in_order_once_each_beside_the_wait_then_the_timeout_comes() {
    let automation = tree("1h");
    let parked = run(&automation, start(), Input::Start, NOW_MS);
    assert_eq!(parked.status, RunStatus::Waiting);
    assert_eq!(parked_until(&parked), ("0".into(), Some(NOW_MS + 10 * MIN)));

    // Level 0: its two steps run; the wait step gets no record; it waits again.
    let first = run(
        &automation,
        claimed(&parked),
        Input::TimedOut,
        NOW_MS + 10 * MIN,
    );
    let Then::Execute(step) = &first.then else {
        panic!("{first:?}")
    };
    assert_eq!(
        (step.step_id.as_str(), step.path.to_string().as_str()),
        ("st_incident", "0.escalations.0.1")
    );
    assert_eq!(
        records(&first),
        [(
            "st_note".into(),
            "0.escalations.0.0".into(),
            StepStatus::Completed
        )]
    );
    let done = Input::StepDone {
        outputs: Map::from_iter([("incidentId".to_owned(), json!("inc_1"))]),
        log: Vec::new(),
        input: None,
        started_at: NOW_MS + 10 * MIN,
    };
    let waits_again = run(&automation, first.state.clone(), done, NOW_MS + 10 * MIN);
    assert_eq!(waits_again.status, RunStatus::Waiting);
    assert_eq!(
        records(&waits_again),
        [(
            "st_incident".into(),
            "0.escalations.0.1".into(),
            StepStatus::Completed
        )]
    );
    let Then::Record(NextJob::Wait { wait, .. }) = &waits_again.then else {
        panic!("{waits_again:?}")
    };
    assert_eq!(wait.key, "order:paid", "the same wait");
    assert_eq!(
        parked_until(&waits_again),
        ("0".into(), Some(NOW_MS + 30 * MIN))
    );

    // Level 1, then the wait's own timeout (not extended by the levels).
    let second = run(
        &automation,
        claimed(&waits_again),
        Input::TimedOut,
        NOW_MS + 30 * MIN,
    );
    assert_eq!(
        records(&second),
        [(
            "st_again".into(),
            "0.escalations.1.0".into(),
            StepStatus::Completed
        )]
    );
    assert_eq!(parked_until(&second), ("0".into(), Some(NOW_MS + 60 * MIN)));
    let timed_out = run(
        &automation,
        claimed(&second),
        Input::TimedOut,
        NOW_MS + 60 * MIN,
    );
    assert_eq!(timed_out.status, RunStatus::Completed);
    assert_eq!(
        records(&timed_out),
        [
            ("st_paid".into(), "0".into(), StepStatus::Completed),
            ("st_after".into(), "1".into(), StepStatus::Completed)
        ]
    );
    assert_eq!(
        timed_out.records[0].output,
        Some(json!({ "timedOut": true }))
    );
    assert!(timed_out.state.context.reserved("_escalations").is_none());
}

#[test]
fn a_signal_ends_the_wait_and_its_pending_levels() {
    let automation = tree("1h");
    let parked = run(&automation, start(), Input::Start, NOW_MS);
    let signal = Input::Signal {
        signal_id: "sig_1".into(),
        payload: json!({ "paid": true }),
        actor: None,
        subject: None,
        key: None,
    };
    let resumed = run(&automation, claimed(&parked), signal, NOW_MS + MIN);
    assert_eq!(resumed.status, RunStatus::Completed);
    assert_eq!(resumed.records[0].step_id, "st_paid");
    assert!(
        resumed.state.context.reserved("_escalations").is_none(),
        "nothing is left to fire"
    );
}

#[test]
fn a_level_due_after_the_timeout_never_fires() {
    let automation = tree("20m");
    let parked = run(&automation, start(), Input::Start, NOW_MS);
    assert_eq!(parked_until(&parked).1, Some(NOW_MS + 10 * MIN));
    let first = run(
        &automation,
        claimed(&parked),
        Input::TimedOut,
        NOW_MS + 10 * MIN,
    );
    let done = Input::StepDone {
        outputs: Map::new(),
        log: Vec::new(),
        input: None,
        started_at: NOW_MS + 10 * MIN,
    };
    let again = run(&automation, first.state, done, NOW_MS + 10 * MIN);
    assert_eq!(
        parked_until(&again).1,
        Some(NOW_MS + 20 * MIN),
        "the timeout, not the 30 min level"
    );
    let timed_out = run(
        &automation,
        claimed(&again),
        Input::TimedOut,
        NOW_MS + 20 * MIN,
    );
    assert_eq!(
        timed_out.records[0].output,
        Some(json!({ "timedOut": true }))
    );
}

/// The state of a job claimed again at the path its record named.
fn claimed_at(t: &Transition) -> RunState {
    let path = match &t.then {
        Then::Record(NextJob::Step { path, .. } | NextJob::WaitForRuns { path, .. }) => {
            path.parse().unwrap()
        }
        other => panic!("{other:?}"),
    };
    RunState::at(path, 1, t.state.context.clone(), t.state.actions)
}

fn note(message: &str) -> serde_json::Value {
    json!({ "id": "st_note", "type": "flow/log", "config": { "message": message } })
}

#[test]
fn a_wait_for_runs_escalates_while_its_runs_go_on_and_ends_when_they_end() {
    let automation = Automation::from_json(
        &json!({ "name": "Orders", "trigger": { "kind": "manual" }, "steps": [
            { "id": "st_runs", "type": "wait_for_runs",
              "config": { "runs": ["run_child"], "timeout": "1h" },
              "escalations": [ { "after": "10m", "steps": [ note("child is slow") ] } ] },
            { "id": "st_after", "type": "flow/log", "config": { "message": "done" } }
        ] })
        .to_string(),
    )
    .unwrap();
    let parked = run(&automation, start(), Input::Start, NOW_MS);
    let Then::Record(NextJob::WaitForRuns { path, wait }) = &parked.then else {
        panic!("{parked:?}")
    };
    assert_eq!((path.as_str(), wait.due_at), ("0", Some(NOW_MS + 10 * MIN)));

    // Due at the level: its steps run, and the step waits on the same runs
    // again, until its own timeout.
    let level = Input::RunsEnded {
        ended: Vec::new(),
        timed_out: true,
    };
    let escalated = run(&automation, claimed_at(&parked), level, NOW_MS + 10 * MIN);
    assert_eq!(escalated.status, RunStatus::Waiting);
    assert_eq!(
        records(&escalated),
        [(
            "st_note".into(),
            "0.escalations.0.0".into(),
            StepStatus::Completed
        )]
    );
    let Then::Record(NextJob::WaitForRuns { path, wait }) = &escalated.then else {
        panic!("{escalated:?}")
    };
    assert_eq!(path, "0");
    assert_eq!(wait.runs, ["run_child"]);
    assert_eq!(
        wait.due_at,
        Some(NOW_MS + 60 * MIN),
        "the timeout it began with"
    );

    // The child ends: the wait resumes, its pending levels are gone.
    let ended = Input::RunsEnded {
        ended: vec![tok_core::run::RunEnded {
            run_id: "run_child".into(),
            status: RunStatus::Completed,
            output: json!({ "ok": true }),
            error: None,
        }],
        timed_out: false,
    };
    let done = run(
        &automation,
        claimed_at(&escalated),
        ended,
        NOW_MS + 20 * MIN,
    );
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(
        records(&done),
        [
            ("st_runs".into(), "0".into(), StepStatus::Completed),
            ("st_after".into(), "1".into(), StepStatus::Completed)
        ]
    );
    assert!(done.state.context.reserved("_escalations").is_none());
}

#[test]
fn a_wait_with_escalations_parks_at_itself_fires_its_level_and_ends_on_time() {
    let automation = Automation::from_json(
        &json!({ "name": "Orders", "trigger": { "kind": "manual" }, "steps": [
            { "id": "st_wait", "type": "wait", "config": { "duration": "1h" },
              "escalations": [ { "after": "10m", "steps": [ note("still waiting") ] } ] },
            { "id": "st_after", "type": "flow/log", "config": { "message": "done" } }
        ] })
        .to_string(),
    )
    .unwrap();
    let parked = run(&automation, start(), Input::Start, NOW_MS);
    assert_eq!(parked.status, RunStatus::Waiting);
    assert_eq!(
        records(&parked),
        [("st_wait".into(), "0".into(), StepStatus::Waiting)]
    );
    let Then::Record(NextJob::Step { path, delay_ms }) = &parked.then else {
        panic!("{parked:?}")
    };
    assert_eq!(
        (path.as_str(), *delay_ms),
        ("0", 10 * MIN),
        "due at its level"
    );

    // Claimed early (a paused run resumed): it only waits on.
    let early = run(&automation, claimed_at(&parked), Input::Start, NOW_MS + MIN);
    assert!(early.records.is_empty(), "{early:?}");
    let Then::Record(NextJob::Step { delay_ms, .. }) = &early.then else {
        panic!("{early:?}")
    };
    assert_eq!(*delay_ms, 9 * MIN);

    let escalated = run(
        &automation,
        claimed_at(&parked),
        Input::Start,
        NOW_MS + 10 * MIN,
    );
    assert_eq!(escalated.status, RunStatus::Waiting);
    assert_eq!(
        records(&escalated),
        [(
            "st_note".into(),
            "0.escalations.0.0".into(),
            StepStatus::Completed
        )]
    );
    let Then::Record(NextJob::Step { path, delay_ms }) = &escalated.then else {
        panic!("{escalated:?}")
    };
    assert_eq!((path.as_str(), *delay_ms), ("0", 50 * MIN), "then its end");

    let done = run(
        &automation,
        claimed_at(&escalated),
        Input::Start,
        NOW_MS + 60 * MIN,
    );
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(
        records(&done),
        [
            ("st_wait".into(), "0".into(), StepStatus::Completed),
            ("st_after".into(), "1".into(), StepStatus::Completed)
        ]
    );
    let until = Timestamp::from_millisecond(NOW_MS + 60 * MIN).unwrap();
    assert_eq!(
        done.records[0].output,
        Some(json!({ "until": until.to_string() }))
    );
    assert!(done.state.context.reserved("_escalations").is_none());
}
