//! Fused scaled-dot-product attention, forward and backward, on tensor cores
//! (`kernels-src/attention.kg`: FlashAttention-2's algorithm; the scores never reach
//! global memory).
//!
//! Assumes: `q [B, H, S_q, D]`, `k` and `v [B, Hkv, S_k, D]` (logical shapes), all of one
//! dtype T, f16 or bf16; D (the head dimension) 64 or 128; `H % Hkv == 0` (grouped-query
//! attention with GROUP = H / Hkv; Hkv = H is plain multi-head attention); B·H ≤ 65535
//! (the grid's y extent). Every tensor of a call uses one of two layouts, all the same
//! one:
//! - `[B, H, S, D]` storage: viewed as `[B*H, S, D]` (B's stride is H times H's; any
//!   stride along S);
//! - `[B, S, H, D]` storage (what a fused QKV projection gives), passed as its permuted
//!   `[B, H, S, D]` view: viewed as `[B, S, H*D]` (H's stride is D);
//!
//! with the last dimension contiguous and every view 16-byte aligned (base address and
//! strides: the kernels' tiles are read with 16-byte vectors; less aligned views compile
//! to code that spills). A tensor that fits neither layout, or another layout than the
//! tensors before it, is a typed error naming it. `lse` (and the backward's `delta`
//! scratch) are f32 `[B, H, S_q]`, viewable as `[B*H, S_q]` with a unit last stride.
//! Outputs may overlap no input and no other output. `B == 0` is an empty call (nothing
//! is launched); `S_q == 0`, `S_k == 0`, `H == 0` or `Hkv == 0` are shape errors (a
//! query with no key has no softmax, and an empty query sequence would leave dk, dv to
//! be zeroed). Every shape, dtype, device, layout, alignment and aliasing error is found
//! before the first launch.
//!
//! Guarantees:
//! - `o = softmax(scale · q kᵀ + mask) v` and `lse = log Σ_j exp(scale · q_i·k_j)` (natural
//!   log, over the visible keys), `scale` by default `1 / sqrt(D)`. Causal masking is
//!   top-left aligned, as torch's `is_causal`: query i sees keys j ≤ i (also when
//!   S_q ≠ S_k), so every query sees key 0 and no row is empty.
//! - GQA: query head h reads K/V head `h / GROUP` (torch's `repeat_interleave` of the K/V
//!   heads, and `enable_gqa=True`); dk, dv of a K/V head sum the GROUP query heads' terms.
//! - Numerics (as FlashAttention): scores and the online softmax in f32 (exp2 of
//!   `scale·log2(e)`-scaled scores); P is rounded to T before `P·V` (and, in the
//!   backward, `P` and `dS` before their products), accumulators in f32; each output
//!   rounded to T once. `delta = rowsum(dO ∘ O)` is f32.
//! - The backward is three launches, `attention_bwd_delta`, `attention_bwd_dkdv` (one
//!   block per K/V block, looping over the query blocks and the GROUP query heads that
//!   see it) and `attention_bwd_dq` (one block per query block): no atomics, so results
//!   are deterministic bit for bit. `delta` lives in the handle's f32 workspace.
//! - Configurations ([`fwd_candidates`], [`dq_candidates`], [`dkdv_candidates`], measured
//!   there): forward and dq default to BM = BN = 64 with 4 warps, with more candidates
//!   per head dimension and target (at D = 128 on sm_90a, warp-specialized tiles of
//!   BM = 128; the forward's both plain and lagged; at D = 64, BM = 128 on 8 warps too);
//!   dkdv BN = 64 with 4 warps, BM = 32 (at D = 64, BM = 64 first and 32); delta BM = 64. The candidate lists go through the plan and the tuner as the other
//!   ops' do (a list of one is not timed). No host synchronization.

use super::plan::{launches_of, Launch, Pass, PlanKey};
use super::{dtype_err, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_2d, tensor_alignment, RuntimeError, Tensor};

/// The head dimensions the kernels are built for.
pub const ATTENTION_HEAD_DIMS: [usize; 2] = [64, 128];

/// Rows per block of `attention_bwd_delta`.
const DELTA_BM: usize = 64;

/// How the `[B, H, S, D]` tensors of a call are stored, and so what 3-D view the
/// kernels get (their `BSHD` define).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionLayout {
    /// `[B, H, S, D]` storage, viewed as `[B*H, S, D]`.
    Bhsd,
    /// `[B, S, H, D]` storage (a permuted view), viewed as `[B, S, H*D]`.
    Bshd,
}

impl AttentionLayout {
    fn describe(self) -> &'static str {
        match self {
            AttentionLayout::Bhsd => {
                "[B, H, S, D] storage (viewable as [B*H, S, D]: B's stride H times H's, D's stride 1)"
            }
            AttentionLayout::Bshd => {
                "[B, S, H, D] storage, permuted (viewable as [B, S, H*D]: H's stride D, D's stride 1)"
            }
        }
    }

    fn bshd(self) -> bool {
        self == AttentionLayout::Bshd
    }

    /// `t` (`[B, H, S, D]`) as the kernels' 3-D view, or None when its strides do not
    /// fit this layout.
    pub fn view(self, t: &Tensor) -> Option<Tensor> {
        let &[b, h, s, d] = t.shape() else {
            return None;
        };
        let v = match self {
            AttentionLayout::Bhsd => t.view(&[b * h, s, d]).ok()?,
            AttentionLayout::Bshd => t.permute(&[0, 2, 1, 3]).ok()?.view(&[b, s, h * d]).ok()?,
        };
        let last = v.shape()[2];
        (last <= 1 || v.strides()[2] == 1).then_some(v)
    }

    /// A fresh `[B, H, S, D]` tensor of this layout (for `[B, S, H, D]`: the permuted
    /// view of a contiguous `[B, S, H, D]`).
    fn empty(self, ops: &Ops, t: DType, shape: [usize; 4]) -> Result<Tensor, OpError> {
        let [b, h, s, d] = shape;
        Ok(match self {
            AttentionLayout::Bhsd => ops.empty(t, &shape)?,
            AttentionLayout::Bshd => ops.empty(t, &[b, s, h, d])?.permute(&[0, 2, 1, 3])?,
        })
    }
}

/// One launch configuration of an attention kernel: BM query rows and BN keys per
/// block step, and the warps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    pub bm: usize,
    pub bn: usize,
    pub warps: u32,
    /// Blocks that must fit on one SM (`.minnctapersm`: registers capped to fit them),
    /// or `None`.
    pub min_blocks: Option<u32>,
    /// Warp-specialized (sm_90a): a producer warpgroup issues TMA copies of the K/V (or
    /// Q/dO) tiles while the `warps` compute, with `setmaxnreg` giving the consumers
    /// the registers. Otherwise the tiles are copied with `cp.async` by every thread:
    /// TMA without a producer measured slower for these kernels (docs/PERFORMANCE.md).
    pub ws: bool,
    /// The forward with P·V one block behind (`attention_fwd`'s `LAG`: the products run
    /// beside the softmax); the other kernels ignore it.
    pub lag: bool,
}

impl AttentionConfig {
    fn label(&self) -> String {
        let mut l = format!("BM={},BN={},w{}", self.bm, self.bn, self.warps);
        if let Some(m) = self.min_blocks {
            l += &format!(",{m}/SM");
        }
        if self.ws {
            l += ",ws";
        }
        if self.lag {
            l += ",lag";
        }
        l
    }

    /// How its kernels are built.
    pub(crate) fn variant(&self) -> super::Variant {
        super::Variant {
            min_blocks_per_sm: self.min_blocks,
            num_stages: None,
            no_tma: !self.ws,
            ws: self.ws,
        }
    }
}

const fn cfg(bm: usize, bn: usize, warps: u32) -> AttentionConfig {
    AttentionConfig {
        bm,
        bn,
        warps,
        min_blocks: None,
        ws: false,
        lag: false,
    }
}

/// `c` with P·V one block behind (the forward's `LAG`).
const fn lagged(c: AttentionConfig) -> AttentionConfig {
    AttentionConfig { lag: true, ..c }
}

/// `c` warp-specialized (sm_90a; the same `cp.async` kernel elsewhere).
const fn specialized(c: AttentionConfig) -> AttentionConfig {
    AttentionConfig { ws: true, ..c }
}

/// `c` with registers capped so that `m` blocks fit on an SM. At D = 64 the forward and
/// dQ kernels take 176–210 registers (2 blocks of 128 threads per SM); capped for 3 they
/// take 148–168 without spilling on either target (ptxas 13.0), which the tuner weighs
/// against the latency-hiding of a third block.
const fn per_sm(c: AttentionConfig, m: u32) -> AttentionConfig {
    AttentionConfig {
        min_blocks: Some(m),
        ..c
    }
}

/// The forward's candidates for head dimension `d`, the default first: BM = BN = 64 with
/// 4 warps. BM = 128 with 8 warps (D = 64; compiles without spills) lost everywhere it
/// was timed causal (for not causal, see below): on an H200 (sm_90a, bf16, causal, `kgen run
/// --bench`) 484 against 616 µs at B·H = 64, S = 4096; 20.3 against 24.0 µs at 16 x 1024;
/// 10.7 against 15.0 µs at 8 x 512. At D = 128, FlashAttention-3's shape: BM = BN = 128
/// on two consumer warpgroups fed by a TMA producer warpgroup (H100, B·H = 128,
/// S = 4096, causal: 1025 against 1238 µs for BM = BN = 64; at D = 64, 122 against 102
/// µs, so not offered there), plain and lagged (`LAG`: P·V one block behind, beside the
/// softmax; same card and shape, causal 987 against 1025 µs, not causal 1706–1712
/// against 1838; it does one more product pair per row block, so the tuner times both:
/// at B·H = 128, S = 2048 the plain loop stays ahead). At D = 64 (BM = BN = 64, 4 warps)
/// the lagged loop lost (106 against 100 µs causal, B·H = 192, S = 1024), so it is not
/// offered there.
///
/// At D = 64, BM = 128, BN = 64 on 8 warps (two warpgroups over 64-row halves, no
/// producer) wins when not causal and loses when causal (H100, `kgen run --bench`,
/// thirty-first session, µs against BM = BN = 64 on 4 warps; B·H × S: 192 × 1024, 64 ×
/// 4096, 384 × 512): not causal 145.5 / 670 / 86.4 against 154.9 / 705 / 92.8, causal
/// 104.0 / 392 / 71.4 against 100.2 / 394 / 67.8. The tuner keys on `causal`, so it is
/// offered and each shape takes its own.
pub fn fwd_candidates(d: usize, arch: kgen_core::Arch) -> Vec<AttentionConfig> {
    if d == 64 {
        vec![cfg(64, 64, 4), per_sm(cfg(64, 64, 4), 3), cfg(128, 64, 8)]
    } else if arch == kgen_core::Arch::Sm90a {
        vec![
            cfg(64, 64, 4),
            specialized(cfg(128, 128, 8)),
            lagged(specialized(cfg(128, 128, 8))),
        ]
    } else {
        // Without a producer (sm_80: `mma.sync`, 255 registers) it spills.
        vec![cfg(64, 64, 4)]
    }
}

/// `attention_bwd_dq`'s candidates, as [`fwd_candidates`]: BM = 128 with 8 warps lost
/// there too for D = 64, causal (490 against 685 µs, 22.6 against 27.0, 12.3 against 16.7), but
/// won for D = 128 on an H100 (B·H = 128, S = 4096, causal: 1791 against 2070 µs;
/// B·H = 32, S = 16384: 6558 against 7488), so the tuner times both there.
///
/// At D = 128 the BM = 128 kernel also comes warp-specialized (a TMA producer
/// warpgroup; H100, B·H = 128, S = 4096, causal: 1309 against 1459 µs with TMA and no
/// producer). At D = 64 that lost (137–142 against 108 µs).
///
/// At D = 64 the plain BM = 128, BN = 64 on 8 warps is offered too: not causal it is a
/// little faster (H100, same shapes as the forward's: 155.3 / 690 / 97.5 against
/// 159.8 / 688 / 100.2 µs), causal it loses by 30–45% (the tuner keys on `causal`).
pub fn dq_candidates(d: usize, arch: kgen_core::Arch) -> Vec<AttentionConfig> {
    if d == 128 && arch == kgen_core::Arch::Sm90a {
        vec![
            cfg(64, 64, 4),
            cfg(128, 64, 8),
            specialized(cfg(128, 64, 8)),
        ]
    } else if d == 128 {
        vec![cfg(64, 64, 4), cfg(128, 64, 8)]
    } else {
        vec![cfg(64, 64, 4), per_sm(cfg(64, 64, 4), 3), cfg(128, 64, 8)]
    }
}

/// `attention_bwd_dkdv`'s candidates, the default first: BM = 32, BN = 64, 4 warps.
/// Measured on an H200 (sm_90a, B·H = 64, S = 4096, causal / not, µs): D = 128 BM = 32
/// 1306 / 2523, BM = 16 1821 / 3586, BM = 32 with 8 warps 3826 / 7424, BM = 64 BN = 64
/// with 8 warps 2492 / 4734, BN = 32 (BM = 16, 32, 64) 2956 to 3470 / 5692 to 6824; D = 64
/// BM = 32 799 / 1544, BM = 16 970 / 1896, 8 warps 2569. (D = 128 with BM = 32 spilled 4
/// bytes on sm_80 until the kernel stopped masking keys past S_k, which never reach a
/// stored row; it now takes 252 registers there.)
///
/// Tried at D = 128 on sm_90a: BN = 128 on two consumer warpgroups fed by a TMA
/// producer warpgroup (each warpgroup owns 64 keys' dK and dV, as the 4-warp kernel's
/// one does). Alone, on random inputs, it was faster (H100, B·H = 128, S = 4096, `kgen
/// run --bench`: causal 2281 / 2275 against 2503 / 2477 µs), but the op's tuner, timing
/// the three launches on real data, found it 60–330 µs slower with every dq candidate at
/// all three D = 128 shapes of `kgen bench` (twenty-fifth session), so it is not offered.
/// The check of every candidate launches each of this list too. (Measured again in the
/// thirty-first session, in the op: forcing that kernel left the backward at 3791 against
/// 3782 µs at 4 × 32 × 4096 and made it 1088 against 1035 µs at 8 × 16 × 2048.)
///
/// At D = 64, BM = 64 (4 warps) is as fast or faster than BM = 32 (H100, `kgen run
/// --bench`, thirty-first session, µs, BM = 64 against 32; B·H × S = 192 × 1024 and
/// 64 × 4096): not causal 302 / 1306 against 308 / 1408, causal 184 / 706 against 184 /
/// 756; it comes first there and the tuner times both. (BM = 16: 369 / 1760 and 217 /
/// 944; 8 warps on BN = 64: 4x slower; BN = 128 on 8 warps: 342 / 1494 and 224 / 838,
/// with a producer 293 / 1283 and 198 / 746.) At D = 128, BM = 64 needs more registers
/// than a thread has (the compiler's estimate: about 256).
pub fn dkdv_candidates(d: usize, _arch: kgen_core::Arch) -> Vec<AttentionConfig> {
    if d == 64 {
        vec![cfg(64, 64, 4), cfg(32, 64, 4)]
    } else {
        vec![cfg(32, 64, 4)]
    }
}

/// The sizes of one call, checked.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    t: DType,
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    scale: f32,
}

impl Geometry {
    fn group(&self) -> usize {
        self.h / self.hkv
    }

    /// The compile-time values every attention kernel but `attention_bwd_delta` takes.
    fn defines(
        &self,
        c: AttentionConfig,
        causal: bool,
        layout: AttentionLayout,
    ) -> Vec<(&'static str, String)> {
        vec![
            ("T", self.t.to_string()),
            ("D", self.d.to_string()),
            ("BM", c.bm.to_string()),
            ("BN", c.bn.to_string()),
            ("CAUSAL", causal.to_string()),
            ("GROUP", self.group().to_string()),
            ("BSHD", layout.bshd().to_string()),
        ]
    }

    fn shape_key(&self, causal: bool, layout: AttentionLayout) -> String {
        format!(
            "T={},D={},B={},H={},Hkv={},Sq={},Sk={},causal={causal},{layout:?}",
            self.t, self.d, self.b, self.h, self.hkv, self.sq, self.sk
        )
    }

    /// The plan key's words: the flags and head counts (the views' shapes give the
    /// rest).
    fn key(&self, op: &'static str, causal: bool, layout: AttentionLayout) -> PlanKey {
        PlanKey::new(op)
            .word(causal as u64)
            .word(layout.bshd() as u64)
            .word(self.h as u64)
            .word(self.hkv as u64)
    }

    fn q_shape(&self) -> [usize; 4] {
        [self.b, self.h, self.sq, self.d]
    }

    fn kv_shape(&self) -> [usize; 4] {
        [self.b, self.hkv, self.sk, self.d]
    }

    /// `[cdiv(s, block), heads, 1]`.
    fn grid(&self, s: usize, block: usize, heads: usize) -> Result<[u32; 3], OpError> {
        Ok(grid_2d(s, block, heads, 1)?)
    }
}

/// Checks q, k, v (dtype, ranks, sizes, head counts) and the scale.
fn geometry(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: Option<f64>,
) -> Result<Geometry, OpError> {
    let t = q.dtype();
    if !matches!(t, DType::F16 | DType::BF16) {
        return Err(dtype_err(op, format!("`q` must be f16 or bf16, got {t}")));
    }
    for (name, x) in [("k", k), ("v", v)] {
        if x.dtype() != t {
            return Err(dtype_err(
                op,
                format!("`{name}` must be {t} like `q`, got {}", x.dtype()),
            ));
        }
    }
    let four = |name: &str, x: &Tensor| -> Result<[usize; 4], OpError> {
        <[usize; 4]>::try_from(x.shape()).map_err(|_| {
            shape_err(
                op,
                format!("`{name}` must be [B, H, S, D], got shape {:?}", x.shape()),
            )
        })
    };
    let [b, h, sq, d] = four("q", q)?;
    let [bk, hkv, sk, dk] = four("k", k)?;
    if bk != b || dk != d {
        return Err(shape_err(
            op,
            format!(
                "`k` {:?} must be [B, Hkv, S_k, D] with q's B = {b} and D = {d}",
                k.shape()
            ),
        ));
    }
    if v.shape() != k.shape() {
        return Err(shape_err(
            op,
            format!("`v` {:?} must have k's shape {:?}", v.shape(), k.shape()),
        ));
    }
    if !ATTENTION_HEAD_DIMS.contains(&d) {
        return Err(shape_err(
            op,
            format!("head dimension D = {d}: the kernels take D = 64 or 128"),
        ));
    }
    if h == 0 || hkv == 0 || h % hkv != 0 {
        return Err(shape_err(
            op,
            format!("{h} query heads and {hkv} K/V heads: H must be a positive multiple of Hkv"),
        ));
    }
    if sq == 0 || sk == 0 {
        return Err(shape_err(
            op,
            format!("S_q = {sq}, S_k = {sk}: both sequences must be non-empty"),
        ));
    }
    if b * h > 65535 {
        return Err(shape_err(
            op,
            format!("B*H = {} exceeds the grid's 65535 blocks along y", b * h),
        ));
    }
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    // Positive: the kernels apply it to each row's max (`max(s) · scale`), which is the
    // max of the scaled scores only for scale > 0.
    if !scale.is_finite() || scale <= 0.0 || scale > f32::MAX as f64 {
        return Err(shape_err(
            op,
            format!("scale {scale} must be positive and finite (in f32)"),
        ));
    }
    Ok(Geometry {
        t,
        b,
        h,
        hkv,
        sq,
        sk,
        d,
        scale: scale as f32,
    })
}

/// Checks `t` has exactly `shape` and `dtype`.
fn expect4(
    op: &'static str,
    name: &str,
    t: &Tensor,
    dtype: DType,
    shape: [usize; 4],
) -> Result<(), OpError> {
    super::expect(op, name, t, dtype, &shape)
}

/// The layout every tensor of `ts` fits (the first of [`AttentionLayout::Bhsd`] and
/// [`AttentionLayout::Bshd`] they all fit), or an error naming the first tensor that
/// fits none of the layouts the tensors before it allow.
fn pick_layout(op: &'static str, ts: &[(&str, &Tensor)]) -> Result<AttentionLayout, OpError> {
    let all = [AttentionLayout::Bhsd, AttentionLayout::Bshd];
    let mut ok = all.to_vec();
    for (i, (name, t)) in ts.iter().enumerate() {
        let fits: Vec<AttentionLayout> =
            ok.iter().copied().filter(|l| l.view(t).is_some()).collect();
        if fits.is_empty() {
            let what = format!(
                "`{name}` (shape {:?}, strides {:?})",
                t.shape(),
                t.strides()
            );
            let before: Vec<String> = ts[..i].iter().map(|(n, _)| format!("`{n}`")).collect();
            return Err(shape_err(
                op,
                if ok.len() == all.len() {
                    format!(
                        "{what} fits neither layout: {} or {}",
                        all[0].describe(),
                        all[1].describe()
                    )
                } else {
                    format!(
                        "{what} must be {}, as {} (one layout for every tensor of the call)",
                        ok[0].describe(),
                        before.join(", ")
                    )
                },
            ));
        }
        ok = fits;
    }
    Ok(ok[0])
}

/// The kernels' view of each `[B, H, S, D]` tensor of `ts` in `layout`, each checked for
/// 16-byte alignment.
fn views(
    op: &'static str,
    layout: AttentionLayout,
    ts: &[(&str, &Tensor)],
) -> Result<Vec<Tensor>, OpError> {
    ts.iter()
        .map(|(name, t)| {
            let v = layout
                .view(t)
                .ok_or_else(|| shape_err(op, format!("`{name}` must be {}", layout.describe())))?;
            let a = tensor_alignment(&v);
            if a < 16 {
                return Err(shape_err(
                    op,
                    format!(
                        "`{name}` (strides {:?}, offset {}) is {a}-byte aligned: its base \
                         address and strides must be multiples of 16 bytes",
                        t.strides(),
                        t.offset()
                    ),
                ));
            }
            Ok(v)
        })
        .collect()
}

/// `lse` (f32 `[B, H, S_q]`) as the kernels' `[B*H, S_q]` with a unit last stride.
fn rows_view(op: &'static str, name: &str, t: &Tensor, g: &Geometry) -> Result<Tensor, OpError> {
    super::expect(op, name, t, DType::F32, &[g.b, g.h, g.sq])?;
    let v = t
        .view(&[g.b * g.h, g.sq])
        .ok()
        .filter(|v| g.sq <= 1 || v.strides()[1] == 1);
    v.ok_or_else(|| {
        shape_err(
            op,
            format!(
                "`{name}` (strides {:?}) must be viewable as [B*H, S_q] with a unit last stride",
                t.strides()
            ),
        )
    })
}

/// Checks every tensor is on `ops`'s device.
fn same_device(ops: &Ops, op: &'static str, ts: &[(&str, &Tensor)]) -> Result<(), OpError> {
    for (name, t) in ts {
        if !t.device().same(ops.device()) {
            return Err(OpError::Runtime(RuntimeError::WrongDevice(format!(
                "{op}: `{name}` lives on {}, the ops handle on {}",
                t.device().describe(),
                ops.device().describe()
            ))));
        }
    }
    Ok(())
}

/// Checks no output overlaps an input or another output.
fn no_aliasing(
    op: &'static str,
    outputs: &[(&str, &Tensor)],
    inputs: &[(&str, &Tensor)],
) -> Result<(), OpError> {
    for (i, (o, ot)) in outputs.iter().enumerate() {
        for (name, t) in inputs.iter().chain(&outputs[i + 1..]) {
            if ot.overlaps(t) {
                return Err(shape_err(
                    op,
                    format!(
                        "`{o}` overlaps `{name}`: an output may share memory with no other argument"
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl Ops {
    /// Scaled-dot-product attention of `q [B, H, S_q, D]` over `k, v [B, Hkv, S_k, D]`
    /// (module docs: layouts, GQA, causal alignment, numerics). `scale` defaults to
    /// `1 / sqrt(D)`. Returns `(o, lse)`: o of q's shape, dtype and layout, lse f32
    /// `[B, H, S_q]` (natural log), what [`Ops::attention_backward`] needs.
    pub fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<(Tensor, Tensor), OpError> {
        const OP: &str = "attention";
        let g = geometry(OP, q, k, v, scale)?;
        let layout = pick_layout(OP, &[("q", q), ("k", k), ("v", v)])?;
        let o = layout.empty(self, g.t, g.q_shape())?;
        let lse = self.empty(DType::F32, &[g.b, g.h, g.sq])?;
        self.attention_into(q, k, v, causal, scale, &o, &lse)?;
        Ok((o, lse))
    }

    /// [`Ops::attention`] into existing `o` (q's shape and dtype, q's layout) and `lse`
    /// (f32 `[B, H, S_q]`, viewable as `[B*H, S_q]` with a unit last stride).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_into(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f64>,
        o: &Tensor,
        lse: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "attention";
        let g = geometry(OP, q, k, v, scale)?;
        expect4(OP, "o", o, g.t, g.q_shape())?;
        let lse2 = rows_view(OP, "lse", lse, &g)?;
        let big = [("q", q), ("k", k), ("v", v), ("o", o)];
        same_device(
            self,
            OP,
            &[("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse)],
        )?;
        no_aliasing(
            OP,
            &[("o", o), ("lse", lse)],
            &[("q", q), ("k", k), ("v", v)],
        )?;
        let layout = pick_layout(OP, &big)?;
        let vs = views(OP, layout, &big)?;
        if g.b == 0 {
            return Ok(());
        }
        let cands = fwd_candidates(g.d, self.device.arch());
        let args = KernelArgs::new()
            .tensor("q", &vs[0])
            .tensor("k", &vs[1])
            .tensor("v", &vs[2])
            .tensor("o", &vs[3])
            .tensor("lse", &lse2)
            .scalar("heads", g.h as i32)
            .scalar("scale", g.scale);
        self.launch_planned(
            g.key("attention_fwd", causal, layout),
            &args,
            || g.shape_key(causal, layout),
            || cands.iter().map(AttentionConfig::label).collect(),
            |i| {
                let c = cands[i];
                let mut defines = g.defines(c, causal, layout);
                defines.push(("LAG", c.lag.to_string()));
                let kern = self.kernel_variant(
                    "attention",
                    "attention_fwd",
                    &defines,
                    Some(c.warps),
                    c.variant(),
                    &args,
                )?;
                Ok((kern, g.grid(g.sq, c.bm, g.b * g.h)?))
            },
        )
    }

    /// Gradients of [`Ops::attention`]: given its inputs, its output `o`, its `lse` and
    /// the output's gradient `dout` (o's shape, dtype and layout), returns
    /// `(dq, dk, dv)` with the shapes, dtype and layout of q, k, v. Three launches
    /// (module docs), deterministic.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        lse: &Tensor,
        dout: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<(Tensor, Tensor, Tensor), OpError> {
        const OP: &str = "attention_backward";
        let g = geometry(OP, q, k, v, scale)?;
        let layout = pick_layout(
            OP,
            &[("q", q), ("k", k), ("v", v), ("o", o), ("dout", dout)],
        )?;
        let dq = layout.empty(self, g.t, g.q_shape())?;
        let dk = layout.empty(self, g.t, g.kv_shape())?;
        let dv = layout.empty(self, g.t, g.kv_shape())?;
        self.attention_backward_into(q, k, v, o, lse, dout, causal, scale, &dq, &dk, &dv)?;
        Ok((dq, dk, dv))
    }

    /// [`Ops::attention_backward`] into existing `dq`, `dk`, `dv` (the shapes and dtype
    /// of q, k, v; every tensor of the call in one layout).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward_into(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        lse: &Tensor,
        dout: &Tensor,
        causal: bool,
        scale: Option<f64>,
        dq: &Tensor,
        dk: &Tensor,
        dv: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "attention_backward";
        let g = geometry(OP, q, k, v, scale)?;
        expect4(OP, "o", o, g.t, g.q_shape())?;
        expect4(OP, "dout", dout, g.t, g.q_shape())?;
        expect4(OP, "dq", dq, g.t, g.q_shape())?;
        expect4(OP, "dk", dk, g.t, g.kv_shape())?;
        expect4(OP, "dv", dv, g.t, g.kv_shape())?;
        let lse2 = rows_view(OP, "lse", lse, &g)?;
        let inputs = [
            ("q", q),
            ("k", k),
            ("v", v),
            ("o", o),
            ("lse", lse),
            ("dout", dout),
        ];
        let outputs = [("dq", dq), ("dk", dk), ("dv", dv)];
        same_device(self, OP, &inputs)?;
        same_device(self, OP, &outputs)?;
        no_aliasing(OP, &outputs, &inputs)?;
        let big = [
            ("q", q),
            ("k", k),
            ("v", v),
            ("o", o),
            ("dout", dout),
            ("dq", dq),
            ("dk", dk),
            ("dv", dv),
        ];
        let layout = pick_layout(OP, &big)?;
        let vs = views(OP, layout, &big)?;
        if g.b == 0 {
            return Ok(());
        }
        let [q3, k3, v3, o3, do3, dq3, dk3, dv3] = &vs[..] else {
            return Err(shape_err(OP, "internal: 8 views expected"));
        };
        let (workspace, delta) = self.take_workspace(&[g.b * g.h, g.sq])?;
        let delta_args = KernelArgs::new()
            .tensor("o", o3)
            .tensor("dout", do3)
            .tensor("delta", &delta)
            .scalar("heads", g.h as i32);
        let dkdv_args = KernelArgs::new()
            .tensor("q", q3)
            .tensor("k", k3)
            .tensor("v", v3)
            .tensor("dout", do3)
            .tensor("lse", &lse2)
            .tensor("delta", &delta)
            .tensor("dk", dk3)
            .tensor("dv", dv3)
            .scalar("heads", g.h as i32)
            .scalar("scale", g.scale);
        let dq_args = KernelArgs::new()
            .tensor("q", q3)
            .tensor("k", k3)
            .tensor("v", v3)
            .tensor("dout", do3)
            .tensor("lse", &lse2)
            .tensor("delta", &delta)
            .tensor("dq", dq3)
            .scalar("heads", g.h as i32)
            .scalar("scale", g.scale);
        // Every dq candidate with every dK/dV candidate (the dK/dV one varying fastest).
        let dq_cands = dq_candidates(g.d, self.device.arch());
        let kv_cands = dkdv_candidates(g.d, self.device.arch());
        let cands: Vec<(AttentionConfig, AttentionConfig)> = dq_cands
            .iter()
            .flat_map(|&c| kv_cands.iter().map(move |&kv| (c, kv)))
            .collect();
        // The delta scratch is the workspace's start (16-byte aligned, rows of S_q: its
        // alignment follows from lse's shape): not part of the key.
        let key = g
            .key("attention_bwd", causal, layout)
            .tensors(&[q3, k3, v3, o3, &lse2, do3, dq3, dk3, dv3]);
        let resolve = |i: usize| -> Result<Vec<Launch>, OpError> {
            let (c, kv) = cands[i];
            let delta_k = self.kernel(
                "attention",
                "attention_bwd_delta",
                &[
                    ("T", g.t.to_string()),
                    ("D", g.d.to_string()),
                    ("BM", DELTA_BM.to_string()),
                    ("BSHD", layout.bshd().to_string()),
                ],
                None,
                &delta_args,
            )?;
            let dkdv_k = self.kernel_variant(
                "attention",
                "attention_bwd_dkdv",
                &g.defines(kv, causal, layout),
                Some(kv.warps),
                kv.variant(),
                &dkdv_args,
            )?;
            let dq_k = self.kernel_variant(
                "attention",
                "attention_bwd_dq",
                &g.defines(c, causal, layout),
                Some(c.warps),
                c.variant(),
                &dq_args,
            )?;
            Ok(vec![
                (delta_k, g.grid(g.sq, DELTA_BM, g.b * g.h)?),
                (dkdv_k, g.grid(g.sk, kv.bn, g.b * g.hkv)?),
                (dq_k, g.grid(g.sq, c.bm, g.b * g.h)?),
            ])
        };
        let run = |_: usize, launches: &[Launch], pass: Pass| -> Result<f32, OpError> {
            let [(dk_, dg), (kk, kg), (qk, qg)] = launches_of::<3>(OP, launches)?;
            let mut ms = self.launch_maybe_timed(dk_, *dg, delta_args.args(), pass)?;
            ms += self.launch_maybe_timed(kk, *kg, dkdv_args.args(), pass)?;
            Ok(ms + self.launch_maybe_timed(qk, *qg, dq_args.args(), pass)?)
        };
        let r = self.launch_tuned_planned(
            key,
            || g.shape_key(causal, layout),
            || {
                cands
                    .iter()
                    .map(|(c, kv)| format!("dq {} dkdv {}", c.label(), kv.label()))
                    .collect()
            },
            resolve,
            run,
        );
        self.give_back_workspace(workspace);
        r.map(|_| ())
    }
}
