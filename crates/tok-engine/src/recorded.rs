//! Recorded answers for the `http` step: `tok test` runs an automation
//! against them instead of the services it calls (`--responses R.json`),
//! or calls the services once and writes what they answered (`--record`).
//!
//! A recording is a JSON file:
//!
//! ```json
//! {"responses": [
//!   {"step": "charge", "method": "POST", "url": "https://pay.example/charges",
//!    "status": 201, "headers": {"content-type": "application/json"},
//!    "body": {"id": "ch_1"}}
//! ]}
//! ```
//!
//! An answer matches a call when each of `step` (the step's `id`),
//! `method` and `url` it gives equals the call's; what it leaves out
//! matches anything, so `{"step": "charge", "status": 500}` answers every
//! call of that step. The answers that match one call are used in their
//! order, one per attempt, and the last repeats: a 503 then a 200 tries
//! the step's retry. A JSON `body` is sent as JSON (with `content-type:
//! application/json` unless `headers` names another), a string as it is.
//!
//! An `mcp` step's answer is the tool's result instead of an HTTP answer:
//! `{"step": "classify", "tool": "classify_document", "result": {"content":
//! [{"type": "text", "text": "invoice"}], "structuredContent": {"kind":
//! "invoice"}}}` (the `CallToolResult` of MCP as JSON, `isError` too).
//!
//! A replayed answer goes through the same mapping as a live one (status
//! to retry or failure, the byte budget, the JSON body; a tool's `isError`
//! and structured content): only the network is left out. Recording
//! writes no request header (credentials stay out of the file) and no
//! `set-cookie`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use reqwest::{Method, Url};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Where the `http` step's answers come from.
#[derive(Clone, Default)]
pub enum Answers {
    /// The services themselves, through the outbound guard.
    #[default]
    Live,
    /// Only the recording: a call it has no answer for fails the step.
    Replay(std::sync::Arc<Recording>),
    /// The services, each answer added to the recording.
    Record(std::sync::Arc<Recording>),
}

/// One recorded answer (see the module doc for the file).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recorded {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// An `http` answer's status; `None` on an `mcp` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub headers: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub body: Value,
    /// An `mcp` answer's tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// An `mcp` answer: the tool's `CallToolResult`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

impl Recorded {
    fn is_tool(&self) -> bool {
        self.tool.is_some()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    responses: Vec<Recorded>,
}

/// The answers of a recording, and how many times each call was answered.
#[derive(Default)]
pub struct Recording {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    answers: Vec<Recorded>,
    /// Per (step, method, url): how many answers were given.
    used: HashMap<(String, String, String), usize>,
}

impl Recording {
    /// An empty recording, for `--record`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a recording, with the file's name and the JSON error's place
    /// when it is not one.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the responses file {}: {e}", path.display()))?;
        let file: File = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is not a responses file ({{\"responses\": [{{\"step\", \"method\", \"url\", \
                 \"status\", \"headers\", \"body\"}}]}}): {e}",
                path.display()
            )
        })?;
        for (i, answer) in file.responses.iter().enumerate() {
            match (answer.status, &answer.tool, &answer.result) {
                (Some(status), None, None) => {
                    if reqwest::StatusCode::from_u16(status).is_err() {
                        return Err(format!(
                            "{}: responses[{i}].status {status} is not an HTTP status (100 to 999)",
                            path.display(),
                        ));
                    }
                }
                (None, Some(_), Some(_)) => {}
                _ => {
                    return Err(format!(
                        "{}: responses[{i}] is neither an http answer (with `status`) nor an mcp                          answer (with `tool` and `result`, and no `status`)",
                        path.display()
                    ));
                }
            }
            if let Some(method) = &answer.method
                && Method::from_bytes(method.as_bytes()).is_err()
            {
                return Err(format!(
                    "{}: responses[{i}].method `{method}` is not an HTTP method",
                    path.display()
                ));
            }
        }
        Ok(Self {
            state: Mutex::new(State {
                answers: file.responses,
                used: HashMap::new(),
            }),
        })
    }

    /// Writes the recording as a responses file.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let file = File {
            responses: self.lock().answers.clone(),
        };
        let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write the responses file {}: {e}", path.display()))
    }

    /// How many answers it holds.
    pub fn len(&self) -> usize {
        self.lock().answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next answer of those `matches` picks for the call `key`: each in
    /// turn, then the last again.
    fn next(
        &self,
        key: (String, String, String),
        matches: impl Fn(&Recorded) -> bool,
    ) -> Option<Recorded> {
        let mut state = self.lock();
        let matching: Vec<usize> = state
            .answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches(a))
            .map(|(i, _)| i)
            .collect();
        let &last = matching.last()?;
        let used = state.used.entry(key).or_default();
        let index = matching.get(*used).copied().unwrap_or(last);
        *used += 1;
        Some(state.answers[index].clone())
    }

    /// The answer to this call, as the HTTP client would have returned it,
    /// or why there is none.
    pub(crate) fn replay(
        &self,
        step: Option<&str>,
        method: &Method,
        url: &Url,
    ) -> Result<reqwest::Response, String> {
        let key = (
            step.unwrap_or_default().to_owned(),
            method.to_string(),
            url.to_string(),
        );
        let answer = self.next(key, |a| {
            !a.is_tool()
                && a.step.as_deref().is_none_or(|s| Some(s) == step)
                && a.method
                    .as_deref()
                    .is_none_or(|m| m.eq_ignore_ascii_case(method.as_str()))
                && a.url.as_deref().is_none_or(|u| same_url(u, url))
        });
        match answer {
            Some(answer) => response(&answer),
            None => Err(format!(
                "no recorded response for step `{}` ({method} {url}); add one to the responses \
                 file, or run with --record to call the service once and write it",
                step.unwrap_or("?")
            )),
        }
    }

    /// The recorded result of this `tools/call`, or why there is none.
    pub(crate) fn replay_tool(&self, step: Option<&str>, tool: &str) -> Result<Value, String> {
        let key = (
            step.unwrap_or_default().to_owned(),
            "tools/call".to_owned(),
            tool.to_owned(),
        );
        let answer = self.next(key, |a| {
            a.tool.as_deref() == Some(tool) && a.step.as_deref().is_none_or(|s| Some(s) == step)
        });
        match answer.and_then(|a| a.result) {
            Some(result) => Ok(result),
            None => Err(format!(
                "no recorded response for step `{}` (tools/call `{tool}`); add one to the \
                 responses file, or run with --record to call the tool once and write it",
                step.unwrap_or("?")
            )),
        }
    }

    /// Adds a tool's result to the recording.
    pub(crate) fn record_tool(&self, step: Option<&str>, tool: &str, result: Value) {
        self.lock().answers.push(Recorded {
            step: step.map(str::to_owned),
            tool: Some(tool.to_owned()),
            result: Some(result),
            ..Recorded::default()
        });
    }

    /// Reads `answer`'s body (no further than `budget` bytes, as the step
    /// would), adds it to the recording and returns it as it came.
    pub(crate) async fn record(
        &self,
        step: Option<&str>,
        method: &Method,
        url: &Url,
        answer: reqwest::Response,
        budget: usize,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let status = answer.status().as_u16();
        let headers = answer.headers().clone();
        let bytes = crate::outbound::body::prefix(answer, budget).await?;
        let is_json = headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("json"));
        let body = match serde_json::from_slice::<Value>(&bytes) {
            Ok(json) if is_json && !json.is_string() => json,
            _ => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
        };
        let mut kept = Map::new();
        for (name, value) in &headers {
            if NOT_RECORDED.contains(&name.as_str()) {
                continue;
            }
            if let Ok(v) = value.to_str() {
                kept.insert(name.as_str().to_owned(), Value::String(v.to_owned()));
            }
        }
        let recorded = Recorded {
            step: step.map(str::to_owned),
            method: Some(method.to_string()),
            url: Some(url.to_string()),
            status: Some(status),
            headers: kept,
            body,
            ..Recorded::default()
        };
        let mut rebuilt = http::Response::builder().status(status);
        for (name, value) in &headers {
            if name != reqwest::header::CONTENT_LENGTH && name != reqwest::header::TRANSFER_ENCODING
            {
                rebuilt = rebuilt.header(name, value);
            }
        }
        self.lock().answers.push(recorded);
        Ok(rebuilt
            .body(bytes)
            .map(reqwest::Response::from)
            .expect("a status and headers read from a response build one"))
    }
}

/// Answer headers a recording leaves out: a cookie, and the framing
/// headers, which no longer describe a body written decoded and whole.
const NOT_RECORDED: [&str; 4] = [
    "set-cookie",
    "content-length",
    "transfer-encoding",
    "content-encoding",
];

/// Equal URLs, however the file spells them (`https://a.example` and
/// `https://a.example/`).
fn same_url(recorded: &str, url: &Url) -> bool {
    Url::parse(recorded).is_ok_and(|r| &r == url)
}

fn response(answer: &Recorded) -> Result<reqwest::Response, String> {
    let mut builder = http::Response::builder().status(answer.status.unwrap_or(200));
    let mut typed = false;
    for (name, value) in &answer.headers {
        let Some(value) = value.as_str() else {
            return Err(format!(
                "recorded header `{name}` is not a string (a header's value is text)"
            ));
        };
        typed |= name.eq_ignore_ascii_case("content-type");
        builder = builder.header(name.as_str(), value);
    }
    let bytes = match &answer.body {
        Value::String(text) => text.clone().into_bytes(),
        Value::Null => Vec::new(),
        json => {
            if !typed {
                builder = builder.header("content-type", "application/json");
            }
            json.to_string().into_bytes()
        }
    };
    builder
        .body(bytes)
        .map(reqwest::Response::from)
        .map_err(|e| format!("recorded answer {answer:?} is not a valid HTTP answer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recording(answers: Value) -> Recording {
        let file: File = serde_json::from_value(json!({ "responses": answers })).unwrap();
        Recording {
            state: Mutex::new(State {
                answers: file.responses,
                used: HashMap::new(),
            }),
        }
    }

    use serde_json::json;

    #[tokio::test]
    async fn answers_are_used_in_order_and_the_last_repeats() {
        let rec = recording(json!([
            {"step": "a", "status": 503, "body": "busy"},
            {"step": "a", "status": 200, "body": {"ok": true}},
        ]));
        let url = Url::parse("https://svc.example/x").unwrap();
        let statuses: Vec<u16> = (0..3)
            .map(|_| {
                rec.replay(Some("a"), &Method::POST, &url)
                    .unwrap()
                    .status()
                    .as_u16()
            })
            .collect();
        assert_eq!(statuses, [503, 200, 200]);
        let answer = rec.replay(Some("a"), &Method::POST, &url).unwrap();
        assert_eq!(answer.headers()["content-type"], "application/json");
        assert_eq!(answer.text().await.unwrap(), r#"{"ok":true}"#);
    }

    #[test]
    fn a_tool_is_answered_by_its_own_answers_only() {
        let rec = recording(json!([
            {"step": "a", "status": 200, "body": "http"},
            {"step": "a", "tool": "lookup", "result": {"content": [], "isError": true}},
            {"step": "a", "tool": "lookup", "result": {"content": []}},
        ]));
        assert_eq!(
            rec.replay_tool(Some("a"), "lookup").unwrap()["isError"],
            true
        );
        assert_eq!(
            rec.replay_tool(Some("a"), "lookup").unwrap(),
            json!({"content": []})
        );
        let error = rec.replay_tool(Some("a"), "other").unwrap_err();
        assert!(error.contains("step `a` (tools/call `other`)"), "{error}");
        let url = Url::parse("https://svc.example/x").unwrap();
        let answer = rec.replay(Some("a"), &Method::GET, &url).unwrap();
        assert_eq!(answer.status().as_u16(), 200);
    }

    #[test]
    fn a_call_with_no_answer_names_the_step_and_the_url() {
        let rec = recording(json!([
            {"step": "a", "url": "https://svc.example/x", "status": 200},
        ]));
        let other = Url::parse("https://svc.example/y").unwrap();
        let error = rec.replay(Some("a"), &Method::GET, &other).unwrap_err();
        assert!(
            error.contains("step `a` (GET https://svc.example/y)"),
            "{error}"
        );
        let same = Url::parse("https://svc.example/x").unwrap();
        assert!(rec.replay(Some("a"), &Method::GET, &same).is_ok());
    }
}
