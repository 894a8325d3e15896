//! Tests of the sandbox: what a script may do, and what stops it.

use super::*;
use serde_json::json;

fn request(source: &str, input: Value) -> Request {
    Request {
        source: source.to_owned(),
        input: input.to_string(),
        timeout_ms: 100,
        memory_limit: 32 * 1024 * 1024,
        cache_key: format!("test:{source}"),
        recycle_after: 100,
        max_output_bytes: 64 * 1024,
    }
}

impl Sandbox {
    fn run_ok(&mut self, request: &Request) -> Response {
        self.run(request).unwrap()
    }
}

fn failure(response: Response) -> Failure {
    match response.outcome {
        Outcome::Error(f) => f,
        Outcome::Ok(v) => panic!("expected a failure, got {v:?}"),
    }
}

fn ok(response: Response) -> Map<String, Value> {
    match response.outcome {
        Outcome::Ok(v) => v,
        Outcome::Error(f) => panic!("expected an output, got {f:?}"),
    }
}

#[test]
fn a_transform_returns_its_object() {
    let mut sandbox = Sandbox::new().unwrap();
    let source = "function main(input) {\n  const total = input.items.reduce((a, i) => a + i.price * i.qty, 0);\n  return { total, count: input.items.length, tag: `order-${input.id}` };\n}";
    let input = json!({"id": 7, "items": [{"price": 2.5, "qty": 2}, {"price": 1, "qty": 3}]});
    let out = ok(sandbox.run_ok(&request(source, input)));
    assert_eq!(
        Value::Object(out),
        json!({"total": 8, "count": 2, "tag": "order-7"})
    );
}

#[test]
fn arrow_functions_bound_with_const_count_as_main() {
    let mut sandbox = Sandbox::new().unwrap();
    let out = ok(sandbox.run_ok(&request(
        "const main = (input) => ({ doubled: input.n * 2 });",
        json!({"n": 21}),
    )));
    assert_eq!(out["doubled"], json!(42));
}

#[test]
fn a_thrown_error_carries_its_message_and_line() {
    let mut sandbox = Sandbox::new().unwrap();
    let source =
        "function main(input) {\n  const x = input.n + 1;\n  throw new TypeError('no ' + x);\n}";
    let f = failure(sandbox.run_ok(&request(source, json!({"n": 1}))));
    assert_eq!(f.kind, FailureKind::Script);
    assert_eq!(f.message, "TypeError: no 2");
    assert_eq!(f.line, Some(3));
}

#[test]
fn an_error_inside_a_builtin_points_at_the_calling_line() {
    let mut sandbox = Sandbox::new().unwrap();
    let source = "function main(input) {\n\n  return { v: input.missing.deeper };\n}";
    let f = failure(sandbox.run_ok(&request(source, json!({}))));
    assert_eq!(f.kind, FailureKind::Script);
    assert!(f.message.starts_with("TypeError:"), "{}", f.message);
    assert_eq!(f.line, Some(3));
}

#[test]
fn syntax_errors_and_missing_main_are_script_errors() {
    let mut sandbox = Sandbox::new().unwrap();
    let f = failure(sandbox.run_ok(&request(
        "function main(input) {\n  return { a: 1 \n}",
        json!({}),
    )));
    assert_eq!(f.kind, FailureKind::Script);
    assert!(f.message.starts_with("SyntaxError"), "{}", f.message);
    assert!(f.line.is_some(), "{f:?}");

    let f = failure(sandbox.run_ok(&request("function handler(x) { return x }", json!({}))));
    assert_eq!(f.kind, FailureKind::Script);
    assert!(f.message.contains("function main(input)"), "{}", f.message);

    let f = failure(sandbox.run_ok(&request(
        "function main() { throw 'plain string' }",
        json!({}),
    )));
    assert_eq!(f.message, "uncaught plain string");
}

#[test]
fn a_non_object_return_names_what_was_returned() {
    let mut sandbox = Sandbox::new().unwrap();
    let cases = [
        ("function main() { return 42 }", "a number (42)"),
        ("function main() { return 'hi' }", "a string (\"hi\")"),
        ("function main() { return [1, 2] }", "an array"),
        ("function main() { return null }", "null"),
        ("function main() { }", "nothing (undefined)"),
        ("async function main() { return {} }", "a Promise"),
    ];
    for (source, what) in cases {
        let f = failure(sandbox.run_ok(&request(source, json!({}))));
        assert_eq!(f.kind, FailureKind::InvalidOutput, "{source}");
        assert!(
            f.message.contains(&format!("it returned {what}")),
            "{source}: {}",
            f.message
        );
    }
    let f = failure(sandbox.run_ok(&request(
        "function main() { return { toJSON() { return 5 } } }",
        json!({}),
    )));
    assert_eq!(f.kind, FailureKind::InvalidOutput);
    assert!(f.message.contains("a number"), "{}", f.message);
    let f = failure(sandbox.run_ok(&request(
        "function main() { const o = {}; o.self = o; return o }",
        json!({}),
    )));
    assert_eq!(f.kind, FailureKind::InvalidOutput);
    assert!(
        f.message.contains("cannot be turned into JSON"),
        "{}",
        f.message
    );
}

#[test]
fn oversized_output_is_refused() {
    let mut sandbox = Sandbox::new().unwrap();
    let f = failure(sandbox.run_ok(&request(
        "function main() { return { big: 'x'.repeat(70000) } }",
        json!({}),
    )));
    assert_eq!(f.kind, FailureKind::InvalidOutput);
    assert!(f.message.contains("at most 65536"), "{}", f.message);
}

#[test]
fn an_endless_loop_is_interrupted_at_its_deadline() {
    let mut sandbox = Sandbox::new().unwrap();
    let started = Instant::now();
    let f = failure(sandbox.run_ok(&request("function main() { while (true) {} }", json!({}))));
    assert_eq!(f.kind, FailureKind::Timeout);
    assert_eq!(f.message, "script ran longer than 100 ms and was stopped");
    assert!(started.elapsed() < Duration::from_secs(1));
    // Even `catch` cannot swallow the interrupt.
    let f = failure(sandbox.run_ok(&request(
        "function main() { for (;;) { try { while (true) {} } catch (e) {} } }",
        json!({}),
    )));
    assert_eq!(f.kind, FailureKind::Timeout);
    // And the sandbox still works afterwards.
    let out = ok(sandbox.run_ok(&request("function main() { return { a: 1 } }", json!({}))));
    assert_eq!(out["a"], json!(1));
}

#[test]
fn a_memory_bomb_hits_the_limit() {
    let mut sandbox = Sandbox::new().unwrap();
    let mut bomb = request(
        "function main() { const a = []; while (true) a.push('x'.repeat(100000) + a.length); }",
        json!({}),
    );
    // Long enough that the heap limit, not the deadline, stops it.
    bomb.timeout_ms = 1000;
    let f = failure(sandbox.run_ok(&bomb));
    assert_eq!(f.kind, FailureKind::Memory);
    assert_eq!(
        f.message,
        "script used more than 32 MiB of memory and was stopped"
    );
    let out = ok(sandbox.run_ok(&request("function main() { return { a: 1 } }", json!({}))));
    assert_eq!(out["a"], json!(1));
}

#[test]
fn deep_recursion_is_a_script_error() {
    let mut sandbox = Sandbox::new().unwrap();
    let f = failure(sandbox.run_ok(&request(
        "function f(n) { return f(n + 1) + 1 }\nfunction main() { return { v: f(0) } }",
        json!({}),
    )));
    assert_eq!(f.kind, FailureKind::Script);
    assert!(f.message.contains("call stack"), "{}", f.message);
    assert_eq!(f.line, Some(1));
}

#[test]
fn console_lines_are_captured_and_capped() {
    let mut sandbox = Sandbox::new().unwrap();
    let response = sandbox.run_ok(&request(
        "function main(input) { console.log('got', input.n, {a: 1}); for (let i = 0; i < 60; i++) console.warn(i); return {} }",
        json!({"n": 5}),
    ));
    assert_eq!(response.logs[0], "got 5 [object Object]");
    assert_eq!(response.logs.len(), MAX_LOG_LINES + 1);
    assert_eq!(response.logs[MAX_LOG_LINES], "… 11 more lines not kept");
    let response = sandbox.run_ok(&request("function main() { return {} }", json!({})));
    assert!(response.logs.is_empty());
}

#[test]
fn contexts_are_reused_per_key_recycled_and_never_shared() {
    let mut sandbox = Sandbox::new().unwrap();
    let source = "globalThis.n = (globalThis.n || 0) + 1;\nfunction main() { globalThis.calls = (globalThis.calls || 0) + 1; return { n, calls } }";
    let mut req = request(source, json!({}));
    req.recycle_after = 3;
    let calls: Vec<Value> = (0..4)
        .map(|_| Value::Object(ok(sandbox.run_ok(&req))))
        .collect();
    // Compiled once for three runs, then recycled: a fresh context.
    assert_eq!(
        calls,
        vec![
            json!({"n": 1, "calls": 1}),
            json!({"n": 1, "calls": 2}),
            json!({"n": 1, "calls": 3}),
            json!({"n": 1, "calls": 1}),
        ]
    );
    // The same source under another key (another tenant) starts clean.
    req.cache_key = "other-tenant".into();
    assert_eq!(
        Value::Object(ok(sandbox.run_ok(&req))),
        json!({"n": 1, "calls": 1})
    );
    // Builtins changed by one key do not leak into another.
    let mut evil = request(
        "Array.prototype.map = function () { return 'hacked' };\nfunction main() { return {} }",
        json!({}),
    );
    evil.cache_key = "evil".into();
    ok(sandbox.run_ok(&evil));
    let out = ok(sandbox.run_ok(&request(
        "function main() { return { m: [1, 2].map(x => x * 2) } }",
        json!({}),
    )));
    assert_eq!(out["m"], json!([2, 4]));
}

#[test]
fn promise_callbacks_never_run_and_do_not_pile_up() {
    let mut sandbox = Sandbox::new().unwrap();
    let source = "function main() { Promise.resolve().then(() => { while (true) {} }); return { queued: true } }";
    for _ in 0..3 {
        let response = sandbox.run_ok(&request(source, json!({})));
        assert_eq!(ok(response)["queued"], json!(true));
        assert!(!sandbox.runtime.is_job_pending());
    }
}

#[test]
fn top_level_code_runs_under_the_deadline_too() {
    let mut sandbox = Sandbox::new().unwrap();
    let f = failure(sandbox.run_ok(&request(
        "while (true) {}\nfunction main() { return {} }",
        json!({}),
    )));
    assert_eq!(f.kind, FailureKind::Timeout);
    let f = failure(sandbox.run_ok(&request(
        "function main() { return { get slow() { for (;;) {} } } }",
        json!({}),
    )));
    assert_eq!(f.kind, FailureKind::Timeout);
}

#[test]
fn the_cache_holds_a_bounded_number_of_contexts() {
    let mut sandbox = Sandbox::new().unwrap();
    for i in 0..(MAX_CONTEXTS + 10) {
        let mut req = request("function main() { return {} }", json!({}));
        req.cache_key = format!("k{i}");
        ok(sandbox.run_ok(&req));
    }
    assert_eq!(sandbox.cache.len(), MAX_CONTEXTS);
}

#[test]
fn the_line_protocol_answers_each_request() {
    let requests = [
        serde_json::to_string(&request(
            "function main(i) { return { v: i.v } }",
            json!({"v": 1}),
        ))
        .unwrap(),
        "this is not json".to_owned(),
        serde_json::to_string(&request("function main() { return 1 }", json!({}))).unwrap(),
    ]
    .join("\n");
    let mut out = Vec::new();
    serve(requests.as_bytes(), &mut out).unwrap();
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0], json!({"ready": true}));
    assert_eq!(lines[1], json!({"ok": {"v": 1}, "logs": []}));
    assert_eq!(lines[2]["error"]["kind"], json!("protocol"));
    assert_eq!(lines[3]["error"]["kind"], json!("invalid_output"));
    assert_eq!(lines.len(), 4);
}
