//! What the text log writes of a value it did not choose itself.
//!
//! A log line's fields carry what tenants and the services they call
//! control: an error a service answered, a value a template rendered from
//! a webhook's body. Written as they are, a newline in one forges the next
//! line of the log (`\n2026-… INFO forged`) and an ANSI escape moves the
//! cursor or recolours the operator's terminal. [`EscapedFields`] is the
//! text format's only field formatter, so every field of every event and
//! span goes through [`escape_controls`]: the line's own newline, written
//! after the fields, is the only one left. The JSON format
//! (`TOK_LOG_FORMAT=json`) escapes by itself.

use std::borrow::Cow;
use std::fmt::Write as _;

use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};

/// `text` with every character that can end a line or steer a terminal
/// written as an escape a reader sees: `\n`, `\r`, `\t`, `\x1b` for the
/// other C0 controls and DEL, `\u{9b}` for the C1 controls, the Unicode
/// line and paragraph separators and the bidirectional overrides (which
/// reorder what a terminal shows). Borrowed when there is none.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        // Line and paragraph separators: a new line to some viewers.
        | '\u{2028}' | '\u{2029}'
        // Bidirectional embeddings, overrides and isolates.
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}')
}

/// The text format's field formatter: the default one's `name=value`
/// layout, with every field passed through [`escape_controls`]. (Field
/// names lose their italics on a terminal: the default formatter paints
/// them only into the terminal's own writer.)
#[derive(Debug, Default)]
pub struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let mut plain = String::new();
        DefaultFields::new().format_fields(Writer::new(&mut plain), fields)?;
        writer.write_str(&escape_controls(&plain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_everything_else_kept() {
        assert!(matches!(
            escape_controls("plain, ünïcode €"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escape_controls("a\n2026-01-01T00:00:00Z  INFO forged\r\t"),
            "a\\n2026-01-01T00:00:00Z  INFO forged\\r\\t"
        );
        assert_eq!(escape_controls("\u{1b}[31mred\u{7}"), "\\x1b[31mred\\x07");
        assert_eq!(escape_controls("\u{9b}2J\u{7f}"), "\\u{9b}2J\\x7f");
        assert_eq!(
            escape_controls("x\u{2028}y\u{202e}z\u{2066}"),
            "x\\u{2028}y\\u{202e}z\\u{2066}"
        );
    }
}
