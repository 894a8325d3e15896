//! The decider's state machine as tables: a tree, a state and an input, and
//! the transition a user of the run would see come of it — which steps are
//! recorded with which status, what the run's status becomes, and what
//! happens to its job. No database, no clock, no randomness but a seeded one.

use std::time::Duration;

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tok_core::advance::{Effect, Env, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::limits::MAX_ACTIONS;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, RunStatus, StepStatus};

const NOW_MS: i64 = 1_780_000_000_000;

fn now() -> Timestamp {
    Timestamp::from_millisecond(NOW_MS).expect("a valid time")
}

/// `ticket/*` steps run in the record transaction; every other registered
/// type is external (as the engine's registry says).
fn kinds(kind: &str) -> StepClass {
    match kind.starts_with("ticket/") {
        true => StepClass::InTransaction,
        false => StepClass::External,
    }
}

fn tree(steps: Value) -> Automation {
    let json = json!({
        "name": "Orders",
        "trigger": { "kind": "manual" },
        "steps": steps,
        "settings": { "retry": { "max_attempts": 3, "backoff": ["30s", "2m"] } }
    });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

fn state(path: &str) -> RunState {
    let context = Context::new(
        Map::from_iter([("orderId".to_owned(), json!("5001"))]),
        json!({ "orderId": "5001", "total": 1200 }),
        json!({ "type": "webhook" }),
    );
    RunState::at(path.parse::<FlowPath>().expect("a path"), 1, context, 0)
}

fn run(automation: &Automation, state: RunState, input: Input) -> Transition {
    let mut rng = StdRng::seed_from_u64(7);
    let mut env = Env {
        now: now(),
        kinds: &kinds,
        rng: &mut rng,
        retries: &|_| None,
    };
    advance(automation, state, input, &mut env)
}

/// The recorded steps (`id status`), the run's status, the job's next move.
type Seen = (Vec<String>, RunStatus, String);

/// What a person would read of a transition: the recorded steps with their
/// status, the run's status, and the job's next move in words.
fn seen(t: &Transition) -> Seen {
    let records = t
        .records
        .iter()
        .map(|r| format!("{} {}", r.step_id, r.status))
        .collect();
    let then = match &t.then {
        Then::Execute(step) => format!("execute {} at {}", step.step_id, step.path),
        Then::Record(NextJob::Step { path, delay_ms }) => format!("step {path} in {delay_ms} ms"),
        Then::Record(NextJob::Retry { path, attempts, .. }) => {
            format!("retry {path} after {attempts} attempts")
        }
        Then::Record(NextJob::Wait { path, wait }) => format!("wait at {path} for {}", wait.key),
        Then::Record(NextJob::WaitForRuns { path, wait }) => {
            format!("wait at {path} for runs {}", wait.runs.join(", "))
        }
        Then::Record(NextJob::Continue { path, .. }) => format!("continue at {path}"),
        Then::Record(NextJob::Done) => "done".to_owned(),
        Then::Record(other) => format!("{other:?}"),
    };
    (records, t.status, then)
}

fn done(outputs: Value) -> Input {
    let Value::Object(outputs) = outputs else {
        panic!("outputs are an object");
    };
    Input::StepDone {
        outputs,
        log: Vec::new(),
        input: Some(json!({})),
        started_at: NOW_MS - 5,
    }
}

fn failed(error: StepError) -> Input {
    Input::StepFailed {
        error,
        input: Some(json!({})),
        started_at: NOW_MS - 5,
    }
}

fn signal(payload: Value) -> Input {
    Input::Signal {
        signal_id: "sig_1".into(),
        payload,
        actor: None,
        subject: None,
        key: None,
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// An order: a ticket, a call to the shop, a wait for the payment signal,
/// a branch on it, and a log line.
fn order_tree() -> Automation {
    tree(json!([
        { "id": "st_note", "type": "set", "config": { "values": { "label": "order {{orderId}}" } } },
        { "id": "st_ticket", "type": "ticket/upsert", "config": { "externalId": "{{orderId}}" } },
        { "id": "st_call", "type": "http", "config": { "url": "https://shop.example/orders/{{orderId}}" } },
        { "id": "st_paid", "type": "wait_for_event",
          "config": { "key": "payment-{{orderId}}", "timeout": "3d",
                      "where": { "rules": [{ "field": "amount", "operator": "gte", "value": 1000 }] } } },
        { "id": "st_check", "type": "condition",
          "rules": [{ "field": "st_paid.timedOut", "operator": "eq", "value": true }],
          "then": [{ "id": "st_late", "type": "flow/log", "config": { "message": "no payment" } }],
          "else": [{ "id": "st_ok", "type": "flow/log", "config": { "message": "paid {{st_paid.payload.amount}}" } }] }
    ]))
}

#[test]
fn every_input_moves_the_order_run_as_a_person_expects() {
    let order = order_tree();
    let at = |path: &str| state(path);
    let table: Vec<(&str, RunState, Input, Seen)> = vec![
        (
            "a start decides the control steps and hands out the first step that needs an executor",
            at("0"),
            Input::Start,
            (
                strings(&["st_note completed"]),
                RunStatus::Running,
                "execute st_ticket at 1".into(),
            ),
        ),
        (
            "an in-transaction step done chains on, but an external step after it waits for the record",
            at("1"),
            done(json!({ "ticketId": "tic_1", "created": true })),
            (
                strings(&["st_ticket completed"]),
                RunStatus::Running,
                "step 2 in 0 ms".into(),
            ),
        ),
        (
            "a start at an external step hands it out",
            at("2"),
            Input::Start,
            (vec![], RunStatus::Running, "execute st_call at 2".into()),
        ),
        (
            "an external step done goes on to the wait, which parks the run",
            at("2"),
            done(json!({ "status": 200 })),
            (
                strings(&["st_call completed", "st_paid waiting"]),
                RunStatus::Waiting,
                "wait at 3 for payment-5001".into(),
            ),
        ),
        (
            "a signal resumes the wait and the run completes on the branch it chose",
            at("3"),
            signal(json!({ "amount": 1200 })),
            (
                strings(&["st_paid completed", "st_check completed", "st_ok completed"]),
                RunStatus::Completed,
                "done".into(),
            ),
        ),
        (
            "a timeout resumes the wait with timedOut",
            at("3"),
            Input::TimedOut,
            (
                strings(&[
                    "st_paid completed",
                    "st_check completed",
                    "st_late completed",
                ]),
                RunStatus::Completed,
                "done".into(),
            ),
        ),
        (
            "a signal for a step that has already moved on is not taken; the claim runs its step",
            {
                let mut moved_on = at("4");
                moved_on.context.publish(
                    "st_paid",
                    &Map::from_iter([("timedOut".to_owned(), json!(true))]),
                );
                moved_on
            },
            signal(json!({ "amount": 1 })),
            (
                strings(&["st_check completed", "st_late completed"]),
                RunStatus::Completed,
                "done".into(),
            ),
        ),
        (
            "a retryable failure with attempts left is retried at the same step",
            at("2"),
            failed(StepError::retryable("503 from the shop")),
            (
                strings(&["st_call retrying"]),
                RunStatus::Running,
                "retry 2 after 1 attempts".into(),
            ),
        ),
        (
            "a terminal failure fails the run",
            at("2"),
            failed(StepError::terminal("404 from the shop")),
            (
                strings(&["st_call failed"]),
                RunStatus::Failed,
                "done".into(),
            ),
        ),
        (
            "a deferred step spends no attempt and records nothing",
            at("2"),
            failed(StepError::deferred(
                "connection_rate",
                "rate limited",
                Duration::from_secs(2),
            )),
            (
                vec![],
                RunStatus::Running,
                "retry 2 after 0 attempts".into(),
            ),
        ),
        (
            "a path the version does not have fails the run",
            at("9"),
            Input::Start,
            (vec![], RunStatus::Failed, "done".into()),
        ),
    ];
    for (name, state, input, expected) in table {
        let transition = run(&order, state, input);
        assert_eq!(seen(&transition), expected, "{name}");
    }
}

#[test]
fn the_last_attempt_of_a_retryable_step_fails_the_run_with_an_incident() {
    let order = order_tree();
    let mut third = state("2");
    third.attempt = 3;
    let t = run(
        &order,
        third,
        failed(StepError::retryable("503 from the shop")),
    );
    assert_eq!(t.status, RunStatus::Failed);
    assert_eq!(
        t.error.as_deref(),
        Some("step `st_call` failed: 503 from the shop")
    );
    assert_eq!(
        t.records[0].log,
        ["failed (gave up after 3 attempts): 503 from the shop"]
    );
    let [Effect::RunFailed(failure)] = t.effects.as_slice() else {
        panic!("one incident, got {:?}", t.effects);
    };
    assert_eq!((failure.step_id.as_str(), failure.attempt), ("st_call", 3));
}

#[test]
fn a_retry_says_when_and_keeps_within_ten_percent_of_the_schedule() {
    let t = run(
        &order_tree(),
        state("2"),
        failed(StepError::retryable("timeout")),
    );
    let Then::Record(NextJob::Retry { delay_ms, .. }) = t.then else {
        panic!("a retry, got {:?}", t.then);
    };
    assert!((27_000..=33_000).contains(&delay_ms), "{delay_ms} ms");
    assert!(t.effects.is_empty(), "no incident while attempts remain");
    let line = &t.records[0].log[0];
    let seconds = delay_ms as f64 / 1000.0;
    assert_eq!(
        line,
        &format!("attempt 1 of 3 failed: timeout; next attempt in {seconds:.0} s")
    );
}

#[test]
fn a_wait_for_a_signal_parks_with_its_key_filter_and_due_time() {
    let t = run(&order_tree(), state("3"), Input::Start);
    let Then::Record(NextJob::Wait { path, wait }) = &t.then else {
        panic!("a wait, got {:?}", t.then);
    };
    assert_eq!(path, "3");
    assert_eq!(wait.key, "payment-5001", "the key is a template");
    assert!(
        wait.lookback,
        "lookback is on unless the step says otherwise"
    );
    assert_eq!(wait.due_at, Some(NOW_MS + 3 * 24 * 3600 * 1000));
    let filter = wait.filter.as_ref().expect("the where rules");
    assert_eq!(filter.rules[0].field, "amount");
    assert_eq!(t.state.actions, 1, "the wait counts once, when it begins");
    assert_eq!(
        t.records[0].log,
        ["waiting for signal `payment-5001` until 2026-05-31T20:26:40Z"]
    );
}

#[test]
fn a_resumed_wait_publishes_the_signal_and_counts_no_second_action() {
    let mut waiting = state("3");
    waiting.actions = 4;
    let t = run(&order_tree(), waiting, signal(json!({ "amount": 1500 })));
    let paid = &t.state.context.as_value()["st_paid"];
    assert_eq!(
        paid,
        &json!({ "timedOut": false, "payload": { "amount": 1500 }, "signalId": "sig_1" })
    );
    assert_eq!(t.records[2].log, ["info: paid 1500"]);
    assert_eq!(
        t.state.actions, 6,
        "the condition and the log; the wait counted before"
    );
}

#[test]
fn a_resumed_wait_names_who_sent_its_signal() {
    let key = json!({ "kind": "key", "id": "key_7" });
    let by_key = Input::Signal {
        signal_id: "sig_1".into(),
        payload: json!({ "amount": 1500 }),
        actor: Some(key.clone()),
        subject: None,
        key: None,
    };
    let t = run(&order_tree(), state("3"), by_key);
    assert_eq!(t.state.context.as_value()["st_paid"]["actor"], key);
    assert_eq!(t.records[0].log, ["resumed by signal sig_1 from key key_7"]);
    let by_run = Input::Signal {
        signal_id: "sig_2".into(),
        payload: json!({ "amount": 1500 }),
        actor: Some(json!({ "kind": "run", "runId": "run_9" })),
        subject: None,
        key: None,
    };
    let t = run(&order_tree(), state("3"), by_run);
    assert_eq!(t.records[0].log, ["resumed by signal sig_2 from run run_9"]);
}

#[test]
fn a_timeout_that_won_the_race_leaves_a_late_signal_nothing_to_resume() {
    let order = order_tree();
    let timed_out = run(&order, state("3"), Input::TimedOut);
    assert_eq!(timed_out.status, RunStatus::Completed);
    // The late signal finds the run past its wait: it changes nothing.
    let after = run(&order, timed_out.state, signal(json!({ "amount": 5000 })));
    assert!(
        after.records.iter().all(|r| r.step_id != "st_paid"),
        "the wait is not recorded again: {:?}",
        seen(&after)
    );
    assert_eq!(
        after.state.context.as_value()["st_paid"]["timedOut"],
        json!(true)
    );
}

#[test]
fn a_wait_for_a_signal_without_a_key_fails_at_once_and_says_what_is_missing() {
    let automation = tree(json!([{ "id": "w", "type": "wait_for_event", "config": {} }]));
    let t = run(&automation, state("0"), Input::Start);
    assert_eq!(t.status, RunStatus::Failed);
    let error = t.error.expect("an error");
    assert!(error.contains("needs `config.key`"), "{error}");
}

/// A wait about the run's subject ticket parks on that ticket; one about a
/// ticket its config names parks on that one; a run with no subject ticket
/// cannot wait about it (a terminal failure that says why); a signal's
/// subject is published with its payload.
#[test]
fn a_wait_about_a_ticket_parks_on_it_and_its_signal_names_it() {
    let automation = |subject: Value| {
        tree(json!([
            { "id": "st_paid", "type": "wait_for_event",
              "config": { "key": "paid", "subject": subject } },
            { "id": "st_log", "type": "flow/log", "config": { "message": "paid" } }
        ]))
    };
    let cases: Vec<(&str, Value, Option<&str>, Option<&str>)> = vec![
        (
            "the run's subject",
            json!("ticket"),
            Some("tk_1"),
            Some("tk_1"),
        ),
        (
            "a ticket its input names",
            json!("tk_{{orderId}}"),
            Some("tk_1"),
            Some("tk_5001"),
        ),
        ("no subject in the config", Value::Null, Some("tk_1"), None),
    ];
    for (case, subject, run_subject, parked_on) in cases {
        let state = state("0").about(run_subject.map(str::to_owned));
        let t = run(&automation(subject), state, Input::Start);
        let Then::Record(NextJob::Wait { wait, .. }) = &t.then else {
            panic!("{case}: the run parks, not {:?}", seen(&t));
        };
        assert_eq!(wait.subject.as_deref(), parked_on, "{case}");
        assert_eq!(t.status, RunStatus::Waiting, "{case}");
    }

    let t = run(&automation(json!("ticket")), state("0"), Input::Start);
    assert_eq!(
        seen(&t),
        (
            strings(&["st_paid failed"]),
            RunStatus::Failed,
            "done".into()
        )
    );
    let error = t.error.expect("an error");
    assert!(
        error.contains("the run has no subject ticket") && error.contains("ticket/upsert"),
        "{error}"
    );

    let about = Input::Signal {
        signal_id: "sig_1".into(),
        payload: json!({ "ok": true }),
        actor: None,
        subject: Some("tk_1".into()),
        key: None,
    };
    let state = state("0").about(Some("tk_1".into()));
    let t = run(&automation(json!("ticket")), state, about);
    assert_eq!(
        t.state.context.as_value()["st_paid"],
        json!({ "timedOut": false, "payload": { "ok": true }, "signalId": "sig_1",
                "subject": "tk_1" })
    );
    assert_eq!(
        t.records[0].log,
        ["resumed by signal sig_1 about ticket tk_1"]
    );
}

#[test]
fn a_timer_wait_delays_the_next_step() {
    let automation = tree(json!([
        { "id": "w", "type": "wait", "config": { "duration": "10m" } },
        { "id": "s", "type": "set", "config": { "values": { "a": 1 } } }
    ]));
    let t = run(&automation, state("0"), Input::Start);
    assert_eq!(
        seen(&t),
        (
            strings(&["w completed"]),
            RunStatus::Waiting,
            "step 1 in 600000 ms".into()
        )
    );
}

#[test]
fn a_step_with_too_much_output_fails() {
    let big = "x".repeat(70 * 1024);
    let t = run(&order_tree(), state("2"), done(json!({ "body": big })));
    assert_eq!(seen(&t).1, RunStatus::Failed);
    assert_eq!(t.records[0].status, StepStatus::Failed);
    assert!(
        t.records[0]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("bytes of output")
    );
}

#[test]
fn a_run_past_its_action_budget_stops_and_says_so() {
    let mut spent = state("0");
    spent.actions = MAX_ACTIONS as i32;
    let t = run(&order_tree(), spent, Input::Start);
    assert_eq!(t.status, RunStatus::Failed);
    assert!(
        t.error
            .unwrap_or_default()
            .contains("action_limit_exceeded")
    );
}

#[test]
fn a_claim_records_at_most_its_share_of_steps_then_queues_again() {
    let chain: Vec<Value> = (0..10)
        .map(
            |i| json!({ "id": format!("s{i}"), "type": "set", "config": { "values": { "i": i } } }),
        )
        .collect();
    let t = run(
        &tree(Value::Array(chain)),
        state("0").chaining(4),
        Input::Start,
    );
    assert_eq!(t.records.len(), 4);
    assert_eq!(seen(&t).2, "step 4 in 0 ms");
}

#[test]
fn an_executed_step_gets_its_config_rendered_and_the_scope_it_sees() {
    let t = run(&order_tree(), state("2"), Input::Start);
    let Then::Execute(step) = t.then else {
        panic!("a step to execute");
    };
    assert_eq!(step.class, StepClass::External);
    assert_eq!(
        step.config["url"],
        json!("https://shop.example/orders/5001")
    );
    assert_eq!(step.scope["orderId"], json!("5001"));
    assert_eq!(t.state.actions, 1);
}

/// A `wait` that is the run's last step holds the run until its end: the
/// run waits at the wait itself, and a claim at its end completes it.
#[test]
fn a_wait_that_is_the_last_step_ends_the_run_only_when_it_ends() {
    let automation = tree(json!([
        { "id": "s", "type": "set", "config": { "values": { "a": 1 } } },
        { "id": "w", "type": "wait", "config": { "duration": "10m" } }
    ]));
    let t = run(&automation, state("0"), Input::Start);
    assert_eq!(
        seen(&t),
        (
            strings(&["s completed", "w waiting"]),
            RunStatus::Waiting,
            "step 1 in 600000 ms".into()
        ),
        "the run is not complete while its last step waits"
    );
    // Claimed early (a paused run resumed): it waits again for the same end.
    let mut early = t.state;
    early.path = "1".parse().unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut env = Env {
        now: Timestamp::from_millisecond(NOW_MS + 60_000).unwrap(),
        kinds: &kinds,
        rng: &mut rng,
        retries: &|_| None,
    };
    let again = advance(&automation, early, Input::Start, &mut env);
    assert_eq!(
        seen(&again),
        (Vec::new(), RunStatus::Waiting, "step 1 in 540000 ms".into())
    );
    // Claimed at its end: the wait completes, and with it the run.
    let mut rng = StdRng::seed_from_u64(7);
    let mut env = Env {
        now: Timestamp::from_millisecond(NOW_MS + 600_000).unwrap(),
        kinds: &kinds,
        rng: &mut rng,
        retries: &|_| None,
    };
    let ended = advance(&automation, again.state, Input::Start, &mut env);
    assert_eq!(
        seen(&ended),
        (
            strings(&["w completed"]),
            RunStatus::Completed,
            "done".into()
        )
    );
    assert_eq!(
        ended.records[0].output,
        Some(json!({ "until": "2026-05-28T20:36:40Z" }))
    );
}

fn guarded(steps: Value, settings: Value) -> Automation {
    let json = json!({
        "name": "Guarded",
        "trigger": { "kind": "manual" },
        "steps": steps,
        "settings": settings,
    });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

#[test]
fn an_automations_own_action_limit_stops_its_run_sooner() {
    let steps = json!([
        { "id": "a", "type": "set", "config": { "values": { "a": 1 } } },
        { "id": "b", "type": "set", "config": { "values": { "b": 2 } } },
        { "id": "c", "type": "set", "config": { "values": { "c": 3 } } },
    ]);
    let automation = guarded(steps, json!({ "limits": { "maxActions": 2 } }));
    let t = run(&automation, state("0"), Input::Start);
    assert_eq!(
        seen(&t),
        (
            vec!["a completed".to_owned(), "b completed".to_owned()],
            RunStatus::Failed,
            "done".to_owned()
        )
    );
    let error = t.error.unwrap_or_default();
    assert!(
        error.starts_with("action_limit_exceeded") && error.contains("`c`"),
        "{error}"
    );
    assert!(error.contains("settings.limits.maxActions"), "{error}");
}

/// The context's limit, step by step: an executed step's outputs and a
/// `set` step's values both count; the step that would pass it fails for
/// good (no retry), its outputs are not published, and nothing after it
/// runs.
#[test]
fn outputs_that_would_pass_the_state_limit_fail_their_step() {
    let steps = json!([
        { "id": "call", "type": "http", "config": {} },
        { "id": "keep", "type": "set", "config": { "values": { "copy": "{{call.body}}" } } },
        { "id": "after", "type": "set", "config": { "values": { "x": 1 } } },
    ]);
    let settings = json!({ "limits": { "maxStateBytes": 1500 },
                           "retry": { "max_attempts": 3, "backoff": ["30s"] } });
    let automation = guarded(steps, settings);
    let body = "z".repeat(600);

    // The call's 600 bytes fit; the copy of them does not.
    let t = run(&automation, state("0"), done(json!({ "body": body })));
    assert_eq!(
        seen(&t),
        (
            vec!["call completed".to_owned(), "keep failed".to_owned()],
            RunStatus::Failed,
            "done".to_owned()
        )
    );
    assert!(t.error.unwrap_or_default().contains("state_too_large"));
    assert!(t.state.context.lookup("keep").is_missing());
    assert!(matches!(&t.effects[..], [Effect::RunFailed(f)] if f.step_id == "keep"));

    // Outputs past it at once: the executed step fails, not retried.
    let t = run(
        &automation,
        state("0"),
        done(json!({ "body": "z".repeat(2000) })),
    );
    assert_eq!(
        seen(&t),
        (
            vec!["call failed".to_owned()],
            RunStatus::Failed,
            "done".to_owned()
        )
    );
}

/// `pruneStateAfter`: the outputs of the latest steps stay, the older go,
/// and a step published again (an iteration) counts as the latest; the
/// state's limit counts what is left.
#[test]
fn pruning_keeps_the_latest_outputs_within_the_state_limit() {
    let steps: Vec<Value> = (0..6)
        .map(|i| {
            json!({ "id": format!("s{i}"), "type": "set",
                         "config": { "values": { format!("v{i}"): "w".repeat(400) } } })
        })
        .collect();
    let automation = guarded(
        Value::Array(steps.clone()),
        json!({ "pruneStateAfter": 2, "limits": { "maxStateBytes": 2000 } }),
    );
    let t = run(&automation, state("0"), Input::Start);
    assert_eq!(t.status, RunStatus::Completed, "{:?}", t.error);
    for gone in ["s0", "s1", "s2", "s3", "v0", "v3"] {
        assert!(t.state.context.lookup(gone).is_missing(), "{gone}");
    }
    for kept in ["s4.v4", "s5.v5", "v5"] {
        assert!(!t.state.context.lookup(kept).is_missing(), "{kept}");
    }
    // Without pruning, the same run passes its limit.
    let unpruned = guarded(
        Value::Array(steps),
        json!({ "limits": { "maxStateBytes": 2000 } }),
    );
    let t = run(&unpruned, state("0"), Input::Start);
    assert_eq!(t.status, RunStatus::Failed);
    assert!(t.error.unwrap_or_default().contains("state_too_large"));
}

/// A custom step that asks to wait: the run parks on its key with what it
/// published; the signal hands the step back to be resumed (no second
/// action), a retried resume is resumed with the same signal again, a
/// timeout resumes it too, and a cancel starts at it for its hook.
#[test]
fn a_custom_step_waits_and_is_resumed_by_its_signal_or_its_timeout() {
    use tok_core::advance::CustomWait;
    use tok_core::advance::custom;
    let automation = tree(json!([
        { "id": "ship", "type": "acme/courier", "config": { "key": "d-{{orderId}}" } },
        { "id": "after", "type": "set", "config": { "values": { "x": 1 } } },
    ]));
    let asks = Input::StepWaits {
        wait: CustomWait {
            keys: vec!["d-5001".into()],
            timeout_ms: Some(60_000),
            outputs: Map::from_iter([("tracking".to_owned(), json!("TR-7"))]),
            ..CustomWait::default()
        },
        input: Some(json!({ "key": "d-5001" })),
        started_at: NOW_MS - 5,
    };
    let mut begun = state("0");
    begun.actions = 1;
    let parked = run(&automation, begun, asks);
    assert_eq!(
        seen(&parked),
        (
            vec!["ship waiting".to_owned()],
            RunStatus::Waiting,
            "wait at 0 for d-5001".to_owned()
        )
    );
    let Then::Record(NextJob::Wait { wait, .. }) = &parked.then else {
        unreachable!()
    };
    assert_eq!(wait.due_at, Some(NOW_MS + 60_000));
    let context = &parked.state.context;
    assert_eq!(
        context.lookup("ship.tracking").value(),
        Some(&json!("TR-7"))
    );
    assert_eq!(
        tok_core::compensation::cancel_at(context).as_deref(),
        Some("0"),
        "a cancel is taken at the live step, for its hook"
    );

    let claimed = |t: &Transition| {
        let mut s = t.state.clone();
        s.recorded = 0;
        s
    };
    let signal = Input::Signal {
        signal_id: "sig_1".into(),
        payload: json!({ "at": "10:00" }),
        actor: None,
        subject: None,
        key: None,
    };
    let resumed = run(&automation, claimed(&parked), signal);
    let Then::Execute(step) = &resumed.then else {
        panic!("{:?}", resumed.then)
    };
    let handed = step.resumed.clone().expect("resumed with the signal");
    assert_eq!(handed["signalId"], "sig_1");
    assert_eq!(handed["payload"]["at"], "10:00");
    assert_eq!(resumed.state.actions, 1, "no second action");
    assert!(custom::live(&resumed.state.context).is_empty());

    // Its resume fails and is retried: the retry is resumed the same way.
    let failed_once = run(
        &automation,
        claimed(&resumed),
        failed(StepError::retryable("503")),
    );
    assert!(matches!(
        failed_once.then,
        Then::Record(NextJob::Retry { .. })
    ));
    let mut retried = claimed(&failed_once);
    retried.attempt = 2;
    let again = run(&automation, retried, Input::Start);
    let Then::Execute(step) = &again.then else {
        panic!("{:?}", again.then)
    };
    assert_eq!(step.resumed.as_ref(), Some(&handed));

    // Its resume succeeds: what resumed it is spent, the run goes on.
    let finished = run(&automation, claimed(&again), done(json!({ "ok": true })));
    assert_eq!(finished.status, RunStatus::Completed);
    assert_eq!(custom::resumed(&finished.state.context, "0"), None);

    // A timeout resumes it too, saying so.
    let timed_out = run(&automation, claimed(&parked), Input::TimedOut);
    let Then::Execute(step) = &timed_out.then else {
        panic!("{:?}", timed_out.then)
    };
    assert_eq!(step.resumed, Some(json!({ "timedOut": true })));
}

/// A custom step waits for what a `wait_for_event` may: any of several
/// keys, about a ticket, whose payload satisfies rules; a wait it cannot
/// have fails it, terminally, saying why.
#[test]
fn a_custom_step_waits_on_several_keys_about_a_ticket_or_fails_saying_why() {
    use tok_core::advance::CustomWait;
    let automation = tree(json!([
        { "id": "ship", "type": "acme/courier", "config": {} },
    ]));
    let asks = |wait: CustomWait| Input::StepWaits {
        wait,
        input: None,
        started_at: NOW_MS - 5,
    };
    let filter: tok_core::definition::Filter = serde_json::from_value(json!({
        "rules": [{ "field": "state", "operator": "eq", "value": "done" }]
    }))
    .unwrap();
    let wait = CustomWait {
        keys: vec!["delivered".into(), "lost".into()],
        subject: Some(" tk_7 ".into()),
        filter: Some(filter.clone()),
        ..CustomWait::default()
    };
    let mut begun = state("0");
    begun.actions = 1;
    let parked = run(&automation, begun.clone(), asks(wait));
    let Then::Record(NextJob::Wait { wait, .. }) = &parked.then else {
        panic!("{:?}", parked.then)
    };
    assert_eq!(wait.keys().collect::<Vec<_>>(), ["delivered", "lost"]);
    assert_eq!(wait.subject.as_deref(), Some("tk_7"));
    assert_eq!(wait.filter.as_ref(), Some(&filter));
    assert!(wait.lookback, "a buffered signal resumes it at once");
    assert_eq!(
        parked.records[0].log,
        ["waiting for a signal on any of `delivered`, `lost` about ticket tk_7"]
    );

    let keys = |keys: &[&str]| CustomWait {
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        ..CustomWait::default()
    };
    let many: Vec<String> = (0..21).map(|n| format!("k{n}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let cases = [
        (keys(&[]), "asked to wait for no signal key"),
        (keys(&["a", " "]), "asked to wait for an empty signal key"),
        (keys(&["a", "a"]), "asked to wait for `a` twice"),
        (
            keys(&many),
            "asked to wait for 21 signal keys; a wait takes at most 20",
        ),
        (
            keys(&["tok:condition"]),
            "keys beginning with `tok:` are reserved",
        ),
        (
            CustomWait {
                subject: Some("".into()),
                ..keys(&["a"])
            },
            "about an empty ticket id",
        ),
        (
            CustomWait {
                what: Some(" ".into()),
                ..keys(&["a"])
            },
            "described what it waits for with an empty text",
        ),
        (
            CustomWait {
                what: Some("x".repeat(201)),
                ..keys(&["a"])
            },
            "described what it waits for in 201 bytes; a description has at most 200",
        ),
    ];
    for (wait, expected) in cases {
        let t = run(&automation, begun.clone(), asks(wait.clone()));
        assert_eq!(t.status, RunStatus::Failed, "{wait:?}");
        let error = t.error.clone().unwrap_or_default();
        assert!(
            error.contains("step `ship` ") && error.contains(expected),
            "{wait:?}: expected `{expected}` in {error}"
        );
    }
}

/// A custom step may wait as a `wait_for_event` with `mode: "all"` does:
/// the first of two signals (in either order) parks it again on the
/// other, the second hands both to its resume; a timeout in between
/// hands what came and what is missing.
#[test]
fn a_custom_step_waits_for_each_of_two_signals_in_either_order() {
    use tok_core::advance::CustomWait;
    use tok_core::waits::WaitMode;
    let automation = tree(json!([
        { "id": "ship", "type": "acme/courier", "config": {} },
    ]));
    let mut begun = state("0");
    begun.actions = 1;
    let asks = Input::StepWaits {
        wait: CustomWait {
            keys: vec!["paid".into(), "packed".into()],
            mode: WaitMode::All,
            timeout_ms: Some(60_000),
            ..CustomWait::default()
        },
        input: None,
        started_at: NOW_MS - 5,
    };
    let parked = run(&automation, begun, asks);
    assert_eq!(
        parked.records[0].log,
        ["waiting for a signal on each of `paid`, `packed` until 2026-05-28T20:27:40Z"]
    );
    let claimed = |t: &Transition| {
        let mut s = t.state.clone();
        s.recorded = 0;
        s
    };
    let on = |key: &str, id: &str| Input::Signal {
        signal_id: id.into(),
        payload: json!({ "k": key }),
        actor: None,
        subject: None,
        key: Some(key.into()),
    };
    for (first, second) in [("paid", "packed"), ("packed", "paid")] {
        let one = run(&automation, claimed(&parked), on(first, "sig_1"));
        let Then::Record(NextJob::Wait { wait, .. }) = &one.then else {
            panic!("{first} first: {:?}", one.then)
        };
        assert_eq!(
            wait.keys().collect::<Vec<_>>(),
            [second],
            "parks on the other"
        );
        assert_eq!(wait.due_at, Some(NOW_MS + 60_000), "until the same timeout");
        assert!(one.records.is_empty(), "no record of its own");
        // The same key again changes nothing.
        let again = run(&automation, claimed(&one), on(first, "sig_9"));
        assert!(matches!(&again.then, Then::Record(NextJob::Wait { .. })));

        let both = run(&automation, claimed(&one), on(second, "sig_2"));
        let Then::Execute(step) = &both.then else {
            panic!("{:?}", both.then)
        };
        let handed = step.resumed.clone().expect("resumed");
        assert_eq!(handed["timedOut"], false);
        assert_eq!(handed["keys"], json!([first, second]));
        assert_eq!(handed["signals"][first]["signalId"], "sig_1");
        assert_eq!(handed["signals"][second]["payload"]["k"], second);
        assert_eq!(handed["signalId"], "sig_2", "the last one's fields");
    }
    let one = run(&automation, claimed(&parked), on("packed", "sig_1"));
    let timed_out = run(&automation, claimed(&one), Input::TimedOut);
    let Then::Execute(step) = &timed_out.then else {
        panic!("{:?}", timed_out.then)
    };
    let handed = step.resumed.clone().expect("resumed");
    assert_eq!(handed["timedOut"], true);
    assert_eq!(handed["missing"], json!(["paid"]));
    assert_eq!(handed["signals"]["packed"]["signalId"], "sig_1");

    // Each of one key: its signal is kept by key all the same.
    let mut begun = state("0");
    begun.actions = 1;
    let one_key = Input::StepWaits {
        wait: CustomWait {
            keys: vec!["paid".into()],
            mode: WaitMode::All,
            ..CustomWait::default()
        },
        input: None,
        started_at: NOW_MS - 5,
    };
    let parked = run(&automation, begun, one_key);
    let paid = run(&automation, claimed(&parked), on("paid", "sig_3"));
    let Then::Execute(step) = &paid.then else {
        panic!("{:?}", paid.then)
    };
    let handed = step.resumed.clone().expect("resumed");
    assert_eq!(handed["keys"], json!(["paid"]));
    assert_eq!(handed["signals"]["paid"]["signalId"], "sig_3");
}

/// A custom step's escalations fire while it waits, as a
/// `wait_for_event`'s: the level's steps run beside it and it parks again
/// on the same keys, counting signals buffered since it began; an
/// approval's key is an approval's alone.
#[test]
fn a_custom_step_escalates_while_it_waits_and_parks_again_on_its_wait() {
    use tok_core::advance::CustomWait;
    let automation = tree(json!([
        { "id": "ship", "type": "acme/courier", "config": {},
          "escalations": [{ "after": "10m", "steps": [
              { "id": "nudge", "type": "flow/log", "config": { "message": "still waiting" } }
          ] }] },
    ]));
    let mut begun = state("0");
    begun.actions = 1;
    let asks = |keys: &[&str]| Input::StepWaits {
        wait: CustomWait {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            timeout_ms: Some(3_600_000),
            only_new: true,
            ..CustomWait::default()
        },
        input: None,
        started_at: NOW_MS - 5,
    };
    let parked = run(&automation, begun.clone(), asks(&["delivered", "lost"]));
    let Then::Record(NextJob::Wait { wait, .. }) = &parked.then else {
        panic!("{:?}", parked.then)
    };
    assert_eq!(
        wait.due_at,
        Some(NOW_MS + 600_000),
        "due at the first level"
    );
    assert!(!wait.lookback);
    let mut claimed = parked.state.clone();
    claimed.recorded = 0;
    let escalated = run(&automation, claimed, Input::TimedOut);
    assert_eq!(
        seen(&escalated).0,
        ["nudge completed"],
        "the level's step ran: {:?}",
        escalated.records
    );
    let Then::Record(NextJob::Wait { wait, .. }) = &escalated.then else {
        panic!("{:?}", escalated.then)
    };
    assert_eq!(wait.keys().collect::<Vec<_>>(), ["delivered", "lost"]);
    assert_eq!(
        wait.due_at,
        Some(NOW_MS + 3_600_000),
        "then its own timeout"
    );
    assert_eq!(wait.since, Some(NOW_MS), "signals since it began count");

    let t = run(&automation, begun, asks(&["approval:apr_1"]));
    assert_eq!(t.status, RunStatus::Failed);
    assert!(
        t.error
            .unwrap_or_default()
            .contains("keys beginning with `approval:` are the decisions of approvals"),
    );
}
