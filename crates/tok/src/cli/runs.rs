//! `tok runs`: the runs listing (`GET /api/dashboard/runs`) as a table,
//! newest first, each automation by its name. `--follow` then
//! reads the live stream (`GET /api/stream`) and prints a line for every
//! change of a run that the filters select, until interrupted.

use std::collections::HashMap;
use std::io::Write;

use anyhow::bail;
use clap::Args;
use serde_json::Value;

use super::{Client, Target};

#[derive(Debug, Args)]
pub struct RunsOptions {
    /// Only runs in this status (queued, running, waiting, paused,
    /// completed, failed, cancelled).
    #[arg(long)]
    pub status: Option<String>,
    /// Only runs of this automation (its id or its name).
    #[arg(long)]
    pub automation: Option<String>,
    /// How many runs the table shows (at most 500).
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// After the table, print each run's changes as they happen.
    #[arg(long)]
    pub follow: bool,
    #[command(flatten)]
    pub target: Target,
}

/// The table's columns: a header and how a run fills it.
const COLUMNS: [&str; 7] = [
    "RUN",
    "AUTOMATION",
    "VERSION",
    "STATUS",
    "TRIGGER",
    "STARTED",
    "ERROR",
];

pub(super) async fn runs(
    client: &Client,
    options: &RunsOptions,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let names = automation_names(client).await?;
    let automation = match &options.automation {
        Some(wanted) => Some(resolve(&names, wanted)?),
        None => None,
    };
    let mut query = vec![format!("limit={}", options.limit)];
    if let Some(status) = &options.status {
        query.push(format!("status={}", encode(status)));
    }
    if let Some(id) = &automation {
        query.push(format!("automation={}", encode(id)));
    }
    let page = client
        .get(&format!("/api/dashboard/runs?{}", query.join("&")))
        .await?;
    let rows: Vec<[String; 7]> = page["items"]
        .as_array()
        .map(|items| items.iter().map(|run| row(run, &names)).collect())
        .unwrap_or_default();
    let mut widths = COLUMNS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    if rows.is_empty() && !options.follow {
        writeln!(out, "no runs")?;
        return Ok(());
    }
    print_row(out, &COLUMNS.map(str::to_owned), &widths)?;
    for row in &rows {
        print_row(out, row, &widths)?;
    }
    if options.follow {
        follow(client, options, automation.as_deref(), &names, &widths, out).await?;
    }
    Ok(())
}

/// Prints a line for every `run.updated` of a selected run, until the
/// stream ends (the server stopped) or the process is interrupted.
async fn follow(
    client: &Client,
    options: &RunsOptions,
    automation: Option<&str>,
    names: &HashMap<String, String>,
    widths: &[usize; 7],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    out.flush()?;
    let mut names = names.clone();
    let mut response = client.open("/api/stream").await?;
    let mut buffer = String::new();
    while let Some(chunk) = response.chunk().await? {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let Some(run_id) = updated_run(&block) else {
                continue;
            };
            let run = client.get(&format!("/api/runs/{run_id}")).await?;
            let selected = options.status.as_deref().is_none_or(|s| run["status"] == s)
                && automation.is_none_or(|a| run["automation_id"] == a);
            if !selected {
                continue;
            }
            let id = run["automation_id"].as_str().unwrap_or_default();
            if !names.contains_key(id) {
                names = automation_names(client).await?;
            }
            print_row(out, &row(&run, &names), widths)?;
            out.flush()?;
        }
    }
    bail!("the server at {} closed the stream", client.base())
}

/// The run id of a `run.updated` event block.
fn updated_run(block: &str) -> Option<String> {
    let mut kind = None;
    let mut data = String::new();
    for line in block.lines() {
        if let Some(k) = line.strip_prefix("event:") {
            kind = Some(k.trim());
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.trim());
        }
    }
    if kind != Some("run.updated") {
        return None;
    }
    let data: Value = serde_json::from_str(&data).ok()?;
    data["run_id"].as_str().map(str::to_owned)
}

/// The tenant's automations' names by id, over every page.
async fn automation_names(client: &Client) -> anyhow::Result<HashMap<String, String>> {
    let mut names = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/automations?limit=500&cursor={}", encode(c)),
            None => "/api/automations?limit=500".to_owned(),
        };
        let page = client.get(&path).await?;
        for automation in page["items"].as_array().into_iter().flatten() {
            if let (Some(id), Some(name)) = (automation["id"].as_str(), automation["name"].as_str())
            {
                names.insert(id.to_owned(), name.to_owned());
            }
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(names),
        }
    }
}

/// An automation's id from its id or its name.
fn resolve(names: &HashMap<String, String>, wanted: &str) -> anyhow::Result<String> {
    if names.contains_key(wanted) {
        return Ok(wanted.to_owned());
    }
    let mut matching = names.iter().filter(|(_, name)| *name == wanted);
    match (matching.next(), matching.next()) {
        (Some((id, _)), None) => Ok(id.clone()),
        (Some(_), Some(_)) => bail!("more than one automation is named `{wanted}`; give its id"),
        (None, _) => {
            bail!("no automation has the id or the name `{wanted}`; `tok apply` creates one")
        }
    }
}

fn row(run: &Value, names: &HashMap<String, String>) -> [String; 7] {
    let text = |field: &str| run[field].as_str().unwrap_or_default().to_owned();
    let automation = text("automation_id");
    let automation = names.get(&automation).cloned().unwrap_or(automation);
    let mut error = text("error").replace('\n', " ");
    if error.chars().count() > 60 {
        error = format!("{}…", error.chars().take(60).collect::<String>());
    }
    [
        text("id"),
        automation,
        run["version"].to_string(),
        text("status"),
        text("trigger_type"),
        time(&run["started_at"]).unwrap_or_else(|| "-".to_owned()),
        error,
    ]
}

/// A time as the API gives it (RFC 3339, or epoch milliseconds) in UTC, to
/// the second.
fn time(value: &Value) -> Option<String> {
    let at = match value {
        Value::Number(ms) => jiff::Timestamp::from_millisecond(ms.as_i64()?).ok()?,
        Value::String(text) => text.parse::<jiff::Timestamp>().ok()?,
        _ => return None,
    };
    Some(at.strftime("%Y-%m-%d %H:%M:%S").to_string())
}

fn print_row(
    out: &mut impl Write,
    cells: &[String; 7],
    widths: &[usize; 7],
) -> std::io::Result<()> {
    let mut line = String::new();
    for (cell, width) in cells.iter().zip(widths) {
        let pad = width.saturating_sub(cell.chars().count());
        line.push_str(cell);
        line.push_str(&" ".repeat(pad + 2));
    }
    writeln!(out, "{}", line.trim_end())
}

/// A query parameter's value, percent-encoded.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
