-- A source's token and signing secret rotate: the one before stays valid
-- until its own end (the overlap the rotation asked for), then answers
-- nothing. An archived automation keeps its row and versions for its runs
-- (its status is `archived`, a value the text column already takes).
ALTER TABLE sources ADD COLUMN previous_token TEXT;
ALTER TABLE sources ADD COLUMN previous_token_until BIGINT;
ALTER TABLE sources ADD COLUMN previous_secret TEXT;
ALTER TABLE sources ADD COLUMN previous_secret_until BIGINT;
CREATE INDEX sources_previous_token ON sources (previous_token) WHERE previous_token IS NOT NULL;
