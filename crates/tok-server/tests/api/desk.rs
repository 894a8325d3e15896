//! The service desk as a client sees it: ticket types, groups, tickets
//! (listing with filters and cursor pages, one ticket with its trace),
//! changes by a person — checked against the tenant's types and groups,
//! traced in words, and raising events that start automations — and the
//! walls between tenants. Types, groups and members change and go: a
//! member with open tickets stays (409 counting them), as does a status
//! that open tickets are in, a type that tickets are of, and a member, a
//! group or a type that an automation names (409 naming it).

use std::collections::HashSet;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{
    Tenant, TestApp, backend_tests, ids, json_request, manual, on_event, trace_messages,
};

backend_tests!(
    crate::helpers::run;
    ticket_types_are_created_and_listed,
    ticket_types_are_validated,
    groups_are_created_with_member_capacities,
    groups_are_validated,
    a_ticket_created_by_a_person_starts_at_its_types_first_status,
    ticket_creation_is_validated,
    a_patch_changes_the_ticket_and_its_trace_says_what_changed,
    a_patch_that_changes_nothing_writes_nothing,
    a_patch_is_validated_against_the_tenants_types_and_groups,
    concurrent_patches_never_undo_each_other,
    a_patch_by_a_person_starts_automations_on_ticket_updated,
    a_ticket_created_by_a_person_starts_automations_on_ticket_created,
    tickets_listing_filters,
    tickets_listing_pages_with_a_cursor,
    tickets_listing_rejects_bad_limits_and_filters,
    another_tenants_tickets_types_and_groups_are_invisible,
    a_ticket_types_statuses_and_fields_change_but_not_under_open_tickets,
    bad_ticket_type_changes_are_refused_with_what_was_expected,
    a_ticket_type_with_tickets_or_named_by_an_automation_is_not_deleted,
    members_are_added_changed_and_removed_but_not_while_they_hold_open_tickets,
    a_groups_member_list_is_replaced_by_name,
    a_group_named_by_an_automation_or_with_busy_members_is_not_deleted,
    another_tenants_groups_and_types_are_out_of_reach,
);

const ORDER_STATUSES: &[&str] = &["new", "awaiting packing", "shipped"];

/// A tenant with the type `order` and the group `warehouse` (Eva, Jan).
struct Desk {
    tenant: Tenant,
    eva: String,
    jan: String,
}

async fn desk(app: &TestApp, name: &str) -> Desk {
    let tenant = app.create_tenant(name).await;
    app.create_ticket_type(&tenant, "order", ORDER_STATUSES)
        .await;
    let group = app
        .create_group(&tenant, "warehouse", &["Eva", "Jan"])
        .await;
    let member = |i: usize| group["members"][i]["id"].as_str().unwrap().to_owned();
    Desk {
        eva: member(0),
        jan: member(1),
        tenant,
    }
}

fn uri(ticket: &Value) -> String {
    format!("/api/tickets/{}", ticket["id"].as_str().unwrap())
}

async fn ticket_types_are_created_and_listed(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let body = json!({
        "name": "order",
        "statuses": ["new", "awaiting packing", "shipped"],
        "fields": [{ "name": "due", "type": "date" }]
    });
    let order = app
        .post(&tenant.key, "/api/ticket-types", &body)
        .await
        .expect(StatusCode::CREATED);
    assert!(order["id"].is_string(), "{order:#}");
    assert_eq!(order["name"], "order", "{order:#}");
    assert_eq!(
        order["statuses"],
        json!(["new", "awaiting packing", "shipped"])
    );
    assert_eq!(order["fields"], json!([{ "name": "due", "type": "date" }]));
    let error = app
        .create_ticket_type(&tenant, "error", &["open", "fixed"])
        .await;

    let listed = app
        .get(&tenant.key, "/api/ticket-types")
        .await
        .expect(StatusCode::OK);
    let items = listed["items"].as_array().unwrap();
    let names: HashSet<&str> = items.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, HashSet::from(["order", "error"]), "{listed:#}");
    let listed_error = items.iter().find(|t| t["name"] == "error").unwrap();
    assert_eq!(listed_error["id"], error["id"]);
    assert_eq!(listed_error["statuses"], json!(["open", "fixed"]));
    assert!(listed["next_cursor"].is_null(), "{listed:#}");

    let again = app
        .post(&tenant.key, "/api/ticket-types", &body)
        .await
        .expect_error(StatusCode::CONFLICT, "conflict");
    assert!(
        error_message(&again).contains("order"),
        "the conflict names the type: {again:#}"
    );
}

async fn ticket_types_are_validated(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    for (body, says) in [
        (json!({ "name": "order", "statuses": [] }), "at least one"),
        (
            json!({ "name": "order", "statuses": ["new", "shipped", "new"] }),
            "`new` is listed twice",
        ),
        (
            json!({ "name": "order", "statuses": ["new", " "] }),
            "empty status",
        ),
        (json!({ "name": " ", "statuses": ["new"] }), "`name`"),
        (
            json!({ "name": "order", "statuses": ["new"], "fields": [{ "type": "date" }] }),
            "fields[0]",
        ),
        (json!({ "name": "order" }), "statuses"),
    ] {
        let error = app
            .post(&tenant.key, "/api/ticket-types", &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert!(
            error_message(&error).contains(says),
            "for {body}, the message should mention {says:?}: {error:#}"
        );
    }
    let listed = app
        .get(&tenant.key, "/api/ticket-types")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"], json!([]), "nothing invalid was saved");
}

async fn groups_are_created_with_member_capacities(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let body = json!({
        "name": "warehouse",
        "members": [{ "name": "Eva", "capacity": 3 }, { "name": "Jan" }]
    });
    let group = app
        .post(&tenant.key, "/api/groups", &body)
        .await
        .expect(StatusCode::CREATED);
    assert!(group["id"].is_string(), "{group:#}");
    assert_eq!(group["name"], "warehouse");
    let members = group["members"].as_array().unwrap();
    assert_eq!(members.len(), 2, "{group:#}");
    assert_eq!(members[0]["name"], "Eva");
    assert_eq!(members[0]["capacity"], 3);
    assert_eq!(members[1]["name"], "Jan");
    assert_eq!(members[1]["capacity"], 10, "the default capacity is 10");
    assert!(members.iter().all(|m| m["id"].is_string()), "{group:#}");
    assert_ne!(members[0]["id"], members[1]["id"]);

    app.create_group(&tenant, "IT", &["Ola"]).await;
    let listed = app
        .get(&tenant.key, "/api/groups")
        .await
        .expect(StatusCode::OK);
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{listed:#}");
    let warehouse = items.iter().find(|g| g["name"] == "warehouse").unwrap();
    assert_eq!(warehouse, &group, "the listing shows the group as created");

    app.post(&tenant.key, "/api/groups", &body)
        .await
        .expect_error(StatusCode::CONFLICT, "conflict");
}

async fn groups_are_validated(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    for (body, says) in [
        (
            json!({ "name": "warehouse", "members": [{ "name": "Eva", "capacity": 0 }] }),
            "at least 1",
        ),
        (
            json!({ "name": "warehouse", "members": [{ "name": "Eva", "capacity": -2 }] }),
            "at least 1",
        ),
        (
            json!({ "name": "warehouse", "members": [{ "name": "Eva" }, { "name": "Eva" }] }),
            "twice",
        ),
        (
            json!({ "name": "warehouse", "members": [{ "name": "" }] }),
            "members[0].name",
        ),
        (json!({ "name": "", "members": [] }), "`name`"),
    ] {
        let error = app
            .post(&tenant.key, "/api/groups", &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        assert!(
            error_message(&error).contains(says),
            "for {body}, the message should mention {says:?}: {error:#}"
        );
    }
    let listed = app
        .get(&tenant.key, "/api/groups")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"], json!([]), "nothing invalid was saved");
}

async fn a_ticket_created_by_a_person_starts_at_its_types_first_status(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let body = json!({
        "external_id": "5001",
        "type": "order",
        "title": "Order 5001",
        "tags": ["vip", "vip", "express"],
        "fields": { "customer": "Alice" }
    });
    let created = app.create_ticket(&d.tenant, &body).await;
    assert_eq!(created["external_id"], "5001");
    assert_eq!(created["type"], "order");
    assert_eq!(created["status"], "new", "the type's first status");
    assert_eq!(created["closed"], false);
    assert_eq!(
        created["tags"],
        json!(["vip", "express"]),
        "repeats dropped"
    );
    assert_eq!(created["fields"], json!({ "customer": "Alice" }));
    assert_eq!(created["title"], "Order 5001");
    assert!(created["assignee"].is_null(), "{created:#}");
    assert!(
        crate::helpers::ms(&created["created_at"]).is_some()
            && crate::helpers::ms(&created["updated_at"]).is_some(),
        "times are RFC 3339: {created:#}"
    );

    let shown = app.ticket(&d.tenant, created["id"].as_str().unwrap()).await;
    for key in [
        "id",
        "external_id",
        "type",
        "status",
        "closed",
        "tags",
        "fields",
        "title",
    ] {
        assert_eq!(shown[key], created[key], "{key}: {shown:#}");
    }
    assert_eq!(
        trace_messages(&shown),
        ["Created by a person (API)"],
        "{shown:#}"
    );
    let line = &shown["trace"][0];
    assert!(crate::helpers::ms(&line["at"]).is_some(), "{line:#}");
    assert!(line["run_id"].is_null() && line["automation_id"].is_null());

    let explicit = app
        .create_ticket(
            &d.tenant,
            &json!({ "external_id": "5002", "type": "order", "status": "shipped" }),
        )
        .await;
    assert_eq!(explicit["status"], "shipped");
    let untyped = app
        .create_ticket(&d.tenant, &json!({ "external_id": "note-1" }))
        .await;
    assert!(
        untyped["type"].is_null() && untyped["status"].is_null(),
        "{untyped:#}"
    );
    assert_eq!(untyped["tags"], json!([]));
    assert_eq!(untyped["fields"], json!({}));
}

async fn ticket_creation_is_validated(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let tenant = &d.tenant;

    let unknown = app
        .post(
            &tenant.key,
            "/api/tickets",
            &json!({ "external_id": "5001", "type": "parcel" }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "unknown_type");
    assert_eq!(unknown["type"], "parcel", "{unknown:#}");
    assert!(error_message(&unknown).contains("`parcel`"), "{unknown:#}");
    assert!(
        error_message(&unknown).contains("order"),
        "names the types: {unknown:#}"
    );

    let bad = app
        .post(
            &tenant.key,
            "/api/tickets",
            &json!({ "external_id": "5001", "type": "order", "status": "lost" }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_status");
    assert_eq!(bad["allowed"], json!(ORDER_STATUSES), "{bad:#}");
    assert!(
        error_message(&bad).contains("new, awaiting packing, shipped"),
        "the message lists the allowed statuses: {bad:#}"
    );

    let untyped = app
        .post(
            &tenant.key,
            "/api/tickets",
            &json!({ "external_id": "5001", "status": "new" }),
        )
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_status");
    assert!(error_message(&untyped).contains("type"), "{untyped:#}");

    for body in [
        json!({ "external_id": " " }),
        json!({ "type": "order" }),
        json!({ "external_id": "5001", "tags": ["ok", ""] }),
        json!({ "external_id": "5001", "assignee": "Eva" }),
    ] {
        app.post(&tenant.key, "/api/tickets", &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    }

    let listed = app
        .get(&tenant.key, "/api/tickets")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"], json!([]), "nothing invalid was saved");

    app.create_ticket(tenant, &json!({ "external_id": "5001", "type": "order" }))
        .await;
    let duplicate = app
        .post(
            &tenant.key,
            "/api/tickets",
            &json!({ "external_id": "5001" }),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "duplicate_external_id");
    assert_eq!(duplicate["external_id"], "5001", "{duplicate:#}");
    let listed = app
        .get(&tenant.key, "/api/tickets?external_id=5001")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed:#}");
}

async fn a_patch_changes_the_ticket_and_its_trace_says_what_changed(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let tenant = &d.tenant;
    app.create_ticket_type(tenant, "return", &["received", "refunded"])
        .await;
    let ticket = app
        .create_ticket(
            tenant,
            &json!({ "external_id": "5001", "type": "order", "tags": ["vip"], "fields": { "a": 1 } }),
        )
        .await;
    let uri = uri(&ticket);

    let patched = app
        .patch(
            &tenant.key,
            &uri,
            &json!({
                "status": "shipped",
                "assignee_id": d.eva,
                "tags": ["express"],
                "fields": { "b": 2 },
                "title": "Order 5001",
                "closed": true
            }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(patched["status"], "shipped");
    assert_eq!(patched["assignee"], json!({ "id": d.eva, "name": "Eva" }));
    assert_eq!(patched["tags"], json!(["express"]));
    assert_eq!(
        patched["fields"],
        json!({ "a": 1, "b": 2 }),
        "fields are merged"
    );
    assert_eq!(patched["title"], "Order 5001");
    assert_eq!(patched["closed"], true);
    assert!(
        crate::helpers::ms(&patched["updated_at"]) > crate::helpers::ms(&ticket["updated_at"]),
        "{patched:#}"
    );
    let shown = app.ticket(tenant, ticket["id"].as_str().unwrap()).await;
    for key in [
        "status",
        "assignee",
        "tags",
        "fields",
        "title",
        "closed",
        "updated_at",
    ] {
        assert_eq!(shown[key], patched[key], "{key} as stored: {shown:#}");
    }
    let messages = trace_messages(&shown);
    for expected in [
        "Status set to shipped by a person (API)",
        "Closed by a person (API)",
        "Tags added: express by a person (API)",
        "Tags removed: vip by a person (API)",
        "Field b set to 2 by a person (API)",
        "Assigned to Eva by a person (API)",
        "Title set to \u{201c}Order 5001\u{201d} by a person (API)",
    ] {
        assert!(
            messages.iter().any(|m| m == expected),
            "the trace should say {expected:?}: {messages:#?}"
        );
    }
    assert_eq!(
        messages.len(),
        8,
        "one line per change after the creation: {messages:#?}"
    );

    let patched = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "assignee_id": d.jan, "fields": { "a": null }, "closed": false, "title": null }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(patched["assignee"], json!({ "id": d.jan, "name": "Jan" }));
    assert_eq!(
        patched["fields"],
        json!({ "b": 2 }),
        "a null field is removed"
    );
    assert_eq!(patched["closed"], false);
    assert!(patched["title"].is_null(), "{patched:#}");

    let patched = app
        .patch(
            &tenant.key,
            &uri,
            &json!({ "assignee_id": null, "type": "return" }),
        )
        .await
        .expect(StatusCode::OK);
    assert!(patched["assignee"].is_null(), "{patched:#}");
    assert_eq!(patched["type"], "return");
    assert_eq!(
        patched["status"], "received",
        "a new type without the ticket's status starts at its first status"
    );

    let shown = app.ticket(tenant, ticket["id"].as_str().unwrap()).await;
    let messages = trace_messages(&shown);
    let later: Vec<&str> = messages[8..].iter().map(String::as_str).collect();
    assert_eq!(
        later,
        [
            "Reopened by a person (API)",
            "Field a cleared by a person (API)",
            "Assigned to Jan by a person (API)",
            "Title cleared by a person (API)",
            "Type set to return by a person (API)",
            "Status set to received (the first of type return) by a person (API)",
            "Unassigned by a person (API)",
        ],
        "{messages:#?}"
    );
    assert!(
        shown["trace"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["run_id"].is_null() && l["automation_id"].is_null()),
        "a person's lines have no run: {shown:#}"
    );
}

async fn a_patch_that_changes_nothing_writes_nothing(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let tenant = &d.tenant;
    let automation = app
        .create_automation(
            tenant,
            &on_event(
                "Watcher",
                "ticket.updated",
                &json!([{ "id": "st_tag", "type": "ticket/add-tags", "config": { "tags": ["seen"] } }]),
            ),
        )
        .await;
    let ticket = app
        .create_ticket(
            tenant,
            &json!({ "external_id": "5001", "type": "order", "tags": ["vip"], "fields": { "a": 1 } }),
        )
        .await;
    let uri = uri(&ticket);
    let same = json!({
        "status": "new", "closed": false, "tags": ["vip"], "fields": { "a": 1 },
        "type": "order", "assignee_id": null
    });
    let unchanged = app
        .patch(&tenant.key, &uri, &same)
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        unchanged["updated_at"], ticket["updated_at"],
        "{unchanged:#}"
    );
    assert_eq!(unchanged["tags"], json!(["vip"]));
    app.patch(&tenant.key, &uri, &json!({}))
        .await
        .expect(StatusCode::OK);
    let shown = app.ticket(tenant, ticket["id"].as_str().unwrap()).await;
    assert_eq!(trace_messages(&shown), ["Created by a person (API)"]);
    assert_eq!(shown["updated_at"], ticket["updated_at"]);

    // A real change afterwards: its event is dispatched after any the empty
    // changes would have raised, so once its run is done, a run for those
    // would exist too.
    app.patch(&tenant.key, &uri, &json!({ "status": "shipped" }))
        .await
        .expect(StatusCode::OK);
    let runs = app
        .wait_for_runs(tenant, &format!("automation={automation}"), 1)
        .await;
    assert_eq!(runs[0]["status"], "completed", "{runs:#?}");
    let listed = app
        .get(&tenant.key, "/api/dashboard/runs")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        1,
        "only the real change started a run: {listed:#}"
    );
}

async fn a_patch_is_validated_against_the_tenants_types_and_groups(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let tenant = &d.tenant;
    let ticket = app
        .create_ticket(tenant, &json!({ "external_id": "5001", "type": "order" }))
        .await;
    let uri = uri(&ticket);

    let bad = app
        .patch(&tenant.key, &uri, &json!({ "status": "lost" }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_status");
    assert_eq!(bad["allowed"], json!(ORDER_STATUSES), "{bad:#}");
    assert!(error_message(&bad).contains("new, awaiting packing, shipped"));

    let unknown = app
        .patch(&tenant.key, &uri, &json!({ "type": "parcel" }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "unknown_type");
    assert_eq!(unknown["type"], "parcel");

    let nobody = app
        .patch(&tenant.key, &uri, &json!({ "assignee_id": "mem_nobody" }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "unknown_assignee");
    assert_eq!(nobody["assignee_id"], "mem_nobody", "{nobody:#}");
    assert!(error_message(&nobody).contains("/api/groups"), "{nobody:#}");

    for body in [
        json!({ "assignee": d.eva }),
        json!({ "closed": "yes" }),
        json!({ "tags": "vip" }),
        json!({ "fields": [1] }),
    ] {
        app.patch(&tenant.key, &uri, &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    }
    // One bad part spoils the whole change: nothing of it is written.
    app.patch(
        &tenant.key,
        &uri,
        &json!({ "tags": ["urgent"], "status": "lost" }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "invalid_status");

    let shown = app.ticket(tenant, ticket["id"].as_str().unwrap()).await;
    assert_eq!(shown["status"], "new");
    assert_eq!(shown["tags"], json!([]));
    assert_eq!(trace_messages(&shown), ["Created by a person (API)"]);

    app.patch(
        &tenant.key,
        "/api/tickets/tkt_nope",
        &json!({ "closed": true }),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.get(&tenant.key, "/api/tickets/tkt_nope")
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
}

async fn concurrent_patches_never_undo_each_other(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let tenant = &d.tenant;
    let ticket = app
        .create_ticket(tenant, &json!({ "external_id": "5001", "type": "order" }))
        .await;
    let uri = uri(&ticket);
    let auth = format!("Bearer {}", tenant.key);
    let requests = (0..8)
        .map(|i| {
            json_request(
                Method::PATCH,
                &uri,
                &[("authorization", auth.as_str())],
                &json!({ "fields": { format!("k{i}"): i } }),
            )
        })
        .collect();
    let replies = app.send_together(requests).await;
    let mut written = HashSet::new();
    for (i, reply) in replies.into_iter().enumerate() {
        if reply.status == StatusCode::CONFLICT {
            let error = reply.expect_error(StatusCode::CONFLICT, "conflict");
            assert!(
                error_message(&error).contains("changed meanwhile"),
                "{error:#}"
            );
        } else {
            reply.expect(StatusCode::OK);
            written.insert(format!("k{i}"));
        }
    }
    assert!(!written.is_empty(), "at least one change goes through");
    let shown = app.ticket(tenant, ticket["id"].as_str().unwrap()).await;
    let kept: HashSet<String> = shown["fields"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        kept, written,
        "every accepted change is kept and a refused one left nothing: {shown:#}"
    );
    assert_eq!(trace_messages(&shown).len(), 1 + written.len(), "{shown:#}");
}

async fn a_patch_by_a_person_starts_automations_on_ticket_updated(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let tenant = &d.tenant;
    let automation = app
        .create_automation(
            tenant,
            &json!({
                "name": "Shipped",
                "trigger": {
                    "kind": "event", "event": "ticket.updated",
                    "filter": { "match": "all", "rules": [
                        { "field": "ticket.status", "operator": "eq", "value": "shipped" }
                    ] }
                },
                "steps": [{
                    "id": "st_tag", "type": "ticket/add-tags",
                    "config": { "tags": ["notify {{ticket.externalId}}"] }
                }]
            }),
        )
        .await;
    let ticket = app
        .create_ticket(tenant, &json!({ "external_id": "5001", "type": "order" }))
        .await;
    let id = ticket["id"].as_str().unwrap();
    app.patch(&tenant.key, &uri(&ticket), &json!({ "status": "shipped" }))
        .await
        .expect(StatusCode::OK);

    let shown = app
        .poll("the automation's tag", async || {
            let shown = app.ticket(tenant, id).await;
            (shown["tags"] == json!(["notify 5001"]))
                .then_some(shown)
                .ok_or(())
        })
        .await;
    let runs = app
        .wait_for_runs(tenant, &format!("automation={automation}"), 1)
        .await;
    let run = &runs[0];
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(run["trigger_type"], "event", "{run:#}");
    let detail = app
        .get(
            &tenant.key,
            &format!("/api/runs/{}", run["id"].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        detail["context"]["changes"],
        json!(["status"]),
        "{detail:#}"
    );
    assert_eq!(detail["context"]["ticket"]["id"], id, "{detail:#}");
    assert_eq!(
        detail["context"]["ticket"]["status"], "shipped",
        "{detail:#}"
    );

    let lines = shown["trace"].as_array().unwrap();
    let by_automation = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .unwrap()
                .starts_with("Tags added: notify 5001")
        })
        .unwrap_or_else(|| panic!("the automation's change is in the trace: {shown:#}"));
    assert_eq!(by_automation["run_id"], run["id"], "{shown:#}");
    assert_eq!(by_automation["automation_id"], automation, "{shown:#}");

    // A change the filter does not match starts nothing; the next matching
    // one does, so once its run is done the count says the first did not.
    app.patch(&tenant.key, &uri(&ticket), &json!({ "status": "new" }))
        .await
        .expect(StatusCode::OK);
    app.patch(&tenant.key, &uri(&ticket), &json!({ "status": "shipped" }))
        .await
        .expect(StatusCode::OK);
    app.wait_for_runs(tenant, &format!("automation={automation}"), 2)
        .await;
}

async fn a_ticket_created_by_a_person_starts_automations_on_ticket_created(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let tenant = &d.tenant;
    let automation = app
        .create_automation(
            tenant,
            &on_event(
                "Route",
                "ticket.created",
                &json!([{ "id": "st_assign", "type": "ticket/assign-least-busy", "config": { "group": "warehouse" } }]),
            ),
        )
        .await;
    let ticket = app
        .create_ticket(tenant, &json!({ "external_id": "5001", "type": "order" }))
        .await;
    let runs = app
        .wait_for_runs(tenant, &format!("automation={automation}"), 1)
        .await;
    assert_eq!(runs[0]["status"], "completed", "{runs:#?}");
    let shown = app.ticket(tenant, ticket["id"].as_str().unwrap()).await;
    assert_eq!(
        shown["assignee"],
        json!({ "id": d.eva, "name": "Eva" }),
        "{shown:#}"
    );
}

/// Five tickets with different types, statuses, tags, assignees.
async fn five_tickets(app: &TestApp, d: &Desk) -> Vec<Value> {
    let tenant = &d.tenant;
    app.create_ticket_type(tenant, "error", &["open", "fixed"])
        .await;
    let mut tickets = Vec::new();
    for body in [
        json!({ "external_id": "o-1", "type": "order", "tags": ["vip"] }),
        json!({ "external_id": "o-2", "type": "order", "status": "shipped", "tags": ["vip", "express"] }),
        json!({ "external_id": "o-3", "type": "order", "tags": ["vip2"] }),
        json!({ "external_id": "e-1", "type": "error" }),
        json!({ "external_id": "e-2", "type": "error", "status": "fixed" }),
    ] {
        tickets.push(app.create_ticket(tenant, &body).await);
    }
    app.patch(
        &tenant.key,
        &uri(&tickets[0]),
        &json!({ "assignee_id": d.eva }),
    )
    .await
    .expect(StatusCode::OK);
    app.patch(
        &tenant.key,
        &uri(&tickets[3]),
        &json!({ "assignee_id": d.eva }),
    )
    .await
    .expect(StatusCode::OK);
    app.patch(&tenant.key, &uri(&tickets[4]), &json!({ "closed": true }))
        .await
        .expect(StatusCode::OK);
    tickets
}

async fn tickets_listing_filters(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let tickets = five_tickets(app, &d).await;
    let external = async |query: &str| external_ids(app, &d.tenant, query).await;
    assert_eq!(external("").await, ["e-1", "e-2", "o-1", "o-2", "o-3"]);
    assert_eq!(external("type=order").await, ["o-1", "o-2", "o-3"]);
    assert_eq!(external("status=shipped").await, ["o-2"]);
    assert_eq!(external("status=new&type=order").await, ["o-1", "o-3"]);
    assert_eq!(external("closed=true").await, ["e-2"]);
    assert_eq!(external("closed=false").await, ["e-1", "o-1", "o-2", "o-3"]);
    assert_eq!(
        external(&format!("assignee={}", d.eva)).await,
        ["e-1", "o-1"]
    );
    assert_eq!(
        external(&format!("assignee={}", d.jan)).await,
        Vec::<String>::new()
    );
    assert_eq!(
        external("tag=vip").await,
        ["o-1", "o-2"],
        "a tag matches whole"
    );
    assert_eq!(external("tag=express&type=order").await, ["o-2"]);
    assert_eq!(external("external_id=e-2").await, ["e-2"]);
    assert_eq!(external("external_id=zzz").await, Vec::<String>::new());

    let page = app
        .get(&d.tenant.key, "/api/tickets?external_id=o-1")
        .await
        .expect(StatusCode::OK);
    let item = &page["items"][0];
    assert_eq!(item["id"], tickets[0]["id"]);
    assert_eq!(item["assignee"], json!({ "id": d.eva, "name": "Eva" }));
    for key in [
        "type",
        "status",
        "closed",
        "tags",
        "fields",
        "title",
        "created_at",
        "updated_at",
    ] {
        assert!(
            item.get(key).is_some(),
            "a listed ticket has `{key}`: {item:#}"
        );
    }
}

async fn tickets_listing_pages_with_a_cursor(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let mut created = Vec::new();
    for i in 0..5 {
        let ticket = app
            .create_ticket(
                &d.tenant,
                &json!({ "external_id": format!("o-{i}"), "type": "order" }),
            )
            .await;
        created.push(ticket["id"].as_str().unwrap().to_owned());
    }
    let mut seen = Vec::new();
    let mut uri = "/api/tickets?limit=2".to_owned();
    let mut pages = 0;
    loop {
        let page = app.get(&d.tenant.key, &uri).await.expect(StatusCode::OK);
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 2, "{page:#}");
        seen.extend(ids(items));
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(cursor) => uri = format!("/api/tickets?limit=2&cursor={cursor}"),
            None => break,
        }
        assert!(pages < 10, "the cursor never ends: {page:#}");
    }
    assert_eq!(pages, 3);
    // Ids sort by creation time (to the millisecond): newest first.
    created.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, created, "by id, newest first, each ticket once");

    let filtered = app
        .get(&d.tenant.key, "/api/tickets?limit=1&type=order&status=new")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        ids(filtered["items"].as_array().unwrap()),
        [created[0].clone()]
    );
    let cursor = filtered["next_cursor"].as_str().expect("more pages");
    let next = app
        .get(
            &d.tenant.key,
            &format!("/api/tickets?limit=1&type=order&status=new&cursor={cursor}"),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(ids(next["items"].as_array().unwrap()), [created[1].clone()]);
}

async fn tickets_listing_rejects_bad_limits_and_filters(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let key = &d.tenant.key;
    for limit in ["0", "501"] {
        let error = app
            .get(key, &format!("/api/tickets?limit={limit}"))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "bad_limit");
        assert!(
            error_message(&error).contains("between 1 and 500"),
            "{error:#}"
        );
    }
    app.get(key, "/api/tickets?limit=500")
        .await
        .expect(StatusCode::OK);
    app.get(key, "/api/tickets?limit=1")
        .await
        .expect(StatusCode::OK);
    for query in ["limit=-1", "limit=many", "closed=maybe", "colour=red"] {
        app.get(key, &format!("/api/tickets?{query}"))
            .await
            .expect_error(StatusCode::BAD_REQUEST, "bad_query");
    }
}

async fn another_tenants_tickets_types_and_groups_are_invisible(app: &TestApp) {
    let a = desk(app, "Acme").await;
    let b = app.create_tenant("Beta").await;
    let ticket = app
        .create_ticket(
            &a.tenant,
            &json!({ "external_id": "5001", "type": "order" }),
        )
        .await;
    let uri = uri(&ticket);

    app.get(&b.key, &uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    app.patch(&b.key, &uri, &json!({ "closed": true }))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    for listing in ["/api/tickets", "/api/ticket-types", "/api/groups"] {
        let page = app.get(&b.key, listing).await.expect(StatusCode::OK);
        assert_eq!(page["items"], json!([]), "{listing}: {page:#}");
    }

    // B has no type `order` and cannot give its tickets to A's people.
    app.post(
        &b.key,
        "/api/tickets",
        &json!({ "external_id": "5001", "type": "order" }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "unknown_type");
    let own = app
        .create_ticket(&b, &json!({ "external_id": "5001" }))
        .await;
    assert_ne!(
        own["id"], ticket["id"],
        "external ids are unique per tenant"
    );
    app.patch(
        &b.key,
        &format!("/api/tickets/{}", own["id"].as_str().unwrap()),
        &json!({ "assignee_id": a.eva }),
    )
    .await
    .expect_error(StatusCode::BAD_REQUEST, "unknown_assignee");
    // The same names are free in another tenant.
    app.create_ticket_type(&b, "order", &["new"]).await;
    app.create_group(&b, "warehouse", &["Eva"]).await;

    let untouched = app.ticket(&a.tenant, ticket["id"].as_str().unwrap()).await;
    assert_eq!(untouched["closed"], false);
    assert_eq!(trace_messages(&untouched), ["Created by a person (API)"]);
}

/// The external ids of a one-page listing with `query`, sorted.
async fn external_ids(app: &TestApp, tenant: &Tenant, query: &str) -> Vec<String> {
    let uri = format!("/api/tickets?{query}");
    let page = app.get(&tenant.key, &uri).await.expect(StatusCode::OK);
    assert!(page["next_cursor"].is_null(), "{page:#}");
    let mut found: Vec<String> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["external_id"].as_str().unwrap().to_owned())
        .collect();
    found.sort();
    found
}

fn error_message(error: &Value) -> &str {
    error["message"].as_str().unwrap_or_default()
}

/// A ticket of `order`, created and then assigned to `member` (if any).
async fn assigned(app: &TestApp, d: &Desk, external_id: &str, member: Option<&str>) -> Value {
    let ticket = app
        .create_ticket(
            &d.tenant,
            &json!({ "external_id": external_id, "type": "order" }),
        )
        .await;
    match member {
        None => ticket,
        Some(member) => app
            .patch(
                &d.tenant.key,
                &uri(&ticket),
                &json!({ "assignee_id": member }),
            )
            .await
            .expect(StatusCode::OK),
    }
}

fn type_uri(ty: &Value) -> String {
    format!("/api/ticket-types/{}", ty["id"].as_str().unwrap())
}

async fn order_type(app: &TestApp, tenant: &Tenant) -> Value {
    app.get(&tenant.key, "/api/ticket-types/order")
        .await
        .expect(StatusCode::OK)
}

async fn a_ticket_types_statuses_and_fields_change_but_not_under_open_tickets(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let order = order_type(app, &d.tenant).await;
    let by_id = app
        .get(&d.tenant.key, &type_uri(&order))
        .await
        .expect(StatusCode::OK);
    assert_eq!(by_id, order);
    assert_eq!(order["statuses"], json!(ORDER_STATUSES));
    let first = assigned(app, &d, "T-1", None).await;
    app.patch(
        &d.tenant.key,
        &uri(&first),
        &json!({ "status": "awaiting packing" }),
    )
    .await
    .expect(StatusCode::OK);
    assigned(app, &d, "T-2", None).await;

    // `awaiting packing` dropped while T-1 is in it, and `new` while T-2 is.
    let refused = app
        .patch(
            &d.tenant.key,
            &type_uri(&order),
            &json!({ "statuses": ["shipped"] }),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([
            { "kind": "tickets", "id": "awaiting packing", "name": "awaiting packing",
              "path": null, "count": 1 },
            { "kind": "tickets", "id": "new", "name": "new", "path": null, "count": 1 },
        ]),
        "{refused:#}"
    );
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("1 ticket (open, in status `awaiting packing`)"),
        "{message}"
    );
    assert_eq!(order_type(app, &d.tenant).await, order, "nothing changed");

    // Closed, T-1 holds its status no longer.
    app.patch(&d.tenant.key, &uri(&first), &json!({ "closed": true }))
        .await
        .expect(StatusCode::OK);
    let changed = app
        .patch(
            &d.tenant.key,
            &type_uri(&order),
            &json!({ "name": "order", "statuses": ["new", "packed", "shipped"] }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(changed["statuses"], json!(["new", "packed", "shipped"]));
    assert_eq!(changed["fields"], order["fields"], "fields stay");
    let changed = app
        .patch(
            &d.tenant.key,
            &type_uri(&order),
            &json!({ "fields": [{ "name": "due", "type": "date" }] }),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        changed["fields"],
        json!([{ "name": "due", "type": "date" }])
    );
    assert_eq!(changed["statuses"], json!(["new", "packed", "shipped"]));
    // A new status is one a ticket may take.
    let third = assigned(app, &d, "T-3", None).await;
    let packed = app
        .patch(&d.tenant.key, &uri(&third), &json!({ "status": "packed" }))
        .await
        .expect(StatusCode::OK);
    assert_eq!(packed["status"], "packed");
}

async fn bad_ticket_type_changes_are_refused_with_what_was_expected(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let order = order_type(app, &d.tenant).await;
    let cases = [
        (json!({ "name": "parcel" }), "`name` cannot change"),
        (json!({ "statuses": [] }), "at least one status"),
        (json!({ "statuses": ["a", " a "] }), "listed twice"),
        (
            json!({ "statuses": ["a", " "] }),
            "must not contain an empty status",
        ),
        (
            json!({ "fields": [{ "type": "date" }] }),
            "non-empty `name`",
        ),
        (
            json!({ "fields": [{ "name": "x" }, { "name": "x" }] }),
            "listed twice",
        ),
        (json!({ "colour": "red" }), "unknown field `colour`"),
    ];
    for (body, expected) in cases {
        let error = app
            .patch(&d.tenant.key, &type_uri(&order), &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    assert_eq!(order_type(app, &d.tenant).await, order);
}

async fn a_ticket_type_with_tickets_or_named_by_an_automation_is_not_deleted(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let order = order_type(app, &d.tenant).await;
    let ticket = assigned(app, &d, "T-1", None).await;
    app.patch(&d.tenant.key, &uri(&ticket), &json!({ "closed": true }))
        .await
        .expect(StatusCode::OK);
    let refused = app
        .delete(&d.tenant.key, &type_uri(&order))
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "tickets", "id": order["id"], "name": "order", "path": null, "count": 1 }]),
        "{refused:#}: a closed ticket is of it too"
    );

    let parcel = app.create_ticket_type(&d.tenant, "parcel", &["new"]).await;
    let automation = app
        .create_automation(
            &d.tenant,
            &manual(
                "Open parcels",
                &json!([{ "id": "st_up", "type": "ticket/upsert",
                          "config": { "externalId": "P-1", "type": "parcel" } }]),
            ),
        )
        .await;
    let refused = app
        .delete(&d.tenant.key, &type_uri(&parcel))
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "automation", "id": automation, "name": "Open parcels",
                 "path": "steps.0.config.type" }]),
        "{refused:#}"
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("ticket type `parcel` is in use by automation `Open parcels`"),
        "{refused:#}"
    );
    app.put(
        &d.tenant.key,
        &format!("/api/automations/{automation}"),
        &manual(
            "Open parcels",
            &json!([{ "id": "st_up", "type": "ticket/upsert",
                      "config": { "externalId": "P-1", "type": "order" } }]),
        ),
    )
    .await
    .expect(StatusCode::OK);
    app.delete(&d.tenant.key, &type_uri(&parcel))
        .await
        .expect(StatusCode::NO_CONTENT);
    app.get(&d.tenant.key, &type_uri(&parcel))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let listed = app
        .get(&d.tenant.key, "/api/ticket-types")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        ids(listed["items"].as_array().unwrap()),
        [order["id"].as_str().unwrap()]
    );
}

fn group_uri(group: &Value) -> String {
    format!("/api/groups/{}", group["id"].as_str().unwrap())
}

async fn warehouse(app: &TestApp, tenant: &Tenant) -> Value {
    app.get(&tenant.key, "/api/groups/warehouse")
        .await
        .expect(StatusCode::OK)
}

async fn members_are_added_changed_and_removed_but_not_while_they_hold_open_tickets(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let group = warehouse(app, &d.tenant).await;
    let by_id = app
        .get(&d.tenant.key, &group_uri(&group))
        .await
        .expect(StatusCode::OK);
    assert_eq!(by_id, group);
    let members = format!("{}/members", group_uri(&group));

    let bo = app
        .post(
            &d.tenant.key,
            &members,
            &json!({ "name": " Bo ", "capacity": 3 }),
        )
        .await
        .expect(StatusCode::CREATED);
    assert_eq!((&bo["name"], &bo["capacity"]), (&json!("Bo"), &json!(3)));
    let cy = app
        .post(&d.tenant.key, &members, &json!({ "name": "Cy" }))
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(cy["capacity"], 10, "the default capacity");
    let names: Vec<Value> = warehouse(app, &d.tenant).await["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].clone())
        .collect();
    assert_eq!(names, ["Eva", "Jan", "Bo", "Cy"]);
    let error = app
        .post(&d.tenant.key, &members, &json!({ "name": "Bo" }))
        .await
        .expect_error(StatusCode::CONFLICT, "conflict");
    assert!(
        error["message"].as_str().unwrap().contains("`Bo`"),
        "{error:#}"
    );
    for (body, expected) in [
        (json!({ "name": " " }), "must not be empty"),
        (json!({ "name": "Di", "capacity": 0 }), "at least 1"),
        (
            json!({ "name": "Di", "role": "lead" }),
            "unknown field `role`",
        ),
    ] {
        let error = app
            .post(&d.tenant.key, &members, &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }

    // An approval step lists Cy: she stays until it does not.
    let cy_uri = format!("{members}/{}", cy["id"].as_str().unwrap());
    let approve = manual(
        "Approve",
        &json!([{ "id": "st_ok", "type": "approval",
                  "config": { "approvers": { "members": [d.jan, cy["id"]] }, "prompt": "Ship?" } }]),
    );
    let automation = app.create_automation(&d.tenant, &approve).await;
    let refused = app
        .delete(&d.tenant.key, &cy_uri)
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "automation", "id": automation, "name": "Approve",
                 "path": "steps.0.config.approvers.members.1" }]),
        "{refused:#}"
    );
    let without = manual(
        "Approve",
        &json!([{ "id": "st_ok", "type": "approval",
                  "config": { "approvers": { "members": [d.jan] }, "prompt": "Ship?" } }]),
    );
    app.put(
        &d.tenant.key,
        &format!("/api/automations/{automation}"),
        &without,
    )
    .await
    .expect(StatusCode::OK);
    app.delete(&d.tenant.key, &cy_uri)
        .await
        .expect(StatusCode::NO_CONTENT);

    let bo_uri = format!("{members}/{}", bo["id"].as_str().unwrap());
    let changed = app
        .patch(&d.tenant.key, &bo_uri, &json!({ "capacity": 6 }))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        changed,
        json!({ "id": bo["id"], "name": "Bo", "capacity": 6 })
    );
    let error = app
        .patch(&d.tenant.key, &bo_uri, &json!({ "capacity": -1 }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("capacity of `Bo`"),
        "{error:#}"
    );
    app.patch(
        &d.tenant.key,
        &format!("{members}/mem_missing"),
        &json!({ "capacity": 2 }),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "not_found");

    // Eva has two open tickets and a closed one.
    let eva_uri = format!("{members}/{}", d.eva);
    let t1 = assigned(app, &d, "T-1", Some(&d.eva)).await;
    assigned(app, &d, "T-2", Some(&d.eva)).await;
    let t3 = assigned(app, &d, "T-3", Some(&d.eva)).await;
    app.patch(&d.tenant.key, &uri(&t3), &json!({ "closed": true }))
        .await
        .expect(StatusCode::OK);
    let refused = app
        .delete(&d.tenant.key, &eva_uri)
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "tickets", "id": d.eva, "name": "Eva", "path": null, "count": 2 }]),
        "{refused:#}"
    );
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("member `Eva` of group `warehouse`")
            && message.contains("2 tickets (open, assigned to `Eva`)")
            && message.contains("reassign"),
        "{message}"
    );

    // Reassigned, Eva goes; her closed ticket says she went.
    for ticket in [&t1] {
        app.patch(
            &d.tenant.key,
            &uri(ticket),
            &json!({ "assignee_id": d.jan }),
        )
        .await
        .expect(StatusCode::OK);
    }
    let t2 = app
        .get(&d.tenant.key, "/api/tickets?external_id=T-2")
        .await
        .expect(StatusCode::OK)["items"][0]
        .clone();
    app.patch(&d.tenant.key, &uri(&t2), &json!({ "assignee_id": null }))
        .await
        .expect(StatusCode::OK);
    app.delete(&d.tenant.key, &eva_uri)
        .await
        .expect(StatusCode::NO_CONTENT);
    let names: Vec<Value> = warehouse(app, &d.tenant).await["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].clone())
        .collect();
    assert_eq!(names, ["Jan", "Bo"]);
    let closed = app.ticket(&d.tenant, t3["id"].as_str().unwrap()).await;
    assert_eq!(closed["assignee"], Value::Null, "{closed:#}");
    assert_eq!(
        trace_messages(&closed).last().map(String::as_str),
        Some("Unassigned: Eva was removed from group warehouse")
    );
    app.delete(&d.tenant.key, &eva_uri)
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    // A ticket cannot be given to her any more.
    app.patch(&d.tenant.key, &uri(&t2), &json!({ "assignee_id": d.eva }))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "unknown_assignee");
}

async fn a_groups_member_list_is_replaced_by_name(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let group = warehouse(app, &d.tenant).await;
    assigned(app, &d, "T-1", Some(&d.jan)).await;

    // Jan left out while he holds an open ticket: nothing changes.
    let refused = app
        .patch(
            &d.tenant.key,
            &group_uri(&group),
            &json!({ "members": [{ "name": "Eva" }, { "name": "Ann" }] }),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "tickets", "id": d.jan, "name": "Jan", "path": null, "count": 1 }]),
        "{refused:#}"
    );
    assert_eq!(warehouse(app, &d.tenant).await, group);

    // Eva leaves, Jan's capacity changes, Ann comes: in the order given.
    let changed = app
        .patch(
            &d.tenant.key,
            &group_uri(&group),
            &json!({ "name": "warehouse",
                     "members": [{ "name": "Ann", "capacity": 2 }, { "name": "Jan", "capacity": 4 }] }),
        )
        .await
        .expect(StatusCode::OK);
    let members = changed["members"].as_array().unwrap();
    let got: Vec<(Value, Value)> = members
        .iter()
        .map(|m| (m["name"].clone(), m["capacity"].clone()))
        .collect();
    assert_eq!(got, [(json!("Ann"), json!(2)), (json!("Jan"), json!(4))]);
    assert_eq!(members[1]["id"], d.jan.as_str(), "Jan keeps his id");
    assert_eq!(warehouse(app, &d.tenant).await, changed);

    for (body, expected) in [
        (json!({ "name": "depot" }), "`name` cannot change"),
        (
            json!({ "members": [{ "name": "Ann" }, { "name": "Ann" }] }),
            "listed twice",
        ),
        (
            json!({ "members": [{ "name": "Ann", "capacity": 0 }] }),
            "at least 1",
        ),
        (
            json!({ "members": [{ "name": "" }] }),
            "`members[0].name` must not be empty",
        ),
    ] {
        let error = app
            .patch(&d.tenant.key, &group_uri(&group), &body)
            .await
            .expect_error(StatusCode::BAD_REQUEST, "invalid_body");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(expected), "{body}: {message}");
    }
    assert_eq!(warehouse(app, &d.tenant).await, changed);
}

async fn a_group_named_by_an_automation_or_with_busy_members_is_not_deleted(app: &TestApp) {
    let d = desk(app, "Acme").await;
    let group = warehouse(app, &d.tenant).await;
    let automation = app
        .create_automation(
            &d.tenant,
            &on_event(
                "Route",
                "ticket.created",
                &json!([{ "id": "st_assign", "type": "ticket/assign-least-busy",
                          "config": { "group": "warehouse" } }]),
            ),
        )
        .await;
    let refused = app
        .delete(&d.tenant.key, &group_uri(&group))
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "automation", "id": automation, "name": "Route",
                 "path": "steps.0.config.group" }]),
        "{refused:#}"
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("group `warehouse` is in use by automation `Route` at steps.0.config.group"),
        "{refused:#}"
    );
    app.put(
        &d.tenant.key,
        &format!("/api/automations/{automation}"),
        &on_event(
            "Route",
            "ticket.created",
            &json!([{ "id": "st_log", "type": "flow/log", "config": { "message": "no group" } }]),
        ),
    )
    .await
    .expect(StatusCode::OK);

    let ticket = assigned(app, &d, "T-1", Some(&d.eva)).await;
    let refused = app
        .delete(&d.tenant.key, &group_uri(&group))
        .await
        .expect_error(StatusCode::CONFLICT, "in_use");
    assert_eq!(
        refused["used_by"],
        json!([{ "kind": "tickets", "id": d.eva, "name": "Eva", "path": null, "count": 1 }]),
        "{refused:#}"
    );
    app.patch(&d.tenant.key, &uri(&ticket), &json!({ "closed": true }))
        .await
        .expect(StatusCode::OK);
    app.delete(&d.tenant.key, &group_uri(&group))
        .await
        .expect(StatusCode::NO_CONTENT);
    app.get(&d.tenant.key, &group_uri(&group))
        .await
        .expect_error(StatusCode::NOT_FOUND, "not_found");
    let listed = app
        .get(&d.tenant.key, "/api/groups")
        .await
        .expect(StatusCode::OK);
    assert_eq!(listed["items"], json!([]));
    let closed = app.ticket(&d.tenant, ticket["id"].as_str().unwrap()).await;
    assert_eq!(closed["assignee"], Value::Null, "{closed:#}");
}

async fn another_tenants_groups_and_types_are_out_of_reach(app: &TestApp) {
    let a = desk(app, "Acme").await;
    let b = desk(app, "Beta").await;
    let group = warehouse(app, &a.tenant).await;
    let order = order_type(app, &a.tenant).await;
    let eva = format!("{}/members/{}", group_uri(&group), a.eva);
    let tries = [
        (Method::GET, group_uri(&group), Value::Null),
        (Method::PATCH, group_uri(&group), json!({ "members": [] })),
        (Method::DELETE, group_uri(&group), Value::Null),
        (
            Method::POST,
            format!("{}/members", group_uri(&group)),
            json!({ "name": "Mallory" }),
        ),
        (Method::PATCH, eva.clone(), json!({ "capacity": 1 })),
        (Method::DELETE, eva.clone(), Value::Null),
        // B's group with A's member.
        (
            Method::DELETE,
            format!("/api/groups/warehouse/members/{}", a.eva),
            Value::Null,
        ),
        (Method::GET, type_uri(&order), Value::Null),
        (
            Method::PATCH,
            type_uri(&order),
            json!({ "statuses": ["x"] }),
        ),
        (Method::DELETE, type_uri(&order), Value::Null),
    ];
    for (method, uri, body) in tries {
        let reply = app
            .send(json_request(
                method.clone(),
                &uri,
                &[("authorization", &format!("Bearer {}", b.tenant.key))],
                &body,
            ))
            .await;
        reply.expect_error(StatusCode::NOT_FOUND, "not_found");
    }
    assert_eq!(warehouse(app, &a.tenant).await, group);
    assert_eq!(order_type(app, &a.tenant).await, order);
}
