//! `tok serve --demo`: one tenant set up as the service desk of README.md,
//! "A service desk in five minutes", so that a newcomer can replay that
//! scenario with curl.
//!
//! The tenant is named [`TENANT_NAME`]. Seeding goes piece by piece and by
//! name — groups, ticket types, sources, automations — and leaves alone what
//! the tenant already has, so a restart with `--demo` changes nothing and a
//! start that died halfway is completed by the next one. Only the start that
//! creates the tenant knows its API key (the database keeps a hash), so only
//! that start can print it.
//!
//! Run `--demo` on one node: two processes seeding the same empty database
//! at the same moment would create two demo tenants.

use std::fmt;

use anyhow::{Context as _, anyhow};
use serde_json::{Value, json};
use tok_core::contract::{self, Param, ParamType};
use tok_core::ids::TenantId;
use tok_engine::Registry;
use tok_engine::definitions::prepare;
use tok_store::{
    AdminStore, DefinitionStore, DeskStore, NewGroup, NewSource, NewTicketType, Source, Store,
    hash_secret, random_token,
};

/// The demo tenant's name: a tenant of this name means the demo is seeded.
pub const TENANT_NAME: &str = "Demo";

/// The warehouse, shipping and IT groups: (group, [(member, capacity)]).
const GROUPS: &[(&str, &[(&str, i32)])] = &[
    ("warehouse", &[("Eva", 10), ("Jan", 10), ("Ota", 10)]),
    ("shipping", &[("Petra", 8), ("Karel", 8)]),
    ("IT", &[("Lucie", 5), ("Martin", 5), ("Tomas", 5)]),
];

/// Ticket types and their statuses; a new ticket starts in the first one.
const TICKET_TYPES: &[(&str, &[&str])] = &[
    ("order", &["new", "awaiting packing", "packed", "shipped"]),
    ("error", &["open", "investigating", "resolved"]),
];

/// What a start with `--demo` found or did.
#[derive(Debug)]
pub enum Seeded {
    /// The demo tenant was created by this start.
    Created(DemoTenant),
    /// A tenant named [`TENANT_NAME`] existed already; `added` names the
    /// pieces it lacked and now has (empty after a clean earlier seeding).
    Existing {
        tenant: TenantId,
        added: Vec<String>,
    },
}

/// The demo tenant as a user needs it to send webhooks and call the API.
#[derive(Debug)]
pub struct DemoTenant {
    pub tenant: TenantId,
    /// The tenant's API key (`tok_demo_…`); only its hash is stored.
    pub api_key: String,
    /// Where the web shop posts its orders.
    pub eshop_webhook: String,
    /// Where the document converter posts its errors.
    pub converter_webhook: String,
}

/// Shell lines a user can paste as they are; the README's walkthrough uses
/// these variable names.
impl fmt::Display for DemoTenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Seeded the demo tenant \"{TENANT_NAME}\" (the service desk of the \
             README's \"A service desk in five minutes\"). \
             Its API key is shown once; paste these lines into your shell:"
        )?;
        writeln!(f, "  export DEMO_TENANT={}", self.tenant)?;
        writeln!(f, "  export DEMO_KEY={}", self.api_key)?;
        writeln!(f, "  export ESHOP_WEBHOOK={}", self.eshop_webhook)?;
        write!(f, "  export CONVERTER_WEBHOOK={}", self.converter_webhook)
    }
}

/// Seeds the demo tenant unless it exists, and completes it if an earlier
/// seeding stopped halfway. `public_url` is `TOK_PUBLIC_URL`, the base of
/// the webhook URLs.
pub async fn seed(
    store: &dyn Store,
    registry: &Registry,
    public_url: &str,
) -> anyhow::Result<Seeded> {
    let (tenant, api_key) = match find_tenant(store).await? {
        Some(id) => (id, None),
        None => {
            let key = format!("tok_demo_{}", random_token());
            let tenant = store
                .create_tenant(TENANT_NAME, &hash_secret(&key))
                .await
                .context("could not create the demo tenant")?;
            (tenant.id, Some(key))
        }
    };
    let mut added = Vec::new();
    ensure_groups(store, &tenant, &mut added).await?;
    ensure_ticket_types(store, &tenant, &mut added).await?;
    let eshop = ensure_source(store, &tenant, "eshop", eshop_params(), &mut added).await?;
    let converter =
        ensure_source(store, &tenant, "converter", converter_params(), &mut added).await?;
    let definitions = [
        new_order(&eshop),
        route_orders(),
        converter_errors(&converter),
    ];
    ensure_automations(store, registry, &tenant, &definitions, &mut added).await?;

    Ok(match api_key {
        Some(api_key) => {
            let base = public_url.trim_end_matches('/');
            Seeded::Created(DemoTenant {
                tenant,
                api_key,
                eshop_webhook: format!("{base}/webhook/{}", eshop.token),
                converter_webhook: format!("{base}/webhook/{}", converter.token),
            })
        }
        None => Seeded::Existing { tenant, added },
    })
}

async fn find_tenant(store: &dyn AdminStore) -> anyhow::Result<Option<TenantId>> {
    for id in store.tenant_ids().await? {
        if let Some(tenant) = store.tenant(&id).await?
            && tenant.name == TENANT_NAME
        {
            return Ok(Some(tenant.id));
        }
    }
    Ok(None)
}

async fn ensure_groups(
    store: &dyn DeskStore,
    tenant: &TenantId,
    added: &mut Vec<String>,
) -> anyhow::Result<()> {
    let existing = store.groups(tenant).await?;
    for (name, members) in GROUPS {
        if existing.iter().any(|g| g.name == *name) {
            continue;
        }
        store
            .create_group(
                tenant,
                NewGroup {
                    name: (*name).to_owned(),
                    members: members
                        .iter()
                        .map(|(member, capacity)| ((*member).to_owned(), *capacity))
                        .collect(),
                },
            )
            .await
            .with_context(|| format!("could not create the demo group `{name}`"))?;
        added.push(format!("group {name}"));
    }
    Ok(())
}

async fn ensure_ticket_types(
    store: &dyn DeskStore,
    tenant: &TenantId,
    added: &mut Vec<String>,
) -> anyhow::Result<()> {
    let existing = store.ticket_types(tenant).await?;
    for (name, statuses) in TICKET_TYPES {
        if existing.iter().any(|t| t.name == *name) {
            continue;
        }
        store
            .create_ticket_type(
                tenant,
                NewTicketType {
                    name: (*name).to_owned(),
                    statuses: statuses.iter().map(|s| (*s).to_owned()).collect(),
                    fields: json!([]),
                },
            )
            .await
            .with_context(|| format!("could not create the demo ticket type `{name}`"))?;
        added.push(format!("ticket type {name}"));
    }
    Ok(())
}

fn param(name: &str, path: &str) -> Param {
    Param {
        name: name.into(),
        path: path.into(),
        kind: ParamType::String,
        required: true,
    }
}

/// The web shop puts the order id deep in the body; `kind` says what happened.
fn eshop_params() -> Vec<Param> {
    vec![param("orderId", "data.order.id"), param("kind", "kind")]
}

/// The converter reports a document and a list of errors; the first one's
/// message becomes the ticket's title.
fn converter_params() -> Vec<Param> {
    vec![
        param("docId", "document.id"),
        param("errorMessage", "errors.0.message"),
    ]
}

async fn ensure_source(
    store: &dyn DefinitionStore,
    tenant: &TenantId,
    name: &str,
    params: Vec<Param>,
    added: &mut Vec<String>,
) -> anyhow::Result<Source> {
    if let Some(found) = store
        .sources(tenant)
        .await?
        .into_iter()
        .find(|s| s.name == name)
    {
        return Ok(found);
    }
    contract::validate_params(&params)
        .map_err(|e| anyhow!("the demo source `{name}` has a bad contract: {e}"))?;
    let source = store
        .create_source(
            tenant,
            NewSource {
                name: name.to_owned(),
                token: random_token(),
                params: serde_json::to_value(&params)?,
                critical: false,
                rate_limit: None,
                secret: None,
                verify_preset: None,
                schema: None,
            },
        )
        .await
        .with_context(|| format!("could not create the demo source `{name}`"))?;
    added.push(format!("source {name}"));
    Ok(source)
}

/// "New order": an `order.created` from the web shop becomes an order
/// ticket waiting to be packed. The tag is the change "Route orders" reacts to.
fn new_order(eshop: &Source) -> Value {
    json!({
        "name": "New order",
        "trigger": {
            "kind": "webhook",
            "source": eshop.id,
            "filter": { "match": "all", "rules": [
                { "field": "kind", "operator": "eq", "value": "order.created" }
            ]}
        },
        "steps": [
            { "id": "st_ticket", "type": "ticket/upsert",
              "config": { "externalId": "order-{{orderId}}", "type": "order", "title": "Order {{orderId}}" } },
            { "id": "st_tag", "type": "ticket/add-tags",
              "config": { "tags": ["awaiting packing"] } }
        ]
    })
}

/// "Route orders": an order ticket that waits to be packed and has nobody
/// goes to the least busy person in the warehouse. It reacts to any change
/// of the ticket (by an automation or a person), so a person who removes the
/// assignee of a waiting order gets it routed again.
fn route_orders() -> Value {
    json!({
        "name": "Route orders",
        "trigger": {
            "kind": "event",
            "event": "ticket.updated",
            "filter": { "match": "all", "rules": [
                { "field": "ticket.type", "operator": "eq", "value": "order" },
                { "field": "ticket.tags", "operator": "contains", "value": "awaiting packing" },
                { "field": "ticket.assigneeId", "operator": "isEmpty" }
            ]}
        },
        "steps": [
            { "id": "st_assign", "type": "ticket/assign-least-busy", "config": { "group": "warehouse" } }
        ]
    })
}

/// "Converter errors": a document the converter could not read becomes an
/// error ticket for IT and an incident. Each document is its own incident
/// (`source` per document): the default would fold every later document
/// into the first open incident.
fn converter_errors(converter: &Source) -> Value {
    json!({
        "name": "Converter errors",
        "trigger": { "kind": "webhook", "source": converter.id },
        "steps": [
            { "id": "st_ticket", "type": "ticket/upsert",
              "config": { "externalId": "doc-{{docId}}", "type": "error", "title": "{{errorMessage}}" } },
            { "id": "st_assign", "type": "ticket/assign-least-busy", "config": { "group": "IT" } },
            { "id": "st_incident", "type": "incident/create", "config": {
                "title": "Document {{docId}} could not be converted",
                "impact": "Document {{docId}} was not processed and nothing was booked from it; \
                           IT has a ticket for it.",
                "source": "converter:{{docId}}",
                "detail": { "document": "{{docId}}", "message": "{{errorMessage}}", "errors": "{{_body.errors}}" }
            }}
        ]
    })
}

async fn ensure_automations(
    store: &dyn DefinitionStore,
    registry: &Registry,
    tenant: &TenantId,
    definitions: &[Value],
    added: &mut Vec<String>,
) -> anyhow::Result<()> {
    let existing = store.automations(tenant).await?;
    for definition in definitions {
        let raw = serde_json::to_vec(definition)?;
        let (automation, version) = prepare(&raw, registry).map_err(|errors| {
            let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
            anyhow!("a demo automation does not validate: {}", list.join("; "))
        })?;
        if existing.iter().any(|a| a.name == automation.name) {
            continue;
        }
        store
            .create_automation(tenant, version)
            .await
            .with_context(|| {
                format!("could not create the demo automation `{}`", automation.name)
            })?;
        added.push(format!("automation {}", automation.name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(id: &str) -> Source {
        Source {
            id: tok_core::ids::SourceId::new(id),
            tenant_id: TenantId::new("ten_x"),
            name: "x".into(),
            token: "t".into(),
            params: json!([]),
            critical: false,
            rate_limit: None,
            secret: None,
            verify_preset: None,
            schema: None,
            previous_token: None,
            previous_token_until: None,
            previous_secret: None,
            previous_secret_until: None,
            created_at: 0,
            secret_error: None,
        }
    }

    #[test]
    fn the_demo_automations_validate() {
        let registry = Registry::with_builtins();
        for definition in [
            new_order(&source("src_a")),
            route_orders(),
            converter_errors(&source("src_b")),
        ] {
            let raw = serde_json::to_vec(&definition).unwrap();
            if let Err(errors) = prepare(&raw, &registry) {
                panic!("{}: {errors:?}", definition["name"]);
            }
        }
    }

    #[test]
    fn the_demo_contracts_validate() {
        contract::validate_params(&eshop_params()).unwrap();
        contract::validate_params(&converter_params()).unwrap();
    }
}
