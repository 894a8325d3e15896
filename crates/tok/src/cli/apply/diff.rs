//! `tok apply -f FILE`: the automation named in FILE is created, or saved as
//! a new version when its definition differs from the current version's,
//! or left alone when it is the same. What changed is printed field by
//! field, so a person sees what a new version will do differently.

use std::io::Write;
use std::path::Path;

use anyhow::{Context as _, bail};
use serde_json::{Map, Value};
use tok_core::definition::Automation;

use super::Client;

pub(super) async fn apply(
    client: &Client,
    file: &Path,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("could not read {}", file.display()))?;
    let sent: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let Some(name) = sent.get("name").and_then(Value::as_str) else {
        bail!(
            "{} has no `name`: an automation is applied by its name",
            file.display()
        );
    };
    let Some(current) = find(client, name).await? else {
        let created = client.post("/api/automations", &sent).await?;
        writeln!(
            out,
            "created automation {name} ({}), version {}",
            created["id"].as_str().unwrap_or("?"),
            created["version"]
        )?;
        return Ok(());
    };
    let id = current["id"].as_str().unwrap_or_default().to_owned();
    // The automation itself has its current definition, whatever a listing shows.
    let current = client.get(&format!("/api/automations/{id}")).await?;
    let version = &current["version"];
    // The server keeps the definition as parsed, defaults filled in; the
    // file parsed the same way compares with it. A file the parser refuses
    // goes to the server, whose answer says what is wrong where.
    if let Ok(parsed) = Automation::from_json(&text)
        && let Ok(normalized) = serde_json::to_value(&parsed)
        && normalized == current["definition"]
    {
        writeln!(out, "automation {name} ({id}) unchanged, version {version}")?;
        return Ok(());
    }
    let saved = client.put(&format!("/api/automations/{id}"), &sent).await?;
    writeln!(
        out,
        "automation {name} ({id}): new version {} (was {version})",
        saved["version"]
    )?;
    let after = match Automation::from_json(&text) {
        Ok(parsed) => serde_json::to_value(&parsed)?,
        Err(_) => sent,
    };
    for line in changes(&current["definition"], &after) {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}

/// The tenant's automation called `name`, over every page of the listing.
async fn find(client: &Client, name: &str) -> anyhow::Result<Option<Value>> {
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/automations?limit=500&cursor={c}"),
            None => "/api/automations?limit=500".to_owned(),
        };
        let page = client.get(&path).await?;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        if let Some(found) = items.into_iter().find(|a| a["name"] == name) {
            return Ok(Some(found));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(None),
        }
    }
}

/// Longest value shown whole in a change line; a longer one is summarised.
const SHOWN_CHARS: usize = 60;

/// One line per top-level field that differs: `~ field: old → new`,
/// `+ field: new`, `- field: old`.
fn changes(before: &Value, after: &Value) -> Vec<String> {
    let empty = Map::new();
    let before = before.as_object().unwrap_or(&empty);
    let after = after.as_object().unwrap_or(&empty);
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| match (before.get(key), after.get(key)) {
            (Some(old), Some(new)) if old != new => {
                if let Some(steps) = by_id(old, new) {
                    return Some(format!("~ {key}: {steps}"));
                }
                let (old, new) = (short(old), short(new));
                Some(if old == new {
                    format!("~ {key}: changed ({new})")
                } else {
                    format!("~ {key}: {old} → {new}")
                })
            }
            (Some(old), None) => Some(format!("- {key}: {}", short(old))),
            (None, Some(new)) => Some(format!("+ {key}: {}", short(new))),
            _ => None,
        })
        .collect()
}

/// Two lists of steps compared by their ids: which were added, removed or
/// changed (`None` when the lists are not lists of steps with ids).
fn by_id(old: &Value, new: &Value) -> Option<String> {
    let ids = |list: &Value| -> Option<Vec<(String, Value)>> {
        list.as_array()?
            .iter()
            .map(|step| Some((step.get("id")?.as_str()?.to_owned(), step.clone())))
            .collect()
    };
    let (old, new) = (ids(old)?, ids(new)?);
    let find = |list: &[(String, Value)], id: &str| {
        list.iter().find(|(i, _)| i == id).map(|(_, s)| s.clone())
    };
    let mut parts = Vec::new();
    let changed: Vec<&str> = new
        .iter()
        .filter(|(id, step)| find(&old, id).is_some_and(|before| before != *step))
        .map(|(id, _)| id.as_str())
        .collect();
    let added: Vec<&str> = new
        .iter()
        .filter(|(id, _)| find(&old, id).is_none())
        .map(|(id, _)| id.as_str())
        .collect();
    let removed: Vec<&str> = old
        .iter()
        .filter(|(id, _)| find(&new, id).is_none())
        .map(|(id, _)| id.as_str())
        .collect();
    for (what, ids) in [("changed", changed), ("added", added), ("removed", removed)] {
        if !ids.is_empty() {
            parts.push(format!("{what} {}", ids.join(", ")));
        }
    }
    if parts.is_empty() {
        parts.push("the same steps in another order".to_owned());
    }
    Some(parts.join("; "))
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= SHOWN_CHARS {
        return text;
    }
    match value {
        Value::Array(items) => format!("[{} items]", items.len()),
        Value::Object(fields) => format!("{{{} fields}}", fields.len()),
        _ => format!("{}…", text.chars().take(SHOWN_CHARS).collect::<String>()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::changes;

    #[test]
    fn changes_name_each_top_level_field_that_differs() {
        let before = json!({
            "name": "a",
            "settings": {"x": 1},
            "steps": [{"id": "a", "n": 1}, {"id": "b"}, {"id": "c"}],
            "tags": [1, 2],
        });
        let after = json!({
            "name": "a",
            "steps": [{"id": "a", "n": 2}, {"id": "b"}, {"id": "d"}],
            "tags": [1, 2, 3],
            "trigger": {"type": "manual"},
        });
        assert_eq!(
            changes(&before, &after),
            [
                "- settings: {\"x\":1}",
                "~ steps: changed a; added d; removed c",
                "~ tags: [1,2] → [1,2,3]",
                "+ trigger: {\"type\":\"manual\"}",
            ]
        );
    }
}
