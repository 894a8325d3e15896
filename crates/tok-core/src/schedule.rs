//! When poll and schedule triggers are due (docs/operations.md, "The
//! scheduler"), as pure functions of a time: the scheduler asks [`Timing`]
//! when a trigger is first due after it is saved, and when it is due next
//! after it fired.
//!
//! Times are Unix milliseconds. A cron expression is read by the `croner`
//! crate (5 fields, or 6 with seconds first) in the trigger's time zone
//! (`jiff`'s zone database), so "08:00 on weekdays in Europe/Prague" stays
//! 08:00 local across daylight saving changes.

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::definition::Trigger;

/// Shortest allowed poll interval, in seconds.
pub const MIN_POLL_INTERVAL_SECS: u64 = 10;

/// A poll's interval when the trigger names none: by what it polls
/// (`messages` 30 s: chat users expect an answer sooner than mail users;
/// `mail` and anything else 60 s).
pub fn default_poll_interval_secs(service: Option<&str>) -> u64 {
    match service {
        Some("messages") => 30,
        _ => 60,
    }
}

/// Why a schedule trigger cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "cron `{cron}` has {fields} fields; expected 5 (minute hour day month weekday) or 6 (with seconds first)"
    )]
    FieldCount { cron: String, fields: usize },
    #[error("cron `{cron}` is not valid: {reason}")]
    Cron { cron: String, reason: String },
    #[error("`{zone}` is not a known time zone; use an IANA name like `Europe/Prague` or `UTC`")]
    TimeZone { zone: String },
}

/// A cron expression in a time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    cron: Cron,
    zone: TimeZone,
}

impl CronSchedule {
    /// Reads `expr` (5 or 6 fields) in `timezone` (UTC when `None`).
    pub fn parse(expr: &str, timezone: Option<&str>) -> Result<Self, ScheduleError> {
        let fields = expr.split_whitespace().count();
        if fields != 5 && fields != 6 {
            return Err(ScheduleError::FieldCount {
                cron: expr.to_owned(),
                fields,
            });
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expr)
            .map_err(|e| ScheduleError::Cron {
                cron: expr.to_owned(),
                reason: e.to_string(),
            })?;
        let zone = match timezone {
            None => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|_| ScheduleError::TimeZone {
                zone: name.to_owned(),
            })?,
        };
        Ok(Self { cron, zone })
    }

    /// The first tick strictly after `after_ms`; `None` when the
    /// expression never matches again (`0 0 30 2 *`).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let from = Timestamp::from_millisecond(after_ms)
            .ok()?
            .to_zoned(self.zone.clone());
        let next = self.cron.find_next_occurrence(&from, false).ok()?;
        Some(next.timestamp().as_millisecond())
    }
}

/// How a poll or schedule trigger comes due.
#[derive(Debug, Clone)]
pub enum Timing {
    /// Every `interval_ms` since the last poll run started.
    Poll { interval_ms: i64 },
    /// At each tick of a cron schedule.
    Cron(Box<CronSchedule>),
}

impl Timing {
    /// The timing of a poll or schedule trigger; `None` for other kinds.
    pub fn of(trigger: &Trigger) -> Option<Result<Self, ScheduleError>> {
        match trigger {
            Trigger::Poll {
                interval_sec,
                service,
                ..
            } => {
                let secs = interval_sec
                    .unwrap_or_else(|| default_poll_interval_secs(service.as_deref()))
                    .max(MIN_POLL_INTERVAL_SECS);
                Some(Ok(Timing::Poll {
                    interval_ms: (secs * 1000) as i64,
                }))
            }
            Trigger::Schedule { cron, timezone, .. } => Some(
                CronSchedule::parse(cron, timezone.as_deref()).map(|c| Timing::Cron(Box::new(c))),
            ),
            _ => None,
        }
    }

    /// The trigger kind a run of this timing gets (`runs.trigger_type`).
    pub fn kind(&self) -> &'static str {
        match self {
            Timing::Poll { .. } => "poll",
            Timing::Cron(_) => "schedule",
        }
    }

    /// When a trigger saved at `now` is first due: a poll at once, a
    /// schedule at its next tick.
    pub fn first_due(&self, now: i64) -> Option<i64> {
        match self {
            Timing::Poll { .. } => Some(now),
            Timing::Cron(cron) => cron.next_after(now),
        }
    }

    /// When a trigger due at `due` and fired at `now` is due next. A poll
    /// keeps its cadence (one interval after `due`) while it is on time,
    /// and counts an interval from `now` when it was late (the server was
    /// down, or the last poll run outlasted the interval). A schedule is
    /// due at the first tick after `now`, however many ticks passed since
    /// the one it fired for: one catch-up run, never a burst.
    pub fn next_due(&self, due: i64, now: i64) -> Option<i64> {
        match self {
            Timing::Poll { interval_ms } if due + interval_ms > now => Some(due + interval_ms),
            Timing::Poll { interval_ms } => Some(now + interval_ms),
            Timing::Cron(cron) => cron.next_after(now),
        }
    }

    /// Whether firing the tick due at `due` at time `now` stands for more
    /// than one tick (the server was down, or the wake late, past the next).
    pub fn is_catch_up(&self, due: i64, now: i64) -> bool {
        match self {
            Timing::Poll { interval_ms } => now - due >= *interval_ms,
            Timing::Cron(cron) => cron.next_after(due).is_some_and(|next| next <= now),
        }
    }
}

/// Unix milliseconds as the RFC 3339 instant `_event.scheduledAt` shows.
pub fn instant(ms: i64) -> String {
    Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    #[test]
    fn five_and_six_fields_tick_in_their_zone() {
        let weekday_8 = CronSchedule::parse("0 8 * * 1-5", Some("Europe/Prague")).unwrap();
        // Friday 2026-12-04 09:00 Prague → Monday 08:00 Prague (07:00 UTC in winter).
        assert_eq!(
            weekday_8.next_after(ms("2026-12-04T08:00:00Z")),
            Some(ms("2026-12-07T07:00:00Z"))
        );
        // In summer Prague is UTC+2.
        assert_eq!(
            weekday_8.next_after(ms("2026-07-01T05:59:00Z")),
            Some(ms("2026-07-01T06:00:00Z"))
        );
        let every_2s = CronSchedule::parse("*/2 * * * * *", None).unwrap();
        assert_eq!(
            every_2s.next_after(ms("2026-12-01T10:00:00.500Z")),
            Some(ms("2026-12-01T10:00:02Z"))
        );
        assert_eq!(
            every_2s.next_after(ms("2026-12-01T10:00:02Z")),
            Some(ms("2026-12-01T10:00:04Z"))
        );
    }

    #[test]
    fn bad_expressions_and_zones_say_what_is_wrong() {
        let err = CronSchedule::parse("0 8 * *", None).unwrap_err();
        assert!(err.to_string().contains("has 4 fields"), "{err}");
        let err = CronSchedule::parse("0 25 * * *", None).unwrap_err();
        assert!(
            matches!(err, ScheduleError::Cron { .. }),
            "{err}: hour 25 must be refused"
        );
        let err = CronSchedule::parse("0 8 * * *", Some("Mars/Olympus")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`Mars/Olympus` is not a known time zone; use an IANA name like `Europe/Prague` or `UTC`"
        );
    }

    #[test]
    fn after_downtime_one_catch_up_then_the_next_tick() {
        let hourly = Timing::Cron(Box::new(CronSchedule::parse("0 * * * *", None).unwrap()));
        let due = ms("2026-12-01T10:00:00Z");
        let now = ms("2026-12-01T13:20:00Z");
        assert!(hourly.is_catch_up(due, now));
        assert_eq!(hourly.next_due(due, now), Some(ms("2026-12-01T14:00:00Z")));
        assert!(!hourly.is_catch_up(due, ms("2026-12-01T10:00:01Z")));
    }

    #[test]
    fn polls_default_by_service_and_start_at_once() {
        let poll = |v: serde_json::Value| Timing::of(&serde_json::from_value(v).unwrap());
        let Some(Ok(Timing::Poll { interval_ms })) =
            poll(serde_json::json!({"kind": "poll", "service": "messages"}))
        else {
            panic!("a poll trigger has a poll timing")
        };
        assert_eq!(interval_ms, 30_000);
        let Some(Ok(mail)) = poll(serde_json::json!({"kind": "poll", "service": "mail"})) else {
            panic!()
        };
        assert_eq!(mail.first_due(1_000), Some(1_000));
        assert_eq!(
            mail.next_due(1_000, 1_400),
            Some(61_000),
            "on time: the cadence holds"
        );
        assert_eq!(
            mail.next_due(1_000, 70_000),
            Some(130_000),
            "late: an interval from now"
        );
        assert!(poll(serde_json::json!({"kind": "manual"})).is_none());
    }
}
