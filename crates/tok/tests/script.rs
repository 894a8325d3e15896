//! The script sandbox on real processes: the `tok` binary's hidden
//! `script-sandbox` subcommand as the pool's children.
//!
//! Hostile scripts must each end as an error within their deadline plus one
//! second (a correctness bound, not a benchmark) while a normal script on the
//! same pool keeps succeeding; a thousand normal scripts must leave no extra
//! processes behind and not grow the children's memory.
//!
//! The tests take turns (`SERIAL`): they count this process's children in
//! `/proc`, which a concurrent test would disturb.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tok_script::{
    MAX_TIMEOUT, PoolConfig, SANDBOX_SUBCOMMAND, ScriptError, ScriptOutput, ScriptPool,
    ScriptRequest,
};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const TIMEOUT: Duration = Duration::from_millis(100);

fn config() -> PoolConfig {
    PoolConfig::new(env!("CARGO_BIN_EXE_tok"), [SANDBOX_SUBCOMMAND])
}

fn request(source: &str, input: Value) -> ScriptRequest {
    ScriptRequest {
        source: source.to_owned(),
        input,
        timeout: Some(TIMEOUT),
        cache_key: format!("tenant-a:{source}"),
    }
}

/// One builtin call that neither polls the interrupt handler nor allocates:
/// only killing the child stops it.
const LONG_BUILTIN: &str = "function main() { return { s: new Array(1e9).join('') } }";

const ADD_ONE: &str = "function main(input) { return { n: input.n + 1 } }";

async fn add_one(pool: &ScriptPool, n: i64) -> Result<ScriptOutput, ScriptError> {
    pool.run(request(ADD_ONE, json!({ "n": n }))).await
}

/// Live (non-zombie) sandbox processes whose parent is this test process,
/// and zombies among `pids`.
fn sandbox_children(pids: &BTreeSet<u32>) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let me = std::process::id();
    let mut live = BTreeSet::new();
    let mut zombies = BTreeSet::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces, so split after `)`.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = after.split_whitespace();
        let state = fields.next().unwrap_or("");
        let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid != me {
            continue;
        }
        if state == "Z" {
            if pids.contains(&pid) {
                zombies.insert(pid);
            }
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(SANDBOX_SUBCOMMAND) {
            live.insert(pid);
        }
    }
    (live, zombies)
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Runs `hostile` while a normal script runs again and again on the same
/// pool; returns the hostile script's error, how long it took, and how many
/// normal scripts completed while it ran.
async fn run_beside_normal_work(
    pool: &ScriptPool,
    hostile: &str,
    timeout: Duration,
) -> (ScriptError, Duration, usize) {
    let running = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let meanwhile = Arc::new(AtomicUsize::new(0));
    let normal = {
        let (pool, running, done, meanwhile) = (
            pool.clone(),
            running.clone(),
            done.clone(),
            meanwhile.clone(),
        );
        tokio::spawn(async move {
            let mut n = 0;
            while !done.load(Ordering::SeqCst) {
                let out = add_one(&pool, n).await.expect("a normal script failed");
                assert_eq!(out.value["n"], json!(n + 1));
                if running.load(Ordering::SeqCst) && !done.load(Ordering::SeqCst) {
                    meanwhile.fetch_add(1, Ordering::SeqCst);
                }
                n += 1;
            }
        })
    };
    // Let the normal loop take its child first.
    tokio::time::sleep(Duration::from_millis(20)).await;
    running.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let error = pool
        .run(ScriptRequest {
            timeout: Some(timeout),
            ..request(hostile, json!({}))
        })
        .await
        .expect_err("a hostile script succeeded");
    let elapsed = started.elapsed();
    done.store(true, Ordering::SeqCst);
    normal.await.unwrap();
    (error, elapsed, meanwhile.load(Ordering::SeqCst))
}

#[tokio::test]
async fn hostile_scripts_end_within_their_deadline_while_others_keep_running() {
    let _turn = SERIAL.lock().await;
    let pool = ScriptPool::new(PoolConfig {
        // Only the hostile scripts retire children here.
        process_scripts: u64::MAX,
        ..config()
    })
    .unwrap();
    pool.warm_up().await.unwrap();

    // The memory bomb gets the longest timeout: it must meet the heap limit
    // first, and filling 32 MiB takes this debug build 100-300 ms.
    let cases: [(&str, &str); 6] = [
        ("endless loop", "function main() { while (true) {} }"),
        (
            "deep recursion",
            "function f(n) { return f(n + 1) + 1 }\nfunction main() { return { v: f(0) } }",
        ),
        (
            "memory bomb",
            "function main() { const a = []; while (true) a.push('x'.repeat(1e5) + a.length) }",
        ),
        (
            "long join",
            "function main() { return { s: new Array(1e9).join() } }",
        ),
        (
            "long indexOf",
            "function main() { return { i: Array.prototype.indexOf.call({length: 2**32 - 1}, 1) } }",
        ),
        ("long join without output", LONG_BUILTIN),
    ];
    for (name, source) in cases {
        let timeout = match name {
            "memory bomb" => MAX_TIMEOUT,
            _ => TIMEOUT,
        };
        let bound = timeout + Duration::from_secs(1);
        let killed_before = pool.stats().killed;
        let retired_before = pool.stats().retired;
        let (error, elapsed, meanwhile) = run_beside_normal_work(&pool, source, timeout).await;
        eprintln!("{name}: {error} after {elapsed:?}; {meanwhile} normal scripts meanwhile");
        assert!(
            elapsed < bound,
            "{name} took {elapsed:?}, more than its deadline + 1 s"
        );
        assert!(error.is_script_fault(), "{name}: {error}");
        // Whatever holds one child, the other keeps serving.
        if elapsed >= Duration::from_millis(50) {
            assert!(meanwhile > 0, "no normal script completed while {name} ran");
        }
        match name {
            "endless loop" => {
                assert_eq!(
                    error.to_string(),
                    "script ran longer than 100 ms and was stopped"
                );
                // The interrupt handler stopped it: no process was killed.
                assert_eq!(pool.stats().killed, killed_before);
            }
            "deep recursion" => {
                assert!(
                    matches!(&error, ScriptError::Script { message, line: Some(1) }
                        if message.contains("Maximum call stack size exceeded")),
                    "{error:?}"
                );
            }
            "memory bomb" => {
                assert_eq!(
                    error.to_string(),
                    "script used more than 32 MiB of memory and was stopped"
                );
                // Its child is retired, so the heap it grew goes back to the
                // system.
                assert_eq!(pool.stats().retired, retired_before + 1);
            }
            // Inside `join` the interrupt handler never runs: either the
            // heap limit ends it, or the worker kills the child.
            "long join" => assert!(
                matches!(
                    error,
                    ScriptError::Timeout { .. } | ScriptError::Memory { .. }
                ),
                "{error:?}"
            ),
            // QuickJS-ng polls the interrupt handler inside `indexOf`; an
            // engine that did not would have its child killed instead.
            // Either way it is a timeout.
            "long indexOf" => {
                assert_eq!(
                    error.to_string(),
                    "script ran longer than 100 ms and was stopped"
                );
            }
            _ => {
                assert_eq!(
                    error.to_string(),
                    "script ran longer than 100 ms and was stopped"
                );
                assert_eq!(
                    pool.stats().killed,
                    killed_before + 1,
                    "the child was not killed"
                );
                assert!(elapsed >= TIMEOUT + pool.config().grace, "{elapsed:?}");
            }
        }
    }

    // Killed children were replaced: the pool is back to full strength.
    let stats = pool.stats();
    eprintln!("after the hostile scripts: {stats:?}");
    assert!(stats.killed >= 1);
    assert!(stats.last_replacement.is_some());
    assert_eq!(add_one(&pool, 1).await.unwrap().value["n"], json!(2));
    wait_for_full_pool(&pool, 2).await;
    // Killed and retired children were reaped: only the pool's own remain.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let current: BTreeSet<u32> = pool.stats().children.into_iter().collect();
        let (live, _) = sandbox_children(&BTreeSet::new());
        if current.len() == 2 && live == current {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "children {live:?}, pool {current:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `size` children are up and idle.
async fn wait_for_full_pool(pool: &ScriptPool, size: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.stats().idle < size {
        assert!(
            Instant::now() < deadline,
            "the pool did not get back to {size} children: {:?}",
            pool.stats()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn a_killed_child_is_replaced_at_once() {
    let _turn = SERIAL.lock().await;
    let pool = ScriptPool::new(config()).unwrap();
    pool.warm_up().await.unwrap();
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let error = pool
            .run(request(LONG_BUILTIN, json!({})))
            .await
            .unwrap_err();
        assert!(matches!(error, ScriptError::Timeout { .. }), "{error:?}");
        let killed_after = started.elapsed();
        // The other child serves at once; the killed one's replacement is
        // up shortly after.
        assert_eq!(add_one(&pool, 1).await.unwrap().value["n"], json!(2));
        wait_for_full_pool(&pool, 2).await;
        let full_again = started.elapsed();
        let (a, b) = tokio::join!(add_one(&pool, 1), add_one(&pool, 2));
        assert_eq!(a.unwrap().value["n"], json!(2));
        assert_eq!(b.unwrap().value["n"], json!(3));
        times.push((
            killed_after,
            full_again,
            pool.stats().last_replacement.unwrap(),
        ));
    }
    eprintln!(
        "(time to the timeout error, to a full pool again, to start a replacement): {times:?}"
    );
    assert_eq!(pool.stats().killed, 5);
}

#[tokio::test]
async fn a_child_that_dies_is_reported_and_replaced() {
    let _turn = SERIAL.lock().await;
    let pool = ScriptPool::new(PoolConfig {
        size: 1,
        ..config()
    })
    .unwrap();
    pool.warm_up().await.unwrap();
    let pid = pool.stats().children[0];
    let run = {
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.run(ScriptRequest {
                timeout: Some(Duration::from_millis(1000)),
                ..request("function main() { while (true) {} }", json!({}))
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let error = run.await.unwrap().unwrap_err();
    assert_eq!(
        error.to_string(),
        "the script's sandbox process died while running it (killed (SIGKILL)); the script was stopped"
    );
    assert_eq!(pool.stats().crashed, 1);
    assert_eq!(add_one(&pool, 41).await.unwrap().value["n"], json!(42));
    assert_ne!(pool.stats().children, vec![pid]);
}

#[tokio::test]
async fn script_errors_come_back_with_message_and_line() {
    let _turn = SERIAL.lock().await;
    let pool = ScriptPool::new(config()).unwrap();
    let error = pool
        .run(request(
            "function main(input) {\n  if (!input.order) {\n    throw new Error('order is missing');\n  }\n}",
            json!({}),
        ))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "script failed at line 3: Error: order is missing"
    );
    let error = pool
        .run(request("function main() { return [1, 2, 3] }", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(error, ScriptError::InvalidOutput(_)), "{error:?}");
    assert!(
        error.to_string().contains("it returned an array"),
        "{error}"
    );
    let out = pool
        .run(request(
            "function main(i) { console.log('seen', i.id); return { ok: true } }",
            json!({"id": 9}),
        ))
        .await
        .unwrap();
    assert_eq!(out.logs, vec!["seen 9".to_owned()]);
}

#[tokio::test]
async fn a_thousand_scripts_leak_no_processes_or_memory() {
    let _turn = SERIAL.lock().await;
    let pool = ScriptPool::new(config()).unwrap();
    pool.warm_up().await.unwrap();
    // Twenty tenants' sources, more than a child caches at once, so
    // contexts are compiled, reused, recycled and evicted along the way.
    let sources: Vec<String> = (0..20)
        .map(|k| {
            format!(
                "function main(input) {{\n  const items = input.items.map((x) => ({{ ...x, total: x.price * x.qty + {k} }}));\n  return {{ key: {k}, items, sum: items.reduce((a, x) => a + x.total, 0), text: JSON.stringify(input).repeat(20) }};\n}}"
            )
        })
        .collect();
    let run = |i: usize| {
        let pool = pool.clone();
        let source = sources[i % sources.len()].clone();
        async move {
            let items: Vec<Value> = (0..20)
                .map(|j| json!({ "price": j, "qty": i % 7, "name": format!("item {j} of {i}") }))
                .collect();
            let out = pool
                .run(ScriptRequest {
                    cache_key: format!("tenant-{}:{}", i % 20, source.len()),
                    ..request(&source, json!({ "items": items }))
                })
                .await
                .unwrap();
            assert_eq!(out.value["key"], json!(i % 20));
        }
    };
    for i in 0..100 {
        run(i).await;
    }
    let before = pool.stats();
    assert_eq!(before.children.len(), 2);
    let rss_before: u64 = before.children.iter().map(|&p| rss_kib(p)).sum();
    let (live, _) = sandbox_children(&BTreeSet::new());
    assert_eq!(live, before.children.iter().copied().collect());

    let started = Instant::now();
    for i in 0..1000 {
        run(i).await;
    }
    let elapsed = started.elapsed();

    let after = pool.stats();
    let rss_after: u64 = after.children.iter().map(|&p| rss_kib(p)).sum();
    eprintln!(
        "1000 scripts in {elapsed:?}; children RSS {rss_before} KiB -> {rss_after} KiB; {after:?}"
    );
    assert_eq!(after.children, before.children, "children were replaced");
    assert_eq!(after.spawned, 2);
    assert_eq!(after.scripts, before.scripts + 1000);
    let (live, _) = sandbox_children(&BTreeSet::new());
    assert_eq!(live, after.children.iter().copied().collect());
    assert!(
        rss_after < rss_before + 20 * 1024,
        "children grew from {rss_before} KiB to {rss_after} KiB"
    );
}

#[tokio::test]
async fn retired_children_are_reaped() {
    let _turn = SERIAL.lock().await;
    let pool = ScriptPool::new(PoolConfig {
        process_scripts: 50,
        ..config()
    })
    .unwrap();
    let mut seen = BTreeSet::new();
    for n in 0..300 {
        add_one(&pool, n).await.unwrap();
        seen.extend(pool.stats().children);
    }
    let stats = pool.stats();
    assert!(stats.retired >= 4, "{stats:?}");
    assert!(seen.len() >= 6, "{seen:?}");
    // Retired children exit and are waited for: none lingers, alive or
    // as a zombie.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (live, zombies) = sandbox_children(&seen);
        let current: BTreeSet<u32> = pool.stats().children.into_iter().collect();
        if live == current && zombies.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox children {live:?} (zombies {zombies:?}) but the pool holds {current:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(pool);
}
