//! `tok test` as a real process: an automation that waits three days, calls
//! a service and sets a field completes at once on the virtual clock and
//! prints every step; a recorded 503 is retried and the next recorded
//! answer used; a recorded 402 fails the run and the process (exit 1)
//! with the step's error; a call with no recorded answer says which; and
//! `--record` calls a real local service once and writes what it answered,
//! which a later test replays without it; an `mcp` tool's recorded result
//! is its step's output, or its error when the tool marked it one. With
//! `--arrivals`, a run that waits for a signal and an approval (and
//! escalates while it waits) gets them at their times and completes; an
//! arrival that never matches what the run waits for, or a decision with
//! no approval pending at its time, is said and fails the test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

/// A directory of the test's files, removed at the end.
struct Files(PathBuf);

impl Files {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("tok-test-command-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, value: &Value) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, serde_json::to_string_pretty(value).unwrap()).unwrap();
        path.display().to_string()
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A source, and an automation on it that waits three days, charges the
/// order at `url` and sets a field.
fn automation(url: &str) -> Value {
    json!([
        { "kind": "source", "name": "eshop",
          "params": [{ "name": "orderId", "path": "order.id", "type": "string", "required": true }] },
        { "kind": "automation", "name": "Follow up",
          "trigger": { "kind": "webhook", "source": "eshop" },
          "steps": [
            { "id": "st_wait", "type": "wait", "config": { "duration": "3d" } },
            { "id": "st_charge", "type": "http",
              "config": { "method": "POST", "url": url, "body": { "order": "{{orderId}}" } } },
            { "id": "st_set", "type": "set",
              "config": { "values": { "followed": "{{orderId}}" } } }
          ] }
    ])
}

fn tok_test(files: &Files, args: &[&str], env: &[(&str, &str)]) -> Output {
    let automation = files.path("automation.json");
    let event = files.write("event.json", &json!({ "order": { "id": "A-17" } }));
    Command::new(env!("CARGO_BIN_EXE_tok"))
        .args(["test", &automation, "--event", &event])
        .args(args)
        .env_remove("TOK_OUTBOUND_ALLOW")
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run tok test")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn explain(output: &Output) -> String {
    format!(
        "exit {}; stdout:\n{}\nstderr:\n{}",
        output.status,
        stdout(output),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_three_day_wait_passes_at_once_and_every_step_is_printed() {
    let files = Files::new("wait");
    files.write(
        "automation.json",
        &automation("https://pay.example/charges"),
    );
    let responses = files.write(
        "responses.json",
        &json!({ "responses": [
            { "step": "st_charge", "status": 503, "body": "busy" },
            { "step": "st_charge", "status": 201, "body": { "id": "ch_1" } }
        ] }),
    );
    let output = tok_test(&files, &["--responses", &responses], &[]);
    assert!(output.status.success(), "{}", explain(&output));
    let out = stdout(&output);
    assert!(
        out.contains("\"Follow up\" (version 1): completed"),
        "{out}"
    );
    assert!(out.contains("completed  0 st_wait (wait)"), "{out}");
    assert!(out.contains("log: Wait until"), "{out}");
    // The 503 was retried after its backoff, on the virtual clock too.
    assert!(
        out.contains("completed  1 st_charge (http, attempt 2)"),
        "{out}"
    );
    assert!(out.contains(r#""body":{"id":"ch_1"}"#), "{out}");
    assert!(out.contains("completed  2 st_set (set)"), "{out}");
    assert!(out.contains(r#"output: {"followed":"A-17"}"#), "{out}");
    assert!(out.contains("3d 0h on the run's clock"), "{out}");
}

#[test]
fn a_failing_recorded_answer_fails_the_run_and_the_process_with_the_steps_error() {
    let files = Files::new("fail");
    files.write(
        "automation.json",
        &automation("https://pay.example/charges"),
    );
    let responses = files.write(
        "responses.json",
        &json!({ "responses": [
            { "step": "st_charge", "status": 402, "body": { "error": "card declined" } }
        ] }),
    );
    let output = tok_test(&files, &["--responses", &responses], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", explain(&output));
    let out = stdout(&output);
    assert!(out.contains("(version 1): failed"), "{out}");
    assert!(
        out.contains(
            r#"error: POST https://pay.example/charges answered 402 Payment Required: {"error":"card declined"}"#
        ),
        "{out}"
    );
    assert!(
        !out.contains("st_set"),
        "the step after it never ran: {out}"
    );

    // A call the file has no answer for names the step and the call.
    let other = files.write(
        "other.json",
        &json!({ "responses": [{ "step": "st_other", "status": 200 }] }),
    );
    let output = tok_test(&files, &["--responses", &other], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", explain(&output));
    let out = stdout(&output);
    assert!(
        out.contains(
            "no recorded response for step `st_charge` (POST https://pay.example/charges)"
        ),
        "{out}"
    );
}

#[test]
fn bad_input_is_refused_with_what_was_wrong() {
    let files = Files::new("bad");
    files.write(
        "automation.json",
        &automation("https://pay.example/charges"),
    );
    let responses = files.write("responses.json", &json!({ "answers": [] }));
    let output = tok_test(&files, &["--responses", &responses], &[]);
    assert!(!output.status.success(), "{}", explain(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is not a responses file"), "{stderr}");
    assert!(stderr.contains("unknown field `answers`"), "{stderr}");

    let event = files.write("event.json", &json!({ "order": {} }));
    let output = Command::new(env!("CARGO_BIN_EXE_tok"))
        .args(["test", &files.path("automation.json"), "--event", &event])
        .output()
        .unwrap();
    assert!(!output.status.success(), "{}", explain(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the event does not match source \"eshop\"'s params"),
        "{stderr}"
    );
    assert!(stderr.contains("order.id"), "{stderr}");
}

/// A local service that answers every POST with 201 and the order it was
/// sent, counting its calls.
async fn service() -> (SocketAddr, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let app = axum::Router::new().route(
        "/charges",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                (
                    axum::http::StatusCode::CREATED,
                    [("set-cookie", "session=secret")],
                    axum::Json(json!({ "id": "ch_9", "order": body["order"] })),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, calls)
}

#[tokio::test(flavor = "multi_thread")]
async fn record_calls_the_service_once_and_writes_what_a_replay_then_answers() {
    let (addr, calls) = service().await;
    let files = Files::new("record");
    files.write(
        "automation.json",
        &automation(&format!("http://{addr}/charges")),
    );
    let responses = files.path("recorded.json");
    let allow = format!("127.0.0.1:{}", addr.port());
    let recorded = {
        let (files, responses) = (&files, responses.clone());
        tokio::task::block_in_place(|| {
            tok_test(
                files,
                &["--responses", &responses, "--record"],
                &[("TOK_OUTBOUND_ALLOW", &allow)],
            )
        })
    };
    assert!(recorded.status.success(), "{}", explain(&recorded));
    assert!(
        stdout(&recorded).contains("recorded 1 answer(s) to"),
        "{}",
        stdout(&recorded)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(&responses)).unwrap()).unwrap();
    let answer = &file["responses"][0];
    assert_eq!(answer["step"], "st_charge");
    assert_eq!(answer["method"], "POST");
    assert_eq!(answer["url"], format!("http://{addr}/charges"));
    assert_eq!(answer["status"], 201);
    assert_eq!(answer["body"], json!({ "id": "ch_9", "order": "A-17" }));
    assert!(
        answer["headers"].get("set-cookie").is_none(),
        "a cookie is not written: {answer}"
    );

    // Replayed, the service is not called again: the guard would not even
    // let it (no TOK_OUTBOUND_ALLOW).
    let replayed =
        tokio::task::block_in_place(|| tok_test(&files, &["--responses", &responses], &[]));
    assert!(replayed.status.success(), "{}", explain(&replayed));
    assert!(
        stdout(&replayed).contains(r#""order":"A-17""#),
        "{}",
        stdout(&replayed)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn an_mcp_tool_is_answered_from_its_recorded_result() {
    let files = Files::new("mcp");
    files.write(
        "automation.json",
        &json!([
            { "kind": "connection", "name": "classifier", "service": "mcp",
              "base_url": "https://mcp.example/mcp" },
            { "kind": "automation", "name": "Classify", "trigger": { "kind": "manual" },
              "steps": [
                { "id": "st_classify", "type": "mcp",
                  "config": { "connection": "classifier", "tool": "classify_document",
                              "arguments": { "text": "{{_body.text}}" } } },
                { "id": "st_set", "type": "set", "config": { "values": { "kind": "{{st_classify.kind}}" } } }
              ] }
        ]),
    );
    let responses = files.write(
        "responses.json",
        &json!({ "responses": [
            { "step": "st_classify", "tool": "classify_document",
              "result": { "content": [{ "type": "text", "text": "an invoice" }],
                          "structuredContent": { "kind": "invoice" } } }
        ] }),
    );
    let event = files.write("input.json", &json!({ "text": "Invoice 2026-17" }));
    let run = |responses: &str| {
        Command::new(env!("CARGO_BIN_EXE_tok"))
            .args(["test", &files.path("automation.json"), "--event", &event])
            .args(["--responses", responses])
            .output()
            .unwrap()
    };
    let output = run(&responses);
    assert!(output.status.success(), "{}", explain(&output));
    let out = stdout(&output);
    assert!(out.contains("completed  0 st_classify (mcp)"), "{out}");
    assert!(out.contains(r#"output: {"kind":"invoice"}"#), "{out}");

    // A result the tool marked as an error fails the step with its text.
    let failing = files.write(
        "failing.json",
        &json!({ "responses": [
            { "step": "st_classify", "tool": "classify_document",
              "result": { "content": [{ "type": "text", "text": "unreadable scan" }],
                          "isError": true } }
        ] }),
    );
    let output = run(&failing);
    assert_eq!(output.status.code(), Some(1), "{}", explain(&output));
    let out = stdout(&output);
    assert!(
        out.contains("error: tool `classify_document` reported an error: unreadable scan"),
        "{out}"
    );
}

/// A group of approvers and a run that waits for a payment's signal, then
/// for Finance's approval (escalating after 4 hours), then notes who
/// approved and what was paid.
fn refund() -> Value {
    json!([
        { "kind": "group", "name": "Finance",
          "members": [{ "name": "Alice" }, { "name": "Bob" }] },
        { "kind": "automation", "name": "Refund",
          "trigger": { "kind": "manual" },
          "steps": [
            { "id": "st_paid", "type": "wait_for_event",
              "config": { "key": "paid-{{order.id}}" } },
            { "id": "st_ok", "type": "approval",
              "config": { "approvers": { "group": "Finance" },
                          "prompt": "Refund {{order.id}}?", "timeout": "2d" },
              "escalations": [{ "after": "4h", "steps": [
                { "id": "st_late", "type": "flow/log",
                  "config": { "message": "refund {{order.id}} still waits" } } ] }] },
            { "id": "st_done", "type": "set",
              "config": { "values": { "by": "{{st_ok.by.name}}", "paid": "{{st_paid.payload.amount}}" } } }
          ] }
    ])
}

#[test]
fn a_run_that_waits_for_a_signal_and_an_approval_gets_them_and_completes() {
    let files = Files::new("arrivals");
    files.write("automation.json", &refund());
    let arrivals = files.write(
        "arrivals.json",
        &json!({ "arrivals": [
            { "signal": { "key": "paid-A-17", "payload": { "amount": 80 } } },
            { "at": "7h", "decision": { "step": "st_ok", "decision": "approve",
                                         "member": "Bob", "comment": "fine" } }
        ] }),
    );
    let output = tok_test(&files, &["--arrivals", &arrivals], &[]);
    assert!(output.status.success(), "{}", explain(&output));
    let out = stdout(&output);
    assert!(out.contains("\"Refund\" (version 1): completed"), "{out}");
    assert!(
        out.contains("completed  0 st_paid (wait_for_event)"),
        "{out}"
    );
    assert!(out.contains(r#""amount":80"#), "{out}");
    // The escalation fired at 4 hours into the wait, before the decision.
    assert!(out.contains("log: info: refund A-17 still waits"), "{out}");
    assert!(out.contains("completed  1 st_ok (approval)"), "{out}");
    assert!(out.contains(r#""comment":"fine""#), "{out}");
    assert!(out.contains(r#"output: {"by":"Bob","paid":80}"#), "{out}");
    assert!(
        out.contains("arrival 0 (signal `paid-A-17` when the run waits for it): came at"),
        "{out}"
    );
    assert!(
        out.contains("arrival 1 (approve on `st_ok` at 7h 0m): came at 7h 0m: apr_"),
        "{out}"
    );
    assert!(out.contains("approved by Bob"), "{out}");
    assert!(out.contains("7h 0m on the run's clock"), "{out}");
}

#[test]
fn an_arrival_that_never_matches_is_said_and_fails_the_test() {
    let files = Files::new("unmatched");
    files.write("automation.json", &refund());
    // A signal on another order's key: the run waits on, with no deadline.
    let arrivals = files.write(
        "arrivals.json",
        &json!({ "arrivals": [{ "signal": { "key": "paid-B-99" } }] }),
    );
    let output = tok_test(&files, &["--arrivals", &arrivals], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", explain(&output));
    let out = stdout(&output);
    assert!(out.contains("(version 1): waiting"), "{out}");
    assert!(
        out.contains(
            "arrival 0 (signal `paid-B-99` when the run waits for it): never came: the run \
             never waited on `paid-B-99`"
        ),
        "{out}"
    );
    assert!(
        out.contains("what is still to arrive does not match what it waits for"),
        "{out}"
    );
    assert!(out.contains("event `paid-A-17` at step 0"), "{out}");

    // A decision at a time when no approval is pending.
    let arrivals = files.write(
        "arrivals.json",
        &json!({ "arrivals": [
            { "at": "1h", "decision": { "step": "st_ok", "decision": "reject" } },
            { "at": "2h", "signal": { "key": "paid-A-17" } }
        ] }),
    );
    let output = tok_test(&files, &["--arrivals", &arrivals], &[]);
    assert_eq!(output.status.code(), Some(1), "{}", explain(&output));
    let out = stdout(&output);
    assert!(
        out.contains(
            "arrival 0 (reject on `st_ok` at 1h 0m): refused at 1h 0m: no approval of step \
             `st_ok` is pending then (the run is waiting, waiting for event `paid-A-17` at step 0)"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "arrival 1 (signal `paid-A-17` at 2h 0m): never came: the test stopped before it"
        ),
        "{out}"
    );

    // A decision on a step that is not an approval of the file: refused
    // before anything runs.
    let arrivals = files.write(
        "arrivals.json",
        &json!({ "arrivals": [{ "decision": { "step": "st_paid", "decision": "approve" } }] }),
    );
    let output = tok_test(&files, &["--arrivals", &arrivals], &[]);
    assert!(!output.status.success(), "{}", explain(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "arrivals.0.decision.step: `st_paid` is not an approval step of the file (its \
             approval steps: st_ok)"
        ),
        "{stderr}"
    );
}
