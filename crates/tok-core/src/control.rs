//! The control steps: the step types tok-core decides by itself, from the
//! scope and the time, with no handler of the engine's registry — the
//! built-in steps ([`crate::builtin`]), the waits ([`crate::waits`],
//! [`crate::condition_wait`], [`crate::children`]), the fan-outs
//! ([`crate::parallel`], [`crate::for_each`]) and [`crate::repeat`]. The
//! decider (`advance`) runs them; validation knows them without asking
//! the registry. Both sit above this module and import it.

use crate::builtin;
use crate::children::WAIT_FOR_RUNS;
use crate::condition_wait::WAIT_FOR_CONDITION;
use crate::for_each::FOR_EACH;
use crate::parallel::PARALLEL;
use crate::repeat::REPEAT;
use crate::waits::WAIT_FOR_EVENT;

/// Step types the decider runs itself: [`builtin::INTERNAL_TYPES`],
/// [`WAIT_FOR_EVENT`], [`WAIT_FOR_CONDITION`], [`WAIT_FOR_RUNS`],
/// [`PARALLEL`], [`FOR_EACH`] and [`REPEAT`].
pub fn is_control(kind: &str) -> bool {
    builtin::is_internal(kind)
        || [
            WAIT_FOR_EVENT,
            WAIT_FOR_CONDITION,
            WAIT_FOR_RUNS,
            PARALLEL,
            FOR_EACH,
            REPEAT,
        ]
        .contains(&kind)
}
