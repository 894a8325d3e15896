//! The HTTP side of the client: one request, its answer as JSON, and the
//! errors a person can act on — no server at the address, a key the server
//! refuses, or the server's own `{"error": {"code", "message"}}`.

use anyhow::{Context as _, anyhow, bail};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::Target;

/// A client of one server, as one tenant.
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
    tenant: Option<String>,
}

impl Client {
    pub fn new(target: &Target) -> anyhow::Result<Client> {
        // reqwest is built with rustls and no default crypto provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let base = target.url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!(
                "TOK_URL `{}` must start with http:// or https://",
                target.url
            );
        }
        if target.api_key.trim().is_empty() {
            bail!("TOK_API_KEY is empty: set it to a tenant's API key or the admin key");
        }
        Ok(Client {
            http: reqwest::Client::new(),
            base,
            key: target.api_key.trim().to_owned(),
            tenant: target.tenant.clone(),
        })
    }

    /// The server's address, as the messages show it.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(tenant) = &self.tenant {
            request = request.header("X-Tok-Tenant", tenant);
        }
        request
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.request(Method::GET, path), path).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(self.request(Method::POST, path).json(body), path)
            .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(self.request(Method::PUT, path).json(body), path)
            .await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(self.request(Method::PATCH, path).json(body), path)
            .await
    }

    /// `Null` for a 204.
    pub async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.request(Method::DELETE, path), path).await
    }

    /// A response that stays open (`GET /api/stream`).
    pub async fn open(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        let response = self
            .request(Method::GET, path)
            .header("Accept", "text/event-stream")
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Err(self.refused(status, path, &text))
    }

    async fn send(&self, request: reqwest::RequestBuilder, path: &str) -> anyhow::Result<Value> {
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .with_context(|| format!("reading the answer of {}{path}", self.base))?;
        if !status.is_success() {
            return Err(self.refused(status, path, &text));
        }
        if status == StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{}{path} answered {status} with a body that is not JSON; is {} a tok server?",
                self.base, self.base
            )
        })
    }

    fn unreachable(&self, error: reqwest::Error) -> anyhow::Error {
        // The innermost cause says what happened ("Connection refused").
        let mut cause: &dyn std::error::Error = &error;
        while let Some(next) = cause.source() {
            cause = next;
        }
        if error.is_connect() {
            anyhow!(
                "no tok server at {}: {cause} (start one with `tok serve`, or set TOK_URL)",
                self.base
            )
        } else {
            anyhow!("the request to {} failed: {cause}", self.base)
        }
    }

    /// The server's answer to a request it did not take.
    fn refused(&self, status: StatusCode, path: &str, text: &str) -> anyhow::Error {
        let error = serde_json::from_str::<Value>(text).ok();
        let error = error.as_ref().map(|v| &v["error"]);
        let code = error.and_then(|e| e["code"].as_str());
        let message = error.and_then(|e| e["message"].as_str());
        let said = match (code, message) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            _ => text.chars().take(300).collect(),
        };
        if status == StatusCode::UNAUTHORIZED {
            return anyhow!(
                "the server at {} refused the API key (401 {said}); set TOK_API_KEY to a \
                 tenant's key, or to the admin key with TOK_TENANT",
                self.base
            );
        }
        anyhow!("{} {path} answered {status}: {said}", self.base)
    }
}
