//! `tok test --arrivals A.json`: what arrives while the run waits, on the
//! run's clock — signals (`POST /api/signals`) and approval decisions
//! (`POST /api/approvals/{id}`), sent through the test's own API as a
//! person or a service would send them.
//!
//! ```json
//! {"arrivals": [
//!   {"at": "2h", "signal": {"key": "paid-A-17", "payload": {"amount": 80}}},
//!   {"decision": {"step": "st_ok", "decision": "approve", "member": "Bob", "comment": "fine"}}
//! ]}
//! ```
//!
//! An arrival with `at` comes when the run's clock reaches that long after
//! the run's start (the clock moves to it as it moves to a job's due time);
//! one without comes as soon as the run waits for it (a wait on the
//! signal's key, a pending approval of the decision's step). Either comes
//! only once nothing else is left to do at that moment, so a run's own
//! steps of that moment go first. Each arrival must be taken: a signal
//! must resume a wait (at once, or from the buffer later), a decision
//! must be accepted; what is not is said, and fails the test.

use std::path::Path;

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Map, Value, json};
use tok_core::definition::Step;
use tok_store::RunDetail;

use crate::cli::Client;

use super::shown;

/// What arrives.
#[derive(Debug, Clone, PartialEq)]
enum What {
    Signal {
        key: String,
        payload: Value,
        /// A ticket id, or `"ticket"`: the run's subject ticket.
        subject: Option<String>,
    },
    Decision {
        step: String,
        decision: String,
        /// An approver's id or name; the first approver when absent.
        member: Option<String>,
        comment: Option<String>,
    },
}

/// What became of an arrival.
#[derive(Debug, Clone, PartialEq)]
enum Fate {
    /// Not sent yet.
    Waiting,
    /// Sent at `at_ms` (the run's clock, from its start).
    Sent {
        at_ms: i64,
        /// What the API answered, as a person reads it.
        said: String,
        /// A signal's id, to find it in the run's steps later.
        signal_id: Option<String>,
        /// Resumed a wait (a signal) or was accepted (a decision).
        taken: bool,
    },
    /// Could not be sent at `at_ms`, for the reason given: the test stops.
    Refused { at_ms: i64, why: String },
}

#[derive(Debug, Clone, PartialEq)]
struct Arrival {
    /// Its place in the file, from 0 (`arrivals.N`).
    index: usize,
    /// When, in ms from the run's start; `None`: as soon as the run waits
    /// for it.
    at_ms: Option<i64>,
    what: What,
    fate: Fate,
}

impl Arrival {
    /// `arrival 2 (signal `paid` at 2h 0m)`, as the messages name it.
    fn name(&self) -> String {
        let when = match self.at_ms {
            Some(ms) => format!(" at {}", shown(ms)),
            None => " when the run waits for it".to_owned(),
        };
        match &self.what {
            What::Signal { key, .. } => format!("arrival {} (signal `{key}`{when})", self.index),
            What::Decision { step, decision, .. } => {
                format!("arrival {} ({decision} on `{step}`{when})", self.index)
            }
        }
    }
}

/// The arrivals of one test, and what became of each.
#[derive(Debug, Default)]
pub(super) struct Arrivals {
    items: Vec<Arrival>,
}

impl Arrivals {
    /// Reads and checks an arrivals file: every mistake names its place
    /// (`arrivals.1.decision.step`) and what was expected.
    pub(super) fn load(path: &Path) -> anyhow::Result<Arrivals> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the arrivals file {}", path.display()))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| {
            anyhow!(
                "{} is not JSON: {e} (line {}, column {})",
                path.display(),
                e.line(),
                e.column()
            )
        })?;
        Self::parse(&value).map_err(|e| anyhow!("{}: {e}", path.display()))
    }

    fn parse(value: &Value) -> anyhow::Result<Arrivals> {
        let list = match value {
            Value::Object(map) => {
                if let Some(other) = map.keys().find(|k| *k != "arrivals") {
                    bail!("unknown field `{other}`; the file is {{\"arrivals\": [...]}}");
                }
                map.get("arrivals")
                    .and_then(Value::as_array)
                    .ok_or_else(|| anyhow!("`arrivals` must be a list: {{\"arrivals\": [...]}}"))?
            }
            _ => bail!("the file must be an object: {{\"arrivals\": [...]}}"),
        };
        let items = list
            .iter()
            .enumerate()
            .map(|(index, item)| parse_arrival(index, item))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Arrivals { items })
    }

    /// Checks that each decision names an approval step of `steps` (every
    /// automation the test applied).
    pub(super) fn check_steps(&self, definitions: &[Value]) -> anyhow::Result<()> {
        let mut approvals = Vec::new();
        for definition in definitions {
            let Ok(steps) = serde_json::from_value::<Vec<Step>>(definition["steps"].clone()) else {
                continue;
            };
            tok_core::walk::each_step(&steps, "steps", &mut |_, step| {
                if step.kind == "approval" {
                    approvals.push(step.id.clone());
                }
            });
        }
        for arrival in &self.items {
            if let What::Decision { step, .. } = &arrival.what
                && !approvals.contains(step)
            {
                let known = if approvals.is_empty() {
                    "the file has no approval step".to_owned()
                } else {
                    format!("its approval steps: {}", approvals.join(", "))
                };
                bail!(
                    "arrivals.{}.decision.step: `{step}` is not an approval step of the file \
                     ({known})",
                    arrival.index
                );
            }
        }
        Ok(())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// When the next arrival with an `at` is due, in ms from the run's
    /// start.
    pub(super) fn next_at(&self) -> Option<i64> {
        self.items
            .iter()
            .filter(|a| a.fate == Fate::Waiting)
            .filter_map(|a| a.at_ms)
            .min()
    }

    /// Sends what is due at `now_ms` (from the run's start) or waited for
    /// by `run` now, in time order, then file order; says how many it
    /// sent. An arrival the API refuses, or a decision with no pending
    /// approval at its time, is [`Fate::Refused`], and stops the sending
    /// ([`Arrivals::refused`]).
    pub(super) async fn deliver(
        &mut self,
        client: &Client,
        run: &RunDetail,
        now_ms: i64,
    ) -> anyhow::Result<usize> {
        let mut due: Vec<usize> = Vec::new();
        for (i, arrival) in self.items.iter().enumerate() {
            if arrival.fate != Fate::Waiting {
                continue;
            }
            let ready = match arrival.at_ms {
                Some(at) => at <= now_ms,
                None => awaited(client, run, &arrival.what).await?,
            };
            if ready {
                due.push(i);
            }
        }
        due.sort_by_key(|&i| (self.items[i].at_ms.unwrap_or(now_ms), i));
        for &i in &due {
            let fate = match send(client, run, &self.items[i].what, now_ms).await {
                Ok(fate) => fate,
                Err(why) => Fate::Refused {
                    at_ms: now_ms,
                    why: format!("{why:#}"),
                },
            };
            let refused = matches!(fate, Fate::Refused { .. });
            self.items[i].fate = fate;
            if refused {
                break;
            }
        }
        Ok(due.len())
    }

    /// Whether an arrival could not be sent (the test stops there).
    pub(super) fn refused(&self) -> bool {
        self.items
            .iter()
            .any(|a| matches!(a.fate, Fate::Refused { .. }))
    }

    /// The arrivals still to come, as the messages name them.
    pub(super) fn pending(&self) -> Vec<String> {
        self.items
            .iter()
            .filter(|a| a.fate == Fate::Waiting)
            .map(Arrival::name)
            .collect()
    }

    /// What became of each arrival, one line each, and whether every one
    /// was taken: a signal that resumed no wait at once counts as taken
    /// when a step of `run` shows its id (a wait took it from the buffer).
    pub(super) fn report(&self, run: &RunDetail) -> (Vec<String>, bool) {
        let steps = serde_json::to_string(&run.steps).unwrap_or_default();
        let ended = matches!(
            run.run.status.as_str(),
            "completed" | "failed" | "cancelled" | "refused"
        );
        let mut all_taken = true;
        let lines = self
            .items
            .iter()
            .map(|arrival| match &arrival.fate {
                Fate::Waiting => {
                    all_taken = false;
                    let why = match (&arrival.what, arrival.at_ms) {
                        _ if ended => format!("the run ended ({}) before it", run.run.status),
                        (_, Some(_)) => "the test stopped before it".to_owned(),
                        (What::Signal { key, .. }, None) => {
                            format!("the run never waited on `{key}`")
                        }
                        (What::Decision { step, .. }, None) => {
                            format!("no approval of step `{step}` was ever pending")
                        }
                    };
                    format!("{}: never came: {why}", arrival.name())
                }
                Fate::Sent {
                    at_ms,
                    said,
                    signal_id,
                    taken,
                } => {
                    let taken = *taken
                        || signal_id
                            .as_deref()
                            .is_some_and(|id| steps.contains(&format!("\"{id}\"")));
                    all_taken &= taken;
                    let note = if taken {
                        ""
                    } else {
                        ", but no wait took it: check its key, subject and the wait's `where`"
                    };
                    format!(
                        "{}: came at {}: {said}{note}",
                        arrival.name(),
                        shown(*at_ms)
                    )
                }
                Fate::Refused { at_ms, why } => {
                    all_taken = false;
                    format!("{}: refused at {}: {why}", arrival.name(), shown(*at_ms))
                }
            })
            .collect();
        (lines, all_taken)
    }
}

fn parse_arrival(index: usize, item: &Value) -> anyhow::Result<Arrival> {
    let at = format!("arrivals.{index}");
    let Value::Object(map) = item else {
        bail!("{at}: an arrival is an object: {{\"at\"?, \"signal\" | \"decision\"}}");
    };
    if let Some(other) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "at" | "signal" | "decision"))
    {
        bail!("{at}: unknown field `{other}` (an arrival has `at`, and `signal` or `decision`)");
    }
    let at_ms = match map.get("at") {
        None => None,
        Some(Value::String(text)) => Some(
            tok_core::duration::parse_duration(text)
                .map_err(|e| anyhow!("{at}.at: {e}"))?
                .as_millis() as i64,
        ),
        Some(other) => {
            bail!("{at}.at: a duration from the run's start (\"90m\", \"2d\"), not {other}")
        }
    };
    let what = match (map.get("signal"), map.get("decision")) {
        (Some(signal), None) => parse_signal(&format!("{at}.signal"), signal)?,
        (None, Some(decision)) => parse_decision(&format!("{at}.decision"), decision)?,
        _ => bail!("{at}: an arrival is a `signal` or a `decision`, exactly one of them"),
    };
    Ok(Arrival {
        index,
        at_ms,
        what,
        fate: Fate::Waiting,
    })
}

fn fields<'a>(
    at: &str,
    value: &'a Value,
    known: &[&str],
) -> anyhow::Result<&'a Map<String, Value>> {
    let Value::Object(map) = value else {
        bail!("{at}: an object, with {}", known.join(", "));
    };
    if let Some(other) = map.keys().find(|k| !known.contains(&k.as_str())) {
        bail!(
            "{at}: unknown field `{other}` (known: {})",
            known.join(", ")
        );
    }
    Ok(map)
}

fn text(at: &str, map: &Map<String, Value>, name: &str) -> anyhow::Result<Option<String>> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
        Some(other) => bail!("{at}.{name}: a non-empty string, not {other}"),
    }
}

fn parse_signal(at: &str, value: &Value) -> anyhow::Result<What> {
    let map = fields(at, value, &["key", "payload", "subject"])?;
    let key =
        text(at, map, "key")?.ok_or_else(|| anyhow!("{at}.key: the signal's key is required"))?;
    let payload = match map.get("payload") {
        None | Some(Value::Null) => json!({}),
        Some(payload @ Value::Object(_)) => payload.clone(),
        Some(other) => bail!("{at}.payload: a JSON object, not {other}"),
    };
    Ok(What::Signal {
        key,
        payload,
        subject: text(at, map, "subject")?,
    })
}

fn parse_decision(at: &str, value: &Value) -> anyhow::Result<What> {
    let map = fields(at, value, &["step", "decision", "member", "comment"])?;
    let step = text(at, map, "step")?
        .ok_or_else(|| anyhow!("{at}.step: the id of the approval step it decides is required"))?;
    let decision = text(at, map, "decision")?
        .ok_or_else(|| anyhow!("{at}.decision: \"approve\" or \"reject\" is required"))?;
    if decision != "approve" && decision != "reject" {
        bail!("{at}.decision: \"approve\" or \"reject\", not {decision:?}");
    }
    Ok(What::Decision {
        step,
        decision,
        member: text(at, map, "member")?,
        comment: text(at, map, "comment")?,
    })
}

/// Whether the run waits now for what `what` brings: a wait on the
/// signal's key (about its subject), or a pending approval of the step.
async fn awaited(client: &Client, run: &RunDetail, what: &What) -> anyhow::Result<bool> {
    Ok(match what {
        What::Signal { key, subject, .. } => match subject_of(run, subject.as_deref()) {
            Ok(subject) => run
                .waits
                .iter()
                .any(|w| w.kind == "event" && &w.key == key && w.subject == subject),
            // About the run's ticket, which it does not have yet.
            Err(_) => false,
        },
        What::Decision { step, .. } => pending_approval(client, step).await?.is_some(),
    })
}

/// The ticket a signal is about: `"ticket"` is the run's subject ticket.
fn subject_of(run: &RunDetail, subject: Option<&str>) -> anyhow::Result<Option<String>> {
    match subject {
        None => Ok(None),
        Some("ticket") => match &run.run.subject_ticket_id {
            Some(ticket) => Ok(Some(ticket.clone())),
            None => bail!("`subject: \"ticket\"`, but the run has no subject ticket yet"),
        },
        Some(ticket) => Ok(Some(ticket.to_owned())),
    }
}

/// The oldest pending approval of step `step` (the tenant is the test's
/// own: its runs are this test's).
async fn pending_approval(client: &Client, step: &str) -> anyhow::Result<Option<Value>> {
    let page = client.get("/api/approvals?limit=500").await?;
    let mut found: Vec<Value> = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["step_id"] == step && a["status"] == "pending")
        .cloned()
        .collect();
    found.sort_by_key(|a| a["created_at"].as_str().map(str::to_owned));
    Ok(found.into_iter().next())
}

async fn send(client: &Client, run: &RunDetail, what: &What, now_ms: i64) -> anyhow::Result<Fate> {
    match what {
        What::Signal {
            key,
            payload,
            subject,
        } => {
            let mut body = json!({ "key": key, "payload": payload });
            if let Some(subject) = subject_of(run, subject.as_deref())? {
                body["subject"] = json!(subject);
            }
            let sent = client.post("/api/signals", &body).await?;
            let id = sent["signal_id"].as_str().map(str::to_owned);
            let resumed: Vec<&str> = sent["resumed"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let said = if resumed.is_empty() {
                format!(
                    "signal {} resumed no wait (kept in the buffer)",
                    id.as_deref().unwrap_or("?")
                )
            } else {
                format!(
                    "signal {} resumed {}",
                    id.as_deref().unwrap_or("?"),
                    resumed.join(", ")
                )
            };
            Ok(Fate::Sent {
                at_ms: now_ms,
                said,
                signal_id: id,
                taken: !resumed.is_empty(),
            })
        }
        What::Decision {
            step,
            decision,
            member,
            comment,
        } => {
            let Some(approval) = pending_approval(client, step).await? else {
                let waits: Vec<String> = run
                    .waits
                    .iter()
                    .map(|w| format!("{} `{}` at step {}", w.kind, w.key, w.path))
                    .collect();
                bail!(
                    "no approval of step `{step}` is pending then (the run is {}{})",
                    run.run.status,
                    if waits.is_empty() {
                        String::new()
                    } else {
                        format!(", waiting for {}", waits.join("; "))
                    }
                );
            };
            let approvers: Vec<&Value> = approval["approvers"]
                .as_array()
                .into_iter()
                .flatten()
                .collect();
            let named = |a: &&Value| {
                member
                    .as_deref()
                    .is_none_or(|m| a["id"] == m || a["name"] == m)
            };
            let Some(approver) = approvers.iter().copied().find(named) else {
                let names: Vec<String> = approvers
                    .iter()
                    .map(|a| {
                        format!(
                            "{} ({})",
                            a["name"].as_str().unwrap_or("?"),
                            a["id"].as_str().unwrap_or("?")
                        )
                    })
                    .collect();
                bail!(
                    "member `{}` is not one of the approvers of step `{step}` ({})",
                    member.as_deref().unwrap_or_default(),
                    if names.is_empty() {
                        "it has none".to_owned()
                    } else {
                        names.join(", ")
                    }
                );
            };
            let id = approval["id"].as_str().unwrap_or_default();
            let mut body = json!({ "decision": decision, "member": approver["id"] });
            if let Some(comment) = comment {
                body["comment"] = json!(comment);
            }
            client.post(&format!("/api/approvals/{id}"), &body).await?;
            Ok(Fate::Sent {
                at_ms: now_ms,
                said: format!(
                    "{id} {} by {}",
                    if decision == "approve" {
                        "approved"
                    } else {
                        "rejected"
                    },
                    approver["name"].as_str().unwrap_or("?")
                ),
                signal_id: None,
                taken: true,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(value: Value) -> String {
        Arrivals::parse(&value).unwrap_err().to_string()
    }

    #[test]
    fn an_arrivals_file_is_read_with_its_times() {
        let arrivals = Arrivals::parse(&json!({ "arrivals": [
            { "at": "2h", "signal": { "key": "paid", "payload": { "amount": 80 }, "subject": "ticket" } },
            { "decision": { "step": "st_ok", "decision": "approve", "member": "Bob", "comment": "fine" } }
        ] }))
        .unwrap();
        assert_eq!(arrivals.items.len(), 2);
        assert_eq!(arrivals.items[0].at_ms, Some(7_200_000));
        assert_eq!(arrivals.next_at(), Some(7_200_000));
        assert_eq!(arrivals.items[1].at_ms, None);
        assert_eq!(
            arrivals.items[1].what,
            What::Decision {
                step: "st_ok".into(),
                decision: "approve".into(),
                member: Some("Bob".into()),
                comment: Some("fine".into()),
            }
        );
    }

    #[test]
    fn a_mistake_names_its_place_and_what_was_expected() {
        let cases = [
            (json!([]), "the file must be an object"),
            (json!({ "arrival": [] }), "unknown field `arrival`"),
            (
                json!({ "arrivals": [{ "at": "2h" }] }),
                "arrivals.0: an arrival is a `signal` or a `decision`",
            ),
            (
                json!({ "arrivals": [{ "signal": { "key": "a" }, "decision": {} }] }),
                "exactly one of them",
            ),
            (
                json!({ "arrivals": [{ "at": 5, "signal": { "key": "a" } }] }),
                "arrivals.0.at: a duration",
            ),
            (
                json!({ "arrivals": [{ "at": "soon", "signal": { "key": "a" } }] }),
                "arrivals.0.at:",
            ),
            (
                json!({ "arrivals": [{ "signal": { "payload": {} } }] }),
                "arrivals.0.signal.key: the signal's key is required",
            ),
            (
                json!({ "arrivals": [{ "signal": { "key": "a", "payload": [1] } }] }),
                "arrivals.0.signal.payload: a JSON object",
            ),
            (
                json!({ "arrivals": [{ "signal": { "key": "a", "when": 1 } }] }),
                "arrivals.0.signal: unknown field `when`",
            ),
            (
                json!({ "arrivals": [{ "decision": { "step": "st_ok", "decision": "yes" } }] }),
                "arrivals.0.decision.decision: \"approve\" or \"reject\", not \"yes\"",
            ),
            (
                json!({ "arrivals": [{ "decision": { "decision": "approve" } }] }),
                "arrivals.0.decision.step",
            ),
        ];
        for (value, expected) in cases {
            let error = refused(value.clone());
            assert!(error.contains(expected), "{value}: {error}");
        }
    }

    #[test]
    fn a_decision_must_name_an_approval_step_of_the_file() {
        let arrivals = Arrivals::parse(&json!({ "arrivals": [
            { "decision": { "step": "st_okk", "decision": "approve" } }
        ] }))
        .unwrap();
        let definition = json!({ "steps": [
            { "id": "st_wait", "type": "wait", "config": { "duration": "1h" } },
            { "id": "st_ok", "type": "approval", "config": { "approvers": { "group": "Finance" } } }
        ] });
        let error = arrivals
            .check_steps(std::slice::from_ref(&definition))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("arrivals.0.decision.step: `st_okk` is not an approval step of the file (its approval steps: st_ok)"),
            "{error}"
        );
        let arrivals = Arrivals::parse(&json!({ "arrivals": [
            { "decision": { "step": "st_ok", "decision": "approve" } }
        ] }))
        .unwrap();
        arrivals.check_steps(&[definition]).unwrap();
    }
}
