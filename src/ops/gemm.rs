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

/// A gemm configuration: tile sizes, warps, pipeline depth, and whether each block
/// walks several tiles (`gemm.kg`'s `PERSISTENT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmConfig {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub warps: u32,
    pub stages: u32,
    /// Launched on as many blocks as the GPU holds at once (at most one per tile), each
    /// taking tiles `grid` apart: a tile's copies start while the previous tile's
    /// epilogue runs.
    pub persistent: bool,
}

impl GemmConfig {
    pub fn label(&self) -> String {
        format!(
            "BM={} BN={} BK={} w{} s{}{}",
            self.bm,
            self.bn,
            self.bk,
            self.warps,
            self.stages,
            if self.persistent { " persistent" } else { "" }
        )
    }
}

/// One configuration of one tile per block.
const fn cfg(bm: u32, bn: u32, bk: u32, warps: u32, stages: u32) -> GemmConfig {
    GemmConfig {
        bm,
        bn,
        bk,
        warps,
        stages,
        persistent: false,
    }
}

/// The tuner's candidates for operands whose rows are 16-byte aligned, the default
/// first; [`narrow_candidates`] for 8- or 4-byte aligned rows, [`unaligned_candidates`]
/// for the others.
pub fn candidates() -> Vec<GemmConfig> {
    let c = cfg;
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

/// Candidates for operands whose rows allow `cp.async` copies but not all of them in
/// 16-byte pieces (8- or 4-byte aligned rows: `cp.async.ca` of 8 or 4 bytes, more
/// copies and addresses per stage): at most 64 accumulator elements per thread and
/// BK 32. With these rows every 128-per-thread tile of [`candidates`] spilled, 4 to 656
/// bytes, in some orientation on sm_80 or sm_90a (and the 64-wide BK ones 8 to 200
/// bytes); these do not, for every orientation, epilogue and alignment of c (ptxas
/// 13.0; `tests/no_spills.rs` covers the classes through `ops::launchable`).
pub fn narrow_candidates() -> Vec<GemmConfig> {
    let c = cfg;
    vec![
        c(128, 128, 32, 8, 3),
        c(128, 128, 32, 8, 4),
        c(64, 128, 32, 4, 4),
        c(128, 64, 32, 4, 3),
        c(64, 64, 32, 4, 3),
    ]
}

/// Persistent candidates, added to [`candidates`] on sm_90a (wgmma: the tiles where
/// the per-tile fill and epilogue weigh, a short K such as an LM head's 768, gain from
/// overlapping them with the next tile's copies). The 128 x 256 tile only without a
/// bias: with one, its outer loop puts the register estimate at 218 against 216.
pub fn persistent_candidates(arch: kgen_core::Arch, bias: bool) -> Vec<GemmConfig> {
    if arch != kgen_core::Arch::Sm90a {
        return Vec::new();
    }
    let p = |c: GemmConfig| GemmConfig {
        persistent: true,
        ..c
    };
    let mut v = vec![p(cfg(128, 128, 64, 8, 4))];
    if !bias {
        v.push(p(cfg(128, 256, 64, 8, 4)));
    }
    v
}

/// Whether `cfg`'s pipeline stages (a tile of a and one of b each, 16-bit) fit the
/// shared memory one block of `arch` may use: 4 stages of 128 x 256 x 64 (192 KiB) do
/// on sm_90a, not on sm_80 (163 KiB), where the tuner would only build and drop them.
pub fn fits_shared(cfg: &GemmConfig, arch: kgen_core::Arch) -> bool {
    let stage = 2 * (cfg.bm * cfg.bk + cfg.bk * cfg.bn) as usize;
    cfg.stages as usize * stage <= arch.target().max_shared_bytes_per_block as usize
}

/// Whether `cfg` spills reading a transposed a (TRANS_A) with 16-byte aligned rows:
/// 128 x 128 x 64 at 4 warps, 4 bytes on sm_80 (ptxas 13.0).
fn spills_with_trans_a(cfg: &GemmConfig) -> bool {
    (cfg.bm, cfg.bn, cfg.bk, cfg.warps) == (128, 128, 64, 4)
}

/// Candidates for operands whose rows are only 2-byte aligned (an odd K or N in f16/
/// bf16): their tiles are copied element by element (`ld.global` + `st.shared`), which
/// holds each element in a register on its way, so the tiles are smaller (measured: the
/// 128 x 128 configurations spill there, tests/no_spills.rs).
pub fn unaligned_candidates() -> Vec<GemmConfig> {
    let c = cfg;
    vec![
        c(128, 128, 32, 8, 3),
        c(64, 64, 32, 4, 3),
        c(64, 128, 32, 8, 3),
        c(128, 64, 32, 8, 3),
    ]
}

/// The most accumulator elements per thread of an epilogue that also writes the
/// pre-activation (`PREACT`): the f32 accumulator and the 16-bit tile being stored are
/// live together, so a 128 x 128 tile at 4 warps (128 per thread) needs about 274
/// registers (over the 216 the compiler allows); at 8 warps about 146.
const PREACT_MAX_PER_THREAD: u32 = 64;

/// `cands` for an epilogue that also writes the pre-activation: the ones within
/// [`PREACT_MAX_PER_THREAD`], the first 8-warp 128 x 128 tile (wgmma on sm_90a) moved to
/// the front, and 128 x 128 x 32 at 8 warps when the list has no such tile.
pub fn preact_candidates(cands: &[GemmConfig]) -> Vec<GemmConfig> {
    let fits = |c: &GemmConfig| c.bm * c.bn / (32 * c.warps) <= PREACT_MAX_PER_THREAD;
    let mut v: Vec<GemmConfig> = cands.iter().copied().filter(fits).collect();
    let wide = |c: &GemmConfig| (c.bm, c.bn, c.warps) == (128, 128, 8);
    if let Some(i) = v.iter().position(wide) {
        let c = v.remove(i);
        v.insert(0, c);
    } else {
        v.insert(0, cfg(128, 128, 32, 8, 3));
    }
    v
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
        let align = kgen_runtime::tensor_alignment(&sa).min(kgen_runtime::tensor_alignment(&sb));
        let mut cands = match align {
            16.. => candidates(),
            4.. => narrow_candidates(),
            _ => unaligned_candidates(),
        };
        if ta {
            cands.retain(|c| !spills_with_trans_a(c));
        }
        if z.is_some() {
            cands = preact_candidates(&cands);
        } else if align >= 16 {
            cands.extend(persistent_candidates(self.device().arch(), bias.is_some()));
        }
        cands.retain(|c| fits_shared(c, self.device().arch()));
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
                ("PERSISTENT", cfg.persistent.to_string()),
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
                let blocks = if cfg.persistent {
                    tiles.min((self.sm_count() * resident_blocks(&kern)).max(1))
                } else {
                    tiles
                };
                let grid = [
                    u32::try_from(blocks).map_err(|_| shape_err(op, "too many tiles"))?,
                    1,
                    1,
                ];
                Ok((kern, grid))
            },
        )
    }
}

/// Blocks of `k` one SM holds at once: the least of its shared memory (228 KiB per SM,
/// 1 KiB reserved per block), its threads (2,048) and, on a GPU, its registers (65,536,
/// allocated 8 per thread at a time); at most 32.
pub fn resident_blocks(k: &kgen_runtime::Kernel) -> usize {
    let launch = k.compiled().launch;
    let threads = launch.threads_per_block.max(1) as usize;
    let smem = (launch.static_shared_bytes + launch.dynamic_shared_bytes) as usize + 1024;
    let by_smem = 233_472 / smem;
    let by_threads = 2048 / threads;
    let by_regs = match k.resources() {
        Some((regs, _)) => 65_536 / (regs.max(1).div_ceil(8) as usize * 8 * threads),
        None => 32,
    };
    by_smem.min(by_threads).min(by_regs).clamp(1, 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pre-activation's candidates keep to 64 accumulator elements per thread,
    /// 8-warp 128 x 128 tiles first.
    #[test]
    fn every_candidate_compiles_where_it_fits_and_the_first_fits_everywhere() {
        use kgen_core::{compile, Arch, CompileOptions, SourceFile};
        let src = SourceFile::new(
            "gemm.kg",
            crate::bundled::source("gemm").expect("kernels-src/gemm.kg"),
        );
        for list in [candidates(), narrow_candidates(), unaligned_candidates()] {
            for arch in [Arch::Sm90a, Arch::Sm80] {
                assert!(fits_shared(&list[0], arch), "{:?} on {arch}", list[0]);
                for c in &list {
                    let mut o = CompileOptions::new(arch)
                        .define("BM", c.bm)
                        .define("BN", c.bn)
                        .define("BK", c.bk);
                    o.num_warps = Some(c.warps);
                    o.num_stages = Some(c.stages);
                    let r = compile(&src, &o);
                    assert_eq!(r.is_ok(), fits_shared(c, arch), "{c:?} on {arch}");
                }
            }
        }
    }

    /// The persistent candidates are offered on sm_90a only, and each compiles with
    /// every epilogue it is offered for (the 128 x 256 one only without a bias).
    #[test]
    fn persistent_candidates_compile_for_their_epilogues() {
        use kgen_core::{compile, Arch, CompileOptions, SourceFile};
        assert!(persistent_candidates(Arch::Sm80, false).is_empty());
        let src = SourceFile::new(
            "gemm.kg",
            crate::bundled::source("gemm").expect("kernels-src/gemm.kg"),
        );
        for bias in [false, true] {
            let list = persistent_candidates(Arch::Sm90a, bias);
            assert_eq!(list.len(), if bias { 1 } else { 2 });
            for c in &list {
                assert!(c.persistent && fits_shared(c, Arch::Sm90a));
                for act in 0..4 {
                    let mut o = CompileOptions::new(Arch::Sm90a)
                        .define("BM", c.bm)
                        .define("BN", c.bn)
                        .define("BK", c.bk)
                        .define("BIAS", bias)
                        .define("ACT", act)
                        .define("TRANS_B", true)
                        .define("PERSISTENT", true);
                    o.num_warps = Some(c.warps);
                    o.num_stages = Some(c.stages);
                    let k =
                        compile(&src, &o).unwrap_or_else(|d| panic!("{c:?}: {}", d.render(&src)));
                    assert!(k.ptx.contains("%nctaid.x"), "{c:?}: not persistent");
                }
            }
        }
    }

    #[test]
    fn preact_candidates_fit_their_epilogue() {
        for list in [candidates(), unaligned_candidates()] {
            let p = preact_candidates(&list);
            assert!(!p.is_empty());
            assert_eq!((p[0].bm, p[0].bn, p[0].warps), (128, 128, 8));
            for c in &p {
                assert!(
                    c.bm * c.bn / (32 * c.warps) <= PREACT_MAX_PER_THREAD,
                    "{c:?}"
                );
            }
        }
        assert_eq!(preact_candidates(&candidates()).len(), 3);
    }

    /// Every list's tiles hold at most 128 accumulator elements per thread, the narrow
    /// and unaligned ones at most 64 with BK 32.
    #[test]
    fn candidate_lists_keep_their_register_budgets() {
        let per_thread = |c: &GemmConfig| c.bm * c.bn / (32 * c.warps);
        assert!(candidates().iter().all(|c| per_thread(c) <= 128));
        for c in narrow_candidates().iter().chain(&unaligned_candidates()) {
            assert!(per_thread(c) <= 64 && c.bk == 32, "{c:?}");
        }
        assert!(candidates().iter().any(spills_with_trans_a));
    }
}
