-- API keys get a name, scopes, an expiry and a revocation; a revoked key
-- keeps its row (runs and decisions name it as their actor). The keys made
-- before this keep every right: `admin`.
ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT 'first key';
ALTER TABLE api_keys ADD COLUMN scopes TEXT NOT NULL DEFAULT 'admin';
ALTER TABLE api_keys ADD COLUMN expires_at BIGINT;
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;
ALTER TABLE api_keys ADD COLUMN revoked_at BIGINT;
