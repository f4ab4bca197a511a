//! Test cases for the bundled kernels: random inputs of awkward sizes, poisoned outputs,
//! and a plain-Rust float64 reference for each. One table serves the CI numerics tests
//! (interpreter vs reference) and `kgen selftest --gpu` (GPU vs interpreter vs reference).
//!
//! Running a case:
//! ```ignore
//! let (func, _) = kgen_core::compile_to_ir(&case.source(), &case.compile_options(arch))?;
//! let mut args = case.args.clone();
//! kgen_core::interp::run(&func, case.grid, &mut args)?;
//! let result = kgen::cases::compare(&args, &case);
//! assert!(result.passed(), "{}: {result}", case.label);
//! ```

use kgen_core::host::{ArgValue, HostTensor};
use kgen_core::types::{DType, Scalar};
use kgen_core::{Arch, CompileOptions, SourceFile};

pub mod adamw;
pub mod attention;
pub mod compare;
pub mod cross_entropy;
pub mod gemm;
pub mod int_div;
pub mod lang;
pub mod layernorm;
pub mod linear_bwd;
pub mod matmul;
pub mod norm_bwd;
pub mod ns;
pub mod optim;
pub mod relu;
pub mod rmsnorm;
pub use crate::rng;
pub mod rope;
pub mod scan;
pub mod softmax;
pub mod sources;
pub mod sumsq;
pub mod swiglu;
pub mod torch_adamw;
pub mod torch_attention;
pub mod torch_muon;
pub mod vec_add;

pub use compare::{
    compare, compare_against, output_values, CompareResult, Mismatch, OutputCompare,
};
pub use rng::Rng;
pub use sources::{kernel_source, BUNDLED_KERNELS};

/// How close an output must be to the float64 reference (and the GPU to the
/// interpreter): `|got - want| <= abs + rel * |want|` element-wise, NaN never passes
/// unless the reference is NaN too.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub rel: f64,
    pub abs: f64,
}

impl Tolerance {
    /// The looser of two tolerances, per component (a case with outputs of several
    /// dtypes takes the loosest).
    pub fn max(self, other: Tolerance) -> Tolerance {
        Tolerance {
            rel: self.rel.max(other.rel),
            abs: self.abs.max(other.abs),
        }
    }

    /// Tolerance for a value computed in f32 and rounded once to `dtype`: `f32` as
    /// given, f16 and bf16 about one unit in the last place (half an ulp of rounding plus
    /// f32 slack), with `abs` as the floor. f16's absolute floor also covers its
    /// subnormal spacing (6e-8).
    pub fn for_dtype(dtype: DType, f32: Tolerance) -> Tolerance {
        match dtype {
            DType::BF16 => Tolerance {
                rel: 8e-3,
                abs: f32.abs,
            }
            .max(f32),
            DType::F16 => Tolerance {
                rel: 1e-3,
                abs: 6e-8,
            }
            .max(f32),
            _ => f32,
        }
    }
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
    /// The kernel file stem in `kernels-src/` (`rmsnorm` for `kernels-src/rmsnorm.kg`), or
    /// `lang` for `src/cases/lang.kg` (the language's own builtins).
    pub kernel: &'static str,
    /// The kernel to compile when the file holds several (`Some("sumsq_finalize")` in
    /// `sumsq.kg`); `None` takes the first. Pass it as `CompileOptions::kernel`
    /// ([`Case::compile_options`] does).
    pub kernel_name: Option<&'static str>,
    /// A readable description, e.g. `rmsnorm T=bf16 rows=1000 cols=4097`.
    pub label: String,
    /// Compile-time values (`-D NAME=VALUE`).
    pub defines: Vec<(String, String)>,
    /// The alignment (bytes) each tensor parameter actually has in `args`: the largest
    /// of 16/8/4/2/1 dividing every non-unit stride and the contiguous extent, in bytes
    /// (odd row lengths such as 4097 give less than 16). A specialization compiled
    /// with the default 16 would be refused at launch for these.
    pub tensor_align: Vec<(String, u32)>,
    pub grid: [u32; 3],
    /// The arguments in parameter order: inputs filled with random data, outputs poisoned.
    pub args: Vec<ArgValue>,
    /// Indices into `args` of the outputs to compare (tensors the kernel writes).
    pub outputs: Vec<usize>,
    /// Expected outputs, one Vec per entry of `outputs`, row-major over the tensor view.
    pub reference: Reference,
    pub tolerance: Tolerance,
    /// Compile options beyond the defines (the CLI's `--ws`, `--multicast`, `--pingpong`).
    pub options: CaseOptions,
}

/// Compile options of a [`Case`] that are not defines: the code-generation forms a
/// user selects with `kgen compile --ws` / `--multicast` (sm_90a; ignored elsewhere).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaseOptions {
    /// Warp-specialize a TMA-fed wgmma kernel (`CompileOptions::ws`).
    pub ws: bool,
    /// Multicast the tile fetches alike in both blocks of a pair (`CompileOptions::multicast`).
    pub multicast: bool,
    /// Two consumer warpgroups take turns issuing products (`CompileOptions::pingpong`).
    pub pingpong: bool,
    /// Warps per block (`--warps`) where the op that launches the kernel picks them
    /// (the compiler's default otherwise).
    pub warps: Option<u32>,
}

impl Case {
    /// The kernel file's source, named `kernels-src/<stem>.kg` (a self-test kernel:
    /// `src/cases/kernels/<stem>.kg`, or `src/cases/lang.kg` for the language cases).
    pub fn source(&self) -> SourceFile {
        let text = kernel_source(self.kernel)
            .unwrap_or_else(|| panic!("no kernel file `{}`", self.kernel));
        SourceFile::new(sources::kernel_file_name(self.kernel), text)
    }

    /// Compile options for this case: kernel name, defines and tensor alignments.
    pub fn compile_options(&self, arch: Arch) -> CompileOptions {
        let mut o = CompileOptions::new(arch);
        o.kernel = self.kernel_name.map(str::to_string);
        o.defines = self.defines.clone();
        o.tensor_align = self.tensor_align.clone();
        o.ws = self.options.ws;
        o.multicast = self.options.multicast;
        o.pingpong = self.options.pingpong;
        o.num_warps = self.options.warps.or(o.num_warps);
        o
    }

    /// The reference outputs.
    pub fn expected(&self) -> Vec<Vec<f64>> {
        (self.reference)(&self.args)
    }
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("kernel", &self.kernel)
            .field("kernel_name", &self.kernel_name)
            .field("label", &self.label)
            .field("defines", &self.defines)
            .field("grid", &self.grid)
            .field("outputs", &self.outputs)
            .field("tolerance", &self.tolerance)
            .finish_non_exhaustive()
    }
}

/// Every case for every bundled kernel, deterministic for a given seed. The full set
/// contains the quick set.
pub fn all_cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(vec_add::cases(seed, sizes));
    v.extend(softmax::cases(seed, sizes));
    v.extend(rmsnorm::cases(seed, sizes));
    v.extend(layernorm::cases(seed, sizes));
    v.extend(adamw::cases(seed, sizes));
    v.extend(sumsq::cases(seed, sizes));
    v.extend(ns::cases(seed, sizes));
    v.extend(norm_bwd::cases(seed, sizes));
    v.extend(swiglu::cases(seed, sizes));
    v.extend(relu::cases(seed, sizes));
    v.extend(rope::cases(seed, sizes));
    v.extend(cross_entropy::cases(seed, sizes));
    v.extend(optim::cases(seed, sizes));
    v.extend(matmul::cases(seed, sizes));
    v.extend(gemm::cases(seed, sizes));
    v.extend(linear_bwd::cases(seed, sizes));
    v.extend(lang::cases(seed, sizes));
    v.extend(attention::cases(seed, sizes));
    v.extend(scan::cases(seed, sizes));
    v.extend(int_div::cases(seed, sizes));
    v
}

// ---- helpers shared by the kernel modules ----

pub(crate) fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// A contiguous tensor of `dtype` with values drawn by `f`, rounded to the dtype. Values
/// that would round to zero are nudged away from it: inputs are never zero.
pub(crate) fn random_tensor(
    rng: &mut Rng,
    dtype: DType,
    shape: &[usize],
    mut f: impl FnMut(&mut Rng) -> f64,
) -> HostTensor {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|_| {
            let v = f(rng);
            if v.abs() < 1e-4 {
                if v < 0.0 {
                    -1e-4
                } else {
                    1e-4
                }
            } else {
                v
            }
        })
        .collect();
    HostTensor::from_f64(dtype, shape, &vals)
}

/// A contiguous output tensor poisoned with 0xFF bytes (NaN in every float dtype).
pub(crate) fn poisoned(dtype: DType, shape: &[usize]) -> HostTensor {
    let mut t = HostTensor::zeros(dtype, shape);
    t.poison(0xFF);
    t
}

/// An f32 scalar argument (the value rounded to f32).
pub(crate) fn f32_arg(v: f64) -> ArgValue {
    ArgValue::Scalar(Scalar::Float(v as f32 as f64, DType::F32))
}

pub(crate) fn tensor_at(args: &[ArgValue], i: usize) -> &HostTensor {
    match &args[i] {
        ArgValue::Tensor(t) => t,
        ArgValue::Scalar(_) => panic!("argument {i} is not a tensor"),
    }
}

pub(crate) fn scalar_at(args: &[ArgValue], i: usize) -> f64 {
    match &args[i] {
        ArgValue::Scalar(s) => s.to_f64(),
        ArgValue::Tensor(_) => panic!("argument {i} is not a scalar"),
    }
}

/// The alignment a host tensor gives a `contiguous` tensor parameter once copied to
/// the device (the runtime's rule, `kgen_runtime::natural_alignment`): the largest of
/// 16, 8, 4, 2, 1 bytes dividing every stride but the last (of dimensions of extent
/// > 1) and the last extent, in bytes.
pub fn contiguous_align(t: &HostTensor) -> u32 {
    kgen_runtime::natural_alignment(t, true)
}

/// `tensor_align` for a case: the parameter names in order (scalars included, they are
/// skipped) paired with the tensor arguments.
pub(crate) fn aligns(names: &[&str], args: &[ArgValue]) -> Vec<(String, u32)> {
    assert_eq!(names.len(), args.len(), "parameter names vs arguments");
    names
        .iter()
        .zip(args)
        .filter_map(|(n, a)| match a {
            ArgValue::Tensor(t) => Some((n.to_string(), contiguous_align(t))),
            ArgValue::Scalar(_) => None,
        })
        .collect()
}

/// `T`, `BLOCK` and `ONE_TILE` of a row kernel with a one-tile and a multi-tile path
/// (`rmsnorm`, `layernorm`, `rmsnorm_bwd`, `softmax`, `softmax_bwd`), and the
/// label's suffix. `ONE_TILE` is true where the ops set it (cols <= BLOCK) for odd row
/// counts; even row counts keep the general kernel (its runtime branch), so that the
/// self-test runs both compiled forms of the one-tile path.
pub(crate) fn tile_path_defines(
    dtype: DType,
    rows: usize,
    cols: usize,
    block: usize,
) -> (Vec<(String, String)>, &'static str) {
    let one_tile = cols <= block && rows % 2 == 1;
    let d = defines(&[
        ("T", dtype.to_string()),
        ("BLOCK", block.to_string()),
        ("ONE_TILE", one_tile.to_string()),
    ]);
    (d, if one_tile { " ONE_TILE" } else { "" })
}

pub(crate) fn defines(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

pub(crate) const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_of_awkward_shapes() {
        assert_eq!(
            contiguous_align(&HostTensor::zeros(DType::F32, &[1000])),
            16
        );
        assert_eq!(contiguous_align(&HostTensor::zeros(DType::F32, &[7])), 4);
        assert_eq!(
            contiguous_align(&HostTensor::zeros(DType::BF16, &[5, 4097])),
            2
        );
        assert_eq!(
            contiguous_align(&HostTensor::zeros(DType::BF16, &[3, 1000])),
            16
        );
        assert_eq!(
            contiguous_align(&HostTensor::zeros(DType::F16, &[3, 1004])),
            8
        );
    }

    #[test]
    fn table_is_well_formed() {
        for sizes in [SizeSet::Quick, SizeSet::Full] {
            let cases = all_cases(1, sizes);
            assert!(!cases.is_empty());
            for c in &cases {
                assert!(kernel_source(c.kernel).is_some(), "{}", c.label);
                assert!(c.grid.iter().all(|&g| g >= 1), "{}", c.label);
                let want = c.expected();
                assert_eq!(want.len(), c.outputs.len(), "{}", c.label);
                for (w, &i) in want.iter().zip(&c.outputs) {
                    let t = tensor_at(&c.args, i);
                    assert_eq!(w.len(), t.num_elements(), "{}", c.label);
                    assert!(w.iter().all(|v| v.is_finite()), "{}", c.label);
                }
                // Outputs that are not also inputs start poisoned; inputs are never zero
                // (except int_div's integers, whose zeros are the data under test).
                for (i, a) in c.args.iter().enumerate() {
                    if c.kernel == "int_div" && !c.outputs.contains(&i) {
                        continue;
                    }
                    // ns_gram_split's workspace starts poisoned (every partial it reads
                    // is written first) and its grid barrier's counter at zero.
                    if c.kernel_name == Some("ns_gram_split") && (i == 4 || i == 5) {
                        let vals = tensor_at(&c.args, i).to_f64_vec();
                        let ok = if i == 4 {
                            vals.iter().all(|v| v.is_nan())
                        } else {
                            vals == [0.0]
                        };
                        assert!(ok, "{} arg{i}", c.label);
                        continue;
                    }
                    if let ArgValue::Tensor(t) = a {
                        let vals = t.to_f64_vec();
                        if c.outputs.contains(&i) && vals.iter().any(|v| v.is_nan()) {
                            assert!(vals.iter().all(|v| v.is_nan()), "{}", c.label);
                        } else {
                            assert!(
                                vals.iter().all(|v| v.is_finite() && *v != 0.0),
                                "{} arg{i}",
                                c.label
                            );
                        }
                    }
                }
            }
            // Labels are unique (they name the case in reports).
            let mut labels: Vec<&str> = cases.iter().map(|c| c.label.as_str()).collect();
            labels.sort();
            let n = labels.len();
            labels.dedup();
            assert_eq!(n, labels.len(), "duplicate labels");
        }
    }
}
