//! `ticket/assign-least-busy`: gives the subject ticket to the member of a
//! group with the fewest open tickets; a tie goes to the lower load relative
//! to capacity, then to the member listed first. A ticket already held by a
//! member of the group stays with them.

use std::cmp::Ordering;

use serde_json::{Map, Value, json};
use tok_store::{MemberLoad, TicketWrite};

use super::{TxContext, TxResult, save, stamp, string, subject_ticket, terminal};

/// The least busy member (see the module doc); `None` for an empty group.
pub(crate) fn least_busy(loads: &[MemberLoad]) -> Option<&MemberLoad> {
    let ratio = |l: &MemberLoad| l.open_tickets as f64 / f64::from(l.member.capacity.max(1));
    loads
        .iter()
        .enumerate()
        .min_by(|(ia, a), (ib, b)| {
            a.open_tickets
                .cmp(&b.open_tickets)
                .then(ratio(a).partial_cmp(&ratio(b)).unwrap_or(Ordering::Equal))
                .then(ia.cmp(ib))
        })
        .map(|(_, l)| l)
}

/// The keys the step's config may have.
pub(crate) const KEYS: &[&str] = &["group", "ticketId"];

/// Checks the step's config at save.
pub(crate) fn validate(config: &Value) -> Result<(), String> {
    super::need(
        config,
        "ticket/assign-least-busy",
        "group",
        "a group's name or id",
    )
}

pub(crate) async fn run(cx: &mut TxContext<'_>, config: &Value) -> TxResult {
    let name = string(config, "group")
        .ok_or_else(|| terminal(format!("step `{}`: `group` is empty", cx.step_id)))?;
    let group = cx.tx.group(&name).await?.ok_or_else(|| {
        terminal(format!(
            "step `{}`: group `{name}` does not exist",
            cx.step_id
        ))
    })?;
    let mut ticket = subject_ticket(cx, config).await?;
    let loads = cx.tx.member_loads(&group.id).await?;
    let chosen = match loads
        .iter()
        .find(|l| Some(&l.member.id) == ticket.assignee_id.as_ref())
    {
        Some(current) => current.member.clone(),
        None => least_busy(&loads)
            .ok_or_else(|| {
                terminal(format!(
                    "step `{}`: group `{}` has no members",
                    cx.step_id, group.name
                ))
            })?
            .member
            .clone(),
    };
    if ticket.assignee_id.as_deref() != Some(chosen.id.as_str()) {
        ticket.assignee_id = Some(chosen.id.clone());
        ticket.assignee_name = Some(chosen.name.clone());
        ticket.updated_at = stamp(ticket.updated_at);
        let trace = vec![format!(
            "Assigned to {} ({}, least busy) by {}",
            chosen.name, group.name, cx.cause.actor
        )];
        save(
            cx,
            TicketWrite {
                ticket,
                created: false,
                changes: vec!["assignee".into()],
                trace,
            },
        )
        .await?;
    }
    let mut out = Map::new();
    out.insert("assigneeId".into(), json!(chosen.id));
    out.insert("assigneeName".into(), json!(chosen.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use tok_store::Member;

    use super::*;

    fn load(name: &str, open: i64, capacity: i32) -> MemberLoad {
        MemberLoad {
            member: Member {
                id: name.into(),
                name: name.into(),
                capacity,
            },
            open_tickets: open,
        }
    }

    #[test]
    fn fewest_open_tickets_wins() {
        let loads = [load("eva", 2, 10), load("jan", 1, 10), load("ota", 3, 10)];
        assert_eq!(least_busy(&loads).unwrap().member.name, "jan");
    }

    #[test]
    fn a_tie_goes_to_the_lower_load_relative_to_capacity() {
        let loads = [load("eva", 2, 4), load("jan", 2, 10), load("ota", 2, 5)];
        assert_eq!(least_busy(&loads).unwrap().member.name, "jan");
    }

    #[test]
    fn a_full_tie_goes_to_the_member_listed_first() {
        let loads = [load("eva", 0, 10), load("jan", 0, 10)];
        assert_eq!(least_busy(&loads).unwrap().member.name, "eva");
        assert!(least_busy(&[]).is_none());
    }
}
