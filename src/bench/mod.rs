//! `kgen::bench`: the workloads of `kgen bench` (the bandwidth-bound rows of
//! `shared/ANCHORS.md`), their floor bytes and targets, the PyTorch peer records that
//! `bench/torch_peers.py --json` writes, and the table / CSV / JSON output.
//!
//! This module is pure (no device): names, shapes, floor-byte formulas, quantiles, peer
//! parsing and formatting. [`measure`] sets the workloads up on a [`kgen_runtime::Device`]
//! and times them.
//!
//! Guarantees: workload names, floor bytes and formula texts are the same as
//! `bench/torch_peers.py`'s (a unit test reads the workload table of `bench/README.md`,
//! which `torch_peers.py --self-check` checks against the Python side, and compares every
//! row); GB/s is `floor_bytes / median` (decimal GB/s), so a kernel that moves more bytes
//! than the floor shows a lower figure, never a higher one.

use kgen_core::types::DType;
use std::fmt::Write as _;

pub mod attention;
pub mod gemm;
pub mod measure;
pub mod muon;

/// The 148 parameter tensors of GPT-2 small (124M) in nanoGPT order (weight-tied
/// lm_head not counted), linear weights `[in, out]` as HF's Conv1D stores them: the same
/// list as `torch_peers.py`'s `gpt2_param_shapes`.
pub fn gpt2_param_shapes() -> Vec<(String, Vec<usize>)> {
    let (d, vocab, ctx, layers) = (768, 50257, 1024, 12);
    let mut v = vec![
        ("wte".to_string(), vec![vocab, d]),
        ("wpe".to_string(), vec![ctx, d]),
    ];
    for i in 0..layers {
        let h = format!("h.{i}.");
        let layer: [(&str, Vec<usize>); 12] = [
            ("ln_1.weight", vec![d]),
            ("ln_1.bias", vec![d]),
            ("attn.c_attn.weight", vec![d, 3 * d]),
            ("attn.c_attn.bias", vec![3 * d]),
            ("attn.c_proj.weight", vec![d, d]),
            ("attn.c_proj.bias", vec![d]),
            ("ln_2.weight", vec![d]),
            ("ln_2.bias", vec![d]),
            ("mlp.c_fc.weight", vec![d, 4 * d]),
            ("mlp.c_fc.bias", vec![4 * d]),
            ("mlp.c_proj.weight", vec![4 * d, d]),
            ("mlp.c_proj.bias", vec![d]),
        ];
        v.extend(layer.into_iter().map(|(n, s)| (format!("{h}{n}"), s)));
    }
    v.push(("ln_f.weight".to_string(), vec![d]));
    v.push(("ln_f.bias".to_string(), vec![d]));
    v
}

/// Total elements of a list of shapes.
pub fn total_numel(shapes: &[Vec<usize>]) -> usize {
    shapes.iter().map(|s| s.iter().product::<usize>()).sum()
}

fn gpt2_shapes_only() -> Vec<Vec<usize>> {
    gpt2_param_shapes().into_iter().map(|(_, s)| s).collect()
}

/// What a workload runs (and on which shapes); [`measure::prepare`] builds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// `dst.copy_from(src)`: one cuMemcpyDtoDAsync of `bytes` bytes.
    Copy { bytes: usize },
    /// One `AdamW::step` over one param group with these shapes.
    AdamW {
        param: DType,
        state: DType,
        shapes: Vec<Vec<usize>>,
    },
    /// RMSNorm (`layer` false) or LayerNorm forward, and with `bwd` also the backward.
    Norm {
        layer: bool,
        rows: usize,
        hidden: usize,
        bwd: bool,
    },
    /// `h = x + residual; y = rmsnorm(h)` fused (`Ops::add_rmsnorm_into`), and with
    /// `bwd` its backward (`Ops::add_rmsnorm_backward_into`).
    AddRmsnorm {
        rows: usize,
        hidden: usize,
        bwd: bool,
    },
    /// `silu(gate) * up` (and its backward), gate and up separate `[rows, cols]`.
    Swiglu { rows: usize, cols: usize, bwd: bool },
    /// RoPE of `q [b, s, h, d]` (and its backward).
    Rope {
        b: usize,
        s: usize,
        h: usize,
        d: usize,
        bwd: bool,
    },
    /// Softmax forward over the last dim.
    Softmax { rows: usize, cols: usize },
    /// Cross-entropy forward + backward (mean loss, dlogits); rows `i % ignore_every == 0`
    /// have target -100 when `ignore_every > 0`.
    CrossEntropy {
        rows: usize,
        vocab: usize,
        ignore_every: usize,
    },
    /// `clip_grad_norm_(max_norm = 1)` over the fp32 gradients of these shapes.
    ClipGradNorm { shapes: Vec<Vec<usize>> },
    /// The global gradient norm over the fp32 gradients of these shapes.
    GradNorm { shapes: Vec<Vec<usize>> },
}

impl Kind {
    /// The floor: the minimum bytes the workload must move (ANCHORS' definition: each
    /// input read once, each output written once; weights, tables and per-row
    /// statistics excluded).
    pub fn floor_bytes(&self) -> u64 {
        let b = |x: usize| x as u64;
        match self {
            Kind::Copy { bytes } => 2 * b(*bytes),
            Kind::AdamW {
                param,
                state,
                shapes,
            } => {
                b(total_numel(shapes))
                    * (3 * param.size_bytes() as u64 + 4 * state.size_bytes() as u64)
            }
            Kind::Norm {
                rows, hidden, bwd, ..
            } => (if *bwd { 10 } else { 4 }) * b(rows * hidden),
            Kind::AddRmsnorm { rows, hidden, bwd } => {
                (if *bwd { 16 } else { 8 }) * b(rows * hidden)
            }
            Kind::Swiglu { rows, cols, bwd } => (if *bwd { 16 } else { 6 }) * b(rows * cols),
            Kind::Rope {
                b: bb,
                s,
                h,
                d,
                bwd,
            } => (if *bwd { 8 } else { 4 }) * b(bb * s * h * d),
            Kind::Softmax { rows, cols } => 4 * b(rows * cols),
            Kind::CrossEntropy { rows, vocab, .. } => 4 * b(rows * vocab),
            Kind::ClipGradNorm { shapes } => 12 * b(total_numel(shapes)),
            Kind::GradNorm { shapes } => 4 * b(total_numel(shapes)),
        }
    }
}

/// One benchmark row: a stable name (the same in `torch_peers.py`), the ANCHORS target.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub name: String,
    pub shape: String,
    pub dtype: &'static str,
    pub formula: &'static str,
    /// ANCHORS' target for kgen, µs (None for the copy ceiling).
    pub target_us: Option<f64>,
    pub kind: Kind,
}

impl Workload {
    pub fn floor_bytes(&self) -> u64 {
        self.kind.floor_bytes()
    }
}

const NORM_FWD: &str = "4*R*H: read x, write y (bf16; weight/bias and per-row stats excluded)";
const NORM_FWDBWD: &str = "10*R*H: fwd read x, write y; bwd read x, dy, write dx (bf16; \
                           weight/bias, dw/db and per-row stats excluded)";

fn adamw_formula(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "N*(3+4)*4: read p,g,m,v + write p,m,v; params, grads, states all fp32",
        DType::BF16 => "N*(3+4)*2: read p,g,m,v + write p,m,v; params, grads, states all bf16",
        _ => "N*(3+4)*2: read p,g,m,v + write p,m,v; params, grads, states all fp16",
    }
}

/// Every workload of `kgen bench`, copy first (its GB/s is the ceiling the others are
/// divided by).
pub fn workloads() -> Vec<Workload> {
    let gpt2 = gpt2_shapes_only();
    let gpt2_label = format!("GPT-2 124M ({} tensors)", gpt2.len());
    let mut w = vec![Workload {
        name: "copy_d2d_1GiB".into(),
        shape: "1 GiB".into(),
        dtype: "bf16",
        formula: "2*S: read S = 2^30 bytes, write S (the bandwidth ceiling)",
        target_us: None,
        kind: Kind::Copy { bytes: 1 << 30 },
    }];
    let adamw =
        |name: &str, shape: &str, dt: DType, shapes: Vec<Vec<usize>>, target: f64| Workload {
            name: name.into(),
            shape: shape.into(),
            dtype: match dt {
                DType::F32 => "fp32",
                DType::BF16 => "bf16",
                _ => "fp16",
            },
            formula: adamw_formula(dt),
            target_us: Some(target),
            kind: Kind::AdamW {
                param: dt,
                state: dt,
                shapes,
            },
        };
    let one = vec![vec![4096, 1024]];
    w.push(adamw(
        "adamw_fp32_gpt2",
        &gpt2_label,
        DType::F32,
        gpt2.clone(),
        1220.0,
    ));
    w.push(adamw(
        "adamw_fp32_4096x1024",
        "4096x1024",
        DType::F32,
        one.clone(),
        45.0,
    ));
    w.push(adamw(
        "adamw_bf16_gpt2",
        &gpt2_label,
        DType::BF16,
        gpt2.clone(),
        650.0,
    ));
    w.push(adamw(
        "adamw_fp16_4096x1024",
        "4096x1024",
        DType::F16,
        one,
        30.0,
    ));
    let norm = |layer: bool, rows: usize, hidden: usize, bwd: bool, target: f64| Workload {
        name: format!(
            "{}_{}_bf16_{rows}x{hidden}",
            if layer { "layernorm" } else { "rmsnorm" },
            if bwd { "fwdbwd" } else { "fwd" }
        ),
        shape: format!("{rows}x{hidden}"),
        dtype: "bf16",
        formula: if bwd { NORM_FWDBWD } else { NORM_FWD },
        target_us: Some(target),
        kind: Kind::Norm {
            layer,
            rows,
            hidden,
            bwd,
        },
    };
    w.push(norm(false, 16384, 4096, false, 95.0));
    w.push(norm(false, 16384, 4096, true, 250.0));
    w.push(norm(true, 16384, 4096, false, 95.0));
    w.push(norm(true, 16384, 4096, true, 260.0));
    w.push(norm(false, 16384, 768, false, 19.0));
    w.push(norm(true, 16384, 768, false, 19.0));
    for bwd in [false, true] {
        w.push(Workload {
            name: format!(
                "add_rmsnorm_{}_bf16_16384x4096",
                if bwd { "fwdbwd" } else { "fwd" }
            ),
            shape: "16384x4096".into(),
            dtype: "bf16",
            formula: if bwd {
                "16*R*H: fwd read x, residual, write h, y; bwd read h, dy, dh_residual, write dh \
                 (bf16; weight, dw and per-row stats excluded)"
            } else {
                "8*R*H: read x, residual, write h, y (bf16; weight and per-row stats excluded)"
            },
            target_us: None,
            kind: Kind::AddRmsnorm {
                rows: 16384,
                hidden: 4096,
                bwd,
            },
        });
    }
    for (bwd, target) in [(false, 190.0), (true, 530.0)] {
        w.push(Workload {
            name: format!(
                "swiglu_{}_bf16_8192x11008",
                if bwd { "fwdbwd" } else { "fwd" }
            ),
            shape: "gate,up 8192x11008".into(),
            dtype: "bf16",
            formula: if bwd {
                "16*N: fwd read gate, up, write out; bwd read gate, up, dout, write dgate, dup"
            } else {
                "6*N: read gate, up, write out (bf16)"
            },
            target_us: Some(target),
            kind: Kind::Swiglu {
                rows: 8192,
                cols: 11008,
                bwd,
            },
        });
    }
    for (bwd, target) in [(false, 95.0), (true, 200.0)] {
        w.push(Workload {
            name: format!(
                "rope_{}_bf16_8x2048x32x128",
                if bwd { "fwdbwd" } else { "fwd" }
            ),
            shape: "q B=8 S=2048 H=32 D=128".into(),
            dtype: "bf16",
            formula: if bwd {
                "8*N: fwd read q, write out; bwd read dout, write dq (tables excluded)"
            } else {
                "4*N: read q, write out (bf16; cos/sin tables excluded)"
            },
            target_us: Some(target),
            kind: Kind::Rope {
                b: 8,
                s: 2048,
                h: 32,
                d: 128,
                bwd,
            },
        });
    }
    w.push(Workload {
        name: "softmax_fwd_bf16_16384x4096".into(),
        shape: "16384x4096".into(),
        dtype: "bf16",
        formula: "4*R*C: read x, write y (bf16)",
        target_us: Some(95.0),
        kind: Kind::Softmax {
            rows: 16384,
            cols: 4096,
        },
    });
    // 50304: GPT-2's vocabulary padded to a multiple of 64 (as nanoGPT does), whose rows
    // are 16-byte aligned (no target; it shows what the odd 50257 costs).
    for (rows, vocab, every, target) in [
        (8192, 50257, 7, Some(620.0)),
        (4096, 128256, 0, Some(790.0)),
        (8192, 50304, 7, None),
    ] {
        w.push(Workload {
            name: format!("cross_entropy_fwdbwd_bf16_{rows}x{vocab}"),
            shape: format!(
                "logits {rows}x{vocab}{}",
                if every > 0 { ", 1 in 7 ignored" } else { "" }
            ),
            dtype: "bf16",
            formula: "4*N*V: read logits once, write dlogits once (bf16; targets excluded)",
            target_us: target,
            kind: Kind::CrossEntropy {
                rows,
                vocab,
                ignore_every: every,
            },
        });
    }
    let grads_label = format!("GPT-2 grads ({} tensors)", gpt2.len());
    w.push(Workload {
        name: "clip_grad_norm_fp32_gpt2".into(),
        shape: grads_label.clone(),
        dtype: "fp32",
        formula: "12*N: read g for the norm, then read g and write g*scale (fp32)",
        target_us: Some(560.0),
        kind: Kind::ClipGradNorm {
            shapes: gpt2.clone(),
        },
    });
    w.push(Workload {
        name: "grad_norm_fp32_gpt2".into(),
        shape: grads_label,
        dtype: "fp32",
        formula: "4*N: read g once (fp32)",
        target_us: Some(190.0),
        kind: Kind::GradNorm { shapes: gpt2 },
    });
    w
}

/// Whether `name` is selected by `--filter` (comma-separated substrings, any match; no
/// filter selects everything). The copy always runs: the others are divided by it.
pub fn selected(name: &str, filter: Option<&str>) -> bool {
    if name == "copy_d2d_1GiB" {
        return true;
    }
    match filter {
        None => true,
        Some(f) => f
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .any(|p| name.contains(p)),
    }
}

/// Quantile `q` (0..=1) of `v` with linear interpolation (torch.quantile's default,
/// which `triton.testing.do_bench` uses); None when `v` is empty.
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(s[lo] + (s[hi] - s[lo]) * (pos - lo as f64))
}

/// Timings of one workload, µs.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub median_us: f64,
    pub p20_us: f64,
    pub p80_us: f64,
    /// Timed runs the quantiles are over.
    pub runs: usize,
    /// Mean host time to issue one call (10 calls, no sync between them).
    pub host_us: f64,
}

impl Measured {
    /// From per-run times in µs.
    pub fn from_times(times_us: &[f64], host_us: f64) -> Option<Measured> {
        Some(Measured {
            median_us: quantile(times_us, 0.5)?,
            p20_us: quantile(times_us, 0.2)?,
            p80_us: quantile(times_us, 0.8)?,
            runs: times_us.len(),
            host_us,
        })
    }
}

/// One record of `torch_peers.py --json`.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRecord {
    pub workload: String,
    pub peer: String,
    pub median_us: Option<f64>,
    pub host_us: Option<f64>,
    pub error: Option<String>,
}

/// Parses the JSON list `torch_peers.py --json` writes. Records without a `workload` or
/// `peer` string are an error (not a torch_peers file); extra fields are ignored.
pub fn parse_peers(text: &str) -> Result<Vec<PeerRecord>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let list = v
        .as_array()
        .ok_or("expected a JSON list of records (torch_peers.py --json)")?;
    let mut out = Vec::with_capacity(list.len());
    for (i, r) in list.iter().enumerate() {
        let s = |k: &str| r.get(k).and_then(|x| x.as_str()).map(str::to_string);
        let f = |k: &str| r.get(k).and_then(|x| x.as_f64());
        let (Some(workload), Some(peer)) = (s("workload"), s("peer")) else {
            return Err(format!("record {i}: no `workload` / `peer` strings"));
        };
        out.push(PeerRecord {
            workload,
            peer,
            median_us: f("median_us").filter(|x| x.is_finite() && *x > 0.0),
            host_us: f("host_us"),
            error: s("error"),
        });
    }
    Ok(out)
}

/// The `workload` of the launch-cost peers' records (`bench/launch_peers.py`): the host
/// cost of one launch from CUDA C++, Triton, torch and cupy on the bench's host.
pub const LAUNCH_PEER_WORKLOAD: &str = "launch_host";

/// The launch-cost peers among `peers` as (peer, median host µs per launch), fastest
/// first; records without a median (a failed peer) are left out.
pub fn launch_peers(peers: &[PeerRecord]) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = peers
        .iter()
        .filter(|r| r.workload == LAUNCH_PEER_WORKLOAD)
        .filter_map(|r| Some((r.peer.clone(), r.median_us?)))
        .collect();
    v.sort_by(|a, b| a.1.total_cmp(&b.1));
    v
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub workload: String,
    pub shape: String,
    pub dtype: String,
    pub floor_bytes: u64,
    pub target_us: Option<f64>,
    /// The timing, or why there is none ("not available: ...", an error).
    pub result: Result<Measured, String>,
    /// Something the run noticed (e.g. the clip coefficient was 1).
    pub note: Option<String>,
    /// The torch peers of this workload (from `--peers`).
    pub peers: Vec<PeerRecord>,
}

impl Row {
    pub fn median_us(&self) -> Option<f64> {
        self.result.as_ref().ok().map(|m| m.median_us)
    }

    /// Decimal GB/s at the floor bytes.
    pub fn gbps(&self) -> Option<f64> {
        self.median_us()
            .map(|us| self.floor_bytes as f64 / us / 1e3)
    }

    /// Fraction of the copy bandwidth measured in the same run.
    pub fn of_copy(&self, copy_gbps: Option<f64>) -> Option<f64> {
        Some(self.gbps()? / copy_gbps.filter(|c| *c > 0.0)?)
    }

    /// Met the ANCHORS target (None: no target or no timing).
    pub fn pass(&self) -> Option<bool> {
        Some(self.median_us()? <= self.target_us?)
    }

    /// The fastest torch peer that ran: (peer, µs).
    pub fn best_peer(&self) -> Option<(&str, f64)> {
        fastest_peer(&self.peers)
    }

    /// Best torch time / kgen time (> 1: kgen is faster).
    pub fn speedup(&self) -> Option<f64> {
        Some(self.best_peer()?.1 / self.median_us()?)
    }

    /// `fused 1344.0, foreach ERR` (every peer of the row).
    pub fn peers_text(&self) -> String {
        self.peers
            .iter()
            .map(|p| match p.median_us {
                Some(us) => format!("{} {us:.1}", p.peer),
                None => format!("{} ERR", p.peer),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Attaches each workload's peer records to its row (in the file's order).
pub fn merge_peers(rows: &mut [Row], peers: &[PeerRecord]) {
    for r in rows.iter_mut() {
        r.peers = peers
            .iter()
            .filter(|p| p.workload == r.workload)
            .cloned()
            .collect();
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{x:.prec$}"))
}

/// The human-readable table (one line per row; peers side by side when present).
pub fn format_table(rows: &[Row], copy_gbps: Option<f64>) -> String {
    let with_peers = rows.iter().any(|r| !r.peers.is_empty());
    let mut s = String::new();
    let _ = write!(
        s,
        "{:<38} {:>9} {:>19} {:>7} {:>6} {:>7} {:>4}",
        "workload", "median_us", "[p20 .. p80]", "GB/s", "%copy", "target", "ok"
    );
    if with_peers {
        let _ = write!(
            s,
            " {:>17} {:>7}  torch peers (us)",
            "torch_best", "speedup"
        );
    }
    s.push('\n');
    for r in rows {
        let _ = write!(s, "{:<38} ", r.workload);
        match &r.result {
            Ok(m) => {
                let _ = write!(
                    s,
                    "{:>9.1} {:>19} {:>7.0} {:>6} {:>7} {:>4}",
                    m.median_us,
                    format!("[{:.1} .. {:.1}]", m.p20_us, m.p80_us),
                    r.gbps().unwrap_or(0.0),
                    r.of_copy(copy_gbps)
                        .map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
                    opt(r.target_us, 0),
                    match r.pass() {
                        Some(true) => "PASS",
                        Some(false) => "MISS",
                        None => "-",
                    }
                );
            }
            Err(e) => {
                let _ = write!(
                    s,
                    "{:>9} {:>19} {:>7} {:>6} {:>7} {:>4}",
                    "-",
                    "",
                    "-",
                    "-",
                    opt(r.target_us, 0),
                    "-"
                );
                let _ = write!(s, "  [{e}]");
            }
        }
        if with_peers && r.result.is_ok() {
            let best = r
                .best_peer()
                .map_or("-".to_string(), |(p, us)| format!("{us:.1} {p}"));
            let _ = write!(
                s,
                " {:>17} {:>7}  {}",
                best,
                r.speedup().map_or("-".into(), |x| format!("{x:.2}x")),
                r.peers_text()
            );
        }
        if let Some(n) = &r.note {
            let _ = write!(s, "  ({n})");
        }
        s.push('\n');
    }
    s
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The CSV header of [`to_csv`].
pub const CSV_HEADER: &str = "workload,shape,dtype,floor_bytes,median_us,p20_us,p80_us,runs,\
     host_us,gbps,of_copy,target_us,pass,torch_best_peer,torch_best_us,speedup,torch_peers,\
     error,note";

/// One CSV line per row (empty fields for missing values).
pub fn to_csv(rows: &[Row], copy_gbps: Option<f64>) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    let num = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x}"));
    for r in rows {
        let m = r.result.as_ref().ok();
        let best = r.best_peer();
        let fields = [
            csv_field(&r.workload),
            csv_field(&r.shape),
            csv_field(&r.dtype),
            r.floor_bytes.to_string(),
            num(m.map(|m| m.median_us)),
            num(m.map(|m| m.p20_us)),
            num(m.map(|m| m.p80_us)),
            m.map_or(String::new(), |m| m.runs.to_string()),
            num(m.map(|m| m.host_us)),
            num(r.gbps()),
            num(r.of_copy(copy_gbps)),
            num(r.target_us),
            r.pass().map_or(String::new(), |p| p.to_string()),
            best.map_or(String::new(), |b| csv_field(b.0)),
            num(best.map(|b| b.1)),
            num(r.speedup()),
            csv_field(&r.peers_text()),
            r.result
                .as_ref()
                .err()
                .map_or(String::new(), |e| csv_field(e)),
            r.note.as_deref().map_or(String::new(), csv_field),
        ];
        s.push_str(&fields.join(","));
        s.push('\n');
    }
    s
}

/// The rows as JSON objects (the `rows` of `kgen bench --json`).
pub fn rows_json(rows: &[Row], copy_gbps: Option<f64>) -> serde_json::Value {
    use serde_json::json;
    let list: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let m = r.result.as_ref().ok();
            json!({
                "workload": r.workload,
                "shape": r.shape,
                "dtype": r.dtype,
                "floor_bytes": r.floor_bytes,
                "median_us": m.map(|m| m.median_us),
                "p20_us": m.map(|m| m.p20_us),
                "p80_us": m.map(|m| m.p80_us),
                "runs": m.map(|m| m.runs),
                "host_us": m.map(|m| m.host_us),
                "gbps": r.gbps(),
                "of_copy": r.of_copy(copy_gbps),
                "target_us": r.target_us,
                "pass": r.pass(),
                "error": r.result.as_ref().err(),
                "note": r.note,
                "torch_best": r.best_peer().map(|(p, us)| json!({"peer": p, "median_us": us})),
                "speedup": r.speedup(),
                "torch": r.peers.iter().map(|p| json!({
                    "peer": p.peer, "median_us": p.median_us, "host_us": p.host_us,
                    "error": p.error,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::Value::Array(list)
}

/// The fastest of `peers` that ran: (peer, µs).
pub fn fastest_peer(peers: &[PeerRecord]) -> Option<(&str, f64)> {
    peers
        .iter()
        .filter_map(|p| p.median_us.map(|us| (p.peer.as_str(), us)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

#[cfg(test)]
mod tests;
