//! `tok apply -f PATH`: a tenant's setup kept in files (docs/security.md,
//! "Declarative"). PATH is one file or a directory (read whole, files
//! ending `.json` in path order); each file holds one object or a list of
//! them. An object without `kind` is an automation; the others say `"kind":
//! "source" | "connection" | "group" | "ticket_type" | "widget"`.
//!
//! Objects match what the server holds by kind and name. Each is created,
//! changed (only the fields the file gives are compared and sent; a field
//! it leaves out keeps the server's value) or left alone, and a line per
//! object says which, with what changed. Nothing unchanged is sent, so
//! applying the same directory twice changes nothing and writes no audit
//! row. They are saved in the order their references need: sources,
//! connections, groups, ticket types, widgets, then automations (an
//! automation that another starts, before it). A trigger's `source` may
//! name a source (the server takes its id; apply looks it up); the other
//! references are taken by name by the server itself.
//!
//! Secrets may stay out of the files: in a source's `secret` (or
//! `verify.secret`) and anywhere in a connection's `credentials`,
//! `{"env": "NAME"}` is the value of the environment variable NAME. The server never gives a secret back, so
//! apply cannot compare one: a secret is sent when its object is created,
//! or, with `--secrets`, again to every object that has one (a connection's
//! credentials by `PATCH`, a source's signing secret by a rotation that
//! keeps its URL and accepts the secret before for an hour). A connection
//! whose `base_url` changes gets the file's credentials in the same
//! `PATCH`, since a connection moved to another origin keeps its
//! credentials only when they are given again (or by a key with `admin`).
//!
//! `--dry-run` prints the plan and sends nothing but reads; `--prune` also
//! deletes what the server holds of these kinds that no file names
//! (automations first, sources last); a delete the server refuses (409: in
//! use) is reported, the others still go, and apply then fails.

mod diff;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Map, Value, json};
use tok_core::definition::Automation;

use super::Client;

/// What `tok apply` was asked to do.
#[derive(Debug, Clone, clap::Args)]
pub struct ApplyOptions {
    /// A file, or a directory of files, of objects to apply (JSON).
    #[arg(short = 'f', long = "file", value_name = "PATH")]
    pub path: PathBuf,
    /// Print what would be created, changed and deleted; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Delete the sources, connections, groups, ticket types, widgets and
    /// automations that no file names.
    #[arg(long)]
    pub prune: bool,
    /// Send every secret the files hold again (they cannot be compared).
    #[arg(long)]
    pub secrets: bool,
}

/// The kinds of object, in the order they are saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Source,
    Connection,
    Group,
    TicketType,
    Widget,
    Automation,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Source,
        Kind::Connection,
        Kind::Group,
        Kind::TicketType,
        Kind::Widget,
        Kind::Automation,
    ];

    fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == text)
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Source => "source",
            Kind::Connection => "connection",
            Kind::Group => "group",
            Kind::TicketType => "ticket_type",
            Kind::Widget => "widget",
            Kind::Automation => "automation",
        }
    }

    /// The API's collection of this kind.
    fn collection(self) -> &'static str {
        match self {
            Kind::Source => "/api/sources",
            Kind::Connection => "/api/connections",
            Kind::Group => "/api/groups",
            Kind::TicketType => "/api/ticket-types",
            Kind::Widget => "/api/widgets",
            Kind::Automation => "/api/automations",
        }
    }

    /// The fields a change of this kind may send; the others (the name,
    /// the secrets) are the object's identity or are never read back.
    fn compared(self) -> &'static [&'static str] {
        match self {
            Kind::Source => &["params", "schema", "critical", "rate_limit"],
            Kind::Connection => &[
                "service",
                "base_url",
                "rate",
                "burst",
                "max_concurrency",
                "breaker",
            ],
            Kind::Group => &["members"],
            Kind::TicketType => &["statuses", "fields"],
            Kind::Widget => &["connection", "request", "ttlSec"],
            Kind::Automation => &[],
        }
    }
}

/// One object of the files.
struct Object {
    kind: Kind,
    name: String,
    /// What is sent to create it (without `kind`, secrets resolved).
    body: Value,
    file: PathBuf,
}

impl Object {
    fn label(&self) -> String {
        format!("{} {}", self.kind.name(), self.name)
    }
}

/// What apply does to one object.
enum Step {
    Create,
    Change { id: String, lines: Vec<String> },
    Unchanged { id: String },
}

/// How many objects went each way.
#[derive(Default)]
struct Tally {
    created: usize,
    changed: usize,
    unchanged: usize,
    deleted: usize,
}

pub(crate) async fn apply(
    client: &Client,
    options: &ApplyOptions,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut objects = read(&options.path)?;
    order_automations(&mut objects);
    let mut held = Held::read(client).await?;
    let would = if options.dry_run { "would " } else { "" };
    let mut tally = Tally::default();
    for object in &objects {
        let mut body = object.body.clone();
        if object.kind == Kind::Automation {
            resolve_source(&mut body, &held)?;
        }
        let current = held.find(object.kind, &object.name)?.cloned();
        let step = match &current {
            None => Step::Create,
            Some(current) => compare(object.kind, &body, current, &object.file)?,
        };
        match step {
            Step::Create => {
                tally.created += 1;
                if options.dry_run {
                    writeln!(out, "would create {}", object.label())?;
                    continue;
                }
                let created = client
                    .post(object.kind.collection(), &body)
                    .await
                    .with_context(|| {
                        format!("creating {} ({})", object.label(), show(&object.file))
                    })?;
                let id = created["id"].as_str().unwrap_or("?");
                match object.kind {
                    Kind::Automation => writeln!(
                        out,
                        "created automation {} ({id}), version {}",
                        object.name, created["version"]
                    )?,
                    _ => writeln!(out, "created {} ({id})", object.label())?,
                }
                held.add(object.kind, created);
            }
            Step::Unchanged { id } => {
                tally.unchanged += 1;
                if options.secrets && has_secret(object) {
                    tally.changed += 1;
                    tally.unchanged -= 1;
                    writeln!(out, "{would}send the secrets of {} ({id})", object.label())?;
                    if !options.dry_run {
                        send_secrets(client, object, &id).await?;
                    }
                    continue;
                }
                match object.kind {
                    Kind::Automation => writeln!(
                        out,
                        "automation {} ({id}) unchanged, version {}",
                        object.name,
                        current
                            .as_ref()
                            .map_or(Value::Null, |c| c["version"].clone())
                    )?,
                    _ => writeln!(out, "{} ({id}) unchanged", object.label())?,
                }
            }
            Step::Change { id, lines } => {
                tally.changed += 1;
                let path = format!("{}/{id}", object.kind.collection());
                if options.dry_run {
                    writeln!(out, "would change {} ({id})", object.label())?;
                } else if object.kind == Kind::Automation {
                    let saved = client.put(&path, &body).await.with_context(|| {
                        format!("saving {} ({})", object.label(), show(&object.file))
                    })?;
                    writeln!(
                        out,
                        "automation {} ({id}): new version {} (was {})",
                        object.name,
                        saved["version"],
                        current
                            .as_ref()
                            .map_or(Value::Null, |c| c["version"].clone())
                    )?;
                } else {
                    let mut patch = changed_fields(object.kind, &body, current.as_ref());
                    // A connection moved to another base URL takes its
                    // credentials along only when they are given again in
                    // the same change: the file's, when it holds them.
                    if object.kind == Kind::Connection
                        && patch.get("base_url").is_some()
                        && has_secret(object)
                    {
                        patch["credentials"] = object.body["credentials"].clone();
                    }
                    client.patch(&path, &patch).await.with_context(|| {
                        format!("changing {} ({})", object.label(), show(&object.file))
                    })?;
                    writeln!(out, "changed {} ({id})", object.label())?;
                }
                for line in lines {
                    writeln!(out, "  {line}")?;
                }
                if options.secrets && has_secret(object) && !options.dry_run {
                    send_secrets(client, object, &id).await?;
                }
            }
        }
    }
    let mut refused = Vec::new();
    if options.prune {
        let named: HashSet<(Kind, &str)> =
            objects.iter().map(|o| (o.kind, o.name.as_str())).collect();
        for kind in Kind::ALL.into_iter().rev() {
            for item in held.of(kind) {
                let name = item["name"].as_str().unwrap_or_default();
                if named.contains(&(kind, name)) {
                    continue;
                }
                let id = item["id"].as_str().unwrap_or_default();
                tally.deleted += 1;
                if options.dry_run {
                    writeln!(out, "would delete {} {name} ({id})", kind.name())?;
                    continue;
                }
                match client.delete(&format!("{}/{id}", kind.collection())).await {
                    Ok(_) => writeln!(out, "deleted {} {name} ({id})", kind.name())?,
                    Err(e) => {
                        tally.deleted -= 1;
                        writeln!(out, "not deleted {} {name} ({id}): {e:#}", kind.name())?;
                        refused.push(format!("{} {name}", kind.name()));
                    }
                }
            }
        }
    }
    let deleted = |verb: &str| {
        if options.prune {
            format!(", {} {verb}", tally.deleted)
        } else {
            String::new()
        }
    };
    if options.dry_run {
        writeln!(
            out,
            "plan: {} to create, {} to change, {} unchanged{}",
            tally.created,
            tally.changed,
            tally.unchanged,
            deleted("to delete")
        )?;
    } else {
        writeln!(
            out,
            "{} created, {} changed, {} unchanged{}",
            tally.created,
            tally.changed,
            tally.unchanged,
            deleted("deleted")
        )?;
    }
    if !refused.is_empty() {
        bail!(
            "the server kept {} it was asked to delete: {}",
            refused.len(),
            refused.join(", ")
        );
    }
    Ok(())
}

fn show(path: &Path) -> String {
    path.display().to_string()
}

/// Every object of the file, or of every `.json` file under the directory.
fn read(path: &Path) -> anyhow::Result<Vec<Object>> {
    let mut files = Vec::new();
    if path.is_dir() {
        collect(path, &mut files)?;
        if files.is_empty() {
            bail!("{} holds no .json file", path.display());
        }
    } else {
        files.push(path.to_path_buf());
    }
    let mut objects: Vec<Object> = Vec::new();
    let mut seen: HashMap<(Kind, String), PathBuf> = HashMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("could not read {}", file.display()))?;
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", file.display()))?;
        let list = match value {
            Value::Array(items) => items,
            one => vec![one],
        };
        for (i, item) in list.into_iter().enumerate() {
            let at = if path.is_dir() || i > 0 {
                format!("{} (object {})", file.display(), i + 1)
            } else {
                file.display().to_string()
            };
            let object = object(item, &file).with_context(|| at.clone())?;
            if let Some(first) = seen.insert((object.kind, object.name.clone()), file.clone()) {
                bail!(
                    "{} is named twice: in {} and in {}; a name says which object a file \
                     holds, so each must be unique per kind",
                    object.label(),
                    first.display(),
                    file.display()
                );
            }
            objects.push(object);
        }
    }
    objects.sort_by_key(|o| o.kind);
    Ok(objects)
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("could not read the directory {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect(&entry, files)?;
        } else if entry.extension().is_some_and(|e| e == "json") {
            files.push(entry);
        }
    }
    Ok(())
}

fn object(item: Value, file: &Path) -> anyhow::Result<Object> {
    let Value::Object(mut fields) = item else {
        bail!("an object to apply must be a JSON object");
    };
    let kind = match fields.remove("kind") {
        None => Kind::Automation,
        Some(Value::String(text)) => Kind::parse(&text).ok_or_else(|| {
            anyhow!(
                "`kind` is `{text}`; expected one of {} (none: an automation)",
                Kind::ALL.map(Kind::name).join(", ")
            )
        })?,
        Some(other) => bail!("`kind` must be a string, not {other}"),
    };
    let name = match fields.get("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim().to_owned(),
        _ => bail!("it has no `name`: a {} is applied by its name", kind.name()),
    };
    match kind {
        Kind::Source => {
            if let Some(secret) = fields.get_mut("secret") {
                *secret = from_env(secret.take(), "secret")?;
            }
            if let Some(verify) = fields.get_mut("verify") {
                *verify = from_env(verify.take(), "verify")?;
            }
        }
        Kind::Connection => {
            if let Some(credentials) = fields.get_mut("credentials") {
                *credentials = from_env(credentials.take(), "credentials")?;
            }
        }
        _ => {}
    }
    Ok(Object {
        kind,
        name,
        body: Value::Object(fields),
        file: file.to_path_buf(),
    })
}

/// `value` with every `{"env": "NAME"}` in it replaced by NAME's value.
fn from_env(value: Value, at: &str) -> anyhow::Result<Value> {
    match value {
        Value::Object(fields) if fields.len() == 1 && fields.contains_key("env") => {
            let Some(Value::String(name)) = fields.get("env") else {
                bail!("`{at}`: `env` must name an environment variable");
            };
            std::env::var(name)
                .map(Value::String)
                .map_err(|_| anyhow!("`{at}` is the environment variable {name}, which is not set"))
        }
        Value::Object(fields) => fields
            .into_iter()
            .map(|(k, v)| {
                let inner = format!("{at}.{k}");
                from_env(v, &inner).map(|v| (k, v))
            })
            .collect::<anyhow::Result<Map<String, Value>>>()
            .map(Value::Object),
        other => Ok(other),
    }
}

/// An automation that another of the files starts (`run_workflow`) goes
/// before it, so that it exists when the other is saved.
fn order_automations(objects: &mut [Object]) {
    let started: HashSet<String> = objects
        .iter()
        .filter(|o| o.kind == Kind::Automation)
        .filter_map(|o| serde_json::from_value::<Automation>(o.body.clone()).ok())
        .flat_map(|a| tok_core::uses::references(&a))
        .filter(|r| r.kind == tok_core::uses::Kind::Automation)
        .map(|r| r.name)
        .collect();
    objects.sort_by_key(|o| (o.kind, !started.contains(&o.name)));
}

/// What the server holds of every kind, by name.
struct Held {
    items: HashMap<Kind, Vec<Value>>,
}

impl Held {
    async fn read(client: &Client) -> anyhow::Result<Self> {
        let mut items = HashMap::new();
        for kind in Kind::ALL {
            items.insert(kind, listing(client, kind.collection()).await?);
        }
        Ok(Self { items })
    }

    fn of(&self, kind: Kind) -> &[Value] {
        self.items.get(&kind).map_or(&[], Vec::as_slice)
    }

    /// The one object of `kind` called `name`; two of that name on the
    /// server are an error, since a file could mean either.
    fn find(&self, kind: Kind, name: &str) -> anyhow::Result<Option<&Value>> {
        let mut found = self.of(kind).iter().filter(|i| i["name"] == name);
        let first = found.next();
        if let Some(second) = found.next() {
            bail!(
                "the server holds two {}s named `{name}` ({} and {}); delete or rename one \
                 before applying",
                kind.name(),
                first.map_or("?", |f| f["id"].as_str().unwrap_or("?")),
                second["id"].as_str().unwrap_or("?")
            );
        }
        Ok(first)
    }

    fn add(&mut self, kind: Kind, created: Value) {
        self.items.entry(kind).or_default().push(created);
    }
}

/// Every item of a listing, page after page.
async fn listing(client: &Client, collection: &str) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("{collection}?limit=500&cursor={c}"),
            None => format!("{collection}?limit=500"),
        };
        let page = client.get(&path).await?;
        all.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(all),
        }
    }
}

/// A webhook trigger's `source` given by name becomes the source's id. (In
/// a dry run a source the files create has no id yet: the name stays, and
/// the automation shows as created or changed.)
fn resolve_source(body: &mut Value, held: &Held) -> anyhow::Result<()> {
    let Some(source) = body.pointer_mut("/trigger/source") else {
        return Ok(());
    };
    let Some(named) = source.as_str() else {
        return Ok(());
    };
    if held.of(Kind::Source).iter().any(|s| s["id"] == named) {
        return Ok(());
    }
    if let Some(found) = held.find(Kind::Source, named)? {
        *source = found["id"].clone();
    }
    Ok(())
}

/// The server's object next to the file's: unchanged, or what differs.
fn compare(kind: Kind, body: &Value, current: &Value, file: &Path) -> anyhow::Result<Step> {
    let id = current["id"].as_str().unwrap_or_default().to_owned();
    if kind == Kind::Automation {
        // The server keeps the definition as parsed, defaults filled in;
        // the file parsed the same way compares with it. One the parser
        // refuses goes to the server, whose answer says what is wrong.
        let after = match serde_json::from_value::<Automation>(body.clone()) {
            Ok(parsed) => serde_json::to_value(&parsed)?,
            Err(_) => body.clone(),
        };
        if after == current["definition"] {
            return Ok(Step::Unchanged { id });
        }
        let lines = diff::changes(&current["definition"], &after);
        return Ok(Step::Change { id, lines });
    }
    let (before, after) = (held_fields(kind, current, body), file_fields(kind, body)?);
    if kind == Kind::Connection
        && let (Some(old), Some(new)) = (before.get("service"), after.get("service"))
        && old != new
    {
        bail!(
            "{}: connection {}'s service is {old} on the server and {new} here; a service \
             cannot change: delete the connection and apply again",
            file.display(),
            current["name"]
        );
    }
    let (before, after) = (Value::Object(before), Value::Object(after));
    if same(&before, &after) {
        return Ok(Step::Unchanged { id });
    }
    let lines = diff::changes(&before, &after);
    Ok(Step::Change { id, lines })
}

/// The file's fields that are compared, as the server would show them.
fn file_fields(kind: Kind, body: &Value) -> anyhow::Result<Map<String, Value>> {
    let mut fields: Map<String, Value> = kind
        .compared()
        .iter()
        .filter_map(|&f| body.get(f).map(|v| (f.to_owned(), v.clone())))
        .collect();
    if kind == Kind::Source
        && let Some(params) = fields.get_mut("params")
    {
        // Parsed as the server parses them, defaults filled in.
        let parsed: Vec<tok_core::contract::Param> =
            serde_json::from_value(params.clone()).context("`params` is not a list of params")?;
        *params = serde_json::to_value(parsed)?;
    }
    Ok(fields)
}

/// The server's values of the fields the file gives.
fn held_fields(kind: Kind, current: &Value, body: &Value) -> Map<String, Value> {
    let mut fields = Map::new();
    for &field in kind.compared() {
        let Some(wanted) = body.get(field) else {
            continue;
        };
        let held = match (kind, field) {
            (Kind::Widget, "ttlSec") => current["ttl_sec"].clone(),
            // Only the breaker's settings the file gives (not its state).
            (Kind::Connection, "breaker") => Value::Object(
                wanted
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, _)| (k.clone(), current["breaker"][k].clone()))
                    .collect(),
            ),
            // Members as the file names them: a capacity the file leaves
            // out is whatever the server holds.
            (Kind::Group, "members") => Value::Array(
                wanted
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| {
                        let held = current["members"]
                            .as_array()?
                            .iter()
                            .find(|h| h["name"] == m["name"])?;
                        let mut shown = json!({ "name": held["name"] });
                        if m.get("capacity").is_some() {
                            shown["capacity"] = held["capacity"].clone();
                        }
                        Some(shown)
                    })
                    .chain(
                        // Members the server holds and the file does not.
                        current["members"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter(|h| {
                                !wanted
                                    .as_array()
                                    .is_some_and(|w| w.iter().any(|m| m["name"] == h["name"]))
                            })
                            .map(|h| json!({ "name": h["name"], "capacity": h["capacity"] })),
                    )
                    .collect(),
            ),
            _ => current[field].clone(),
        };
        fields.insert(field.to_owned(), held);
    }
    fields
}

/// The body of a `PATCH`: the compared fields of the file that differ.
fn changed_fields(kind: Kind, body: &Value, current: Option<&Value>) -> Value {
    let after = file_fields(kind, body).unwrap_or_default();
    let before = current
        .map(|c| held_fields(kind, c, body))
        .unwrap_or_default();
    Value::Object(
        after
            .into_iter()
            .filter(|(k, v)| !before.get(k).is_some_and(|b| same(b, v)))
            .collect(),
    )
}

/// Equal as JSON values, a number being equal to the same number written
/// another way (`5` and `5.0`: a rate is a float on the server).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn has_secret(object: &Object) -> bool {
    match object.kind {
        Kind::Source => !source_secret(&object.body).is_null(),
        Kind::Connection => object
            .body
            .get("credentials")
            .is_some_and(|c| c.as_object().is_some_and(|m| !m.is_empty())),
        _ => false,
    }
}

/// A source's signing secret: `verify.secret`, or the older `secret`.
fn source_secret(body: &Value) -> &Value {
    match &body["verify"]["secret"] {
        Value::Null => &body["secret"],
        secret => secret,
    }
}

/// Sends the object's secrets again: the connection's credentials, or the
/// source's signing secret by a rotation that keeps the URL (the secret
/// before stays valid for an hour, while the sender moves to the new one).
async fn send_secrets(client: &Client, object: &Object, id: &str) -> anyhow::Result<()> {
    let sent = match object.kind {
        Kind::Connection => {
            client
                .patch(
                    &format!("/api/connections/{id}"),
                    &json!({ "credentials": object.body["credentials"] }),
                )
                .await
        }
        Kind::Source => client
            .post(
                &format!("/api/sources/{id}/rotate"),
                &json!({ "token": false, "secret": source_secret(&object.body), "overlap": "1h" }),
            )
            .await,
        _ => return Ok(()),
    };
    sent.with_context(|| format!("sending the secrets of {}", object.label()))?;
    Ok(())
}
