//! `gemm`: c = act(a @ b + bias) on tensor cores (`kernels-src/gemm.kg`), f16 and bf16
//! with f32 accumulation, any M, N, K and transposed operands as views.
//!
//! Operands: `a [M, K]` and `b [K, N]` may be row-major or transposed views (strides
//! `[1, ld]`, e.g. `x.transpose(0, 1)` for a weight gradient `x.T @ dy`): the kernel
//! reads the transposed storage and the tensor cores take the transpose for free
//! (`ldmatrix.trans`), so no operand is copied. Other strides (neither dimension
//! contiguous) and a non-contiguous `c` go to the strided `matmul.kg`.
//! The configuration (tile sizes, warps, pipeline depth) is autotuned per shape among
//! [`candidates`]; `KGEN_AUTOTUNE=0` takes the first.

use super::plan::PlanKey;
use super::{dtype_err, shape_err, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{Arg, Tensor};

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
    fn code(self) -> u32 {
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
        const OP: &str = "gemm";
        let t = a.dtype();
        if !matches!(t, DType::F16 | DType::BF16) {
            return Err(dtype_err(OP, format!("f16 or bf16 operands, not {t}")));
        }
        if b.dtype() != t || c.dtype() != t || bias.is_some_and(|x| x.dtype() != t) {
            return Err(dtype_err(
                OP,
                format!(
                    "operands must share a dtype: a {t}, b {}, c {}{}",
                    b.dtype(),
                    c.dtype(),
                    bias.map(|x| format!(", bias {}", x.dtype()))
                        .unwrap_or_default()
                ),
            ));
        }
        if a.rank() != 2 || b.rank() != 2 || c.rank() != 2 {
            return Err(shape_err(OP, "a, b and c must be 2-D"));
        }
        let (m, k) = (a.shape()[0], a.shape()[1]);
        let n = b.shape()[1];
        if b.shape()[0] != k || c.shape() != [m, n] {
            return Err(shape_err(
                OP,
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
                    OP,
                    format!("bias {:?} for {n} columns", x.shape()),
                ));
            }
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let c_ok = c.strides()[1] == 1 || n == 1;
        let bias_ok = bias.is_none_or(|x| x.strides()[0] == 1 || n == 1);
        let (Some((sa, ta)), Some((sb, tb)), true, true) = (storage(a), storage(b), c_ok, bias_ok)
        else {
            if bias.is_none() && act == Activation::None {
                return self.matmul_fma_into(a, b, c);
            }
            return Err(shape_err(
                OP,
                "operands need one contiguous dimension, c and bias a contiguous last one",
            ));
        };
        // Without a bias the kernel reads none: any contiguous one-element view will do.
        let dummy;
        let bias_t = match bias {
            Some(x) => x,
            None => {
                dummy = sa.flatten()?.narrow(0, 0, 1)?;
                &dummy
            }
        };
        let key = PlanKey::new(OP)
            .tensors(&[&sa, &sb, bias_t, c])
            .word(ta as u64 | (tb as u64) << 1 | (bias.is_some() as u64) << 2)
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
            ]
        };
        let args = [
            Arg::from(&sa),
            Arg::from(&sb),
            Arg::from(bias_t),
            Arg::from(c),
        ];
        self.launch_planned(
            key,
            &args,
            || format!("{t} {m}x{n}x{k} ta={ta} tb={tb}"),
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
                    &[("a", &sa), ("b", &sb), ("bias", bias_t), ("c", c)],
                )?;
                let tiles = m.div_ceil(cfg.bm as usize) * n.div_ceil(cfg.bn as usize);
                let grid = [
                    u32::try_from(tiles).map_err(|_| shape_err(OP, "too many tiles"))?,
                    1,
                    1,
                ];
                Ok((kern, grid))
            },
        )
    }
}

/// `gemm` on large shapes (4096³, 8192³) and a transposed, biased, activated one on the
/// GPU, against float64 on a sample of 2048 output elements (each a whole K-long dot
/// product), inputs random and the output poisoned first. On the interpreter only a
/// small shape (the large ones would take hours there; the bundled cases cover the
/// interpreter on awkward shapes).
pub fn gpu_checks(device: &kgen_runtime::Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    let big: &[(usize, usize, usize, bool, bool, bool, Activation)] = if device.is_gpu() {
        &[
            (4096, 4096, 4096, false, false, false, Activation::None),
            (8192, 8192, 8192, false, false, false, Activation::None),
            (4096, 4096, 4096, true, true, true, Activation::GeluTanh),
            (1000, 4097, 1032, false, true, true, Activation::Silu),
        ]
    } else {
        &[(100, 72, 40, true, false, true, Activation::Relu)]
    };
    let mut out = Vec::new();
    for &(m, n, k, ta, tb, bias, act) in big {
        let label = format!(
            "gemm bf16 {m}x{n}x{k}{}{}{} {act:?} (2048 sampled elements vs f64)",
            if ta { " a.T" } else { "" },
            if tb { " b.T" } else { "" },
            if bias { " +bias" } else { "" },
        );
        out.push((label, check_one(&ops, m, n, k, ta, tb, bias, act)));
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn check_one(
    ops: &Ops,
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    with_bias: bool,
    act: Activation,
) -> Result<f64, String> {
    let e = |x: kgen_runtime::RuntimeError| x.to_string();
    let d = ops.device();
    let dt = DType::BF16;
    let mut rng = crate::cases::Rng::new((m * 31 + n * 7 + k) as u64);
    let mut rand = |len: usize| -> Vec<f64> { (0..len).map(|_| rng.normalish()).collect() };
    // Storage row-major; a transposed operand is the transpose of its storage.
    let (sa_shape, sb_shape) = (
        if ta { [k, m] } else { [m, k] },
        if tb { [n, k] } else { [k, n] },
    );
    let a_s = d.from_f64(dt, &sa_shape, &rand(m * k)).map_err(e)?;
    let b_s = d.from_f64(dt, &sb_shape, &rand(k * n)).map_err(e)?;
    let bias_t = d.from_f64(dt, &[n], &rand(n)).map_err(e)?;
    let c = d.from_f64(dt, &[m, n], &vec![f64::NAN; m * n]).map_err(e)?;
    let a = if ta {
        a_s.transpose(0, 1).map_err(e)?
    } else {
        a_s.clone()
    };
    let b = if tb {
        b_s.transpose(0, 1).map_err(e)?
    } else {
        b_s.clone()
    };
    ops.gemm_into(&a, &b, with_bias.then_some(&bias_t), act, &c)
        .map_err(|x| x.to_string())?;
    let (av, bv, biasv, got) = (
        a_s.to_f64_vec().map_err(e)?,
        b_s.to_f64_vec().map_err(e)?,
        bias_t.to_f64_vec().map_err(e)?,
        c.to_f64_vec().map_err(e)?,
    );
    let at = |i: usize, p: usize| if ta { av[p * m + i] } else { av[i * k + p] };
    let bt = |p: usize, j: usize| if tb { bv[j * k + p] } else { bv[p * n + j] };
    let apply = |x: f64| match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::GeluTanh => {
            0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::Silu => x / (1.0 + (-x).exp()),
    };
    let total = m * n;
    let step = (total / 2048).max(1);
    let mut worst = 0.0f64;
    // Every element of the last row and column too (the tiles that hang over the edge).
    let edges = (0..n)
        .map(|j| (m - 1) * n + j)
        .chain((0..m).map(|i| i * n + n - 1));
    for idx in (0..total).step_by(step).chain(edges) {
        let (i, j) = (idx / n, idx % n);
        let mut s = 0.0;
        let mut scale = 0.0;
        for p in 0..k {
            let t = at(i, p) * bt(p, j);
            s += t;
            scale += t.abs();
        }
        let want = apply(s + if with_bias { biasv[j] } else { 0.0 });
        let g = got[idx];
        if !g.is_finite() {
            return Err(format!("[{i}, {j}] = {g} (want {want})"));
        }
        // One bf16 rounding of the result plus f32 accumulation over K terms.
        let tol = 8e-3 * want.abs() + 1e-6 * scale + 1e-3;
        let err = (g - want).abs();
        if err > tol {
            return Err(format!(
                "[{i}, {j}] = {g}, want {want} (tolerance {tol:.2e})"
            ));
        }
        worst = worst.max(err / (want.abs() + 1.0));
    }
    Ok(worst)
}
