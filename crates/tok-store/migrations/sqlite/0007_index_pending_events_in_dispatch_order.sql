-- The dispatcher takes each tenant's oldest pending events in
-- (received_at, id) order; the index now has that order, so a backlog of
-- thousands is read a batch at a time instead of sorted whole.
DROP INDEX event_inbox_pending;
CREATE INDEX event_inbox_pending ON event_inbox (tenant_id, received_at, id) WHERE status = 'pending';
