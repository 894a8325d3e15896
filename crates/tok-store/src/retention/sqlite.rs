//! [`RetentionBackend`] of the SQLite store: `PRAGMA incremental_vacuum`
//! gives the pages freed by expiry back to the file system.

use super::sql::RetentionBackend;
use crate::Result;
use crate::sqlite::SqliteStore;

impl RetentionBackend for SqliteStore {
    const SET_RETENTION: &'static str =
        "UPDATE tenants SET settings = json_set(settings, '$.retention', json($2)) WHERE id = $1";

    async fn reclaim_space(&self, pages: u32) -> Result<Option<i64>> {
        let writer = self.writer().await;
        let mode: i64 = sqlx::query_scalar("PRAGMA auto_vacuum")
            .fetch_one(&*writer)
            .await?;
        // 2 = INCREMENTAL; 0 (NONE) or 1 (FULL) have nothing to do here.
        if mode != 2 {
            return Ok(None);
        }
        sqlx::query(&format!("PRAGMA incremental_vacuum({pages})"))
            .execute(&*writer)
            .await?;
        let count: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&*writer)
            .await?;
        Ok(Some(count))
    }
}
