//! What a bench run hands back: figures with their targets, the table
//! printed at the end, the JSON file, and the progress lines on stderr
//! while it runs.

use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The bound a figure should stay within (its target in docs/performance.md,
/// "Running it").
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn met(self, value: f64) -> bool {
        match self {
            Target::AtLeast(t) => value >= t,
            Target::AtMost(t) => value <= t,
        }
    }

    fn describe(self) -> String {
        match self {
            Target::AtLeast(t) => format!(">= {}", number(t)),
            Target::AtMost(t) => format!("<= {}", number(t)),
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub(crate) name: String,
    /// `None` when the figure could not be measured; `notes` says why.
    pub(crate) value: Option<f64>,
    /// Shown instead of the number (a value known by construction).
    pub(crate) shown: Option<String>,
    pub(crate) unit: &'static str,
    pub(crate) target: Option<Target>,
    /// Overrides the comparison with the target (known by construction).
    pub(crate) met: Option<bool>,
    pub(crate) notes: String,
    /// The raw numbers behind the figure, for the JSON file.
    pub(crate) details: Value,
}

impl Figure {
    pub(crate) fn new(name: &str, value: f64, unit: &'static str) -> Self {
        Self {
            name: name.to_owned(),
            value: Some(value),
            shown: None,
            unit,
            target: None,
            met: None,
            notes: String::new(),
            details: Value::Null,
        }
    }

    /// A figure that could not be measured, and why.
    pub(crate) fn missing(name: &str, unit: &'static str, why: impl Into<String>) -> Self {
        Self {
            value: None,
            notes: why.into(),
            ..Self::new(name, 0.0, unit)
        }
    }

    pub(crate) fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }

    pub(crate) fn notes(mut self, notes: impl Into<String>) -> Self {
        self.notes = notes.into();
        self
    }

    pub(crate) fn details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// Whether the figure meets its target; `None` without a target or a value.
    pub(crate) fn is_met(&self) -> Option<bool> {
        self.met
            .or_else(|| Some(self.target?.met(self.value?)))
            .filter(|_| self.target.is_some())
    }

    fn value_text(&self) -> String {
        match (&self.shown, self.value) {
            (Some(shown), _) => shown.clone(),
            (None, Some(v)) => number(v),
            (None, None) => "n/a".into(),
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "value": self.value,
            "shown": self.shown,
            "unit": self.unit,
            "target": self.target.map(Target::describe),
            "met": self.is_met(),
            "notes": self.notes,
            "details": self.details,
        })
    }
}

/// A number as a reader wants it: no decimals when large, three significant
/// digits when small.
pub(crate) fn number(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Milliseconds with two decimals.
pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 100_000.0).round() / 100.0
}

/// The table: one row per figure, a figure that misses its target says MISS.
pub(crate) fn table(figures: &[Figure]) -> String {
    let header = ["figure", "value", "unit", "target", "met", "notes"];
    let rows: Vec<[String; 6]> = figures
        .iter()
        .map(|f| {
            [
                f.name.clone(),
                f.value_text(),
                f.unit.to_owned(),
                f.target.map(Target::describe).unwrap_or_default(),
                match f.is_met() {
                    Some(true) => "yes".into(),
                    Some(false) => "MISS".into(),
                    None => String::new(),
                },
                f.notes.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row).take(5) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 6]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i == 5 {
                out.push_str(cell);
            } else if i == 1 {
                out.push_str(&format!("{cell:>w$}  ", w = widths[i]));
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(header);
    out.push_str(&line(
        widths.map(|w| "-".repeat(w)).each_ref().map(|s| &s[..]),
    ));
    for row in &rows {
        out.push_str(&line(row.each_ref().map(|s| &s[..])));
    }
    out
}

/// Percentile by nearest rank over sorted samples.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Progress on stderr: one line rewritten in place on a terminal, a line
/// every few seconds otherwise (a log file should not fill with updates).
pub(crate) struct Progress {
    tty: bool,
    last: Mutex<Option<Instant>>,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            tty: std::io::stderr().is_terminal(),
            last: Mutex::new(None),
        }
    }

    /// A passing state: how far a load has got.
    pub(crate) fn update(&self, figure: &str, message: &str) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if self.tty {
            eprint!("\r\x1b[K[{figure}] {message}");
        } else if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            eprintln!("[{figure}] {message}");
            *last = Some(Instant::now());
        }
    }

    /// A line that stays: a phase began or ended.
    pub(crate) fn line(&self, figure: &str, message: &str) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if self.tty {
            eprint!("\r\x1b[K");
        }
        eprintln!("[{figure}] {message}");
        *last = Some(Instant::now());
    }
}
