//! The decider's tables for the waits of several signals and of a ticket's
//! condition: a `wait_for_event` on `keys` in `all` mode keeps each signal
//! and parks again on the keys still missing, until its original timeout,
//! and ends with all of them (in either order) or times out with those
//! that came; in `any` mode the first ends it and names its key. A
//! `wait_for_condition` parks on its ticket, ends when the store resumes it
//! with the ticket, parks again at each `every` check and gives up at its
//! deadline.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tok_core::advance::{Env, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, Resume, RunStatus, SignalWait, StepStatus};
use tok_core::waits::{CONDITION_KEY, WAITING_KEY};

const NOW_MS: i64 = 1_780_000_000_000;
const MIN: i64 = 60_000;

/// Every registered type is external: the run goes on to the step after
/// a wait in a job of its own, which shows that the wait completed.
fn kinds(_: &str) -> StepClass {
    StepClass::External
}

fn tree(steps: Value) -> Automation {
    let json = json!({ "name": "Orders", "trigger": { "kind": "manual" }, "steps": steps });
    Automation::from_json(&json.to_string()).expect("a valid definition")
}

/// A wait on `paid` and `packed` in `mode`, then an `http` step.
fn both(mode: &str, extra: Value) -> Automation {
    let mut config = json!({ "keys": ["paid", "packed"], "mode": mode, "timeout": "1h" });
    if let (Value::Object(config), Value::Object(extra)) = (&mut config, extra) {
        config.extend(extra);
    }
    tree(json!([
        { "id": "st_wait", "type": "wait_for_event", "config": config },
        { "id": "st_next", "type": "http", "config": { "url": "https://example.test" } }
    ]))
}

fn run(automation: &Automation, state: RunState, input: Input, now: i64) -> Transition {
    let mut rng = StdRng::seed_from_u64(7);
    let mut env = Env {
        now: Timestamp::from_millisecond(now).expect("a time"),
        kinds: &kinds,
        rng: &mut rng,
        retries: &|_| None,
    };
    advance(automation, state, input, &mut env)
}

fn start(subject: Option<&str>) -> RunState {
    let context = Context::new(Map::new(), json!({}), json!({ "type": "manual" }));
    RunState::at("0".parse::<FlowPath>().expect("a path"), 1, context, 0)
        .about(subject.map(str::to_owned))
}

/// The state of the claim that takes the job `t` parked.
fn claimed(t: &Transition) -> RunState {
    let path = match &t.then {
        Then::Record(NextJob::Wait { path, .. }) => path.parse().expect("a path"),
        other => panic!("not parked: {other:?}"),
    };
    RunState::at(path, 1, t.state.context.clone(), t.state.actions).about(t.state.subject.clone())
}

fn parked(t: &Transition) -> &SignalWait {
    match &t.then {
        Then::Record(NextJob::Wait { wait, .. }) => wait,
        other => panic!("not parked: {other:?}"),
    }
}

fn keys(wait: &SignalWait) -> Vec<&str> {
    wait.keys().collect()
}

fn records(t: &Transition) -> Vec<(String, StepStatus)> {
    t.records
        .iter()
        .map(|r| (r.step_id.clone(), r.status))
        .collect()
}

/// Where the run goes on after a step recorded in this claim: the path of
/// its next job (an external step runs in a job of its own).
fn goes_on(t: &Transition) -> String {
    match &t.then {
        Then::Record(NextJob::Step { path, delay_ms: 0 }) => path.clone(),
        other => panic!("does not go on: {other:?}"),
    }
}

/// A signal on `key`, as its resume carries it.
fn on(key: &str, id: &str, payload: Value) -> Input {
    Input::from(Some(Resume::Signal {
        signal_id: id.into(),
        payload,
        actor: None,
        subject: None,
        key: Some(key.into()),
    }))
}

fn outputs(t: &Transition, step: &str) -> Value {
    t.state.context.as_value()[step].clone()
}

#[test]
fn all_of_two_signals_ends_the_wait_in_either_order_and_only_with_both() {
    let automation = both("all", json!({}));
    for (first, second) in [("paid", "packed"), ("packed", "paid")] {
        let begun = run(&automation, start(None), Input::Start, NOW_MS);
        assert_eq!(records(&begun), [("st_wait".into(), StepStatus::Waiting)]);
        assert_eq!(begun.status, RunStatus::Waiting);
        assert_eq!(keys(parked(&begun)), ["paid", "packed"]);
        assert_eq!(parked(&begun).due_at, Some(NOW_MS + 60 * MIN));
        assert!(
            begun.records[0].log[0].contains("waiting for a signal on each of `paid`, `packed`"),
            "{:?}",
            begun.records[0].log
        );

        // The first signal: no record, the run parks again on the other
        // key until the timeout it began with.
        let one = on(first, "sig_1", json!({ "n": 1 }));
        let half = run(&automation, claimed(&begun), one, NOW_MS + 5 * MIN);
        assert_eq!(records(&half), [], "{first} then {second}");
        assert_eq!(half.status, RunStatus::Waiting);
        assert_eq!(keys(parked(&half)), [second]);
        assert_eq!(parked(&half).due_at, Some(NOW_MS + 60 * MIN));
        assert!(outputs(&half, "st_wait").is_null(), "nothing published yet");

        // The second: the step completes with both, in the order they came.
        let two = on(second, "sig_2", json!({ "n": 2 }));
        let done = run(&automation, claimed(&half), two, NOW_MS + 9 * MIN);
        assert_eq!(records(&done), [("st_wait".into(), StepStatus::Completed)]);
        assert_eq!(goes_on(&done), "1", "on to st_next");
        assert_eq!(
            outputs(&done, "st_wait"),
            json!({
                "timedOut": false,
                "signals": {
                    first: { "signalId": "sig_1", "payload": { "n": 1 } },
                    second: { "signalId": "sig_2", "payload": { "n": 2 } }
                },
                "keys": [first, second]
            })
        );
        assert!(done.state.context.reserved(WAITING_KEY).is_none());
    }
}

#[test]
fn all_parks_again_on_the_missing_keys_from_when_it_began_without_lookback() {
    // Two signals at once: the first resumes the wait, the second finds
    // its rows gone and is buffered. The wait parks again on the second
    // key and, without lookback, takes the buffered signals from when it
    // began (the store's part), so the second is taken there.
    let automation = both("all", json!({ "lookback": false }));
    let begun = run(&automation, start(None), Input::Start, NOW_MS);
    assert_eq!(parked(&begun).since, None, "no buffer at the first park");
    let half = run(
        &automation,
        claimed(&begun),
        on("paid", "sig_1", json!({})),
        NOW_MS + 1,
    );
    let again = parked(&half);
    assert_eq!(
        (keys(again), again.lookback, again.since),
        (vec!["packed"], false, Some(NOW_MS))
    );
    let taken = on("packed", "sig_2", json!({}));
    let done = run(&automation, claimed(&half), taken, NOW_MS + 2);
    assert_eq!(outputs(&done, "st_wait")["keys"], json!(["paid", "packed"]));

    // With lookback, the park looks at the whole buffer anyway.
    let automation = both("all", json!({}));
    let begun = run(&automation, start(None), Input::Start, NOW_MS);
    let half = run(
        &automation,
        claimed(&begun),
        on("packed", "sig_1", json!({})),
        NOW_MS + 1,
    );
    assert_eq!((parked(&half).lookback, parked(&half).since), (true, None));
}

#[test]
fn any_ends_with_the_first_signal_and_names_its_key() {
    let automation = both("any", json!({}));
    let begun = run(&automation, start(None), Input::Start, NOW_MS);
    assert_eq!(keys(parked(&begun)), ["paid", "packed"]);
    assert!(begun.state.context.reserved(WAITING_KEY).is_none());
    let done = run(
        &automation,
        claimed(&begun),
        on("packed", "sig_7", json!({ "box": 3 })),
        NOW_MS + MIN,
    );
    assert_eq!(records(&done), [("st_wait".into(), StepStatus::Completed)]);
    assert_eq!(
        outputs(&done, "st_wait"),
        json!({ "timedOut": false, "payload": { "box": 3 }, "signalId": "sig_7", "key": "packed" })
    );
    assert_eq!(done.records[0].log, ["resumed by signal sig_7 on `packed`"]);
    assert_eq!(goes_on(&done), "1", "on to st_next");
}

#[test]
fn all_that_times_out_says_what_came_and_what_is_missing() {
    let automation = both("all", json!({}));
    let begun = run(&automation, start(None), Input::Start, NOW_MS);
    let half = run(
        &automation,
        claimed(&begun),
        on("paid", "sig_1", json!({ "amount": 12 })),
        NOW_MS + MIN,
    );
    let out = run(
        &automation,
        claimed(&half),
        Input::TimedOut,
        NOW_MS + 60 * MIN,
    );
    assert_eq!(records(&out), [("st_wait".into(), StepStatus::Completed)]);
    assert_eq!(
        outputs(&out, "st_wait"),
        json!({
            "timedOut": true,
            "signals": { "paid": { "signalId": "sig_1", "payload": { "amount": 12 } } },
            "keys": ["paid"],
            "missing": ["packed"]
        })
    );
    assert_eq!(
        out.records[0].log,
        ["timed out: no signal came on `packed`"]
    );
    assert!(out.state.context.reserved(WAITING_KEY).is_none());
}

#[test]
fn an_escalation_of_all_parks_again_on_the_missing_keys_only() {
    let automation = tree(json!([
        { "id": "st_wait", "type": "wait_for_event",
          "config": { "keys": ["paid", "packed", "sent"], "mode": "all", "timeout": "1h" },
          "escalations": [{ "after": "10m", "steps": [
              { "id": "st_note", "type": "flow/log", "config": { "message": "late" } } ] }] },
        { "id": "st_next", "type": "http", "config": { "url": "https://example.test" } }
    ]));
    let begun = run(&automation, start(None), Input::Start, NOW_MS);
    assert_eq!(
        parked(&begun).due_at,
        Some(NOW_MS + 10 * MIN),
        "due at the level"
    );
    let half = run(
        &automation,
        claimed(&begun),
        on("packed", "sig_1", json!({})),
        NOW_MS + MIN,
    );
    assert_eq!(keys(parked(&half)), ["paid", "sent"]);
    assert_eq!(
        parked(&half).due_at,
        Some(NOW_MS + 10 * MIN),
        "still the level"
    );
    let escalated = run(
        &automation,
        claimed(&half),
        Input::TimedOut,
        NOW_MS + 10 * MIN,
    );
    assert_eq!(
        records(&escalated),
        [("st_note".into(), StepStatus::Completed)]
    );
    assert_eq!(keys(parked(&escalated)), ["paid", "sent"]);
    assert_eq!(parked(&escalated).due_at, Some(NOW_MS + 60 * MIN));
}

#[test]
fn a_cancelled_run_keeps_no_wait_of_several_signals() {
    let automation = both("all", json!({}));
    let begun = run(&automation, start(None), Input::Start, NOW_MS);
    assert!(begun.state.context.reserved(WAITING_KEY).is_some());
    let cancelled = run(
        &automation,
        claimed(&begun),
        Input::Cancel { error: None },
        NOW_MS + MIN,
    );
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert!(cancelled.state.context.reserved(WAITING_KEY).is_none());
}

#[test]
fn a_wait_with_a_bad_key_list_fails_at_once_and_says_what_was_expected() {
    let cases = [
        (
            json!({ "keys": [] }),
            "config.keys must be a non-empty list",
        ),
        (
            json!({ "key": "a", "keys": ["b"] }),
            "has both `config.key` and `config.keys`",
        ),
        (json!({ "keys": ["a", "a"] }), "names `a` twice"),
        (json!({ "keys": ["a", ""] }), "config.keys.1 is \"\""),
        (
            json!({ "key": "a", "mode": "all" }),
            "`config.mode` without `config.keys`",
        ),
        (
            json!({ "keys": ["a"], "mode": "most" }),
            "config.mode must be \"any\" or \"all\"",
        ),
        (
            json!({ "keys": ["a", "tok:condition"] }),
            "reserved for tok",
        ),
    ];
    for (config, expected) in cases {
        let automation =
            tree(json!([{ "id": "st_wait", "type": "wait_for_event", "config": config }]));
        let t = run(&automation, start(None), Input::Start, NOW_MS);
        assert_eq!(t.status, RunStatus::Failed, "{config}");
        let error = t.records[0].error.clone().unwrap_or_default();
        assert!(
            error.starts_with("step `st_wait`") && error.contains(expected),
            "{config}: expected `{expected}` in {error:?}"
        );
    }
}

/// A wait until the ticket is `shipped`, checked every 5 minutes for an
/// hour at most, then an `http` step.
fn shipped() -> Automation {
    tree(json!([
        { "id": "st_shipped", "type": "wait_for_condition",
          "config": { "rules": [{ "field": "status", "operator": "eq", "value": "shipped" }],
                      "every": "5m", "timeout": "1h" } },
        { "id": "st_next", "type": "http", "config": { "url": "https://example.test" } }
    ]))
}

#[test]
fn a_condition_wait_parks_on_the_runs_ticket_and_ends_when_it_holds() {
    let automation = shipped();
    let begun = run(&automation, start(Some("tk_1")), Input::Start, NOW_MS);
    assert_eq!(
        records(&begun),
        [("st_shipped".into(), StepStatus::Waiting)]
    );
    assert_eq!(begun.status, RunStatus::Waiting);
    let wait = parked(&begun);
    assert_eq!(wait.key, CONDITION_KEY);
    assert!(wait.is_condition());
    assert_eq!(wait.subject.as_deref(), Some("tk_1"));
    assert_eq!(wait.filter.as_ref().map(|f| f.rules.len()), Some(1));
    assert_eq!(
        wait.due_at,
        Some(NOW_MS + 5 * MIN),
        "due at the first check"
    );
    assert!(
        begun.records[0].log[0].starts_with("waiting until ticket tk_1 holds the rules"),
        "{:?}",
        begun.records[0].log
    );

    let ticket = json!({ "id": "tk_1", "status": "shipped", "closed": false });
    let holds = Input::from(Some(Resume::Condition {
        ticket: ticket.clone(),
    }));
    let done = run(&automation, claimed(&begun), holds, NOW_MS + MIN);
    assert_eq!(
        records(&done),
        [("st_shipped".into(), StepStatus::Completed)]
    );
    assert_eq!(
        outputs(&done, "st_shipped"),
        json!({ "timedOut": false, "ticket": ticket })
    );
    assert_eq!(
        done.records[0].log,
        ["the condition holds: ticket tk_1 holds the rules"]
    );
    assert_eq!(goes_on(&done), "1", "on to st_next");
    assert!(done.state.context.reserved(WAITING_KEY).is_none());
}

#[test]
fn a_condition_wait_is_checked_every_interval_until_its_deadline() {
    let automation = shipped();
    let begun = run(&automation, start(Some("tk_1")), Input::Start, NOW_MS);
    // A check that found nothing: park again until the next, no record.
    let check = run(
        &automation,
        claimed(&begun),
        Input::TimedOut,
        NOW_MS + 5 * MIN,
    );
    assert_eq!(records(&check), []);
    assert_eq!(check.status, RunStatus::Waiting);
    assert_eq!(parked(&check).due_at, Some(NOW_MS + 10 * MIN));
    assert_eq!(parked(&check).subject.as_deref(), Some("tk_1"));
    // The last check is the deadline, not past it.
    let late = run(
        &automation,
        claimed(&check),
        Input::TimedOut,
        NOW_MS + 58 * MIN,
    );
    assert_eq!(parked(&late).due_at, Some(NOW_MS + 60 * MIN));
    // At the deadline the step gives up.
    let out = run(
        &automation,
        claimed(&late),
        Input::TimedOut,
        NOW_MS + 60 * MIN,
    );
    assert_eq!(
        records(&out),
        [("st_shipped".into(), StepStatus::Completed)]
    );
    assert_eq!(outputs(&out, "st_shipped"), json!({ "timedOut": true }));
    assert_eq!(
        out.records[0].log,
        ["timed out: ticket tk_1 did not hold the rules"]
    );
    assert_eq!(goes_on(&out), "1", "on to st_next");
    assert!(out.state.context.reserved(WAITING_KEY).is_none());
}

#[test]
fn a_condition_wait_without_a_ticket_fails_and_says_how_to_give_one() {
    let t = run(&shipped(), start(None), Input::Start, NOW_MS);
    assert_eq!(t.status, RunStatus::Failed);
    let error = t.records[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("step `st_shipped` waits for a condition on the run's subject ticket")
            && error.contains("no subject ticket"),
        "{error}"
    );
}

/// The errors of saving `steps`, as `path: message`.
fn save_errors(steps: Value) -> Vec<String> {
    let def = json!({ "name": "n", "trigger": { "kind": "manual" }, "steps": steps });
    let def: Automation = serde_json::from_value(def).expect("a definition");
    match tok_core::validate::validate(&def, 100, &|kind| kind == "http") {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn keys_modes_and_conditions_are_checked_at_save_with_what_was_expected() {
    let rule = json!([{ "field": "status", "operator": "eq", "value": "shipped" }]);
    let good = json!([
        { "id": "a", "type": "wait_for_event", "config": { "keys": ["x", "{{k}}"], "mode": "all" } },
        { "id": "b", "type": "wait_for_event", "config": { "keys": ["x"] } },
        { "id": "c", "type": "wait_for_condition",
          "config": { "rules": rule, "match": "any", "every": "1m", "timeout": "3d" } },
        { "id": "d", "type": "wait_for_condition", "config": { "rules": rule, "subject": "{{t}}" } }
    ]);
    assert_eq!(save_errors(good), Vec::<String>::new());
    let cases = [
        (
            json!({ "id": "w", "type": "wait_for_event", "config": { "key": "a", "keys": ["b"] } }),
            "steps.0.config: wait_for_event takes `key` (one signal key) or `keys`",
        ),
        (
            json!({ "id": "w", "type": "wait_for_event", "config": { "keys": [] } }),
            "steps.0.config.keys: keys must be a non-empty list of signal keys",
        ),
        (
            json!({ "id": "w", "type": "wait_for_event", "config": { "keys": ["a", "a"] } }),
            "steps.0.config.keys.1: `a` is listed twice",
        ),
        (
            json!({ "id": "w", "type": "wait_for_event", "config": { "keys": ["a", 3] } }),
            "steps.0.config.keys.1: each key must be a non-empty string",
        ),
        (
            json!({ "id": "w", "type": "wait_for_event", "config": { "keys": ["tok:x"] } }),
            "steps.0.config.keys.0: signal keys beginning with `tok:` are reserved",
        ),
        (
            json!({ "id": "w", "type": "wait_for_event",
                    "config": { "keys": (0..21).map(|i| format!("k{i}")).collect::<Vec<_>>() } }),
            "steps.0.config.keys: keys lists 21 keys; a wait has at most 20",
        ),
        (
            json!({ "id": "w", "type": "wait_for_event", "config": { "key": "a", "mode": "all" } }),
            "steps.0.config.mode: mode goes with `keys`",
        ),
        (
            json!({ "id": "w", "type": "wait_for_event", "config": { "keys": ["a"], "mode": "both" } }),
            "steps.0.config.mode: mode must be \"any\"",
        ),
        (
            json!({ "id": "w", "type": "wait_for_condition", "config": {} }),
            "steps.0.config.rules: wait_for_condition needs `config.rules`",
        ),
        (
            json!({ "id": "w", "type": "wait_for_condition", "config": { "rules": rule, "match": "most" } }),
            "steps.0.config.match: wait_for_condition config.match must be \"all\" or \"any\"",
        ),
        (
            json!({ "id": "w", "type": "wait_for_condition", "config": { "rules": rule, "every": "5ms" } }),
            "steps.0.config.every: every is 5 ms; the rules are checked at most every 1000 ms",
        ),
        (
            json!({ "id": "w", "type": "wait_for_condition", "config": { "rules": rule, "timeout": "soon" } }),
            "steps.0.config.timeout:",
        ),
        (
            json!({ "id": "w", "type": "wait_for_condition", "config": { "rules": rule, "key": "k" } }),
            "steps.0.config.key: a `wait_for_condition` step has no config key `key`",
        ),
    ];
    for (step, expected) in cases {
        let errors = save_errors(json!([step]));
        assert!(
            errors.iter().any(|e| e.starts_with(expected)),
            "{step}: expected `{expected}` in {errors:?}"
        );
    }
}

#[test]
fn all_whose_signals_together_pass_the_output_limit_fails_and_says_so() {
    let automation = both("all", json!({}));
    let big = json!({ "blob": "x".repeat(40 * 1024) });
    let begun = run(&automation, start(None), Input::Start, NOW_MS);
    let half = run(
        &automation,
        claimed(&begun),
        on("paid", "sig_1", big.clone()),
        NOW_MS + 1,
    );
    assert_eq!(half.status, RunStatus::Waiting, "one fits");
    let out = run(
        &automation,
        claimed(&half),
        on("packed", "sig_2", big),
        NOW_MS + 2,
    );
    assert_eq!(out.status, RunStatus::Failed);
    let error = out.records[0].error.clone().unwrap_or_default();
    assert!(
        error.starts_with("step `st_wait` returned") && error.contains("bytes of output"),
        "{error}"
    );
}
