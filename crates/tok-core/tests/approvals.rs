//! The decider's table for `approval` steps: the executor's opening of the
//! approval asks to wait, as any step that waits does, and parks the run
//! on the decision's key (with the step's timeout,
//! never taking a buffered signal); the decision resumes it with `{decision,
//! by, comment}`; a timeout completes it with `{timedOut: true}`; a failed
//! opening (`no_approvers`) and a denied one (`authorization_denied`) fail
//! the run at once. No database.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, json};
use tok_core::advance::{
    CustomWait, Effect, Env, Input, RunState, StepClass, Then, Transition, advance,
};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, RunStatus, SignalWait, StepStatus};

const NOW_MS: i64 = 1_780_000_000_000;

fn kinds(kind: &str) -> StepClass {
    match kind {
        "approval" => StepClass::InTransaction,
        _ => StepClass::External,
    }
}

fn tree() -> Automation {
    let json = json!({ "name": "Refund", "trigger": { "kind": "manual" }, "steps": [
        { "id": "st_ok", "type": "approval",
          "config": { "approvers": { "group": "Finance" }, "prompt": "Refund?", "timeout": "1h" } },
        { "id": "st_after", "type": "flow/log", "config": { "message": "timed out: {{st_ok.timedOut}}" } }
    ] });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

fn at_approval() -> RunState {
    let context = Context::new(Map::new(), json!({}), json!({ "type": "manual" }));
    RunState::at("0".parse::<FlowPath>().unwrap(), 1, context, 0)
}

fn run(state: RunState, input: Input) -> Transition {
    let mut rng = StdRng::seed_from_u64(7);
    let mut env = Env {
        now: Timestamp::from_millisecond(NOW_MS).unwrap(),
        kinds: &kinds,
        rng: &mut rng,
        retries: &|_| None,
    };
    advance(&tree(), state, input, &mut env)
}

/// The executor opened the approval and asks to wait for its decision,
/// as the engine's `approval` step does.
fn opened() -> Input {
    Input::StepWaits {
        wait: CustomWait {
            keys: vec!["approval:apr_1".into()],
            timeout_ms: Some(3_600_000),
            only_new: true,
            outputs: Map::from_iter([
                ("approvalId".to_owned(), json!("apr_1")),
                (
                    "approvers".to_owned(),
                    json!([{ "id": "mem_b", "name": "Bob" }]),
                ),
            ]),
            what: Some("a decision".into()),
            ..CustomWait::default()
        },
        input: Some(json!({ "approvers": { "group": "Finance" }, "timeout": "1h" })),
        started_at: NOW_MS - 5,
    }
}

/// The run parked at the approval, as its job is claimed again.
fn parked() -> RunState {
    run(at_approval(), opened()).state
}

fn records(t: &Transition) -> Vec<(String, StepStatus)> {
    t.records
        .iter()
        .map(|r| (r.step_id.clone(), r.status))
        .collect()
}

#[test]
fn a_start_hands_the_approval_to_the_executor_in_the_record_transaction() {
    let t = run(at_approval(), Input::Start);
    let Then::Execute(step) = &t.then else {
        panic!("{t:?}")
    };
    assert_eq!(
        (step.kind.as_str(), step.class),
        ("approval", StepClass::InTransaction)
    );
    assert!(t.records.is_empty());
}

#[test]
fn an_opened_approval_parks_the_run_on_its_decision_key_until_the_timeout() {
    let t = run(at_approval(), opened());
    assert_eq!(t.status, RunStatus::Waiting);
    assert_eq!(records(&t), [("st_ok".to_owned(), StepStatus::Waiting)]);
    assert_eq!(
        t.then,
        Then::Record(NextJob::Wait {
            path: "0".into(),
            wait: SignalWait {
                key: "approval:apr_1".into(),
                subject: None,
                filter: None,
                lookback: false,
                due_at: Some(NOW_MS + 3_600_000),
                ..Default::default()
            },
        })
    );
    assert_eq!(t.records[0].output.as_ref().unwrap()["approvalId"], "apr_1");
    assert_eq!(t.state.context.as_value()["st_ok"]["approvalId"], "apr_1");
    assert_eq!(
        t.records[0].log,
        ["waiting for a decision until 2026-05-28T21:26:40Z"]
    );
}

#[test]
fn a_decision_completes_the_step_with_the_decision_and_who_made_it() {
    let payload = json!({ "decision": "approve", "by": { "id": "mem_b", "name": "Bob" },
                          "comment": "fine", "approvalId": "apr_1" });
    let t = run(
        parked(),
        Input::Signal {
            signal_id: "sig_1".into(),
            payload,
            actor: None,
            subject: None,
            key: None,
        },
    );
    assert_eq!(t.status, RunStatus::Completed, "{t:?}");
    assert_eq!(
        records(&t),
        [
            ("st_ok".to_owned(), StepStatus::Completed),
            ("st_after".to_owned(), StepStatus::Completed)
        ]
    );
    let output = t.records[0].output.clone().unwrap();
    assert_eq!(
        output,
        json!({ "decision": "approve", "by": { "id": "mem_b", "name": "Bob" },
                "comment": "fine", "approvalId": "apr_1", "timedOut": false })
    );
    assert_eq!(t.records[0].log, ["approved by Bob"]);
    assert_eq!(t.records[1].log, ["info: timed out: false"]);
}

#[test]
fn nobody_deciding_before_the_timeout_completes_the_step_timed_out() {
    let t = run(parked(), Input::TimedOut);
    assert_eq!(t.status, RunStatus::Completed, "{t:?}");
    let output = t.records[0].output.clone().unwrap();
    assert_eq!(output, json!({ "approvalId": "apr_1", "timedOut": true }));
    assert_eq!(t.records[0].log, ["timed out: nobody decided"]);
    assert_eq!(t.records[1].log, ["info: timed out: true"]);
}

#[test]
fn no_approvers_and_a_denied_step_fail_the_run_at_once_with_an_incident() {
    for message in [
        "no_approvers: step `st_ok`: group `Finance` has no members, so nobody could decide",
        "authorization_denied: step `st_ok` (approval) may not run: tenant ten_a is suspended",
    ] {
        let t = run(
            at_approval(),
            Input::StepFailed {
                error: StepError::terminal(message),
                input: None,
                started_at: NOW_MS - 5,
            },
        );
        assert_eq!(t.status, RunStatus::Failed);
        assert_eq!(records(&t), [("st_ok".to_owned(), StepStatus::Failed)]);
        assert!(matches!(&t.effects[..], [Effect::RunFailed(f)] if f.message == message));
        assert_eq!(t.then, Then::Record(NextJob::Done));
    }
}
