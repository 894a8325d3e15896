//! The words of the incidents a run raises: the title and impact a tenant
//! reads (no step names, no run ids), and the source that keeps one cause
//! from opening a second incident while the first is open. The engine adds
//! the admin's detail (ids, steps, input). And the line any run that ends
//! writes to its ticket's trace ([`run_ended_trace`]).
//!
//! A run that failed for good at a step is a [`Failure`]: the decider's
//! effects carry it, and its incident is worded here.

use crate::ids::AutomationId;
use crate::limits::MAX_DEPTH;
use crate::run::RunStatus;

/// A run that failed for good at a step.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub step_id: String,
    pub path: String,
    pub kind: String,
    pub attempt: u32,
    pub message: String,
}

/// What an incident says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentText {
    /// The dedupe key: one open incident per source.
    pub source: String,
    pub title: String,
    pub impact: String,
}

/// A run that failed for good at a step. `ticket` is the external id of
/// the run's subject ticket, when it has one.
pub fn run_failed(
    automation_id: &AutomationId,
    automation_name: &str,
    ticket: Option<&str>,
    failure: &Failure,
) -> IncidentText {
    let source = format!("run-failed:{automation_id}:{}", failure.step_id);
    match ticket {
        Some(ticket) => IncidentText {
            source,
            title: format!(
                "The automation \u{201c}{automation_name}\u{201d} did not finish for ticket {ticket}"
            ),
            impact: format!(
                "The automation for ticket {ticket} did not finish; no data was lost. \
                 It can be retried from where it stopped."
            ),
        },
        None => IncidentText {
            source,
            title: format!("The automation \u{201c}{automation_name}\u{201d} did not finish"),
            impact: "An event was received but its automation did not finish; no data was lost. \
                     It can be retried from where it stopped."
                .to_owned(),
        },
    }
}

/// A compensation step failed for good (`failure.message` names the step
/// it was undoing): what the run did is not all undone.
pub fn compensation_failed(
    automation_id: &AutomationId,
    automation_name: &str,
    ticket: Option<&str>,
    failure: &Failure,
) -> IncidentText {
    let source = format!("compensation-failed:{automation_id}:{}", failure.step_id);
    let what = match ticket {
        Some(ticket) => format!("for ticket {ticket} "),
        None => String::new(),
    };
    IncidentText {
        source,
        title: format!(
            "The automation \u{201c}{automation_name}\u{201d} could not undo all it did {what}"
        )
        .trim_end()
        .to_owned(),
        // No step names (the tenant reads this): the incident's detail and
        // the run's error name the undo and the step it was undoing.
        impact: format!(
            "A run {what}was stopped and began to undo what it did, but one undo did not \
             succeed after its retries; what it should have undone may still be in place. \
             Check it by hand: the run's steps show which undo failed."
        ),
    }
}

/// The line a run that ended writes to its ticket's trace (the ticket's
/// log says what each automation did, not only what failed): its kind
/// (`run_completed`, `run_cancelled`, `run_failed`) and its message. `None`
/// for a status that is not an end.
pub fn run_ended_trace(
    automation_name: &str,
    status: RunStatus,
    error: Option<&str>,
) -> Option<(&'static str, String)> {
    let name = format!("\u{201c}{automation_name}\u{201d}");
    Some(match status {
        RunStatus::Completed => ("run_completed", format!("Automation {name} completed")),
        RunStatus::Cancelled => ("run_cancelled", format!("Automation {name} was cancelled")),
        RunStatus::Failed => (
            "run_failed",
            match error {
                Some(error) => format!("Automation {name} failed: {error}"),
                None => format!("Automation {name} failed"),
            },
        ),
        _ => return None,
    })
}

/// A change could not raise its event: the chain of automations that led
/// to it is deeper than [`MAX_DEPTH`].
pub fn chain_too_deep(automation_id: &AutomationId, automation_name: &str) -> IncidentText {
    IncidentText {
        source: format!("loop:{automation_id}"),
        title: format!(
            "Automations keep triggering each other (last: \u{201c}{automation_name}\u{201d})"
        ),
        impact: format!(
            "A chain of automations that trigger each other was stopped after {MAX_DEPTH} levels; \
             the last change did not start further automations. Check the automations that \
             react to each other's changes."
        ),
    }
}

/// A run could not start (or go on): its automation's stored definition
/// no longer parses (a row changed outside tok, or written by a version
/// that read it differently). One incident per automation version.
pub fn definition_invalid(automation_id: &AutomationId, version: i32) -> IncidentText {
    IncidentText {
        source: format!("definition-invalid:{automation_id}:{version}"),
        title: format!(
            "An automation's saved definition cannot be read (automation {automation_id}, version {version})"
        ),
        impact: "An event started this automation, but its saved definition is not valid, so \
                 the run failed before its first step; no data was lost. Save the automation \
                 again, then retry the failed runs."
            .to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> Failure {
        Failure {
            step_id: "st_call".into(),
            path: "1".into(),
            kind: "http".into(),
            attempt: 3,
            message: "503 from the service".into(),
        }
    }

    #[test]
    fn a_tenant_reads_the_ticket_and_no_step_names_or_run_ids() {
        let id = AutomationId::from("aut_1".to_string());
        let text = run_failed(&id, "New order", Some("TK-4822"), &failure());
        assert_eq!(text.source, "run-failed:aut_1:st_call");
        assert_eq!(
            text.impact,
            "The automation for ticket TK-4822 did not finish; no data was lost. \
             It can be retried from where it stopped."
        );
        assert!(!text.title.contains("st_call") && !text.impact.contains("st_call"));
        let without = run_failed(&id, "New order", None, &failure());
        assert_eq!(
            without.title,
            "The automation \u{201c}New order\u{201d} did not finish"
        );
    }

    #[test]
    fn a_failed_undo_tells_the_tenant_no_step_names() {
        let id = AutomationId::from("aut_1".to_string());
        let failure = Failure {
            step_id: "undo_hotel".into(),
            path: "1.compensate.0".into(),
            kind: "http".into(),
            attempt: 3,
            message: "compensation `undo_hotel` of step `hotel` failed: 404".into(),
        };
        let text = compensation_failed(&id, "Trip", Some("TK-7"), &failure);
        assert_eq!(text.source, "compensation-failed:aut_1:undo_hotel");
        assert_eq!(
            text.title,
            "The automation \u{201c}Trip\u{201d} could not undo all it did for ticket TK-7"
        );
        for word in ["undo_hotel", "hotel`", "404", "1.compensate"] {
            assert!(!text.impact.contains(word), "{word} in {}", text.impact);
        }
        assert!(text.impact.contains("for ticket TK-7"), "{}", text.impact);
    }

    #[test]
    fn an_ended_run_names_its_automation_and_how_it_ended() {
        assert_eq!(
            run_ended_trace("Route orders", RunStatus::Completed, None),
            Some((
                "run_completed",
                "Automation \u{201c}Route orders\u{201d} completed".to_owned()
            ))
        );
        let (kind, line) =
            run_ended_trace("Route orders", RunStatus::Failed, Some("timed out")).unwrap();
        assert_eq!(kind, "run_failed");
        assert!(line.ends_with("failed: timed out"), "{line}");
        assert_eq!(
            run_ended_trace("X", RunStatus::Cancelled, None).unwrap().0,
            "run_cancelled"
        );
        assert_eq!(run_ended_trace("X", RunStatus::Waiting, None), None);
    }
}
