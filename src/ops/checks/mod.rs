//! The op library's self-checks (test code): every op run once on awkward shapes against
//! a float64 reference from [`crate::cases`], inputs random and outputs poisoned first,
//! on the GPU or the interpreter; [`gpu_checks`] is the op half of `kgen selftest`. The
//! unit tests that need those references or checks live here too. The ops themselves
//! (`ops/*.rs` outside this folder) use nothing from here nor from `cases`.
//!
//! Files: `common` (random and poisoned tensors, the error measure, tolerances), one per
//! op file (`norm`, `act`, `rope`, `loss`, `linear`: linear layers forward and backward
//! and matmul, `gemm`), and `capture` (ops
//! recorded into a CUDA graph replay like eager ones). The optimizer's checks are
//! [`crate::optim::checks`].

use kgen_runtime::Device;

pub mod act;
pub mod capture;
mod common;
pub mod gemm;
pub mod linear;
pub mod loss;
pub mod norm;
pub mod ns;
pub mod rope;

/// Every op run once on `device` against a float64 reference (the op half of
/// `kgen selftest`): (label, max relative error, or why it failed).
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let mut v = Vec::new();
    v.extend(linear::gpu_checks(device));
    v.extend(gemm::gpu_checks(device));
    v.extend(norm::gpu_checks(device));
    v.extend(act::gpu_checks(device));
    v.extend(rope::gpu_checks(device));
    v.extend(loss::gpu_checks(device));
    v.extend(ns::gpu_checks(device));
    v.extend(crate::optim::checks::gpu_checks(device));
    v.extend(capture::gpu_checks(device));
    v
}
