-- Expiry deletes a tenant's rows older than its retention in bounded
-- batches (the rows a monthly partition drop does not take: those of a
-- partition that still holds a tenant with a longer retention, finished
-- runs, dispatched events). Each batch finds its rows by tenant and age.
-- event_inbox is not partitioned: PostgreSQL wants the partition key in
-- every unique index, and its idempotency index must stay unique across
-- months.
CREATE INDEX run_steps_expiry ON run_steps (tenant_id, created_at);
CREATE INDEX ticket_trace_expiry ON ticket_trace (tenant_id, at);
CREATE INDEX runs_expiry ON runs (tenant_id, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX event_inbox_expiry ON event_inbox (tenant_id, received_at) WHERE status <> 'pending';
