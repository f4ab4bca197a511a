//! A float64 port of `torch.optim.Muon` (torch 2.9+, `torch/optim/_muon.py`): the
//! Newton–Schulz orthogonalization `_zeropower_via_newtonschulz`, the learning-rate
//! adjustment `_adjust_lr` and the per-parameter step `_single_tensor_muon`; plus
//! [`singular_values_f64`], a small Jacobi SVD the tests use to measure how orthogonal a
//! result is. Written from torch's Python source, independently of any kernel; it is the
//! reference the Muon kernels (issue 24) are checked against.
//!
//! What torch's source says (read from two stored versions of pytorch/pytorch's
//! `torch/optim/_muon.py`, commits b5ee4d7 and 098e03f):
//! - Defaults: `lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
//!   ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None`
//!   (None means "original"). Only 2-D parameters are accepted; `ns_steps >= 100` and a
//!   coefficient tuple that is not exactly 3 values are errors.
//! - `_zeropower_via_newtonschulz(grad, (a, b, c), ns_steps, eps)`:
//!   `X = grad.bfloat16()`; if `rows > cols`, `X = X.T`;
//!   `X.div_(X.norm().clamp(min=eps))` (Frobenius norm, a bf16 scalar); then `ns_steps`
//!   times `A = X @ X.T; B = addmm(A, A, A, beta=b, alpha=c); X = addmm(X, B, X, beta=a)`,
//!   i.e. `B = b*A + c*A@A`, `X = a*X + B@X`; transpose back. b5ee4d7 always uses `addmm`;
//!   098e03f has a `use_addmm` flag (default False) whose eager path writes
//!   `b * A + c * A @ A` and `a * X + B @ X`, rounding each temporary to bf16.
//! - `_adjust_lr(lr, fn, (A, B))`: "original"/None → `lr * sqrt(max(1, A / B))`;
//!   "match_rms_adamw" → `lr * 0.2 * sqrt(max(A, B))`.
//! - `_single_tensor_muon`, per parameter: `buf.lerp_(grad, 1 - momentum)`;
//!   `update = grad.lerp(buf, momentum) if nesterov else buf`; `update = NS(update)`;
//!   `adjusted_lr = _adjust_lr(lr, adjust_lr_fn, param.shape)`;
//!   `param.mul_(1 - lr * weight_decay)` (the unadjusted lr);
//!   `param.add_(update, alpha=-adjusted_lr)`. The momentum buffer starts at zeros.
//!
//! Departures, all deliberate:
//! - Torch takes one `(a, b, c)` for every step. [`ns_schedule`] also accepts one triple per
//!   step (as in the Polar-Express-style schedules), which the kernels support.
//! - `round_bf16 = false` is pure f64 (torch always iterates in bf16). `round_bf16 = true`
//!   rounds (round-to-nearest-even) the input, the norm, `X` after normalization, `A`, `B`
//!   and each new `X` to bf16, with every product and sum in between exact (f64): the
//!   `addmm` path with f32 accumulation, up to the accumulation order. It does not model
//!   the extra roundings of the eager (`use_addmm=False`) path.
//! - `lerp` follows ATen's formula (`self + w*(end-self)` for `|w| < 0.5`, else
//!   `end - (end-self)*(1-w)`), here in f64.

/// How `_adjust_lr` scales the learning rate for a `[rows, cols]` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchAdjustLr {
    /// Keller Jordan's: `lr * sqrt(max(1, rows / cols))` (torch's default, `adjust_lr_fn=None`).
    Original,
    /// Moonshot's: `lr * 0.2 * sqrt(max(rows, cols))`.
    MatchRmsAdamW,
}

/// One group's hyperparameters, as `torch.optim.Muon` takes them.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchMuonHyper {
    pub lr: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub nesterov: bool,
    /// One triple for every step, or one per step (see [`ns_schedule`]).
    pub ns_coefficients: Vec<(f64, f64, f64)>,
    pub eps: f64,
    pub ns_steps: usize,
    pub adjust_lr: TorchAdjustLr,
}

impl Default for TorchMuonHyper {
    /// torch's defaults.
    fn default() -> TorchMuonHyper {
        TorchMuonHyper {
            lr: 1e-3,
            weight_decay: 0.1,
            momentum: 0.95,
            nesterov: true,
            ns_coefficients: vec![TORCH_NS_COEFFICIENTS],
            eps: 1e-7,
            ns_steps: 5,
            adjust_lr: TorchAdjustLr::Original,
        }
    }
}

/// torch's (and Keller Jordan's) quintic coefficients `(a, b, c)`.
pub const TORCH_NS_COEFFICIENTS: (f64, f64, f64) = (3.4445, -4.775, 2.0315);

/// The per-step coefficients: `coeffs[0]` repeated `steps` times when there is one triple,
/// `coeffs` itself when there is one per step, `None` otherwise (the caller reports it).
pub fn ns_schedule(coeffs: &[(f64, f64, f64)], steps: usize) -> Option<Vec<(f64, f64, f64)>> {
    if coeffs.len() == steps {
        Some(coeffs.to_vec())
    } else if coeffs.len() == 1 {
        Some(vec![coeffs[0]; steps])
    } else {
        None
    }
}

/// `_adjust_lr(lr, adjust_lr_fn, (rows, cols))`.
pub fn torch_adjust_lr(lr: f64, f: TorchAdjustLr, rows: usize, cols: usize) -> f64 {
    let (a, b) = (rows as f64, cols as f64);
    match f {
        TorchAdjustLr::Original => lr * (a / b).max(1.0).sqrt(),
        TorchAdjustLr::MatchRmsAdamW => lr * (0.2 * a.max(b).sqrt()),
    }
}

fn round(x: f64, bf16: bool) -> f64 {
    if bf16 {
        half::bf16::from_f64(x).to_f64()
    } else {
        x
    }
}

/// `[m, k] @ [k, n]`, row-major.
fn matmul(x: &[f64], y: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        let row = &mut out[i * n..(i + 1) * n];
        for (l, &xil) in x[i * k..(i + 1) * k].iter().enumerate() {
            for (o, &ylj) in row.iter_mut().zip(&y[l * n..(l + 1) * n]) {
                *o += xil * ylj;
            }
        }
    }
    out
}

/// `[m, k] @ [m, k]^T` (a Gram matrix), row-major.
fn matmul_nt(x: &[f64], m: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * m];
    for i in 0..m {
        for j in 0..m {
            let (xi, xj) = (&x[i * k..(i + 1) * k], &x[j * k..(j + 1) * k]);
            out[i * m + j] = xi.iter().zip(xj).map(|(p, q)| p * q).sum();
        }
    }
    out
}

fn transpose(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; x.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = x[i * cols + j];
        }
    }
    t
}

/// `_zeropower_via_newtonschulz` on a row-major `[rows, cols]` matrix, returned in the
/// same orientation. The coefficients go through [`ns_schedule`]; when it rejects them the
/// result is an empty `Vec` (as it is, validly, when `rows * cols == 0`), so callers
/// validate with [`ns_schedule`] first. See the module header for `round_bf16`.
pub fn newton_schulz_f64(
    x: &[f64],
    rows: usize,
    cols: usize,
    steps: usize,
    coeffs: &[(f64, f64, f64)],
    eps: f64,
    round_bf16: bool,
) -> Vec<f64> {
    assert_eq!(
        x.len(),
        rows * cols,
        "newton_schulz_f64: x is not [rows, cols]"
    );
    let Some(schedule) = ns_schedule(coeffs, steps) else {
        return Vec::new();
    };
    if rows * cols == 0 {
        return Vec::new();
    }
    let r = |v: f64| round(v, round_bf16);
    // ortho_grad = grad.bfloat16(); if rows > cols: ortho_grad = ortho_grad.T
    let tall = rows > cols;
    let (m, n) = if tall { (cols, rows) } else { (rows, cols) };
    let mut xs: Vec<f64> = x.iter().map(|&v| r(v)).collect();
    if tall {
        xs = transpose(&xs, rows, cols);
    }
    // ortho_grad.div_(ortho_grad.norm().clamp(min=eps))
    let norm = r(r(xs.iter().map(|v| v * v).sum::<f64>().sqrt()).max(eps));
    for v in xs.iter_mut() {
        *v = r(*v / norm);
    }
    for &(a, b, c) in &schedule {
        // A = X @ X.T; B = b*A + c*A@A; X = a*X + B@X
        let mut gram: Vec<f64> = matmul_nt(&xs, m, n);
        gram.iter_mut().for_each(|v| *v = r(*v));
        let gram2 = matmul(&gram, &gram, m, m, m);
        let upd: Vec<f64> = gram
            .iter()
            .zip(&gram2)
            .map(|(&g, &g2)| r(b * g + c * g2))
            .collect();
        let bx = matmul(&upd, &xs, m, m, n);
        xs = xs.iter().zip(&bx).map(|(&v, &w)| r(a * v + w)).collect();
    }
    if tall {
        transpose(&xs, cols, rows)
    } else {
        xs
    }
}

/// The singular values of a row-major `[rows, cols]` matrix, descending: the square roots
/// (clamped at 0) of the eigenvalues of the smaller Gram matrix, found by cyclic Jacobi.
/// Squaring the matrix costs half the digits of the smallest singular values (absolute
/// error about `1e-8 * largest`), plenty for the band checks here. Meant for up to a few
/// hundred rows or columns.
pub fn singular_values_f64(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    assert_eq!(
        x.len(),
        rows * cols,
        "singular_values_f64: x is not [rows, cols]"
    );
    let (m, mut a) = if rows <= cols {
        (rows, matmul_nt(x, rows, cols))
    } else {
        (cols, matmul_nt(&transpose(x, rows, cols), cols, rows))
    };
    for _sweep in 0..100 {
        let off: f64 = (0..m)
            .flat_map(|i| (0..m).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * m + j] * a[i * m + j])
            .sum();
        let diag: f64 = (0..m).map(|i| a[i * m + i] * a[i * m + i]).sum();
        if off <= 1e-30 * diag || off == 0.0 {
            break;
        }
        for p in 0..m {
            for q in p + 1..m {
                let apq = a[p * m + q];
                if apq == 0.0 {
                    continue;
                }
                // The rotation that zeroes a[p][q] (Numerical Recipes' `jacobi`).
                let theta = (a[q * m + q] - a[p * m + p]) / (2.0 * apq);
                let t = if theta.abs() > 1e150 {
                    0.5 / theta
                } else {
                    theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt())
                };
                let cs = 1.0 / (t * t + 1.0).sqrt();
                let sn = t * cs;
                for k in 0..m {
                    let (akp, akq) = (a[k * m + p], a[k * m + q]);
                    a[k * m + p] = cs * akp - sn * akq;
                    a[k * m + q] = sn * akp + cs * akq;
                }
                for k in 0..m {
                    let (apk, aqk) = (a[p * m + k], a[q * m + k]);
                    a[p * m + k] = cs * apk - sn * aqk;
                    a[q * m + k] = sn * apk + cs * aqk;
                }
            }
        }
    }
    let mut s: Vec<f64> = (0..m).map(|i| a[i * m + i].max(0.0).sqrt()).collect();
    s.sort_by(|u, v| v.total_cmp(u));
    s
}

/// ATen's `lerp(start, end, w)`.
fn lerp(start: f64, end: f64, w: f64) -> f64 {
    if w.abs() < 0.5 {
        start + w * (end - start)
    } else {
        end - (end - start) * (1.0 - w)
    }
}

/// One `_single_tensor_muon` step for one `[rows, cols]` parameter, in place. `buf` is
/// `state["momentum_buffer"]` (zeros before the first step). `round_bf16` goes to the
/// Newton–Schulz iteration ([`newton_schulz_f64`]). Panics if `h.ns_coefficients` does not
/// fit `h.ns_steps` ([`ns_schedule`]) or a slice is not `rows * cols` long: both are bugs
/// in the calling test.
pub fn torch_muon_step(
    h: &TorchMuonHyper,
    p: &mut [f64],
    grad: &[f64],
    buf: &mut [f64],
    rows: usize,
    cols: usize,
    round_bf16: bool,
) {
    let n = rows * cols;
    assert!(
        p.len() == n && grad.len() == n && buf.len() == n,
        "torch_muon_step: shapes"
    );
    assert!(
        ns_schedule(&h.ns_coefficients, h.ns_steps).is_some(),
        "torch_muon_step: {} coefficient triples for {} steps",
        h.ns_coefficients.len(),
        h.ns_steps
    );
    // buf.lerp_(grad, 1 - momentum)
    for (b, &g) in buf.iter_mut().zip(grad) {
        *b = lerp(*b, g, 1.0 - h.momentum);
    }
    // update = grad.lerp(buf, momentum) if nesterov else buf
    let update: Vec<f64> = if h.nesterov {
        grad.iter()
            .zip(buf.iter())
            .map(|(&g, &b)| lerp(g, b, h.momentum))
            .collect()
    } else {
        buf.to_vec()
    };
    let update = newton_schulz_f64(
        &update,
        rows,
        cols,
        h.ns_steps,
        &h.ns_coefficients,
        h.eps,
        round_bf16,
    );
    let adjusted_lr = torch_adjust_lr(h.lr, h.adjust_lr, rows, cols);
    let decay = 1.0 - h.lr * h.weight_decay;
    for (pi, &u) in p.iter_mut().zip(&update) {
        // param.mul_(1 - lr * weight_decay); param.add_(update, alpha=-adjusted_lr)
        *pi *= decay;
        *pi += -adjusted_lr * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::rng::Rng;

    const C: &[(f64, f64, f64)] = &[TORCH_NS_COEFFICIENTS];

    fn random(tag: &str, n: usize) -> Vec<f64> {
        let mut rng = Rng::for_case(24, tag);
        (0..n).map(|_| rng.normalish()).collect()
    }

    fn max_abs_diff(x: &[f64], y: &[f64]) -> f64 {
        assert_eq!(x.len(), y.len());
        x.iter()
            .zip(y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    }

    /// The quintic applied `steps` times to a scalar.
    fn quintic(mut x: f64, steps: usize) -> f64 {
        let (a, b, c) = TORCH_NS_COEFFICIENTS;
        for _ in 0..steps {
            x = a * x + b * x * x * x + c * x * x * x * x * x;
        }
        x
    }

    #[test]
    fn singular_values_of_known_matrices() {
        // A diagonal (with a negative entry), padded to 3x5.
        let mut d = vec![0.0; 15];
        (d[0], d[6], d[12]) = (0.5, -3.0, 2.0);
        let s = singular_values_f64(&d, 3, 5);
        assert!(max_abs_diff(&s, &[3.0, 2.0, 0.5]) < 1e-12, "{s:?}");
        // A rotation times a diagonal, and its transpose.
        let (c, sn) = (0.3f64.cos(), 0.3f64.sin());
        let rd = [c * 4.0, -sn * 0.25, sn * 4.0, c * 0.25];
        assert!(max_abs_diff(&singular_values_f64(&rd, 2, 2), &[4.0, 0.25]) < 1e-12);
        // Rank 1: u v^T on 7x4 has one singular value |u| |v|, the others 0.
        let (u, v) = (random("sv-u", 7), random("sv-v", 4));
        let uv: Vec<f64> = u
            .iter()
            .flat_map(|&a| v.iter().map(move |&b| a * b))
            .collect();
        let norm = |w: &[f64]| w.iter().map(|x| x * x).sum::<f64>().sqrt();
        let s = singular_values_f64(&uv, 7, 4);
        assert_eq!(s.len(), 4);
        assert!((s[0] - norm(&u) * norm(&v)).abs() < 1e-12 * s[0]);
        assert!(s[1..].iter().all(|&x| x < 1e-6 * s[0]), "{s:?}");
        // A random 9x6: sum of squares is the squared Frobenius norm, and the transpose has
        // the same singular values.
        let x = random("sv-x", 54);
        let s = singular_values_f64(&x, 9, 6);
        let fro2: f64 = x.iter().map(|v| v * v).sum();
        assert!((s.iter().map(|v| v * v).sum::<f64>() - fro2).abs() < 1e-10 * fro2);
        assert!(max_abs_diff(&s, &singular_values_f64(&transpose(&x, 9, 6), 6, 9)) < 1e-12);
        assert!(s.windows(2).all(|w| w[0] >= w[1]));
    }

    #[test]
    fn schedule() {
        let (p, q) = ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0));
        assert_eq!(ns_schedule(&[p], 3), Some(vec![p; 3]));
        assert_eq!(ns_schedule(&[p, q], 2), Some(vec![p, q]));
        assert_eq!(ns_schedule(&[p, q], 3), None);
        assert_eq!(ns_schedule(&[], 2), None);
        assert_eq!(ns_schedule(&[], 0), Some(vec![]));
        assert!(newton_schulz_f64(&[1.0; 6], 2, 3, 3, &[p, q], 1e-7, false).is_empty());
    }

    /// The singular values of NS(X) are the quintic applied to those of X / ||X||_F
    /// (NS is an odd matrix polynomial: U S V^T -> U p(S) V^T). Returns NS(X)'s.
    fn check_against_scalar_map(tag: &str, rows: usize, cols: usize) -> Vec<f64> {
        let x = random(tag, rows * cols);
        let y = newton_schulz_f64(&x, rows, cols, 5, C, 1e-7, false);
        assert_eq!(y.len(), rows * cols);
        let fro = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut want: Vec<f64> = singular_values_f64(&x, rows, cols)
            .iter()
            .map(|s| quintic(s / fro, 5))
            .collect();
        want.sort_by(|u, v| v.total_cmp(u));
        let got = singular_values_f64(&y, rows, cols);
        assert!(
            max_abs_diff(&got, &want) < 1e-6,
            "{tag}: {}",
            max_abs_diff(&got, &want)
        );
        got
    }

    #[test]
    fn ns_f64_lands_in_the_quintic_band() {
        // Measured with this seed, singular values of NS(X) in [min, max]: 64x64
        // [0.6821, 1.1903] (X's smallest is 3.0e-3 of ||X||_F), 127x300 [0.6818, 1.1343],
        // 300x127 [0.6820, 1.1344]. The quintic does not converge to 1: its 5-step image
        // of [0.003, 1] is [0.6818, 1.2024], and values below ~1.5e-3 come out under 0.68.
        for (tag, rows, cols) in [
            ("ns-64", 64, 64),
            ("ns-127x300", 127, 300),
            ("ns-300x127", 300, 127),
        ] {
            let s = check_against_scalar_map(tag, rows, cols);
            let (hi, lo) = (s[0], s[s.len() - 1]);
            assert!(
                hi <= 1.25 && lo >= 0.6,
                "{tag}: singular values in [{lo}, {hi}]"
            );
        }
    }

    #[test]
    fn tall_is_the_transpose_of_wide() {
        let (rows, cols) = (7, 5);
        let x = random("tall", rows * cols);
        let xt = transpose(&x, rows, cols);
        for bf16 in [false, true] {
            let tall = newton_schulz_f64(&x, rows, cols, 5, C, 1e-7, bf16);
            let wide = newton_schulz_f64(&xt, cols, rows, 5, C, 1e-7, bf16);
            assert_eq!(tall, transpose(&wide, cols, rows));
        }
        // And 5x7 directly: an odd polynomial of X, so NS(-X) = -NS(X).
        let w = random("wide", 35);
        let neg: Vec<f64> = w.iter().map(|v| -v).collect();
        let (p, q) = (
            newton_schulz_f64(&w, 5, 7, 5, C, 1e-7, false),
            newton_schulz_f64(&neg, 5, 7, 5, C, 1e-7, false),
        );
        assert!(p.iter().zip(&q).all(|(a, b)| *a == -*b));
    }

    #[test]
    fn degenerate_shapes() {
        assert!(newton_schulz_f64(&[], 0, 4, 5, C, 1e-7, false).is_empty());
        assert!(newton_schulz_f64(&[], 4, 0, 5, C, 1e-7, true).is_empty());
        // 1x1: normalization gives sign(g) exactly, then the scalar quintic 5 times:
        // 1 -> 0.701 -> 1.11362 -> 0.72071 -> 1.08997 -> 0.6964364094697522.
        let want = 0.696_436_409_469_752_2;
        assert!((quintic(1.0, 5) - want).abs() < 1e-15);
        for g in [-0.37, 2.5e3] {
            let y = newton_schulz_f64(&[g], 1, 1, 5, C, 1e-7, false);
            assert!((y[0] - want * g.signum()).abs() < 1e-14, "{y:?}");
            // In bf16 the first step is already off: B = bf16(b + c) = -2.75 and
            // X = bf16(a - 2.75) = 0.6953125; five steps end on 0.6875.
            let y = newton_schulz_f64(&[g], 1, 1, 5, C, 1e-7, true);
            assert_eq!(y, vec![0.6875 * g.signum()]);
        }
        // Zero steps: only the normalization.
        let y = newton_schulz_f64(&[3.0, -4.0], 1, 2, 0, C, 1e-7, false);
        assert_eq!(y, vec![0.6, -0.8]);
        // All zeros: divided by eps, stays zero.
        assert_eq!(
            newton_schulz_f64(&[0.0; 6], 2, 3, 5, C, 1e-7, true),
            vec![0.0; 6]
        );
    }

    #[test]
    fn bf16_stays_near_f64() {
        // Measured with this seed: max |bf16 - f64| 0.0074 (64x64), 0.0033 (127x300),
        // 0.0038 (300x127), on entries of RMS 0.110, 0.050 and 0.050; the bf16 results'
        // singular values lie in [0.6797, 1.1928], [0.6797, 1.1351], [0.6802, 1.1365].
        for (tag, rows, cols) in [
            ("ns-64", 64, 64),
            ("ns-127x300", 127, 300),
            ("ns-300x127", 300, 127),
        ] {
            let x = random(tag, rows * cols);
            let f = newton_schulz_f64(&x, rows, cols, 5, C, 1e-7, false);
            let b = newton_schulz_f64(&x, rows, cols, 5, C, 1e-7, true);
            assert!(b.iter().all(|&v| v == round(v, true)));
            let d = max_abs_diff(&f, &b);
            assert!(d < 2e-2, "{tag}: max |bf16 - f64| = {d}");
            let s = singular_values_f64(&b, rows, cols);
            let (hi, lo) = (s[0], s[s.len() - 1]);
            assert!(
                hi <= 1.25 && lo >= 0.6,
                "{tag}: bf16 singular values in [{lo}, {hi}]"
            );
        }
    }

    #[test]
    fn adjust_lr_by_hand() {
        use TorchAdjustLr::*;
        assert_eq!(torch_adjust_lr(0.02, Original, 8, 2), 0.04);
        assert_eq!(torch_adjust_lr(0.02, Original, 2, 8), 0.02);
        assert_eq!(torch_adjust_lr(0.02, Original, 9, 9), 0.02);
        assert!(
            (torch_adjust_lr(0.02, MatchRmsAdamW, 2, 8) - 0.02 * 0.2 * 8f64.sqrt()).abs() < 1e-18
        );
        assert!((torch_adjust_lr(0.02, MatchRmsAdamW, 100, 3) - 0.04).abs() < 1e-17);
    }

    #[test]
    fn zero_grad_only_decays() {
        let h = TorchMuonHyper {
            lr: 0.02,
            weight_decay: 0.1,
            ..TorchMuonHyper::default()
        };
        let p0 = random("decay-p", 12);
        let mut p = p0.clone();
        let mut buf = vec![0.0; 12];
        torch_muon_step(&h, &mut p, &[0.0; 12], &mut buf, 3, 4, false);
        let decay = 1.0 - 0.02 * 0.1;
        assert!(p.iter().zip(&p0).all(|(a, b)| *a == b * decay));
        assert_eq!(buf, vec![0.0; 12]);
    }

    #[test]
    fn one_by_one_step() {
        // buf = (1 - m) g; nesterov update keeps g's sign; NS gives sign(g) * 0.69644; the
        // step is that times lr * sqrt(max(1, 1/1)) = lr (Original) or lr * 0.2 (MatchRms).
        let q = quintic(1.0, 5);
        for (adjust, scale) in [
            (TorchAdjustLr::Original, 1.0),
            (TorchAdjustLr::MatchRmsAdamW, 0.2),
        ] {
            let h = TorchMuonHyper {
                lr: 0.05,
                adjust_lr: adjust,
                ..TorchMuonHyper::default()
            };
            for (p0, g) in [(0.8, -1.7), (-0.3, 0.02)] {
                let (mut p, mut buf) = ([p0], [0.0]);
                torch_muon_step(&h, &mut p, &[g], &mut buf, 1, 1, false);
                let want = p0 * (1.0 - 0.05 * 0.1) - 0.05 * scale * q * f64::signum(g);
                assert!((p[0] - want).abs() < 1e-15, "{} vs {want}", p[0]);
                assert!((buf[0] - 0.05 * g).abs() < 1e-15);
            }
        }
    }

    #[test]
    fn step_matches_the_formulas() {
        // Two steps on an 8x2 parameter (Original adjusts lr by sqrt(8/2) = 2), with and
        // without nesterov, checked against the formulas written out by hand.
        let (rows, cols, n) = (8, 2, 16);
        let (g1, g2, p0) = (random("s-g1", n), random("s-g2", n), random("s-p", n));
        for nesterov in [true, false] {
            let h = TorchMuonHyper {
                lr: 0.01,
                weight_decay: 0.2,
                nesterov,
                ..TorchMuonHyper::default()
            };
            let m = h.momentum;
            let (mut p, mut buf) = (p0.clone(), vec![0.0; n]);
            torch_muon_step(&h, &mut p, &g1, &mut buf, rows, cols, false);
            torch_muon_step(&h, &mut p, &g2, &mut buf, rows, cols, false);
            let mut want = p0.clone();
            let mut b = vec![0.0; n];
            for g in [&g1, &g2] {
                b = b
                    .iter()
                    .zip(g.iter())
                    .map(|(bi, gi)| m * bi + (1.0 - m) * gi)
                    .collect();
                let u: Vec<f64> = if nesterov {
                    g.iter()
                        .zip(&b)
                        .map(|(gi, bi)| (1.0 - m) * gi + m * bi)
                        .collect()
                } else {
                    b.clone()
                };
                let o = newton_schulz_f64(&u, rows, cols, 5, C, 1e-7, false);
                for (w, oi) in want.iter_mut().zip(&o) {
                    *w = *w * (1.0 - 0.01 * 0.2) - 0.02 * oi;
                }
            }
            assert!(max_abs_diff(&buf, &b) < 1e-14);
            assert!(
                max_abs_diff(&p, &want) < 1e-12,
                "{}",
                max_abs_diff(&p, &want)
            );
        }
    }
}
