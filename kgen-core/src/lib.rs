//! kgen-core: the kgen compiler. Pure Rust; no CUDA needed.
//!
//! ```text
//!   .kg text ──front::parse──▶ ast::Module ◀── #[kernel] (kgen-macros)
//!                                  │
//!                         check::lower_kernel      types, shapes, broadcasting,
//!                                  │               constant evaluation, specialization
//!                                  ▼
//!                            ir::Function          SSA tile IR in arenas
//!                                  │
//!                          passes::optimize        folding, CSE, DCE
//!                                  │
//!                          valid::validate ──▶ ModuleInfo
//!                                  │
//!                    back::ptx::write (layouts,    ──▶ CompiledKernel { ptx, abi, .. }
//!                    lowering, one printer)
//!
//!   interp::run executes the same ir::Function on the CPU.
//! ```
//!
//! The whole sequence is visible in one place: [`pipeline::compile`].

pub mod abi;
pub mod abi_doc;
pub mod back;
pub mod check;
pub mod diag;
pub mod front;
pub mod host;
pub mod interp;
pub mod ir;
pub mod passes;
pub mod pipeline;
pub mod round;
pub mod span;
pub mod target;
pub mod types;
pub mod valid;

pub use abi::{CompiledKernel, ConstArg, KernelAbi, LaunchHints, Specialization};
pub use diag::{Diagnostic, Diagnostics, ErrorCode};
pub use pipeline::{compile, compile_to_ir, CompileOptions};
pub use span::{SourceFile, Span};
pub use target::{source_targets, Arch, Target};
pub use types::{DType, Shape};

/// The compiler version, part of every cache key.
pub const COMPILER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The package version and a hash of the compiler's own sources (`build.rs`), e.g.
/// `0.1.0+3f2a9c01d4e5b6a7`: caches of compiled kernels key on it, so a compiler built
/// from changed sources never reuses another build's output.
pub const COMPILER_FINGERPRINT: &str = env!("KGEN_CORE_FINGERPRINT");
