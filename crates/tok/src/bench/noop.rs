//! `bench/noop`: a step type that does nothing, registered as an external
//! handler so that each of its steps goes through its own claim and record
//! (the `steps-queued`, `fairness` and `workers` figures). `tok serve`
//! never registers it: the bench's servers are `tok bench-serve`
//! ([`SERVE_SUBCOMMAND`]), the same serve with a registry that has the
//! bench's step types too ([`register`]).

use async_trait::async_trait;
use serde_json::{Map, Value};
use tok_core::error::StepError;
use tok_engine::{Registry, StepCall, StepHandler};

/// The hidden subcommand of the `tok` binary that serves like `tok serve`
/// with the bench's step types registered: what `tok bench` starts, and
/// what a server for `tok bench --url` must be started with.
pub const SERVE_SUBCOMMAND: &str = "bench-serve";

/// The step type's name in automations.
pub const NOOP_STEP: &str = "bench/noop";

/// Adds the bench's step types to a server's registry.
pub fn register(registry: &mut Registry) {
    registry.register(NOOP_STEP, Noop);
}

/// Why an automation with the bench's step types was refused.
pub(crate) fn not_registered() -> String {
    format!(
        "`{NOOP_STEP}` is registered only by a server started with `tok {SERVE_SUBCOMMAND}` \
         (not `tok serve`)"
    )
}

/// Returns no outputs, at once; with `config.outputBytes` an output of
/// about that many bytes of JSON, like a service's answer (`db-cost`'s
/// scenario-B shape), and with `config.outputKey` that answer under that
/// one key (in a loop, `k{{index}}`: each iteration's answer stays in the
/// run's context under a key of its own, so the context grows with the
/// run, `db-cost`'s long runs). With `config.sleepMs` (at most 10 s) it
/// holds its worker that long first, like a call to a slow service; with
/// `config.fail` it then fails, terminally, with that message (`bulk`'s
/// runs to retry).
pub struct Noop;

#[async_trait]
impl StepHandler for Noop {
    async fn run(&self, call: StepCall) -> Result<Map<String, Value>, StepError> {
        if let Some(ms) = call.config.get("sleepMs").and_then(Value::as_u64) {
            tokio::time::sleep(std::time::Duration::from_millis(ms.min(10_000))).await;
        }
        if let Some(message) = call.config.get("fail").and_then(Value::as_str) {
            return Err(StepError::terminal(message));
        }
        let Some(bytes) = call.config.get("outputBytes").and_then(Value::as_u64) else {
            return Ok(Map::new());
        };
        let answer = answer(usize::try_from(bytes).unwrap_or(usize::MAX).min(1 << 20));
        Ok(match call.config.get("outputKey").and_then(Value::as_str) {
            Some(key) => Map::from_iter([(key.to_owned(), Value::Object(answer))]),
            None => answer,
        })
    }
}

const WORDS: [&str; 16] = [
    "order", "customer", "shipped", "invoice", "Prague", "pending", "status", "item", "quantity",
    "price", "delivery", "address", "ticket", "reply", "agent", "note",
];

/// `{"status": 200, "body": {"items": [...]}}` of about `bytes` bytes of
/// JSON: items with an id, a random 16-hex-digit reference (as little
/// compressible as a real one), a few words and an amount — the shape of
/// the storage measurement's outputs (`docs/operations.md`).
fn answer(bytes: usize) -> Map<String, Value> {
    let mut items = Vec::new();
    let mut size = 40;
    let mut n = 0usize;
    while size < bytes {
        let random = tok_store::random_token();
        let reference = &random[..16];
        let text: Vec<&str> = (0..3 + (n * 7 + usize::from(random.as_bytes()[0])) % 6)
            .map(|k| WORDS[(n * 5 + k * 3 + usize::from(random.as_bytes()[1])) % WORDS.len()])
            .collect();
        let item = serde_json::json!({
            "id": 100_000 + (usize::from(random.as_bytes()[2]) * 3_517 + n) % 900_000,
            "ref": reference,
            "text": text.join(" "),
            "amount": (usize::from(random.as_bytes()[3]) * 39 + n) as f64 / 100.0,
        });
        size += item.to_string().len() + 1;
        items.push(item);
        n += 1;
    }
    let mut out = Map::new();
    out.insert("status".into(), Value::from(200));
    out.insert("body".into(), serde_json::json!({ "items": items }));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_answer_is_about_the_size_asked() {
        for bytes in [1_000, 2_000, 3_000] {
            let text = serde_json::Value::Object(super::answer(bytes)).to_string();
            assert!(
                text.len() + 100 >= bytes && text.len() < bytes + 200,
                "{bytes}: {}",
                text.len()
            );
        }
    }
}
