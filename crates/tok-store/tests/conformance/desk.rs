//! The life of ticket types, groups and members: a type's statuses and
//! fields change, but not so that an open ticket's status is none of its
//! type's; a type with tickets is not deleted; members are added, changed
//! and removed one by one or as a whole list matched by name; a member
//! with open tickets is not removed (nor its group), and the closed
//! tickets of one who is are unassigned with a trace line; a refusal
//! changes nothing, and no tenant reaches another's.

use tok_store::{
    Cause, DeskChange, Group, HeldBy, NewGroup, NewTicketType, Ticket, TicketFilter,
    TicketTypePatch, TicketWrite,
};

use super::*;

backend_tests!(
    run_on_fresh_db;
    a_ticket_type_changes_but_keeps_the_statuses_open_tickets_are_in,
    a_ticket_type_with_tickets_is_not_deleted,
    members_are_added_changed_and_removed_but_not_while_they_hold_open_tickets,
    a_member_list_is_replaced_by_name,
    a_group_whose_members_hold_open_tickets_is_not_deleted,
);

async fn ticket_type(store: &dyn Store, tenant: &TenantId, name: &str) -> String {
    let new = NewTicketType {
        name: name.into(),
        statuses: vec!["new".into(), "packing".into(), "shipped".into()],
        fields: json!([{ "name": "due" }]),
    };
    store.create_ticket_type(tenant, new).await.unwrap().id
}

async fn group(store: &dyn Store, tenant: &TenantId, members: &[&str]) -> Group {
    let new = NewGroup {
        name: "warehouse".into(),
        members: members.iter().map(|m| ((*m).to_owned(), 5)).collect(),
    };
    store.create_group(tenant, new).await.unwrap()
}

/// Writes a ticket as a person would: of `type_id` in `status`, assigned
/// to `assignee`, open or closed.
async fn ticket(
    store: &dyn Store,
    tenant: &TenantId,
    external_id: &str,
    type_id: Option<&str>,
    status: &str,
    assignee: Option<&str>,
    closed: bool,
) -> String {
    let now = tok_store::now_ms();
    let id = tok_core::ids::new_id("tkt");
    let write = TicketWrite {
        ticket: Ticket {
            id: id.clone(),
            external_id: external_id.into(),
            type_id: type_id.map(str::to_owned),
            type_name: None,
            title: None,
            status: Some(status.into()),
            closed,
            tags: Vec::new(),
            fields: serde_json::Map::new(),
            assignee_id: assignee.map(str::to_owned),
            assignee_name: None,
            created_at: now,
            updated_at: now,
        },
        created: true,
        changes: Vec::new(),
        trace: vec!["Created".into()],
    };
    let cause = Cause {
        actor: "api".into(),
        ..Cause::default()
    };
    store
        .write_ticket(tenant, write, None, &cause)
        .await
        .expect("write a ticket");
    id
}

fn held(id: &str, name: &str, tickets: i64) -> HeldBy {
    HeldBy {
        id: id.into(),
        name: name.into(),
        tickets,
    }
}

async fn a_ticket_type_changes_but_keeps_the_statuses_open_tickets_are_in(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let order = ticket_type(&*store, &acme, "order").await;
    ticket(&*store, &acme, "T-1", Some(&order), "packing", None, false).await;
    ticket(&*store, &acme, "T-2", Some(&order), "packing", None, false).await;
    // A closed ticket holds no status.
    ticket(&*store, &acme, "T-3", Some(&order), "shipped", None, true).await;

    let drop_packing = TicketTypePatch {
        statuses: Some(vec!["new".into(), "shipped".into()]),
        fields: None,
    };
    let refused = store
        .update_ticket_type(&acme, &order, drop_packing.clone())
        .await
        .unwrap();
    assert_eq!(
        refused,
        DeskChange::Held(vec![held("packing", "packing", 2)]),
        "{backend:?}"
    );
    let kept = store.ticket_type(&acme, "order").await.unwrap().unwrap();
    assert_eq!(kept.statuses, ["new", "packing", "shipped"], "{backend:?}");

    // Another tenant's id is none of theirs.
    assert_eq!(
        store
            .update_ticket_type(&other, &order, drop_packing)
            .await
            .unwrap(),
        DeskChange::NotFound
    );
    assert!(store.ticket_type(&other, &order).await.unwrap().is_none());

    // Dropping `shipped` (only a closed ticket is in it), renaming none,
    // and the fields alone.
    let changed = store
        .update_ticket_type(
            &acme,
            &order,
            TicketTypePatch {
                statuses: Some(vec!["new".into(), "packing".into(), "done".into()]),
                fields: None,
            },
        )
        .await
        .unwrap();
    let DeskChange::Done(changed) = changed else {
        panic!("{backend:?}: {changed:?}");
    };
    assert_eq!(changed.statuses, ["new", "packing", "done"]);
    assert_eq!(changed.fields, json!([{ "name": "due" }]), "fields stay");
    let fields = TicketTypePatch {
        statuses: None,
        fields: Some(json!([{ "name": "due" }, { "name": "weight" }])),
    };
    store
        .update_ticket_type(&acme, &order, fields)
        .await
        .unwrap();
    let read = store.ticket_type(&acme, &order).await.unwrap().unwrap();
    assert_eq!(
        (
            read.name.as_str(),
            read.statuses.len(),
            read.fields[1]["name"].clone()
        ),
        ("order", 3, json!("weight")),
        "{backend:?}"
    );
}

async fn a_ticket_type_with_tickets_is_not_deleted(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let order = ticket_type(&*store, &acme, "order").await;
    let spare = ticket_type(&*store, &acme, "spare").await;
    ticket(&*store, &acme, "T-1", Some(&order), "new", None, true).await;

    assert_eq!(
        store.delete_ticket_type(&acme, &order).await.unwrap(),
        DeskChange::Held(vec![held(&order, "order", 1)]),
        "{backend:?}: a closed ticket is of it too"
    );
    assert!(store.ticket_type(&acme, &order).await.unwrap().is_some());
    assert_eq!(
        store.delete_ticket_type(&other, &spare).await.unwrap(),
        DeskChange::NotFound
    );
    assert_eq!(
        store.delete_ticket_type(&acme, &spare).await.unwrap(),
        DeskChange::Done(())
    );
    assert!(store.ticket_type(&acme, &spare).await.unwrap().is_none());
    assert_eq!(
        store.delete_ticket_type(&acme, &spare).await.unwrap(),
        DeskChange::NotFound,
        "{backend:?}: gone"
    );
    let names: Vec<String> = store
        .ticket_types(&acme)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["order"]);
}

async fn members_are_added_changed_and_removed_but_not_while_they_hold_open_tickets(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let warehouse = group(&*store, &acme, &["Eva"]).await;
    let eva = warehouse.members[0].id.clone();

    let bo = store
        .add_member(&acme, &warehouse.id, "Bo", 3)
        .await
        .unwrap()
        .expect("the group");
    assert_eq!((bo.name.as_str(), bo.capacity), ("Bo", 3));
    let error = store
        .add_member(&acme, &warehouse.id, "Bo", 4)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Taken(m) if m.contains("`Bo`")),
        "{backend:?}: {error}"
    );
    assert!(
        store
            .add_member(&other, &warehouse.id, "Mallory", 1)
            .await
            .unwrap()
            .is_none(),
        "{backend:?}: another tenant's group"
    );
    let read = store.group(&acme, "warehouse").await.unwrap().unwrap();
    let names: Vec<&str> = read.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["Eva", "Bo"], "{backend:?}: added last");

    let changed = store
        .update_member(&acme, &warehouse.id, &bo.id, 8)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(changed.capacity, 8);
    assert!(
        store
            .update_member(&other, &warehouse.id, &bo.id, 1)
            .await
            .unwrap()
            .is_none()
    );

    // Eva holds an open ticket and a closed one.
    let open = ticket(&*store, &acme, "T-1", None, "new", Some(&eva), false).await;
    let closed = ticket(&*store, &acme, "T-2", None, "new", Some(&eva), true).await;
    assert_eq!(
        store
            .delete_member(&acme, &warehouse.id, &eva)
            .await
            .unwrap(),
        DeskChange::Held(vec![held(&eva, "Eva", 1)]),
        "{backend:?}"
    );
    assert_eq!(
        store
            .delete_member(&other, &warehouse.id, &eva)
            .await
            .unwrap(),
        DeskChange::NotFound
    );
    let cause = Cause {
        actor: "api".into(),
        ..Cause::default()
    };
    let mut reassigned = store.ticket(&acme, &open).await.unwrap().unwrap();
    reassigned.assignee_id = Some(bo.id.clone());
    reassigned.updated_at += 1;
    let write = TicketWrite {
        ticket: reassigned,
        created: false,
        changes: vec!["assignee".into()],
        trace: vec!["Assigned to Bo".into()],
    };
    store
        .write_ticket(&acme, write, None, &cause)
        .await
        .unwrap();

    let before = store.ticket(&acme, &closed).await.unwrap().unwrap();
    assert_eq!(
        store
            .delete_member(&acme, &warehouse.id, &eva)
            .await
            .unwrap(),
        DeskChange::Done(())
    );
    let read = store.group(&acme, &warehouse.id).await.unwrap().unwrap();
    let names: Vec<&str> = read.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["Bo"], "{backend:?}");
    let after = store.ticket(&acme, &closed).await.unwrap().unwrap();
    assert_eq!(after.assignee_id, None, "{backend:?}: unassigned");
    assert!(after.updated_at > before.updated_at);
    let trace = store.ticket_trace(&acme, &closed).await.unwrap();
    assert_eq!(
        trace.last().map(|l| l.message.as_str()),
        Some("Unassigned: Eva was removed from group warehouse"),
        "{backend:?}"
    );
    let still = store.ticket(&acme, &open).await.unwrap().unwrap();
    assert_eq!(still.assignee_id.as_deref(), Some(bo.id.as_str()));
    let by_eva = TicketFilter {
        assignee_id: Some(eva.clone()),
        ..TicketFilter::default()
    };
    let left = store.tickets(&acme, &by_eva, 10, None).await.unwrap();
    assert!(left.items.is_empty(), "{backend:?}");
    assert_eq!(
        store
            .delete_member(&acme, &warehouse.id, &eva)
            .await
            .unwrap(),
        DeskChange::NotFound,
        "{backend:?}: gone"
    );
}

async fn a_member_list_is_replaced_by_name(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let warehouse = group(&*store, &acme, &["Eva", "Bo", "Ann"]).await;
    let id_of = |name: &str| {
        warehouse
            .members
            .iter()
            .find(|m| m.name == name)
            .unwrap()
            .id
            .clone()
    };
    let (eva, bo, ann) = (id_of("Eva"), id_of("Bo"), id_of("Ann"));
    ticket(&*store, &acme, "T-1", None, "new", Some(&bo), false).await;
    ticket(&*store, &acme, "T-2", None, "new", Some(&bo), false).await;

    // Bo left out while he holds two open tickets: nothing changes.
    let without_bo = vec![("Ann".to_owned(), 2), ("Cy".to_owned(), 4)];
    assert_eq!(
        store
            .set_members(&acme, &warehouse.id, without_bo.clone())
            .await
            .unwrap(),
        DeskChange::Held(vec![held(&bo, "Bo", 2)]),
        "{backend:?}"
    );
    let read = store.group(&acme, &warehouse.id).await.unwrap().unwrap();
    assert_eq!(read.members.len(), 3, "{backend:?}: nothing changed");
    assert!(read.members.iter().all(|m| m.capacity == 5));
    assert_eq!(
        store
            .set_members(&other, &warehouse.id, without_bo)
            .await
            .unwrap(),
        DeskChange::NotFound
    );

    // Eva leaves, Ann changes, Cy comes, Bo stays: in the order given.
    let list = vec![
        ("Cy".to_owned(), 4),
        ("Bo".to_owned(), 5),
        ("Ann".to_owned(), 2),
    ];
    let DeskChange::Done(changed) = store.set_members(&acme, &warehouse.id, list).await.unwrap()
    else {
        panic!("{backend:?}: refused");
    };
    let read = store.group(&acme, &warehouse.id).await.unwrap().unwrap();
    for group in [&changed, &read] {
        let got: Vec<(&str, i32)> = group
            .members
            .iter()
            .map(|m| (m.name.as_str(), m.capacity))
            .collect();
        assert_eq!(got, [("Cy", 4), ("Bo", 5), ("Ann", 2)], "{backend:?}");
    }
    assert_eq!(read.members[1].id, bo, "a kept member keeps their id");
    assert_eq!(read.members[2].id, ann);
    assert!(read.members.iter().all(|m| m.id != eva));
}

async fn a_group_whose_members_hold_open_tickets_is_not_deleted(db: &TestDb) {
    let backend = db.backend;
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let warehouse = group(&*store, &acme, &["Eva", "Bo"]).await;
    let (eva, bo) = (&warehouse.members[0].id, &warehouse.members[1].id);
    let open = ticket(&*store, &acme, "T-1", None, "new", Some(eva), false).await;
    let closed = ticket(&*store, &acme, "T-2", None, "new", Some(bo), true).await;
    assert_eq!(
        store.delete_group(&acme, &warehouse.id).await.unwrap(),
        DeskChange::Held(vec![held(eva, "Eva", 1)]),
        "{backend:?}"
    );
    assert_eq!(
        store.delete_group(&other, &warehouse.id).await.unwrap(),
        DeskChange::NotFound
    );
    assert_eq!(
        store
            .group(&acme, &warehouse.id)
            .await
            .unwrap()
            .unwrap()
            .members
            .len(),
        2
    );

    // Closed, the ticket no longer holds Eva.
    let cause = Cause {
        actor: "api".into(),
        ..Cause::default()
    };
    let mut done = store.ticket(&acme, &open).await.unwrap().unwrap();
    done.closed = true;
    done.updated_at += 1;
    let write = TicketWrite {
        ticket: done,
        created: false,
        changes: vec!["closed".into()],
        trace: vec!["Closed".into()],
    };
    store
        .write_ticket(&acme, write, None, &cause)
        .await
        .unwrap();
    assert_eq!(
        store.delete_group(&acme, &warehouse.id).await.unwrap(),
        DeskChange::Done(())
    );
    assert!(store.group(&acme, "warehouse").await.unwrap().is_none());
    assert!(store.groups(&acme).await.unwrap().is_empty(), "{backend:?}");
    for id in [&open, &closed] {
        let ticket = store.ticket(&acme, id).await.unwrap().unwrap();
        assert_eq!(ticket.assignee_id, None, "{backend:?}: {id} unassigned");
    }
    // The name is free again.
    group(&*store, &acme, &["Ann"]).await;
}
