//! Automation definitions: preparing a definition for saving (parse,
//! validate, hash) and a cache of parsed versions for the dispatcher and
//! the workers. A version never changes once saved, so a cached version is
//! never stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tok_core::definition::{Automation, DefinitionError, Trigger};
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
        let DefinitionError::Json {
            path,
            message,
            line,
            column,
        } = e;
        vec![ValidationError {
            path,
            message: format!("{message} (line {line}, column {column})"),
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

/// Each registered step's own check of its `config` (the script guard,
/// the `http` step's URL and body, …) and of the keys it has, on every
/// step of every child list.
fn check_handler_configs(
    steps: &[tok_core::definition::Step],
    at: &str,
    registry: &Registry,
    errors: &mut Vec<ValidationError>,
) {
    tok_core::walk::each_step(steps, at, &mut |here, step| {
        if let Err(e) = registry.check_config(&step.kind, &step.config) {
            let path = if e.key.is_empty() {
                format!("{here}.config")
            } else {
                format!("{here}.config.{}", e.key)
            };
            errors.push(ValidationError {
                path,
                message: e.message,
            });
        }
        if !step.escalations.is_empty() && !registry.may_wait(&step.kind) {
            errors.push(ValidationError {
                path: format!("{here}.escalations"),
                message: tok_core::escalation::never_waits(step),
            });
        }
        if let Some(keys) = registry.config_keys(&step.kind) {
            errors.extend(tok_core::validate::unknown_config_keys(
                here,
                &step.kind,
                &step.config,
                keys,
            ));
        }
    });
}

/// The (kind, key) the dispatcher looks automations up by.
fn trigger_index(trigger: &Trigger) -> (&'static str, Option<String>) {
    match trigger {
        Trigger::Webhook { source, .. } => ("webhook", Some(source.clone())),
        Trigger::Event { event, .. } => ("event", Some(event.clone())),
        other => (other.kind_name(), None),
    }
}

/// A cached version: its tenant, automation and number. The tenant is
/// part of the key, so that an automation id of another tenant never
/// finds that tenant's definition here.
type Key = (TenantId, AutomationId, i32);

/// Parsed definitions by (tenant, automation, version).
#[derive(Default)]
pub struct DefinitionCache {
    parsed: Mutex<HashMap<Key, Arc<Automation>>>,
}

/// Past this many versions the cache starts over rather than grow without bound.
const CACHE_LIMIT: usize = 10_000;

impl DefinitionCache {
    /// The parsed definition of the tenant's version whose JSON the
    /// caller already has.
    pub fn parse(
        &self,
        tenant: &TenantId,
        id: &AutomationId,
        version: i32,
        json: &Value,
    ) -> Result<Arc<Automation>> {
        let key = (tenant.clone(), id.clone(), version);
        if let Some(found) = self.cached(&key) {
            return Ok(found);
        }
        let automation: Automation = serde_json::from_value(json.clone()).map_err(|e| {
            EngineError::Definition(format!(
                "automation {id} version {version} does not parse: {e}"
            ))
        })?;
        Ok(self.insert(key, automation))
    }

    /// The parsed definition of a version, loaded from the store when not cached.
    pub async fn get(
        &self,
        store: &dyn DefinitionStore,
        tenant: &TenantId,
        id: &AutomationId,
        version: i32,
    ) -> Result<Arc<Automation>> {
        if let Some(found) = self.cached(&(tenant.clone(), id.clone(), version)) {
            return Ok(found);
        }
        let saved = store
            .automation_version(tenant, id, version)
            .await?
            .ok_or_else(|| {
                EngineError::Definition(format!("automation {id} has no version {version}"))
            })?;
        self.parse(tenant, id, version, &saved.definition)
    }

    fn cached(&self, key: &Key) -> Option<Arc<Automation>> {
        let parsed = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
        parsed.get(key).cloned()
    }

    fn insert(&self, key: Key, automation: Automation) -> Arc<Automation> {
        let automation = Arc::new(automation);
        let mut parsed = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
        if parsed.len() >= CACHE_LIMIT {
            parsed.clear();
        }
        parsed.insert(key, automation.clone());
        automation
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tok_core::definition::Step;
    use tok_core::walk::ChildKind;
    use tok_script::{PoolConfig, ScriptPool};

    use super::*;

    fn registry() -> Registry {
        let mut registry = Registry::with_builtins();
        // Validation never starts a sandbox, so no program is needed.
        let pool = ScriptPool::new(PoolConfig::new("/nonexistent", ["x"])).unwrap();
        registry.register("script", crate::ScriptStep::new(pool));
        registry
    }

    fn refused(definition: &Value) -> Vec<ValidationError> {
        prepare(definition.to_string().as_bytes(), &registry()).unwrap_err()
    }

    #[test]
    fn the_script_guard_reaches_every_kind_of_child_list() {
        let script = Step::new(
            "js",
            "script",
            json!({"source": "function main(i) { return {x: '{{_body.x}}'} }"}),
        );
        for kind in ChildKind::ALL {
            let mut holder = kind.holder("h");
            kind.add(&mut holder, vec![script.clone()]);
            let mut outer = ChildKind::Compensate.holder("outer");
            outer.compensate.clear();
            let definition = json!({"name": "n", "trigger": {"kind": "manual"},
                                    "steps": [outer, holder]});
            let errors = refused(&definition);
            let list = match kind {
                ChildKind::Branch => "branches.0".to_owned(),
                ChildKind::Escalation => "escalations.0.steps".to_owned(),
                other => other.key().to_owned(),
            };
            assert_eq!(errors.len(), 1, "{kind:?}: {errors:#?}");
            assert_eq!(errors[0].path, format!("steps.1.{list}.0.config.source"));
            assert!(
                errors[0].message.contains("must not contain `{{`"),
                "{errors:#?}"
            );
        }
    }

    #[test]
    fn a_shape_error_is_refused_at_its_path_with_its_position() {
        let errors = refused(
            &json!({"name": "n", "trigger": {"kind": "manual"}, "steps": [],
                                     "flwo": {"priority": 5}}),
        );
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert_eq!(errors[0].path, "flwo");
        assert!(
            errors[0]
                .message
                .starts_with("unknown field `flwo`, expected one of `name`, `trigger`, `flow`, `steps`, `settings` (line 1, column "),
            "{errors:#?}"
        );
    }

    #[test]
    fn a_cached_version_is_found_only_for_its_own_tenant() {
        let cache = DefinitionCache::default();
        let id = AutomationId::from("aut_shared".to_owned());
        let named = |name: &str| json!({"name": name, "trigger": {"kind": "manual"}, "steps": []});
        let (acme, other) = (
            TenantId::from("acme".to_owned()),
            TenantId::from("other".to_owned()),
        );
        let first = cache.parse(&acme, &id, 1, &named("Acme's")).unwrap();
        assert_eq!(first.name, "Acme's");
        let second = cache.parse(&other, &id, 1, &named("Other's")).unwrap();
        assert_eq!(
            second.name, "Other's",
            "another tenant's id never reads acme's version"
        );
        let again = cache.parse(&acme, &id, 1, &named("ignored")).unwrap();
        assert_eq!(again.name, "Acme's", "a version never changes once cached");
    }
}
