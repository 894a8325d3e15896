//! What can go wrong running a script, worded for the tenant who wrote it.
//!
//! Every variant but [`ScriptError::Sandbox`] is the script's own doing:
//! running it again gives the same result, so the engine treats those as
//! terminal. `Sandbox` means tok could not start or talk to a sandbox
//! process at all, which says nothing about the script.

use std::time::Duration;

use thiserror::Error;

pub type Result<T, E = ScriptError> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScriptError {
    /// The script threw, did not compile, or does not define `main`.
    #[error("{}", with_line(message, *line))]
    Script {
        /// The error as JavaScript prints it (`TypeError: x is undefined`).
        message: String,
        /// Line in the script's source, when known.
        line: Option<u32>,
    },
    /// The script was still running at its deadline. Either the interrupt
    /// handler stopped it, or (inside one long builtin, which the handler
    /// cannot interrupt) its sandbox process was killed.
    #[error("script ran longer than {} ms and was stopped", limit.as_millis())]
    Timeout { limit: Duration },
    /// The script reached its memory limit.
    #[error("script used more than {} MiB of memory and was stopped", limit_bytes / (1024 * 1024))]
    Memory { limit_bytes: usize },
    /// `main` returned something other than a JSON object.
    #[error("{0}")]
    InvalidOutput(String),
    /// The sandbox process died while running the script (QuickJS aborted,
    /// most likely out of memory in a place that cannot throw).
    #[error("the script's sandbox process died while running it ({0}); the script was stopped")]
    Crashed(String),
    /// The request was refused before anything ran (a timeout outside the
    /// allowed range).
    #[error("{0}")]
    InvalidRequest(String),
    /// No sandbox process could be started or talked to. Not the script's
    /// fault; another attempt may succeed.
    #[error("script sandbox unavailable: {0}")]
    Sandbox(String),
}

impl ScriptError {
    /// Whether the script itself caused this failure, so that running it
    /// again would fail the same way. Only [`ScriptError::Sandbox`] is not.
    pub fn is_script_fault(&self) -> bool {
        !matches!(self, ScriptError::Sandbox(_))
    }

    /// The line in the script's source, for script errors that carry one.
    pub fn line(&self) -> Option<u32> {
        match self {
            ScriptError::Script { line, .. } => *line,
            _ => None,
        }
    }
}

fn with_line(message: &str, line: Option<u32>) -> String {
    match line {
        Some(line) => format!("script failed at line {line}: {message}"),
        None => format!("script failed: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_happened() {
        let e = ScriptError::Script {
            message: "Error: boom".into(),
            line: Some(3),
        };
        assert_eq!(e.to_string(), "script failed at line 3: Error: boom");
        assert_eq!(e.line(), Some(3));
        assert_eq!(
            ScriptError::Timeout {
                limit: Duration::from_millis(100)
            }
            .to_string(),
            "script ran longer than 100 ms and was stopped"
        );
        assert_eq!(
            ScriptError::Memory {
                limit_bytes: 32 << 20
            }
            .to_string(),
            "script used more than 32 MiB of memory and was stopped"
        );
        assert!(!ScriptError::Sandbox("x".into()).is_script_fault());
        assert!(ScriptError::Crashed("x".into()).is_script_fault());
    }
}
