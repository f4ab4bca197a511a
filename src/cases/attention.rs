//! `attention.kg`'s forward as a user compiles it (`kgen compile --ws --pingpong`), not
//! through the op: the forms the op does not launch, above all the two consumer
//! warpgroups taking turns (`--pingpong`, `back/ptx/pingpong.rs`), checked against
//! [`torch_attention::forward`] in float64 and (`selftest --gpu`) the GPU against the
//! interpreter. The op's own configurations are checked by `checks::ops::attention`.
//!
//! Inputs are random normal (never zero) with grouped-query heads (2 query heads per K/V
//! head), ragged sequence lengths (1, 127, 300: one partial block, several blocks with a
//! ragged last one), causal and not; outputs are poisoned. Tolerance: `o` is a weighted
//! average of V's rows, rounded through bf16 twice (P before `P·V`, and `o` itself), so
//! each element is within a few bf16 roundings of `max|v|`: 2^-6 · max|v| absolute, as
//! the op's checks allow relative to the output's largest magnitude; lse (f32) is far
//! inside that.

use super::torch_attention::{forward, AttnShape};
use super::*;

/// (S, causal) of the quick cases; the head dimension is 128 (the sm_90a forward with
/// a producer and two consumer warpgroups is the D = 128 configuration).
const QUICK: &[(usize, bool)] = &[(1, true), (127, true), (300, true), (300, false)];

/// Query heads per batch (K/V heads: half).
const HEADS: usize = 2;

pub(crate) fn cases(seed: u64, _sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    for &(s, causal) in QUICK {
        // The lagged loop with turns, and the same loop without (its baseline).
        for pingpong in [true, false] {
            v.push(forward_case(seed, s, 128, causal, pingpong));
        }
    }
    // D = 64 with turns too (not a configuration the op offers).
    v.push(forward_case(seed, 300, 64, true, true));
    v
}

/// One `attention_fwd` case: BM = 128, BN = 64 on 8 consumer warps, warp-specialized,
/// `LAG` (P·V one block behind, the loop whose products stand together), `pingpong` or
/// not. (The op's BN = 128 spills as sm_80 PTX, where `--ws` and `--pingpong` do not
/// apply and the kernel is plain `mma.sync`; BN = 64 assembles without spills on both
/// targets. BN = 128 with turns was checked with `kgen run` and the sanitizers.)
pub fn forward_case(seed: u64, s: usize, d: usize, causal: bool, pingpong: bool) -> Case {
    let batch = 1;
    let shape = AttnShape {
        batch,
        heads: HEADS,
        kv_heads: HEADS / 2,
        seq_q: s,
        seq_k: s,
        head_dim: d,
    };
    let turns = if pingpong { " pingpong" } else { "" };
    let label = format!("attention_fwd ws lag{turns} BN=64 D={d} S={s} causal={causal} GQA 2:1");
    let mut rng = Rng::for_case(seed, &label);
    let t = DType::BF16;
    let bh = batch * HEADS;
    let bhk = batch * HEADS / 2;
    let q = random_tensor(&mut rng, t, &[bh, s, d], |r| r.normalish());
    let k = random_tensor(&mut rng, t, &[bhk, s, d], |r| r.normalish());
    let vt = random_tensor(&mut rng, t, &[bhk, s, d], |r| r.normalish());
    let max_v = vt.to_f64_vec().iter().fold(0f64, |m, x| m.max(x.abs()));
    let scale = 1.0 / (d as f64).sqrt();
    let args = vec![
        ArgValue::Tensor(q),
        ArgValue::Tensor(k),
        ArgValue::Tensor(vt),
        ArgValue::Tensor(poisoned(t, &[bh, s, d])),
        ArgValue::Tensor(poisoned(DType::F32, &[bh, s])),
        ArgValue::Scalar(Scalar::Int(HEADS as i64, DType::I32)),
        f32_arg(scale),
    ];
    Case {
        options: CaseOptions {
            ws: true,
            pingpong,
            warps: Some(8),
            ..Default::default()
        },
        kernel: "attention",
        kernel_name: Some("attention_fwd"),
        label,
        defines: defines(&[
            ("T", t.to_string()),
            ("D", d.to_string()),
            ("BM", "128".into()),
            ("BN", "64".into()),
            ("CAUSAL", causal.to_string()),
            ("GROUP", "2".into()),
            ("LAG", "true".into()),
        ]),
        tensor_align: aligns(&["q", "k", "v", "o", "lse", "heads", "scale"], &args),
        grid: [cdiv(s, 128) as u32, bh as u32, 1],
        args,
        outputs: vec![3, 4],
        reference: Box::new(move |args| {
            let q = tensor_at(args, 0).to_f64_vec();
            let k = tensor_at(args, 1).to_f64_vec();
            let v = tensor_at(args, 2).to_f64_vec();
            let (o, lse) = forward(&q, &k, &v, &shape, causal, scalar_at(args, 6));
            vec![o, lse]
        }),
        tolerance: Tolerance {
            rel: 8e-3,
            abs: 2f64.powi(-6) * max_v,
        },
    }
}
