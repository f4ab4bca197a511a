//! Test cases for the bundled kernels: random inputs of awkward sizes, poisoned outputs,
//! and a plain-Rust float64 reference for each. One table serves the CI numerics tests
//! (interpreter vs reference) and `kgen selftest --gpu` (GPU vs interpreter vs reference).

use kgen_core::host::ArgValue;

/// How close an output must be to the float64 reference (and the GPU to the
/// interpreter): `|got - want| <= abs + rel * |want|` element-wise, NaN never passes
/// unless the reference is NaN too.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rel: f64,
    pub abs: f64,
}

/// Which sizes to generate: the quick set for debug-mode tests, or the full set
/// (awkward sizes 1, 7, 1000, 4097 and more) for release tests and the GPU self-test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeSet {
    Quick,
    Full,
}

/// The float64 reference: computes the expected outputs from the (unmodified) inputs.
pub type Reference = Box<dyn Fn(&[ArgValue]) -> Vec<Vec<f64>> + Send + Sync>;

/// One run of one kernel specialization on one set of inputs.
pub struct Case {
    /// The kernel file stem in `kernels-src/` (`rmsnorm` for `kernels-src/rmsnorm.kg`).
    pub kernel: &'static str,
    /// A readable description, e.g. `rmsnorm T=bf16 rows=1000 cols=4097`.
    pub label: String,
    /// Compile-time values (`-D NAME=VALUE`).
    pub defines: Vec<(String, String)>,
    pub grid: [u32; 3],
    /// The arguments in parameter order: inputs filled with random data, outputs poisoned.
    pub args: Vec<ArgValue>,
    /// Indices into `args` of the outputs to compare (tensors the kernel writes).
    pub outputs: Vec<usize>,
    /// Expected outputs, one Vec per entry of `outputs`, row-major over the tensor view.
    pub reference: Reference,
    pub tolerance: Tolerance,
}

/// Every case for every bundled kernel, deterministic for a given seed.
pub fn all_cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let _ = (seed, sizes);
    Vec::new()
}
