//! Property tests of tok-core's pure decisions: paths survive text, `next`
//! walks any tree exactly like a straightforward recursive interpreter,
//! templates never panic, and retry jitter stays within ±10 %.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Map, Value, json};
use tok_core::flow::{first, next, step_at};
use tok_core::template::{check, render};
use tok_core::{Branch, FlowPath, Next, RetryPolicy, Step, TemplateError};

fn branch() -> impl Strategy<Value = Branch> {
    prop_oneof![
        Just(Branch::Then),
        Just(Branch::Else),
        (0usize..1000).prop_map(Branch::Do),
        (0usize..10).prop_map(Branch::Parallel),
    ]
}

fn flow_path() -> impl Strategy<Value = FlowPath> {
    (0usize..1000, vec((branch(), 0usize..1000), 0..6)).prop_map(|(first, hops)| {
        let mut p = FlowPath::root(first);
        for (b, i) in hops {
            p.push(b, i);
        }
        p
    })
}

proptest! {
    #[test]
    fn flow_path_display_and_from_str_round_trip(p in flow_path()) {
        let text = p.to_string();
        prop_assert_eq!(text.parse::<FlowPath>().unwrap(), p);
    }

    #[test]
    fn any_parsable_text_is_canonical(s in "[0-9a-z.]{0,20}") {
        if let Ok(p) = s.parse::<FlowPath>() {
            prop_assert_eq!(p.to_string(), s);
        }
    }
}

/// A generated tree: what each condition answers on each visit, how many
/// items each loop gets.
#[derive(Debug, Clone)]
enum Node {
    Plain,
    End,
    Cond {
        results: Vec<bool>,
        then: Vec<Node>,
        else_: Vec<Node>,
    },
    Loop {
        count: usize,
        body: Vec<Node>,
    },
}

fn node() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![6 => Just(Node::Plain), 1 => Just(Node::End)];
    leaf.prop_recursive(4, 48, 4, |inner| {
        prop_oneof![
            3 => Just(Node::Plain),
            2 => (vec(any::<bool>(), 1..4), vec(inner.clone(), 0..4), vec(inner.clone(), 0..4))
                .prop_map(|(results, then, else_)| Node::Cond { results, then, else_ }),
            2 => (0usize..4, vec(inner, 0..4)).prop_map(|(count, body)| Node::Loop { count, body }),
        ]
    })
}

#[derive(Default)]
struct Answers {
    results: HashMap<String, Vec<bool>>,
    counts: HashMap<String, usize>,
}

fn build(nodes: &[Node], answers: &mut Answers, next_id: &mut usize) -> Vec<Step> {
    nodes
        .iter()
        .map(|n| {
            *next_id += 1;
            let id = format!("s{next_id}");
            match n {
                Node::Plain => Step::new(id, "set", Value::Null),
                Node::End => Step::new(id, "end", Value::Null),
                Node::Cond {
                    results,
                    then,
                    else_,
                } => {
                    answers.results.insert(id.clone(), results.clone());
                    let mut s = Step::new(id, "condition", Value::Null);
                    s.then = build(then, answers, next_id);
                    s.else_ = build(else_, answers, next_id);
                    s
                }
                Node::Loop { count, body } => {
                    answers.counts.insert(id.clone(), *count);
                    let mut s = Step::new(id, "loop", Value::Null);
                    s.do_ = build(body, answers, next_id);
                    s
                }
            }
        })
        .collect()
}

/// The outputs a step publishes on its `visit`-th execution (0-based).
fn outputs(step: &Step, answers: &Answers, visit: usize) -> Value {
    match step.kind.as_str() {
        "condition" => {
            let r = &answers.results[&step.id];
            json!({"result": r[visit % r.len()]})
        }
        "loop" => json!({"count": answers.counts[&step.id]}),
        _ => json!({}),
    }
}

/// The reference: a direct recursive interpreter. Returns false once an `end`
/// stopped the run.
fn interpret(
    steps: &[Step],
    prefix: &str,
    answers: &Answers,
    visits: &mut HashMap<String, usize>,
    out: &mut Vec<String>,
) -> bool {
    for (i, step) in steps.iter().enumerate() {
        let path = if prefix.is_empty() {
            i.to_string()
        } else {
            format!("{prefix}.{i}")
        };
        out.push(path.clone());
        let visit = visits.entry(step.id.clone()).or_insert(0);
        let published = outputs(step, answers, *visit);
        *visit += 1;
        let keep_going = match step.kind.as_str() {
            "end" => false,
            "condition" => {
                let (word, list) = if published["result"] == json!(true) {
                    ("then", &step.then)
                } else {
                    ("else", &step.else_)
                };
                interpret(list, &format!("{path}.{word}"), answers, visits, out)
            }
            "loop" => {
                let count = answers.counts[&step.id];
                (0..count).all(|it| {
                    interpret(&step.do_, &format!("{path}.do.{it}"), answers, visits, out)
                })
            }
            _ => true,
        };
        if !keep_going {
            return false;
        }
    }
    true
}

proptest! {
    #[test]
    fn next_walks_any_tree_like_the_reference(nodes in vec(node(), 0..6)) {
        let mut answers = Answers::default();
        let steps = build(&nodes, &mut answers, &mut 0);

        let mut expected = Vec::new();
        interpret(&steps, "", &answers, &mut HashMap::new(), &mut expected);

        let mut ctx = Map::new();
        let mut visits: HashMap<String, usize> = HashMap::new();
        let mut executed = Vec::new();
        let mut cursor = first(&steps);
        while let Next::Step(path) = cursor {
            prop_assert!(
                executed.len() < expected.len(),
                "more steps than expected: {:?} then {}", executed, path
            );
            let step = step_at(&steps, &path).expect("next only returns existing paths");
            executed.push(path.to_string());
            let visit = visits.entry(step.id.clone()).or_insert(0);
            ctx.insert(step.id.clone(), outputs(step, &answers, *visit));
            *visit += 1;
            cursor = next(&steps, &path, &Value::Object(ctx.clone())).unwrap();
        }
        prop_assert_eq!(&executed, &expected);
        let distinct: HashSet<&String> = executed.iter().collect();
        prop_assert_eq!(distinct.len(), executed.len(), "a path was visited twice");
    }

    #[test]
    fn templates_never_panic_and_render_agrees_with_check(s in "\\PC{0,40}", t in "[a-z{} .0-9]{0,30}") {
        let scope = json!({"a": {"b": [1, "x"]}, "c": "text", "0": null});
        for template in [s.as_str(), t.as_str()] {
            match (check(template), render(template, &scope)) {
                (Ok(()), Ok(_) | Err(TemplateError::Missing { .. })) => {}
                (Err(syntax), Err(rendered)) => prop_assert_eq!(syntax, rendered),
                (checked, rendered) => prop_assert!(
                    false,
                    "check {:?} and render {:?} disagree on {:?}", checked, rendered, template
                ),
            }
        }
    }

    #[test]
    fn retry_delays_stay_within_ten_percent_of_the_schedule(
        backoff_ms in vec(0u64..10_000_000_000, 0..6),
        max_attempts in 1u32..=10,
        failed_attempt in 1u32..13,
        seed in any::<u64>(),
    ) {
        let policy = RetryPolicy {
            max_attempts,
            backoff: backoff_ms.iter().map(|&ms| Duration::from_millis(ms)).collect(),
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let delay = policy.delay_after(failed_attempt, &mut rng);
        if failed_attempt >= max_attempts {
            prop_assert_eq!(delay, None);
        } else {
            let i = (failed_attempt as usize - 1).min(policy.backoff.len().saturating_sub(1));
            let base = policy.backoff.get(i).copied().unwrap_or(Duration::ZERO);
            let d = delay.expect("attempts remain");
            prop_assert!(d >= base - base / 10 && d <= base + base / 10, "{:?} vs {:?}", d, base);
        }
    }
}
