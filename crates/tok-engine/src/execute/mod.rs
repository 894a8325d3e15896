//! Executing runs: the worker pool's slots and claims ([`pool`]), and the
//! runner that carries out one claim's transition ([`runner`]) with its
//! effects.

mod effects;
pub(crate) mod pool;
mod runner;
