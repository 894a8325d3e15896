//! How an automation's runs start (`"flow": {…}` beside `trigger`;
//! docs/workflows.md, "Priority" and the sections after it): the controls
//! the dispatch applies to the runs an event starts.
//!
//! `priority`: an integer from [`MIN_PRIORITY`] to [`MAX_PRIORITY`], or a
//! template over the run's first context rendering one (`"{{_body.tier}}"`).
//! A run's jobs are claimed in their tenant's share highest priority first
//! (then oldest first); the share itself is the tenant's whatever the
//! priority, so a tenant cannot take another's slots by raising its own.
//! A written priority is checked at save; a rendered one that is not an
//! integer, or that a template cannot render, is 0 (said in the dispatch's
//! log), and one outside the range is held to it.
//!
//! The start controls (`debounce`, `throttle`, `batch`, `singleton`; one
//! per automation) each keep one row per key: the dispatch renders the
//! control's `key` over the run's first context, reads the key's row
//! (locked: two dispatchers decide one after the other) and asks
//! [`decide`] what the event does. Its answer is in rows only — a run
//! whose first job is due later, held by the control (what `blocked_by`
//! says), an open run the event joins, a run written `skipped` — so a
//! restart loses no debounce window and no batch. The table, for a key
//! whose row names a run that is *open* (its first job not yet claimed),
//! *active* (begun, not finished) or neither (ended, or no row):
//!
//! | control | open | active | neither |
//! |---|---|---|---|
//! | `debounce` | join: due `min(now + period, opened + maxWait)`, the last body | start, due `now + period` | start, due `now + period` |
//! | `batch` | join while under `maxSize` (due now at `maxSize`), else start | start, due `now + timeout` | start, due `now + timeout` |
//! | `throttle` | start at the next free slot | same | same |
//! | `singleton` `skip` | `skipped` | `skipped` | start now |
//! | `singleton` `cancel` | cancel it, start now | cancel it, start now | start now |
//! | `singleton` `queue` | queue behind it | queue behind it | start now |
//!
//! A singleton key's row counts its queued runs (`count`); a queued run's
//! first job is held (`blocked_by: singleton`) until the scheduler, which
//! looks for keys whose run ended with runs queued, lets the oldest go and
//! names it the key's run.
//!
//! `throttle`'s slot is a generic cell rate (GCRA): each key keeps the time
//! its next start is due (`next`); with `T = period / limit`, a start is
//! due at `max(now, next − (burst − 1)·T)` and moves `next` to
//! `max(next, now) + T`. So `limit` starts per `period`, `burst` of them at
//! once, and every event gets its run: queued, never dropped.
//!
//! The types of `flow` are the definition's ([`FlowControl`] and its parts,
//! re-exported here from [`crate::definition`]); this module is what they do.

use std::time::Duration;

use serde_json::Value;

use crate::condition::Condition;
use crate::definition::Filter;
pub use crate::definition::{
    Batch, CancelOn, Debounce, FlowControl, Singleton, SingletonMode, Throttle,
};
use crate::duration::format_duration;
use crate::template;

pub const MIN_PRIORITY: i64 = -100;
pub const MAX_PRIORITY: i64 = 100;

/// The shortest period, window or timeout a control may have.
pub const MIN_PERIOD: Duration = Duration::from_millis(100);
/// The longest: a window longer than this is a schedule, not a debounce.
pub const MAX_PERIOD: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most events one batch run takes.
pub const MAX_BATCH: u32 = 100;
/// Most bytes of bodies one batch run's `_events` holds: an event that
/// would pass it makes the batch full (it starts now) and opens the next.
pub const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// Most starts a throttle allows per period.
pub const MAX_THROTTLE: u32 = 10_000;
/// Longest key a control keeps: a longer rendered key is cut to it.
pub const MAX_KEY_LEN: usize = 200;

/// Most `cancelOn` entries an automation has.
pub const MAX_CANCEL_ON: usize = 10;

impl CancelOn {
    /// The value a context has at the entry's `match` path, as the row
    /// keeps it (compact JSON); none when it has none or null there.
    pub fn value(&self, context: &Value) -> Option<String> {
        match crate::context::lookup(context, &self.match_) {
            crate::context::Lookup::Found(Value::Null) | crate::context::Lookup::Missing => None,
            crate::context::Lookup::Found(v) => Some(v.to_string()),
        }
    }
}

/// Whether an event whose context is `event` cancels a run whose row says
/// `value` at `path`, with the entry's `where` (`filter`).
pub fn cancels(path: &str, value: &str, filter: Option<&Filter>, event: &Value) -> bool {
    let matches = match crate::context::lookup(event, path) {
        crate::context::Lookup::Found(v) if !v.is_null() => {
            serde_json::to_string(v).is_ok_and(|text| text == value)
        }
        _ => false,
    };
    matches && filter.is_none_or(|f| Condition::from_filter(f).evaluate(event).result)
}

/// The one start control of an automation, if it has one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Control<'a> {
    Debounce(&'a Debounce),
    Throttle(&'a Throttle),
    Batch(&'a Batch),
    Singleton(&'a Singleton),
}

impl Control<'_> {
    /// The control's name, as its row and `blocked_by` say it.
    pub fn name(&self) -> &'static str {
        match self {
            Control::Debounce(_) => "debounce",
            Control::Throttle(_) => "throttle",
            Control::Batch(_) => "batch",
            Control::Singleton(_) => "singleton",
        }
    }

    fn key_template(&self) -> Option<&str> {
        match self {
            Control::Debounce(c) => c.key.as_deref(),
            Control::Throttle(c) => c.key.as_deref(),
            Control::Batch(c) => c.key.as_deref(),
            Control::Singleton(c) => c.key.as_deref(),
        }
    }

    /// The key of a run starting with `context`: the control's `key`
    /// rendered over it (cut to [`MAX_KEY_LEN`]), `""` without one. A key
    /// the template cannot render is `""` too, with the reason.
    pub fn key(&self, context: &Value) -> (String, Option<String>) {
        let Some(t) = self.key_template() else {
            return (String::new(), None);
        };
        // Rendered no further than the key keeps.
        match template::render_cut(t, context, MAX_KEY_LEN) {
            Ok(Value::String(s)) => (cut(s), None),
            Ok(Value::Null) => (
                String::new(),
                Some(format!(
                    "flow.{}.key rendered null; the run has the key \"\"",
                    self.name()
                )),
            ),
            Ok(other) => (cut(other.to_string()), None),
            Err(e) => (
                String::new(),
                Some(format!(
                    "flow.{}.key: {e}; the run has the key \"\"",
                    self.name()
                )),
            ),
        }
    }

    /// Whether the run may wait for its key's row to say when it starts:
    /// its first steps are not begun at dispatch (a join changes its
    /// context; a queued singleton run must not begin before its turn).
    pub fn holds(&self) -> bool {
        match self {
            Control::Singleton(c) => c.mode == SingletonMode::Queue,
            _ => true,
        }
    }

    /// What the control says of a run it holds, for `blocked_by`.
    pub fn reason(&self, key: &str) -> String {
        let key = if key.is_empty() {
            String::new()
        } else {
            format!(" of key \u{201c}{key}\u{201d}")
        };
        match self {
            Control::Debounce(c) => format!(
                "debounced: starts {} after the last event{key}",
                format_duration(c.period)
            ),
            Control::Throttle(c) => format!(
                "throttled: at most {} starts per {}{key}",
                c.limit,
                format_duration(c.period)
            ),
            Control::Batch(c) => format!(
                "batching: starts with {} events{key} or {} after the first",
                c.max_size,
                format_duration(c.timeout)
            ),
            Control::Singleton(_) => format!("singleton{key}"),
        }
    }
}

/// The queue key of a run queued on a singleton key (`mode: queue`): the
/// scheduler finds a key's queued runs by it, oldest first.
pub fn singleton_queue_key(automation: &str, key: &str) -> String {
    format!("flow:{automation}/{key}")
}

/// How long a queued singleton run's first job is due after (for ever, in
/// effect): the scheduler makes it due when its turn comes.
pub const QUEUED_FOR_MS: i64 = 10 * 365 * 24 * 3600 * 1000;

fn cut(mut key: String) -> String {
    if key.len() > MAX_KEY_LEN {
        let mut at = MAX_KEY_LEN;
        while !key.is_char_boundary(at) {
            at -= 1;
        }
        key.truncate(at);
    }
    key
}

/// What the run a key's row names is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRun {
    /// Not begun: its first job is written and no worker has claimed it.
    Open,
    /// Begun and not finished.
    Active,
    /// Finished, or gone.
    Ended,
}

/// A key's row, as the dispatch read it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyState {
    /// The run the key's last start made, and what it is now.
    pub run_id: String,
    pub run: KeyRun,
    /// When that run's window opened (Unix ms; debounce, batch).
    pub opened_at: i64,
    /// Events in it (batch).
    pub count: i64,
    /// When the key's next start is due (Unix ms; throttle).
    pub next_at: i64,
}

/// What an event does, by [`decide`].
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// A new run, its first step due at `due` (held by the control until
    /// then when that is later than now); the key's row then says
    /// `opened_at`, `count` and `next_at` of it.
    Start {
        due: i64,
        opened_at: i64,
        count: i64,
        next_at: i64,
    },
    /// The event goes into the key's open run `run_id`, whose first step
    /// is then due at `due`, with `count` events.
    Join {
        run_id: String,
        due: i64,
        count: i64,
    },
    /// A run of the key is unfinished: the event's run is `skipped`.
    Skip { active: String },
    /// That run is cancelled first, then the event's starts now.
    Replace { active: String },
    /// The event's run waits behind `behind` (the key's unfinished run)
    /// and the runs queued before it; the key then has `waiting` queued.
    /// The scheduler lets the oldest go when the key's run ends.
    Queue { behind: String, waiting: i64 },
}

/// The start control's decision for one event at `now` (Unix ms), given
/// its key's row (see the table in the module doc).
pub fn decide(control: Control<'_>, state: Option<&KeyState>, now: i64) -> Gate {
    let start = |due: i64, count: i64, next_at: i64| Gate::Start {
        due,
        opened_at: now,
        count,
        next_at,
    };
    let open = state.filter(|s| s.run == KeyRun::Open);
    let unfinished = state.filter(|s| s.run != KeyRun::Ended);
    match control {
        Control::Debounce(c) => {
            let period = ms(c.period);
            match open {
                Some(s) => {
                    let latest = c
                        .max_wait
                        .map_or(i64::MAX, |w| s.opened_at.saturating_add(ms(w)));
                    Gate::Join {
                        run_id: s.run_id.clone(),
                        due: (now + period).min(latest).max(now),
                        count: s.count + 1,
                    }
                }
                None => {
                    let latest = c.max_wait.map_or(i64::MAX, |w| now.saturating_add(ms(w)));
                    start((now + period).min(latest), 1, 0)
                }
            }
        }
        Control::Batch(c) => match open {
            Some(s) if s.count < i64::from(c.max_size) => {
                let count = s.count + 1;
                let due = if count >= i64::from(c.max_size) {
                    now
                } else {
                    (s.opened_at + ms(c.timeout)).max(now)
                };
                Gate::Join {
                    run_id: s.run_id.clone(),
                    due,
                    count,
                }
            }
            _ if c.max_size <= 1 => start(now, 1, 0),
            _ => start(now + ms(c.timeout), 1, 0),
        },
        Control::Throttle(c) => {
            let limit = i64::from(c.limit.max(1));
            let interval = (ms(c.period) + limit - 1) / limit;
            let burst = i64::from(c.burst.unwrap_or(1).clamp(1, c.limit.max(1)));
            let next = state.map_or(now, |s| s.next_at);
            let due = (next - (burst - 1) * interval).max(now);
            start(due, 1, next.max(now) + interval)
        }
        Control::Singleton(c) => match (unfinished, c.mode) {
            (Some(s), SingletonMode::Skip) => Gate::Skip {
                active: s.run_id.clone(),
            },
            (Some(s), SingletonMode::Queue) => Gate::Queue {
                behind: s.run_id.clone(),
                waiting: s.count + 1,
            },
            (Some(s), SingletonMode::Cancel) => Gate::Replace {
                active: s.run_id.clone(),
            },
            (None, _) => start(now, 0, 0),
        },
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

impl FlowControl {
    /// The automation's start control: the first it has of `debounce`,
    /// `throttle`, `batch`, `singleton` ([`check`] refuses more than one).
    pub fn control(&self) -> Option<Control<'_>> {
        self.debounce
            .as_ref()
            .map(Control::Debounce)
            .or(self.throttle.as_ref().map(Control::Throttle))
            .or(self.batch.as_ref().map(Control::Batch))
            .or(self.singleton.as_ref().map(Control::Singleton))
    }

    /// The priority of a run that starts with `context`, and why it is 0
    /// when its template did not give one.
    pub fn priority(&self, context: &Value) -> (i32, Option<String>) {
        let Some(priority) = &self.priority else {
            return (0, None);
        };
        let rendered = match priority {
            Value::String(t) => match template::render(t, context) {
                Ok(v) => v,
                Err(e) => {
                    return (
                        0,
                        Some(format!("flow.priority: {e}; the run has priority 0")),
                    );
                }
            },
            other => other.clone(),
        };
        match integer(&rendered) {
            Some(n) => (n.clamp(MIN_PRIORITY, MAX_PRIORITY) as i32, None),
            None => (
                0,
                Some(format!(
                    "flow.priority rendered {rendered}, not an integer; the run has priority 0"
                )),
            ),
        }
    }
}

/// An integer as JSON writes it, or a string of one (a rendered template
/// with text around its placeholder is a string).
fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// What is wrong with a written `flow.priority`, if anything.
pub fn check_priority(priority: &Value) -> Option<String> {
    let range = format!("an integer from {MIN_PRIORITY} to {MAX_PRIORITY}");
    match priority {
        Value::String(t) if template::has_placeholder(t) => template::check(t)
            .err()
            .map(|e| format!("the priority template does not parse: {e}")),
        Value::Number(_) | Value::String(_) => match integer(priority) {
            Some(n) if (MIN_PRIORITY..=MAX_PRIORITY).contains(&n) => None,
            _ => Some(format!(
                "`priority` is {priority}; it must be {range} (higher is claimed first), \
                 or a template rendering one"
            )),
        },
        other => Some(format!(
            "`priority` is {other}; it must be {range}, or a template rendering one"
        )),
    }
}

/// What is wrong with a written `flow`: (path, message) pairs.
pub fn check(flow: &FlowControl) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    let mut error = |path: &str, message: String| errors.push((format!("flow.{path}"), message));
    if let Some(message) = flow.priority.as_ref().and_then(check_priority) {
        error("priority", message);
    }
    let named: Vec<&str> = [
        flow.debounce.as_ref().map(|_| "debounce"),
        flow.throttle.as_ref().map(|_| "throttle"),
        flow.batch.as_ref().map(|_| "batch"),
        flow.singleton.as_ref().map(|_| "singleton"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if named.len() > 1 {
        error(
            named[1],
            format!(
                "`{}` and `{}` both shape the starts; an automation has one of debounce, \
                 throttle, batch and singleton (priority goes with any)",
                named[0], named[1]
            ),
        );
    }
    let range = format!(
        "from {} to {}",
        format_duration(MIN_PERIOD),
        format_duration(MAX_PERIOD)
    );
    let period = |path: &str, d: Duration| {
        if !(MIN_PERIOD..=MAX_PERIOD).contains(&d) {
            Some((
                path.to_owned(),
                format!("`{path}` is {}; it must be {range}", format_duration(d)),
            ))
        } else {
            None
        }
    };
    let mut found = Vec::new();
    let key = |control: &str, key: &Option<String>| {
        if let Some(t) = key
            && let Err(e) = template::check(t)
        {
            Some((
                format!("{control}.key"),
                format!("the key template does not parse: {e}"),
            ))
        } else {
            None
        }
    };
    if let Some(c) = &flow.debounce {
        found.extend(key("debounce", &c.key));
        found.extend(period("debounce.period", c.period));
        if let Some(w) = c.max_wait {
            found.extend(period("debounce.maxWait", w));
            if w < c.period {
                found.push((
                    "debounce.maxWait".into(),
                    format!(
                        "`maxWait` is {}, shorter than the period {}; it bounds how long \
                         events may keep a run waiting, so it is at least the period",
                        format_duration(w),
                        format_duration(c.period)
                    ),
                ));
            }
        }
    }
    if let Some(c) = &flow.throttle {
        found.extend(key("throttle", &c.key));
        found.extend(period("throttle.period", c.period));
        if !(1..=MAX_THROTTLE).contains(&c.limit) {
            found.push((
                "throttle.limit".into(),
                format!(
                    "`limit` is {}; it must be from 1 to {MAX_THROTTLE} starts per period",
                    c.limit
                ),
            ));
        }
        if let Some(b) = c.burst
            && !(1..=c.limit.max(1)).contains(&b)
        {
            found.push((
                "throttle.burst".into(),
                format!(
                    "`burst` is {b}; it must be from 1 to the limit ({})",
                    c.limit
                ),
            ));
        }
    }
    if let Some(c) = &flow.batch {
        found.extend(key("batch", &c.key));
        found.extend(period("batch.timeout", c.timeout));
        if !(1..=MAX_BATCH).contains(&c.max_size) {
            found.push((
                "batch.maxSize".into(),
                format!(
                    "`maxSize` is {}; it must be from 1 to {MAX_BATCH} events",
                    c.max_size
                ),
            ));
        }
    }
    if flow.cancel_on.len() > MAX_CANCEL_ON {
        found.push((
            "cancelOn".into(),
            format!(
                "{} entries; an automation has at most {MAX_CANCEL_ON}",
                flow.cancel_on.len()
            ),
        ));
    }
    for (i, c) in flow.cancel_on.iter().enumerate() {
        if c.source.trim().is_empty() || c.source.len() > MAX_KEY_LEN {
            found.push((
                format!("cancelOn.{i}.source"),
                "`source` names a source's id or an internal event's type (`ticket.closed`)".into(),
            ));
        }
        if c.match_.trim().is_empty() || c.match_.len() > MAX_KEY_LEN || c.match_.contains("{{") {
            found.push((
                format!("cancelOn.{i}.match"),
                "`match` is a path read in the run's context and the event's \
                 (`_body.orderId`), not a template"
                    .into(),
            ));
        }
    }
    if let Some(d) = flow.start_timeout {
        found.extend(period("startTimeout", d));
    }
    if let Some(c) = &flow.singleton {
        found.extend(key("singleton", &c.key));
    }
    for (path, message) in found {
        error(&path, message);
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn flow(priority: Value) -> FlowControl {
        FlowControl {
            priority: Some(priority),
            ..Default::default()
        }
    }

    #[test]
    fn a_written_priority_is_checked_at_save() {
        for ok in [
            json!(0),
            json!(-100),
            json!(100),
            json!("7"),
            json!("{{_body.tier}}"),
        ] {
            assert_eq!(check_priority(&ok), None, "{ok}");
        }
        for bad in [
            json!(101),
            json!(-101),
            json!(1.5),
            json!("high"),
            json!(true),
            json!([1]),
        ] {
            let message = check_priority(&bad).unwrap_or_else(|| panic!("{bad} passed"));
            assert!(message.contains("-100 to 100"), "{message}");
        }
        assert!(
            check_priority(&json!("{{ _body.tier"))
                .unwrap()
                .contains("does not parse")
        );
    }

    #[test]
    fn a_rendered_priority_is_an_integer_held_to_the_range_or_0_with_the_reason() {
        let context = json!({ "_body": { "tier": 50, "big": 1000, "name": "gold", "text": "20" } });
        assert_eq!(flow(json!(30)).priority(&context), (30, None));
        assert_eq!(FlowControl::default().priority(&context), (0, None));
        assert_eq!(flow(json!("{{_body.tier}}")).priority(&context), (50, None));
        assert_eq!(flow(json!("{{_body.text}}")).priority(&context), (20, None));
        assert_eq!(flow(json!("{{_body.big}}")).priority(&context), (100, None));
        let (n, why) = flow(json!("{{_body.name}}")).priority(&context);
        assert_eq!(n, 0);
        assert!(why.unwrap().contains("\"gold\", not an integer"));
        let (n, why) = flow(json!("{{_body.missing}}")).priority(&context);
        assert_eq!(n, 0);
        assert!(why.unwrap().contains("_body.missing"));
    }

    fn control(flow: Value) -> FlowControl {
        serde_json::from_value(flow).expect("a flow")
    }

    fn row(run: KeyRun, opened_at: i64, count: i64, next_at: i64) -> KeyState {
        KeyState {
            run_id: "r1".into(),
            run,
            opened_at,
            count,
            next_at,
        }
    }

    #[test]
    fn debounce_joins_the_open_run_until_max_wait_and_starts_anew_once_it_began() {
        let flow = control(json!({ "debounce": { "period": "10s", "maxWait": "25s" } }));
        let c = flow.control().unwrap();
        assert_eq!(
            decide(c, None, 1_000),
            Gate::Start {
                due: 11_000,
                opened_at: 1_000,
                count: 1,
                next_at: 0
            }
        );
        let open = row(KeyRun::Open, 1_000, 1, 0);
        assert_eq!(
            decide(c, Some(&open), 5_000),
            Gate::Join {
                run_id: "r1".into(),
                due: 15_000,
                count: 2
            }
        );
        // Past maxWait of the first event, the run is due at it.
        assert_eq!(
            decide(c, Some(&row(KeyRun::Open, 1_000, 3, 0)), 20_000),
            Gate::Join {
                run_id: "r1".into(),
                due: 26_000,
                count: 4
            }
        );
        for began in [KeyRun::Active, KeyRun::Ended] {
            assert!(matches!(
                decide(c, Some(&row(began, 1_000, 1, 0)), 30_000),
                Gate::Start {
                    due: 40_000,
                    opened_at: 30_000,
                    ..
                }
            ));
        }
    }

    #[test]
    fn a_batch_fills_to_max_size_then_is_due_at_once_and_the_next_event_opens_another() {
        let flow = control(json!({ "batch": { "maxSize": 3, "timeout": "5s" } }));
        let c = flow.control().unwrap();
        assert!(matches!(
            decide(c, None, 0),
            Gate::Start {
                due: 5_000,
                count: 1,
                ..
            }
        ));
        let second = decide(c, Some(&row(KeyRun::Open, 0, 1, 0)), 1_000);
        assert_eq!(
            second,
            Gate::Join {
                run_id: "r1".into(),
                due: 5_000,
                count: 2
            }
        );
        let third = decide(c, Some(&row(KeyRun::Open, 0, 2, 0)), 2_000);
        assert_eq!(
            third,
            Gate::Join {
                run_id: "r1".into(),
                due: 2_000,
                count: 3
            }
        );
        assert!(matches!(
            decide(c, Some(&row(KeyRun::Open, 0, 3, 0)), 2_500),
            Gate::Start {
                due: 7_500,
                count: 1,
                ..
            }
        ));
        let one = control(json!({ "batch": { "maxSize": 1, "timeout": "5s" } }));
        assert!(matches!(
            decide(one.control().unwrap(), None, 9),
            Gate::Start { due: 9, .. }
        ));
    }

    #[test]
    fn throttle_spaces_starts_by_period_over_limit_with_a_burst_and_drops_none() {
        let flow = control(json!({ "throttle": { "limit": 2, "period": "1s" } }));
        let c = flow.control().unwrap();
        let mut state: Option<KeyState> = None;
        let mut dues = Vec::new();
        for _ in 0..10 {
            let Gate::Start { due, next_at, .. } = decide(c, state.as_ref(), 0) else {
                panic!("a throttle always starts");
            };
            dues.push(due);
            state = Some(row(KeyRun::Open, 0, 1, next_at));
        }
        assert_eq!(
            dues,
            [
                0, 500, 1_000, 1_500, 2_000, 2_500, 3_000, 3_500, 4_000, 4_500
            ]
        );
        // After a quiet while the key is due at once again.
        assert!(matches!(
            decide(c, state.as_ref(), 60_000),
            Gate::Start {
                due: 60_000,
                next_at: 60_500,
                ..
            }
        ));
        let burst = control(json!({ "throttle": { "limit": 4, "period": "4s", "burst": 2 } }));
        let c = burst.control().unwrap();
        let mut state: Option<KeyState> = None;
        let mut dues = Vec::new();
        for _ in 0..4 {
            let Gate::Start { due, next_at, .. } = decide(c, state.as_ref(), 0) else {
                panic!("a throttle always starts");
            };
            dues.push(due);
            state = Some(row(KeyRun::Open, 0, 1, next_at));
        }
        assert_eq!(dues, [0, 0, 1_000, 2_000]);
    }

    #[test]
    fn singleton_skips_or_replaces_an_unfinished_run_and_starts_when_none_is() {
        let skip = control(json!({ "singleton": { "key": "{{_body.order}}", "mode": "skip" } }));
        let cancel = control(json!({ "singleton": { "mode": "cancel" } }));
        let queue = control(json!({ "singleton": { "mode": "queue" } }));
        assert_eq!(
            decide(
                queue.control().unwrap(),
                Some(&row(KeyRun::Active, 0, 2, 0)),
                5
            ),
            Gate::Queue {
                behind: "r1".into(),
                waiting: 3
            }
        );
        assert!(matches!(
            decide(
                queue.control().unwrap(),
                Some(&row(KeyRun::Ended, 0, 0, 0)),
                5
            ),
            Gate::Start {
                due: 5,
                count: 0,
                ..
            }
        ));
        for run in [KeyRun::Open, KeyRun::Active] {
            assert_eq!(
                decide(skip.control().unwrap(), Some(&row(run, 0, 1, 0)), 5),
                Gate::Skip {
                    active: "r1".into()
                }
            );
            assert_eq!(
                decide(cancel.control().unwrap(), Some(&row(run, 0, 1, 0)), 5),
                Gate::Replace {
                    active: "r1".into()
                }
            );
        }
        for c in [skip.control().unwrap(), cancel.control().unwrap()] {
            assert!(matches!(
                decide(c, Some(&row(KeyRun::Ended, 0, 1, 0)), 5),
                Gate::Start { due: 5, .. }
            ));
            assert!(matches!(decide(c, None, 5), Gate::Start { due: 5, .. }));
        }
    }

    #[test]
    fn a_key_is_its_template_rendered_over_the_context_cut_to_its_bound() {
        let flow = control(json!({ "debounce": { "key": "{{_body.customer}}", "period": "1s" } }));
        let c = flow.control().unwrap();
        assert_eq!(
            c.key(&json!({ "_body": { "customer": "c-1" } })),
            ("c-1".into(), None)
        );
        assert_eq!(
            c.key(&json!({ "_body": { "customer": 42 } })),
            ("42".into(), None)
        );
        let (key, why) = c.key(&json!({ "_body": {} }));
        assert_eq!(key, "");
        assert!(why.unwrap().contains("_body.customer"));
        let long = "é".repeat(300);
        let (key, _) = c.key(&json!({ "_body": { "customer": long } }));
        assert!(key.len() <= MAX_KEY_LEN && key.chars().all(|ch| ch == 'é'));
        let unkeyed = control(json!({ "throttle": { "limit": 1, "period": "1s" } }));
        assert_eq!(
            unkeyed.control().unwrap().key(&json!({})),
            (String::new(), None)
        );
    }

    #[test]
    fn a_written_flow_is_checked_at_save_with_the_path_and_the_bound() {
        let errors = |flow: Value| -> Vec<(String, String)> { check(&control(flow)) };
        assert!(
            errors(json!({ "debounce": { "period": "5m", "maxWait": "1h", "key": "{{id}}" } }))
                .is_empty()
        );
        assert!(
            errors(
                json!({ "throttle": { "limit": 2, "period": "1s", "burst": 2 }, "priority": 5 })
            )
            .is_empty()
        );
        for (flow, path, says) in [
            (
                json!({ "debounce": { "period": "10ms" } }),
                "flow.debounce.period",
                "from 100ms",
            ),
            (
                json!({ "debounce": { "period": "8d" } }),
                "flow.debounce.period",
                "to 7d",
            ),
            (
                json!({ "debounce": { "period": "1m", "maxWait": "30s" } }),
                "flow.debounce.maxWait",
                "at least the period",
            ),
            (
                json!({ "throttle": { "limit": 0, "period": "1s" } }),
                "flow.throttle.limit",
                "from 1",
            ),
            (
                json!({ "throttle": { "limit": 2, "period": "1s", "burst": 3 } }),
                "flow.throttle.burst",
                "to the limit",
            ),
            (
                json!({ "batch": { "maxSize": 101, "timeout": "1s" } }),
                "flow.batch.maxSize",
                "to 100",
            ),
            (
                json!({ "batch": { "maxSize": 5, "timeout": "1s", "key": "{{ x" } }),
                "flow.batch.key",
                "does not parse",
            ),
            (
                json!({ "debounce": { "period": "1s" }, "batch": { "maxSize": 2, "timeout": "1s" } }),
                "flow.batch",
                "one of debounce",
            ),
        ] {
            let found = errors(flow.clone());
            assert!(
                found.iter().any(|(p, m)| p == path && m.contains(says)),
                "{flow}: {found:?}"
            );
        }
    }
}
