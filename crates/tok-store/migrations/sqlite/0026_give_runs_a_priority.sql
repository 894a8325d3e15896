-- A run's priority (`flow.priority` of its automation, -100..100): its
-- first job has it, and so does every job written for it later (a
-- parallel branch, a retry, its compensation). Claims take a tenant's
-- jobs highest priority first.
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
