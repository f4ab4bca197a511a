//! Self-checks of attention (`ops/attention.rs`), forward and backward, against the
//! float64 reference of [`crate::cases::torch_attention`]: sequence lengths 1, 7, 127 and
//! 1000 (and S_q ≠ S_k, where causal masking is top-left aligned), D = 64 and 128, causal
//! and not, grouped-query heads (H = 4 over Hkv = 2, 2 over 1) and plain multi-head,
//! both layouts (`[B, H, S, D]` storage, a permuted `[B, S, H, D]` one, and q, k, v as
//! head ranges of one fused `[B, S, H + 2 Hkv, D]` buffer), bf16 and f16;
//! inputs random normal (never zero), outputs poisoned with NaN first. Plus the typed
//! errors the op returns before any launch.
//!
//! The error measure is relative to the output's largest magnitude,
//! `max |got - want| / max |want|` per tensor (o, lse, dq, dk, dv), because attention
//! outputs are weighted averages whose small elements carry the absolute error of the
//! large ones. Tolerances ([`tolerances`]): the kernels round P (a probability, ≤ 1) to T
//! before `P·V`, as FlashAttention does, so each term of o carries a relative rounding
//! of up to 2^-9 (bf16) or 2^-12 (f16) on top of o's own final rounding (the same
//! again); those terms add with random signs, so o's error stays within a few units of
//! that rounding of its largest element: 2^-6 (bf16) and 2^-9 (f16) leave a margin of
//! 8x over one rounding. The gradients round P and dS = P ∘ (dP - delta) to T before
//! their products, and dS subtracts two nearly equal f32 numbers (dP and delta, the
//! latter from the rounded o), so they get twice that: 2^-5 and 2^-8. lse is f32 from
//! f32 scores (products of 16-bit inputs are exact in f32; the sums and the exp2/log2
//! approximations are not): 2^-14 of its largest magnitude. dq and dk, which cancel to
//! (nearly) zero with one visible key, are judged against at least 1e-3 of the largest
//! term that cancels (`scale · max|dout| · max|v| · D · max|k|` or `max|q|`).
//! Measured on the interpreter ([`CASES`]): o up to 2.9e-3 (bf16) and 3.8e-4 (f16), the
//! gradients up to 4.3e-3 and 5.7e-4, lse 1.7e-7; on an H200 (sm_90a and sm_80 code
//! paths, [`GPU_CASES`] too) the worst of the five 4.4e-3 (bf16) and 5.7e-4 (f16): 4-7x
//! inside the tolerances. [`gpu_checks`] reports the
//! largest of a case's five measured errors ([`AttnErrors::worst`]).

use super::common::{poisoned_on, random_on, read};
use crate::cases::torch_attention::{backward, forward, AttnShape};
use crate::ops::{OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{Device, Tensor};

/// One attention call of the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnCase {
    pub t: DType,
    pub shape: AttnShape,
    pub causal: bool,
    pub storage: Storage,
}

/// How a case's tensors are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// `[B, H, S, D]`, contiguous.
    Bhsd,
    /// `[B, S, H, D]`, contiguous, passed as its permuted `[B, H, S, D]` view.
    Bshd,
    /// q, k and v (and dq, dk, dv) as head ranges of one `[B, S, H + 2 Hkv, D]` buffer
    /// (a fused QKV projection's output: S's stride is (H + 2 Hkv)·D, not H·D), permuted;
    /// o and dout `[B, S, H, D]`.
    FusedQkv,
}

impl AttnCase {
    pub fn label(&self) -> String {
        let s = &self.shape;
        format!(
            "attention fwd+bwd {} B={} H={}/{} S={}x{} D={}{}{}",
            self.t,
            s.batch,
            s.heads,
            s.kv_heads,
            s.seq_q,
            s.seq_k,
            s.head_dim,
            if self.causal { " causal" } else { "" },
            match self.storage {
                Storage::Bhsd => "",
                Storage::Bshd => " [B,S,H,D]",
                Storage::FusedQkv => " fused [B,S,H+2Hkv,D]",
            }
        )
    }
}

#[allow(clippy::too_many_arguments)]
const fn case(
    t: DType,
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seq_q: usize,
    seq_k: usize,
    head_dim: usize,
    causal: bool,
    storage: Storage,
) -> AttnCase {
    AttnCase {
        t,
        shape: AttnShape {
            batch,
            heads,
            kv_heads,
            seq_q,
            seq_k,
            head_dim,
        },
        causal,
        storage,
    }
}

const BF: DType = DType::BF16;
const HF: DType = DType::F16;
const BHSD: Storage = Storage::Bhsd;
const BSHD: Storage = Storage::Bshd;
const FUSED: Storage = Storage::FusedQkv;

/// The cases every device runs (the interpreter too: `kgen selftest` without a GPU).
/// Every sequence length, head dimension, mask, head grouping, storage and dtype appears;
/// S = 1000 only for D = 64, causal, with 2 heads (the interpreter's slowest case).
pub const CASES: &[AttnCase] = &[
    case(BF, 1, 2, 2, 1, 1, 64, false, BHSD),
    case(HF, 2, 4, 2, 7, 7, 128, true, BSHD),
    case(BF, 1, 4, 2, 7, 7, 64, false, BSHD),
    case(HF, 1, 4, 2, 7, 127, 64, true, BHSD),
    case(BF, 1, 2, 1, 127, 7, 64, true, BSHD),
    case(HF, 1, 2, 1, 127, 7, 128, false, BHSD),
    case(BF, 1, 4, 2, 127, 127, 128, false, BHSD),
    case(HF, 1, 4, 2, 127, 127, 64, true, BSHD),
    case(BF, 1, 2, 2, 127, 127, 128, true, BSHD),
    case(HF, 1, 1, 1, 1, 127, 128, true, BHSD),
    case(BF, 1, 2, 1, 1000, 1000, 64, true, BHSD),
    case(BF, 2, 4, 2, 127, 127, 64, true, FUSED),
    case(HF, 1, 2, 2, 7, 7, 128, false, FUSED),
];

/// More cases on a GPU: longer sequences for D = 128, not causal, more heads.
pub const GPU_CASES: &[AttnCase] = &[
    case(BF, 2, 8, 2, 1000, 1000, 128, true, BSHD),
    case(HF, 2, 8, 8, 1000, 1000, 64, false, BHSD),
    case(BF, 1, 4, 2, 1000, 1000, 64, false, BSHD),
    case(HF, 1, 4, 1, 333, 1000, 128, true, BHSD),
    case(BF, 3, 6, 3, 1000, 77, 64, false, BHSD),
    case(BF, 2, 8, 8, 1000, 1000, 64, true, FUSED),
];

/// The tolerances (relative to the largest magnitude of each tensor) of o, of the
/// gradients and of lse (module docs).
pub fn tolerances(t: DType) -> (f64, f64, f64) {
    let lse = 2f64.powi(-14);
    match t {
        DType::BF16 => (2f64.powi(-6), 2f64.powi(-5), lse),
        _ => (2f64.powi(-9), 2f64.powi(-8), lse),
    }
}

/// Every case on `device` ([`CASES`], plus [`GPU_CASES`] on a GPU) and the typed errors.
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    let mut out = Vec::new();
    let extra: &[AttnCase] = if device.is_gpu() { GPU_CASES } else { &[] };
    for c in CASES.iter().chain(extra) {
        out.push((c.label(), check_case(&ops, c).map(|r| r.worst())));
    }
    for head_dim in [64, 128] {
        out.push((
            format!("attention: every tuning candidate, bf16 D={head_dim} causal GQA S=127"),
            check_every_candidate(&ops, head_dim),
        ));
    }
    // Several key blocks with ragged edges (the interpreter checks a shorter one in
    // the unit tests).
    if device.is_gpu() {
        for (s, causal) in [(1000, false), (1000, true), (300, false)] {
            out.push((
                format!("attention: every forward candidate, bf16 D=128 GQA S={s} causal={causal}"),
                check_forward_candidates(&ops, 128, s, causal),
            ));
        }
    }
    out.push((
        "attention: typed errors before any launch".to_string(),
        check_errors(&ops).map(|_| 0.0),
    ));
    out
}

/// The measured errors of one case (each relative to the tensor's largest magnitude).
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnErrors {
    pub o: f64,
    pub lse: f64,
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
}

impl AttnErrors {
    /// The largest of the five.
    pub fn worst(&self) -> f64 {
        [self.o, self.lse, self.dq, self.dk, self.dv]
            .into_iter()
            .fold(0.0, f64::max)
    }
}

impl std::fmt::Display for AttnErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "o {:.2e}, lse {:.2e}, dq {:.2e}, dk {:.2e}, dv {:.2e}",
            self.o, self.lse, self.dq, self.dk, self.dv
        )
    }
}

/// `max |got - want| / max(max |want|, floor)`; Err when not finite or above `tol`.
/// `floor` judges a tensor that cancels to (nearly) zero, as dq and dk do with one key,
/// against the size of the terms that cancel.
fn rel_to_max(name: &str, got: &[f64], want: &[f64], floor: f64, tol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!(
            "{name}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    let scale = want
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs()))
        .max(floor)
        .max(1e-30);
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs() / scale;
        if !e.is_finite() {
            return Err(format!("{name}: element {i}: got {g}, expected {w}"));
        }
        if e > worst.0 {
            worst = (e, i);
        }
    }
    let (e, i) = worst;
    if e > tol {
        return Err(format!(
            "{name}: element {i}: got {}, expected {} (error {e:.2e} of max |{name}| \
             {scale:.3} > {tol:.1e})",
            got[i], want[i]
        ));
    }
    Ok(e)
}

/// A `[B, H, S, D]` tensor of the case's layout: random (with its values in logical
/// order) or poisoned.
fn tensor4(
    device: &Device,
    rng: Option<&mut crate::cases::Rng>,
    t: DType,
    shape: [usize; 4],
    bshd: bool,
) -> Result<(Tensor, Vec<f64>), String> {
    let [b, h, s, d] = shape;
    let storage = if bshd { [b, s, h, d] } else { shape };
    let raw = match rng {
        Some(r) => random_on(device, r, t, &storage, None)?.0,
        None => poisoned_on(device, t, &storage)?,
    };
    let view = if bshd {
        raw.permute(&[0, 2, 1, 3]).map_err(|e| e.to_string())?
    } else {
        raw
    };
    let vals = read(&view)?;
    Ok((view, vals))
}

/// q, k and v (or dq, dk, dv) of a case, random or poisoned, with their values.
fn qkv(
    device: &Device,
    mut rng: Option<&mut crate::cases::Rng>,
    c: &AttnCase,
) -> Result<[(Tensor, Vec<f64>); 3], String> {
    let s = c.shape;
    let (qs, kvs) = (
        [s.batch, s.heads, s.seq_q, s.head_dim],
        [s.batch, s.kv_heads, s.seq_k, s.head_dim],
    );
    let bshd = c.storage != Storage::Bhsd;
    if c.storage != Storage::FusedQkv || s.seq_q != s.seq_k {
        return Ok([
            tensor4(device, rng.as_deref_mut(), c.t, qs, bshd)?,
            tensor4(device, rng.as_deref_mut(), c.t, kvs, bshd)?,
            tensor4(device, rng, c.t, kvs, bshd)?,
        ]);
    }
    let (h, hkv) = (s.heads, s.kv_heads);
    let all = [s.batch, s.seq_q, h + 2 * hkv, s.head_dim];
    let buf = match rng {
        Some(r) => random_on(device, r, c.t, &all, None)?.0,
        None => poisoned_on(device, c.t, &all)?,
    };
    let part = |first: usize, n: usize| -> Result<(Tensor, Vec<f64>), String> {
        let t = buf
            .narrow(2, first, n)
            .and_then(|t| t.permute(&[0, 2, 1, 3]))
            .map_err(|e| e.to_string())?;
        let vals = read(&t)?;
        Ok((t, vals))
    };
    Ok([part(0, h)?, part(h, hkv)?, part(h + hkv, hkv)?])
}

/// One forward and backward against the f64 reference; the measured errors.
pub fn check_case(ops: &Ops, c: &AttnCase) -> Result<AttnErrors, String> {
    let e = |x: OpError| x.to_string();
    let dev = ops.device();
    let s = c.shape;
    let qs = [s.batch, s.heads, s.seq_q, s.head_dim];
    let mut rng = crate::cases::Rng::for_case(71, &c.label());
    let bshd = c.storage != Storage::Bhsd;
    let [(q, qv), (k, kv), (v, vv)] = qkv(dev, Some(&mut rng), c)?;
    let (dout, dov) = tensor4(dev, Some(&mut rng), c.t, qs, bshd)?;
    let (o, _) = tensor4(dev, None, c.t, qs, bshd)?;
    let lse = poisoned_on(dev, DType::F32, &[s.batch, s.heads, s.seq_q])?;
    let [(dq, _), (dk, _), (dv, _)] = qkv(dev, None, c)?;
    ops.attention_into(&q, &k, &v, c.causal, None, &o, &lse)
        .map_err(e)?;
    ops.attention_backward_into(&q, &k, &v, &o, &lse, &dout, c.causal, None, &dq, &dk, &dv)
        .map_err(e)?;
    // The scale the kernels use: 1/sqrt(D) rounded to f32.
    let scale = (1.0 / (s.head_dim as f64).sqrt()) as f32 as f64;
    let (want_o, want_lse) = forward(&qv, &kv, &vv, &s, c.causal, scale);
    let (want_dq, want_dk, want_dv) = backward(&qv, &kv, &vv, &dov, &s, c.causal, scale);
    let (to, tg, tl) = tolerances(c.t);
    // dq and dk are sums of scale·dS·k (q) with dS = P ∘ (dout·v - delta): their floor
    // is 1e-3 of the largest such term.
    let big = |x: &[f64]| x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let term = scale * big(&dov) * big(&vv) * s.head_dim as f64;
    let (fq, fk) = (1e-3 * term * big(&kv), 1e-3 * term * big(&qv));
    Ok(AttnErrors {
        o: rel_to_max("o", &read(&o)?, &want_o, 0.0, to)?,
        lse: rel_to_max("lse", &read(&lse)?, &want_lse, 0.0, tl)?,
        dq: rel_to_max("dq", &read(&dq)?, &want_dq, fq, tg)?,
        dk: rel_to_max("dk", &read(&dk)?, &want_dk, fk, tg)?,
        dv: rel_to_max("dv", &read(&dv)?, &want_dv, 0.0, tg)?,
    })
}

/// `r` is an error of the expected kind whose message holds every one of `words`.
fn expect_err(
    what: &str,
    r: Result<impl Sized, OpError>,
    dtype: bool,
    words: &[&str],
) -> Result<(), String> {
    let err = match r {
        Ok(_) => return Err(format!("{what}: accepted")),
        Err(e) => e,
    };
    let kind_ok = match &err {
        OpError::Dtype { .. } => dtype,
        OpError::Shape { .. } => !dtype,
        OpError::Runtime(_) => false,
    };
    let msg = err.to_string();
    if !kind_ok {
        return Err(format!("{what}: wrong kind of error: {msg}"));
    }
    if let Some(w) = words.iter().find(|w| !msg.contains(*w)) {
        return Err(format!("{what}: the message does not name `{w}`: {msg}"));
    }
    Ok(())
}

/// The typed errors: dtypes, shapes, head counts, head dimensions, empty sequences,
/// mixed layouts, misalignment and aliasing, each found before any launch.
pub fn check_errors(ops: &Ops) -> Result<(), String> {
    let d = ops.device();
    let z = |t: DType, shape: &[usize]| d.zeros(t, shape).map_err(|e| e.to_string());
    let (bf, hf) = (DType::BF16, DType::F16);
    let q = z(bf, &[2, 4, 8, 64])?;
    let kv = z(bf, &[2, 2, 8, 64])?;
    let fwd = |q: &Tensor, k: &Tensor, v: &Tensor| ops.attention(q, k, v, true, None);
    // Dtypes.
    expect_err(
        "f32 q",
        fwd(&z(DType::F32, &[2, 4, 8, 64])?, &kv, &kv),
        true,
        &["`q`"],
    )?;
    expect_err(
        "f16 k, bf16 q",
        fwd(&q, &z(hf, &[2, 2, 8, 64])?, &kv),
        true,
        &["`k`"],
    )?;
    // Shapes.
    expect_err(
        "rank 3",
        fwd(&z(bf, &[8, 8, 64])?, &kv, &kv),
        false,
        &["`q`"],
    )?;
    expect_err(
        "v != k",
        fwd(&q, &kv, &z(bf, &[2, 2, 9, 64])?),
        false,
        &["`v`"],
    )?;
    expect_err(
        "batch",
        fwd(&q, &z(bf, &[1, 2, 8, 64])?, &kv),
        false,
        &["`k`"],
    )?;
    let q3 = z(bf, &[2, 3, 8, 64])?;
    expect_err("H % Hkv", fwd(&q3, &kv, &kv), false, &["multiple of Hkv"])?;
    for dim in [32, 80, 256] {
        let (qd, kd) = (z(bf, &[1, 2, 8, dim])?, z(bf, &[1, 2, 8, dim])?);
        expect_err("D", fwd(&qd, &kd, &kd), false, &["D = 64 or 128"])?;
    }
    let k0 = z(bf, &[2, 2, 0, 64])?;
    expect_err("S_k = 0", fwd(&q, &k0, &k0), false, &["S_k = 0"])?;
    let lse = z(DType::F32, &[2, 4, 8])?;
    let o = z(bf, &[2, 4, 8, 64])?;
    let into = |o: &Tensor, lse: &Tensor| ops.attention_into(&q, &kv, &kv, false, None, o, lse);
    expect_err(
        "o shape",
        into(&z(bf, &[2, 4, 7, 64])?, &lse),
        false,
        &["`o`"],
    )?;
    expect_err("lse dtype", into(&o, &z(bf, &[2, 4, 8])?), true, &["`lse`"])?;
    expect_err(
        "scale",
        ops.attention(&q, &kv, &kv, true, Some(f64::NAN)),
        false,
        &["scale"],
    )?;
    // The kernels scale each row's max: a negative scale would pick the wrong one.
    expect_err(
        "negative scale",
        ops.attention(&q, &kv, &kv, true, Some(-0.125)),
        false,
        &["positive"],
    )?;
    // Layouts: k in [B, S, H, D] storage with q in [B, H, S, D]; q fitting neither.
    let perm = |t: &Tensor| t.permute(&[0, 2, 1, 3]).map_err(|e| e.to_string());
    let k_bshd = perm(&z(bf, &[2, 8, 2, 64])?)?;
    expect_err(
        "mixed layouts",
        fwd(&q, &k_bshd, &kv),
        false,
        &["`k`", "[B, H, S, D] storage", "`q`"],
    )?;
    // The last dimension strided.
    let q_odd = z(bf, &[2, 4, 64, 8])?
        .transpose(2, 3)
        .map_err(|e| e.to_string())?;
    expect_err(
        "q fits no layout",
        fwd(&q_odd, &kv, &kv),
        false,
        &["`q`", "neither"],
    )?;
    // Alignment: a view one element into its storage.
    let big = z(bf, &[2 * 4 * 8 * 64 + 8])?;
    let q_mis = big
        .narrow(0, 1, 2 * 4 * 8 * 64)
        .and_then(|t| t.reshape(&[2, 4, 8, 64]))
        .map_err(|e| e.to_string())?;
    expect_err(
        "misaligned q",
        fwd(&q_mis, &kv, &kv),
        false,
        &["`q`", "aligned"],
    )?;
    // Aliasing: o over q.
    expect_err("o aliases q", into(&q, &lse), false, &["`o`", "overlaps"])?;
    // The backward: a mixed layout on dout, a wrong dk, dq over dout.
    let dv = z(bf, &[2, 2, 8, 64])?;
    let bwd = |dout: &Tensor, dq: &Tensor, dk: &Tensor| {
        ops.attention_backward_into(&q, &kv, &kv, &o, &lse, dout, true, None, dq, dk, &dv)
    };
    let dq = z(bf, &[2, 4, 8, 64])?;
    let dk = z(bf, &[2, 2, 8, 64])?;
    let dout_bshd = perm(&z(bf, &[2, 8, 4, 64])?)?;
    expect_err("bwd mixed", bwd(&dout_bshd, &dq, &dk), false, &["`dout`"])?;
    expect_err(
        "bwd dk shape",
        bwd(&o, &dq, &z(bf, &[2, 4, 8, 64])?),
        false,
        &["`dk`"],
    )?;
    let dout = z(bf, &[2, 4, 8, 64])?;
    expect_err(
        "bwd dq aliases dout",
        bwd(&dout, &dout, &dk),
        false,
        &["`dq`", "overlaps"],
    )?;
    expect_err(
        "bwd f16 dout",
        ops.attention_backward(&q, &kv, &kv, &o, &lse, &z(hf, &[2, 4, 8, 64])?, true, None),
        true,
        &["`dout`"],
    )?;
    Ok(())
}

/// Every candidate of the forward's, dq's and dK/dV's tuning lists for `ops`' target
/// ([`fwd_candidates`](crate::ops::attention::fwd_candidates),
/// [`dq_candidates`](crate::ops::attention::dq_candidates),
/// [`dkdv_candidates`](crate::ops::attention::dkdv_candidates)), each launched directly as
/// the op builds it (warp-specialized ones too) on a causal, grouped-query case of
/// S = 127 with head dimension `head_dim`, outputs poisoned: each must match the f64
/// reference within [`tolerances`]. The op itself runs only the tuner's pick. Returns
/// the largest error.
pub fn check_every_candidate(ops: &Ops, head_dim: usize) -> Result<f64, String> {
    check_candidates(ops, head_dim, 127, true, true)
}

/// The forward's candidates alone ([`check_every_candidate`]'s check) at sequence
/// length `s`, causal or not: several key blocks, ragged edges (the lagged forward's
/// extra pass and its pass over key block -1 among them).
pub fn check_forward_candidates(
    ops: &Ops,
    head_dim: usize,
    s: usize,
    causal: bool,
) -> Result<f64, String> {
    check_candidates(ops, head_dim, s, causal, false)
}

fn check_candidates(
    ops: &Ops,
    head_dim: usize,
    s: usize,
    causal: bool,
    with_backward: bool,
) -> Result<f64, String> {
    use crate::ops::attention::{dkdv_candidates, dq_candidates, fwd_candidates, AttentionConfig};
    use crate::ops::KernelArgs;
    let e = |x: OpError| x.to_string();
    let d = ops.device();
    let arch = d.arch();
    let dd = head_dim;
    let c = case(BF, 1, 4, 2, s, s, dd, causal, BHSD);
    let (qs, kvs) = ([1, 4, s, dd], [1, 2, s, dd]);
    let mut rng = crate::cases::Rng::new(3);
    let mut t4 = |shape| tensor4(d, Some(&mut rng), BF, shape, false);
    let (q, qv) = t4(qs)?;
    let (k, kv) = t4(kvs)?;
    let (v, vv) = t4(kvs)?;
    let (dout, dov) = t4(qs)?;
    let scale = 0.125f32;
    let (want_o, want_lse) = forward(&qv, &kv, &vv, &c.shape, causal, scale as f64);
    let v3 = |t: &Tensor| t.reshape(&[t.shape()[0] * t.shape()[1], s, dd]);
    let (q3, k3, vv3, do3) = (
        v3(&q).map_err(|x| x.to_string())?,
        v3(&k).map_err(|x| x.to_string())?,
        v3(&v).map_err(|x| x.to_string())?,
        v3(&dout).map_err(|x| x.to_string())?,
    );
    let (to, tg, _) = tolerances(BF);
    let defines = |name: &str, c: AttentionConfig| {
        let mut d = vec![
            ("T", "bf16".to_string()),
            ("D", dd.to_string()),
            ("BM", c.bm.to_string()),
            ("BN", c.bn.to_string()),
            ("CAUSAL", causal.to_string()),
            ("GROUP", "2".to_string()),
            ("BSHD", "false".to_string()),
        ];
        if name == "attention_fwd" {
            d.push(("LAG", c.lag.to_string()));
        }
        d
    };
    let mut worst = 0f64;
    let mut kept = None;
    // Builds candidate `cand` of kernel `name` as the op does and launches it over
    // `blocks` row blocks of `heads` heads.
    let launch =
        |name: &str, cand: AttentionConfig, args: &KernelArgs, blocks: usize, heads: u32| {
            let kern = ops
                .kernel_variant(
                    "attention",
                    name,
                    &defines(name, cand),
                    Some(cand.warps),
                    cand.variant(),
                    args,
                )
                .map_err(e)?;
            ops.launch_args(&kern, [s.div_ceil(blocks) as u32, heads, 1], args)
                .map_err(e)
        };
    for cand in fwd_candidates(dd, arch) {
        let o = poisoned_on(d, BF, &[4, s, dd])?;
        let lse = poisoned_on(d, DType::F32, &[4, s])?;
        let args = KernelArgs::new()
            .tensor("q", &q3)
            .tensor("k", &k3)
            .tensor("v", &vv3)
            .tensor("o", &o)
            .tensor("lse", &lse)
            .scalar("heads", 4i32)
            .scalar("scale", scale);
        launch("attention_fwd", cand, &args, cand.bm, 4)?;
        let what = |t: &str| format!("attention_fwd {cand:?} {t}");
        let eo = rel_to_max(&what("o"), &read(&o)?, &want_o, 0.0, to)?;
        let el = rel_to_max(&what("lse"), &read(&lse)?, &want_lse, 0.0, 1e-4)?;
        worst = worst.max(eo).max(el);
        kept.get_or_insert((o, lse));
    }
    let (o, lse) = kept.ok_or("no forward candidate")?;
    if !with_backward {
        return Ok(worst);
    }
    let (want_dq, want_dk, want_dv) = backward(&qv, &kv, &vv, &dov, &c.shape, causal, scale as f64);
    let delta = poisoned_on(d, DType::F32, &[4, s])?;
    let dargs = KernelArgs::new()
        .tensor("o", &o)
        .tensor("dout", &do3)
        .tensor("delta", &delta)
        .scalar("heads", 4i32);
    let defs = [
        ("T", "bf16".to_string()),
        ("D", dd.to_string()),
        ("BM", "64".to_string()),
        ("BSHD", "false".to_string()),
    ];
    let kern = ops
        .kernel("attention", "attention_bwd_delta", &defs, None, &dargs)
        .map_err(e)?;
    ops.launch_args(&kern, [s.div_ceil(64) as u32, 4, 1], &dargs)
        .map_err(e)?;
    // The backward kernels' inputs; each adds its outputs and the scalars.
    let inputs = || {
        KernelArgs::new()
            .tensor("q", &q3)
            .tensor("k", &k3)
            .tensor("v", &vv3)
            .tensor("dout", &do3)
            .tensor("lse", &lse)
            .tensor("delta", &delta)
    };
    for cand in dq_candidates(dd, arch) {
        let dq = poisoned_on(d, BF, &[4, s, dd])?;
        let args = inputs()
            .tensor("dq", &dq)
            .scalar("heads", 4i32)
            .scalar("scale", scale);
        launch("attention_bwd_dq", cand, &args, cand.bm, 4)?;
        let what = format!("attention_bwd_dq {cand:?} dq");
        worst = worst.max(rel_to_max(&what, &read(&dq)?, &want_dq, 0.0, tg)?);
    }
    for cand in dkdv_candidates(dd, arch) {
        let dk = poisoned_on(d, BF, &[2, s, dd])?;
        let dv = poisoned_on(d, BF, &[2, s, dd])?;
        let args = inputs()
            .tensor("dk", &dk)
            .tensor("dv", &dv)
            .scalar("heads", 4i32)
            .scalar("scale", scale);
        launch("attention_bwd_dkdv", cand, &args, cand.bn, 2)?;
        for (name, got, want) in [("dk", &dk, &want_dk), ("dv", &dv, &want_dv)] {
            let what = format!("attention_bwd_dkdv {cand:?} {name}");
            worst = worst.max(rel_to_max(&what, &read(got)?, want, 0.0, tg)?);
        }
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checks of [`CASES`] up to S = 127 (every dtype, D, mask, grouping and layout),
    /// the f64 reference and the interpreter agreeing; and the typed errors.
    #[test]
    fn attention_checks_pass_on_the_interpreter() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        for c in CASES {
            let t0 = std::time::Instant::now();
            let r = check_case(&ops, c).unwrap_or_else(|why| panic!("{}: {why}", c.label()));
            eprintln!("{}: {r} ({:.1} s)", c.label(), t0.elapsed().as_secs_f64());
        }
        check_errors(&ops).unwrap();
    }

    fn bits(t: &Tensor) -> Vec<u64> {
        read(t).unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// Every candidate of the forward's, dq's and dK/dV's tuning lists for the interpreter's
    /// target (which runs only the first through the op), D = 64 and 128: each matches
    /// the f64 reference within the same tolerances.
    #[test]
    fn every_candidate_matches_the_reference() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        for head_dim in [64, 128] {
            let e = check_every_candidate(&ops, head_dim).unwrap();
            eprintln!("every candidate, D = {head_dim}: worst {e:.2e}");
        }
    }

    /// The forward's candidates (the lagged one among them on sm_90a) over three key
    /// blocks with a ragged edge, not causal: each matches the f64 reference.
    #[test]
    fn every_forward_candidate_matches_the_reference_over_several_blocks() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let e = check_forward_candidates(&ops, 128, 300, false).unwrap();
        eprintln!("forward candidates, D = 128, S = 300: worst {e:.2e}");
    }

    /// A warm call (the remembered plan) writes bit for bit what the first call wrote,
    /// into poisoned outputs, and the backward is deterministic; the allocating forms
    /// return o and the gradients in the inputs' layout (here `[B, S, H, D]` storage).
    #[test]
    fn warm_calls_are_deterministic_and_keep_the_layout() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let mut rng = crate::cases::Rng::new(9);
        let (qs, kvs) = ([2, 4, 33, 128], [2, 2, 33, 128]);
        let mut t4 = |shape| tensor4(&d, Some(&mut rng), HF, shape, true).unwrap().0;
        let (q, k, v, dout) = (t4(qs), t4(kvs), t4(kvs), t4(qs));
        let run = || {
            let (o, lse) = ops.attention(&q, &k, &v, false, Some(0.1)).unwrap();
            let (dq, dk, dv) = ops
                .attention_backward(&q, &k, &v, &o, &lse, &dout, false, Some(0.1))
                .unwrap();
            // [B, S, H, D] storage: H's stride is D, S's is H·D.
            for (t, h) in [(&o, 4), (&dq, 4), (&dk, 2), (&dv, 2)] {
                assert_eq!(t.strides()[1], 128);
                assert_eq!(t.strides()[2], h * 128);
            }
            [&o, &lse, &dq, &dk, &dv].map(bits)
        };
        let first = run();
        assert!(first
            .iter()
            .flatten()
            .all(|b| f64::from_bits(*b).is_finite()));
        assert_eq!(run(), first, "a warm call differs from the first");
    }

    /// An empty batch is an empty call: empty outputs, nothing launched, no error.
    #[test]
    fn an_empty_batch_is_an_empty_call() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let q = d.zeros(BF, &[0, 4, 8, 64]).unwrap();
        let kv = d.zeros(BF, &[0, 2, 8, 64]).unwrap();
        let (o, lse) = ops.attention(&q, &kv, &kv, true, None).unwrap();
        assert_eq!(
            (o.shape(), lse.shape()),
            (&[0, 4, 8, 64][..], &[0, 4, 8][..])
        );
        let (dq, dk, dv) = ops
            .attention_backward(&q, &kv, &kv, &o, &lse, &q, true, None)
            .unwrap();
        assert_eq!(dq.shape(), q.shape());
        assert_eq!((dk.shape(), dv.shape()), (kv.shape(), kv.shape()));
    }
}
