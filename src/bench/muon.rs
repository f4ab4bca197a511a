//! The Muon rows of `kgen bench`: Newton–Schulz through `Ops::newton_schulz_into` and a
//! whole `Muon::step` over GPT-2 small's 48 hidden matrices, beside the torch peers of
//! the same names from `--peers` (`bench/torch_peers.py`: Keller Jordan's
//! `zeropower_via_newtonschulz5` eager and under `torch.compile`; `torch.optim.Muon`).
//!
//! Assumes: the names, shapes, floor bytes and formulas are `torch_peers.py`'s (a unit
//! test compares them with the workload table of `bench/README.md`, which
//! `torch_peers.py --self-check` checks against the Python side); the figure of merit is
//! TFLOP/s from the Newton–Schulz flops, `batch * steps * (4*m*m*n + 2*m^3)` with
//! `m = min(rows, cols)`, `n = max`.
//!
//! Guarantees: inputs are random (never zero), outputs poisoned with NaN before the first
//! call; after timing, sampled rows of the result are checked to be finite and, for
//! Newton–Schulz, to have squared norms near 1 (the rows of an orthogonalized wide
//! matrix), so a broken kernel is an error, not a fast row.

use super::measure::{fill, pool, tile_from, Fill, Timer};
use super::{Measured, PeerRecord};
use crate::ops::newton_schulz::QUINTIC;
use crate::ops::{shape_err, OpError, Ops};
use crate::optim::{Muon, MuonGroup};
use kgen_core::types::DType;
use kgen_runtime::Tensor;
use std::fmt::Write as _;

/// Newton–Schulz steps of every Muon row (Muon's default, torch_peers.py's).
pub const NS_STEPS: usize = 5;

/// The flops of one Newton–Schulz call on a `[rows, cols]` matrix: per step `A = X X^T`
/// (2·m·m·n), `A A` (2·m³) and `B X` (2·m·m·n), `m = min(rows, cols)`, `n = max`.
pub fn ns_flops(rows: usize, cols: usize, steps: usize) -> f64 {
    let (m, n) = (rows.min(cols) as f64, rows.max(cols) as f64);
    steps as f64 * (4.0 * m * m * n + 2.0 * m * m * m)
}

/// The 48 hidden matrices of GPT-2 small that Muon updates, `[out, in]` (nn.Linear's
/// layout, torch_peers.py's `gpt2_hidden_matrices`): per layer c_attn, attn c_proj,
/// c_fc, mlp c_proj.
pub fn gpt2_hidden_matrices() -> Vec<[usize; 2]> {
    let d = 768;
    (0..12)
        .flat_map(|_| [[3 * d, d], [d, d], [4 * d, d], [d, 4 * d]])
        .collect()
}

/// What a Muon row runs.
#[derive(Clone, Debug, PartialEq)]
pub enum MuonKind {
    /// `Ops::newton_schulz_into` on bf16 `[rows, cols]` (`batch` 1) or
    /// `[batch, rows, cols]`, into a bf16 tensor of the same shape.
    NewtonSchulz {
        batch: usize,
        rows: usize,
        cols: usize,
    },
    /// One `Muon::step` over one group of these `[rows, cols]` fp32 parameters.
    Step { shapes: Vec<[usize; 2]> },
}

/// One Muon row: a stable name (the same in `torch_peers.py`).
#[derive(Clone, Debug, PartialEq)]
pub struct MuonWorkload {
    pub name: String,
    pub shape: String,
    pub dtype: &'static str,
    pub formula: &'static str,
    pub kind: MuonKind,
}

const NS_FORMULA: &str = "4*batch*rows*cols: read G, write X once (bf16); flops = \
                          batch*steps*(4*m*m*n + 2*m^3), m = min(rows, cols), n = max";
const STEP_FORMULA: &str = "N*(1+2+2)*4: read g, read+write momentum, read+write p (fp32; \
                            N = 84,934,656 elements of the 48 matrices; the bf16 \
                            Newton-Schulz temporaries excluded); flops = sum over matrices \
                            of steps*(4*m*m*n + 2*m^3)";

impl MuonWorkload {
    /// Newton–Schulz on `batch` matrices `[rows, cols]` (named as torch_peers.py does).
    pub fn newton_schulz(batch: usize, rows: usize, cols: usize) -> MuonWorkload {
        let dims = if batch > 1 {
            format!("{batch}x{rows}x{cols}")
        } else {
            format!("{rows}x{cols}")
        };
        MuonWorkload {
            name: format!("newton_schulz{NS_STEPS}_bf16_{dims}"),
            shape: dims,
            dtype: "bf16",
            formula: NS_FORMULA,
            kind: MuonKind::NewtonSchulz { batch, rows, cols },
        }
    }

    /// The floor: the minimum bytes the workload must move (torch_peers.py's formula).
    pub fn floor_bytes(&self) -> u64 {
        match &self.kind {
            MuonKind::NewtonSchulz { batch, rows, cols } => 4 * (batch * rows * cols) as u64,
            MuonKind::Step { shapes } => {
                20 * shapes.iter().map(|[r, c]| (r * c) as u64).sum::<u64>()
            }
        }
    }

    /// The Newton–Schulz flops of one call.
    pub fn flops(&self) -> f64 {
        match &self.kind {
            MuonKind::NewtonSchulz { batch, rows, cols } => {
                *batch as f64 * ns_flops(*rows, *cols, NS_STEPS)
            }
            MuonKind::Step { shapes } => {
                shapes.iter().map(|&[r, c]| ns_flops(r, c, NS_STEPS)).sum()
            }
        }
    }
}

/// The Muon workloads of issue 24, in torch_peers.py's order.
pub fn muon_workloads() -> Vec<MuonWorkload> {
    let mut v: Vec<MuonWorkload> = [
        (1024, 1024),
        (2048, 2048),
        (4096, 4096),
        (8192, 8192),
        (768, 3072),
    ]
    .into_iter()
    .map(|(r, c)| MuonWorkload::newton_schulz(1, r, c))
    .collect();
    v.push(MuonWorkload::newton_schulz(12, 768, 768));
    let shapes = gpt2_hidden_matrices();
    v.push(MuonWorkload {
        name: "muon_step_gpt2".into(),
        shape: format!(
            "GPT-2 124M hidden matrices ({} tensors, [out, in])",
            shapes.len()
        ),
        dtype: "fp32",
        formula: STEP_FORMULA,
        kind: MuonKind::Step { shapes },
    });
    v
}

/// What one Muon row measured.
#[derive(Clone, Debug)]
pub struct MuonRow {
    pub w: MuonWorkload,
    pub kgen: Result<Measured, String>,
    /// The after-run check: the mean squared norm of the sampled rows (Newton–Schulz),
    /// or the sampled parameters' RMS (the step).
    pub check: Option<f64>,
    /// torch's peers of this workload (from `--peers`).
    pub peers: Vec<PeerRecord>,
}

impl MuonRow {
    /// TFLOP/s at `us` for this row's flops.
    pub fn tflops(&self, us: f64) -> f64 {
        self.w.flops() / (us * 1e-6) / 1e12
    }

    /// The fastest torch peer that ran: (peer, µs).
    pub fn best_peer(&self) -> Option<(&str, f64)> {
        super::fastest_peer(&self.peers)
    }

    /// Best torch time / kgen time (> 1: kgen is faster).
    pub fn speedup(&self) -> Option<f64> {
        Some(self.best_peer()?.1 / self.kgen.as_ref().ok()?.median_us)
    }
}

fn check_err(what: String) -> OpError {
    shape_err("bench muon", what)
}

/// Up to `rows` rows at the start and at the end of the contiguous `t` (as `[.., cols]`),
/// read back.
fn sample_rows(t: &Tensor, cols: usize, rows: usize) -> Result<Vec<Vec<f64>>, OpError> {
    let total = t.numel() / cols.max(1);
    let take = rows.min(total);
    let flat = t.reshape(&[t.numel()])?;
    let mut out = Vec::new();
    for start in [0, total - take] {
        let v = flat.narrow(0, start * cols, take * cols)?.to_f64_vec()?;
        out.extend(v.chunks(cols).map(<[f64]>::to_vec));
    }
    Ok(out)
}

/// Newton–Schulz's result: every sampled row finite, their mean squared norm returned.
/// The rows of the wide orientation are near-orthonormal after 5 quintic steps (singular
/// values in about 0.5 .. 1.5), so the mean is near 1; outside `0.1 .. 3` is an error.
fn check_ns_rows(out: &Tensor, rows: usize, cols: usize) -> Result<f64, OpError> {
    if rows > cols {
        // Tall: the rows of the wide orientation are the columns; not sampled here.
        return Ok(f64::NAN);
    }
    let sample = sample_rows(out, cols, 64)?;
    let mut sum = 0.0;
    for (i, r) in sample.iter().enumerate() {
        if let Some(x) = r.iter().find(|x| !x.is_finite()) {
            return Err(check_err(format!("sampled row {i} holds {x}")));
        }
        sum += r.iter().map(|x| x * x).sum::<f64>();
    }
    let mean = sum / sample.len().max(1) as f64;
    if !(0.1..=3.0).contains(&mean) {
        return Err(check_err(format!(
            "sampled rows' mean squared norm {mean:.3}, not near 1: not orthogonalized"
        )));
    }
    Ok(mean)
}

/// A Muon (lr 0.02, weight decay 0.1, momentum 0.95, Nesterov, the quintic
/// coefficients, 5 steps, eps 1e-7: torch_peers.py's) over fp32 `shapes`, params
/// N(0, 0.02²) and grads N(0, 0.01²) (per matrix, padding left zero).
fn muon_with_random_state(ops: &Ops, shapes: &[[usize; 2]], seed: u64) -> Result<Muon, OpError> {
    let group = MuonGroup {
        weight_decay: 0.1,
        momentum: 0.95,
        nesterov: true,
        ns_coefficients: vec![QUINTIC],
        ns_steps: NS_STEPS,
        shapes: shapes.to_vec(),
        ..MuonGroup::new(0.02)
    };
    let opt = Muon::new(ops, DType::F32, vec![group])?;
    let largest = shapes.iter().map(|[r, c]| r * c).max().unwrap_or(1);
    for (k, std) in [(0u64, 0.02), (1, 0.01)] {
        let how = Fill::Normal { mean: 0.0, std };
        let p = pool(
            ops.device(),
            DType::F32,
            largest,
            how,
            seed ^ ((k + 1) << 32),
        )?;
        for j in 0..shapes.len() {
            let t = if k == 0 {
                opt.param(0, j)?
            } else {
                opt.grad(0, j)?
            };
            tile_from(&t, &p)?;
        }
        ops.device().synchronize()?;
    }
    Ok(opt)
}

/// Times one Muon row (kgen's op, tuned during the warm-up) and checks what it wrote.
pub fn run_muon(ops: &Ops, timer: &Timer, w: &MuonWorkload, seed: u64) -> MuonRow {
    let mut row = MuonRow {
        w: w.clone(),
        kgen: Err("not run".into()),
        check: None,
        peers: Vec::new(),
    };
    let r = (|| -> Result<(), OpError> {
        match &w.kind {
            MuonKind::NewtonSchulz { batch, rows, cols } => {
                let shape: Vec<usize> = if *batch > 1 {
                    vec![*batch, *rows, *cols]
                } else {
                    vec![*rows, *cols]
                };
                let d = ops.device();
                let (x, out) = (d.empty(DType::BF16, &shape)?, d.empty(DType::BF16, &shape)?);
                let normal = Fill::Normal {
                    mean: 0.0,
                    std: 1.0,
                };
                fill(&x, normal, seed)?;
                fill(&out, Fill::Nan, 0)?;
                row.kgen = timer
                    .time(&mut || ops.newton_schulz_into(&x, &out, NS_STEPS, &[QUINTIC]))
                    .map_err(|e| e.to_string());
                if row.kgen.is_ok() {
                    row.check = Some(check_ns_rows(&out, *rows, *cols)?);
                }
            }
            MuonKind::Step { shapes } => {
                let mut opt = muon_with_random_state(ops, shapes, seed)?;
                row.kgen = timer.time(&mut || opt.step(ops)).map_err(|e| e.to_string());
                if row.kgen.is_ok() {
                    let p = opt.param(0, shapes.len() - 1)?;
                    let sample = sample_rows(&p, shapes[shapes.len() - 1][1], 16)?;
                    let vals: Vec<f64> = sample.into_iter().flatten().collect();
                    if let Some(x) = vals.iter().find(|x| !x.is_finite()) {
                        return Err(check_err(format!("a sampled parameter is {x}")));
                    }
                    let ms = vals.iter().map(|x| x * x).sum::<f64>() / vals.len().max(1) as f64;
                    row.check = Some(ms.sqrt());
                }
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

/// Attaches each row's torch peers (in the file's order).
pub fn merge_muon_peers(rows: &mut [MuonRow], peers: &[PeerRecord]) {
    for r in rows.iter_mut() {
        r.peers = peers
            .iter()
            .filter(|p| p.workload == r.w.name)
            .cloned()
            .collect();
    }
}

/// The Muon table: kgen's median and TFLOP/s, the fastest torch peer and its TFLOP/s,
/// kgen against it, every peer, and the after-run check.
pub fn format_muon_table(rows: &[MuonRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<32} {:>10} {:>19} {:>7} {:>20} {:>7} {:>7} {:>7}  torch peers (us)",
        "workload", "kgen us", "[p20 .. p80]", "TF/s", "torch_best us", "TF/s", "speedup", "check"
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
            "{:<32} {:>10} {:>19} {:>7} {:>20} {:>7} {:>7} {:>7}  {}",
            r.w.name,
            med,
            spread,
            tf,
            best.map_or("-".into(), |(p, us)| format!("{us:.1} {p}")),
            best.map_or("-".into(), |(_, us)| format!("{:.0}", r.tflops(us))),
            r.speedup().map_or("-".into(), |x| format!("{x:.2}x")),
            r.check
                .filter(|c| c.is_finite())
                .map_or("-".into(), |c| format!("{c:.3}")),
            peers
        );
        if let Err(e) = &r.kgen {
            let _ = writeln!(s, "  kgen: {e}");
        }
    }
    s
}

/// The rows as JSON objects (`muon` in `kgen bench --json`).
pub fn muon_rows_json(rows: &[MuonRow]) -> serde_json::Value {
    use serde_json::json;
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                let m = r.kgen.as_ref().ok();
                json!({
                    "workload": r.w.name,
                    "shape": r.w.shape,
                    "dtype": r.w.dtype,
                    "floor_bytes": r.w.floor_bytes(),
                    "flops": r.w.flops(),
                    "median_us": m.map(|m| m.median_us),
                    "p20_us": m.map(|m| m.p20_us),
                    "p80_us": m.map(|m| m.p80_us),
                    "runs": m.map(|m| m.runs),
                    "host_us": m.map(|m| m.host_us),
                    "tflops": m.map(|m| r.tflops(m.median_us)),
                    "error": r.kgen.as_ref().err(),
                    "check": r.check.filter(|c| c.is_finite()),
                    "torch_best": r.best_peer().map(|(p, us)| json!({"peer": p, "median_us": us})),
                    "speedup": r.speedup(),
                    "torch": r.peers.iter().map(|p| json!({
                        "peer": p.peer, "median_us": p.median_us, "host_us": p.host_us,
                        "error": p.error,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_runtime::Device;

    /// `| `name` | shape | dtype | peers | bytes | formula |` rows of bench/README.md.
    fn readme_rows() -> Vec<Vec<String>> {
        include_str!("../../bench/README.md")
            .lines()
            .map(|l| {
                l.trim()
                    .trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_string())
                    .collect::<Vec<_>>()
            })
            .filter(|c| c.len() >= 6 && c[0].starts_with('`'))
            .collect()
    }

    #[test]
    fn names_shapes_floors_and_formulas_match_torch_peers() {
        let rows = readme_rows();
        let ws = muon_workloads();
        let names: Vec<&str> = ws.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "newton_schulz5_bf16_1024x1024",
                "newton_schulz5_bf16_2048x2048",
                "newton_schulz5_bf16_4096x4096",
                "newton_schulz5_bf16_8192x8192",
                "newton_schulz5_bf16_768x3072",
                "newton_schulz5_bf16_12x768x768",
                "muon_step_gpt2",
            ]
        );
        for w in &ws {
            let row = rows
                .iter()
                .find(|r| r[0] == format!("`{}`", w.name))
                .unwrap_or_else(|| panic!("{} is not in bench/README.md", w.name));
            assert_eq!(row[1], w.shape, "{}: shape", w.name);
            assert_eq!(row[2], w.dtype, "{}: dtype", w.name);
            assert_eq!(row[4], w.floor_bytes().to_string(), "{}: floor", w.name);
            assert_eq!(row[5], w.formula, "{}: formula", w.name);
        }
    }

    #[test]
    fn flops_and_the_gpt2_hidden_matrices() {
        let h = gpt2_hidden_matrices();
        assert_eq!(h.len(), 48);
        assert_eq!(h.iter().map(|[r, c]| r * c).sum::<usize>(), 84_934_656);
        // The GPT-2 list's [in, out] Conv1D weights, transposed.
        let mut conv: Vec<[usize; 2]> = super::super::gpt2_param_shapes()
            .into_iter()
            .filter(|(n, s)| s.len() == 2 && n != "wte" && n != "wpe")
            .map(|(_, s)| [s[1], s[0]])
            .collect();
        let mut hs = h.clone();
        conv.sort();
        hs.sort();
        assert_eq!(hs, conv);
        // 5 * (4 m^2 n + 2 m^3) per matrix, times the batch.
        let w = MuonWorkload::newton_schulz(1, 768, 3072);
        let (m, n) = (768.0f64, 3072.0f64);
        assert_eq!(w.flops(), 5.0 * (4.0 * m * m * n + 2.0 * m * m * m));
        assert_eq!(
            MuonWorkload::newton_schulz(12, 768, 768).flops(),
            12.0 * ns_flops(768, 768, 5)
        );
        assert_eq!(ns_flops(3072, 768, 5), ns_flops(768, 3072, 5));
        let step = muon_workloads().pop().unwrap();
        let want =
            12.0 * (ns_flops(2304, 768, 5) + ns_flops(768, 768, 5) + 2.0 * ns_flops(3072, 768, 5));
        assert_eq!(step.flops(), want);
    }

    fn small(kind: MuonKind) -> MuonWorkload {
        MuonWorkload {
            name: "small".into(),
            shape: String::new(),
            dtype: "bf16",
            formula: "",
            kind,
        }
    }

    #[test]
    fn rows_run_on_the_interpreter_and_pair_with_peers() {
        let ops = Ops::new(&Device::interpreter());
        let timer = Timer::new(&ops, 2, 1, 0).unwrap();
        let mut rows = vec![
            run_muon(
                &ops,
                &timer,
                &small(MuonKind::NewtonSchulz {
                    batch: 2,
                    rows: 16,
                    cols: 40,
                }),
                1,
            ),
            run_muon(
                &ops,
                &timer,
                &small(MuonKind::Step {
                    shapes: vec![[24, 8], [8, 8], [8, 24]],
                }),
                2,
            ),
        ];
        for r in &rows {
            assert!(r.kgen.is_ok(), "{:?}", r.kgen);
            let c = r.check.unwrap();
            assert!(c.is_finite() && c > 0.0, "check {c}");
        }
        // Orthogonalized rows: squared norms near 1.
        assert!((0.3..=2.0).contains(&rows[0].check.unwrap()));
        let peers = vec![
            PeerRecord {
                workload: "small".into(),
                peer: "eager".into(),
                median_us: Some(1e9),
                host_us: None,
                error: None,
            },
            PeerRecord {
                workload: "small".into(),
                peer: "compile".into(),
                median_us: None,
                host_us: None,
                error: Some("boom".into()),
            },
            PeerRecord {
                workload: "other".into(),
                peer: "eager".into(),
                median_us: Some(1.0),
                host_us: None,
                error: None,
            },
        ];
        merge_muon_peers(&mut rows, &peers);
        assert_eq!(rows[0].peers.len(), 2);
        assert_eq!(rows[0].best_peer(), Some(("eager", 1e9)));
        assert!(rows[0].speedup().unwrap() > 1.0);
        let t = format_muon_table(&rows);
        assert!(t.contains("eager 1000000000.0, compile ERR"), "{t}");
        let j = muon_rows_json(&rows);
        assert_eq!(j[0]["torch_best"]["peer"], "eager");
        assert_eq!(j[1]["torch"][0]["peer"], "eager");
    }

    #[test]
    fn a_bad_result_is_an_error() {
        let d = Device::interpreter();
        let zeros = d.from_f64(DType::BF16, &[4, 8], &[0.0; 32]).unwrap();
        assert!(check_ns_rows(&zeros, 4, 8).is_err());
        let nan = d.from_f64(DType::BF16, &[4, 8], &[f64::NAN; 32]).unwrap();
        assert!(check_ns_rows(&nan, 4, 8).is_err());
    }
}
