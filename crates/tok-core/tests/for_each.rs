//! The decider's tables for `for_each`: the step publishes its items and
//! forks its first `concurrency` items; an item's job runs the `do` list
//! with its `item` and `index`, keeping its steps' outputs apart from the
//! other items', and ends its item past the last step; the join
//! completes the step with the results in item order (also when its
//! completion rule was met while items were in flight, which the store
//! cancelled), or fails it with `item_failed`. No database.

use jiff::Timestamp;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tok_core::advance::{Env, Execute, Input, RunState, StepClass, Then, Transition, advance};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::for_each::ItemsJoin;
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

fn state(path: &str, context: &Context) -> RunState {
    RunState::at(
        path.parse::<FlowPath>().expect("a path"),
        1,
        context.clone(),
        0,
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

fn called(status: i64) -> Input {
    Input::StepDone {
        outputs: Map::from_iter([("status".to_owned(), json!(status))]),
        log: Vec::new(),
        input: None,
        started_at: NOW_MS - 5,
    }
}

fn joined(total: usize, done: &[usize], cancelled: &[usize]) -> Input {
    Input::BranchesJoined {
        total,
        failed: None,
        done: done.to_vec(),
        cancelled: cancelled.to_vec(),
    }
}

/// Ask each of the order's lines' supplier, 2 at once; the run goes on
/// with the answers.
fn order(complete: Value) -> Automation {
    tree(json!([
        { "id": "lines", "type": "for_each",
          "config": { "items": "{{_body.lines}}", "concurrency": 2, "complete": complete },
          "do": [
            { "id": "ask", "type": "http", "config": { "url": "https://supplier/{{item.sku}}?n={{index}}" } },
            { "id": "note", "type": "flow/log", "config": { "message": "{{item.sku}} answered {{ask.status}}" } }
          ] },
        { "id": "after", "type": "flow/log", "config": { "message": "{{lines.completed}} answered" } }
    ]))
}

fn context() -> Context {
    let lines = json!({ "lines": [{ "sku": "a" }, { "sku": "b" }, { "sku": "c" }] });
    Context::new(Map::new(), lines, json!({ "type": "manual" }))
}

fn execute(t: &Transition) -> &Execute {
    match &t.then {
        Then::Execute(step) => step,
        other => panic!("expected a step to execute, got {other:?}"),
    }
}

#[test]
fn a_for_each_forks_its_first_items_and_each_item_runs_with_its_own_outputs() {
    let order = order(json!("all"));
    let start = run(&order, state("0", &context()), Input::Start);
    assert_eq!(start.status, RunStatus::Running);
    let Then::Record(NextJob::Fork {
        path,
        branches,
        items,
    }) = &start.then
    else {
        panic!("a for_each forks: {:?}", start.then);
    };
    assert_eq!(path, "0");
    assert_eq!(
        branches,
        &vec![(0, "0.items.0.0".to_owned()), (1, "0.items.1.0".to_owned())],
        "only `concurrency` items start"
    );
    assert_eq!(
        items,
        &Some(ItemsJoin {
            total: 3,
            started: 2,
            concurrency: 2,
            need: 3,
            cancelled: Vec::new(),
        })
    );
    assert_eq!(start.records[0].log, vec!["running 3 items, 2 at once"]);
    let forked = start.state.context.clone();
    assert_eq!(forked.as_value()["lines"]["count"], json!(3));
    // A retry at the step starts over: an earlier attempt's item outputs go.
    let mut retried = forked.clone();
    retried.set_reserved("_item:0:2", Some(json!({ "ask": { "status": 500 } })));
    let again = run(&order, state("0", &retried), Input::Start);
    assert!(again.state.context.reserved("_item:0:2").is_none());

    // Item 1 renders its own item and index.
    let item = run(&order, state("0.items.1.0", &forked), Input::Start);
    assert_eq!(
        execute(&item).config["url"],
        json!("https://supplier/b?n=1")
    );
    // Its call's answer goes to its own entry, and its next step reads it.
    let done = run(&order, state("0.items.1.0", &forked), called(201));
    let records: Vec<String> = done.records.iter().map(|r| r.step_id.clone()).collect();
    assert_eq!(records, ["ask", "note"]);
    assert_eq!(done.records[1].log, vec!["info: b answered 201"]);
    assert_eq!(
        done.then,
        Then::Record(NextJob::BranchDone {
            parallel: "0".into(),
            branch: 1,
            failed: None,
        })
    );
    let after = done.state.context;
    assert!(
        after.as_value().get("ask").is_none(),
        "an item's step does not publish at the top, where other items would overwrite it"
    );
    assert_eq!(
        after.as_value()["_item:0:1"],
        json!({ "ask": { "status": 201 }, "note": {} })
    );
}

#[test]
fn the_join_gives_the_results_in_item_order_and_the_run_goes_on() {
    let order = order(json!("all"));
    let mut context = run(&order, state("0", &context()), Input::Start)
        .state
        .context;
    for (n, status) in [(2, 202), (0, 200), (1, 201)] {
        let path = format!("0.items.{n}.0");
        context = run(&order, state(&path, &context), called(status))
            .state
            .context;
    }
    let t = run(&order, state("0", &context), joined(3, &[2, 0, 1], &[]));
    assert_eq!(t.status, RunStatus::Completed);
    let output = t.records[0].output.clone().expect("outputs");
    let statuses: Vec<Value> = output["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["ask"]["status"].clone())
        .collect();
    assert_eq!(statuses, [json!(200), json!(201), json!(202)]);
    assert_eq!(output["completed"], json!(3));
    assert_eq!(output["first"], json!(2));
    assert_eq!(t.records[1].log, vec!["info: 3 answered"]);
    assert!(
        !t.state
            .context
            .as_value()
            .as_object()
            .expect("an object")
            .keys()
            .any(|k| k.starts_with("_item:")),
        "the items' entries leave the context"
    );
}

#[test]
fn a_rule_met_while_items_are_in_flight_completes_with_what_is_done() {
    let order = order(json!("any"));
    let start = run(&order, state("0", &context()), Input::Start);
    let Then::Record(NextJob::Fork { items, .. }) = &start.then else {
        panic!("a fork: {:?}", start.then);
    };
    assert_eq!(items.as_ref().map(|i| i.need), Some(1));
    let context = run(
        &order,
        state("0.items.1.0", &start.state.context),
        called(200),
    )
    .state
    .context;
    // Item 1 was done first; item 0 was in flight and the store cancelled it.
    let t = run(&order, state("0", &context), joined(3, &[1], &[0]));
    assert_eq!(t.status, RunStatus::Completed);
    let output = t.records[0].output.clone().expect("outputs");
    assert_eq!(
        output["results"],
        json!([null, { "ask": { "status": 200 }, "note": {} }, null])
    );
    assert_eq!(
        (output["completed"].clone(), output["cancelled"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(t.records[0].log, vec!["1 of 3 items done; 1 cancelled"]);
}

#[test]
fn a_failed_item_fails_its_item_then_the_step() {
    let order = order(json!("all"));
    let forked = run(&order, state("0", &context()), Input::Start)
        .state
        .context;
    let t = run(
        &order,
        state("0.items.2.0", &forked),
        Input::StepFailed {
            error: StepError::terminal("HTTP 404"),
            input: None,
            started_at: NOW_MS,
        },
    );
    assert_eq!(
        t.status,
        RunStatus::Running,
        "an item failing is not the run failing"
    );
    assert_eq!(
        t.then,
        Then::Record(NextJob::BranchDone {
            parallel: "0".into(),
            branch: 2,
            failed: Some("step `ask` failed: HTTP 404".into()),
        })
    );
    let t = run(
        &order,
        state("0", &forked),
        Input::BranchesJoined {
            total: 3,
            failed: Some("item 2 failed: step `ask` failed: HTTP 404".into()),
            done: vec![2],
            cancelled: vec![],
        },
    );
    assert_eq!(t.status, RunStatus::Failed);
    assert_eq!(
        t.error.as_deref(),
        Some("step `lines` failed: item_failed: item 2 failed: step `ask` failed: HTTP 404")
    );
}

#[test]
fn no_items_complete_at_once_and_too_many_fail_clearly() {
    let order = order(json!("all"));
    let none = Context::new(Map::new(), json!({ "lines": [] }), json!({}));
    let t = run(&order, state("0", &none), Input::Start);
    assert_eq!(t.status, RunStatus::Completed);
    assert_eq!(
        t.records[0].output,
        Some(json!({ "count": 0, "results": [], "completed": 0, "cancelled": 0, "first": null }))
    );

    let limited = tree(json!([
        { "id": "lines", "type": "for_each", "config": { "items": "{{_body.lines}}", "maxItems": 2 },
          "do": [ { "id": "ask", "type": "http", "config": {} } ] }
    ]));
    let t = run(&limited, state("0", &context()), Input::Start);
    assert_eq!(t.status, RunStatus::Failed);
    assert!(
        t.error
            .as_deref()
            .is_some_and(|e| e.contains("too_many_items: for_each `lines` got 3 items")),
        "{:?}",
        t.error
    );
}

/// Reserve stock at each supplier, confirm; the first confirmed wins.
fn reserve_first() -> Automation {
    tree(json!([
        { "id": "suppliers", "type": "for_each",
          "config": { "items": ["a", "b", "c"], "complete": "any" },
          "do": [
            { "id": "reserve", "type": "http", "config": { "url": "https://{{item}}/reserve" },
              "compensate": [
                { "id": "release", "type": "http",
                  "config": { "url": "https://{{item}}/release/{{reserve.hold}}" } }
              ] },
            { "id": "confirm", "type": "http", "config": { "url": "https://{{item}}/confirm" } }
          ] },
        { "id": "after", "type": "flow/log", "config": { "message": "{{suppliers.first}} won" } }
    ]))
}

fn reserved(hold: &str) -> Input {
    Input::StepDone {
        outputs: Map::from_iter([("hold".to_owned(), json!(hold))]),
        log: Vec::new(),
        input: None,
        started_at: NOW_MS - 5,
    }
}

#[test]
fn the_cancelled_items_completed_steps_are_undone_before_the_step_completes() {
    let automation = reserve_first();
    let none = Context::new(Map::new(), json!({}), json!({}));
    let mut context = run(&automation, state("0", &none), Input::Start)
        .state
        .context;
    // Every item reserved (2, 0, 1 in that order); item 1 confirmed first.
    for (n, hold) in [(2, "h2"), (0, "h0"), (1, "h1")] {
        let path = format!("0.items.{n}.0");
        let t = run(&automation, state(&path, &context), reserved(hold));
        context = t.state.context;
    }
    context = run(&automation, state("0.items.1.1", &context), called(200))
        .state
        .context;
    let join = run(&automation, state("0", &context), joined(3, &[1], &[0, 2]));
    assert_eq!(join.status, RunStatus::Running);
    let release = execute(&join);
    assert_eq!(
        release.path.to_string(),
        "0.items.0.0.compensate.0",
        "the most recent first"
    );
    assert_eq!(release.config["url"], json!("https://a/release/h0"));

    // A cancel of the run now: what is left of the items' undo goes to the
    // run's compensation, before the winner's reservation.
    let cancel_context = join.state.context.clone();
    assert_eq!(
        tok_core::compensation::cancel_at(&cancel_context).as_deref(),
        Some("0.items.1.0"),
        "the run has its own compensation to do"
    );
    let cancelled = run(
        &automation,
        state("0.items.0.0.compensate.0", &cancel_context),
        Input::Cancel { error: None },
    );
    assert_eq!(cancelled.status, RunStatus::Compensating);
    assert_eq!(
        cancelled.then,
        Then::Record(NextJob::Step {
            path: "0.items.2.0.compensate.0".into(),
            delay_ms: 0
        }),
        "the items' undo left goes first"
    );
    assert_eq!(
        tok_core::compensation::pending(&cancelled.state.context),
        ["0.items.1.0"]
    );
    let mut only_undo = cancel_context;
    tok_core::compensation::forget(&mut only_undo, &["0.items.1.0".to_owned()]);
    assert_eq!(
        tok_core::compensation::cancel_at(&only_undo).as_deref(),
        Some("0.items.2.0"),
        "with nothing else to undo, a cancel still undoes the items' rest"
    );

    let undone = run(&automation, join.state.clone(), called(200));
    assert_eq!(
        undone.then,
        Then::Record(NextJob::Step {
            path: "0.items.2.0.compensate.0".into(),
            delay_ms: 0
        }),
        "the next undo is a call of its own claim"
    );
    let next_claim = state("0.items.2.0.compensate.0", &undone.state.context);
    let next = run(&automation, next_claim, Input::Start);
    let release = execute(&next);
    assert_eq!(release.config["url"], json!("https://c/release/h2"));

    let done = run(&automation, next.state.clone(), called(200));
    assert_eq!(done.status, RunStatus::Completed);
    let records: Vec<(String, String)> = done
        .records
        .iter()
        .map(|r| (r.step_id.clone(), r.status.to_string()))
        .collect();
    assert_eq!(
        records,
        [
            ("release".to_owned(), "completed".to_owned()),
            ("suppliers".to_owned(), "completed".to_owned()),
            ("after".to_owned(), "completed".to_owned()),
        ]
    );
    let output = done.records[1].output.clone().expect("outputs");
    assert_eq!(output["results"][1]["confirm"]["status"], json!(200));
    assert_eq!(output["cancelled"], json!(2));
    assert_eq!(done.records[2].log, vec!["info: 1 won"]);
    assert_eq!(
        tok_core::compensation::pending(&done.state.context),
        ["0.items.1.0"],
        "the winner's reservation stays to undo if the run is undone later"
    );
}
