//! A float64 reference of scaled-dot-product attention, forward (o, lse) and backward
//! (dq, dk, dv), as torch's `F.scaled_dot_product_attention(q, k, v, is_causal=causal,
//! scale=scale, enable_gqa=True)` computes it in f64 and autograd differentiates it: the
//! reference the op's checks (`crate::checks::ops::attention`) compare against. Written
//! from the definition (scores, softmax, weighted sum; the gradients by the chain rule),
//! independently of the kernels' FlashAttention algebra; its backward is checked against
//! finite differences of its forward below.
//!
//! Tensors are row-major: q, o, dout, dq `[B, H, S_q, D]`, k, v, dk, dv `[B, Hkv, S_k, D]`
//! (query head h reads K/V head `h / (H / Hkv)`), lse `[B, H, S_q]`. Causal masking is
//! top-left aligned: query i sees keys j ≤ i.

/// The sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: usize,
    /// Query heads H.
    pub heads: usize,
    /// K/V heads Hkv (divides H).
    pub kv_heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
}

impl AttnShape {
    /// Elements of q (and o, dout, dq).
    pub fn q_len(&self) -> usize {
        self.batch * self.heads * self.seq_q * self.head_dim
    }

    /// Elements of k (and v, dk, dv).
    pub fn kv_len(&self) -> usize {
        self.batch * self.kv_heads * self.seq_k * self.head_dim
    }

    /// Offset of row `i` of query head `h` of batch `b` in q.
    fn q_row(&self, b: usize, h: usize, i: usize) -> usize {
        ((b * self.heads + h) * self.seq_q + i) * self.head_dim
    }

    /// Offset of row `j` of the K/V head that query head `h` reads.
    fn kv_row(&self, b: usize, h: usize, j: usize) -> usize {
        let g = self.heads / self.kv_heads;
        ((b * self.kv_heads + h / g) * self.seq_k + j) * self.head_dim
    }

    /// Keys query `i` sees: `0..n`.
    fn visible(&self, i: usize, causal: bool) -> usize {
        if causal {
            (i + 1).min(self.seq_k)
        } else {
            self.seq_k
        }
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The softmax row of query `i` of head `(b, h)`: `(p over the visible keys, lse)`.
fn probs(
    q: &[f64],
    k: &[f64],
    s: &AttnShape,
    (b, h, i): (usize, usize, usize),
    causal: bool,
    scale: f64,
) -> (Vec<f64>, f64) {
    let d = s.head_dim;
    let qr = &q[s.q_row(b, h, i)..][..d];
    let scores: Vec<f64> = (0..s.visible(i, causal))
        .map(|j| scale * dot(qr, &k[s.kv_row(b, h, j)..][..d]))
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = scores.iter().map(|x| (x - m).exp()).sum();
    let p = scores.iter().map(|x| (x - m).exp() / sum).collect();
    (p, m + sum.ln())
}

/// The forward: `(o, lse)`.
pub fn forward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    s: &AttnShape,
    causal: bool,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let d = s.head_dim;
    let mut o = vec![0.0; s.q_len()];
    let mut lse = vec![0.0; s.batch * s.heads * s.seq_q];
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.seq_q {
                let (p, l) = probs(q, k, s, (b, h, i), causal, scale);
                lse[(b * s.heads + h) * s.seq_q + i] = l;
                let orow = &mut o[s.q_row(b, h, i)..][..d];
                for (j, pj) in p.iter().enumerate() {
                    let vr = &v[s.kv_row(b, h, j)..][..d];
                    for (x, y) in orow.iter_mut().zip(vr) {
                        *x += pj * y;
                    }
                }
            }
        }
    }
    (o, lse)
}

/// The backward of [`forward`] given the output gradient `dout`: `(dq, dk, dv)` (the K/V
/// gradients summed over the query heads of each group). With `P = softmax(scale·QKᵀ)`:
/// `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP - rowsum(dP ∘ P))`, `dQ = scale·dS K`,
/// `dK = scale·dSᵀ Q` (`rowsum(dP ∘ P) = rowsum(dO ∘ O)`, the kernels' delta).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
    s: &AttnShape,
    causal: bool,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = s.head_dim;
    let mut dq = vec![0.0; s.q_len()];
    let mut dk = vec![0.0; s.kv_len()];
    let mut dv = vec![0.0; s.kv_len()];
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.seq_q {
                let (p, _) = probs(q, k, s, (b, h, i), causal, scale);
                let qi = s.q_row(b, h, i);
                let dor = &dout[qi..][..d];
                let dp: Vec<f64> = (0..p.len())
                    .map(|j| dot(dor, &v[s.kv_row(b, h, j)..][..d]))
                    .collect();
                let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (j, (pj, dpj)) in p.iter().zip(&dp).enumerate() {
                    let kj = s.kv_row(b, h, j);
                    let ds = pj * (dpj - delta);
                    for t in 0..d {
                        dv[kj + t] += pj * dor[t];
                        dq[qi + t] += scale * ds * k[kj + t];
                        dk[kj + t] += scale * ds * q[qi + t];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::Rng;

    fn random(rng: &mut Rng, n: usize) -> Vec<f64> {
        (0..n).map(|_| rng.normalish()).collect()
    }

    /// `L = Σ dout ∘ o`, whose gradients are what [`backward`] returns.
    fn loss(q: &[f64], k: &[f64], v: &[f64], dout: &[f64], s: &AttnShape, c: bool) -> f64 {
        dot(&forward(q, k, v, s, c, 0.7).0, dout)
    }

    /// The backward matches central finite differences of the forward, for every element
    /// of q, k and v, with GQA (2 query heads on 1 K/V head), causal and not, S_q = S_k
    /// and S_q ≠ S_k.
    #[test]
    fn backward_matches_finite_differences() {
        for (sq, sk) in [(5, 5), (3, 6), (6, 3)] {
            for causal in [false, true] {
                let s = AttnShape {
                    batch: 1,
                    heads: 2,
                    kv_heads: 1,
                    seq_q: sq,
                    seq_k: sk,
                    head_dim: 4,
                };
                let mut rng = Rng::new(5 + sq as u64 * 3 + sk as u64);
                let (q, k, v) = (
                    random(&mut rng, s.q_len()),
                    random(&mut rng, s.kv_len()),
                    random(&mut rng, s.kv_len()),
                );
                let dout = random(&mut rng, s.q_len());
                let (dq, dk, dv) = backward(&q, &k, &v, &dout, &s, causal, 0.7);
                let eps = 1e-5;
                let mut worst = 0.0f64;
                for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
                    for idx in 0..grad.len() {
                        let at = |delta: f64| {
                            let (mut q2, mut k2, mut v2) = (q.clone(), k.clone(), v.clone());
                            [&mut q2, &mut k2, &mut v2][which][idx] += delta;
                            loss(&q2, &k2, &v2, &dout, &s, causal)
                        };
                        let fd = (at(eps) - at(-eps)) / (2.0 * eps);
                        let err = (fd - grad[idx]).abs() / grad[idx].abs().max(1.0);
                        assert!(
                            err < 1e-7,
                            "{sq}x{sk} causal={causal} tensor {which} element {idx}: \
                             backward {} vs finite difference {fd}",
                            grad[idx]
                        );
                        worst = worst.max(err);
                    }
                }
                assert!(worst > 0.0, "no gradient was compared");
            }
        }
    }

    /// Identities: one key gives o = v (the softmax is 1), lse = the one scaled score,
    /// dq = dk = 0 and dv = the summed dout of the group's query heads; under causal
    /// masking the first query sees key 0 alone and the last (S_q = S_k) every key; the
    /// probabilities sum to one (v ≡ 1 gives o ≡ 1).
    #[test]
    fn known_identities() {
        let mut rng = Rng::new(11);
        let s = AttnShape {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            seq_q: 3,
            seq_k: 1,
            head_dim: 8,
        };
        let (q, k, v) = (
            random(&mut rng, s.q_len()),
            random(&mut rng, s.kv_len()),
            random(&mut rng, s.kv_len()),
        );
        let dout = random(&mut rng, s.q_len());
        for causal in [false, true] {
            let (o, lse) = forward(&q, &k, &v, &s, causal, 0.3);
            let (dq, dk, dv) = backward(&q, &k, &v, &dout, &s, causal, 0.3);
            assert!(dq.iter().chain(&dk).all(|x| x.abs() < 1e-12));
            for b in 0..2 {
                for h in 0..4 {
                    for i in 0..3 {
                        let (qi, kj) = (s.q_row(b, h, i), s.kv_row(b, h, 0));
                        assert_eq!(&o[qi..qi + 8], &v[kj..kj + 8]);
                        let want = 0.3 * dot(&q[qi..qi + 8], &k[kj..kj + 8]);
                        assert!((lse[(b * 4 + h) * 3 + i] - want).abs() < 1e-12);
                    }
                }
                for hk in 0..2 {
                    for t in 0..8 {
                        let want: f64 = (0..2)
                            .flat_map(|g| (0..3).map(move |i| (2 * hk + g, i)))
                            .map(|(h, i)| dout[s.q_row(b, h, i) + t])
                            .sum();
                        let got = dv[(b * 2 + hk) * 8 + t];
                        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
                    }
                }
            }
        }
        // Causal, S_q = S_k = 4: query 0 sees key 0 alone; the last sees every key, as
        // without the mask.
        let s4 = AttnShape {
            seq_q: 4,
            seq_k: 4,
            ..s
        };
        let (q, k, v) = (
            random(&mut rng, s4.q_len()),
            random(&mut rng, s4.kv_len()),
            random(&mut rng, s4.kv_len()),
        );
        let (oc, _) = forward(&q, &k, &v, &s4, true, 0.5);
        let (of, _) = forward(&q, &k, &v, &s4, false, 0.5);
        for b in 0..2 {
            for h in 0..4 {
                let (q0, q3, k0) = (s4.q_row(b, h, 0), s4.q_row(b, h, 3), s4.kv_row(b, h, 0));
                assert_eq!(&oc[q0..q0 + 8], &v[k0..k0 + 8]);
                for t in 0..8 {
                    assert!((oc[q3 + t] - of[q3 + t]).abs() < 1e-12);
                }
            }
        }
        // Probabilities sum to one: o of v ≡ 1 is 1.
        let ones = vec![1.0; s4.kv_len()];
        let (o1, _) = forward(&q, &k, &ones, &s4, false, 0.5);
        assert!(o1.iter().all(|x| (x - 1.0).abs() < 1e-12));
    }
}
