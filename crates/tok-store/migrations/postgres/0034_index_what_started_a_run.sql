-- What started a run (its context's `_body`: a webhook's body, a manual
-- start's input), written once with the run and never updated, so that a
-- search over it (`POST /api/runs/search`) has an index: a GIN index of
-- `jsonb_path_ops` answers `body @> '{"order": {"id": "A-2"}}'`. The
-- context itself changes with every step; an index on it would be
-- written again at every step (docs/performance.md).
ALTER TABLE runs ADD COLUMN body JSONB;
UPDATE runs SET body = context -> '_body';
CREATE INDEX runs_body ON runs USING GIN (body jsonb_path_ops);
