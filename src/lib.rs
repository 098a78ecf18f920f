pub mod config;
pub mod identity;
pub mod limit;
pub mod proxy;
