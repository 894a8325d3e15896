//! Text and JSON measured against a byte budget, without ever holding more
//! than the budget.
//!
//! Whatever a tenant or a webhook body controls and tok writes out — a
//! rendered template, a log line, an error message — is bounded here in
//! bytes: a [`Capped`] writer stops serializing a value as soon as it passes
//! its budget, so a value of 100 MB costs at most the budget to find out it
//! does not fit. Templates use it while rendering
//! ([`crate::template`]); the decider uses [`bound_log`] and [`cut`] on
//! every step record it writes, so no step stores more than
//! [`MAX_STEP_LOG_BYTES`] of log lines or an error longer than
//! [`MAX_ERROR_BYTES`]. The limits and why they are what they are:
//! [`crate::limits`] and docs/security.md, "Rendering budgets".

use std::borrow::Cow;
use std::io;

use serde_json::Value;

use crate::limits::{MAX_ERROR_BYTES, MAX_LOG_LINE_BYTES, MAX_STEP_LOG_BYTES};

/// A writer that keeps (or only counts) what is written to it until it
/// passes `cap` bytes, then fails: serializing into it costs at most `cap`
/// bytes of memory and about as much work. What it keeps of the write that
/// passed the cap is the part that fit.
pub(crate) struct Capped<'a> {
    out: Option<&'a mut Vec<u8>>,
    /// Bytes written so far, the refused write included.
    pub(crate) written: usize,
    cap: usize,
}

impl<'a> Capped<'a> {
    /// Appends to `out`, at most `cap` bytes.
    pub(crate) fn into(out: &'a mut Vec<u8>, cap: usize) -> Self {
        Self {
            out: Some(out),
            written: 0,
            cap,
        }
    }

    /// Counts only.
    pub(crate) fn counting(cap: usize) -> Self {
        Self {
            out: None,
            written: 0,
            cap,
        }
    }

    /// Serializes `v` as compact JSON: `Ok` with its size, or `Err` with
    /// the bytes reached when it passed the cap (the first `cap` bytes stay
    /// appended).
    pub(crate) fn json(mut self, v: &Value) -> Result<usize, usize> {
        match serde_json::to_writer(&mut self, v) {
            Ok(()) => Ok(self.written),
            Err(_) => Err(self.written),
        }
    }
}

impl io::Write for Capped<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = self.cap.saturating_sub(self.written);
        self.written = self.written.saturating_add(buf.len());
        if let Some(out) = self.out.as_mut() {
            out.extend_from_slice(&buf[..buf.len().min(room)]);
        }
        if self.written > self.cap {
            return Err(io::Error::other("past the byte budget"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The size of `v` as compact JSON, or `Err` with the bytes reached when
/// measuring passed `max` (the work stops there).
pub fn json_size_within(v: &Value, max: usize) -> Result<usize, usize> {
    Capped::counting(max).json(v)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    &s[..at]
}

/// `s` as it is when it has at most `max` bytes; otherwise its beginning,
/// cut at a character boundary, with a marker saying how long it was, all
/// within `max` bytes (`max` of at least 64).
pub fn cut(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let marker = format!("… [cut: {} bytes in all]", s.len());
    let keep = prefix(s, max.saturating_sub(marker.len()));
    Cow::Owned(format!("{keep}{marker}"))
}

/// `v` as a log line shows it: compact JSON (a string in quotes), at most
/// `max` bytes of it, then a marker when it was longer. Costs at most `max`
/// bytes whatever the size of `v`.
pub fn preview(v: &Value, max: usize) -> String {
    let mut out = Vec::with_capacity(max.min(256));
    let fitted = Capped::into(&mut out, max).json(v);
    let text = String::from_utf8_lossy(&out);
    match fitted {
        Ok(_) => text.into_owned(),
        Err(_) => {
            let shown = prefix(&text, max);
            match v {
                Value::String(s) => format!("{shown}…\" [cut: {} bytes in all]", s.len()),
                _ => format!("{shown}… [cut: longer than {max} bytes]"),
            }
        }
    }
}

/// Bounds a step's log lines: each at most [`MAX_LOG_LINE_BYTES`] (cut with
/// a marker), and all of them at most [`MAX_STEP_LOG_BYTES`]. When they do
/// not all fit, the first lines that fit are kept, then one line saying how
/// many were left out, then the last line (a condition's result, a
/// failure's reason).
pub fn bound_log(lines: &mut Vec<String>) {
    for line in lines.iter_mut() {
        if line.len() > MAX_LOG_LINE_BYTES {
            *line = cut(line, MAX_LOG_LINE_BYTES).into_owned();
        }
    }
    let total: usize = lines.iter().map(String::len).sum();
    if total <= MAX_STEP_LOG_BYTES {
        return;
    }
    let Some(last) = lines.pop() else {
        return;
    };
    // Room for the marker line and the last line.
    let room = MAX_STEP_LOG_BYTES.saturating_sub(last.len() + 128);
    let mut used = 0;
    let kept = lines
        .iter()
        .take_while(|line| {
            used += line.len();
            used <= room
        })
        .count();
    let left_out = lines.len() - kept;
    lines.truncate(kept);
    lines.push(format!(
        "… {left_out} log lines left out: a step keeps at most {MAX_STEP_LOG_BYTES} bytes of log"
    ));
    lines.push(last);
}

/// `error` cut to [`MAX_ERROR_BYTES`] with a marker, in place.
pub fn bound_error(error: &mut String) {
    if error.len() > MAX_ERROR_BYTES {
        *error = cut(error, MAX_ERROR_BYTES).into_owned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sizes_are_measured_up_to_the_budget_only() {
        let v = json!({"a": [1, 2, "x"]});
        let size = v.to_string().len();
        assert_eq!(json_size_within(&v, size), Ok(size));
        let reached = json_size_within(&v, size - 1).unwrap_err();
        assert!(reached > size - 1 && reached <= size, "{reached}");
        // A large value stops being measured right after the budget.
        let big = json!("a".repeat(1_000_000));
        let reached = json_size_within(&big, 100).unwrap_err();
        assert!(reached > 100, "{reached}");
    }

    #[test]
    fn a_cut_keeps_the_beginning_within_the_budget_and_says_how_long_it_was() {
        assert_eq!(cut("short", 64), "short");
        let long = "é".repeat(1000);
        let cut = cut(&long, 100);
        assert!(cut.len() <= 100, "{}", cut.len());
        assert!(cut.starts_with("éé") && cut.ends_with("… [cut: 2000 bytes in all]"));
    }

    #[test]
    fn a_preview_shows_json_cut_short_with_a_marker() {
        assert_eq!(preview(&json!("abc"), 100), "\"abc\"");
        assert_eq!(preview(&json!({"a": 1}), 100), "{\"a\":1}");
        let shown = preview(&json!("x".repeat(100_000)), 20);
        assert_eq!(
            shown,
            format!("\"{}…\" [cut: 100000 bytes in all]", "x".repeat(19))
        );
        let shown = preview(&json!([1, 2, 3, 4, 5, 6, 7, 8, 9]), 8);
        assert_eq!(shown, "[1,2,3,4… [cut: longer than 8 bytes]");
    }

    #[test]
    fn a_long_log_keeps_its_first_lines_and_its_last() {
        let mut lines: Vec<String> = (0..100)
            .map(|i| format!("{i}:{}", "a".repeat(2000)))
            .collect();
        lines.push("the result".into());
        bound_log(&mut lines);
        let total: usize = lines.iter().map(String::len).sum();
        assert!(total <= MAX_STEP_LOG_BYTES, "{total}");
        assert_eq!(lines.last().unwrap(), "the result");
        assert!(lines[0].starts_with("0:"));
        let marker = &lines[lines.len() - 2];
        assert!(marker.contains("log lines left out"), "{marker}");

        let mut one = vec!["x".repeat(MAX_LOG_LINE_BYTES * 3)];
        bound_log(&mut one);
        assert!(one[0].len() <= MAX_LOG_LINE_BYTES && one[0].contains("[cut: "));

        let mut small = vec!["a".to_owned(), "b".to_owned()];
        bound_log(&mut small);
        assert_eq!(small, ["a", "b"]);
    }
}
