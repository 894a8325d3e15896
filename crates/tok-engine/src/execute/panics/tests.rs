//! A step that panics inside the record transaction fails its run with an
//! incident and frees its slot, on both backends.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tok_core::ids::{RunId, TenantId};
use tok_store::testing::{TestDb, backends};
use tok_store::{RunDetail, Store};

use crate::definitions::prepare;
use crate::steps::{TxContext, TxError, TxStep};
use crate::{Engine, EngineConfig, Registry};

/// Panics in the record transaction: a bug in a step type.
struct PanicsInTransaction;

#[async_trait::async_trait]
impl TxStep for PanicsInTransaction {
    async fn run(
        &self,
        _cx: &mut TxContext<'_>,
        _config: &Value,
    ) -> Result<crate::StepOutcome, TxError> {
        panic!("index out of bounds: the len is 0 but the index is 3")
    }

    fn validate(&self, _config: &Value) -> Result<(), String> {
        Ok(())
    }

    fn config_keys(&self) -> &'static [&'static str] {
        &[]
    }
}

async fn automation(
    store: &Arc<dyn Store>,
    registry: &Registry,
    tenant: &TenantId,
    steps: Value,
) -> tok_core::ids::AutomationId {
    let definition = json!({ "name": "test", "trigger": { "kind": "manual" }, "steps": steps });
    let raw = serde_json::to_vec(&definition).unwrap();
    let (_, version) = prepare(&raw, registry).unwrap_or_else(|e| panic!("rejected: {e:?}"));
    store.create_automation(tenant, version).await.unwrap().id
}

/// Polls until the run is final; panics after 30 s.
async fn finished(store: &Arc<dyn Store>, tenant: &TenantId, run: &RunId) -> RunDetail {
    for _ in 0..600 {
        let detail = store.run(tenant, run).await.unwrap().expect("run exists");
        if matches!(detail.run.status.as_str(), "completed" | "failed") {
            return detail;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("run {run} did not finish within 30 s");
}

#[tokio::test]
async fn a_step_panicking_in_the_record_transaction_fails_its_run_and_frees_its_slot() {
    for backend in backends() {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        let tenant = store.create_tenant("Acme", "hash").await.unwrap().id;
        let mut registry = Registry::with_builtins();
        registry.register_in_transaction("test/panic", Arc::new(PanicsInTransaction));
        let broken = automation(
            &store,
            &registry,
            &tenant,
            json!([
                { "id": "st_before", "type": "set", "config": { "values": { "a": 1 } } },
                { "id": "st_bug", "type": "test/panic" }
            ]),
        )
        .await;
        let fine = automation(
            &store,
            &registry,
            &tenant,
            json!([{ "id": "st_ok", "type": "set", "config": { "values": { "ok": true } } }]),
        )
        .await;
        let config = EngineConfig {
            concurrency: 1,
            poll_interval: Duration::from_millis(50),
            ..EngineConfig::default()
        };
        let engine = Engine::new(store.clone(), registry, config);
        let running = engine.start(true).await.unwrap();
        let bad_run = engine
            .start_run(&tenant, &broken, json!({}), None)
            .await
            .unwrap();
        let bad = finished(&store, &tenant, &bad_run).await;
        // One slot: this run completes only if the panicked claim freed it.
        let good_run = engine
            .start_run(&tenant, &fine, json!({}), None)
            .await
            .unwrap();
        let good = finished(&store, &tenant, &good_run).await;
        let incidents = store.incidents(&tenant, None, 10, None).await.unwrap();
        running.shutdown().await;

        assert_eq!(bad.run.status, "failed", "{backend:?}");
        let error = bad.run.error.clone().unwrap_or_default();
        assert!(
            error.contains("step `st_bug` panicked: index out of bounds"),
            "{backend:?}: {error}"
        );
        let failed: Vec<_> = bad.steps.iter().filter(|s| s.status == "failed").collect();
        assert_eq!(failed.len(), 1, "{backend:?}: {:?}", bad.steps);
        assert_eq!(failed[0].step_id, "st_bug", "{backend:?}");
        assert!(
            incidents
                .items
                .iter()
                .any(|i| i.run_id.as_deref() == Some(bad_run.as_str())),
            "{backend:?}: an incident for the panicked run: {:?}",
            incidents.items
        );
        assert_eq!(good.run.status, "completed", "{backend:?}");
        drop(store);
        db.cleanup().await;
    }
}
