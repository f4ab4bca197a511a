//! `#[kernel]`: kernels written in Rust syntax. (Issue 4; not implemented yet.)
//!
//! This crate exists so that the workspace layout is fixed from the start. It exports
//! no macro until the front end it needs (the shared AST and checker in `kgen-core`) is
//! done; see the issue tracker.
