//! kgen: a tile-kernel compiler for NVIDIA GPUs, written in Rust.
//!
//! This facade re-exports the compiler ([`core`]), the runtime ([`runtime`]) and the
//! `#[kernel]` macro.

pub use kgen_core as core;
pub use kgen_macros::kernel;
pub use kgen_runtime as runtime;

pub mod bench;
pub mod bundled;
pub mod cases;
pub mod ops;
pub mod optim;
pub mod train;
