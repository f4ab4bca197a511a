//! `gemm`: c = act(a @ b + bias) on tensor cores (`kernels-src/gemm.kg`), f16 and bf16
//! with f32 accumulation, any M, N, K and transposed operands as views.
//!
//! Operands: `a [M, K]` and `b [K, N]` may be row-major or transposed views (strides
//! `[1, ld]`, e.g. `x.transpose(0, 1)` for a weight gradient `x.T @ dy`): the kernel
//! reads the transposed storage and the tensor cores take the transpose for free
//! (`ldmatrix.trans`), so no operand is copied. A transposed `c` (no bias) is computed
//! as `c.T = b.T @ a.T`. Other strides (neither dimension contiguous) go to the strided
//! `matmul.kg` (without a bias or an activation; with them, a typed error).
//! `gemm_impl` also writes the pre-activation `a @ b + bias` when asked (`PREACT`: a
//! linear layer's forward for its backward, `ops/linear.rs`).
//! The configuration (tile sizes, warps, pipeline depth) is autotuned per shape among
//! [`candidates`]; `KGEN_AUTOTUNE=0` takes the first.

use super::plan::PlanKey;
use super::{dtype_err, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::Tensor;

/// The epilogue activation (`gemm.kg`'s `ACT`), applied after the bias in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    #[default]
    None,
    Relu,
    /// GELU with the tanh approximation (torch's `approximate='tanh'`).
    GeluTanh,
    Silu,
}

impl Activation {
    /// The `ACT` code of `gemm.kg` and `linear_bwd.kg`.
    pub(crate) fn code(self) -> u32 {
        match self {
            Activation::None => 0,
            Activation::Relu => 1,
            Activation::GeluTanh => 2,
            Activation::Silu => 3,
        }
    }
}

/// A gemm configuration: tile sizes, warps and pipeline depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmConfig {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub warps: u32,
    pub stages: u32,
}

impl GemmConfig {
    pub fn label(&self) -> String {
        format!(
            "BM={} BN={} BK={} w{} s{}",
            self.bm, self.bn, self.bk, self.warps, self.stages
        )
    }
}

/// The tuner's candidates for operands whose rows allow `cp.async` copies (4-byte
/// aligned or better), the default first; [`unaligned_candidates`] for the others.
pub fn candidates() -> Vec<GemmConfig> {
    let c = |bm, bn, bk, warps, stages| GemmConfig {
        bm,
        bn,
        bk,
        warps,
        stages,
    };
    vec![
        c(128, 128, 32, 4, 3),
        c(128, 128, 64, 4, 3),
        c(128, 256, 32, 8, 3),
        c(256, 128, 32, 8, 3),
        c(128, 256, 64, 8, 3),
        c(256, 128, 64, 8, 3),
        c(128, 128, 32, 4, 4),
        c(64, 128, 32, 4, 4),
        // Every warp 16 rows: wgmma on sm_90a (mma.sync elsewhere).
        c(128, 128, 64, 8, 3),
        c(128, 128, 64, 8, 4),
        c(128, 256, 64, 8, 4),
    ]
}

/// Candidates for operands whose rows are only 2-byte aligned (an odd K or N in f16/
/// bf16): their tiles are copied element by element (`ld.global` + `st.shared`), which
/// holds each element in a register on its way, so the tiles are smaller (measured: the
/// 128 x 128 configurations spill there, tests/no_spills.rs).
pub fn unaligned_candidates() -> Vec<GemmConfig> {
    let c = |bm, bn, bk, warps, stages| GemmConfig {
        bm,
        bn,
        bk,
        warps,
        stages,
    };
    vec![
        c(128, 128, 32, 8, 3),
        c(64, 64, 32, 4, 3),
        c(64, 128, 32, 8, 3),
        c(128, 64, 32, 8, 3),
    ]
}

/// How an operand is passed: its row-major storage and whether that is the transpose.
fn storage(t: &Tensor) -> Option<(Tensor, bool)> {
    let (s, sh) = (t.strides(), t.shape());
    if s[1] == 1 || sh[1] <= 1 {
        return Some((t.clone(), false));
    }
    if s[0] == 1 || sh[0] <= 1 {
        return t.transpose(0, 1).ok().map(|v| (v, true));
    }
    None
}

impl Ops {
    /// `act(a @ b + bias)` → a new `[M, N]` tensor of the operands' dtype.
    pub fn gemm(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
    ) -> Result<Tensor, OpError> {
        let (m, n) = (
            a.shape().first().copied().unwrap_or(0),
            b.shape().get(1).copied().unwrap_or(0),
        );
        let c = self.empty(a.dtype(), &[m, n])?;
        self.gemm_into(a, b, bias, act, &c)?;
        Ok(c)
    }

    /// `c = act(a @ b + bias)` into an existing `[M, N]` tensor.
    pub fn gemm_into(
        &self,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
        c: &Tensor,
    ) -> Result<(), OpError> {
        self.gemm_impl("gemm", a, b, bias, act, c, None)
    }

    /// [`Ops::gemm_into`] that also writes the pre-activation `z = a @ b + bias` (rounded
    /// to T) into an existing `[M, N]` tensor, from the same accumulator in the same
    /// launch (`gemm.kg`'s `PREACT`): what a layer's backward needs for `act'(z)`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_impl(
        &self,
        op: &'static str,
        a: &Tensor,
        b: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
        c: &Tensor,
        z: Option<&Tensor>,
    ) -> Result<(), OpError> {
        let t = a.dtype();
        if !matches!(t, DType::F16 | DType::BF16) {
            return Err(dtype_err(op, format!("f16 or bf16 operands, not {t}")));
        }
        let same = |x: &Tensor| x.dtype() == t;
        if !same(b) || !same(c) || !bias.is_none_or(same) || !z.is_none_or(same) {
            return Err(dtype_err(
                op,
                format!(
                    "operands must share a dtype: a {t}, b {}, c {}{}{}",
                    b.dtype(),
                    c.dtype(),
                    bias.map(|x| format!(", bias {}", x.dtype()))
                        .unwrap_or_default(),
                    z.map(|x| format!(", z {}", x.dtype())).unwrap_or_default()
                ),
            ));
        }
        if a.rank() != 2 || b.rank() != 2 || c.rank() != 2 {
            return Err(shape_err(op, "a, b and c must be 2-D"));
        }
        let (m, k) = (a.shape()[0], a.shape()[1]);
        let n = b.shape()[1];
        if b.shape()[0] != k || c.shape() != [m, n] {
            return Err(shape_err(
                op,
                format!(
                    "{:?} @ {:?} -> {:?} does not fit",
                    a.shape(),
                    b.shape(),
                    c.shape()
                ),
            ));
        }
        if let Some(x) = bias {
            if x.shape() != [n] {
                return Err(shape_err(
                    op,
                    format!("bias {:?} for {n} columns", x.shape()),
                ));
            }
        }
        if let Some(z) = z {
            if z.shape() != [m, n] {
                return Err(shape_err(
                    op,
                    format!("z {:?} for a [{m}, {n}] result", z.shape()),
                ));
            }
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let row_major = |x: &Tensor| x.strides()[1] == 1 || n == 1;
        let col_major = |x: &Tensor| x.strides()[0] == 1 || m == 1;
        if !row_major(c) && col_major(c) && bias.is_none() && z.is_none_or(col_major) {
            // A transposed c (e.g. the gradient of a weight stored [in, out]):
            // c.T = b.T @ a.T, whose rows the kernel writes (the activation is
            // element-wise; a bias would run along c.T's rows, which the kernel has not).
            let zt = z.map(|z| z.transpose(0, 1)).transpose()?;
            return self.gemm_impl(
                op,
                &b.transpose(0, 1)?,
                &a.transpose(0, 1)?,
                None,
                act,
                &c.transpose(0, 1)?,
                zt.as_ref(),
            );
        }
        let c_ok = row_major(c) && z.is_none_or(row_major);
        let bias_ok = bias.is_none_or(|x| x.strides()[0] == 1 || n == 1);
        let (Some((sa, ta)), Some((sb, tb)), true, true) = (storage(a), storage(b), c_ok, bias_ok)
        else {
            if bias.is_none() && act == Activation::None && z.is_none() {
                return self.matmul_fma_into(a, b, c);
            }
            return Err(shape_err(
                op,
                "operands need one contiguous dimension, c, z and bias a contiguous last one",
            ));
        };
        // Without a bias the kernel reads none, without PREACT it writes no z: any
        // one-element row of a (m >= 1 here), and a itself, will do.
        let dummy_bias;
        let bias_t = match bias {
            Some(x) => x,
            None => {
                dummy_bias = a.select(0, 0)?.narrow(0, 0, k.min(1))?;
                &dummy_bias
            }
        };
        let z_t = z.unwrap_or(&sa);
        let key = PlanKey::new(op)
            .word(
                ta as u64
                    | (tb as u64) << 1
                    | (bias.is_some() as u64) << 2
                    | (z.is_some() as u64) << 3,
            )
            .word(act.code() as u64);
        let copyable = |t: &Tensor| kgen_runtime::tensor_alignment(t) >= 4;
        let cands = if copyable(&sa) && copyable(&sb) {
            candidates()
        } else {
            unaligned_candidates()
        };
        let defines = |cfg: &GemmConfig| -> Vec<(&'static str, String)> {
            vec![
                ("T", t.to_string()),
                ("BM", cfg.bm.to_string()),
                ("BN", cfg.bn.to_string()),
                ("BK", cfg.bk.to_string()),
                ("TRANS_A", ta.to_string()),
                ("TRANS_B", tb.to_string()),
                ("BIAS", bias.is_some().to_string()),
                ("ACT", act.code().to_string()),
                ("PREACT", z.is_some().to_string()),
            ]
        };
        let args = KernelArgs::new()
            .tensor("a", &sa)
            .tensor("b", &sb)
            .tensor("bias", bias_t)
            .tensor("c", c)
            .tensor("z", z_t);
        self.launch_planned(
            key,
            &args,
            || {
                format!(
                    "{t} {m}x{n}x{k} ta={ta} tb={tb}{}",
                    if z.is_some() { " preact" } else { "" }
                )
            },
            || cands.iter().map(GemmConfig::label).collect(),
            |i| {
                let cfg = cands[i];
                let kern = self.kernel_full(
                    "gemm",
                    "gemm",
                    &defines(&cfg),
                    Some(cfg.warps),
                    None,
                    Some(cfg.stages),
                    &args,
                )?;
                let tiles = m.div_ceil(cfg.bm as usize) * n.div_ceil(cfg.bn as usize);
                let grid = [
                    u32::try_from(tiles).map_err(|_| shape_err(op, "too many tiles"))?,
                    1,
                    1,
                ];
                Ok((kern, grid))
            },
        )
    }
}
