//! The sandbox child: the process that actually runs tenant JavaScript.
//!
//! [`sandbox_main`] reads one [`Request`] per line from stdin, evaluates it
//! with QuickJS and writes one [`Response`] per line to stdout, until stdin
//! closes. The process holds one QuickJS runtime with a stack limit, a heap
//! limit (set per script) and an interrupt handler that stops the script at
//! its deadline. Contexts hold no `std`/`os` modules and no host functions
//! but a `console.log` whose lines are captured and returned.
//!
//! The interrupt handler only runs between bytecode instructions, so one
//! long builtin call (`new Array(1e9).join()`) cannot be stopped from in
//! here; that is why this is a separate process, which the pool kills when
//! it overruns (see [`crate::pool`]). Everything in this module assumes it
//! may be killed at any instruction.
//!
//! Each cache key (one tenant's source) gets its own context with `main`
//! compiled once, so tenants never share globals; a context is dropped
//! after `recycle_after` runs, after a timeout or a memory error, and when
//! it is the least recently used of [`MAX_CONTEXTS`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{self, BufRead, Write};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rquickjs::context::EvalOptions;
use rquickjs::function::Rest;
use rquickjs::prelude::Coerced;
use rquickjs::{CatchResultExt, CaughtError, Context, Ctx, Function, Object, Persistent, Runtime};
use serde_json::{Map, Value};

use crate::protocol::{Failure, FailureKind, Outcome, Request, Response};

/// The line the child prints once it can take requests; the pool waits for
/// it, so a wrong program path fails at start and not on the first script.
pub(crate) const READY: &str = r#"{"ready":true}"#;

/// Native stack QuickJS may use. Deep recursion ends as a `RangeError`
/// long before the process's 8 MiB main-thread stack runs out.
const MAX_STACK_BYTES: usize = 1024 * 1024;
/// Compiled scripts kept per process; the least recently used goes first.
pub(crate) const MAX_CONTEXTS: usize = 16;
/// `console.log` lines kept per run, and characters kept per line.
const MAX_LOG_LINES: usize = 50;
const MAX_LOG_CHARS: usize = 500;
/// The name scripts get in stack traces, where their line numbers are read.
const FILE_NAME: &str = "script.js";

/// The child's entry point (`tok script-sandbox`): serves requests on
/// stdin/stdout until stdin closes, then exits. Never returns.
pub fn sandbox_main() -> ! {
    let stdin = io::stdin();
    let stdout = io::stdout();
    let code = match serve(stdin.lock(), stdout.lock()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tok script sandbox: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// A QuickJS runtime with the stack limit and the deadline's interrupt
/// handler; the heap limit is set per script.
fn new_runtime(
    deadline: &Rc<Cell<Option<Instant>>>,
    interrupted: &Rc<Cell<bool>>,
) -> io::Result<Runtime> {
    let runtime = Runtime::new().map_err(|e| io::Error::other(e.to_string()))?;
    runtime.set_max_stack_size(MAX_STACK_BYTES);
    let deadline = deadline.clone();
    let interrupted = interrupted.clone();
    runtime.set_interrupt_handler(Some(Box::new(move || {
        let over = deadline.get().is_some_and(|d| Instant::now() >= d);
        if over {
            interrupted.set(true);
        }
        over
    })));
    Ok(runtime)
}

/// Announces readiness, then answers each request line with one response
/// line.
pub(crate) fn serve(input: impl BufRead, mut output: impl Write) -> io::Result<()> {
    let mut sandbox = Sandbox::new()?;
    writeln!(output, "{READY}")?;
    output.flush()?;
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let response = match serde_json::from_str::<Request>(&line) {
            Ok(request) => sandbox.run(&request)?,
            Err(e) => Response {
                outcome: Outcome::Error(Failure {
                    kind: FailureKind::Protocol,
                    message: format!("unreadable request: {e}"),
                    line: None,
                }),
                logs: Vec::new(),
            },
        };
        serde_json::to_writer(&mut output, &response)?;
        output.write_all(b"\n")?;
        output.flush()?;
    }
    Ok(())
}

/// One compiled script: its own context, and `main` in it.
struct Entry {
    // Declared first so it is dropped before the context that owns it.
    main: Persistent<Function<'static>>,
    context: Context,
    uses: u32,
    last_used: u64,
}

/// What a run gathers from `console.log`.
#[derive(Default)]
struct Logs {
    lines: Vec<String>,
    dropped: usize,
}

impl Logs {
    fn push(&mut self, line: String) {
        if self.lines.len() >= MAX_LOG_LINES {
            self.dropped += 1;
            return;
        }
        let line = match line.char_indices().nth(MAX_LOG_CHARS) {
            Some((cut, _)) => format!("{}…", &line[..cut]),
            None => line,
        };
        self.lines.push(line);
    }

    fn take(&mut self) -> Vec<String> {
        let mut lines = std::mem::take(&mut self.lines);
        if self.dropped > 0 {
            lines.push(format!("… {} more lines not kept", self.dropped));
        }
        self.dropped = 0;
        lines
    }
}

/// A failure as caught inside a context, before it is classified.
struct Thrown {
    message: String,
    line: Option<u32>,
    out_of_memory: bool,
}

impl Thrown {
    fn plain(message: impl Into<String>) -> Self {
        Thrown {
            message: message.into(),
            line: None,
            out_of_memory: false,
        }
    }
}

/// Why a run produced no output, before the deadline flag is consulted.
enum RunError {
    Thrown(Thrown),
    InvalidOutput(String),
}

impl From<Thrown> for RunError {
    fn from(t: Thrown) -> Self {
        RunError::Thrown(t)
    }
}

/// The interpreter state of one sandbox process.
pub(crate) struct Sandbox {
    // Declared first: contexts and their functions go before the runtime.
    cache: HashMap<String, Entry>,
    runtime: Runtime,
    /// When the running script must stop; `None` between scripts.
    deadline: Rc<Cell<Option<Instant>>>,
    /// Set by the interrupt handler when it stopped a script.
    interrupted: Rc<Cell<bool>>,
    logs: Rc<RefCell<Logs>>,
    clock: u64,
}

impl Sandbox {
    pub(crate) fn new() -> io::Result<Self> {
        let deadline: Rc<Cell<Option<Instant>>> = Rc::default();
        let interrupted: Rc<Cell<bool>> = Rc::default();
        Ok(Sandbox {
            cache: HashMap::new(),
            runtime: new_runtime(&deadline, &interrupted)?,
            deadline,
            interrupted,
            logs: Rc::default(),
            clock: 0,
        })
    }

    /// Runs one request to its end: an output, or a classified failure.
    /// Fails only when no new QuickJS runtime can be made, and then the
    /// process should end.
    pub(crate) fn run(&mut self, request: &Request) -> io::Result<Response> {
        self.logs.borrow_mut().take();
        self.interrupted.set(false);
        // The limit is the script's own budget on top of what the cached
        // contexts already hold; if those hold more than one budget, they
        // go first, so the process stays within two budgets.
        if self.heap_bytes() > request.memory_limit {
            self.clear();
        }
        self.runtime
            .set_memory_limit(self.heap_bytes() + request.memory_limit);
        self.deadline.set(Some(
            Instant::now() + Duration::from_millis(request.timeout_ms),
        ));
        let result = self.evaluate(request);
        self.deadline.set(None);
        let mut fresh_runtime = self.runtime.is_job_pending();
        let outcome = match result {
            Ok(output) => Outcome::Ok(output),
            Err(error) => {
                let failure = self.classify(error, request);
                fresh_runtime |= matches!(failure.kind, FailureKind::Timeout | FailureKind::Memory);
                Outcome::Error(failure)
            }
        };
        // After a timeout or a memory error, whatever the script left
        // half-built goes with the whole runtime. So do promise callbacks,
        // which never run (`main` is synchronous) and would otherwise pile
        // up in the runtime's job queue, keeping their contexts alive.
        if fresh_runtime {
            self.cache.clear();
            self.runtime = new_runtime(&self.deadline, &self.interrupted)?;
        }
        Ok(Response {
            outcome,
            logs: self.logs.borrow_mut().take(),
        })
    }

    fn heap_bytes(&self) -> usize {
        usize::try_from(self.runtime.memory_usage().malloc_size).unwrap_or(0)
    }

    /// Drops every cached context and collects what they held.
    fn clear(&mut self) {
        self.cache.clear();
        self.runtime.run_gc();
    }

    fn classify(&self, error: RunError, request: &Request) -> Failure {
        if self.interrupted.get() {
            return Failure {
                kind: FailureKind::Timeout,
                message: format!(
                    "script ran longer than {} ms and was stopped",
                    request.timeout_ms
                ),
                line: None,
            };
        }
        match error {
            RunError::Thrown(thrown) if thrown.out_of_memory => Failure {
                kind: FailureKind::Memory,
                message: format!(
                    "script used more than {} MiB of memory and was stopped",
                    request.memory_limit / (1024 * 1024)
                ),
                line: None,
            },
            RunError::Thrown(thrown) => Failure {
                kind: FailureKind::Script,
                message: thrown.message,
                line: thrown.line,
            },
            RunError::InvalidOutput(message) => Failure {
                kind: FailureKind::InvalidOutput,
                message,
                line: None,
            },
        }
    }

    fn evaluate(&mut self, request: &Request) -> Result<Map<String, Value>, RunError> {
        self.clock += 1;
        let stale = self
            .cache
            .get(&request.cache_key)
            .is_some_and(|e| e.uses >= request.recycle_after.max(1));
        if stale {
            self.cache.remove(&request.cache_key);
        }
        if !self.cache.contains_key(&request.cache_key) {
            if self.cache.len() >= MAX_CONTEXTS {
                self.evict_oldest();
            }
            let entry = self.compile(&request.source)?;
            self.cache.insert(request.cache_key.clone(), entry);
        }
        let Some(entry) = self.cache.get_mut(&request.cache_key) else {
            return Err(Thrown::plain("compiled script went missing from the cache").into());
        };
        entry.uses += 1;
        entry.last_used = self.clock;
        let main = entry.main.clone();
        entry.context.with(|ctx| {
            let main = main
                .restore(&ctx)
                .map_err(|e| Thrown::plain(e.to_string()))?;
            let input = ctx
                .json_parse(request.input.as_bytes())
                .catch(&ctx)
                .map_err(|e| thrown(&ctx, e))?;
            let result: rquickjs::Value = main
                .call((input,))
                .catch(&ctx)
                .map_err(|e| thrown(&ctx, e))?;
            output(&ctx, result, request.max_output_bytes)
        })
    }

    fn evict_oldest(&mut self) {
        if let Some(key) = self
            .cache
            .iter()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(k, _)| k.clone())
        {
            self.cache.remove(&key);
        }
    }

    /// A fresh context with `console` and the script's top level run once;
    /// `main` may be a function declaration or a `const`/`let` binding.
    fn compile(&self, source: &str) -> Result<Entry, RunError> {
        let context = Context::full(&self.runtime).map_err(|e| Thrown {
            out_of_memory: matches!(e, rquickjs::Error::Allocation),
            ..Thrown::plain(e.to_string())
        })?;
        let logs = self.logs.clone();
        let main = context.with(|ctx| -> Result<_, Thrown> {
            install_console(&ctx, logs)
                .catch(&ctx)
                .map_err(|e| thrown(&ctx, e))?;
            let mut options = EvalOptions::default();
            options.strict = false;
            options.filename = Some(FILE_NAME.to_owned());
            ctx.eval_with_options::<(), _>(source, options)
                .catch(&ctx)
                .map_err(|e| thrown(&ctx, e))?;
            let main: rquickjs::Value = ctx
                .eval("typeof main === 'function' ? main : undefined")
                .catch(&ctx)
                .map_err(|e| thrown(&ctx, e))?;
            match main.into_function() {
                Some(main) => Ok(Persistent::save(&ctx, main)),
                None => Err(Thrown::plain(
                    "the script must define `function main(input)` that returns an object",
                )),
            }
        })?;
        Ok(Entry {
            main,
            context,
            uses: 0,
            last_used: self.clock,
        })
    }
}

/// `console.log` (and `info`, `warn`, `error`) appending to the run's logs.
fn install_console(ctx: &Ctx<'_>, logs: Rc<RefCell<Logs>>) -> rquickjs::Result<()> {
    let console = Object::new(ctx.clone())?;
    let log = Function::new(ctx.clone(), move |args: Rest<Coerced<String>>| {
        let line: Vec<String> = args.0.into_iter().map(|a| a.0).collect();
        logs.borrow_mut().push(line.join(" "));
    })?;
    for name in ["log", "info", "warn", "error", "debug"] {
        console.set(name, log.clone())?;
    }
    ctx.globals().set("console", console)
}

/// Describes what a script threw: `Name: message` and the line of the
/// innermost frame in the script itself.
fn thrown<'js>(ctx: &Ctx<'js>, error: CaughtError<'js>) -> Thrown {
    match error {
        CaughtError::Exception(e) => {
            let name = e
                .get::<_, Option<Coerced<String>>>("name")
                .ok()
                .flatten()
                .map(|n| n.0)
                .unwrap_or_else(|| "Error".to_owned());
            let message = e.message().unwrap_or_default();
            let out_of_memory = name == "InternalError" && message == "out of memory";
            Thrown {
                message: if message.is_empty() {
                    name
                } else {
                    format!("{name}: {message}")
                },
                line: e.stack().as_deref().and_then(script_line),
                out_of_memory,
            }
        }
        // QuickJS throws `null` when it runs out of memory while building
        // the error itself.
        CaughtError::Value(v) if v.is_null() => Thrown {
            out_of_memory: true,
            ..Thrown::plain("out of memory")
        },
        CaughtError::Value(v) => {
            let shown = match v.as_string() {
                Some(s) => s.to_string().ok(),
                None => ctx
                    .json_stringify(v)
                    .ok()
                    .flatten()
                    .and_then(|s| s.to_string().ok()),
            };
            Thrown::plain(format!(
                "uncaught {}",
                shown.unwrap_or_else(|| "value that cannot be shown".to_owned())
            ))
        }
        CaughtError::Error(e) => Thrown {
            out_of_memory: matches!(e, rquickjs::Error::Allocation),
            ..Thrown::plain(e.to_string())
        },
    }
}

/// The line of the first stack frame in the script (`at main (script.js:3:11)`).
fn script_line(stack: &str) -> Option<u32> {
    let marker = format!("{FILE_NAME}:");
    stack.lines().find_map(|frame| {
        let at = frame.find(&marker)? + marker.len();
        let digits: String = frame[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

/// Checks that `main` returned a JSON object and turns it into one.
fn output<'js>(
    ctx: &Ctx<'js>,
    value: rquickjs::Value<'js>,
    max_bytes: usize,
) -> Result<Map<String, Value>, RunError> {
    if let Some(what) = not_an_object(&value) {
        return Err(RunError::InvalidOutput(format!(
            "`main` must return an object, like `return {{ total: 3 }}`; it returned {what}"
        )));
    }
    let json = match ctx.json_stringify(value).catch(ctx) {
        Ok(Some(json)) => json.to_string().map_err(|e| {
            RunError::InvalidOutput(format!("the returned object is not valid text: {e}"))
        })?,
        Ok(None) => {
            return Err(RunError::InvalidOutput(
                "the returned object turns into nothing as JSON (its `toJSON` returns undefined)"
                    .into(),
            ));
        }
        Err(e) => {
            let thrown = thrown(ctx, e);
            if thrown.out_of_memory {
                return Err(RunError::Thrown(thrown));
            }
            return Err(RunError::InvalidOutput(format!(
                "the returned object cannot be turned into JSON: {}",
                thrown.message
            )));
        }
    };
    if json.len() > max_bytes {
        return Err(RunError::InvalidOutput(format!(
            "the returned object is {} bytes as JSON; at most {max_bytes} are allowed",
            json.len()
        )));
    }
    match serde_json::from_str::<Value>(&json) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(RunError::InvalidOutput(format!(
            "`main` must return an object; its `toJSON` turned it into {}",
            json_kind(&other)
        ))),
        Err(e) if e.to_string().contains("recursion limit") => Err(RunError::InvalidOutput(
            "the returned object is nested too deeply (more than 127 levels)".into(),
        )),
        Err(e) => Err(RunError::InvalidOutput(format!(
            "the returned object is not valid JSON: {e}"
        ))),
    }
}

/// What a non-object return value was, for the error message; `None` for
/// a plain object.
fn not_an_object(value: &rquickjs::Value<'_>) -> Option<String> {
    let shown = |v: &rquickjs::Value<'_>| -> String {
        let text = v.get::<Coerced<String>>().map(|s| s.0).unwrap_or_default();
        match text.char_indices().nth(40) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text,
        }
    };
    if value.is_undefined() {
        Some("nothing (undefined); is a `return` missing?".into())
    } else if value.is_null() {
        Some("null".into())
    } else if value.is_bool() {
        Some(format!("a boolean ({})", shown(value)))
    } else if value.is_number() {
        Some(format!("a number ({})", shown(value)))
    } else if value.is_big_int() {
        Some(format!("a BigInt ({})", shown(value)))
    } else if value.is_string() {
        Some(format!("a string ({:?})", shown(value)))
    } else if value.is_symbol() {
        Some("a symbol".into())
    } else if value.is_array() {
        Some("an array; wrap it, like `return { items: [...] }`".into())
    } else if value.is_function() {
        Some("a function".into())
    } else if value.is_promise() {
        Some("a Promise; `main` must not be `async`".into())
    } else if value.is_object() {
        None
    } else {
        Some(format!("a {}", value.type_name()))
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
