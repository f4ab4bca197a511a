//! The attention rows of `kgen bench`: `Ops::attention_into` (forward) and
//! `Ops::attention_backward_into` (backward: delta, dK/dV, dQ), bf16, causal, torch's
//! `[B, H, S, D]` layout, scale `1/sqrt(D)`, beside the torch peers of the same names
//! from `--peers` (`bench/torch_peers.py`: `F.scaled_dot_product_attention` on its cuDNN
//! and FlashAttention-2 backends).
//!
//! Assumes: the names, shapes and formulas are `torch_peers.py`'s `_attention()` rows
//! (issue 25's table); the figure of merit is TFLOP/s from the causal flops
//! `2·2·B·H·S²·D / 2` (forward) and 2.5 times that (backward), FlashAttention's
//! convention.
//!
//! Guarantees: inputs are random normal (never zero), outputs poisoned with NaN before
//! the first call; after timing, sampled rows of the output are checked: finite, and for
//! the forward inside `[min v, max v]` of the whole tensor (a convex combination of V's
//! rows), so a broken kernel is an error, not a fast row.

use super::measure::{fill, Fill, Timer};
use super::{Measured, PeerRecord};
use crate::ops::{shape_err, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::Tensor;
use std::fmt::Write as _;

/// One attention row.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionWorkload {
    pub name: String,
    pub backward: bool,
    pub shape: [usize; 4],
}

impl AttentionWorkload {
    /// The causal flops of one call (module docs).
    pub fn flops(&self) -> f64 {
        let [b, h, s, d] = self.shape.map(|x| x as f64);
        let fwd = 2.0 * 2.0 * b * h * s * s * d / 2.0;
        if self.backward {
            2.5 * fwd
        } else {
            fwd
        }
    }
}

/// Issue 25's shapes, forward then backward each, in torch_peers.py's order.
pub fn attention_workloads() -> Vec<AttentionWorkload> {
    let shapes = [
        [4, 32, 4096, 128],
        [8, 16, 2048, 128],
        [16, 12, 1024, 64],
        [1, 32, 16384, 128],
    ];
    shapes
        .iter()
        .flat_map(|&sh| {
            [false, true].map(|backward| AttentionWorkload {
                name: format!(
                    "attention_{}_bf16_causal_{}x{}x{}x{}",
                    if backward { "bwd" } else { "fwd" },
                    sh[0],
                    sh[1],
                    sh[2],
                    sh[3]
                ),
                backward,
                shape: sh,
            })
        })
        .collect()
}

/// What one row measured.
#[derive(Clone, Debug)]
pub struct AttentionRow {
    pub w: AttentionWorkload,
    pub kgen: Result<Measured, String>,
    /// The sampled output's largest magnitude (after the checks).
    pub check: Option<f64>,
    pub peers: Vec<PeerRecord>,
}

impl AttentionRow {
    pub fn tflops(&self, us: f64) -> f64 {
        self.w.flops() / (us * 1e-6) / 1e12
    }

    pub fn best_peer(&self) -> Option<(&str, f64)> {
        super::fastest_peer(&self.peers)
    }

    /// Best torch time / kgen time (> 1: kgen is faster).
    pub fn speedup(&self) -> Option<f64> {
        Some(self.best_peer()?.1 / self.kgen.as_ref().ok()?.median_us)
    }
}

fn check_err(what: String) -> OpError {
    shape_err("bench attention", what)
}

/// The first and last `n` elements of `t`, read back.
fn sample(t: &Tensor, n: usize) -> Result<Vec<f64>, OpError> {
    let flat = t.reshape(&[t.numel()])?;
    let n = n.min(t.numel());
    let mut v = flat.narrow(0, 0, n)?.to_f64_vec()?;
    v.extend(flat.narrow(0, t.numel() - n, n)?.to_f64_vec()?);
    Ok(v)
}

/// Times one row and checks what it wrote.
pub fn run_attention(ops: &Ops, timer: &Timer, w: &AttentionWorkload, seed: u64) -> AttentionRow {
    let mut row = AttentionRow {
        w: w.clone(),
        kgen: Err("not run".into()),
        check: None,
        peers: Vec::new(),
    };
    let r = (|| -> Result<(), OpError> {
        let d = ops.device();
        let shape = w.shape.to_vec();
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        let mk = |k: u64| -> Result<Tensor, OpError> {
            let t = d.empty(DType::BF16, &shape)?;
            fill(&t, normal, seed ^ (k << 40))?;
            Ok(t)
        };
        let (q, k, v) = (mk(1)?, mk(2)?, mk(3)?);
        let [b, h, s, _] = w.shape;
        let o = d.empty(DType::BF16, &shape)?;
        let lse = d.empty(DType::F32, &[b, h, s])?;
        fill(&o, Fill::Nan, 0)?;
        fill(&lse, Fill::Nan, 0)?;
        if !w.backward {
            row.kgen = timer
                .time(&mut || ops.attention_into(&q, &k, &v, true, None, &o, &lse))
                .map_err(|e| e.to_string());
            if row.kgen.is_ok() {
                let vs = sample(&v, 1 << 16)?;
                let (lo, hi) = vs
                    .iter()
                    .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
                let os = sample(&o, 1 << 12)?;
                if let Some(x) = os.iter().find(|x| !x.is_finite()) {
                    return Err(check_err(format!("a sampled output is {x}")));
                }
                // Row 0 of a causal head is v's row 0; every output lies in V's range
                // (a convex combination), up to bf16 rounding.
                let slack = 0.02 * (hi - lo);
                if let Some(x) = os.iter().find(|&&x| x < lo - slack || x > hi + slack) {
                    return Err(check_err(format!(
                        "a sampled output {x} is outside V's sampled range [{lo}, {hi}]"
                    )));
                }
                row.check = Some(os.iter().fold(0.0f64, |m, x| m.max(x.abs())));
            }
        } else {
            ops.attention_into(&q, &k, &v, true, None, &o, &lse)?;
            let dout = mk(4)?;
            let (dq, dk, dv) = (
                d.empty(DType::BF16, &shape)?,
                d.empty(DType::BF16, &shape)?,
                d.empty(DType::BF16, &shape)?,
            );
            for t in [&dq, &dk, &dv] {
                fill(t, Fill::Nan, 0)?;
            }
            row.kgen = timer
                .time(&mut || {
                    ops.attention_backward_into(
                        &q, &k, &v, &o, &lse, &dout, true, None, &dq, &dk, &dv,
                    )
                })
                .map_err(|e| e.to_string());
            if row.kgen.is_ok() {
                let mut m = 0.0f64;
                for (name, t) in [("dq", &dq), ("dk", &dk), ("dv", &dv)] {
                    let xs = sample(t, 1 << 12)?;
                    if let Some(x) = xs.iter().find(|x| !x.is_finite()) {
                        return Err(check_err(format!("a sampled {name} is {x}")));
                    }
                    m = xs.iter().fold(m, |m, x| m.max(x.abs()));
                }
                row.check = Some(m);
            }
        }
        Ok(())
    })();
    if let Err(e) = r {
        row.kgen = Err(e.to_string());
    }
    let _ = ops.device().synchronize();
    row
}

/// Attaches each row's torch peers.
pub fn merge_attention_peers(rows: &mut [AttentionRow], peers: &[PeerRecord]) {
    for r in rows.iter_mut() {
        r.peers = peers
            .iter()
            .filter(|p| p.workload == r.w.name)
            .cloned()
            .collect();
    }
}

/// The table: kgen's median and TFLOP/s, the fastest torch peer, kgen against it, every
/// peer.
pub fn format_attention_table(rows: &[AttentionRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<42} {:>10} {:>19} {:>7} {:>16} {:>7} {:>7}  torch peers (us)",
        "workload", "kgen us", "[p20 .. p80]", "TF/s", "torch_best us", "TF/s", "speedup"
    );
    for r in rows {
        let best = r.best_peer();
        let (med, spread, tf) = match &r.kgen {
            Ok(m) => (
                format!("{:.1}", m.median_us),
                format!("[{:.1} .. {:.1}]", m.p20_us, m.p80_us),
                format!("{:.0}", r.tflops(m.median_us)),
            ),
            Err(_) => ("ERROR".into(), String::new(), "-".into()),
        };
        let peers = r
            .peers
            .iter()
            .map(|p| match p.median_us {
                Some(us) => format!("{} {us:.1}", p.peer),
                None => format!("{} ERR", p.peer),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "{:<42} {:>10} {:>19} {:>7} {:>16} {:>7} {:>7}  {}",
            r.w.name,
            med,
            spread,
            tf,
            best.map_or("-".into(), |(p, us)| format!("{us:.1} {p}")),
            best.map_or("-".into(), |(_, us)| format!("{:.0}", r.tflops(us))),
            r.speedup().map_or("-".into(), |x| format!("{x:.2}x")),
            peers
        );
        if let Err(e) = &r.kgen {
            let _ = writeln!(s, "  kgen: {e}");
        }
    }
    s
}

/// The rows as JSON objects (`attention` in `kgen bench --json`).
pub fn attention_rows_json(rows: &[AttentionRow]) -> serde_json::Value {
    use serde_json::json;
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                let m = r.kgen.as_ref().ok();
                json!({
                    "workload": r.w.name,
                    "shape": r.w.shape,
                    "backward": r.w.backward,
                    "flops": r.w.flops(),
                    "median_us": m.map(|m| m.median_us),
                    "p20_us": m.map(|m| m.p20_us),
                    "p80_us": m.map(|m| m.p80_us),
                    "tflops": m.map(|m| r.tflops(m.median_us)),
                    "error": r.kgen.as_ref().err(),
                    "check": r.check,
                    "torch_best": r.best_peer().map(|(p, us)| json!({"peer": p, "median_us": us})),
                    "speedup": r.speedup(),
                    "torch": r.peers.iter().map(|p| json!({
                        "peer": p.peer, "median_us": p.median_us, "error": p.error,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names and flops are torch_peers.py's (its `--list` output is not available
    /// here; the README's table is what `--self-check` keeps equal to the script).
    #[test]
    fn workloads_match_the_peer_table() {
        let readme = include_str!("../../bench/README.md");
        for w in attention_workloads() {
            assert!(
                readme.contains(&w.name),
                "{} not in bench/README.md",
                w.name
            );
        }
        let w = &attention_workloads()[0];
        // ANCHORS: cuDNN's 1015 us is 542 TF/s on the first shape.
        let tf = w.flops() / 1015e-6 / 1e12;
        assert!((tf - 542.0).abs() < 2.0, "{tf}");
        assert_eq!(attention_workloads()[1].flops(), 2.5 * w.flops());
    }
}
