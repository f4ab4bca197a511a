//! Every kernel specialization the op library can launch, for the tests that compile
//! and assemble them all (`tests/no_spills.rs`: zero spills and zero stack on sm_80 and
//! sm_90a).
//!
//! Assumes: an op's kernels depend on its operands' dtypes, shapes and alignments (and
//! on the device's SM count and target), as the op files choose them; the shapes below
//! reach every branch of those choices: every power-of-two tile from 32 to 8192 with
//! rows of every alignment class (16, 8, 4 and 2 bytes for 16-bit dtypes), rows longer
//! than one tile, row counts below and above the multi-row and bounded-launch
//! thresholds, vocabularies for each cross-entropy kernel family, both index dtypes.
//! Guarantees: [`launchable_kernels`] drives every op through a recording [`Ops`]
//! handle ([`Ops::recording`]) on the interpreter (an sm_90a device with the H100's SM
//! count, so the thread-block-cluster candidates are included): every candidate of
//! every tuning list is built and recorded, nothing runs. The list is what the ops ask
//! for, not a copy of their rules, so it cannot drift from them.

use super::{KernelRequest, OpError, Ops};
use crate::optim::{AdamW, AdamWLaunch, GradStats, GradStatsLaunch, ParamGroup};
use kgen_core::types::DType;
use kgen_runtime::{Device, Tensor};

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// How many alignment classes of rows to try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Rows 16-byte aligned and rows of the dtype's own alignment (2 or 4 bytes: the
    /// widest and the narrowest vectors).
    Quick,
    /// Every alignment class: 16, 8, 4 and (16-bit dtypes) 2 bytes.
    Full,
}

/// The kernels every op can launch (each once, sorted), and the op calls that failed
/// (an op whose default candidate does not compile; the requests are recorded before
/// compiling, so the tests see them either way). The ops run once per target: their
/// candidate lists may differ by target (Newton–Schulz's two-blocks-per-SM Gram tile is
/// offered on sm_90a only).
pub fn launchable_kernels(coverage: Coverage) -> (Vec<KernelRequest>, Vec<String>) {
    let mut all = Vec::new();
    let mut errors = Vec::new();
    for arch in [kgen_core::Arch::Sm90a, kgen_core::Arch::Sm80] {
        let (v, e) = launchable_on(Device::interpreter_as(arch), coverage);
        all.extend(v);
        errors.extend(e.into_iter().map(|x| format!("{arch}: {x}")));
    }
    all.sort();
    all.dedup();
    (all, errors)
}

fn launchable_on(device: Device, coverage: Coverage) -> (Vec<KernelRequest>, Vec<String>) {
    let ops = Ops::recording(&device);
    let errors = std::sync::Mutex::new(Vec::new());
    let note = |what: String, r: Result<(), OpError>| {
        if let Err(e) = r {
            if let Ok(mut v) = errors.lock() {
                v.push(format!("{what}: {e}"));
            }
        }
    };
    let sms = ops.sm_count();
    // One thread per dtype (each op call compiles the kernels it asks for).
    std::thread::scope(|s| {
        for t in FLOATS {
            let (ops, note) = (&ops, &note);
            s.spawn(move || {
                for &cols in &row_widths(coverage) {
                    for rows in row_counts(cols, sms) {
                        note(
                            format!("norms {t} [{rows}, {cols}]"),
                            norms(ops, t, rows, cols),
                        );
                        note(
                            format!("softmax {t} [{rows}, {cols}]"),
                            softmax(ops, t, rows, cols),
                        );
                    }
                    note(
                        format!("activations {t} [{cols}]"),
                        activations(ops, t, cols),
                    );
                }
                for &vocab in &VOCABS {
                    for idx in [DType::I32, DType::I64] {
                        note(
                            format!("cross_entropy {t} {idx} V={vocab}"),
                            cross_entropy(ops, t, idx, vocab),
                        );
                    }
                }
                for c in FLOATS {
                    for &(h, d) in &[(1usize, 2usize), (12, 64), (32, 128), (8, 80)] {
                        note(format!("rope {t} {c} H={h} D={d}"), rope(ops, t, c, h, d));
                    }
                }
                note(format!("matmul {t}"), matmul(ops, t));
                if matches!(t, DType::F16 | DType::BF16) {
                    note(
                        format!("gemm {t} alignments"),
                        gemm_alignments(ops, t, coverage),
                    );
                    note(format!("attention {t}"), attention(ops, t, coverage));
                }
                note(format!("linear {t}"), linear(ops, t));
                note(format!("optimizer {t}"), optimizer(ops, t));
                note(format!("newton_schulz / muon {t}"), muon(ops, t));
            });
        }
    });
    let mut v = ops.take_recorded();
    v.sort();
    v.dedup();
    (v, errors.into_inner().unwrap_or_default())
}

/// Row widths: each power of two from 32 to 8192 and the row one element shorter
/// (the dtype's own alignment; with `Full`, also 2 and 4 elements shorter: for 16-bit
/// dtypes 4- and 8-byte aligned rows), rows shorter than a warp, a width of whole
/// 256-element spans (768), and rows longer than one tile.
fn row_widths(coverage: Coverage) -> Vec<usize> {
    let mut v = vec![1, 7, 768, 8193, 12288];
    for e in 5..=13 {
        let p = 1usize << e;
        v.extend([p, p - 1]);
        if coverage == Coverage::Full {
            v.extend([p - 2, p - 4]);
        }
    }
    if coverage == Coverage::Full {
        v.extend([8194, 8196]);
    }
    v
}

/// Row counts for rows of `cols`: one row, and enough rows for every multi-row and
/// bounded candidate (ROWS up to 4096 / BLOCK at two blocks per SM, at least 8 rows
/// per SM).
fn row_counts(cols: usize, sms: usize) -> [usize; 2] {
    let block = cols.next_power_of_two().clamp(32, 8192);
    [1, (2 * sms * (4096 / block).max(1)).max(8 * sms)]
}

/// Vocabularies: the two-pass kernel's tiles (up to 2048, odd and aligned rows), rows
/// that a block caches whole or in part, windows of odd rows, cluster rows.
const VOCABS: [usize; 12] = [
    1, 7, 32, 1000, 2048, 2047, 4097, 8193, 12288, 40000, 50257, 128256,
];

fn tensor(ops: &Ops, t: DType, shape: &[usize]) -> Result<Tensor, OpError> {
    ops.empty(t, shape)
}

fn norms(ops: &Ops, t: DType, rows: usize, cols: usize) -> Result<(), OpError> {
    let x = tensor(ops, t, &[rows, cols])?;
    let w = tensor(ops, t, &[cols])?;
    let (y, rstd) = ops.rmsnorm(&x, &w, 1e-6)?;
    ops.add_rmsnorm(&x, &y, &w, 1e-6)?;
    ops.rmsnorm_backward(&x, &w, &rstd, &y)?;
    ops.add_rmsnorm_backward(&x, &w, &rstd, &y, &x)?;
    let (y, mean, rstd) = ops.layernorm(&x, &w, &w, 1e-5)?;
    ops.layernorm_backward(&x, &w, &mean, &rstd, &y)?;
    Ok(())
}

fn softmax(ops: &Ops, t: DType, rows: usize, cols: usize) -> Result<(), OpError> {
    let x = tensor(ops, t, &[rows, cols])?;
    let y = ops.softmax(&x)?;
    ops.softmax_backward(&y, &x)?;
    Ok(())
}

/// SwiGLU over rows of `h` (and the concatenated form where 2h is even... always) and
/// ReLU over `h` elements, 4 rows.
fn activations(ops: &Ops, t: DType, h: usize) -> Result<(), OpError> {
    let gate = tensor(ops, t, &[4, h])?;
    let up = tensor(ops, t, &[4, h])?;
    let out = ops.swiglu(&gate, &up)?;
    ops.swiglu_backward(&gate, &up, &out)?;
    let x = tensor(ops, t, &[4, 2 * h])?;
    let y = ops.swiglu_concat(&x)?;
    ops.swiglu_concat_backward(&x, &y)?;
    let y = ops.relu(&gate)?;
    ops.relu_backward(&gate, &y)?;
    Ok(())
}

/// Cross-entropy, out of place and in place, over 8 rows (`8 * V * sizeof(T)` is a
/// multiple of 16 for every V: the flat views the window kernels need).
fn cross_entropy(ops: &Ops, t: DType, idx: DType, vocab: usize) -> Result<(), OpError> {
    let rows = 8;
    let x = tensor(ops, t, &[rows, vocab])?;
    let targets = ops.zeros(idx, &[rows])?;
    ops.cross_entropy(&x, &targets, super::loss::DEFAULT_IGNORE_INDEX)?;
    ops.cross_entropy_in_place(&x, &targets, super::loss::DEFAULT_IGNORE_INDEX)?;
    Ok(())
}

/// RoPE forward and backward, `[2, 3, h, d]`, tables of dtype `c`.
fn rope(ops: &Ops, t: DType, c: DType, h: usize, d: usize) -> Result<(), OpError> {
    let x = tensor(ops, t, &[2, 3, h, d])?;
    let cos = tensor(ops, c, &[3, d / 2])?;
    let sin = tensor(ops, c, &[3, d / 2])?;
    let y = ops.rope(&x, &cos, &sin)?;
    ops.rope_backward(&y, &cos, &sin)?;
    Ok(())
}

fn matmul(ops: &Ops, t: DType) -> Result<(), OpError> {
    // Both operands' rows aligned, neither, and each one alone (a pipelined fetch of one
    // operand by `cp.async` and of the other element by element).
    for (m, k, n) in [
        (64usize, 64usize, 64usize),
        (33, 7, 5),
        (33, 64, 5),
        (33, 7, 64),
    ] {
        let a = tensor(ops, t, &[m, k])?;
        let b = tensor(ops, t, &[k, n])?;
        ops.matmul(&a, &b)?;
    }
    if matches!(t, DType::F16 | DType::BF16) {
        // The GEMM's other paths: transposed operands, a bias and an activation.
        let bias = tensor(ops, t, &[64])?;
        for (ta, tb) in [(false, true), (true, false), (true, true)] {
            let a = tensor(ops, t, &[64, 64])?;
            let b = tensor(ops, t, &[64, 64])?;
            let a = if ta { a.transpose(0, 1)? } else { a };
            let b = if tb { b.transpose(0, 1)? } else { b };
            ops.gemm(&a, &b, Some(&bias), super::gemm::Activation::GeluTanh)?;
        }
    }
    Ok(())
}

/// A `[rows, 64]` view of 16-bit elements whose rows are `align` bytes apart in
/// multiples (a row stride of 64, 68, 66 or 65 elements: 16-, 8-, 4- or 2-byte aligned
/// rows).
fn rows_aligned(ops: &Ops, t: DType, rows: usize, align: u32) -> Result<Tensor, OpError> {
    let stride = match align {
        16 => 64,
        8 => 68,
        4 => 66,
        _ => 65,
    };
    Ok(tensor(ops, t, &[rows, stride])?.narrow(1, 0, 64)?)
}

/// The GEMM over operands of each alignment class (each candidate list: 16-byte rows,
/// 8- or 4-byte rows, 2-byte rows) in every orientation (TRANS_A, TRANS_B), with the
/// plain epilogue, a bias and GELU, and the pre-activation beside them; and with a c
/// whose rows are not 16-byte aligned. Quick: a and b of (16, 16), (8, 16) and
/// (16, 2) bytes, c 16-byte aligned and once 2-byte; Full: every pair of classes, c in
/// each.
fn gemm_alignments(ops: &Ops, t: DType, coverage: Coverage) -> Result<(), OpError> {
    use super::gemm::Activation as A;
    let classes: &[(u32, u32)] = match coverage {
        Coverage::Quick => &[(16, 16), (8, 16), (16, 2)],
        Coverage::Full => &[
            (16, 16),
            (16, 8),
            (16, 4),
            (16, 2),
            (8, 16),
            (8, 8),
            (8, 4),
            (8, 2),
            (4, 16),
            (4, 8),
            (4, 4),
            (4, 2),
            (2, 16),
            (2, 8),
            (2, 4),
            (2, 2),
        ],
    };
    let c_classes: &[u32] = match coverage {
        Coverage::Quick => &[16],
        Coverage::Full => &[16, 8, 4, 2],
    };
    let bias = tensor(ops, t, &[64])?;
    for &(ta, tb) in &[(false, false), (true, false), (false, true), (true, true)] {
        for &(aa, ab) in classes {
            // 64 x 64 operands: transposed ones are the transpose of their storage.
            let a = rows_aligned(ops, t, 64, aa)?;
            let b = rows_aligned(ops, t, 64, ab)?;
            let a = if ta { a.transpose(0, 1)? } else { a };
            let b = if tb { b.transpose(0, 1)? } else { b };
            for &ca in c_classes {
                let c = rows_aligned(ops, t, 64, ca)?;
                let z = rows_aligned(ops, t, 64, ca)?;
                ops.gemm_into(&a, &b, None, A::None, &c)?;
                ops.gemm_into(&a, &b, Some(&bias), A::GeluTanh, &c)?;
                ops.gemm_impl("gemm", &a, &b, Some(&bias), A::GeluTanh, &c, Some(&z))?;
            }
        }
    }
    // A linear layer's output whose rows are 2-byte aligned (an odd N) over aligned
    // operands.
    let x = rows_aligned(ops, t, 64, 16)?;
    let w = rows_aligned(ops, t, 7, 16)?;
    let y = tensor(ops, t, &[64, 7])?;
    let z = tensor(ops, t, &[64, 7])?;
    let b7 = tensor(ops, t, &[7])?;
    ops.linear_into(&x, &w, Some(&b7), A::GeluTanh, &y)?;
    ops.linear_with_preact_into(&x, &w, Some(&b7), A::GeluTanh, &y, &z)?;
    Ok(())
}

/// Linear layers: the forward with the saved pre-activation (the GEMM's PREACT
/// epilogue: GELU with a bias, the heaviest, and SiLU without) on rows 16-byte and
/// 2-byte aligned; the backward for every activation, with and without the bias
/// gradient, over rows of 1 and 4097 and widths that reach every `linear_bwd` tile
/// (BLOCK 8 to 512) in every alignment class, and its GEMMs (dx = dz @ w; dw = dz.T @ x
/// reading dz transposed, odd widths included).
fn linear(ops: &Ops, t: DType) -> Result<(), OpError> {
    use super::gemm::Activation as A;
    let half = matches!(t, DType::F16 | DType::BF16);
    if half {
        for k in [64usize, 63] {
            let x = tensor(ops, t, &[33, k])?;
            let w = tensor(ops, t, &[40, k])?;
            let b = tensor(ops, t, &[40])?;
            ops.linear_with_preact(&x, &w, Some(&b), A::GeluTanh)?;
            ops.linear_with_preact(&x, &w, None, A::Silu)?;
        }
    }
    for n in [1usize, 7, 100, 1000, 4097] {
        for m in [1usize, 4097] {
            let k = 24;
            let x = tensor(ops, t, &[m, k])?;
            let w = tensor(ops, t, &[n, k])?;
            let dy = tensor(ops, t, &[m, n])?;
            for act in [A::None, A::Relu, A::GeluTanh, A::Silu] {
                for db in [false, true] {
                    let z = (act != A::None).then_some(&dy);
                    ops.linear_backward(&dy, &x, &w, z, act, db)?;
                }
            }
        }
    }
    Ok(())
}

/// Attention forward and backward for every head dimension, mask, layout (`[B, H, S, D]`
/// storage and a permuted `[B, S, H, D]` one), plain and grouped heads (GROUP 1 and 2),
/// with lse rows 16-byte aligned (S = 64) and 4-byte aligned (S = 7; Full: also 8-byte,
/// S = 6).
fn attention(ops: &Ops, t: DType, coverage: Coverage) -> Result<(), OpError> {
    let seqs: &[usize] = match coverage {
        Coverage::Quick => &[64, 7],
        Coverage::Full => &[64, 7, 6],
    };
    let b = 2;
    for &d in &super::attention::ATTENTION_HEAD_DIMS {
        for (h, hkv) in [(2usize, 2usize), (4, 2)] {
            for bshd in [false, true] {
                for &s in seqs {
                    let make = |heads: usize| -> Result<Tensor, OpError> {
                        Ok(if bshd {
                            tensor(ops, t, &[b, s, heads, d])?.permute(&[0, 2, 1, 3])?
                        } else {
                            tensor(ops, t, &[b, heads, s, d])?
                        })
                    };
                    let (q, k, v, dout) = (make(h)?, make(hkv)?, make(hkv)?, make(h)?);
                    for causal in [false, true] {
                        let (o, lse) = ops.attention(&q, &k, &v, causal, None)?;
                        ops.attention_backward(&q, &k, &v, &o, &lse, &dout, causal, None)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// AdamW (one group and two, amsgrad, capturable) with parameters of dtype `t` and
/// every state dtype, and the gradient statistics and clipping, default launches.
fn optimizer(ops: &Ops, t: DType) -> Result<(), OpError> {
    for s in FLOATS {
        for (groups, amsgrad) in [(1usize, false), (2, true), (2, false)] {
            let groups: Vec<ParamGroup> = (0..groups)
                .map(|i| {
                    let mut g = ParamGroup::new(1e-3);
                    g.amsgrad = amsgrad && i == 0;
                    g.shapes = vec![vec![33, 7], vec![100]];
                    g
                })
                .collect();
            for capturable in [false, true] {
                let mut opt =
                    AdamW::with_launch(ops, t, s, groups.clone(), AdamWLaunch::default())?;
                opt.set_capturable(ops, capturable)?;
                opt.step(ops)?;
            }
        }
    }
    let g = tensor(ops, t, &[5000])?;
    let stats = GradStats::new(ops, GradStatsLaunch::default())?;
    stats.compute(ops, &g, 1.0)?;
    stats.clip_(ops, &g, 1.0)?;
    Ok(())
}

/// Newton–Schulz on inputs of dtype `t` (wide, tall and square; rows 16-byte aligned and
/// of the dtype's own alignment; a transposed view) into outputs of each orientation,
/// and Muon's step over parameters of dtype `t` (Nesterov on and off; wide, tall and
/// odd-width matrices).
fn muon(ops: &Ops, t: DType) -> Result<(), OpError> {
    use super::newton_schulz::QUINTIC;
    use crate::optim::{Muon, MuonGroup};
    for (r, c) in [(40usize, 64usize), (64, 40), (40, 63), (63, 40), (64, 64)] {
        let x = tensor(ops, t, &[2, r, c])?;
        ops.newton_schulz(&x, 2, &[QUINTIC])?;
        let y = tensor(ops, t, &[c, r])?.transpose(0, 1)?;
        ops.newton_schulz_into(&x.select(0, 0)?, &y, 1, &[QUINTIC])?;
    }
    for nesterov in [true, false] {
        let g = MuonGroup {
            nesterov,
            shapes: vec![[40, 64], [64, 40], [33, 7]],
            ..MuonGroup::new(0.02)
        };
        Muon::new(ops, t, vec![g])?.step(ops)?;
    }
    Ok(())
}
