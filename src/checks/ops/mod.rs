//! The op library's self-checks (test code): every op run once on awkward shapes against
//! a float64 reference from [`crate::cases`], inputs random and outputs poisoned first,
//! on the GPU or the interpreter; [`gpu_checks`] is the op half of `kgen selftest`. The
//! unit tests that need those references or checks live here too. The ops themselves
//! (`ops/*.rs` outside this folder) use nothing from here nor from `cases`.
//!
//! Files: `common` (random and poisoned tensors, the error measure, tolerances), one per
//! op file (`norm`, `act`, `rope`, `attention`: group `attn`, `loss`, `linear`: linear
//! layers forward and backward and matmul, `gemm`), and `capture` (ops
//! recorded into a CUDA graph replay like eager ones). The optimizer's checks are
//! [`crate::checks::optim`].

use kgen_runtime::Device;

pub mod act;
pub mod attention;
pub mod capture;
mod common;
pub mod gemm;
pub mod linear;
pub mod loss;
pub mod norm;
pub mod ns;
pub mod rope;

/// The groups of [`gpu_checks`], by name (`kgen selftest --filter ops:ns,optim`).
pub const GROUPS: &[&str] = &[
    "linear", "gemm", "norm", "act", "rope", "attn", "loss", "ns", "optim", "capture",
];

/// Every op run once on `device` against a float64 reference (the op half of
/// `kgen selftest`): (label, max relative error, or why it failed).
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    gpu_checks_of(device, |_| true)
}

/// [`gpu_checks`] of the groups `want` accepts (names of [`GROUPS`]).
pub fn gpu_checks_of(
    device: &Device,
    want: impl Fn(&str) -> bool,
) -> Vec<(String, Result<f64, String>)> {
    type Group = fn(&Device) -> Vec<(String, Result<f64, String>)>;
    let groups: [(&str, Group); 10] = [
        ("linear", linear::gpu_checks),
        ("gemm", gemm::gpu_checks),
        ("norm", norm::gpu_checks),
        ("act", act::gpu_checks),
        ("rope", rope::gpu_checks),
        ("attn", attention::gpu_checks),
        ("loss", loss::gpu_checks),
        ("ns", ns::gpu_checks),
        ("optim", crate::checks::optim::gpu_checks),
        ("capture", capture::gpu_checks),
    ];
    let mut v = Vec::new();
    for (name, f) in groups {
        if want(name) {
            v.extend(f(device));
        }
    }
    v
}
