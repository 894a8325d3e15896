-- Signals and waits may be about a ticket (`subject`, a ticket id of the
-- tenant; DESIGN §5a): a signal resumes only the waits on its key about
-- the same ticket, and a signal about none only the waits about none.
-- NULL: about no ticket, as every signal and wait was before.
ALTER TABLE waits ADD COLUMN subject TEXT;
ALTER TABLE signals ADD COLUMN subject TEXT;

-- A signal finds the waits on its key about its subject.
DROP INDEX waits_key;
CREATE INDEX waits_key ON waits (tenant_id, key, subject);

-- A starting wait takes the oldest unconsumed signal of (tenant, key,
-- subject): signals about other tickets on the same key are not read.
DROP INDEX signals_buffered;
CREATE INDEX signals_buffered ON signals (tenant_id, key, subject, received_at, id)
    WHERE consumed_at IS NULL;
