-- The W3C trace context a webhook was sent with (`traceparent`, checked
-- and normalized at intake), so that its runs continue the sender's trace
-- however late they start. NULL: the event came without one.
ALTER TABLE event_inbox ADD COLUMN traceparent TEXT;
