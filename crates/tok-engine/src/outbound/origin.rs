//! Credentials keep to their origin (docs/security.md): a step or widget naming
//! a connection calls only URLs of the origin (scheme, host, port) of the
//! connection's `base_url`, so the connection's credentials reach no other
//! host, whatever the tenant writes or a webhook body renders.
//!
//! Three places hold the rule: [`check_definition`] and [`check_widget`]
//! refuse a literal URL of another origin when it is saved (a 400), and
//! [`mismatches`] finds those a change of a connection's base URL would
//! leave behind (the API refuses the change);
//! [`for_call`] refuses a URL that rendered to another origin when it is
//! called (a terminal error beginning with `origin_mismatch:`); and the
//! guard refuses a redirect off the origin while credentials are attached.
//!
//! A change of a connection's base URL to another origin ([`moved`]) would
//! send the credentials it holds to that origin: the API asks for them
//! again (or the `admin` scope) before it saves one.
//!
//! A connection with credentials but no `base_url` has no origin to keep
//! them to: a call through it is refused, and so is saving a step or
//! widget that names it. tok does not guess an origin from the first URL
//! called.

use std::collections::HashMap;

use serde_json::Value;
use tok_core::definition::Automation;
use tok_core::ids::TenantId;
use tok_core::validate::ValidationError;
use tok_core::walk::each_step;
use tok_store::{Connection, ConnectionStore, StoreError};
use url::{Origin, Url};

/// The code that begins the message of a call refused for its origin.
pub const MISMATCH: &str = "origin_mismatch";

/// The origin a connection's credentials are bound to, or why the
/// connection cannot be used with them.
fn bound_origin(connection: &Connection) -> Result<Option<Origin>, String> {
    match connection.base_url.as_deref() {
        Some(base) => match Url::parse(base) {
            Ok(url) if url.has_host() => Ok(Some(url.origin())),
            _ => Err(format!(
                "connection `{}`: its base_url `{base}` is not an absolute http(s) URL",
                connection.name
            )),
        },
        None if connection.has_credentials => Err(format!(
            "connection `{}` has credentials but no base_url: tok sends credentials only to \
             the origin of a connection's base_url; create the connection with one",
            connection.name
        )),
        None => Ok(None),
    }
}

fn mismatch(connection: &Connection, url: &Url, origin: &Origin) -> String {
    format!(
        "`{url}` is of the origin {}, not of connection `{}`'s base_url ({}): a step or widget \
         naming a connection calls only its base_url's origin, so its credentials go nowhere else",
        url.origin().ascii_serialization(),
        connection.name,
        origin.ascii_serialization()
    )
}

/// Whether a base URL going from `from` to `to` changes its origin (scheme,
/// host, port): the two origins as they are shown, when it does. A base
/// URL that does not parse has an origin of its own, unlike any other.
pub fn moved(from: Option<&str>, to: Option<&str>) -> Option<(String, String)> {
    let origin = |base: Option<&str>| base.and_then(|b| Url::parse(b).ok()).map(|u| u.origin());
    let shown = |base: Option<&str>, origin: &Option<Origin>| match (base, origin) {
        (_, Some(o)) if o.is_tuple() => o.ascii_serialization(),
        (Some(base), _) => format!("`{base}`"),
        (None, _) => "no base_url".to_owned(),
    };
    let (a, b) = (origin(from), origin(to));
    let same = matches!((&a, &b), (Some(a), Some(b)) if a.is_tuple() && a == b)
        || (from.is_none() && to.is_none());
    (!same).then(|| (shown(from, &a), shown(to, &b)))
}

/// At the call: the origin the call's credentials are bound to (for the
/// redirects), once `url` (rendered and joined to the base URL) is of the
/// connection's origin; else a terminal message beginning with
/// `origin_mismatch:`.
pub(crate) fn for_call(connection: &Connection, url: &Url) -> Result<Option<Origin>, String> {
    let origin = bound_origin(connection).map_err(|e| format!("{MISMATCH}: {e}"))?;
    match origin {
        Some(origin) if url.origin() != origin => Err(format!(
            "{MISMATCH}: {}",
            mismatch(connection, url, &origin)
        )),
        Some(origin) => Ok(connection.has_credentials.then_some(origin)),
        None => Ok(None),
    }
}

/// At save: a literal absolute `url` must be of `connection`'s origin, and
/// a connection with credentials must have a base_url. Templated URLs are
/// judged at the call.
pub fn check_literal(connection: &Connection, url: &str) -> Result<(), String> {
    let origin = bound_origin(connection)?;
    if url.contains("{{") {
        return Ok(());
    }
    let lower = url.trim_start().to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Ok(());
    }
    let (Some(origin), Ok(parsed)) = (origin, Url::parse(url.trim())) else {
        return Ok(());
    };
    if parsed.origin() != origin {
        return Err(mismatch(connection, &parsed, &origin));
    }
    Ok(())
}

/// Every `http` step of `automation` that names a connection (by a literal
/// name) and calls a literal URL of another origin, or names a connection
/// with credentials and no base_url, as validation errors at the step's
/// `config.url` or `config.connection`. Called beside
/// `definitions::prepare` where a definition is saved; a connection that
/// does not exist yet is not judged here (its call fails or is judged then).
pub async fn check_definition(
    tenant: &TenantId,
    automation: &Automation,
    connections: &dyn ConnectionStore,
) -> Result<Vec<ValidationError>, StoreError> {
    let mut wanted: Vec<(String, String, String)> = Vec::new();
    each_step(&automation.steps, "steps", &mut |path, step| {
        if step.kind != "http" {
            return;
        }
        let Some(name) = step.config.get("connection").and_then(Value::as_str) else {
            return;
        };
        if name.contains("{{") {
            return;
        }
        let url = step
            .config
            .get("url")
            .and_then(Value::as_str)
            .unwrap_or_default();
        wanted.push((path.to_owned(), name.to_owned(), url.to_owned()));
    });
    let mut found: HashMap<String, Option<Connection>> = HashMap::new();
    let mut errors = Vec::new();
    for (path, name, url) in wanted {
        if !found.contains_key(&name) {
            let connection = connections.connection(tenant, &name).await?;
            found.insert(name.clone(), connection);
        }
        let Some(Some(connection)) = found.get(&name) else {
            continue;
        };
        if let Err(message) = check_literal(connection, &url) {
            let field = if bound_origin(connection).is_err() {
                "connection"
            } else {
                "url"
            };
            errors.push(ValidationError {
                path: format!("{path}.config.{field}"),
                message,
            });
        }
    }
    Ok(errors)
}

/// The paths (`steps.0.config.url`) of the `http` steps of `automation`
/// that name `connection` (by its name or id) and call a literal URL that
/// is not of its origin: what would fail with `origin_mismatch` were the
/// connection as given (a change of its base URL not yet saved).
pub fn mismatches(automation: &Automation, connection: &Connection) -> Vec<String> {
    let mut found = Vec::new();
    each_step(&automation.steps, "steps", &mut |path, step| {
        let names = step.config.get("connection").and_then(Value::as_str);
        if step.kind != "http" || !names.is_some_and(|n| n == connection.id || n == connection.name)
        {
            return;
        }
        let url = step.config.get("url").and_then(Value::as_str);
        if check_literal(connection, url.unwrap_or_default()).is_err() {
            found.push(format!("{path}.config.url"));
        }
    });
    found
}

/// A widget's request through its connection, as [`check_definition`]
/// judges a step's; `Ok` when the connection does not exist (the fetch
/// says so).
pub async fn check_widget(
    tenant: &TenantId,
    connection: Option<&str>,
    request: &Value,
    connections: &dyn ConnectionStore,
) -> Result<Result<(), String>, StoreError> {
    let Some(name) = connection else {
        return Ok(Ok(()));
    };
    let Some(connection) = connections.connection(tenant, name).await? else {
        return Ok(Ok(()));
    };
    let url = request
        .get("url")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Ok(check_literal(&connection, url))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn connection(base_url: Option<&str>, credentials: Value) -> Connection {
        Connection {
            id: "c1".into(),
            name: "shop".into(),
            service: "http".into(),
            base_url: base_url.map(str::to_owned),
            has_credentials: credentials.as_object().is_some_and(|m| !m.is_empty()),
            credentials,
            rate: None,
            burst: 0,
            max_concurrency: None,
            breaker_threshold: 5,
            breaker_cooldown_ms: 30_000,
            breaker_state: "closed".into(),
            failures: 0,
            created_at: 0,
        }
    }

    #[test]
    fn a_literal_url_must_be_of_the_base_urls_origin() {
        let shop = connection(
            Some("https://api.shop.example/v1"),
            json!({ "bearer": "s" }),
        );
        assert!(check_literal(&shop, "/orders").is_ok());
        assert!(check_literal(&shop, "https://api.shop.example/v2/orders").is_ok());
        assert!(check_literal(&shop, "https://API.shop.example:443/x").is_ok());
        assert!(check_literal(&shop, "https://{{_body.host}}/x").is_ok());
        for other in [
            "http://api.shop.example/x",
            "https://api.shop.example:8443/x",
            "https://echo.example/x",
            "https://api.shop.example.evil.example/x",
            "https://api.shop.example@evil.example/x",
        ] {
            let error = check_literal(&shop, other).unwrap_err();
            assert!(
                error.contains("https://api.shop.example"),
                "{other}: {error}"
            );
            assert!(error.contains("connection `shop`"), "{error}");
        }
    }

    #[test]
    fn credentials_without_a_base_url_have_no_origin() {
        let loose = connection(None, json!({ "bearer": "s" }));
        let error = check_literal(&loose, "https://anywhere.example/").unwrap_err();
        assert!(error.contains("no base_url"), "{error}");
        let url = Url::parse("https://anywhere.example/").unwrap();
        assert!(
            for_call(&loose, &url)
                .unwrap_err()
                .starts_with("origin_mismatch: ")
        );
        let open = connection(None, json!({}));
        assert_eq!(for_call(&open, &url), Ok(None));
        assert!(check_literal(&open, "https://anywhere.example/").is_ok());
    }

    #[test]
    fn a_move_of_the_base_url_strands_the_literal_urls_of_the_old_origin() {
        let automation: Automation = serde_json::from_value(json!({
            "name": "Orders",
            "trigger": { "kind": "manual" },
            "steps": [
                { "id": "st_rel", "type": "http", "config": { "connection": "shop", "url": "/orders" } },
                { "id": "st_if", "type": "condition", "config": { "if": "{{x}}" }, "then": [
                    { "id": "st_abs", "type": "http",
                      "config": { "connection": "c1", "url": "https://api.shop.example/orders" } },
                    { "id": "st_tpl", "type": "http",
                      "config": { "connection": "shop", "url": "https://{{host}}/orders" } },
                    { "id": "st_else", "type": "http",
                      "config": { "connection": "other", "url": "https://api.shop.example/x" } }
                ] }
            ]
        }))
        .unwrap();
        let here = connection(
            Some("https://api.shop.example/v2"),
            json!({ "bearer": "s" }),
        );
        assert!(mismatches(&automation, &here).is_empty(), "same origin");
        let moved = connection(Some("https://shop.example.net"), json!({ "bearer": "s" }));
        assert_eq!(
            mismatches(&automation, &moved),
            ["steps.1.then.0.config.url"],
            "named by id; the relative, the templated and another connection's URLs are not stranded"
        );
    }

    #[test]
    fn a_move_is_a_change_of_scheme_host_or_port() {
        let from = Some("https://api.shop.example/v1");
        for same in [
            "https://api.shop.example/v2",
            "https://API.shop.example:443/",
            "https://api.shop.example",
        ] {
            assert_eq!(moved(from, Some(same)), None, "{same}");
        }
        for other in [
            "http://api.shop.example/v1",
            "https://api.shop.example:8443/v1",
            "https://evil.example/v1",
            "https://api.shop.example.evil.example/",
            "https://api.shop.example@evil.example/",
        ] {
            let (a, b) = moved(from, Some(other)).expect(other);
            assert_eq!(a, "https://api.shop.example");
            assert_ne!(b, a, "{other}");
        }
        assert_eq!(
            moved(None, Some("https://x.example/")),
            Some(("no base_url".into(), "https://x.example".into()))
        );
        assert!(moved(Some("not a url"), Some("not a url")).is_some());
        assert_eq!(moved(None, None), None);
    }

    #[test]
    fn a_rendered_url_of_another_origin_is_an_origin_mismatch() {
        let shop = connection(Some("https://api.shop.example"), json!({ "bearer": "s" }));
        let home = Url::parse("https://api.shop.example/orders").unwrap();
        assert_eq!(
            for_call(&shop, &home)
                .unwrap()
                .unwrap()
                .ascii_serialization(),
            "https://api.shop.example"
        );
        let away = Url::parse("https://echo.example/steal").unwrap();
        let error = for_call(&shop, &away).unwrap_err();
        assert!(error.starts_with("origin_mismatch: "), "{error}");
        assert!(error.contains("https://echo.example"), "{error}");
        let public = connection(Some("https://api.shop.example"), Value::Null);
        assert_eq!(for_call(&public, &home), Ok(None), "no credentials to bind");
    }
}
