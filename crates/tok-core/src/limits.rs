//! Hard limits of the runtime, shared by validation at save (tree size,
//! definition size, loop cap) and by the engine at run time (actions per run,
//! output size, depth). They exist so one tenant's automation cannot exhaust a
//! node; raising one is a capacity decision, not a bug fix. A tenant's own
//! quotas, which the platform admin sets, are [`crate::quotas::TenantLimits`].

/// Steps in one automation tree, nested steps included (checked at save).
pub const MAX_STEPS: usize = 50;
/// Steps executed by one run, loop iterations included; the run fails when it
/// would exceed this rather than silently stopping a loop.
pub const MAX_ACTIONS: u32 = 1000;
/// Serialized size of one step's outputs.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// Bytes one rendered template may reach: a string with its placeholders
/// replaced, or the JSON of the value a lone placeholder (`"{{_body}}"`)
/// stands for. It is the size of the largest webhook body
/// (`tok_server::MAX_WEBHOOK_BYTES`), so passing a whole body on
/// (`{{_body}}`) always fits, while a template that repeats a big field
/// (`{{_body.b}}` a thousand times) stops here instead of taking the
/// process's memory. Rendering is stopped as it passes the budget: nothing
/// past it is ever allocated. See docs/security.md, "Rendering budgets".
pub const MAX_RENDERED_VALUE_BYTES: usize = 256 * 1024;
/// Bytes of a step's whole rendered config, all its rendered values
/// together (literal ones too): twice a value, so a step can pass a whole
/// body on and as much again in its other fields, while a config of many
/// lone placeholders (`{"a": "{{_body}}", "b": "{{_body}}", …}`) cannot
/// multiply a body. A step that passes it, or [`MAX_RENDERED_VALUE_BYTES`],
/// fails with `render_budget_exceeded`, naming the config's path.
pub const MAX_RENDERED_CONFIG_BYTES: usize = 512 * 1024;
/// Bytes of one step log line. A `flow/log` whose message renders past it
/// fails (`render_budget_exceeded`); any other line longer than this (a
/// handler's, one tok writes) is cut with a marker. 8 KiB is a screen of
/// text: a log line is for a person to read, a bigger value belongs in an
/// output.
pub const MAX_LOG_LINE_BYTES: usize = 8 * 1024;
/// Bytes of all log lines of one step record: past it the first lines that
/// fit are kept, then a line saying how many were left out, then the last
/// line. The size of a step's outputs ([`MAX_OUTPUT_BYTES`]): a condition of
/// a hundred rules keeps a line for each, a thousand do not.
pub const MAX_STEP_LOG_BYTES: usize = 64 * 1024;
/// Bytes of one value (the field's, the rule's) shown in a condition's log
/// line; a longer one is shown cut short, with a marker, and the condition
/// is evaluated on the whole value all the same.
pub const MAX_LOGGED_VALUE_BYTES: usize = 256;
/// Bytes of a step's error message and of a run's, which may quote what a
/// tenant sent: past it, cut with a marker, like a log line.
pub const MAX_ERROR_BYTES: usize = MAX_LOG_LINE_BYTES;
/// Serialized size of a run's context (its state: the event, the params
/// and every step's outputs); the step whose outputs would pass it fails
/// with `state_too_large`. An automation may set a lower one
/// (`settings.limits.maxStateBytes`).
pub const MAX_STATE_BYTES: usize = 4 * 1024 * 1024;
/// How deep runs may start other runs (through events or child workflows).
pub const MAX_DEPTH: u32 = 5;
/// How deep child runs nest (`run_workflow`): a run's depth plus one may be
/// at most this; deeper, the starting step fails with `nesting_depth_exceeded`.
pub const MAX_NESTING_DEPTH: i64 = 3;
/// Size of a definition's JSON as sent to the API.
pub const MAX_DEFINITION_BYTES: usize = 256 * 1024;
/// Longest `flow/pause`; a pause holds its worker slot, so it must stay short.
pub const MAX_PAUSE_SECS: f64 = 60.0;
/// Items one `loop` step may iterate over; also the ceiling of its `maxItems`.
pub const MAX_LOOP_ITEMS: usize = 1000;
/// Most items of one `for_each` step that run at once (`config.concurrency`).
pub const MAX_FOR_EACH_CONCURRENCY: usize = 50;
/// Keys one `wait_for_event` may wait on (`config.keys`): each parks as a
/// wait row of its own.
pub const MAX_WAIT_KEYS: usize = 20;
/// Shortest `every` of a `wait_for_condition`: each check is a claim of
/// the run's job (a change of the ticket is checked at once anyway).
pub const MIN_CONDITION_EVERY_MS: i64 = 1000;
/// Ceiling of any retry policy's `max_attempts`.
pub const MAX_ATTEMPTS_CAP: u32 = 10;

/// The window `settings.limits.startsPerMinute` counts starts in.
pub const START_WINDOW_MS: i64 = 60_000;

/// Whether an automation limited to `per_minute` starts may start once
/// more at `now`, given the creation times of its latest starts (Unix ms,
/// newest first; refused runs are no starts): `Ok`, or `Err` with the
/// milliseconds until a start frees up (the oldest of the last
/// `per_minute` starts leaves the sliding minute).
pub fn start_allowed(recent: &[i64], per_minute: u32, now: i64) -> Result<(), i64> {
    let in_window: Vec<i64> = recent
        .iter()
        .copied()
        .filter(|at| *at > now - START_WINDOW_MS)
        .collect();
    let Some(last) = (per_minute as usize).checked_sub(1) else {
        return Err(START_WINDOW_MS);
    };
    match in_window.get(last) {
        Some(oldest) => Err((oldest + START_WINDOW_MS - now).max(1)),
        None => Ok(()),
    }
}

/// The error of a run an event would have started over its limit.
pub fn start_rate_exceeded(per_minute: u32) -> String {
    format!(
        "start_rate_exceeded: the automation may start {per_minute} runs per minute \
         (settings.limits.startsPerMinute of the automation, or else of its tenant); \
         this one was not started"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_count_in_a_sliding_minute() {
        let now = 1_000_000;
        assert_eq!(start_allowed(&[], 2, now), Ok(()));
        assert_eq!(start_allowed(&[now - 10], 2, now), Ok(()));
        // The second start of the window was 20 s ago: it leaves in 40 s.
        assert_eq!(
            start_allowed(&[now - 10, now - 20_000], 2, now),
            Err(40_000)
        );
        // Starts older than a minute do not count.
        assert_eq!(start_allowed(&[now - 10, now - 60_000], 2, now), Ok(()));
        assert_eq!(start_allowed(&[now], 1, now), Err(60_000));
    }
}
