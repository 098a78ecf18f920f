//! The LLM-API vocabulary of token quotas (contract section 9), pure and
//! beside the layers: what a request reserves ([`reserve`], its prompt
//! measured in bytes or in its model's tokens by [`tokenizer`]) and the usage
//! its response reports ([`usage`]), from the bytes alone. Configuration,
//! admission and the proxy call them; nothing here does I/O.

mod event_stream;
mod json;
pub mod price;
pub mod reserve;
pub mod tokenizer;
pub mod usage;
