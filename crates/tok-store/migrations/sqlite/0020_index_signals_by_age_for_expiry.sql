-- Signals are deleted by retention once past both their lookback and the
-- 24 h idempotency window (DESIGN §15): the expiry finds a tenant's oldest
-- signals by when they were received, consumed or not.
CREATE INDEX signals_age ON signals (tenant_id, received_at);
