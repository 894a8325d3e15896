-- A replayed event is a new inbox row that names the event it replays
-- (`replay_of`, always the first event, never a replay): `if_no_runs`
-- reads the runs of the event and of all its replays.
ALTER TABLE event_inbox ADD COLUMN replay_of TEXT;
CREATE INDEX event_inbox_replays ON event_inbox (tenant_id, replay_of) WHERE replay_of IS NOT NULL;
