//! kgen: a tile-kernel compiler for NVIDIA GPUs, written in Rust.
//!
//! This facade re-exports the compiler ([`core`]), the runtime ([`runtime`]) and the
//! `#[kernel]` macro.

// `#[kgen::kernel]` expands to `::kgen::...` paths; this makes them resolve inside this
// crate too (the GPT's small kernels in `gpt/kernels.rs`).
extern crate self as kgen;

pub use kgen_core as core;
pub use kgen_macros::{kernel, kernels};
pub use kgen_runtime as runtime;

pub mod bench;
pub mod bundled;
pub mod cases;
pub mod checks;
pub mod gpt;
pub mod ops;
pub mod optim;
pub mod rng;
pub mod train;
