//! Automation definitions: preparing a definition for saving (parse,
//! validate, hash) and a cache of parsed versions for the dispatcher and
//! the workers. A version never changes once saved, so a cached version is
//! never stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tok_core::definition::{Automation, Trigger};
use tok_core::ids::{AutomationId, TenantId};
use tok_core::validate::{ValidationError, validate};
use tok_store::{DefinitionStore, NewVersion};

use crate::registry::Registry;
use crate::{EngineError, Result};

/// Parses and validates a definition as sent by a client, ready to store.
/// Every problem is reported, each with the place in the JSON it concerns.
pub fn prepare(
    raw: &[u8],
    registry: &Registry,
) -> Result<(Automation, NewVersion), Vec<ValidationError>> {
    let text = std::str::from_utf8(raw).map_err(|e| {
        vec![ValidationError {
            path: String::new(),
            message: format!("the body is not UTF-8: {e}"),
        }]
    })?;
    let automation = Automation::from_json(text).map_err(|e| {
        vec![ValidationError {
            path: String::new(),
            message: e.to_string(),
        }]
    })?;
    let mut errors = match validate(&automation, raw.len(), &|kind| registry.is_known(kind)) {
        Ok(()) => Vec::new(),
        Err(errors) => errors,
    };
    check_handler_configs(&automation.steps, "steps", registry, &mut errors);
    if !errors.is_empty() {
        return Err(errors);
    }
    let definition = serde_json::to_value(&automation).unwrap_or(Value::Null);
    let hash = hex::encode(Sha256::digest(definition.to_string().as_bytes()));
    let (trigger_kind, trigger_key) = trigger_index(&automation.trigger);
    let version = NewVersion {
        name: automation.name.clone(),
        definition,
        hash,
        trigger_kind: trigger_kind.to_owned(),
        trigger_key,
    };
    Ok((automation, version))
}

fn check_handler_configs(
    steps: &[tok_core::definition::Step],
    at: &str,
    registry: &Registry,
    errors: &mut Vec<ValidationError>,
) {
    for (i, step) in steps.iter().enumerate() {
        let here = format!("{at}.{i}");
        if let Err(message) = registry.validate(&step.kind, &step.config) {
            errors.push(ValidationError {
                path: format!("{here}.config"),
                message,
            });
        }
        check_handler_configs(&step.then, &format!("{here}.then"), registry, errors);
        check_handler_configs(&step.else_, &format!("{here}.else"), registry, errors);
        check_handler_configs(&step.do_, &format!("{here}.do"), registry, errors);
    }
}

/// The (kind, key) the dispatcher looks automations up by.
fn trigger_index(trigger: &Trigger) -> (&'static str, Option<String>) {
    match trigger {
        Trigger::Webhook { source, .. } => ("webhook", Some(source.clone())),
        Trigger::Event { event, .. } => ("event", Some(event.clone())),
        other => (other.kind_name(), None),
    }
}

/// Parsed definitions by (automation, version).
#[derive(Default)]
pub struct DefinitionCache {
    parsed: Mutex<HashMap<(AutomationId, i32), Arc<Automation>>>,
}

/// Past this many versions the cache starts over rather than grow without bound.
const CACHE_LIMIT: usize = 10_000;

impl DefinitionCache {
    /// The parsed definition of a version whose JSON the caller already has.
    pub fn parse(&self, id: &AutomationId, version: i32, json: &Value) -> Result<Arc<Automation>> {
        if let Some(found) = self.cached(id, version) {
            return Ok(found);
        }
        let automation: Automation = serde_json::from_value(json.clone()).map_err(|e| {
            EngineError::Definition(format!(
                "automation {id} version {version} does not parse: {e}"
            ))
        })?;
        Ok(self.insert(id, version, automation))
    }

    /// The parsed definition of a version, loaded from the store when not cached.
    pub async fn get(
        &self,
        store: &dyn DefinitionStore,
        tenant: &TenantId,
        id: &AutomationId,
        version: i32,
    ) -> Result<Arc<Automation>> {
        if let Some(found) = self.cached(id, version) {
            return Ok(found);
        }
        let saved = store
            .automation_version(tenant, id, version)
            .await?
            .ok_or_else(|| {
                EngineError::Definition(format!("automation {id} has no version {version}"))
            })?;
        self.parse(id, version, &saved.definition)
    }

    fn cached(&self, id: &AutomationId, version: i32) -> Option<Arc<Automation>> {
        let parsed = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
        parsed.get(&(id.clone(), version)).cloned()
    }

    fn insert(&self, id: &AutomationId, version: i32, automation: Automation) -> Arc<Automation> {
        let automation = Arc::new(automation);
        let mut parsed = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
        if parsed.len() >= CACHE_LIMIT {
            parsed.clear();
        }
        parsed.insert((id.clone(), version), automation.clone());
        automation
    }
}
