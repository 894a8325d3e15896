//! A property of the decider over composed runs: random trees of calls,
//! conditions, `parallel` branches, `for_each` items and `repeat`s, driven
//! through `advance`
//! with random outcomes (done, retryable or terminal failures) and random
//! interleavings of the run's jobs, as the store would carry them out (a
//! fork parks its job and starts one per branch; a branch's end counts on
//! the parked job, a failure cancels its siblings; branches' publications
//! merge into the run's context; a `for_each` item's end starts the next
//! item or, once its rule is met, cancels the items still running).
//! Whatever happens, the run ends (no branch is lost: a run never waits
//! with nothing left to run), no parallel step joins twice or hears of a
//! branch twice, no `for_each` runs more items at once than its
//! concurrency, a completed run completed every branch it forked (and as
//! many items as each `for_each` needed), and the run never executes more
//! than `MAX_ACTIONS`.

use std::collections::HashMap;

use jiff::Timestamp;
use proptest::collection::vec;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use tok_core::advance::{Env, Input, RunState, StepClass, Then, advance};
use tok_core::context::Context;
use tok_core::definition::Automation;
use tok_core::error::StepError;
use tok_core::limits::MAX_ACTIONS;
use tok_core::path::FlowPath;
use tok_core::run::{NextJob, Resume, RunStatus, StepStatus};

/// A generated step.
#[derive(Debug, Clone)]
enum Node {
    /// A `set` step.
    Set,
    /// An `http` step: the outcome is drawn when it runs.
    Call,
    /// A condition on the run's input `n`.
    Cond {
        above: i64,
        then: Vec<Node>,
        else_: Vec<Node>,
    },
    Parallel(Vec<Vec<Node>>),
    /// A call (and `body`) for each of `items` items, `concurrency` at
    /// once, complete when all, any or `atLeast` of them are done.
    ForEach {
        items: usize,
        concurrency: usize,
        complete: Value,
        body: Vec<Node>,
    },
    /// Repeats a call (and `body`) until the call answers `ok`.
    Repeat {
        max: u64,
        body: Vec<Node>,
    },
}

fn node() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![2 => Just(Node::Set), 3 => Just(Node::Call)];
    leaf.prop_recursive(3, 40, 4, |inner| {
        prop_oneof![
            3 => Just(Node::Call),
            2 => (0i64..10, vec(inner.clone(), 0..3), vec(inner.clone(), 0..3))
                .prop_map(|(above, then, else_)| Node::Cond { above, then, else_ }),
            3 => vec(vec(inner.clone(), 0..3), 1..4).prop_map(Node::Parallel),
            2 => (
                0usize..5,
                1usize..4,
                prop_oneof![Just(json!("all")), Just(json!("any")), Just(json!({ "atLeast": 1 }))],
                vec(inner.clone(), 0..2),
            )
                .prop_map(|(items, concurrency, complete, body)| Node::ForEach {
                    items,
                    concurrency,
                    complete,
                    body,
                }),
            2 => (prop_oneof![Just(1u64), Just(3), Just(1000)], vec(inner, 0..2))
                .prop_map(|(max, body)| Node::Repeat { max, body }),
        ]
    })
}

fn build(nodes: &[Node], next_id: &mut usize) -> Vec<Value> {
    nodes
        .iter()
        .map(|node| {
            *next_id += 1;
            let id = format!("s{next_id}");
            match node {
                Node::Set => json!({ "id": id, "type": "set", "config": { "values": { "v": 1 } } }),
                Node::Call => json!({ "id": id, "type": "http", "config": { "url": "https://x" } }),
                Node::Cond { above, then, else_ } => json!({
                    "id": id, "type": "condition",
                    "rules": [{ "field": "n", "operator": "gt", "value": above }],
                    "then": build(then, next_id), "else": build(else_, next_id)
                }),
                Node::Parallel(branches) => {
                    let branches: Vec<Value> = branches
                        .iter()
                        .map(|b| Value::Array(build(b, next_id)))
                        .collect();
                    json!({ "id": id, "type": "parallel", "branches": branches })
                }
                Node::ForEach {
                    items,
                    concurrency,
                    complete,
                    body,
                } => {
                    let mut steps = vec![
                        json!({ "id": format!("{id}_call"), "type": "http", "config": { "url": "https://x/{{item}}" } }),
                    ];
                    steps.extend(build(body, next_id));
                    json!({
                        "id": id, "type": "for_each",
                        "config": { "items": (0..*items).collect::<Vec<_>>(), "concurrency": concurrency,
                                    "complete": complete },
                        "do": steps
                    })
                }
                Node::Repeat { max, body } => {
                    *next_id += 1;
                    let probe = format!("s{next_id}");
                    let mut steps = vec![
                        json!({ "id": probe, "type": "http", "config": { "url": "https://x" } }),
                    ];
                    steps.extend(build(body, next_id));
                    json!({
                        "id": id, "type": "repeat",
                        "config": { "until": { "rules": [{ "field": format!("{probe}.ok"), "operator": "eq", "value": true }] },
                                    "maxIterations": max },
                        "do": steps
                    })
                }
            }
        })
        .collect()
}

/// One job of the simulated queue.
#[derive(Debug, Clone)]
struct Job {
    path: String,
    attempt: u32,
    resume: Option<Resume>,
    ready: bool,
}

/// What the simulation saw, for the properties.
#[derive(Debug, Default)]
struct Seen {
    /// Forks by parallel path: how many branches each fork started.
    forks: HashMap<String, Vec<usize>>,
    /// Joins by parallel path: the branches done at each join (and failed).
    joins: HashMap<String, Vec<(usize, bool)>>,
    /// The paths' beginnings of the `for_each` items cancelled when their
    /// step's rule was met: what they forked never joins.
    cancelled: Vec<String>,
}

fn kinds(kind: &str) -> StepClass {
    match kind {
        "http" => StepClass::External,
        _ => StepClass::InTransaction,
    }
}

/// Runs the tree to its end; returns the run's final status, its actions
/// and what it saw. Panics (failing the property) on a broken invariant.
fn drive(automation: &Automation, seed: u64, n: i64, start_actions: i32) -> (RunStatus, i32, Seen) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut context = Context::new(
        Map::from_iter([("n".to_owned(), json!(n))]),
        json!({}),
        json!({}),
    );
    let mut actions = start_actions;
    let mut jobs = vec![Job {
        path: "0".into(),
        attempt: 1,
        resume: None,
        ready: true,
    }];
    let mut seen = Seen::default();
    for _ in 0..50_000 {
        let ready: Vec<usize> = (0..jobs.len()).filter(|&i| jobs[i].ready).collect();
        assert!(
            !ready.is_empty(),
            "the run waits with nothing left to run (a lost branch): {jobs:?}"
        );
        let job = jobs.remove(ready[rng.random_range(0..ready.len())]);
        let claimed_actions = actions;
        let path: FlowPath = job.path.parse().expect("a job's path");
        let mut state = RunState::at(path, job.attempt, context.clone(), actions);
        let mut input = Input::from(job.resume.clone());
        let mut records = Vec::new();
        let (status, next, end_state) = loop {
            let mut step_rng = StdRng::seed_from_u64(rng.random());
            let mut env = Env {
                now: Timestamp::from_millisecond(1_780_000_000_000).unwrap(),
                kinds: &kinds,
                rng: &mut step_rng,
                retries: &|_| None,
            };
            let t = advance(automation, state, input, &mut env);
            state = t.state.clone();
            records.extend(t.records);
            match t.then {
                Then::Execute(_) => {
                    let roll: u32 = rng.random_range(0..100);
                    input = if roll < 6 {
                        Input::StepFailed {
                            error: StepError::terminal("refused"),
                            input: None,
                            started_at: 0,
                        }
                    } else if roll < 16 {
                        Input::StepFailed {
                            error: StepError::retryable("busy"),
                            input: None,
                            started_at: 0,
                        }
                    } else {
                        let ok = rng.random_bool(0.5);
                        Input::StepDone {
                            outputs: Map::from_iter([("ok".to_owned(), json!(ok))]),
                            log: Vec::new(),
                            input: None,
                            started_at: 0,
                        }
                    };
                    continue;
                }
                Then::Record(next) => break (t.status, next, t.state),
            }
        };
        if tok_core::parallel::in_branch(&job.path) {
            // A branch's record adds its actions and writes its steps'
            // outputs over the run's context, as the store does.
            actions += end_state.actions - claimed_actions;
            for record in &records {
                if let (StepStatus::Completed, Some(Value::Object(outputs))) =
                    (record.status, &record.output)
                {
                    tok_core::for_each::publish(
                        &mut context,
                        &record.path,
                        &record.step_id,
                        outputs,
                    );
                }
            }
        } else {
            actions = end_state.actions;
            context = end_state.context.clone();
        }
        assert!(
            actions <= MAX_ACTIONS as i32,
            "{actions} actions, more than {MAX_ACTIONS}"
        );
        if status.is_final() {
            return (status, actions, seen);
        }
        match next {
            NextJob::Step { path, .. } => jobs.push(Job {
                path,
                attempt: 1,
                resume: None,
                ready: true,
            }),
            NextJob::Retry { path, attempts, .. } => jobs.push(Job {
                path,
                attempt: attempts as u32 + 1,
                resume: None,
                ready: true,
            }),
            NextJob::Fork {
                path,
                branches,
                items,
            } => {
                let total = items.as_ref().map_or(branches.len(), |items| items.total);
                let need = items.as_ref().map_or(branches.len(), |items| items.need);
                seen.forks.entry(path.clone()).or_default().push(need);
                jobs.push(Job {
                    path,
                    attempt: 1,
                    resume: Some(Resume::Branches {
                        total,
                        done: Vec::new(),
                        failed: None,
                        items,
                    }),
                    ready: false,
                });
                for (_, first) in branches {
                    jobs.push(Job {
                        path: first,
                        attempt: 1,
                        resume: None,
                        ready: true,
                    });
                }
            }
            NextJob::BranchDone {
                parallel,
                branch,
                failed,
            } => {
                let Some(parked) = jobs.iter_mut().find(|j| j.path == parallel) else {
                    panic!("branch {branch} of {parallel} ended with no parallel step to join");
                };
                let Some(Resume::Branches {
                    total,
                    done,
                    failed: before,
                    items,
                }) = &mut parked.resume
                else {
                    panic!("the parallel job at {parallel} is not parked on branches");
                };
                assert!(!parked.ready, "a branch of {parallel} ended after its join");
                assert!(before.is_none(), "a branch ended after another failed");
                assert!(
                    !done.contains(&branch),
                    "branch {branch} of {parallel} ended twice"
                );
                done.push(branch);
                // The next item to start, as the store starts it.
                let mut next_item = None;
                let over = match items {
                    _ if failed.is_some() => true,
                    None => done.len() == *total,
                    Some(items) if done.len() >= items.need => {
                        items.cancelled =
                            (0..items.started).filter(|n| !done.contains(n)).collect();
                        true
                    }
                    Some(items) => {
                        if items.started < *total {
                            next_item = Some((items.started, items.concurrency));
                            items.started += 1;
                        }
                        false
                    }
                };
                let inside = match items {
                    Some(_) => format!("{parallel}.items."),
                    None => format!("{parallel}.branches."),
                };
                if over {
                    parked.ready = true;
                    *before = failed.clone();
                    let record = (done.len(), failed.is_some());
                    seen.joins.entry(parallel.clone()).or_default().push(record);
                    if let Some(items) = items {
                        let gone = items.cancelled.iter().map(|n| format!("{inside}{n}."));
                        seen.cancelled.extend(gone);
                    }
                    if failed.is_some() || inside.ends_with(".items.") {
                        jobs.retain(|j| !j.path.starts_with(&inside));
                    }
                }
                if let Some((n, concurrency)) = next_item {
                    jobs.push(Job {
                        path: tok_core::for_each::item_start(&parallel, n),
                        attempt: 1,
                        resume: None,
                        ready: true,
                    });
                    let mut running: Vec<&str> = jobs
                        .iter()
                        .filter_map(|j| j.path.strip_prefix(inside.as_str()))
                        .filter_map(|rest| rest.split('.').next())
                        .collect();
                    running.sort();
                    running.dedup();
                    assert!(
                        running.len() <= concurrency,
                        "{parallel} runs items {running:?} at once, more than {concurrency}"
                    );
                }
            }
            NextJob::Done => panic!("a job ended with a run that is not over"),
            other => panic!("unexpected next move {other:?}"),
        }
    }
    panic!("the run did not end within 50000 claims");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn composed_runs_end_join_once_and_stay_within_their_actions(
        nodes in vec(node(), 1..4),
        seed in any::<u64>(),
        n in 0i64..10,
        start_actions in prop_oneof![Just(0i32), 900i32..1000],
    ) {
        let steps = build(&nodes, &mut 0);
        let automation = Automation::from_json(&json!({
            "name": "p", "trigger": { "kind": "manual" }, "steps": steps,
            "settings": { "retry": { "max_attempts": 2, "backoff": ["1s"] } }
        }).to_string()).expect("a definition");
        let (status, actions, seen) = drive(&automation, seed, n, start_actions);
        prop_assert!(status.is_final());
        prop_assert!(actions <= MAX_ACTIONS as i32);
        for (parallel, forks) in &seen.forks {
            let joins = seen.joins.get(parallel).map_or(0, Vec::len);
            prop_assert!(joins <= forks.len(), "{parallel} joined {joins} times for {} forks", forks.len());
            let cancelled = seen.cancelled.iter().any(|item| parallel.starts_with(item.as_str()));
            if status == RunStatus::Completed && !cancelled {
                prop_assert_eq!(joins, forks.len(), "{} forked but never joined", parallel);
                for ((done, failed), total) in seen.joins[parallel].iter().zip(forks) {
                    prop_assert!(!failed && done == total, "{parallel}: {done} of {total} branches");
                }
            }
        }
    }
}
