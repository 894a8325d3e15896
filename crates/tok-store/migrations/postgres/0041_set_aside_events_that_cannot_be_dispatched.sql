-- An event the dispatcher cannot start runs for, for a reason of its own
-- (the database refuses its runs as invalid data, or planning them fails),
-- is set aside: its status becomes 'failed' and `error` says why, so that
-- it no longer holds back the events dispatched with it. The events API
-- shows both; a replay dispatches it again.
ALTER TABLE event_inbox ADD COLUMN error TEXT;
