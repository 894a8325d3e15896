//! OpenTelemetry traces of runs: a webhook's `traceparent` becomes its
//! runs' trace, each run is a span and each of its recorded steps a child
//! span, and every outbound call of a step carries `traceparent`.
//!
//! A run is carried out in claims on any node, and a node may die between
//! two of them, so no span is held in memory across a run. Its spans are
//! named by ids every node derives alike from rows: the run's trace id is
//! the webhook's (stored with the event, `_event.traceparent` in the run's
//! context) or one derived from the run id, the run's span id is derived
//! from the run id, a step's from the run id, its path and its attempt.
//! The run span and its step spans are exported once the run ends, from
//! its rows (start, end, status and each recorded step), by the node that
//! ended it; the work of an external step is also a live span
//! (`tracing-opentelemetry`, the `step` span of the runner) whose parent
//! is its step's span, so a call in flight is seen as it happens.
//!
//! The ids are chosen through [`ChosenIds`], the SDK's id generator with
//! a way to name the next span's ids: the SDK takes a span's id, and a
//! root span's trace id, only from its generator. A run without a sender's
//! trace is the root of a trace whose id is derived from the run id, so
//! its exported spans, the live spans of its claims and the `traceparent`
//! of its calls are one trace, whichever node made each. Nothing is exported unless the binary installed a
//! tracer provider (`OTEL_EXPORTER_OTLP_ENDPOINT`) and called
//! [`enable`]; without it the ids still go out in `traceparent`.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tok_core::ids::{RunId, TenantId};
use tok_store::{RunDetail, Store};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns the export of run spans on (the binary does, once it installed
/// the global tracer provider).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether run spans are exported.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A `traceparent` header as received: `Some` as tok writes it (version
/// `00`, lowercase, surrounding spaces trimmed) when it is a valid W3C
/// trace context, `None` otherwise (an
/// invalid one is dropped, as the W3C recommendation says, and the run
/// gets a trace of its own).
pub fn valid_traceparent(header: &str) -> Option<String> {
    // Read by hand: the SDK's propagator takes ids shorter than the
    // specification's fixed widths (and pads them), which would make a
    // trace the sender never had.
    let header = header.trim();
    if header.len() > 128 {
        return None;
    }
    let mut fields = header.split('-');
    let (version, trace, span, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let hex = |field: &str, width: usize| {
        field.len() == width
            && field
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    // Version 00 has exactly four fields; a later version may add more.
    if !(hex(version, 2) && hex(trace, 32) && hex(span, 16) && hex(flags, 2))
        || version == "ff"
        || (version == "00" && fields.next().is_some())
    {
        return None;
    }
    let trace = TraceId::from_hex(trace)
        .ok()
        .filter(|t| *t != TraceId::INVALID)?;
    let span = SpanId::from_hex(span)
        .ok()
        .filter(|s| *s != SpanId::INVALID)?;
    let sampled = u8::from_str_radix(flags, 16).ok()? & 1 == 1;
    Some(format_traceparent(trace, span, sampled))
}

fn format_traceparent(trace: TraceId, span: SpanId, sampled: bool) -> String {
    format!("00-{trace}-{span}-{:02x}", u8::from(sampled))
}

/// What a run's trace is: its trace id, the span it continues (the
/// webhook's sender's, or the step of a parent run), and whether the
/// sender sampled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunTrace {
    pub trace_id: TraceId,
    pub parent: Option<SpanId>,
    pub sampled: bool,
    pub span_id: SpanId,
}

impl RunTrace {
    /// The trace of run `run` whose context is `context`.
    pub fn of(run: &str, context: &Value) -> RunTrace {
        let digest = Sha256::digest(format!("run:{run}").as_bytes());
        let span_id = span_id_of(&digest[16..24]);
        let inbound = context["_event"]["traceparent"]
            .as_str()
            .and_then(parse_traceparent);
        match inbound {
            Some((trace_id, parent, sampled)) => RunTrace {
                trace_id,
                parent: Some(parent),
                sampled,
                span_id,
            },
            None => {
                let mut bytes = [0u8; 16];
                bytes.copy_from_slice(&digest[..16]);
                RunTrace {
                    trace_id: TraceId::from_bytes(bytes),
                    parent: None,
                    sampled: true,
                    span_id,
                }
            }
        }
    }

    /// The context whose span is the run's (a remote parent for the spans
    /// of its claims).
    pub fn run_context(&self) -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            self.trace_id,
            self.span_id,
            self.flags(),
            true,
            TraceState::default(),
        ))
    }

    /// The span id of the step at `path`, attempt `attempt`, of this run.
    pub fn step_span_id(run: &str, path: &str, attempt: i32) -> SpanId {
        let digest = Sha256::digest(format!("step:{run}:{path}:{attempt}").as_bytes());
        span_id_of(&digest[..8])
    }

    /// The context whose span is the step's (a remote parent for the live
    /// span of its work).
    pub fn step_context(&self, run: &str, path: &str, attempt: i32) -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            self.trace_id,
            Self::step_span_id(run, path, attempt),
            self.flags(),
            true,
            TraceState::default(),
        ))
    }

    /// The `traceparent` a step's outbound call carries: the live span of
    /// its work when traces are exported, else the step's own span.
    pub fn outbound(&self, run: &str, path: &str, attempt: i32) -> String {
        if enabled() {
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            let cx = tracing::Span::current().context();
            let span = cx.span();
            let sc = span.span_context();
            if sc.is_valid() && sc.trace_id() == self.trace_id {
                return format_traceparent(sc.trace_id(), sc.span_id(), sc.is_sampled());
            }
        }
        format_traceparent(
            self.trace_id,
            Self::step_span_id(run, path, attempt),
            self.sampled,
        )
    }

    /// The `traceparent` a child run started by the step at `path` keeps:
    /// its parent is that step's span.
    pub fn for_child(&self, run: &str, path: &str, attempt: i32) -> String {
        format_traceparent(
            self.trace_id,
            Self::step_span_id(run, path, attempt),
            self.sampled,
        )
    }

    fn flags(&self) -> TraceFlags {
        if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        }
    }

    fn parent_context(&self) -> Context {
        match self.parent {
            Some(parent) => Context::new().with_remote_span_context(SpanContext::new(
                self.trace_id,
                parent,
                self.flags(),
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        }
    }
}

fn span_id_of(bytes: &[u8]) -> SpanId {
    let mut id = [0u8; 8];
    id.copy_from_slice(bytes);
    // An all-zero span id is invalid; a digest that gives one is moved.
    if id == [0u8; 8] {
        id[7] = 1;
    }
    SpanId::from_bytes(id)
}

fn parse_traceparent(text: &str) -> Option<(TraceId, SpanId, bool)> {
    let mut parts = text.split('-');
    let (_version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    (trace != TraceId::INVALID && span != SpanId::INVALID).then_some((trace, span, flags & 1 == 1))
}

thread_local! {
    static NEXT_SPAN_ID: Cell<Option<SpanId>> = const { Cell::new(None) };
    static NEXT_TRACE_ID: Cell<Option<TraceId>> = const { Cell::new(None) };
}

/// The SDK's id generator, random unless ids were chosen for the next
/// span built on this thread ([`with_ids`]).
#[derive(Debug, Default)]
pub struct ChosenIds(RandomIdGenerator);

impl IdGenerator for ChosenIds {
    fn new_trace_id(&self) -> TraceId {
        NEXT_TRACE_ID
            .with(Cell::take)
            .unwrap_or_else(|| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_SPAN_ID
            .with(Cell::take)
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// Builds a span with the id `id` and, if it is a root, the trace id
/// `trace` (the SDK asks for a trace id only for a root). The build is
/// synchronous, on this thread, so the ids cannot go to another span.
fn with_ids<T>(id: SpanId, trace: Option<TraceId>, build: impl FnOnce() -> T) -> T {
    NEXT_SPAN_ID.with(|next| next.set(Some(id)));
    NEXT_TRACE_ID.with(|next| next.set(trace));
    let built = build();
    NEXT_SPAN_ID.with(|next| next.set(None));
    NEXT_TRACE_ID.with(|next| next.set(None));
    built
}

fn at(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// Exports the spans of run `run`, which has just ended: the run's and
/// one per recorded step. A task of its own reads the run (after the
/// transaction that ended it), so nothing waits for it; without an
/// exporter it does nothing.
pub fn run_ended(store: std::sync::Arc<dyn Store>, tenant: TenantId, run: RunId) {
    if !enabled() {
        return;
    }
    tokio::spawn(async move {
        match store.run(&tenant, &run).await {
            Ok(Some(detail)) => export(&tenant, &detail),
            Ok(None) => {}
            Err(e) => tracing::debug!(%run, error = %e, "the ended run's spans were not exported"),
        }
    });
}

/// The spans of an ended run.
pub fn export(tenant: &TenantId, detail: &RunDetail) {
    let run = detail.run.id.as_str();
    let trace = RunTrace::of(run, &detail.context);
    let tracer = opentelemetry::global::tracer("tok");
    let common = [
        KeyValue::new("tok.tenant_id", tenant.to_string()),
        KeyValue::new("tok.automation_id", detail.run.automation_id.to_string()),
        KeyValue::new("tok.run_id", run.to_owned()),
    ];
    let ended = detail.run.finished_at.unwrap_or_else(tok_store::now_ms);
    // A run without a sender's trace is a root: its trace id is the one
    // its claims and calls already carry.
    let root_trace = trace.parent.is_none().then_some(trace.trace_id);
    let run_span = with_ids(trace.span_id, root_trace, || {
        let mut attributes = common.to_vec();
        attributes.push(KeyValue::new("tok.run.status", detail.run.status.clone()));
        attributes.push(KeyValue::new(
            "tok.trigger",
            detail.run.trigger_type.clone(),
        ));
        tracer
            .span_builder("run")
            .with_kind(SpanKind::Internal)
            .with_start_time(at(detail.run.created_at))
            .with_attributes(attributes)
            .start_with_context(&tracer, &trace.parent_context())
    });
    let run_cx = Context::new().with_span(run_span);
    for step in &detail.steps {
        let id = RunTrace::step_span_id(run, &step.path, step.attempt);
        let span = with_ids(id, None, || {
            let mut attributes = common.to_vec();
            attributes.extend([
                KeyValue::new("tok.step_id", step.step_id.clone()),
                KeyValue::new("tok.step.path", step.path.clone()),
                KeyValue::new("tok.step.type", step.kind.clone()),
                KeyValue::new("tok.step.attempt", i64::from(step.attempt)),
                KeyValue::new("tok.step.status", step.status.clone()),
            ]);
            tracer
                .span_builder("step")
                .with_start_time(at(step.started_at))
                .with_attributes(attributes)
                .start_with_context(&tracer, &run_cx)
        });
        let cx = Context::new().with_span(span);
        let span = cx.span();
        if let Some(error) = &step.error {
            span.set_status(Status::error(error.clone()));
        }
        span.end_with_timestamp(at(step.finished_at));
    }
    let span = run_cx.span();
    if let Some(error) = &detail.run.error {
        span.set_status(Status::error(error.clone()));
    }
    span.end_with_timestamp(at(ended));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_valid_traceparent_is_kept_and_an_invalid_one_dropped() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(valid_traceparent(good).as_deref(), Some(good));
        let unsampled = " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ";
        assert_eq!(
            valid_traceparent(unsampled).as_deref(),
            Some(unsampled.trim())
        );
        // A later version's extra fields are ignored; tok passes it on as 00.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
        assert_eq!(valid_traceparent(later).as_deref(), Some(good));
        for bad in [
            "",
            // W3C trace context: the ids are lowercase hex.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "not a trace",
        ] {
            assert_eq!(valid_traceparent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_runs_trace_is_its_webhooks_or_its_own_and_the_same_on_every_node() {
        let inbound = json!({ "_event": {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        }});
        let trace = RunTrace::of("run_1", &inbound);
        assert_eq!(
            trace.trace_id.to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(trace.parent.unwrap().to_string(), "00f067aa0ba902b7");
        assert_eq!(trace, RunTrace::of("run_1", &inbound));
        let own = RunTrace::of("run_2", &json!({ "_event": {} }));
        assert_eq!(own.parent, None);
        assert_eq!(own, RunTrace::of("run_2", &json!({})));
        assert_ne!(own.trace_id, RunTrace::of("run_3", &json!({})).trace_id);
        // A step's span: one per attempt, in the run's trace.
        let first = trace.outbound("run_1", "2", 1);
        assert!(
            first.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{first}"
        );
        assert_ne!(first, trace.outbound("run_1", "2", 2));
        assert_eq!(first, trace.outbound("run_1", "2", 1));
        assert_eq!(valid_traceparent(&first).as_deref(), Some(first.as_str()));
    }
}
