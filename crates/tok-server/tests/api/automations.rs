//! Automations: validation at save (400 `invalid_definition` with precise
//! messages), versions (a run finishes on the version it started with),
//! pause and resume, and manual runs (idempotent, refused while paused).

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{
    Tenant, TestApp, backend_tests, is_final, json_request, log_step, manual, on_webhook,
    plain_source,
};

backend_tests!(
    crate::helpers::run;
    unknown_step_type_is_rejected,
    bad_template_is_rejected,
    more_than_50_steps_are_rejected,
    malformed_definition_is_rejected,
    unknown_config_keys_are_rejected_where_they_stand,
    webhook_trigger_must_name_an_own_source,
    running_run_keeps_its_version_when_a_new_one_is_saved,
    paused_automation_gets_no_runs_until_resumed,
    manual_run_completes_and_is_idempotent,
    concurrent_manual_starts_with_one_key_share_one_run,
    blank_idempotency_key_is_no_key,
    manual_run_of_a_paused_automation_is_409,
    a_runs_priority_is_its_automations_flow_priority_rendered_for_it,
);

/// `flow.priority` is checked at save, rendered for each run from what
/// started it (a manual start's input, a webhook's body), held to
/// -100..100 (0 when it renders no integer), and shown on the run. A start
/// control tok does not have is refused by its name.
async fn a_runs_priority_is_its_automations_flow_priority_rendered_for_it(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let mut ranked = manual("Ranked", &json!([log_step("st_log", "ranked")]));
    ranked["flow"] = json!({ "priority": "{{tier}}" });
    let automation = app.create_automation(&tenant, &ranked).await;
    for (tier, wanted) in [
        (json!(80), 80),
        (json!(-5), -5),
        (json!(1000), 100),
        (json!("gold"), 0),
    ] {
        let run = app
            .start_run(&tenant, &automation, &json!({ "input": { "tier": tier } }))
            .await;
        let run = app.wait_for_final(&tenant, &run).await;
        assert_eq!(run["priority"], wanted, "tier {tier}: {run:#}");
    }

    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let mut on_order = on_webhook(
        "Orders",
        source["id"].as_str().unwrap(),
        &json!([log_step("st_log", "order")]),
    );
    on_order["flow"] = json!({ "priority": "{{_body.rank}}" });
    let orders = app.create_automation(&tenant, &on_order).await;
    app.webhook(source["token"].as_str().unwrap(), &json!({ "rank": 30 }))
        .await
        .expect(StatusCode::ACCEPTED);
    let runs = app
        .wait_for_runs(&tenant, &format!("automation={orders}"), 1)
        .await;
    let run = app
        .get(
            &tenant.key,
            &format!("/api/runs/{}", runs[0]["id"].as_str().unwrap()),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(run["priority"], 30, "{run:#}");

    let mut too_high = manual("Too high", &json!([log_step("st_log", "x")]));
    too_high["flow"] = json!({ "priority": 500 });
    let errors = rejected(app, &tenant, &too_high).await;
    assert_eq!(errors[0]["path"], "flow.priority", "{errors:#?}");
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .contains("-100 to 100"),
        "{errors:#?}"
    );
    // A mode that does not exist is refused by name, not saved and ignored.
    let mut queued = manual("Queued", &json!([log_step("st_log", "x")]));
    queued["flow"] = json!({ "singleton": { "mode": "later" } });
    let errors = rejected(app, &tenant, &queued).await;
    assert_eq!(errors[0]["path"], "flow.singleton.mode", "{errors:#?}");
}

/// Posts a definition that must be refused; returns its `errors`.
async fn rejected(app: &TestApp, tenant: &Tenant, definition: &Value) -> Vec<Value> {
    let reply = app.post(&tenant.key, "/api/automations", definition).await;
    let error = reply.expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    let errors = error["errors"].as_array().expect("errors").clone();
    assert!(!errors.is_empty(), "{error:#}");
    for e in &errors {
        let (path, message) = (e["path"].as_str().unwrap(), e["message"].as_str().unwrap());
        let line = if path.is_empty() {
            message.to_owned()
        } else {
            format!("{path}: {message}")
        };
        assert!(
            error["message"].as_str().unwrap().contains(&line),
            "the summary names every problem: {error:#}"
        );
    }
    errors
}

/// Nothing was saved: the tenant still has no automations.
async fn assert_no_automations(app: &TestApp, tenant: &Tenant) {
    let list = app
        .get(&tenant.key, "/api/automations")
        .await
        .expect(StatusCode::OK);
    assert_eq!(list["items"], json!([]), "{list:#}");
}

async fn unknown_step_type_is_rejected(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let steps = json!([log_step("st_ok", "fine"), { "id": "st_bad", "type": "ticket/teleport", "config": {} }]);
    let errors = rejected(app, &tenant, &manual("Typo", &steps)).await;
    assert_eq!(
        errors,
        [json!({ "path": "steps.1.type", "message": "unknown step type `ticket/teleport`" })]
    );
    assert_no_automations(app, &tenant).await;
}

async fn bad_template_is_rejected(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let steps = json!([{
        "id": "st_check", "type": "condition",
        "rules": [{ "field": "kind", "operator": "eq", "value": "x" }],
        "then": [log_step("st_log", "order {{a")]
    }]);
    let errors = rejected(app, &tenant, &manual("Unclosed", &steps)).await;
    assert_eq!(
        errors,
        [json!({
            "path": "steps.0.then.0.config.message",
            "message": "template `order {{a` opens `{{` at byte 6 but never closes it with `}}`"
        })]
    );
    assert_no_automations(app, &tenant).await;
}

async fn more_than_50_steps_are_rejected(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let fifty: Vec<Value> = (0..50).map(|i| log_step(&format!("st_{i}"), "x")).collect();
    app.create_automation(&tenant, &manual("Fifty", &json!(fifty)))
        .await;

    // 50 at the top plus one nested: the limit counts the whole tree.
    let mut steps = fifty;
    steps[0] = json!({
        "id": "st_0", "type": "condition", "rules": [{ "field": "a", "operator": "isEmpty" }],
        "then": [log_step("st_nested", "x")]
    });
    let errors = rejected(app, &tenant, &manual("Fifty-one", &json!(steps))).await;
    assert_eq!(
        errors,
        [json!({ "path": "steps", "message": "the tree has 51 steps; at most 50 are allowed" })]
    );
}

async fn malformed_definition_is_rejected(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let definition = json!({ "name": "Typo", "trigger": { "kind": "manual" }, "steps": [{ "id": "a", "type": "end", "thne": [] }] });
    let errors = rejected(app, &tenant, &definition).await;
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0]["message"].as_str().unwrap().contains("thne"),
        "{errors:#?}"
    );
    let errors = rejected(app, &tenant, &json!({ "name": "No trigger", "steps": [] })).await;
    assert!(
        errors[0]["message"].as_str().unwrap().contains("trigger"),
        "{errors:#?}"
    );
    assert_no_automations(app, &tenant).await;
}

/// A key a step type does not read is refused at its path, in every child
/// list, for control, in-transaction and connector steps alike: a
/// misspelt `timeoutMs` must not save and be ignored.
async fn unknown_config_keys_are_rejected_where_they_stand(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let steps = json!([
        { "id": "st_call", "type": "http", "config": { "url": "https://shop.example/orders", "timeout": 500 } },
        { "id": "st_both", "type": "parallel", "branches": [
            [{ "id": "st_tag", "type": "ticket/add-tags", "config": { "tags": ["x"], "tag": "y" } }],
            [{ "id": "st_each", "type": "loop", "config": { "items": [1], "maxitems": 2 },
               "do": [log_step("st_in", "x")] }]
        ] },
        { "id": "st_end", "type": "end", "config": { "output": {} } }
    ]);
    let errors = rejected(app, &tenant, &manual("Typos", &steps)).await;
    assert_eq!(
        errors,
        [
            json!({
                "path": "steps.1.branches.1.0.config.maxitems",
                "message": "a `loop` step has no config key `maxitems`; expected one of `items`, \
                            `maxItems` (did you mean `maxItems`?)"
            }),
            json!({
                "path": "steps.0.config.timeout",
                "message": "a `http` step has no config key `timeout`; expected one of \
                            `connection`, `method`, `url`, `headers`, `body`, `timeoutMs` \
                            (did you mean `timeoutMs`?)"
            }),
            json!({
                "path": "steps.1.branches.0.0.config.tag",
                "message": "a `ticket/add-tags` step has no config key `tag`; expected one of \
                            `tags`, `ticketId` (did you mean `tags`?)"
            }),
        ]
    );
    assert_no_automations(app, &tenant).await;

    // The same steps with the keys spelt right save.
    let mut fixed = steps.clone();
    fixed[0]["config"] = json!({ "url": "https://shop.example/orders", "timeoutMs": 500 });
    fixed[1]["branches"][0][0]["config"] = json!({ "tags": ["x", "y"] });
    fixed[1]["branches"][1][0]["config"] = json!({ "items": [1], "maxItems": 2 });
    app.create_automation(&tenant, &manual("Spelt right", &fixed))
        .await;
}

async fn webhook_trigger_must_name_an_own_source(app: &TestApp) {
    let acme = app.create_tenant("Acme").await;
    let other = app.create_tenant("Other").await;
    let theirs = app.create_source(&other, &plain_source("their shop")).await;
    let theirs = theirs["id"].as_str().unwrap();

    let definition = on_webhook("Borrowed", theirs, &json!([log_step("st_a", "a")]));
    let errors = rejected(app, &acme, &definition).await;
    assert_eq!(
        errors,
        [json!({
            "path": "trigger.source",
            "message": format!("`{theirs}` is not a source of this tenant; create it with POST /api/sources")
        })]
    );
    assert_no_automations(app, &acme).await;
    // The owner may use it, and a new version may not move it to another tenant's source.
    let mine = app.create_source(&acme, &plain_source("my shop")).await;
    let id = app
        .create_automation(
            &acme,
            &on_webhook("Mine", mine["id"].as_str().unwrap(), &json!([])),
        )
        .await;
    let reply = app
        .put(&acme.key, &format!("/api/automations/{id}"), &definition)
        .await;
    reply.expect_error(StatusCode::BAD_REQUEST, "invalid_definition");
    app.create_automation(&other, &definition).await;
}

async fn running_run_keeps_its_version_when_a_new_one_is_saved(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let v1 = manual(
        "Versioned",
        &json!([
            log_step("st_v1_start", "v1 starts"),
            { "id": "st_wait", "type": "wait", "config": { "duration": "1s" } },
            log_step("st_v1_end", "v1 ends")
        ]),
    );
    let id = app.create_automation(&tenant, &v1).await;
    let run_id = app.start_run(&tenant, &id, &json!({ "input": {} })).await;
    let waiting = app
        .wait_for_run(&tenant, &run_id, |run| {
            run["status"] == "waiting" || is_final(run)
        })
        .await;
    assert_eq!(
        waiting["status"], "waiting",
        "the run got past its 1 s wait before the test saw it wait (a badly stalled machine?): {waiting:#}"
    );
    assert_eq!(waiting["version"], 1);

    // Hold the engine while version 2 is saved, so the run is certainly
    // still in its wait: what it runs next must come from version 1.
    app.stop_engine().await;
    let v2 = manual("Versioned", &json!([log_step("st_v2", "v2 only")]));
    let saved = app
        .put(&tenant.key, &format!("/api/automations/{id}"), &v2)
        .await
        .expect(StatusCode::OK);
    assert_eq!(saved, json!({ "id": id, "version": 2 }));
    let shown = app
        .get(&tenant.key, &format!("/api/automations/{id}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(shown["version"], 2, "{shown:#}");
    assert_eq!(shown["definition"]["steps"][0]["id"], "st_v2", "{shown:#}");
    let still = app
        .get(&tenant.key, &format!("/api/runs/{run_id}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        (&still["status"], &still["version"]),
        (&json!("waiting"), &json!(1)),
        "{still:#}"
    );
    app.start_engine().await;

    let finished = app.wait_for_final(&tenant, &run_id).await;
    assert_eq!(finished["status"], "completed", "{finished:#}");
    assert_eq!(finished["version"], 1, "{finished:#}");
    let step_ids: Vec<&Value> = finished["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["step_id"])
        .collect();
    assert_eq!(
        step_ids,
        [
            &json!("st_v1_start"),
            &json!("st_wait"),
            &json!("st_v1_end")
        ]
    );
    assert_eq!(finished["steps"][2]["log"], json!(["info: v1 ends"]));

    let next = app.start_run(&tenant, &id, &json!({ "input": {} })).await;
    let next = app.wait_for_final(&tenant, &next).await;
    assert_eq!(next["version"], 2, "{next:#}");
    assert_eq!(next["steps"][0]["step_id"], "st_v2", "{next:#}");
    assert_eq!(next["steps"][0]["log"], json!(["info: v2 only"]));
}

async fn paused_automation_gets_no_runs_until_resumed(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let source = app.create_source(&tenant, &plain_source("eshop")).await;
    let (source_id, token) = (
        source["id"].as_str().unwrap(),
        source["token"].as_str().unwrap(),
    );
    let paused = app
        .create_automation(
            &tenant,
            &on_webhook("Paused", source_id, &json!([log_step("st_p", "p")])),
        )
        .await;
    let active = app
        .create_automation(
            &tenant,
            &on_webhook("Active", source_id, &json!([log_step("st_a", "a")])),
        )
        .await;

    let reply = app
        .post(
            &tenant.key,
            &format!("/api/automations/{paused}/pause"),
            &json!({}),
        )
        .await;
    assert_eq!(
        reply.expect(StatusCode::OK),
        json!({ "id": paused, "status": "paused" })
    );
    let shown = app
        .get(&tenant.key, &format!("/api/automations/{paused}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(shown["status"], "paused");

    let first = app
        .webhook(token, &json!({ "n": 1 }))
        .await
        .expect(StatusCode::ACCEPTED);
    // The active automation's run is created in the same dispatch as the
    // paused one's would be: once it exists, the event was dispatched.
    let runs = app
        .wait_for_runs(&tenant, &format!("automation={active}"), 1)
        .await;
    assert_eq!(runs[0]["event_id"], first["event_id"]);
    let none = app
        .get(
            &tenant.key,
            &format!("/api/dashboard/runs?automation={paused}"),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        none["items"],
        json!([]),
        "a paused automation gets no run: {none:#}"
    );

    let reply = app
        .post(
            &tenant.key,
            &format!("/api/automations/{paused}/resume"),
            &json!({}),
        )
        .await;
    assert_eq!(
        reply.expect(StatusCode::OK),
        json!({ "id": paused, "status": "active" })
    );
    let second = app
        .webhook(token, &json!({ "n": 2 }))
        .await
        .expect(StatusCode::ACCEPTED);
    let runs = app
        .wait_for_runs(&tenant, &format!("automation={paused}"), 1)
        .await;
    assert_eq!(
        runs[0]["event_id"], second["event_id"],
        "only events after the resume start runs"
    );
    assert_eq!(runs[0]["status"], "completed");
    app.wait_for_runs(&tenant, &format!("automation={active}"), 2)
        .await;

    let reply = app
        .post(
            &tenant.key,
            "/api/automations/aut_nonexistent/pause",
            &json!({}),
        )
        .await;
    reply.expect_error(StatusCode::NOT_FOUND, "not_found");
}

async fn manual_run_completes_and_is_idempotent(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let id = app
        .create_automation(
            &tenant,
            &manual("Greet", &json!([log_step("st_hi", "hello {{name}}")])),
        )
        .await;

    let run_id = app
        .start_run(&tenant, &id, &json!({ "input": { "name": "Eva" } }))
        .await;
    assert!(run_id.starts_with("run_"), "{run_id}");
    let run = app.wait_for_final(&tenant, &run_id).await;
    assert_eq!(run["status"], "completed", "{run:#}");
    assert_eq!(run["trigger_type"], "manual", "{run:#}");
    assert_eq!(run["automation_id"], id);
    assert_eq!(run["steps"][0]["log"], json!(["info: hello Eva"]));

    let keyed = json!({ "input": { "name": "Jan" }, "idempotency_key": "greet-jan" });
    let first = app.start_run(&tenant, &id, &keyed).await;
    let again = app.start_run(&tenant, &id, &keyed).await;
    assert_eq!(
        first, again,
        "a repeated idempotency key returns the first run"
    );
    let header = [("idempotency-key", "greet-jan")];
    let uri = format!("/api/automations/{id}/runs");
    let by_header = app
        .post_with(
            &tenant.key,
            &uri,
            &header,
            &json!({ "input": { "name": "Jan" } }),
        )
        .await;
    assert_eq!(
        by_header.expect(StatusCode::CREATED)["run_id"],
        first.as_str()
    );
    let fresh = app
        .start_run(
            &tenant,
            &id,
            &json!({ "input": { "name": "Jan" }, "idempotency_key": "greet-jan-2" }),
        )
        .await;
    assert_ne!(fresh, first);

    // Three distinct runs in all; the keyed one ran once.
    let runs = app
        .wait_for_runs(&tenant, &format!("automation={id}&trigger=manual"), 3)
        .await;
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{runs:#?}");
    let run = app
        .get(&tenant.key, &format!("/api/runs/{first}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(run["steps"].as_array().unwrap().len(), 1, "{run:#}");
    assert_eq!(run["steps"][0]["log"], json!(["info: hello Jan"]));

    let bad = app
        .post(&tenant.key, &uri, &json!({ "input": [1, 2] }))
        .await;
    bad.expect_error(StatusCode::BAD_REQUEST, "invalid_body");
    let nul = app
        .post(
            &tenant.key,
            &uri,
            &json!({ "input": { "name": "J\u{0}n" } }),
        )
        .await;
    let error = nul.expect_error(StatusCode::BAD_REQUEST, "nul_in_json");
    // The pointer is into the whole body, as for every route.
    assert_eq!(error["path"], "/input/name", "{error:#}");
    let missing = app
        .post(
            &tenant.key,
            "/api/automations/aut_nonexistent/runs",
            &json!({ "input": {} }),
        )
        .await;
    missing.expect_error(StatusCode::NOT_FOUND, "not_found");
}

async fn concurrent_manual_starts_with_one_key_share_one_run(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let id = app
        .create_automation(
            &tenant,
            &manual("Greet", &json!([log_step("st_hi", "hi {{name}}")])),
        )
        .await;
    let uri = format!("/api/automations/{id}/runs");
    let auth = format!("Bearer {}", tenant.key);
    let body = json!({ "input": { "name": "Eva" }, "idempotency_key": "greet-eva" });
    let requests = (0..8)
        .map(|_| {
            json_request(
                Method::POST,
                &uri,
                &[("authorization", auth.as_str())],
                &body,
            )
        })
        .collect();
    let replies = app.send_together(requests).await;
    let run_ids: Vec<Value> = replies
        .into_iter()
        .map(|r| r.expect(StatusCode::CREATED)["run_id"].clone())
        .collect();
    assert!(
        run_ids.iter().all(|r| r == &run_ids[0]),
        "one run for one key: {run_ids:#?}"
    );

    let runs = app.wait_for_runs(&tenant, "", 1).await;
    assert_eq!(runs[0]["id"], run_ids[0]);
    assert_eq!(runs[0]["status"], "completed", "{:#}", runs[0]);
}

async fn blank_idempotency_key_is_no_key(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let id = app
        .create_automation(&tenant, &manual("Greet", &json!([log_step("st_hi", "hi")])))
        .await;
    let uri = format!("/api/automations/{id}/runs");
    let mut started = Vec::new();
    for _ in 0..2 {
        let by_header = app
            .post_with(&tenant.key, &uri, &[("idempotency-key", "")], &json!({}))
            .await;
        started.push(by_header.expect(StatusCode::CREATED)["run_id"].clone());
        let by_body = app
            .post(&tenant.key, &uri, &json!({ "idempotency_key": "  " }))
            .await;
        started.push(by_body.expect(StatusCode::CREATED)["run_id"].clone());
    }
    let distinct: std::collections::HashSet<String> =
        started.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        distinct.len(),
        4,
        "a blank key must not tie unrelated starts together: {started:#?}"
    );
    app.wait_for_runs(&tenant, "", 4).await;
}

async fn manual_run_of_a_paused_automation_is_409(app: &TestApp) {
    let tenant = app.create_tenant("Acme").await;
    let id = app
        .create_automation(&tenant, &manual("Greet", &json!([log_step("st_hi", "hi")])))
        .await;
    app.post(
        &tenant.key,
        &format!("/api/automations/{id}/pause"),
        &json!({}),
    )
    .await
    .expect(StatusCode::OK);

    let uri = format!("/api/automations/{id}/runs");
    let reply = app.post(&tenant.key, &uri, &json!({ "input": {} })).await;
    reply.expect_error(StatusCode::CONFLICT, "automation_paused");
    let none = app
        .get(&tenant.key, "/api/dashboard/runs")
        .await
        .expect(StatusCode::OK);
    assert_eq!(none["items"], json!([]), "{none:#}");

    app.post(
        &tenant.key,
        &format!("/api/automations/{id}/resume"),
        &json!({}),
    )
    .await
    .expect(StatusCode::OK);
    let run_id = app.start_run(&tenant, &id, &json!({ "input": {} })).await;
    assert_eq!(
        app.wait_for_final(&tenant, &run_id).await["status"],
        "completed"
    );
}
