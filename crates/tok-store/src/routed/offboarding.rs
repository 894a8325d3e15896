//! A tenant's deletion over every database ([`OffboardingStore`]): the
//! mark, the keys and the tenant's row are the shared database's; each
//! table's rows are erased in the tenant's own database first, then in
//! every other one (a move leaves rows behind in the database it left
//! until `tok tenant forget`), the shared one last. The deletion ends
//! once no database holds a row of the tenant: the copies of its row in
//! the tenant databases go, then its row in the shared database with the
//! platform's audit row, in one transaction there.

use async_trait::async_trait;
use tok_core::ids::TenantId;

use super::RoutedStore;
use crate::offboarding::{Finished, OffboardingStore, RowsLeft, erased_table};
use crate::{AdminStore, NewAudit, Result, Tenant};

impl RoutedStore {
    /// The indexes of every database, the tenant's own first, the shared
    /// one last.
    async fn erasure_order(&self, tenant: &TenantId) -> Result<Vec<usize>> {
        let own = self.db_index(tenant).await?;
        let mut order = vec![own];
        order.extend((1..self.dbs.len()).filter(|i| *i != own));
        if own != 0 {
            order.push(0);
        }
        Ok(order)
    }

    /// Forgets what this process keeps of the tenant's routing.
    fn forget_routes(&self, tenant: &TenantId) {
        self.routes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tenant);
        self.mirrored
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tenant);
    }
}

#[async_trait]
impl OffboardingStore for RoutedStore {
    async fn begin_tenant_deletion(&self, tenant: &TenantId) -> Result<Option<Tenant>> {
        self.shared().begin_tenant_deletion(tenant).await
    }

    async fn deleting_tenants(&self) -> Result<Vec<TenantId>> {
        self.shared().deleting_tenants().await
    }

    async fn erase_tenant_rows(&self, tenant: &TenantId, table: &str, limit: u32) -> Result<u64> {
        let erased = erased_table(table).ok_or_else(|| crate::offboarding::not_erased(table))?;
        match self.shared().tenant(tenant).await? {
            Some(t) if t.deleting() => {}
            _ => return Err(crate::offboarding::not_deleting(tenant)),
        }
        for index in self.erasure_order(tenant).await? {
            let db = &*self.dbs[index];
            let done = db.call(db.store.erase_rows(tenant, erased, limit)).await?;
            if done > 0 {
                return Ok(done);
            }
        }
        Ok(0)
    }

    async fn tenant_rows_left(&self, tenant: &TenantId, cap: u32) -> Result<Vec<RowsLeft>> {
        let parts = self.every_database();
        let answers = self
            .gather("a tenant's rows left", parts, |db, ()| {
                db.rows_left(tenant, cap)
            })
            .await?;
        let mut total: Vec<RowsLeft> = Vec::new();
        for (_, left) in answers {
            for part in left {
                match total.iter_mut().find(|t| t.table == part.table) {
                    Some(t) => t.rows = (t.rows + part.rows).min(u64::from(cap)),
                    None => total.push(part),
                }
            }
        }
        // In the order of the erasure.
        total.sort_by_key(|t| {
            crate::offboarding::ERASED
                .iter()
                .position(|e| e.name == t.table)
        });
        Ok(total)
    }

    async fn finish_tenant_deletion(&self, tenant: &TenantId, audit: NewAudit) -> Result<Finished> {
        match self.shared().tenant(tenant).await? {
            Some(t) if t.deleting() => {}
            _ => return Ok(Finished::NotDeleting),
        }
        for index in self.erasure_order(tenant).await? {
            if index == 0 {
                continue;
            }
            let db = &*self.dbs[index];
            match db.call(db.store.forget_tenant_row(tenant)).await? {
                Finished::Done => {}
                left => return Ok(left),
            }
        }
        let finished = self.shared().finish_tenant_deletion(tenant, audit).await?;
        if finished == Finished::Done {
            self.forget_routes(tenant);
        }
        Ok(finished)
    }
}
