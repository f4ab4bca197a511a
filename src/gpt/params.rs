//! The GPT's parameters: f32 master copies inside the optimizer ([`MuonWithAdamW`]: Muon
//! on the hidden matrices, AdamW on the embedding and the norm weights) and bf16 working
//! copies laid out exactly like the optimizer's flat buffers, so that one cast launch per
//! flat buffer refreshes the working weights before a step and one more moves the bf16
//! gradients into the optimizer's f32 gradient buffer after it.
//!
//! Layout. Muon's one param group registers, per layer, `q, k, v, o` (`[d, d]`), `gate,
//! up` (`[f, d]`) and `down` (`[d, f]`), torch's `[out, in]` shapes. Muon stores the
//! matrices of one stored shape contiguously in registration order, so a layer's q, k, v
//! are one `[3d, d]` matrix (one GEMM makes `[q | k | v]`) and its gate and up one
//! `[2f, d]` matrix (`[gate | up]`, what `swiglu_concat` takes), while Muon still
//! orthogonalizes each of the seven matrices on its own. [`Params::new`] checks that
//! adjacency and fails with a typed error if the optimizer's layout ever changes. AdamW's
//! group 0 is the embedding `[256, d]` (tied with the output head), group 1 the `2L + 1`
//! RMSNorm weights `[d]` (before each attention and MLP, and the final one).

use super::data::{write_npy_f32, SplitMix};
use super::kernels::{cast_into, VOCAB};
use super::{GptConfig, GptError};
use crate::ops::{shape_err, OpError, Ops};
use crate::optim::{MuonGroup, MuonWithAdamW, ParamGroup};
use kgen_core::host::HostTensor;
use kgen_core::types::DType;
use kgen_runtime::Tensor;
use std::path::Path;

/// Muon matrices per layer, in registration order.
const PER_LAYER: usize = 7;

/// One layer's matrices (torch's `[out, in]` layout).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `[q; k; v]`, `[3d, d]`.
    pub qkv: Tensor,
    /// The attention's output projection, `[d, d]`.
    pub o: Tensor,
    /// `[gate; up]`, `[2f, d]`.
    pub fc: Tensor,
    /// The MLP's down projection, `[d, f]`.
    pub down: Tensor,
}

/// Every parameter, as views of one pair of flat buffers (the f32 masters, the bf16
/// working copies or the bf16 gradients).
#[derive(Clone, Debug)]
pub struct Weights {
    /// The token embedding and output head, `[256, d]`.
    pub emb: Tensor,
    /// RMSNorm weights `[d]`: `2l` before layer l's attention, `2l + 1` before its MLP,
    /// `2L` the final norm.
    pub norms: Vec<Tensor>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// Every tensor with a stable name (the twin's file names).
    pub fn named(&self) -> Vec<(String, &Tensor)> {
        let mut v = vec![("emb".to_string(), &self.emb)];
        for (k, n) in self.norms.iter().enumerate() {
            v.push((format!("norm{k}"), n));
        }
        for (l, w) in self.layers.iter().enumerate() {
            v.push((format!("l{l}.qkv"), &w.qkv));
            v.push((format!("l{l}.o"), &w.o));
            v.push((format!("l{l}.fc"), &w.fc));
            v.push((format!("l{l}.down"), &w.down));
        }
        v
    }
}

/// Where each parameter sits in the two flat buffers: (offset, shape) per Weights field.
#[derive(Clone, Debug)]
struct Slots {
    emb: usize,
    norms: Vec<usize>,
    /// (qkv, o, fc, down) offsets per layer.
    layers: Vec<[usize; 4]>,
}

/// The optimizer, the bf16 working copies and the views of all three.
pub struct Params {
    pub opt: MuonWithAdamW,
    /// bf16 copies of (Muon's, AdamW's) flat parameter buffers.
    p16: [Tensor; 2],
    /// bf16 gradients laid out like (Muon's, AdamW's) flat gradient buffers.
    g16: [Tensor; 2],
    /// f32 master views.
    pub master: Weights,
    /// bf16 working views (what the forward reads).
    pub w: Weights,
    /// bf16 gradient views (what the backward writes).
    pub g: Weights,
    cfg: GptConfig,
}

impl Params {
    /// The optimizer and buffers, parameters zero (see [`Params::init`]).
    pub fn new(ops: &Ops, cfg: &GptConfig) -> Result<Params, GptError> {
        let (d, f, l) = (cfg.d_model, cfg.hidden, cfg.layers);
        let mut shapes = Vec::with_capacity(PER_LAYER * l);
        for _ in 0..l {
            shapes.extend([[d, d], [d, d], [d, d], [d, d], [f, d], [f, d], [d, f]]);
        }
        let muon = MuonGroup {
            shapes,
            weight_decay: cfg.muon_weight_decay,
            ..MuonGroup::new(cfg.muon_lr)
        };
        let adam = |shapes: Vec<Vec<usize>>| ParamGroup {
            shapes,
            weight_decay: 0.0,
            betas: (0.9, 0.95),
            ..ParamGroup::new(cfg.lr)
        };
        let groups = vec![adam(vec![vec![VOCAB, d]]), adam(vec![vec![d]; 2 * l + 1])];
        let opt = MuonWithAdamW::new(ops, DType::F32, vec![muon], groups)?;

        let mp = |j: usize| opt.muon.param(0, j).map(|t| t.offset());
        let mut layers = Vec::with_capacity(l);
        for i in 0..l {
            let j = PER_LAYER * i;
            let (q, k, v, o) = (mp(j)?, mp(j + 1)?, mp(j + 2)?, mp(j + 3)?);
            let (gate, up, down) = (mp(j + 4)?, mp(j + 5)?, mp(j + 6)?);
            if k != q + d * d || v != k + d * d || up != gate + f * d {
                return Err(GptError::Op(shape_err(
                    "gpt",
                    "Muon no longer stores a layer's q, k, v (and gate, up) contiguously: \
                     the fused [3d, d] and [2f, d] views need that",
                )));
            }
            layers.push([q, o, gate, down]);
        }
        let slots = Slots {
            emb: opt.adamw.param(0, 0).offset(),
            norms: (0..2 * l + 1)
                .map(|k| opt.adamw.param(1, k).offset())
                .collect(),
            layers,
        };
        let (mflat, aflat) = (opt.muon.params_flat(), opt.adamw.params_flat());
        let p16 = [
            ops.zeros(DType::BF16, mflat.shape())?,
            ops.zeros(DType::BF16, aflat.shape())?,
        ];
        let g16 = [
            ops.zeros(DType::BF16, mflat.shape())?,
            ops.zeros(DType::BF16, aflat.shape())?,
        ];
        let master = views(cfg, &slots, mflat, aflat)?;
        let w = views(cfg, &slots, &p16[0], &p16[1])?;
        let g = views(cfg, &slots, &g16[0], &g16[1])?;
        Ok(Params {
            opt,
            p16,
            g16,
            master,
            w,
            g,
            cfg: cfg.clone(),
        })
    }

    /// Number of parameters (the embedding counted once).
    pub fn count(&self) -> usize {
        self.master.named().iter().map(|(_, t)| t.numel()).sum()
    }

    /// Writes the initial values into the f32 masters: the embedding N(0, 0.02); q, k, v,
    /// gate and up N(0, 1/fan_in); o and down the same divided by sqrt(2L) (GPT-2's
    /// scaling of the residual projections); the norm weights 1.
    pub fn init(&self, seed: u64) -> Result<(), GptError> {
        let mut rng = SplitMix::new(seed);
        let l = self.cfg.layers as f64;
        let mut fill = |t: &Tensor, std: f64| -> Result<(), GptError> {
            let v: Vec<f64> = (0..t.numel()).map(|_| rng.normal() * std).collect();
            Ok(t.copy_from_host(&HostTensor::from_f64(DType::F32, t.shape(), &v))?)
        };
        fill(&self.master.emb, 0.02)?;
        for w in &self.master.layers {
            let fan = |t: &Tensor| 1.0 / (t.shape()[1] as f64).sqrt();
            fill(&w.qkv, fan(&w.qkv))?;
            fill(&w.o, fan(&w.o) / (2.0 * l).sqrt())?;
            fill(&w.fc, fan(&w.fc))?;
            fill(&w.down, fan(&w.down) / (2.0 * l).sqrt())?;
        }
        for n in &self.master.norms {
            n.copy_from_host(&HostTensor::from_f64(
                DType::F32,
                n.shape(),
                &vec![1.0; n.numel()],
            ))?;
        }
        Ok(())
    }

    /// The bf16 working copies from the f32 masters (two launches).
    pub fn refresh_working(&self, ops: &Ops) -> Result<(), OpError> {
        cast_into(ops, self.opt.muon.params_flat(), &self.p16[0])?;
        cast_into(ops, self.opt.adamw.params_flat(), &self.p16[1])
    }

    /// The bf16 gradients into the optimizers' f32 gradient buffers (two launches).
    pub fn grads_to_master(&self, ops: &Ops) -> Result<(), OpError> {
        cast_into(ops, &self.g16[0], self.opt.muon.grads_flat())?;
        cast_into(ops, &self.g16[1], self.opt.adamw.grads_flat())
    }

    /// `clip_grad_norm_(1.0)` over AdamW's gradients (Muon normalizes its own updates),
    /// then one step of both optimizers.
    pub fn step(&mut self, ops: &Ops) -> Result<(), OpError> {
        self.opt.adamw.clip_grad_norm_(ops, 1.0)?;
        self.opt.step(ops)
    }

    /// Every group's learning rate: the configured one times `scale`.
    pub fn set_lr_scale(&mut self, scale: f64) -> Result<(), OpError> {
        self.opt.muon.set_lr(0, self.cfg.muon_lr * scale)?;
        for g in 0..2 {
            self.opt.adamw.set_lr(g, self.cfg.lr * scale)?;
        }
        Ok(())
    }

    /// Writes every f32 master tensor as `<dir>/<name>.npy` (torch's layouts).
    pub fn dump(&self, dir: &Path) -> Result<(), GptError> {
        for (name, t) in self.master.named() {
            let v: Vec<f32> = t.to_f64_vec()?.iter().map(|&x| x as f32).collect();
            write_npy_f32(&dir.join(format!("{name}.npy")), t.shape(), &v)?;
        }
        Ok(())
    }
}

/// The [`Weights`] views of two flat buffers laid out like the optimizer's.
fn views(
    cfg: &GptConfig,
    slots: &Slots,
    muon: &Tensor,
    adam: &Tensor,
) -> Result<Weights, GptError> {
    let (d, f) = (cfg.d_model, cfg.hidden);
    let at = |flat: &Tensor, off: usize, shape: &[usize]| -> Result<Tensor, GptError> {
        let n = shape.iter().product();
        Ok(flat.narrow(0, off, n)?.reshape(shape)?)
    };
    let layers = slots
        .layers
        .iter()
        .map(|&[qkv, o, fc, down]| {
            Ok(LayerWeights {
                qkv: at(muon, qkv, &[3 * d, d])?,
                o: at(muon, o, &[d, d])?,
                fc: at(muon, fc, &[2 * f, d])?,
                down: at(muon, down, &[d, f])?,
            })
        })
        .collect::<Result<Vec<_>, GptError>>()?;
    Ok(Weights {
        emb: at(adam, slots.emb, &[VOCAB, d])?,
        norms: slots
            .norms
            .iter()
            .map(|&o| at(adam, o, &[d]))
            .collect::<Result<Vec<_>, GptError>>()?,
        layers,
    })
}
