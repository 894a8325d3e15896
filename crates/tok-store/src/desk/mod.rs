//! The service-desk part of the store: ticket types, groups, tickets with
//! their trace, incidents; and [`RecordTx`], the record transaction in
//! which built-in steps that touch these rows run, so that their effect and
//! the step's record commit together or not at all.
//!
//! Every ticket write also writes its trace lines and an internal
//! `ticket.created` / `ticket.updated` event in the same transaction, carrying
//! the cause (run, automation, depth): the dispatcher's loop protection reads
//! them. An event deeper than the depth limit is not written; the write
//! reports it so the caller can raise an alert.
//!
//! Deleting a ticket is written once for both databases
//! (`ticket_deletion.rs`); the desk's other queries are still written
//! once per backend (`desk_sql.rs`).

use async_trait::async_trait;
use serde::Serialize;
use serde_json::{Map, Value};
use tok_core::ids::{AutomationId, EventId, RunId, TenantId};

use crate::{
    AutomationRow, ClaimedJob, NewApproval, NewEvent, NewRun, NewSignal, Page, Record, Result,
    RunEnded, SignalSent, StepRow,
};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TicketType {
    pub id: String,
    pub name: String,
    pub statuses: Vec<String>,
    pub fields: Value,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
}

#[derive(Debug, Clone)]
pub struct NewTicketType {
    pub name: String,
    pub statuses: Vec<String>,
    pub fields: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Member {
    pub id: String,
    pub name: String,
    pub capacity: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    pub id: String,
    pub name: String,
    pub members: Vec<Member>,
}

#[derive(Debug, Clone)]
pub struct NewGroup {
    pub name: String,
    /// (name, capacity) in the group's stable order.
    pub members: Vec<(String, i32)>,
}

/// A change to a ticket type: each `Some` replaces what is stored. Its
/// name never changes (steps and tickets name it).
#[derive(Debug, Clone, Default)]
pub struct TicketTypePatch {
    pub statuses: Option<Vec<String>>,
    pub fields: Option<Value>,
}

/// Tickets that keep a change or a delete from happening: `tickets` of
/// them hold the part named `name` whose id is `id` (a member, a status,
/// whose id is its name, or the ticket type itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBy {
    pub id: String,
    pub name: String,
    pub tickets: i64,
}

/// What a change or a delete of a ticket type, a group or a member did.
#[derive(Debug, Clone, PartialEq)]
pub enum DeskChange<T> {
    Done(T),
    /// The tenant has no such resource.
    NotFound,
    /// Refused, and nothing changed: tickets hold what it would remove.
    Held(Vec<HeldBy>),
}

/// What [`DeskStore::delete_ticket`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketDeletion {
    /// The ticket, its trace and the signals buffered about it are gone.
    Deleted,
    /// The tenant has no such ticket.
    NotFound,
    /// Refused, and nothing changed: these runs (the first 20) have not
    /// ended and are about the ticket (its subject, or a wait for a signal
    /// about it), and `events` about it are not dispatched yet.
    InUse { runs: Vec<RunId>, events: i64 },
}

/// A member of a group with the number of open tickets assigned to them.
#[derive(Debug, Clone, Serialize)]
pub struct MemberLoad {
    pub member: Member,
    pub open_tickets: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ticket {
    pub id: String,
    pub external_id: String,
    pub type_id: Option<String>,
    /// The type's name, read with the ticket (not stored on it).
    #[serde(rename = "type")]
    pub type_name: Option<String>,
    pub title: Option<String>,
    pub status: Option<String>,
    pub closed: bool,
    pub tags: Vec<String>,
    pub fields: Map<String, Value>,
    pub assignee_id: Option<String>,
    /// The assignee's name, read with the ticket (not stored on it).
    pub assignee_name: Option<String>,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub updated_at: i64,
}

impl Ticket {
    /// What internal ticket events carry under `ticket`.
    pub fn event_view(&self) -> Value {
        serde_json::json!({
            "id": self.id,
            "externalId": self.external_id,
            "type": self.type_name,
            "status": self.status,
            "closed": self.closed,
            "tags": self.tags,
            "assigneeId": self.assignee_id,
            "fields": self.fields,
            "title": self.title,
        })
    }
}

/// One ticket write: the ticket as it should be after it, what changed, and
/// the lines for its trace.
#[derive(Debug, Clone)]
pub struct TicketWrite {
    pub ticket: Ticket,
    pub created: bool,
    /// Names of the changed fields (`status`, `tags`, …), for the event.
    pub changes: Vec<String>,
    pub trace: Vec<String>,
}

/// Who caused a change: a run of an automation, or a person (no run).
#[derive(Debug, Clone, Default)]
pub struct Cause {
    pub run_id: Option<RunId>,
    pub automation_id: Option<AutomationId>,
    /// Depth of the causing run; the event it causes is one deeper.
    pub depth: i32,
    /// Who, in words, for the trace (`automation "Route orders"`, `api`).
    pub actor: String,
}

/// What a write caused.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// The internal event written, or `None` when the chain was too deep.
    pub event_id: Option<EventId>,
    /// The event was not written: the chain of automations is deeper than
    /// the limit. The caller should raise an alert.
    pub too_deep: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct TraceLine {
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub at: i64,
    pub kind: String,
    pub message: String,
    pub run_id: Option<String>,
    pub automation_id: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct TicketFilter {
    pub status: Option<String>,
    pub closed: Option<bool>,
    pub type_name: Option<String>,
    pub assignee_id: Option<String>,
    pub tag: Option<String>,
    pub external_id: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Incident {
    pub id: String,
    pub source: String,
    pub title: String,
    pub impact: String,
    pub detail: Value,
    pub status: String,
    pub run_id: Option<String>,
    pub ticket_id: Option<String>,
    pub occurrences: i32,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub updated_at: i64,
    #[serde(serialize_with = "crate::rfc3339::serialize_opt")]
    pub resolved_at: Option<i64>,
}

#[derive(Debug, Clone, Default)]
pub struct NewIncident {
    /// The cause: while an incident of this source is open, another one of
    /// the same source only counts as an occurrence of it.
    pub source: String,
    pub title: String,
    pub impact: String,
    pub detail: Value,
    pub run_id: Option<RunId>,
    pub ticket_id: Option<String>,
}

/// An internal event to write (an `emit` step).
#[derive(Debug, Clone)]
pub struct NewInternalEvent {
    pub event_type: String,
    pub payload: Value,
    pub subject_ticket_id: Option<String>,
}

/// Ticket types, groups, tickets and incidents outside a run.
#[async_trait]
pub trait DeskStore: Send + Sync {
    async fn create_ticket_type(&self, tenant: &TenantId, new: NewTicketType)
    -> Result<TicketType>;
    /// Every ticket type of the tenant, by name (what a ticket is checked
    /// against).
    async fn ticket_types(&self, tenant: &TenantId) -> Result<Vec<TicketType>>;
    /// A page of ticket types by name, after the name `after`.
    async fn ticket_types_page(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<TicketType>>;
    /// A ticket type by id or name.
    async fn ticket_type(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<TicketType>>;
    /// Changes the ticket type `id`. Refused (`Held`, one per status) while
    /// open tickets of the type are in a status the new statuses leave out:
    /// their status would be none of the type's.
    async fn update_ticket_type(
        &self,
        tenant: &TenantId,
        id: &str,
        patch: TicketTypePatch,
    ) -> Result<DeskChange<TicketType>>;
    /// Deletes the ticket type `id`. Refused (`Held`, the type) while any
    /// ticket, open or closed, is of the type.
    async fn delete_ticket_type(&self, tenant: &TenantId, id: &str) -> Result<DeskChange<()>>;
    async fn create_group(&self, tenant: &TenantId, new: NewGroup) -> Result<Group>;
    /// A group by id or name, with its members.
    async fn group(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<Group>>;
    /// Adds a member after the group's others; `None` when the tenant has
    /// no group `group_id`, [`Taken`](crate::StoreError::Taken)
    /// when the group has a member of that name.
    async fn add_member(
        &self,
        tenant: &TenantId,
        group_id: &str,
        name: &str,
        capacity: i32,
    ) -> Result<Option<Member>>;
    /// Sets a member's capacity; `None` when the group has no such member.
    async fn update_member(
        &self,
        tenant: &TenantId,
        group_id: &str,
        member_id: &str,
        capacity: i32,
    ) -> Result<Option<Member>>;
    /// Removes a member from its group. Refused (`Held`) while open tickets
    /// are assigned to them; the closed tickets they had are unassigned,
    /// each with a trace line naming them. Serialized with the group's
    /// assignments, so a least-busy pick never lands on a member being
    /// removed.
    async fn delete_member(
        &self,
        tenant: &TenantId,
        group_id: &str,
        member_id: &str,
    ) -> Result<DeskChange<()>>;
    /// Makes the group's members `members` (name, capacity), in that order,
    /// matched by name: a new name is added, a known one keeps its id and
    /// takes the capacity, one left out is removed as
    /// [`Self::delete_member`] removes it. Refused (`Held`, one per member)
    /// while a member left out holds open tickets; nothing changes then.
    async fn set_members(
        &self,
        tenant: &TenantId,
        group_id: &str,
        members: Vec<(String, i32)>,
    ) -> Result<DeskChange<Group>>;
    /// Deletes the group `id` and its members. Refused (`Held`, one per
    /// member) while its members hold open tickets.
    async fn delete_group(&self, tenant: &TenantId, id: &str) -> Result<DeskChange<()>>;
    /// Every group of the tenant with its members, by name.
    async fn groups(&self, tenant: &TenantId) -> Result<Vec<Group>>;
    /// A page of groups with their members, by name, after the name `after`.
    async fn groups_page(
        &self,
        tenant: &TenantId,
        limit: u32,
        after: Option<&str>,
    ) -> Result<Page<Group>>;

    async fn tickets(
        &self,
        tenant: &TenantId,
        filter: &TicketFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<Ticket>>;
    async fn ticket(&self, tenant: &TenantId, id: &str) -> Result<Option<Ticket>>;
    async fn ticket_trace(&self, tenant: &TenantId, id: &str) -> Result<Vec<TraceLine>>;
    /// Deletes the ticket with its trace and the signals still buffered
    /// about it, in one transaction. Refused
    /// ([`TicketDeletion::InUse`]) while a run about it has not ended or
    /// an event about it is not dispatched yet; finished runs keep their
    /// record, naming the ticket by its id.
    async fn delete_ticket(&self, tenant: &TenantId, id: &str) -> Result<TicketDeletion>;
    /// Writes a ticket change made outside a run (by a person, through the
    /// API), with its trace and event. An update applies only if the ticket
    /// is still at `expected_updated_at`, otherwise it is
    /// [`Changed`](crate::StoreError::Changed); a new ticket whose external id
    /// another has is [`Taken`](crate::StoreError::Taken).
    async fn write_ticket(
        &self,
        tenant: &TenantId,
        write: TicketWrite,
        expected_updated_at: Option<i64>,
        cause: &Cause,
    ) -> Result<Written>;

    async fn incidents(
        &self,
        tenant: &TenantId,
        status: Option<&str>,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<Page<Incident>>;
    async fn incident(&self, tenant: &TenantId, id: &str) -> Result<Option<Incident>>;
    async fn resolve_incident(&self, tenant: &TenantId, id: &str) -> Result<bool>;
}

/// A child run a record started, or the one its idempotency key had started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildStart {
    pub run_id: RunId,
    pub created: bool,
}

/// The record transaction of one claimed job, open. Built-in steps that
/// touch the database run through it; [`RecordTx::commit`] writes the
/// step records and the run's new state and commits everything together.
/// Dropping it rolls back.
#[async_trait]
pub trait RecordTx: Send {
    async fn ticket(&mut self, id: &str) -> Result<Option<Ticket>>;
    /// Whether the tenant has a ticket of this id, read without taking
    /// its row (a signal about it need not hold the ticket back).
    async fn ticket_exists(&mut self, id: &str) -> Result<bool>;
    async fn ticket_by_external_id(&mut self, external_id: &str) -> Result<Option<Ticket>>;
    /// A ticket type by name or id.
    async fn ticket_type(&mut self, name_or_id: &str) -> Result<Option<TicketType>>;
    /// A group by name or id, with its members.
    async fn group(&mut self, name_or_id: &str) -> Result<Option<Group>>;
    async fn member_loads(&mut self, group_id: &str) -> Result<Vec<MemberLoad>>;
    async fn write_ticket(&mut self, write: TicketWrite, cause: &Cause) -> Result<Written>;
    async fn trace(
        &mut self,
        ticket_id: &str,
        kind: &str,
        message: &str,
        cause: &Cause,
    ) -> Result<()>;
    async fn emit(&mut self, event: NewInternalEvent, cause: &Cause) -> Result<Written>;
    /// Sends a signal to the tenant's waits as part of this record (an
    /// `emit` step with a `key`): the waits it resumes are resumed, or it is
    /// buffered, when the record commits, and not at all if it does not.
    async fn send_signal(&mut self, signal: NewSignal) -> Result<SignalSent>;
    /// Opens an incident, or counts one more occurrence of the open one
    /// with the same source. Returns its id and whether it is new.
    async fn open_incident(&mut self, incident: NewIncident) -> Result<(String, bool)>;
    /// The steps recorded for this run so far (for an incident's detail).
    async fn run_steps(&mut self) -> Result<Vec<StepRow>>;
    /// The tenant's automation with this id, or else this name, at its
    /// current version (a `run_workflow` step's child).
    async fn automation_named(&mut self, id_or_name: &str) -> Result<Option<AutomationRow>>;
    /// Starts a child of this job's run as part of this record: its event,
    /// the run (queued, `parent_run_id` this run) and its first job. A
    /// repeated idempotency key of the run's automation answers the run
    /// the key started, and writes nothing.
    async fn start_child(&mut self, event: NewEvent, run: NewRun) -> Result<ChildStart>;
    /// The job's tenant's quotas as the admin set them (its
    /// `startsPerMinute` is the start limit of a child whose automation
    /// sets none).
    async fn tenant_limits(&mut self) -> Result<tok_core::quotas::TenantLimits>;
    /// The creation times of the latest `limit` starts of `automation`
    /// after `since`, newest first, refused runs left out, its starts locked
    /// until the record commits (a child's start limit,
    /// `settings.limits.startsPerMinute`).
    async fn recent_starts(
        &mut self,
        automation: &AutomationId,
        since: i64,
        limit: u32,
    ) -> Result<Vec<i64>>;
    /// This job's run ended: the waits on it learn how (a waiting parent
    /// is resumed when its wait is over), when the record commits.
    async fn run_ended(&mut self, ended: RunEnded) -> Result<()>;
    /// This job's run's context as it is stored: as the claim found it,
    /// with what the records before this one changed.
    async fn run_context(&mut self) -> Result<Value>;
    /// The tenant's members with these ids (those that exist), in that order.
    async fn members(&mut self, ids: &[String]) -> Result<Vec<Member>>;
    /// Opens an approval for this run; returns its id.
    async fn open_approval(&mut self, approval: NewApproval) -> Result<String>;
    async fn commit(self: Box<Self>, record: Record) -> Result<()>;
}

/// Opening a record transaction belongs to the queue.
#[async_trait]
pub trait RecordStore: Send + Sync {
    /// Opens the record transaction of a claimed job after checking its
    /// claim token: fails with `LeaseLost` (and holds nothing) when another
    /// worker took the job over.
    async fn begin_record(&self, job: &ClaimedJob) -> Result<Box<dyn RecordTx>>;
}

mod ticket_deletion;

pub(crate) use ticket_deletion::delete_ticket_in;
