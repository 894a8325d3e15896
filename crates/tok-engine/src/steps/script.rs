//! `script`: a tenant's JavaScript transform, `function main(input)`
//! returning an object whose keys become the step's outputs.
//!
//! The handler only shapes the request; the script runs in a sandbox child
//! process of a [`ScriptPool`] (see `tok-script` for why processes), so it
//! never runs on the runtime's threads, and a runaway script costs its own
//! step no more than its timeout plus the pool's grace period. Every
//! failure the script causes is terminal: the same script on the same
//! input fails the same way. Only a sandbox that cannot be started is
//! retried.
//!
//! The compiled script is cached per tenant and source (a hash of it), so a
//! new automation version with a changed script compiles afresh, and two
//! tenants never share a context.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tok_core::error::StepError;
use tok_script::{ScriptPool, ScriptRequest};

use crate::registry::{ConfigError, StepCall, StepHandler};

/// The `script` step type, running its scripts on `pool`.
pub struct ScriptStep {
    pool: ScriptPool,
}

impl ScriptStep {
    pub fn new(pool: ScriptPool) -> Self {
        Self { pool }
    }
}

struct Config<'a> {
    source: &'a str,
    input: Option<&'a Value>,
    timeout: Option<Duration>,
}

/// The config, or what is wrong with it and the key it concerns.
fn parse(config: &Value) -> Result<Config<'_>, ConfigError> {
    let refused = |key: &str, message: String| ConfigError {
        key: key.to_owned(),
        message,
    };
    let source = match config.get("source") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.as_str(),
        _ => {
            return Err(refused(
                "source",
                "script needs `source`: JavaScript defining `function main(input)` that returns an object"
                    .into(),
            ));
        }
    };
    if !defines_main(source) {
        return Err(refused(
            "source",
            "script `source` must define `function main(input)` (or `const main = (input) => ...`) that returns an object"
                .into(),
        ));
    }
    // Config strings are rendered before the step runs: a template here
    // would put whatever a webhook body holds into the code.
    if source.contains("{{") {
        return Err(refused(
            "source",
            "script `source` must not contain `{{`: config strings are templates, and data belongs in `input`, not in code (write `{ {` if you need two braces)"
                .into(),
        ));
    }
    let timeout = match config.get("timeoutMs") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let ms = v.as_u64().ok_or_else(|| {
                refused("timeoutMs", format!("script `timeoutMs` is {v}; it must be a whole number of milliseconds between 50 and 1000"))
            })?;
            let timeout = Duration::from_millis(ms);
            tok_script::check_timeout(timeout)
                .map_err(|e| refused("timeoutMs", format!("script `timeoutMs`: {e}")))?;
            Some(timeout)
        }
    };
    Ok(Config {
        source,
        input: config.get("input"),
        timeout,
    })
}

/// Whether `source` declares `main` as a function or binds it with `=`.
/// A save-time hint only (comments can fool it); the sandbox checks for real.
fn defines_main(source: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    source.match_indices("main").any(|(at, _)| {
        let before = &source[..at];
        let after = &source[at + "main".len()..];
        if before.chars().next_back().is_some_and(is_ident)
            || after.chars().next().is_some_and(is_ident)
        {
            return false;
        }
        let after = after.trim_start();
        before.trim_end().ends_with("function")
            || (after.starts_with('=') && !after.starts_with("=="))
    })
}

#[async_trait]
impl StepHandler for ScriptStep {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        let config = parse(&call.config).map_err(|e| StepError::terminal(e.message))?;
        let cache_key = format!(
            "{}:{}",
            call.tenant_id,
            hex::encode(Sha256::digest(config.source.as_bytes()))
        );
        let request = ScriptRequest {
            source: config.source.to_owned(),
            input: config
                .input
                .cloned()
                .unwrap_or_else(|| Arc::unwrap_or_clone(call.context)),
            timeout: config.timeout,
            cache_key,
        };
        match self.pool.run(request).await {
            Ok(output) => {
                for line in &output.logs {
                    tracing::debug!(tenant = %call.tenant_id, run = %call.run_id, step = %call.step_id, "script log: {line}");
                }
                Ok(output.value)
            }
            Err(e) if e.is_script_fault() => Err(StepError::terminal(e.to_string())),
            Err(e) => Err(StepError::retryable(e.to_string())),
        }
    }

    fn config_keys(&self) -> Option<&'static [&'static str]> {
        Some(&["source", "input", "timeoutMs"])
    }

    fn validate(&self, config: &Value) -> Result<(), String> {
        self.check_config(config).map_err(|e| e.message)
    }

    fn check_config(&self, config: &Value) -> Result<(), ConfigError> {
        parse(config).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tok_script::PoolConfig;

    use super::*;

    fn step() -> ScriptStep {
        // Validation never starts a child, so no sandbox program is needed.
        ScriptStep::new(ScriptPool::new(PoolConfig::new("/nonexistent", ["x"])).unwrap())
    }

    #[test]
    fn configs_are_checked_at_save() {
        let step = step();
        let ok = |config: Value| step.validate(&config);
        assert_eq!(
            ok(json!({"source": "function main(input) { return {} }"})),
            Ok(())
        );
        assert_eq!(
            ok(
                json!({"source": "const main = (i) => ({ n: i.n })", "input": {"n": 1}, "timeoutMs": 1000})
            ),
            Ok(())
        );
        assert_eq!(
            ok(json!({"source": "let main=function(i){return {}}", "timeoutMs": 50})),
            Ok(())
        );

        let err = ok(json!({})).unwrap_err();
        assert!(err.starts_with("script needs `source`"), "{err}");
        let err = ok(json!({"source": "function handler(input) { return {} }"})).unwrap_err();
        assert!(err.contains("must define `function main(input)`"), "{err}");
        let err = ok(json!({"source": "function domain() {} if (main == 1) {}"})).unwrap_err();
        assert!(err.contains("must define"), "{err}");
        let err =
            ok(json!({"source": "function main(i) { return {a: '{{body.x}}'} }"})).unwrap_err();
        assert!(err.contains("must not contain `{{`"), "{err}");
        assert_eq!(
            ok(json!({"source": "function main() { return {} }", "timeoutMs": 5000})).unwrap_err(),
            "script `timeoutMs`: script timeout is 5000 ms; it must be between 50 and 1000 ms"
        );
        let err = ok(json!({"source": "function main() { return {} }", "timeoutMs": "fast"}))
            .unwrap_err();
        assert!(err.contains("whole number of milliseconds"), "{err}");
    }

    #[test]
    fn a_refused_config_names_its_key() {
        let step = step();
        let key = |config: Value| step.check_config(&config).unwrap_err().key;
        assert_eq!(
            key(json!({"source": "function main(i) { return {a: '{{_body.x}}'} }"})),
            "source"
        );
        assert_eq!(key(json!({})), "source");
        assert_eq!(
            key(json!({"source": "function main() { return {} }", "timeoutMs": 1})),
            "timeoutMs"
        );
    }

    #[tokio::test]
    async fn an_unavailable_sandbox_is_retryable_and_a_bad_config_is_not() {
        let step = step();
        let call = |config: Value| StepCall {
            tenant_id: "t1".into(),
            run_id: tok_core::ids::RunId::generate(),
            path: "0".into(),
            step_id: "transform".into(),
            idempotency_key: "r:0".into(),
            attempt: 1,
            job_id: tok_core::ids::JobId(1),
            lease_ms: 30_000,
            config,
            context: Arc::new(json!({})),
            effects: crate::registry::Effects::none(),
            traceparent: None,
            lease: crate::registry::Lease::default(),
        };
        let e = step
            .run(call(json!({"source": "function main() { return {} }"})))
            .await
            .unwrap_err();
        assert!(e.is_retryable(), "{e}");
        let e = step.run(call(json!({"timeoutMs": 10}))).await.unwrap_err();
        assert!(!e.is_retryable(), "{e}");
    }
}
