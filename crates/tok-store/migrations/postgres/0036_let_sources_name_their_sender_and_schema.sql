-- A source names the sender whose signature it checks (`standard`,
-- `stripe`, `github`, `shopify`, `slack`; NULL with a secret is
-- `standard`, as every signed source was before) and may carry a JSON
-- Schema its bodies must meet.
ALTER TABLE sources ADD COLUMN verify_preset TEXT;
ALTER TABLE sources ADD COLUMN body_schema JSONB;
