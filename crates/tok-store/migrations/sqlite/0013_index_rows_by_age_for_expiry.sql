-- Expiry deletes a tenant's rows older than its retention in bounded
-- batches; each batch finds its rows by tenant and age.
CREATE INDEX run_steps_expiry ON run_steps (tenant_id, created_at);
CREATE INDEX ticket_trace_expiry ON ticket_trace (tenant_id, at);
CREATE INDEX runs_expiry ON runs (tenant_id, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX event_inbox_expiry ON event_inbox (tenant_id, received_at) WHERE status <> 'pending';
