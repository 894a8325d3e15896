//! A record stores what its claim changed of the run's context, not the
//! whole context: folding the stored changes of a run's records, in order,
//! over the context they started from must give the context the last one
//! ended with, whatever the steps did.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use tok_core::context::{Changes, Context, ContextDelta};

#[derive(Debug, Clone)]
enum Op {
    Publish(String, Vec<(String, i64)>),
    SetReserved(String, Option<i64>),
    Output(i64),
}

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "status", "st_1", "st_2", "_x"]).prop_map(str::to_owned)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (key(), prop::collection::vec((key(), any::<i64>()), 0..4))
            .prop_map(|(id, outputs)| Op::Publish(id, outputs)),
        (
            prop::sample::select(vec!["_compensable", "_escalations", "_y"]),
            prop::option::of(any::<i64>())
        )
            .prop_map(|(k, v)| Op::SetReserved(k.to_owned(), v)),
        any::<i64>().prop_map(Op::Output),
    ]
}

fn run(context: &mut Context, op: &Op) {
    match op {
        Op::Publish(id, outputs) => {
            let outputs: Map<String, Value> =
                outputs.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            context.publish(id, &outputs);
        }
        Op::SetReserved(key, value) => context.set_reserved(key, value.map(|v| json!(v))),
        Op::Output(v) => context.set_output(json!(v)),
    }
}

proptest! {
    #[test]
    fn records_changes_fold_into_the_last_context(
        records in prop::collection::vec(prop::collection::vec(op(), 0..5), 1..8),
    ) {
        let start = json!({"a": 1, "_body": {"k": "v"}, "_escalations": {"0": 1}});
        let mut stored = start.clone();
        let mut live = start;
        for ops in &records {
            // Each record's claim begins from the context as the last
            // record left it, as a continuing job's does.
            let mut context = Context::from_value(live);
            for op in ops {
                run(&mut context, op);
            }
            let keys = context.changed();
            let change = serde_json::to_value(Changes::of(context.as_value(), &keys)).unwrap();
            let delta: ContextDelta = serde_json::from_value(change).unwrap();
            delta.apply(&mut stored);
            live = context.into_value();
            prop_assert_eq!(&stored, &live);
        }
    }
}
