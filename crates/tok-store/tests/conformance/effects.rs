//! Effects once (`EffectStore`): a stored result reads back under its
//! tenant, idempotency key and name; the first result stored wins (a second
//! store answers it); names and tenants keep results apart; and the results
//! expire with the tenant's step data.

use tok_store::now_ms;
use tok_store::retention::Expiring;

use super::*;

backend_tests!(
    run_on_fresh_db;
    an_effect_result_is_stored_once_per_key_and_name,
    effect_results_expire_with_the_step_data,
);

async fn an_effect_result_is_stored_once_per_key_and_name(db: &TestDb) {
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let other = tenant(&*store, "other").await;
    let run = RunId::from("run_1".to_owned());
    let key = "run_1:0";
    assert_eq!(
        store.effect_result(&acme, key, "charge").await.unwrap(),
        None
    );

    let first = json!({ "chargeId": "ch_1" });
    let kept = store
        .store_effect_result(&acme, &run, key, "charge", &first)
        .await
        .unwrap();
    assert_eq!(kept, first);
    let second = store
        .store_effect_result(&acme, &run, key, "charge", &json!({ "chargeId": "ch_2" }))
        .await
        .unwrap();
    assert_eq!(second, first, "the first result stored wins");
    assert_eq!(
        store.effect_result(&acme, key, "charge").await.unwrap(),
        Some(first.clone())
    );

    assert_eq!(
        store.effect_result(&acme, key, "receipt").await.unwrap(),
        None,
        "another effect of the step"
    );
    assert_eq!(
        store
            .effect_result(&acme, "run_1:1", "charge")
            .await
            .unwrap(),
        None,
        "another step"
    );
    assert_eq!(
        store.effect_result(&other, key, "charge").await.unwrap(),
        None,
        "another tenant"
    );
    let refused = store
        .store_effect_result(&acme, &run, key, "nul", &json!({ "a": "x\u{0}" }))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("U+0000"), "{refused}");
}

async fn effect_results_expire_with_the_step_data(db: &TestDb) {
    let store = db.store().await;
    let acme = tenant(&*store, "acme").await;
    let run = RunId::from("run_1".to_owned());
    store
        .store_effect_result(&acme, &run, "run_1:0", "charge", &json!(1))
        .await
        .unwrap();
    assert_eq!(
        store
            .expire(&acme, Expiring::Effects, now_ms() - 60_000, 100)
            .await
            .unwrap(),
        0,
        "not expired yet"
    );
    assert_eq!(
        store
            .expire(&acme, Expiring::Effects, now_ms() + 60_000, 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .effect_result(&acme, "run_1:0", "charge")
            .await
            .unwrap(),
        None
    );
}
