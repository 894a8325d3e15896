//! [`RetentionBackend`] of the PostgreSQL store: its monthly partitions
//! (`partitions.rs`), created ahead, dropped whole once expired, and the
//! rows of a month without one moved out of the default partition.

use tok_core::ids::TenantId;

use super::sql::RetentionBackend;
use super::{Expiring, MovedRows, PartitionProblem};
use crate::Result;
use crate::postgres::{MIGRATION_LOCK, PgStore};

impl RetentionBackend for PgStore {
    const SET_RETENTION: &'static str =
        "UPDATE tenants SET settings = jsonb_set(settings, '{retention}', $2) WHERE id = $1";

    async fn drop_expired_partitions(
        &self,
        what: Expiring,
        cutoffs: &[(TenantId, i64)],
    ) -> Result<Vec<String>> {
        crate::partitions::drop_expired(self.pool(), what, cutoffs).await
    }

    async fn create_partitions(
        &self,
        now_ms: i64,
        ahead: u32,
        skip: &[String],
    ) -> Result<Vec<PartitionProblem>> {
        crate::partitions::create(self.pool(), MIGRATION_LOCK, now_ms, ahead, skip).await
    }

    async fn move_default_rows(
        &self,
        max_rows: u64,
        skip: &[String],
    ) -> Result<(Vec<MovedRows>, Vec<PartitionProblem>)> {
        crate::partitions::move_default_rows(self.pool(), MIGRATION_LOCK, max_rows, skip).await
    }
}
