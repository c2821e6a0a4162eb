#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod batch;
mod checkpoint;
mod cluster;
pub mod config;
mod layout;
mod meta;
mod node;
mod reply;
mod scan;
mod scripts;
mod slots;
mod store;
pub mod update;
mod variable;

pub use config::RedisConfig;
pub use variable::RedisVariable;
