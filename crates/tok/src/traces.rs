//! OpenTelemetry export (OTLP over HTTP, protobuf), on only when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set: then the SDK reads the standard variables itself
//! (`OTEL_SERVICE_NAME`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*`, …),
//! the run and step spans of `tok_engine::traces` are exported, and so are
//! the process's own `tracing` spans of tok's crates (the work of a step as
//! it happens) through `tracing-opentelemetry`. Without the variable no
//! exporter is built and nothing leaves the process.
//!
//! The collector is the platform's, named by its operator, not a tenant's
//! service: its calls do not go through the outbound guard.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

/// The installed tracer provider; flushed and shut down by [`Traces::shutdown`].
pub struct Traces(Option<SdkTracerProvider>);

/// Whether the environment asks for an export.
fn wanted() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty()))
}

/// The exporter the environment asks for, installed as the global tracer
/// provider, and the layer that sends tok's `tracing` spans to it; `None`
/// without an endpoint.
pub fn from_env<S>() -> anyhow::Result<(Option<impl Layer<S>>, Traces)>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    if !wanted() {
        return Ok((None, Traces(None)));
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| {
            anyhow::anyhow!(
                "OTEL_EXPORTER_OTLP_ENDPOINT: the OTLP exporter could not be built: {e}"
            )
        })?;
    // OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) wins;
    // `tok` otherwise.
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let mut resource = Resource::builder();
    if !named {
        resource = resource.with_service_name("tok");
    }
    let provider = SdkTracerProvider::builder()
        .with_id_generator(tok_engine::traces::ChosenIds::default())
        .with_resource(resource.build())
        .with_batch_exporter(exporter)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    tok_engine::traces::enable();
    let tracer: SdkTracer = provider.tracer("tok");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(
            Targets::new()
                .with_target("tok_engine", tracing::Level::INFO)
                .with_target("tok_server", tracing::Level::INFO),
        );
    Ok((Some(layer), Traces(Some(provider))))
}

impl Traces {
    /// Sends what is still batched (at the end of `tok serve`).
    pub fn shutdown(self) {
        if let Some(provider) = self.0
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "the last spans could not be exported");
        }
    }
}
