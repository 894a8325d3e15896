//! Executing runs: the worker pool's slots and claims ([`pool`]), and the
//! runner that carries out one claim's transition ([`runner`]) with its
//! effects. A panic anywhere in a claim fails its step ([`panics`]).

mod effects;
mod panics;
pub(crate) mod pool;
pub(crate) mod runner;
