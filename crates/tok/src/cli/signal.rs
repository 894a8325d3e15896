//! `tok signal KEY --payload JSON [--subject TICKET]`: `POST /api/signals`,
//! and what it did — the runs it resumed, or that it waits in the lookback
//! buffer for a wait that starts soon.

use std::io::Write;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::Client;

pub(super) async fn signal(
    client: &Client,
    key: &str,
    subject: Option<&str>,
    payload: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let payload: Value = serde_json::from_str(payload)
        .with_context(|| format!("--payload is not JSON: {payload}"))?;
    if !payload.is_object() {
        bail!("--payload must be a JSON object, like '{{\"paid\": true}}', not {payload}");
    }
    let mut body = json!({ "key": key, "payload": payload });
    if let Some(subject) = subject {
        body["subject"] = json!(subject);
    }
    let sent = client.post("/api/signals", &body).await?;
    let resumed: Vec<&str> = sent["resumed"]
        .as_array()
        .map(|runs| runs.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let id = sent["signal_id"].as_str().unwrap_or("?");
    if sent["duplicate"] == true {
        writeln!(
            out,
            "signal {key} ({id}) was sent before; nothing new resumed"
        )?;
    } else if !resumed.is_empty() {
        writeln!(
            out,
            "signal {key} ({id}) resumed {} run(s): {}",
            resumed.len(),
            resumed.join(", ")
        )?;
    } else if sent["buffered"] == true {
        writeln!(
            out,
            "signal {key} ({id}): no run waits for it; kept for a wait that starts within the lookback window"
        )?;
    } else {
        writeln!(out, "signal {key} ({id}): no run waits for it")?;
    }
    Ok(())
}
