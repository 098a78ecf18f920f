//! The limiter engine: rate-limit algorithms as pure decisions, the in-memory
//! store that applies them per key, and the all-or-nothing key stack.

pub mod params;

pub use params::{Algorithm, LeakyMode, NANOS_PER_SEC, Nanos, Rate};
