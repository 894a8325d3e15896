-- Who sent a signal (`{"kind": "key", "id"}` for POST /api/signals,
-- `{"kind": "run", "runId"}` for an `emit` step, the approver's for a
-- decision): the `wait_for_event` it resumes, now or from the
-- buffer, publishes it as `actor`.
ALTER TABLE signals ADD COLUMN actor JSONB;
