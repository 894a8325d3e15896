//! Which keys a step's `config` may have. Every step type says which keys
//! it reads; a key outside them is refused at save with its path, the
//! keys the type has, and the nearest of them when the key looks like a
//! misspelling (`timeout` written for `timeoutMs` would otherwise save and
//! be ignored). The control steps' keys are here; a registered type gives
//! its own (the engine's `StepHandler::config_keys`), checked with
//! [`unknown_config_keys`].

use serde_json::Value;

use super::ValidationError;

/// The config keys of each control step type that tok-core runs.
const CONTROL_KEYS: &[(&str, &[&str])] = &[
    ("condition", &[]),
    (crate::parallel::PARALLEL, &[]),
    (
        crate::for_each::FOR_EACH,
        &["items", "concurrency", "complete", "maxItems"],
    ),
    ("end", &["output"]),
    ("loop", &["items", "maxItems"]),
    ("set", &["values"]),
    ("flow/log", &["message", "level"]),
    (crate::builtin::WAIT, &["duration", "until"]),
    (
        crate::waits::WAIT_FOR_EVENT,
        &[
            "key", "keys", "mode", "subject", "where", "timeout", "lookback",
        ],
    ),
    (
        crate::condition_wait::WAIT_FOR_CONDITION,
        &["rules", "match", "subject", "every", "timeout"],
    ),
    (crate::children::WAIT_FOR_RUNS, &["runs", "mode", "timeout"]),
    (
        crate::repeat::REPEAT,
        &["until", "while", "maxIterations", "every"],
    ),
];

/// The config keys of a control step type; `None` for any other type.
pub fn control_config_keys(kind: &str) -> Option<&'static [&'static str]> {
    CONTROL_KEYS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, keys)| *keys)
}

/// One error for each key of `config` (the config of a `kind` step at
/// `at`, like `steps.2.then.0`) that is not among `keys`. A config that is
/// not an object is someone else's error.
pub fn unknown_config_keys(
    at: &str,
    kind: &str,
    config: &Value,
    keys: &[&str],
) -> Vec<ValidationError> {
    let Value::Object(map) = config else {
        return Vec::new();
    };
    map.keys()
        .filter(|key| !keys.contains(&key.as_str()))
        .map(|key| ValidationError {
            path: format!("{at}.config.{key}"),
            message: unknown_key_message(kind, key, keys),
        })
        .collect()
}

fn unknown_key_message(kind: &str, key: &str, keys: &[&str]) -> String {
    let mut message = format!("a `{kind}` step has no config key `{key}`; ");
    if keys.is_empty() {
        message.push_str("its config takes no keys");
        return message;
    }
    let listed: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    message.push_str(&format!("expected one of {}", listed.join(", ")));
    if let Some(near) = nearest(key, keys) {
        message.push_str(&format!(" (did you mean `{near}`?)"));
    }
    message
}

/// The key `key` was most likely meant to be: the same but for case, one
/// that begins with the other (`timeout` for `timeoutMs`), or one at most
/// two edits away.
fn nearest<'k>(key: &str, keys: &[&'k str]) -> Option<&'k str> {
    let lower = key.to_lowercase();
    let close = |k: &&&str| {
        let k = k.to_lowercase();
        k == lower
            || (lower.len() >= 3 && (k.starts_with(&lower) || lower.starts_with(&k)))
            || strsim::levenshtein(&k, &lower) <= 2
    };
    keys.iter()
        .filter(close)
        .min_by_key(|k| strsim::levenshtein(&k.to_lowercase(), &lower))
        .copied()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_unknown_key_is_named_with_the_keys_the_type_has() {
        let errors = unknown_config_keys(
            "steps.0",
            "http",
            &json!({"url": "https://x", "timeout": 5}),
            &["url", "method", "timeoutMs"],
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, "steps.0.config.timeout");
        assert_eq!(
            errors[0].message,
            "a `http` step has no config key `timeout`; expected one of `url`, `method`, \
             `timeoutMs` (did you mean `timeoutMs`?)"
        );
    }

    #[test]
    fn a_key_far_from_every_known_one_gets_no_guess() {
        let errors = unknown_config_keys("s", "set", &json!({"flow": 1}), &["values"]);
        assert_eq!(
            errors[0].message,
            "a `set` step has no config key `flow`; expected one of `values`"
        );
        assert_eq!(nearest("Values", &["values"]), Some("values"));
        assert_eq!(nearest("maxItem", &["items", "maxItems"]), Some("maxItems"));
    }

    #[test]
    fn every_control_type_lists_its_keys() {
        for kind in crate::builtin::INTERNAL_TYPES.iter().chain(&[
            crate::waits::WAIT_FOR_EVENT,
            crate::condition_wait::WAIT_FOR_CONDITION,
            crate::children::WAIT_FOR_RUNS,
            crate::parallel::PARALLEL,
            crate::for_each::FOR_EACH,
            crate::repeat::REPEAT,
        ]) {
            assert!(crate::control::is_control(kind));
            assert!(control_config_keys(kind).is_some(), "{kind} lists no keys");
        }
        assert_eq!(control_config_keys("http"), None);
    }

    #[test]
    fn a_type_without_keys_says_so_and_known_keys_pass() {
        let errors = unknown_config_keys("s", "condition", &json!({"x": 1}), &[]);
        assert_eq!(
            errors[0].message,
            "a `condition` step has no config key `x`; its config takes no keys"
        );
        assert!(unknown_config_keys("s", "loop", &json!({"items": []}), &["items"]).is_empty());
        assert!(unknown_config_keys("s", "loop", &Value::Null, &["items"]).is_empty());
    }
}
