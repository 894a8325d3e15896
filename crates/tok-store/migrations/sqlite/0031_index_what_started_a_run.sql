-- What started a run (its context's `_body`), written once with the run:
-- on PostgreSQL it has an index for `POST /api/runs/search`; SQLite keeps
-- it for the same shape of row and searches by reading the contexts.
ALTER TABLE runs ADD COLUMN body TEXT;
UPDATE runs SET body = context -> '_body';
