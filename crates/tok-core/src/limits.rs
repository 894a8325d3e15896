//! Hard limits of the runtime, shared by validation at save (tree size,
//! definition size, loop cap) and by the engine at run time (actions per run,
//! output size, depth). They exist so one tenant's automation cannot exhaust a
//! node; raising one is a capacity decision, not a bug fix.

/// Steps in one automation tree, nested steps included (checked at save).
pub const MAX_STEPS: usize = 50;
/// Steps executed by one run, loop iterations included; the run fails when it
/// would exceed this rather than silently stopping a loop.
pub const MAX_ACTIONS: u32 = 1000;
/// Serialized size of one step's outputs.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
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
/// Ceiling of any retry policy's `max_attempts`.
pub const MAX_ATTEMPTS_CAP: u32 = 10;
