//! Every metric family of `/metrics` has its `# HELP` and `# TYPE` lines
//! (what Prometheus's linter, `promtool check metrics`, asks), on API and
//! worker nodes alike: `tok serve` describes every metric
//! (`tok::describe_metrics`) once its recorder is installed.
//!
//! The metrics are found in the sources themselves — every `counter!`,
//! `gauge!` and `histogram!` of the workspace's crates — and each is
//! recorded once under a recorder of this test's own, described as `serve`
//! describes them, and its exposition parsed: a metric added later without
//! a description fails here, whether or not another test makes it appear.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each metric the sources record: its name and its kind.
fn recorded_in_sources() -> BTreeMap<String, &'static str> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .expect("the workspace's crates")
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut found = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for kind in ["counter", "gauge", "histogram"] {
            let call = format!("{kind}!(");
            let mut rest = text.as_str();
            while let Some(at) = rest.find(&call) {
                let before = &rest[..at];
                rest = &rest[at + call.len()..];
                // `describe_counter!(` describes; it records nothing.
                if before.ends_with("describe_") {
                    continue;
                }
                let name = rest.trim_start();
                let Some(name) = name.strip_prefix('"') else {
                    continue;
                };
                let name = &name[..name.find('"').unwrap_or(0)];
                if name.starts_with("tok_") {
                    found.insert(name.to_owned(), kind);
                }
            }
        }
    }
    found
}

/// The families of a Prometheus text exposition without a `# HELP` or a
/// `# TYPE` line.
fn undescribed(text: &str) -> Vec<String> {
    let mut help = BTreeSet::new();
    let mut types = BTreeMap::new();
    let mut sampled = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(!text.trim().is_empty(), "an empty HELP: {line}");
            help.insert(name.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            types.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name = line.split(['{', ' ']).next().unwrap();
            sampled.insert(name.to_owned());
        }
    }
    let family = |sample: &str| -> String {
        for suffix in ["_sum", "_count", "_bucket"] {
            if let Some(base) = sample.strip_suffix(suffix)
                && matches!(
                    types.get(base).map(String::as_str),
                    Some("summary" | "histogram")
                )
            {
                return base.to_owned();
            }
        }
        sample.to_owned()
    };
    let mut missing: Vec<String> = sampled
        .iter()
        .map(|s| family(s))
        .filter(|f| !help.contains(f) || !types.contains_key(f))
        .collect();
    missing.sort();
    missing.dedup();
    missing
}

#[test]
fn every_metric_the_sources_record_is_described() {
    let found = recorded_in_sources();
    // The scan finds what it should: the queue's gauges, steps, webhooks…
    for name in [
        "tok_queue_ready_jobs",
        "tok_steps_total",
        "tok_webhooks_total",
        "tok_step_duration_seconds",
        "tok_database_errors_total",
    ] {
        assert!(found.contains_key(name), "{name} not found in {found:?}");
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        tok::describe_metrics();
        for (name, kind) in &found {
            match *kind {
                "counter" => metrics::counter!(name.clone()).increment(1),
                "gauge" => metrics::gauge!(name.clone()).set(1.0),
                _ => metrics::histogram!(name.clone()).record(1.0),
            }
        }
    });
    let text = handle.render();
    for name in found.keys() {
        assert!(
            text.contains(name.as_str()),
            "{name} is not rendered:\n{text}"
        );
    }
    let missing = undescribed(&text);
    assert!(
        missing.is_empty(),
        "metric families without `# HELP` (describe each where it is recorded, \
         with `metrics::describe_*!`, called from `tok::describe_metrics`): {missing:?}\n{text}"
    );
}

#[test]
fn a_family_without_help_is_found() {
    let text = "# TYPE tok_x_total counter\ntok_x_total 1\n\
                # HELP tok_y described\n# TYPE tok_y gauge\ntok_y 2\n\
                # HELP tok_z_seconds z\n# TYPE tok_z_seconds summary\n\
                tok_z_seconds{quantile=\"0.5\"} 1\ntok_z_seconds_sum 1\ntok_z_seconds_count 1\n";
    assert_eq!(undescribed(text), ["tok_x_total"]);
}

/// `promtool check metrics` on the same exposition, where Prometheus's
/// tools are installed (`apt-get install prometheus`).
#[test]
#[ignore = "needs promtool (Debian's `prometheus` package)"]
fn promtool_finds_nothing_to_say() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        tok::describe_metrics();
        for (name, kind) in recorded_in_sources() {
            match kind {
                "counter" => metrics::counter!(name).increment(1),
                "gauge" => metrics::gauge!(name).set(1.0),
                _ => metrics::histogram!(name).record(1.0),
            }
        }
    });
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool on the PATH");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(handle.render().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("promtool: {said}");
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}
