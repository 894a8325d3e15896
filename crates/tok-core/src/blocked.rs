//! Why a run waits (docs/workflows.md, "Why a run waits"): what holds a run
//! that is neither running nor finished, read from its rows — its jobs,
//! its waits and its tenant's load — by one pure function, [`why`], so
//! every reader (the run detail, its tests) says the same.
//!
//! The kinds, in the order they are looked for:
//! - `approval`, `signal`, `condition`, `runs`: a wait row (a decision, a
//!   signal on a key, a ticket's condition, child runs), `until` its
//!   timeout (a condition's: its next check);
//! - `breaker`, `connection_concurrency`, `connection_rate`: a step its
//!   connection held back before it called anything, `until` it is tried
//!   again (the job carries [`Resume::Deferred`] with the limit);
//! - `throttle`, `debounce`, `batch`, `singleton`: a run's first job its
//!   automation's start control holds (`flow`, see [`crate::start`]),
//!   `until` it is due — a debounce's or a batch's `until` moves when an
//!   event joins; a queued singleton run has none (it goes when the run
//!   ahead of it ends);
//! - `timer`: a job due later (a `wait` step, a retry's backoff);
//! - `queue_key`: a job due now whose queue key (a ticket's) another run
//!   holds or was queued on first;
//! - `tenant_concurrency`: a job due now while its tenant has as many
//!   steps in flight as its `settings.limits.concurrency`.
//!
//! A job due now that nothing holds is not blocked: it is next in line for
//! a free worker (`None`).

use serde::Serialize;
use serde_json::{Value, json};

use crate::run::Resume;

/// Every kind [`why`] may say.
pub const KINDS: &[&str] = &[
    "approval",
    "signal",
    "condition",
    "runs",
    BREAKER,
    CONNECTION_CONCURRENCY,
    CONNECTION_RATE,
    "throttle",
    "debounce",
    "batch",
    "singleton",
    "timer",
    "queue_key",
    "tenant_concurrency",
];

pub const BREAKER: &str = "breaker";
pub const CONNECTION_CONCURRENCY: &str = "connection_concurrency";
pub const CONNECTION_RATE: &str = "connection_rate";

/// What holds a run: `kind`, when it lets go if that is known, and what
/// the kind names (a signal's key, the run holding a queue key, …).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockedBy {
    pub kind: String,
    #[serde(serialize_with = "rfc3339_opt")]
    pub until: Option<i64>,
    pub detail: Value,
}

fn rfc3339_opt<S: serde::Serializer>(ms: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
    match ms.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok()) {
        Some(at) => s.serialize_str(&at.to_string()),
        None => s.serialize_none(),
    }
}

/// One job of the run, as its row says.
#[derive(Debug, Clone, Default)]
pub struct Job {
    pub path: String,
    pub run_after: i64,
    /// A worker holds it (an unexpired lease).
    pub leased: bool,
    /// The run is paused.
    pub held: bool,
    pub resume: Option<Resume>,
    pub queue_key: Option<String>,
    /// Another run whose job of the same queue key is leased, or due and
    /// queued before this one.
    pub key_holder: Option<String>,
}

/// One wait row of the run.
#[derive(Debug, Clone)]
pub struct Wait {
    pub kind: String,
    pub key: String,
    /// The ticket an awaited signal must be about.
    pub subject: Option<String>,
    pub due_at: Option<i64>,
}

/// The run's tenant: its concurrency cap and its steps in flight.
#[derive(Debug, Clone, Copy, Default)]
pub struct TenantLoad {
    pub cap: Option<i64>,
    pub running: i64,
}

/// What holds a run whose status is `status`, or `None` (finished, paused,
/// running, or next in line).
pub fn why(
    status: &str,
    jobs: &[Job],
    waits: &[Wait],
    tenant: TenantLoad,
    now: i64,
) -> Option<BlockedBy> {
    if !matches!(status, "queued" | "running" | "waiting") {
        return None;
    }
    if jobs.iter().any(|j| j.leased || j.held) {
        return None;
    }
    let blocked = |kind: &str, until: Option<i64>, detail: Value| BlockedBy {
        kind: kind.to_owned(),
        until,
        detail,
    };
    if let Some(wait) = waits.first() {
        return Some(
            match (wait.kind.as_str(), wait.key.strip_prefix("approval:")) {
                ("event", Some(approval)) => {
                    blocked("approval", wait.due_at, json!({ "approvalId": approval }))
                }
                ("event", None) => {
                    let mut detail = json!({ "key": wait.key });
                    if let Some(subject) = &wait.subject {
                        detail["subject"] = json!(subject);
                    }
                    blocked("signal", wait.due_at, detail)
                }
                ("condition", _) => blocked(
                    "condition",
                    wait.due_at,
                    json!({ "ticketId": wait.subject }),
                ),
                _ => blocked(
                    "runs",
                    wait.due_at,
                    json!({ "runId": wait.key.strip_prefix("run:").unwrap_or(&wait.key) }),
                ),
            },
        );
    }
    // A job parked until its parallel branches join waits for them: the
    // branches' own jobs say what holds them.
    let jobs: Vec<&Job> = jobs
        .iter()
        .filter(|j| !matches!(j.resume, Some(Resume::Branches { .. })))
        .collect();
    for job in &jobs {
        if let Some(Resume::Deferred { limit, reason }) = &job.resume
            && job.run_after > now
        {
            // A queued singleton run goes when the run ahead ends: when
            // that is, nobody knows.
            let until = Some(job.run_after).filter(|_| limit != "singleton");
            return Some(blocked(limit, until, json!({ "reason": reason })));
        }
    }
    if let Some(job) = jobs.iter().find(|j| j.run_after > now) {
        return Some(blocked(
            "timer",
            Some(job.run_after),
            json!({ "path": job.path }),
        ));
    }
    if let Some(job) = jobs.iter().find(|j| j.key_holder.is_some()) {
        return Some(blocked(
            "queue_key",
            None,
            json!({ "key": job.queue_key, "runId": job.key_holder }),
        ));
    }
    match tenant.cap {
        Some(cap) if !jobs.is_empty() && tenant.running >= cap => Some(blocked(
            "tenant_concurrency",
            None,
            json!({ "limit": cap, "running": tenant.running }),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn job(run_after: i64) -> Job {
        Job {
            path: "1".into(),
            run_after,
            ..Job::default()
        }
    }

    fn kind(b: Option<BlockedBy>) -> Option<(String, Option<i64>, Value)> {
        b.map(|b| (b.kind, b.until, b.detail))
    }

    #[test]
    fn each_kind_is_told_from_the_rows() {
        let idle = TenantLoad::default();
        let wait = |kind: &str, key: &str| Wait {
            kind: kind.into(),
            key: key.into(),
            subject: None,
            due_at: Some(NOW + 60_000),
        };
        let parked = [job(NOW + 60_000)];
        let cases = [
            (
                wait("event", "approval:apr_1"),
                "approval",
                json!({ "approvalId": "apr_1" }),
            ),
            (
                wait("event", "order-1"),
                "signal",
                json!({ "key": "order-1" }),
            ),
            (
                Wait {
                    subject: Some("tk_1".into()),
                    ..wait("event", "shipped")
                },
                "signal",
                json!({ "key": "shipped", "subject": "tk_1" }),
            ),
            (
                wait("runs", "run:run_7"),
                "runs",
                json!({ "runId": "run_7" }),
            ),
        ];
        for (w, name, detail) in cases {
            assert_eq!(
                kind(why("waiting", &parked, &[w], idle, NOW)),
                Some((name.to_owned(), Some(NOW + 60_000), detail))
            );
        }
        let deferred = Job {
            resume: Some(Resume::Deferred {
                limit: CONNECTION_RATE.into(),
                reason: "connection `shop`: the rate limit of 1 calls per second is reached".into(),
            }),
            ..job(NOW + 800)
        };
        let (k, until, detail) = kind(why("running", &[deferred], &[], idle, NOW)).unwrap();
        assert_eq!((k.as_str(), until), ("connection_rate", Some(NOW + 800)));
        assert!(detail["reason"].as_str().unwrap().contains("rate limit"));
        assert_eq!(
            kind(why("waiting", &[job(NOW + 5_000)], &[], idle, NOW)),
            Some(("timer".into(), Some(NOW + 5_000), json!({ "path": "1" })))
        );
        let queued = Job {
            queue_key: Some("ticket:tkt_1".into()),
            key_holder: Some("run_1".into()),
            ..job(NOW - 1)
        };
        assert_eq!(
            kind(why("queued", &[queued], &[], idle, NOW)),
            Some((
                "queue_key".into(),
                None,
                json!({ "key": "ticket:tkt_1", "runId": "run_1" })
            ))
        );
        let full = TenantLoad {
            cap: Some(2),
            running: 2,
        };
        assert_eq!(
            kind(why("queued", &[job(NOW - 1)], &[], full, NOW)),
            Some((
                "tenant_concurrency".into(),
                None,
                json!({ "limit": 2, "running": 2 })
            ))
        );
    }

    #[test]
    fn a_run_that_runs_is_paused_is_next_in_line_or_ended_is_not_blocked() {
        let full = TenantLoad {
            cap: Some(1),
            running: 0,
        };
        let leased = Job {
            leased: true,
            ..job(NOW + 5_000)
        };
        let held = Job {
            held: true,
            ..job(NOW + 5_000)
        };
        assert_eq!(why("running", &[leased], &[], full, NOW), None);
        assert_eq!(
            why("paused", std::slice::from_ref(&held), &[], full, NOW),
            None
        );
        assert_eq!(why("running", &[held], &[], full, NOW), None);
        assert_eq!(why("queued", &[job(NOW)], &[], full, NOW), None);
        assert_eq!(why("completed", &[], &[], full, NOW), None);
        let until = BlockedBy {
            kind: "timer".into(),
            until: Some(0),
            detail: json!({}),
        };
        assert_eq!(
            serde_json::to_value(until).unwrap()["until"],
            "1970-01-01T00:00:00Z"
        );
    }
}
