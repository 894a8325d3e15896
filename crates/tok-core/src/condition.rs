//! Conditions: the rules of a `condition` step and of a trigger filter,
//! evaluated against a scope, with one log line per rule that says what was
//! compared.
//!
//! A field that has not arrived (*missing*) is distinct from one that arrived
//! empty (null, `""`, `[]`, `{}`): `isEmpty` is true for both, but the log line
//! tells them apart, and every operator except `isEmpty`, `neq` and
//! `notContains` is false on a missing field. Numbers compare as numbers (also
//! against numeric strings) and values that both look like ISO dates compare
//! as instants.

use std::cmp::Ordering;

use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use serde_json::{Map, Value};

use crate::budget::{cut, preview};
use crate::context::{Lookup, lookup};
use crate::definition::{Filter, Match, Operator, Rule, Step};
use crate::limits::MAX_LOGGED_VALUE_BYTES;
use crate::template;

/// Rules and how they combine, whichever form they were written in.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub match_: Match,
    pub rules: Vec<Rule>,
}

/// The outcome of a condition and its log: one line per rule evaluated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    pub result: bool,
    pub lines: Vec<String>,
}

impl Condition {
    /// The condition of a trigger filter.
    pub fn from_filter(f: &Filter) -> Condition {
        Condition {
            match_: f.match_,
            rules: f.rules.clone(),
        }
    }

    /// The condition of a `condition` step, from `match` + `rules` or from the
    /// legacy single rule written on the step (`fieldId`, `operator`,
    /// `value`). This is the only place the legacy form is interpreted.
    /// Fails when the step has no rule, mixes both forms, or has a legacy rule
    /// without its field or operator.
    pub fn from_step(step: &Step) -> Result<Condition, String> {
        let legacy = step.field_id.is_some() || step.operator.is_some() || step.value.is_some();
        match (&step.rules, legacy) {
            (Some(_), true) => Err(format!(
                "condition `{}` has both `rules` and the legacy `fieldId`/`operator`/`value`; keep only `rules`",
                step.id
            )),
            (Some(rules), false) if rules.is_empty() => Err(format!(
                "condition `{}` has an empty `rules` list; add at least one rule",
                step.id
            )),
            (Some(rules), false) => Ok(Condition {
                match_: step.match_.unwrap_or_default(),
                rules: rules.clone(),
            }),
            (None, true) => {
                let field = step.field_id.clone().ok_or_else(|| {
                    format!(
                        "condition `{}` has `operator`/`value` but no `fieldId`",
                        step.id
                    )
                })?;
                let operator = step.operator.ok_or_else(|| {
                    format!("condition `{}` has `fieldId` but no `operator`", step.id)
                })?;
                Ok(Condition {
                    match_: step.match_.unwrap_or_default(),
                    rules: vec![Rule {
                        field,
                        operator,
                        value: step.value.clone().unwrap_or(Value::Null),
                    }],
                })
            }
            (None, false) => Err(format!(
                "condition `{}` has no rules; give `rules` (and `match`) or the legacy `fieldId`/`operator`/`value`",
                step.id
            )),
        }
    }

    /// Evaluates every rule against `scope` (all of them, so the log is
    /// complete) and combines the results. Rule values are rendered as
    /// templates first; a value that cannot be rendered makes its rule false.
    pub fn evaluate(&self, scope: &Value) -> Evaluation {
        let mut lines = Vec::with_capacity(self.rules.len());
        let mut results = Vec::with_capacity(self.rules.len());
        for rule in &self.rules {
            let (result, line) = evaluate_rule(rule, scope);
            results.push(result);
            lines.push(line);
        }
        let result = match self.match_ {
            Match::All => results.iter().all(|&r| r),
            Match::Any => results.iter().any(|&r| r),
        };
        Evaluation { result, lines }
    }
}

impl Condition {
    /// A JSON document that the value at `root` of every scope the
    /// condition holds for contains (PostgreSQL's `@>`), for an index to
    /// find the candidates that [`Condition::evaluate`] then decides; `None`
    /// when no rule pins one down. Only `eq` rules on `root.…` whose value
    /// equals one JSON value and nothing else go in: a string that reads as
    /// neither a number nor an instant (those also equal other spellings),
    /// a boolean; no template, no array index in the path, no quote,
    /// backslash, bracket, `$` or `*` in a key (the path stays one a JSON
    /// path spells plainly). With `match:
    /// any`, only a condition of one rule.
    pub fn containment(&self, root: &str) -> Option<Value> {
        if self.match_ == Match::Any && self.rules.len() != 1 {
            return None;
        }
        let mut document = Value::Object(Map::new());
        let mut pinned = false;
        for rule in &self.rules {
            let Some(path) = field_path(&rule.field)
                .strip_prefix(root)
                .and_then(|p| p.strip_prefix('.'))
            else {
                continue;
            };
            let exact = match &rule.value {
                Value::String(s) => {
                    !s.contains("{{")
                        && as_number(&rule.value).is_none()
                        && instant(&rule.value).is_none()
                }
                Value::Bool(_) => true,
                _ => false,
            };
            let segments: Vec<&str> = path.split('.').collect();
            if rule.operator != Operator::Eq
                || !exact
                || segments.iter().any(|s| {
                    s.is_empty()
                        || s.parse::<usize>().is_ok()
                        || s.contains(['"', '\\', '[', ']', '$', '*'])
                })
            {
                continue;
            }
            let mut at = &mut document;
            for segment in &segments[..segments.len() - 1] {
                at = at
                    .as_object_mut()
                    .map(|m| {
                        m.entry(*segment)
                            .or_insert_with(|| Value::Object(Map::new()))
                    })
                    .filter(|v| v.is_object())?;
            }
            at.as_object_mut()?
                .insert(segments[segments.len() - 1].to_owned(), rule.value.clone());
            pinned = true;
        }
        pinned.then_some(document)
    }
}

/// One rule's truth and its log line. The line shows each value cut to
/// [`MAX_LOGGED_VALUE_BYTES`] (the rule is decided on the whole value), so
/// a rule over a big field logs a short line.
fn evaluate_rule(rule: &Rule, scope: &Value) -> (bool, String) {
    let shown = |v: &Value| preview(v, MAX_LOGGED_VALUE_BYTES);
    let mut line = format!(
        "Condition: {} {}",
        cut(&rule.field, MAX_LOGGED_VALUE_BYTES),
        rule.operator
    );
    if !rule.operator.is_unary() {
        line.push(' ');
        line.push_str(&plain(&rule.value));
    }
    let field = field_path(&rule.field);
    let found = lookup(scope, field);
    line.push_str(" | ");
    let name = cut(&rule.field, MAX_LOGGED_VALUE_BYTES);
    match found {
        Lookup::Found(v) => line.push_str(&format!("{name} = {}", shown(v))),
        Lookup::Missing => line.push_str(&format!("{name} is missing")),
    }
    if rule.operator.is_unary() {
        return (apply(rule.operator, found, &Value::Null), line);
    }
    match template::render_value(&rule.value, scope) {
        Ok(expected) => {
            line.push_str(&format!(", compared with {}", shown(&expected)));
            (apply(rule.operator, found, &expected), line)
        }
        Err(e) => {
            line.push_str(&format!(", but the value could not be rendered: {e}"));
            (false, line)
        }
    }
}

/// Fields are paths, but authors sometimes wrap them in braces like a
/// template; `{{status}}` is read as `status`.
fn field_path(field: &str) -> &str {
    let trimmed = field.trim();
    trimmed
        .strip_prefix("{{")
        .and_then(|f| f.strip_suffix("}}"))
        .map_or(trimmed, str::trim)
}

/// A value as an author would write it: strings without quotes, the rest as
/// JSON, cut to [`MAX_LOGGED_VALUE_BYTES`].
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => cut(s, MAX_LOGGED_VALUE_BYTES).into_owned(),
        other => preview(other, MAX_LOGGED_VALUE_BYTES),
    }
}

/// The truth of `field <operator> expected`.
fn apply(operator: Operator, found: Lookup<'_>, expected: &Value) -> bool {
    let Lookup::Found(actual) = found else {
        return matches!(
            operator,
            Operator::IsEmpty | Operator::Neq | Operator::NotContains
        );
    };
    match operator {
        Operator::Eq => loose_eq(actual, expected),
        Operator::Neq => !loose_eq(actual, expected),
        Operator::Gt => compare(actual, expected) == Some(Ordering::Greater),
        Operator::Gte => matches!(
            compare(actual, expected),
            Some(Ordering::Greater | Ordering::Equal)
        ),
        Operator::Lt => compare(actual, expected) == Some(Ordering::Less),
        Operator::Lte => matches!(
            compare(actual, expected),
            Some(Ordering::Less | Ordering::Equal)
        ),
        Operator::Contains => contains(actual, expected),
        Operator::NotContains => !contains(actual, expected),
        Operator::StartsWith => match (actual, scalar_text(expected)) {
            (Value::String(s), Some(prefix)) => s.starts_with(&prefix),
            _ => false,
        },
        Operator::IsEmpty => is_empty(actual),
        Operator::IsNotEmpty => !is_empty(actual),
        Operator::In => match expected {
            Value::Array(options) => options.iter().any(|o| loose_eq(actual, o)),
            _ => false,
        },
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Text of a string, number or boolean, for substring and prefix tests.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn contains(actual: &Value, expected: &Value) -> bool {
    match actual {
        Value::String(s) => scalar_text(expected).is_some_and(|needle| s.contains(&needle)),
        Value::Array(items) => items.iter().any(|item| loose_eq(item, expected)),
        Value::Object(map) => expected.as_str().is_some_and(|key| map.contains_key(key)),
        _ => false,
    }
}

/// A number, or a string that reads as a finite number.
fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()),
        _ => None,
    }
}

/// Parses an RFC 3339 timestamp, or a `YYYY-MM-DD` date meaning midnight UTC.
pub fn parse_instant(s: &str) -> Option<Timestamp> {
    if s.len() == 10 {
        let date: Date = s.parse().ok()?;
        return date.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp());
    }
    let looks_like_datetime = s.len() >= 20
        && s.as_bytes()[..10].iter().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                *b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    if !looks_like_datetime {
        return None;
    }
    s.parse().ok()
}

fn instant(v: &Value) -> Option<Timestamp> {
    v.as_str().and_then(parse_instant)
}

/// Equality as conditions mean it: numbers by value (`1 == 1.0`, `"5" == 5`),
/// dates as instants, everything else as JSON.
fn loose_eq(a: &Value, b: &Value) -> bool {
    if a.is_number() || b.is_number() {
        if let (Some(x), Some(y)) = (as_number(a), as_number(b)) {
            return numbers_equal(a, b, x, y);
        }
        return false;
    }
    if let (Some(x), Some(y)) = (instant(a), instant(b)) {
        return x == y;
    }
    a == b
}

fn numbers_equal(a: &Value, b: &Value, x: f64, y: f64) -> bool {
    match (a.as_i64(), b.as_i64()) {
        (Some(i), Some(j)) => i == j,
        _ => x == y,
    }
}

/// Order for gt/gte/lt/lte: numbers (numeric strings included, so `"9" < "10"`),
/// then instants, then strings; anything else is incomparable.
fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    if let (Some(x), Some(y)) = (as_number(a), as_number(b)) {
        if let (Some(i), Some(j)) = (a.as_i64(), b.as_i64()) {
            return Some(i.cmp(&j));
        }
        return x.partial_cmp(&y);
    }
    if a.is_number() || b.is_number() {
        return None;
    }
    if let (Some(x), Some(y)) = (instant(a), instant(b)) {
        return Some(x.cmp(&y));
    }
    match (a, b) {
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(field: &str, operator: Operator, value: Value) -> Rule {
        Rule {
            field: field.into(),
            operator,
            value,
        }
    }

    fn eval(field: &str, operator: Operator, value: Value, scope: &Value) -> Evaluation {
        Condition {
            match_: Match::All,
            rules: vec![rule(field, operator, value)],
        }
        .evaluate(scope)
    }

    fn holds(field: &str, operator: Operator, value: Value, scope: &Value) -> bool {
        eval(field, operator, value, scope).result
    }

    /// Whether `doc` holds `part` as PostgreSQL's `@>` means it for objects
    /// and scalars.
    fn contains_doc(doc: &Value, part: &Value) -> bool {
        match (doc, part) {
            (Value::Object(d), Value::Object(p)) => p
                .iter()
                .all(|(k, v)| d.get(k).is_some_and(|dv| contains_doc(dv, v))),
            (d, p) => d == p,
        }
    }

    #[test]
    fn containment_pins_only_what_every_matching_scope_holds() {
        let all = |rules: Vec<Rule>| Condition {
            match_: Match::All,
            rules,
        };
        let c = all(vec![
            rule("_body.order.id", Operator::Eq, json!("A-2")),
            rule("_body.paid", Operator::Eq, json!(true)),
            rule("_body.total", Operator::Eq, json!(10)),
            rule("_body.day", Operator::Eq, json!("2026-12-01")),
            rule("_body.code", Operator::Eq, json!("007")),
            rule("_body.items.0.sku", Operator::Eq, json!("X")),
            rule("_body.who", Operator::Eq, json!("{{name}}")),
            rule("_body.shop", Operator::Neq, json!("cz")),
            rule("st_a.ok", Operator::Eq, json!("yes")),
        ]);
        assert_eq!(
            c.containment("_body"),
            Some(json!({ "order": { "id": "A-2" }, "paid": true }))
        );
        let any = Condition {
            match_: Match::Any,
            rules: vec![
                rule("_body.a", Operator::Eq, json!("x")),
                rule("_body.b", Operator::Eq, json!("y")),
            ],
        };
        assert_eq!(any.containment("_body"), None);
        assert_eq!(
            all(vec![rule("_body.total", Operator::Gt, json!(3))]).containment("_body"),
            None
        );

        // Every scope the condition holds for contains the document.
        let scopes = [
            json!({ "_body": { "order": { "id": "A-2", "n": 1 }, "paid": true, "total": "10",
                               "day": "2026-12-01T00:00:00Z", "code": 7,
                               "items": [{ "sku": "X" }], "who": "Ann", "shop": "sk" },
                    "st_a": { "ok": "yes" }, "name": "Ann" }),
            json!({ "_body": { "order": { "id": "A-2" }, "paid": true, "total": 10.0,
                               "day": "2026-12-01", "code": "007", "items": [{ "sku": "X" }],
                               "who": "Ann" }, "st_a": { "ok": "yes" }, "name": "Ann" }),
        ];
        let doc = c.containment("_body").unwrap();
        for scope in &scopes {
            assert!(
                c.evaluate(scope).result,
                "{scope}: {:?}",
                c.evaluate(scope).lines
            );
            assert!(contains_doc(&scope["_body"], &doc), "{scope}");
        }
    }

    #[test]
    fn log_lines_have_the_documented_format() {
        let scope = json!({"result": "Redirect", "note": ""});
        let e = eval("result", Operator::Eq, json!("Missing info"), &scope);
        assert!(!e.result);
        assert_eq!(
            e.lines,
            [
                r#"Condition: result eq Missing info | result = "Redirect", compared with "Missing info""#
            ]
        );
        let e = eval("result", Operator::Eq, json!("Missing info"), &json!({}));
        assert_eq!(
            e.lines,
            [
                r#"Condition: result eq Missing info | result is missing, compared with "Missing info""#
            ]
        );
        let e = eval("note", Operator::IsEmpty, Value::Null, &scope);
        assert!(e.result);
        assert_eq!(e.lines, [r#"Condition: note isEmpty | note = """#]);
        let e = eval("n", Operator::Gt, json!(3), &json!({"n": 4}));
        assert_eq!(e.lines, ["Condition: n gt 3 | n = 4, compared with 3"]);
    }

    #[test]
    fn missing_is_false_except_for_is_empty_neq_and_not_contains() {
        let scope = json!({});
        for op in [
            Operator::Eq,
            Operator::Gt,
            Operator::Gte,
            Operator::Lt,
            Operator::Lte,
            Operator::Contains,
            Operator::StartsWith,
            Operator::IsNotEmpty,
            Operator::In,
        ] {
            assert!(!holds("x", op, json!("a"), &scope), "{op}");
        }
        for op in [Operator::IsEmpty, Operator::Neq, Operator::NotContains] {
            assert!(holds("x", op, json!("a"), &scope), "{op}");
        }
    }

    #[test]
    fn empty_values_are_empty_but_present() {
        for v in [json!(null), json!(""), json!([]), json!({})] {
            let scope = json!({ "x": v });
            assert!(holds("x", Operator::IsEmpty, Value::Null, &scope));
            assert!(!holds("x", Operator::IsNotEmpty, Value::Null, &scope));
            assert!(
                !eval("x", Operator::IsEmpty, Value::Null, &scope).lines[0].contains("missing")
            );
        }
        assert!(holds(
            "x",
            Operator::IsNotEmpty,
            Value::Null,
            &json!({"x": 0})
        ));
        assert!(holds(
            "x",
            Operator::IsNotEmpty,
            Value::Null,
            &json!({"x": false})
        ));
    }

    #[test]
    fn numbers_compare_as_numbers() {
        assert!(holds("n", Operator::Eq, json!(1.0), &json!({"n": 1})));
        assert!(holds("n", Operator::Eq, json!(5), &json!({"n": "5"})));
        assert!(holds("n", Operator::Eq, json!("5"), &json!({"n": 5.0})));
        assert!(!holds("n", Operator::Eq, json!("5"), &json!({"n": "5.0"})));
        assert!(holds("n", Operator::Gt, json!(9), &json!({"n": 10})));
        assert!(holds("n", Operator::Gt, json!("9"), &json!({"n": 10})));
        assert!(!holds("n", Operator::Gt, json!("10"), &json!({"n": "9"})));
        assert!(holds("n", Operator::Lte, json!(2.5), &json!({"n": 2.5})));
        assert!(!holds("n", Operator::Eq, json!(1), &json!({"n": true})));
        assert!(holds("n", Operator::Neq, json!("abc"), &json!({"n": 1})));
    }

    #[test]
    fn dates_compare_as_instants() {
        let scope = json!({"due": "2024-03-01T00:00:00Z", "at": "2024-03-01T10:00:00+02:00"});
        assert!(holds("due", Operator::Eq, json!("2024-03-01"), &scope));
        assert!(holds(
            "at",
            Operator::Eq,
            json!("2024-03-01T08:00:00Z"),
            &scope
        ));
        assert!(holds("at", Operator::Gt, json!("2024-03-01"), &scope));
        assert!(holds(
            "due",
            Operator::Lt,
            json!("2024-03-01T00:00:01Z"),
            &scope
        ));
        assert!(holds(
            "d",
            Operator::Gt,
            json!("2024-02-28"),
            &json!({"d": "2024-10-01"})
        ));
        assert_eq!(
            parse_instant("2024-03-01"),
            Some("2024-03-01T00:00:00Z".parse().unwrap())
        );
        assert_eq!(parse_instant("order-2024"), None);
        assert_eq!(parse_instant("2024-13-01"), None);
    }

    #[test]
    fn strings_compare_exactly_and_in_order() {
        assert!(!holds(
            "s",
            Operator::Eq,
            json!("abc"),
            &json!({"s": "ABC"})
        ));
        assert!(holds("s", Operator::Lt, json!("b"), &json!({"s": "a"})));
        assert!(!holds("s", Operator::Gt, json!(true), &json!({"s": "a"})));
    }

    #[test]
    fn contains_starts_with_and_in() {
        let scope = json!({"s": "urgent order", "tags": ["vip", 5], "o": {"k": 1}});
        assert!(holds("s", Operator::Contains, json!("order"), &scope));
        assert!(!holds("s", Operator::NotContains, json!("order"), &scope));
        assert!(holds("tags", Operator::Contains, json!("vip"), &scope));
        assert!(holds("tags", Operator::Contains, json!("5"), &scope));
        assert!(holds("tags", Operator::NotContains, json!("x"), &scope));
        assert!(holds("o", Operator::Contains, json!("k"), &scope));
        assert!(holds("s", Operator::StartsWith, json!("urgent"), &scope));
        assert!(!holds("tags", Operator::StartsWith, json!("vip"), &scope));
        assert!(holds(
            "s",
            Operator::In,
            json!(["a", "urgent order"]),
            &scope
        ));
        assert!(holds("n", Operator::In, json!([1, 2]), &json!({"n": "2"})));
        assert!(!holds("s", Operator::In, json!("urgent order"), &scope));
    }

    #[test]
    fn values_are_templates() {
        let scope = json!({"a": 3, "b": 3, "name": "Eva"});
        assert!(holds("a", Operator::Eq, json!("{{b}}"), &scope));
        let e = eval("name", Operator::Eq, json!("{{expected}}"), &scope);
        assert!(!e.result);
        assert!(
            e.lines[0].starts_with("Condition: name eq {{expected}} | name = \"Eva\", but the value could not be rendered: template refers to `expected`"),
            "{}",
            e.lines[0]
        );
        assert!(holds("{{name}}", Operator::Eq, json!("Eva"), &scope));
    }

    #[test]
    fn match_all_and_any_evaluate_every_rule() {
        let scope = json!({"a": 1, "b": 2});
        let rules = vec![
            rule("a", Operator::Eq, json!(1)),
            rule("b", Operator::Eq, json!(3)),
        ];
        let all = Condition {
            match_: Match::All,
            rules: rules.clone(),
        }
        .evaluate(&scope);
        assert!(!all.result);
        assert_eq!(all.lines.len(), 2);
        let any = Condition {
            match_: Match::Any,
            rules,
        }
        .evaluate(&scope);
        assert!(any.result);
    }

    #[test]
    fn from_step_reads_both_forms_and_rejects_bad_ones() {
        let new_form: Step = serde_json::from_value(json!({
            "id": "c", "type": "condition", "match": "any",
            "rules": [{"field": "a", "operator": "eq", "value": 1}]
        }))
        .unwrap();
        let c = Condition::from_step(&new_form).unwrap();
        assert_eq!(c.match_, Match::Any);
        assert_eq!(c.rules, vec![rule("a", Operator::Eq, json!(1))]);

        let legacy: Step = serde_json::from_value(json!({
            "id": "c", "type": "condition", "fieldId": "status", "operator": "isEmpty"
        }))
        .unwrap();
        let c = Condition::from_step(&legacy).unwrap();
        assert_eq!(c.match_, Match::All);
        assert_eq!(
            c.rules,
            vec![rule("status", Operator::IsEmpty, Value::Null)]
        );

        let mut both = new_form;
        both.field_id = Some("x".into());
        assert!(Condition::from_step(&both).unwrap_err().contains("both"));
        let mut no_op = legacy;
        no_op.operator = None;
        assert!(
            Condition::from_step(&no_op)
                .unwrap_err()
                .contains("no `operator`")
        );
        let empty = Step::new("c", "condition", Value::Null);
        assert!(
            Condition::from_step(&empty)
                .unwrap_err()
                .contains("no rules")
        );
        let mut empty_rules = empty;
        empty_rules.rules = Some(vec![]);
        assert!(
            Condition::from_step(&empty_rules)
                .unwrap_err()
                .contains("empty")
        );
    }

    #[test]
    fn from_filter_copies_rules() {
        let f = Filter {
            match_: Match::Any,
            rules: vec![rule("kind", Operator::Eq, json!("order.created"))],
        };
        let c = Condition::from_filter(&f);
        assert!(c.evaluate(&json!({"kind": "order.created"})).result);
        assert!(!c.evaluate(&json!({"kind": "order.updated"})).result);
    }
}
