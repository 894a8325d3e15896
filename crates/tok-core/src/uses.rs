//! What an automation refers to by name or id: its webhook source, the
//! connections its calls use, the groups it assigns to or asks for approval,
//! the ticket types it writes, the automations it starts. A resource is
//! deleted only when no automation refers to it (the API's 409 names those
//! that do), and `tok apply` orders what it saves by these references.
//!
//! Only a literal reference counts: a templated one (`{{input.group}}`) is
//! known at run time only, and a step that finds no such resource then
//! fails with an error naming it.
//!
//! Every step is visited through the one walker ([`crate::walk`]), so a
//! reference in a branch, an escalation or a compensation is found too.

use serde_json::Value;

use crate::definition::{Automation, Step, Trigger};
use crate::template::has_placeholder;
use crate::walk::each_step;

/// The kinds of resource a definition refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Source,
    Connection,
    Group,
    TicketType,
    Automation,
}

impl Kind {
    /// The kind as the API and `tok apply` name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Source => "source",
            Kind::Connection => "connection",
            Kind::Group => "group",
            Kind::TicketType => "ticket_type",
            Kind::Automation => "automation",
        }
    }
}

/// One reference: what it names (a name or an id, as written) and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub kind: Kind,
    pub name: String,
    /// The dot path of the field that holds it (`trigger.source`,
    /// `steps.2.config.connection`).
    pub path: String,
}

/// Every literal reference of the definition, in the order of its fields.
pub fn references(automation: &Automation) -> Vec<Reference> {
    let mut found = Vec::new();
    if let Trigger::Webhook { source, .. } = &automation.trigger {
        push(&mut found, Kind::Source, source, "trigger.source".into());
    }
    each_step(&automation.steps, "steps", &mut |path, step| {
        step_references(path, step, &mut found);
    });
    found
}

/// Whether the definition refers to the resource of `kind` whose id is `id`
/// and whose name is `name` (a reference may use either).
pub fn refers_to(automation: &Automation, kind: Kind, id: &str, name: &str) -> Option<Reference> {
    references(automation)
        .into_iter()
        .find(|r| r.kind == kind && (r.name == id || r.name == name))
}

/// Where in a step's config each kind of reference sits, by step type.
fn step_references(path: &str, step: &Step, found: &mut Vec<Reference>) {
    let config = |pointer: &str| step.config.pointer(pointer).and_then(Value::as_str);
    let at = |field: &str| format!("{path}.config.{field}");
    match step.kind.as_str() {
        "http" | "mcp" => {
            if let Some(name) = config("/connection") {
                push(found, Kind::Connection, name, at("connection"));
            }
        }
        "ticket/assign-least-busy" => {
            if let Some(name) = config("/group") {
                push(found, Kind::Group, name, at("group"));
            }
        }
        "approval" => {
            if let Some(name) = config("/approvers/group") {
                push(found, Kind::Group, name, at("approvers.group"));
            }
        }
        "ticket/upsert" | "ticket/set-type" => {
            if let Some(name) = config("/type") {
                push(found, Kind::TicketType, name, at("type"));
            }
        }
        crate::children::RUN_WORKFLOW => {
            if let Some(name) = config("/automation") {
                push(found, Kind::Automation, name, at("automation"));
            }
        }
        _ => {}
    }
}

fn push(found: &mut Vec<Reference>, kind: Kind, name: &str, path: String) {
    let name = name.trim();
    if name.is_empty() || has_placeholder(name) {
        return;
    }
    found.push(Reference {
        kind,
        name: name.to_owned(),
        path,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn automation(json: &str) -> Automation {
        Automation::from_json(json).unwrap()
    }

    #[test]
    fn finds_references_in_every_child_list_and_skips_templates() {
        let a = automation(
            r#"{"name":"a","trigger":{"kind":"webhook","source":"src_1"},"steps":[
                {"id":"c","type":"condition","rules":[{"field":"x","operator":"isEmpty"}],
                 "then":[{"id":"h","type":"http","config":{"connection":"shop","url":"/x"}}],
                 "else":[{"id":"t","type":"ticket/upsert","config":{"externalId":"1","type":"order"}}]},
                {"id":"p","type":"parallel","branches":[[
                    {"id":"a","type":"approval","config":{"approvers":{"group":"{{input.g}}"}}},
                    {"id":"g","type":"ticket/assign-least-busy","config":{"group":"warehouse"}}
                ]]},
                {"id":"w","type":"run_workflow","config":{"automation":"child"}}
            ]}"#,
        );
        let refs = references(&a);
        let found: Vec<(Kind, &str, &str)> = refs
            .iter()
            .map(|r| (r.kind, r.name.as_str(), r.path.as_str()))
            .collect();
        assert_eq!(
            found,
            vec![
                (Kind::Source, "src_1", "trigger.source"),
                (Kind::Connection, "shop", "steps.0.then.0.config.connection"),
                (Kind::TicketType, "order", "steps.0.else.0.config.type"),
                (
                    Kind::Group,
                    "warehouse",
                    "steps.1.branches.0.1.config.group"
                ),
                (Kind::Automation, "child", "steps.2.config.automation"),
            ]
        );
        assert!(refers_to(&a, Kind::Group, "grp_9", "warehouse").is_some());
        assert!(refers_to(&a, Kind::Group, "grp_9", "sales").is_none());
    }
}
