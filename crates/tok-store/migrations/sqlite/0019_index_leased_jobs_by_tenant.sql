-- A tenant's steps in flight (`settings.limits.concurrency`, DESIGN §15)
-- are its jobs with a live lease: the claim counts them for a tenant with
-- a cap. The index holds only leased jobs (a lease that expired stays in it
-- until the job is claimed again or recorded), so the count reads a
-- tenant's leases, never its backlog.
CREATE INDEX jobs_leased_by_tenant ON jobs (tenant_id) WHERE locked_by IS NOT NULL;
