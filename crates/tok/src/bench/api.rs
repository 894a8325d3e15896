//! The bench's HTTP client of tok's API: setting up tenants, sources and
//! automations with the admin key, sending webhooks, and waiting for runs
//! to finish by paging `GET /api/dashboard/runs` (nothing is added to the
//! server for the bench).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::report::Progress;

/// A tok server's API, as the platform admin.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
    pub(crate) admin_key: String,
}

/// A tenant the bench created, with its own key.
#[derive(Clone)]
pub(crate) struct Tenant {
    pub(crate) key: String,
}

/// A webhook source: where to send and the source's id for triggers.
#[derive(Clone)]
pub(crate) struct Source {
    pub(crate) id: String,
    pub(crate) url: String,
}

/// The fields of a listed run the bench reads.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RunRow {
    pub(crate) id: String,
    pub(crate) event_id: String,
    pub(crate) status: String,
    /// Milliseconds since the Unix epoch (the API answers RFC 3339).
    #[serde(deserialize_with = "epoch_ms_of_rfc3339")]
    pub(crate) finished_at: Option<i64>,
}

/// An optional RFC 3339 time of the API as milliseconds since the epoch,
/// the bench's own clock.
fn epoch_ms_of_rfc3339<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| tok_store::rfc3339::parse(&text).map_err(serde::de::Error::custom))
        .transpose()
}

/// Milliseconds since the Unix epoch, like the store's timestamps.
pub(crate) fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Api {
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> anyhow::Result<Value> {
        let response = request
            .send()
            .await
            .with_context(|| format!("{what}: no answer"))?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("{what}: {status}: {body}");
        }
        serde_json::from_str(&body).with_context(|| format!("{what}: not JSON: {body}"))
    }

    pub(crate) async fn tenant(&self, name: &str) -> anyhow::Result<Tenant> {
        let created = self
            .send(
                self.http
                    .post(format!("{}/api/tenants", self.base))
                    .bearer_auth(&self.admin_key)
                    .json(&json!({ "name": name })),
                "create a tenant (is the admin key right?)",
            )
            .await?;
        Ok(Tenant {
            key: created["api_key"]
                .as_str()
                .context("a created tenant has no api_key")?
                .to_owned(),
        })
    }

    /// A source whose contract takes `n` (an integer) from the body.
    pub(crate) async fn source(&self, tenant: &Tenant, name: &str) -> anyhow::Result<Source> {
        let created = self
            .send(
                self.http
                    .post(format!("{}/api/sources", self.base))
                    .bearer_auth(&tenant.key)
                    .json(&json!({ "name": name, "params": [
                        { "name": "n", "path": "n", "type": "integer", "required": true }
                    ]})),
                "create a source",
            )
            .await?;
        let id = created["id"].as_str().context("a source without id")?;
        let token = created["token"]
            .as_str()
            .context("a source without token")?;
        // The URL the server shows uses TOK_PUBLIC_URL, which may not be
        // where the bench reaches it.
        Ok(Source {
            id: id.to_owned(),
            url: format!("{}/webhook/{token}", self.base),
        })
    }

    /// An automation triggered by `source`, running `steps`; its id.
    pub(crate) async fn automation(
        &self,
        tenant: &Tenant,
        name: &str,
        source: &Source,
        steps: Vec<Value>,
    ) -> anyhow::Result<String> {
        self.automation_with_flow(tenant, name, source, steps, None)
            .await
    }

    /// [`Api::automation`] with a `flow` (start controls).
    pub(crate) async fn automation_with_flow(
        &self,
        tenant: &Tenant,
        name: &str,
        source: &Source,
        steps: Vec<Value>,
        flow: Option<Value>,
    ) -> anyhow::Result<String> {
        let mut definition = json!({
            "name": name,
            "trigger": { "kind": "webhook", "source": source.id },
            "steps": steps,
        });
        if let Some(flow) = flow {
            definition["flow"] = flow;
        }
        let created = self
            .send(
                self.http
                    .post(format!("{}/api/automations", self.base))
                    .bearer_auth(&tenant.key)
                    .json(&definition),
                &format!("create the automation `{name}`"),
            )
            .await?;
        Ok(created["id"]
            .as_str()
            .context("an automation without id")?
            .to_owned())
    }

    /// One page of runs.
    async fn runs_page(
        &self,
        tenant: &Tenant,
        query: &str,
        cursor: Option<&str>,
    ) -> anyhow::Result<(Vec<RunRow>, Option<String>)> {
        let mut url = format!("{}/api/dashboard/runs?{query}", self.base);
        if let Some(cursor) = cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let page = self
            .send(self.http.get(url).bearer_auth(&tenant.key), "list runs")
            .await?;
        let items: Vec<RunRow> = serde_json::from_value(page["items"].clone())
            .context("the runs listing changed shape")?;
        Ok((items, page["next_cursor"].as_str().map(str::to_owned)))
    }

    /// Every run of the tenant (of one automation when given), all pages.
    pub(crate) async fn all_runs(
        &self,
        tenant: &Tenant,
        automation: Option<&str>,
    ) -> anyhow::Result<Vec<RunRow>> {
        let query = match automation {
            Some(id) => format!("limit=500&automation={id}"),
            None => "limit=500".to_owned(),
        };
        let mut runs = Vec::new();
        let mut cursor = None;
        loop {
            let (items, next) = self.runs_page(tenant, &query, cursor.as_deref()).await?;
            runs.extend(items);
            match next {
                Some(next) => cursor = Some(next),
                None => return Ok(runs),
            }
        }
    }

    /// Whether the tenant has a run in `status` (one row fetched).
    async fn has_run(
        &self,
        tenant: &Tenant,
        automation: Option<&str>,
        status: &str,
    ) -> anyhow::Result<bool> {
        let mut query = format!("limit=1&status={status}");
        if let Some(id) = automation {
            query.push_str(&format!("&automation={id}"));
        }
        Ok(!self.runs_page(tenant, &query, None).await?.0.is_empty())
    }

    /// One run with its steps.
    pub(crate) async fn run(&self, tenant: &Tenant, id: &str) -> anyhow::Result<Value> {
        self.send(
            self.http
                .get(format!("{}/api/runs/{id}", self.base))
                .bearer_auth(&tenant.key),
            "show a run",
        )
        .await
    }

    /// Waits until `expected` runs (of the automation, when given) have
    /// finished, or `limit` has passed. Cheap while runs are moving: it asks
    /// for one queued and one running run, and lists everything only every
    /// few seconds (for the progress line) or when nothing seems to move.
    pub(crate) async fn wait_runs(
        &self,
        tenant: &Tenant,
        automation: Option<&str>,
        expected: usize,
        limit: Duration,
        progress: (&Progress, &str),
    ) -> anyhow::Result<Finished> {
        let started = Instant::now();
        let mut last_full: Option<Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let moving = self.has_run(tenant, automation, "queued").await?
                || self.has_run(tenant, automation, "running").await?;
            let timed_out = started.elapsed() >= limit;
            if moving
                && !timed_out
                && last_full.is_some_and(|t| t.elapsed() < Duration::from_secs(2))
            {
                continue;
            }
            last_full = Some(Instant::now());
            let runs = self.all_runs(tenant, automation).await?;
            let finished = Finished::new(runs, expected, timed_out);
            progress.0.update(
                progress.1,
                &format!(
                    "{} of {expected} runs completed, {} failed ({:.0} s)",
                    finished.completed().count(),
                    finished.failed,
                    started.elapsed().as_secs_f64()
                ),
            );
            if finished.done() || timed_out {
                return Ok(finished);
            }
        }
    }
}

/// Runs at the end of a wait.
pub(crate) struct Finished {
    pub(crate) runs: Vec<RunRow>,
    pub(crate) expected: usize,
    pub(crate) failed: usize,
    pub(crate) timed_out: bool,
}

impl Finished {
    fn new(runs: Vec<RunRow>, expected: usize, timed_out: bool) -> Self {
        let failed = runs
            .iter()
            .filter(|r| matches!(r.status.as_str(), "failed" | "cancelled"))
            .count();
        Self {
            runs,
            expected,
            failed,
            timed_out,
        }
    }

    pub(crate) fn completed(&self) -> impl Iterator<Item = &RunRow> {
        self.runs.iter().filter(|r| r.status == "completed")
    }

    fn done(&self) -> bool {
        self.completed().count() + self.failed >= self.expected
    }

    /// When the last run finished (server clock, epoch ms).
    pub(crate) fn last_finished_ms(&self) -> Option<i64> {
        self.runs.iter().filter_map(|r| r.finished_at).max()
    }

    /// What went wrong, for the notes; empty when every run completed.
    pub(crate) fn problems(&self) -> String {
        let completed = self.completed().count();
        let mut problems = Vec::new();
        if self.failed > 0 {
            problems.push(format!("{} runs failed", self.failed));
        }
        if completed + self.failed < self.expected {
            problems.push(format!(
                "only {completed} of {} runs completed{}",
                self.expected,
                if self.timed_out {
                    " before the time limit"
                } else {
                    ""
                }
            ));
        }
        problems.join(", ")
    }
}

/// How a batch of webhooks went.
#[derive(Debug, Default)]
pub(crate) struct Sent {
    pub(crate) accepted: usize,
    /// Other answers by status, and failed requests under `"error"`.
    pub(crate) refused: BTreeMap<String, usize>,
    /// Latency of each accepted request.
    pub(crate) latencies: Vec<Duration>,
    /// Event id and the time (epoch ms) the 202 arrived, when kept.
    pub(crate) events: Vec<(String, i64)>,
    /// When the last answer arrived.
    last_answer: Option<Instant>,
    /// From the first request due to the last answer.
    pub(crate) elapsed: Duration,
}

impl Sent {
    pub(crate) fn errors(&self) -> usize {
        self.refused.values().sum()
    }

    /// "no errors", or the answers that were not 202.
    pub(crate) fn error_text(&self) -> String {
        if self.refused.is_empty() {
            return "no errors".into();
        }
        let parts: Vec<String> = self
            .refused
            .iter()
            .map(|(what, n)| format!("{n}× {what}"))
            .collect();
        format!("errors: {}", parts.join(", "))
    }

    fn merge(&mut self, one: Answer) {
        self.last_answer = self.last_answer.max(Some(one.answered));
        match one.outcome {
            Ok(event) => {
                self.accepted += 1;
                self.latencies.push(one.latency);
                if let Some(event) = event {
                    self.events.push(event);
                }
            }
            Err(what) => *self.refused.entry(what).or_default() += 1,
        }
    }
}

/// One request's answer: the event (when asked for) or what went wrong.
pub(crate) struct Answer {
    outcome: Result<Option<(String, i64)>, String>,
    latency: Duration,
    answered: Instant,
}

/// The body of webhook `n`: distinct per bench run and per event (the
/// server de-duplicates identical bodies), about 300 bytes.
/// How many `shard`s the bench's webhook bodies cycle through: the keys
/// a backlog split over keys uses (`fairness`).
pub(crate) const SHARDS: usize = 1000;

pub(crate) fn webhook_body(nonce: &str, n: usize) -> Vec<u8> {
    let shard = n % SHARDS;
    format!(
        r#"{{"kind":"bench.event","n":{n},"nonce":"{nonce}","shard":"s-{shard}","data":{{"customer":"c-{n}","items":[{{"sku":"A-1","qty":2}},{{"sku":"B-7","qty":1}}],"note":"The quick brown fox jumps over the lazy dog; the bench pads each body to a size webhooks have."}}}}"#
    )
    .into_bytes()
}

/// Posts one webhook; `started` is when the request was due (open-loop
/// latency counts from the schedule, not from when it went out).
pub(crate) async fn post_webhook(
    http: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    started: Instant,
    keep_event: bool,
) -> Answer {
    let sent = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    let outcome = match sent {
        Ok(response) if response.status() == StatusCode::ACCEPTED => {
            if keep_event {
                let answered = epoch_ms();
                match response.json::<Value>().await {
                    Ok(body) => match body["event_id"].as_str() {
                        Some(id) => Ok(Some((id.to_owned(), answered))),
                        None => Err("202 without event_id".into()),
                    },
                    Err(_) => Err("unreadable 202".into()),
                }
            } else {
                response
                    .bytes()
                    .await
                    .map(|_| None)
                    .map_err(|_| "unreadable 202".into())
            }
        }
        Ok(response) => Err(response.status().as_u16().to_string()),
        Err(e) if e.is_timeout() => Err("timeout".into()),
        Err(_) => Err("connection error".into()),
    };
    let answered = Instant::now();
    Answer {
        outcome,
        latency: answered - started,
        answered,
    }
}

/// Sends `count` webhooks from `senders` concurrent senders, each sending
/// its next as soon as its last was answered (closed loop).
pub(crate) async fn send_closed_loop(
    http: &reqwest::Client,
    url: &str,
    nonce: &str,
    count: usize,
    senders: usize,
    keep_events: bool,
    progress: (&Progress, &str),
) -> Sent {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..senders.max(1) {
        let (http, url, nonce, next, done) = (
            http.clone(),
            url.to_owned(),
            nonce.to_owned(),
            next.clone(),
            done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut sent = Sent::default();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return sent;
                }
                let answer = post_webhook(
                    &http,
                    &url,
                    webhook_body(&nonce, n),
                    Instant::now(),
                    keep_events,
                )
                .await;
                sent.merge(answer);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut all = Sent::default();
    let mut pending = tasks;
    while !pending.is_empty() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let sent = done.load(Ordering::Relaxed);
        progress.0.update(
            progress.1,
            &format!(
                "{sent} of {count} webhooks answered ({:.0}/s)",
                sent as f64 / started.elapsed().as_secs_f64()
            ),
        );
        let mut still = Vec::new();
        for task in pending {
            if task.is_finished() {
                if let Ok(sent) = task.await {
                    merge_all(&mut all, sent);
                }
            } else {
                still.push(task);
            }
        }
        pending = still;
    }
    all.elapsed = all.last_answer.map_or(Duration::ZERO, |t| t - started);
    all
}

fn merge_all(all: &mut Sent, one: Sent) {
    all.last_answer = all.last_answer.max(one.last_answer);
    all.accepted += one.accepted;
    for (what, n) in one.refused {
        *all.refused.entry(what).or_default() += n;
    }
    all.latencies.extend(one.latencies);
    all.events.extend(one.events);
}

/// Sends `count` webhooks at `rate` per second on a fixed schedule, without
/// waiting for earlier answers (open loop), at most `max_in_flight` at once.
pub(crate) async fn send_open_loop(
    http: &reqwest::Client,
    url: &str,
    nonce: &str,
    count: usize,
    rate: f64,
    keep_events: bool,
    progress: (&Progress, &str),
) -> Sent {
    const MAX_IN_FLIGHT: usize = 4096;
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let start = Instant::now() + Duration::from_millis(20);
    let mut tasks = Vec::with_capacity(count);
    for n in 0..count {
        let due = start + Duration::from_secs_f64(n as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (http, url, body) = (http.clone(), url.to_owned(), webhook_body(nonce, n));
        tasks.push(tokio::spawn(async move {
            let answer = post_webhook(&http, &url, body, due, keep_events).await;
            drop(permit);
            answer
        }));
        if n % 500 == 0 {
            progress.0.update(
                progress.1,
                &format!("{n} of {count} webhooks sent at {rate:.0}/s"),
            );
        }
    }
    let mut all = Sent::default();
    for task in tasks {
        if let Ok(answer) = task.await {
            all.merge(answer);
        }
    }
    all.elapsed = all
        .last_answer
        .map_or(Duration::ZERO, |t| t.saturating_duration_since(start));
    all
}
