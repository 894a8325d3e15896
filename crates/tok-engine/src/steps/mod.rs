//! Built-in step types that run outside the record transaction.

pub(crate) mod pause;
