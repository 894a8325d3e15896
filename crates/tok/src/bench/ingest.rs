//! `ingest`: how many webhooks the server accepts per second (each 202 only
//! after its inbox row committed), and the latency of a webhook at a fixed
//! offered rate.
//!
//! The source has no automation, so the dispatcher only marks the events
//! dispatched: the figure is the webhook path, not the runs behind it.
//! Throughput is closed loop (`--senders` senders, each sending its next
//! webhook when the last was answered); latency is open loop (sent on a
//! schedule whatever the answers, each measured from when it was due), so a
//! stalled server shows in the latency instead of slowing the sender.

use serde_json::json;

use super::api::{self, Sent};
use super::report::{Figure, Target, ms, percentile};
use super::sys::CpuMeter;
use super::{Bench, Server};

const NAME: &str = "ingest";

pub(crate) async fn run(bench: &Bench) -> anyhow::Result<Vec<Figure>> {
    let mut server = bench.server(NAME, None).await?;
    let measured = measure(bench, &mut server).await;
    bench.release(NAME, server).await;
    measured
}

/// p50, p99 and max of the accepted requests' latencies, in ms.
fn latencies(sent: &mut Sent) -> (f64, f64, f64) {
    sent.latencies.sort();
    let l = &sent.latencies;
    (
        ms(percentile(l, 50.0)),
        ms(percentile(l, 99.0)),
        ms(l.last().copied().unwrap_or_default()),
    )
}

async fn measure(bench: &Bench, server: &mut Server) -> anyhow::Result<Vec<Figure>> {
    let api = &server.api.clone();
    let tenant = api.tenant(&format!("bench ingest {}", bench.nonce)).await?;
    let source = api.source(&tenant, "ingest").await?;
    let progress = (&bench.progress, NAME);
    let senders = bench.options().senders;

    // Warm up: connections opened, caches filled.
    let warm = format!("{}-warm", bench.nonce);
    api::send_closed_loop(
        &bench.http,
        &source.url,
        &warm,
        500,
        senders,
        false,
        progress,
    )
    .await;

    let count = bench.scaled(20_000, 500);
    bench.progress.line(
        NAME,
        &format!("throughput: {count} webhooks from {senders} senders"),
    );
    let cpu = CpuMeter::start(&server.pids());
    let mut sent = api::send_closed_loop(
        &bench.http,
        &source.url,
        &format!("{}-max", bench.nonce),
        count,
        senders,
        false,
        progress,
    )
    .await;
    let cpu_max = cpu.finish();
    server.check_alive()?;
    let secs = sent.elapsed.as_secs_f64().max(1e-3);
    let rate = sent.accepted as f64 / secs;
    let (p50, p99, max) = latencies(&mut sent);
    let throughput = Figure::new(NAME, rate.round(), "req/s")
        .target(Target::AtLeast(10_000.0))
        .notes(format!(
            "{} of {count} accepted in {secs:.1} s by {senders} senders; {}; p50 {p50} ms, p99 {p99} ms{}",
            sent.accepted,
            sent.error_text(),
            cpu_max.as_ref().map(|c| format!("; {c}")).unwrap_or_default(),
        ))
        .details(json!({
            "requests": count, "accepted": sent.accepted, "refused": sent.refused,
            "seconds": secs, "senders": senders,
            "p50_ms": p50, "p99_ms": p99, "max_ms": max, "cpu": cpu_max,
        }));

    let rate = f64::from(bench.options().rate);
    let seconds = (10.0 * bench.options().scale).max(2.0);
    let count = (rate * seconds).round() as usize;
    bench.progress.line(
        NAME,
        &format!("latency: {rate:.0} webhooks/s offered for {seconds:.0} s (open loop)"),
    );
    let cpu = CpuMeter::start(&server.pids());
    let mut sent = api::send_open_loop(
        &bench.http,
        &source.url,
        &format!("{}-rate", bench.nonce),
        count,
        rate,
        false,
        progress,
    )
    .await;
    let cpu_rate = cpu.finish();
    server.check_alive()?;
    let achieved = sent.accepted as f64 / sent.elapsed.as_secs_f64().max(1e-3);
    let (p50, p99, max) = latencies(&mut sent);
    let latency = Figure::new("ingest-p99", p99, "ms")
        .target(Target::AtMost(10.0))
        .notes(format!(
            "at {rate:.0}/s offered for {seconds:.0} s, from each request's scheduled time: p50 {p50} ms, max {max} ms; {} of {count} accepted ({achieved:.0}/s); {}{}",
            sent.accepted,
            sent.error_text(),
            cpu_rate.as_ref().map(|c| format!("; {c}")).unwrap_or_default(),
        ))
        .details(json!({
            "offered_rate": rate, "seconds": seconds, "requests": count,
            "accepted": sent.accepted, "refused": sent.refused, "achieved_rate": achieved,
            "p50_ms": p50, "p99_ms": p99, "max_ms": max, "cpu": cpu_rate,
        }));
    Ok(vec![throughput, latency])
}
