//! `tok bench` runs end to end on a tiny load: it starts its own server on
//! SQLite, prints the table and writes a JSON file a script can read. No
//! figure's value is asserted on: a benchmark is not a timed test.

use std::process::Command;

use serde_json::Value;

#[test]
fn bench_prints_the_table_and_writes_json() {
    let dir = std::env::temp_dir().join(format!("tok-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("bench.json");
    let run = Command::new(env!("CARGO_BIN_EXE_tok"))
        .args(["bench", "--only", "steps", "--scale", "0.01", "--out"])
        .arg(&out)
        .env_remove("TOK_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tok bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "tok bench failed:\n{stdout}\n{stderr}"
    );

    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    for column in ["figure", "value", "unit", "target", "notes"] {
        assert!(header.contains(column), "table header: {header}");
    }
    let row = stdout
        .lines()
        .find(|l| l.starts_with("steps "))
        .unwrap_or_else(|| panic!("no `steps` row in:\n{stdout}"));
    assert!(row.contains("steps/s") && row.contains(">= 20000"), "{row}");

    let json: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let config = &json["configuration"];
    assert_eq!(config["backend"], "sqlite");
    assert!(config["cores"].as_u64().unwrap() >= 1);
    assert!(
        config["commit"]
            .as_str()
            .unwrap()
            .contains("journal_mode=wal"),
        "{config}"
    );
    let figures = json["figures"].as_array().unwrap();
    assert_eq!(figures.len(), 1, "{json}");
    assert_eq!(figures[0]["name"], "steps");
    let details = &figures[0]["details"];
    assert!(details["events"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(details["completed_runs"], details["events"], "{json}");
    assert!(figures[0]["value"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tok bench --only wal` on a tiny load: the three figures of the log,
/// and what a clean shutdown left of it (nothing: a size, not a speed).
#[test]
fn bench_measures_the_sqlite_log_and_what_a_shutdown_leaves() {
    let dir = std::env::temp_dir().join(format!("tok-bench-wal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("bench.json");
    let run = Command::new(env!("CARGO_BIN_EXE_tok"))
        .args(["bench", "--only", "wal", "--scale", "0.01", "--out"])
        .arg(&out)
        .env_remove("TOK_DATABASE_URL")
        .env_remove("TOK_SQLITE_WAL_LIMIT")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tok bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "tok bench failed:\n{stdout}\n{stderr}"
    );
    let json: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let figures = json["figures"].as_array().unwrap();
    let names: Vec<&str> = figures.iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(
        names,
        ["wal-peak", "wal-idle", "wal-after-shutdown"],
        "{json}"
    );
    let details = &figures[0]["details"];
    assert_eq!(details["completed_runs"], details["events"], "{json}");
    assert!(details["wal_peak_bytes"].as_u64().unwrap() > 0, "{json}");
    assert!(
        details["wal_after_shutdown_bytes"]
            .as_u64()
            .is_none_or(|b| b == 0),
        "{json}"
    );
    assert_eq!(details["exit"], "exit status: 0", "{json}");
    let _ = std::fs::remove_dir_all(&dir);
}
