//! The GPT on the interpreter: the tiny configuration learns, and the hand-written
//! backward agrees with finite differences of an independent float64 model.

use super::data::{Batches, Corpus};
use super::model::{backward, forward, Acts, GradBufs, Model};
use super::params::{Params, Weights};
use super::*;
use crate::ops::Ops;
use kgen_runtime::{Device, Tensor};

/// Real text for the tests, compiled in (no file system, the same on every machine).
fn text() -> Vec<u8> {
    let mut t = include_str!("../../README.md").as_bytes().to_vec();
    t.extend_from_slice(include_str!("../../docs/ARCHITECTURE.md").as_bytes());
    t
}

/// The tiny configuration learns: the training loss falls by far in a few steps and
/// the validation loss falls too (the main job's CI form, shortened).
#[test]
fn tiny_gpt_loss_falls_on_the_interpreter() {
    let cfg = GptConfig {
        steps: 12,
        eval_every: 12,
        eval_batches: 1,
        samples: 0,
        ..GptConfig::tiny()
    };
    let corpus = Corpus::from_bytes(&text(), "test");
    let t = std::time::Instant::now();
    let r = train(
        &Device::interpreter(),
        &cfg,
        &corpus,
        &RunOptions::default(),
        |_| {},
    )
    .unwrap();
    eprintln!(
        "tiny GPT, {} steps on the interpreter: {:.1} s, losses {:?}, validation {:?}",
        cfg.steps,
        t.elapsed().as_secs_f64(),
        r.step_losses,
        r.val_losses
    );
    let first = r.step_losses[0];
    let last3 = r.step_losses[cfg.steps - 3..].iter().sum::<f64>() / 3.0;
    assert!(first.is_finite() && last3.is_finite());
    assert!((first - 256f64.ln()).abs() < 0.3, "initial loss {first}");
    assert!(last3 < first - 0.8, "loss {first} -> {last3}");
    let (v0, v1) = (r.val_losses[0].1, r.val_losses[1].1);
    assert!(v1 < v0 - 0.5, "validation loss {v0} -> {v1}");
}

/// A host float64 copy of a [`Weights`].
struct HostWeights {
    emb: Vec<f64>,
    norms: Vec<Vec<f64>>,
    /// (qkv, o, fc, down) per layer.
    layers: Vec<[Vec<f64>; 4]>,
}

impl HostWeights {
    fn read(w: &Weights) -> HostWeights {
        let r = |t: &Tensor| t.to_f64_vec().unwrap();
        HostWeights {
            emb: r(&w.emb),
            norms: w.norms.iter().map(r).collect(),
            layers: w
                .layers
                .iter()
                .map(|l| [r(&l.qkv), r(&l.o), r(&l.fc), r(&l.down)])
                .collect(),
        }
    }

    /// The tensor `k` of [`Weights::named`]'s order.
    fn tensor_mut(&mut self, k: usize) -> &mut Vec<f64> {
        let nn = self.norms.len();
        match k {
            0 => &mut self.emb,
            k if k <= nn => &mut self.norms[k - 1],
            k => &mut self.layers[(k - 1 - nn) / 4][(k - 1 - nn) % 4],
        }
    }
}

/// `y[r, :] = x[r, :] @ w.T` (x `[rows, k]`, w `[n, k]`).
fn lin(x: &[f64], w: &[f64], k: usize) -> Vec<f64> {
    let n = w.len() / k;
    let mut y = Vec::with_capacity(x.len() / k * n);
    for xr in x.chunks_exact(k) {
        for wr in w.chunks_exact(k) {
            y.push(xr.iter().zip(wr).map(|(a, b)| a * b).sum());
        }
    }
    y
}

fn rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let d = w.len();
    let mut y = Vec::with_capacity(x.len());
    for r in x.chunks_exact(d) {
        let rstd = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
        y.extend(r.iter().zip(w).map(|(v, wi)| v * rstd * wi));
    }
    y
}

/// The model's mean loss in float64, from its definition (module docs), independent of
/// the ops.
fn reference_loss(cfg: &GptConfig, w: &HostWeights, x: &[i32], y: &[i32]) -> f64 {
    let (d, f, h, hd, s) = (cfg.d_model, cfg.hidden, cfg.heads, cfg.head_dim(), cfg.seq);
    let n = x.len();
    let eps = cfg.eps as f64;
    let mut st: Vec<f64> = x
        .iter()
        .flat_map(|&t| w.emb[t as usize * d..(t as usize + 1) * d].to_vec())
        .collect();
    let mut yk = rmsnorm(&st, &w.norms[0], eps);
    for (l, [wqkv, wo, wfc, wdown]) in w.layers.iter().enumerate() {
        let mut qkv = lin(&yk, wqkv, d);
        // RoPE (rotate-half) on q and k of every head, position = index in the sequence.
        for t in 0..n {
            let p = (t % s) as f64;
            for part in 0..2 {
                for head in 0..h {
                    let base = t * 3 * d + part * d + head * hd;
                    for i in 0..hd / 2 {
                        let a = p * cfg.rope_base.powf(-((2 * i) as f64) / hd as f64);
                        let (x1, x2) = (qkv[base + i], qkv[base + i + hd / 2]);
                        qkv[base + i] = x1 * a.cos() - x2 * a.sin();
                        qkv[base + i + hd / 2] = x2 * a.cos() + x1 * a.sin();
                    }
                }
            }
        }
        // Causal attention per sequence and head.
        let scale = 1.0 / (hd as f64).sqrt();
        let mut o = vec![0.0; n * d];
        for b in 0..n / s {
            for head in 0..h {
                let at = |t: usize, part: usize| (b * s + t) * 3 * d + part * d + head * hd;
                for i in 0..s {
                    let sc: Vec<f64> = (0..=i)
                        .map(|j| {
                            (0..hd)
                                .map(|e| qkv[at(i, 0) + e] * qkv[at(j, 1) + e])
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = sc.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        for c in 0..hd {
                            o[(b * s + i) * d + head * hd + c] += ej / z * qkv[at(j, 2) + c];
                        }
                    }
                }
            }
        }
        for (sv, ov) in st.iter_mut().zip(lin(&o, wo, d)) {
            *sv += ov;
        }
        yk = rmsnorm(&st, &w.norms[2 * l + 1], eps);
        let u = lin(&yk, wfc, d);
        let a: Vec<f64> = u
            .chunks_exact(2 * f)
            .flat_map(|r| (0..f).map(move |c| r[c] / (1.0 + (-r[c]).exp()) * r[f + c]))
            .collect();
        for (sv, mv) in st.iter_mut().zip(lin(&a, wdown, f)) {
            *sv += mv;
        }
        yk = rmsnorm(&st, &w.norms[2 * l + 2], eps);
    }
    let logits = lin(&yk, &w.emb, d);
    let mut loss = 0.0;
    for (row, &t) in logits.chunks_exact(256).zip(y) {
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        loss += lse - row[t as usize];
    }
    loss / n as f64
}

/// The backward through the whole model against central differences of the float64
/// reference: for every parameter tensor (the tied embedding, every norm weight, every
/// matrix of both layers, the fused ones block by block: q, k, v, gate, up), its 3
/// largest gradient entries and 3 random ones. The
/// kgen gradients come from bf16 activations and bf16 gradients (the attention op is
/// bf16/f16 only), the reference is exact, so the tolerance is bf16's: the worst entry
/// within 5% of the tensor's largest checked gradient (measured: at most 2.1%), and the loss within 1%.
#[test]
fn gpt_gradients_match_finite_differences_of_a_float64_model() {
    let cfg = GptConfig {
        d_model: 128,
        heads: 2,
        layers: 2,
        hidden: 96,
        seq: 12,
        batch: 2,
        ..GptConfig::tiny()
    };
    cfg.validate().unwrap();
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let model = Model::new(&d, &cfg).unwrap();
    let p = Params::new(&ops, &cfg).unwrap();
    p.init(7).unwrap();
    let corpus = Corpus::from_bytes(&text(), "test");
    let batch = Batches::new(&corpus.train, cfg.batch, cfg.seq, 3).next_batch();
    let acts = Acts::new(&ops, &cfg, cfg.batch, cfg.seq).unwrap();
    let g = GradBufs::new(&ops, &cfg, cfg.batch, cfg.seq).unwrap();
    acts.upload(&ops, &batch.x, &batch.y).unwrap();
    p.refresh_working(&ops).unwrap();
    forward(&ops, &model, &p.w, &acts, true).unwrap();
    backward(&ops, &model, &p.w, &p.g, &acts, &g).unwrap();
    let kgen_loss = acts.loss.to_f64_vec().unwrap()[0];

    // The reference sees exactly the bf16 weights the kgen forward used.
    let mut hw = HostWeights::read(&p.w);
    let ref_loss = reference_loss(&cfg, &hw, &batch.x, &batch.y);
    assert!(
        (kgen_loss - ref_loss).abs() < 0.01 * ref_loss,
        "loss: kgen {kgen_loss}, float64 {ref_loss}"
    );
    let mut rng = data::SplitMix::new(11);
    let h = 1e-4;
    let (dm, f) = (cfg.d_model, cfg.hidden);
    let mut report = Vec::new();
    for (k, (name, gt)) in p.g.named().into_iter().enumerate() {
        let gk = gt.to_f64_vec().unwrap();
        // The fused matrices block by block (q, k, v; gate, up): each its own check.
        let blocks: Vec<(String, std::ops::Range<usize>)> = if name.ends_with(".qkv") {
            ["q", "k", "v"]
                .iter()
                .enumerate()
                .map(|(i, b)| (format!("{name}:{b}"), i * dm * dm..(i + 1) * dm * dm))
                .collect()
        } else if name.ends_with(".fc") {
            ["gate", "up"]
                .iter()
                .enumerate()
                .map(|(i, b)| (format!("{name}:{b}"), i * f * dm..(i + 1) * f * dm))
                .collect()
        } else {
            vec![(name.clone(), 0..gk.len())]
        };
        for (bname, range) in blocks {
            let mut idx: Vec<usize> = range.clone().collect();
            idx.sort_by(|&a, &b| gk[b].abs().total_cmp(&gk[a].abs()));
            let mut pick: Vec<usize> = idx[..3].to_vec();
            pick.extend((0..3).map(|_| range.start + rng.below(range.len())));
            let (mut worst, mut scale) = (0.0f64, 0.0f64);
            for &i in &pick {
                let v = hw.tensor_mut(k)[i];
                hw.tensor_mut(k)[i] = v + h;
                let up = reference_loss(&cfg, &hw, &batch.x, &batch.y);
                hw.tensor_mut(k)[i] = v - h;
                let down = reference_loss(&cfg, &hw, &batch.x, &batch.y);
                hw.tensor_mut(k)[i] = v;
                let fd = (up - down) / (2.0 * h);
                worst = worst.max((fd - gk[i]).abs());
                scale = scale.max(fd.abs());
            }
            report.push((bname, worst, scale));
        }
    }
    let text: Vec<String> = report
        .iter()
        .map(|(n, w, s)| format!("{n}: {:.3}", w / s))
        .collect();
    eprintln!(
        "loss kgen {kgen_loss:.5} float64 {ref_loss:.5}; worst gradient error / largest, per \
         tensor: {}",
        text.join(", ")
    );
    for (name, worst, scale) in report {
        assert!(scale > 0.0, "{name}: no gradient");
        assert!(
            worst <= 0.05 * scale,
            "{name}: |kgen - finite difference| up to {worst:.3e}, largest gradient {scale:.3e}"
        );
    }
}
