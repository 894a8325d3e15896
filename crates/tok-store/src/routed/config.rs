//! Which tenants live on which database, as configured
//! (`TOK_TENANT_DATABASES`, `TOK_TENANT_DATABASES_FILE`,
//! `TOK_TENANT_DATABASE_TIMEOUT`).

use std::time::Duration;

use serde_json::Value;

/// How long a call to a tenant database may take, its connection
/// included, before the database counts as not answering (3 s): long
/// enough for any of tok's statements, short enough that a database gone
/// away costs the others a few seconds once, not a lease.
pub const DEFAULT_TENANT_DATABASE_TIMEOUT: Duration = Duration::from_secs(3);

/// Which tenants live on which database: entries `tenant=url`, where
/// `tenant` is a tenant's id or name, or `*` for every tenant no other
/// entry names (new ones included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantDatabases {
    entries: Vec<(String, String)>,
    timeout: Duration,
}

impl Default for TenantDatabases {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            timeout: DEFAULT_TENANT_DATABASE_TIMEOUT,
        }
    }
}

impl TenantDatabases {
    /// Parses `tenant=url` entries separated by `;` or new lines (blank
    /// ones and lines starting with `#` are skipped); `origin` names where
    /// the text came from in errors (`TOK_TENANT_DATABASES`, a file).
    pub fn parse(text: &str, origin: &str) -> std::result::Result<Self, String> {
        let mut out = Self::default();
        for (n, raw) in text.split([';', '\n']).enumerate() {
            let entry = raw.trim();
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let Some((key, url)) = entry.split_once('=') else {
                return Err(format!(
                    "{origin}: entry {} `{}` has no `=`; expected `tenant=postgres://…` \
                     (a tenant's id or name, or `*`)",
                    n + 1,
                    redact(entry)
                ));
            };
            out.add(
                key.trim(),
                url.trim(),
                &format!("{origin}: entry {}", n + 1),
            )?;
        }
        Ok(out)
    }

    /// Parses a file: a JSON object `{"tenant": "postgres://…", …}` when it
    /// starts with `{`, else the lines of [`TenantDatabases::parse`].
    pub fn parse_file(text: &str, path: &str) -> std::result::Result<Self, String> {
        if !text.trim_start().starts_with('{') {
            return Self::parse(text, path);
        }
        let value: serde_json::Map<String, Value> = serde_json::from_str(text)
            .map_err(|e| format!("{path}: not a JSON object of tenant to database URL ({e})"))?;
        let mut out = Self::default();
        for (key, url) in value {
            let Some(url) = url.as_str() else {
                return Err(format!(
                    "{path}: the value of `{key}` is {url}; expected a string postgres://…"
                ));
            };
            out.add(key.trim(), url.trim(), &format!("{path}: `{key}`"))?;
        }
        Ok(out)
    }

    /// Adds the entries of `other` (one configuration from two places).
    pub fn merge(&mut self, other: TenantDatabases) -> std::result::Result<(), String> {
        for (key, url) in other.entries {
            self.add(&key, &url, "both TOK_TENANT_DATABASES and the file")?;
        }
        Ok(())
    }

    fn add(&mut self, key: &str, url: &str, at: &str) -> std::result::Result<(), String> {
        if key.is_empty() {
            return Err(format!(
                "{at}: the tenant before `=` is empty; expected a tenant's id or name, or `*`"
            ));
        }
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(format!(
                "{at}: the database of `{key}` is `{}`; expected a postgres://… URL",
                redact(url)
            ));
        }
        if self.entries.iter().any(|(k, _)| k == key) {
            return Err(format!("{at}: `{key}` is named twice"));
        }
        self.entries.push((key.to_owned(), url.to_owned()));
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, `(tenant, url)`, in the order given.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }

    /// These entries, each database waited for at most `timeout` per call
    /// ([`DEFAULT_TENANT_DATABASE_TIMEOUT`] unless set).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long a call to a tenant database may take before the database
    /// counts as not answering.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// Hides a password in a URL shown in an error or a log.
pub(crate) fn redact(text: &str) -> String {
    match (text.find("://"), text.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &text[..scheme], &text[at..])
        }
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_by_tenant_with_clear_errors() {
        let parsed = TenantDatabases::parse(
            " acme = postgres://u:p@db1/acme ; ten_1=postgresql://db2/x?sslmode=require\n# a comment\n*=postgres://db3/rest;",
            "TOK_TENANT_DATABASES",
        )
        .unwrap();
        assert_eq!(
            parsed.entries(),
            [
                ("acme".to_owned(), "postgres://u:p@db1/acme".to_owned()),
                (
                    "ten_1".to_owned(),
                    "postgresql://db2/x?sslmode=require".to_owned()
                ),
                ("*".to_owned(), "postgres://db3/rest".to_owned()),
            ]
        );
        let err = |text: &str| TenantDatabases::parse(text, "TOK_TENANT_DATABASES").unwrap_err();
        assert_eq!(
            err("acme=postgres://db/a;beta"),
            "TOK_TENANT_DATABASES: entry 2 `beta` has no `=`; expected `tenant=postgres://…` \
             (a tenant's id or name, or `*`)"
        );
        assert_eq!(
            err("acme=sqlite://x.db"),
            "TOK_TENANT_DATABASES: entry 1: the database of `acme` is `sqlite://x.db`; \
             expected a postgres://… URL"
        );
        assert_eq!(
            err("=postgres://db/a"),
            "TOK_TENANT_DATABASES: entry 1: the tenant before `=` is empty; expected a \
             tenant's id or name, or `*`"
        );
        assert_eq!(
            err("a=postgres://db/a;a=postgres://db/b"),
            "TOK_TENANT_DATABASES: entry 2: `a` is named twice"
        );
        // A password never shows in an error.
        assert!(!err("a=mysql://u:secret@db/a").contains("secret"));
    }

    #[test]
    fn a_file_is_json_or_lines_and_merges_with_the_variable() {
        let file = TenantDatabases::parse_file(
            r#"{ "acme": "postgres://db1/acme" }"#,
            "/etc/tok/tenants.json",
        )
        .unwrap();
        assert_eq!(file.entries().len(), 1);
        assert_eq!(
            TenantDatabases::parse_file(r#"{ "acme": 3 }"#, "t.json").unwrap_err(),
            "t.json: the value of `acme` is 3; expected a string postgres://…"
        );
        assert!(
            TenantDatabases::parse_file("{ nope", "t.json")
                .unwrap_err()
                .starts_with("t.json: not a JSON object of tenant to database URL")
        );
        let lines = TenantDatabases::parse_file("beta=postgres://db2/b\n", "t.conf").unwrap();
        let mut all = lines;
        all.merge(file.clone()).unwrap();
        assert_eq!(all.entries().len(), 2);
        let mut twice = file.clone();
        assert_eq!(
            twice.merge(file).unwrap_err(),
            "both TOK_TENANT_DATABASES and the file: `acme` is named twice"
        );
    }
}
