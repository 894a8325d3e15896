//! What changed between what the server holds and what a file says, one
//! line per top-level field, so a person sees what a new version will do
//! differently.

use serde_json::{Map, Value};

/// Longest value shown whole in a change line; a longer one is summarised.
const SHOWN_CHARS: usize = 60;

/// One line per top-level field that differs: `~ field: old → new`,
/// `+ field: new`, `- field: old`.
pub(super) fn changes(before: &Value, after: &Value) -> Vec<String> {
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
