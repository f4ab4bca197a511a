//! The GPT's forward and backward passes, by hand, with the op library (module docs of
//! [`crate::gpt`]: the model, the dtypes, the embedding and RoPE arrangements).
//!
//! Streams: `s_0` is the embedding output; `s_k = s_(k-1) + out_(k-1)` for k = 1..=2L,
//! where `out_(2l)` is layer l's attention output and `out_(2l+1)` its MLP output. Norm k
//! reads `s_k` (`y_k = rmsnorm(s_k) * w_k`): norms `2l` and `2l + 1` feed layer l's
//! attention and MLP, norm `2L` the head. Every norm after the first is `add_rmsnorm`
//! (the residual add fused in), and its backward `add_rmsnorm_backward` adds the
//! gradient arriving along the residual stream, so the backward never needs an add.

use super::kernels::{onehot_into, VOCAB};
use super::params::Weights;
use super::{GptConfig, GptError};
use crate::ops::gemm::Activation;
use crate::ops::{OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{Device, Tensor};

/// The `ignore_index` passed to the cross-entropy (no target is ever ignored).
const IGNORE: i64 = -100;
/// Largest upload of one `upload_async` (the runtime's pinned slots hold 16 KiB).
const UPLOAD_CHUNK: usize = 4096;

/// The model's shapes and its RoPE tables.
pub struct Model {
    pub cfg: GptConfig,
    /// `[3 * seq, head_dim / 2]` f32: rows `3p` and `3p + 1` hold position p's angles
    /// (for q and k), rows `3p + 2` cos 1 / sin 0 (v passes unrotated).
    cos3: Tensor,
    sin3: Tensor,
}

impl Model {
    pub fn new(device: &Device, cfg: &GptConfig) -> Result<Model, GptError> {
        let (s, hd) = (cfg.seq, cfg.head_dim());
        let half = hd / 2;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..s {
            for part in 0..3 {
                for i in 0..half {
                    let a = if part < 2 {
                        p as f64 * cfg.rope_base.powf(-((2 * i) as f64) / hd as f64)
                    } else {
                        0.0
                    };
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        Ok(Model {
            cfg: cfg.clone(),
            cos3: device.from_f64(DType::F32, &[3 * s, half], &cos)?,
            sin3: device.from_f64(DType::F32, &[3 * s, half], &sin)?,
        })
    }
}

/// One layer's saved activations.
struct LayerActs {
    /// `[N, 3d]`: q and k after RoPE, v (rotated by angle 0: unchanged).
    qkv_r: Tensor,
    /// The attention output before its projection, `[N, d]` (`[B, S, H, Dh]` storage).
    o: Tensor,
    /// `[B, H, S]` f32.
    lse: Tensor,
    /// `[gate | up]`, `[N, 2f]`.
    u: Tensor,
    /// `silu(gate) * up`, `[N, f]`.
    a: Tensor,
}

/// The activations of one batch shape `[B, S]` (N = B·S tokens), allocated once.
pub struct Acts {
    pub b: usize,
    pub s: usize,
    /// i32 `[2, N]`: the input bytes, then the targets.
    pub io: Tensor,
    /// bf16 `[2N, 256]`: rows `0..N` the logits' gradient, rows `N..2N` the inputs'
    /// one-hot rows.
    ab: Tensor,
    /// bf16 `[2N, d]`: rows `0..N` the final norm's output (the head's input), rows
    /// `N..2N` the gradient of the embedding output. `ab[.., :]ᵀ @ hb` is the tied
    /// embedding's whole gradient in one GEMM.
    hb: Tensor,
    /// Streams `s_0 .. s_2L`, `[N, d]`.
    streams: Vec<Tensor>,
    /// Norm outputs `y_0 .. y_(2L-1)` (`y_2L` is `hb`'s first half).
    ys: Vec<Tensor>,
    /// f32 `[N]` per norm.
    rstd: Vec<Tensor>,
    layers: Vec<LayerActs>,
    /// Scratch: the projections before RoPE `[N, 3d]`, a sublayer's output `[N, d]`.
    qkv: Tensor,
    out: Tensor,
    /// `[N, 256]`.
    pub logits: Tensor,
    /// f32 `[1]`: the mean loss.
    pub loss: Tensor,
    row_loss: Tensor,
    stats: Tensor,
}

/// The backward's scratch for one batch shape.
pub struct GradBufs {
    /// Two `[N, d]` stream gradients (ping-pong).
    ds: [Tensor; 2],
    /// A norm output's gradient, `[N, d]`.
    dy: Tensor,
    /// The attention output's gradient, `[N, d]`.
    dout: Tensor,
    dqkv_r: Tensor,
    dqkv: Tensor,
    da: Tensor,
    du: Tensor,
}

impl Acts {
    pub fn new(ops: &Ops, cfg: &GptConfig, b: usize, s: usize) -> Result<Acts, OpError> {
        let (n, d, f, l) = (b * s, cfg.d_model, cfg.hidden, cfg.layers);
        let bf = |shape: &[usize]| ops.empty(DType::BF16, shape);
        let hb = bf(&[2 * n, d])?;
        let layers = (0..l)
            .map(|_| {
                Ok(LayerActs {
                    qkv_r: bf(&[n, 3 * d])?,
                    o: bf(&[n, d])?,
                    lse: ops.empty(DType::F32, &[b, cfg.heads, s])?,
                    u: bf(&[n, 2 * f])?,
                    a: bf(&[n, f])?,
                })
            })
            .collect::<Result<Vec<_>, OpError>>()?;
        Ok(Acts {
            b,
            s,
            io: ops.zeros(DType::I32, &[2, n])?,
            ab: bf(&[2 * n, VOCAB])?,
            streams: (0..=2 * l).map(|_| bf(&[n, d])).collect::<Result<_, _>>()?,
            ys: (0..2 * l).map(|_| bf(&[n, d])).collect::<Result<_, _>>()?,
            rstd: (0..=2 * l)
                .map(|_| ops.empty(DType::F32, &[n]))
                .collect::<Result<_, _>>()?,
            hb,
            layers,
            qkv: bf(&[n, 3 * d])?,
            out: bf(&[n, d])?,
            logits: bf(&[n, VOCAB])?,
            loss: ops.zeros(DType::F32, &[1])?,
            row_loss: ops.empty(DType::F32, &[n])?,
            stats: ops.empty(DType::F32, &[2])?,
        })
    }

    fn n(&self) -> usize {
        self.b * self.s
    }

    /// Queues the batch's bytes and targets (each `[N]`) for upload on `ops`' stream,
    /// without synchronizing the host (pinned staging, 16 KiB at a time).
    pub fn upload(&self, ops: &Ops, x: &[i32], y: &[i32]) -> Result<(), OpError> {
        let n = self.n();
        for (row, v) in [x, y].into_iter().enumerate() {
            if v.len() != n {
                return Err(crate::ops::shape_err(
                    "gpt",
                    format!("{} tokens for a batch of {n}", v.len()),
                ));
            }
            let dst = self.io.select(0, row)?;
            for (c, chunk) in v.chunks(UPLOAD_CHUNK).enumerate() {
                let bytes: Vec<u8> = chunk.iter().flat_map(|t| t.to_le_bytes()).collect();
                let part = dst.narrow(0, c * UPLOAD_CHUNK, chunk.len())?;
                ops.stream().upload_async(&part, &bytes)?;
            }
        }
        Ok(())
    }

    /// The final norm's output `[N, d]`.
    fn hf(&self) -> Result<Tensor, OpError> {
        Ok(self.hb.narrow(0, 0, self.n())?)
    }

    /// Norm k's output.
    fn y(&self, k: usize) -> Result<Tensor, OpError> {
        match self.ys.get(k) {
            Some(y) => Ok(y.clone()),
            None => self.hf(),
        }
    }
}

impl GradBufs {
    pub fn new(ops: &Ops, cfg: &GptConfig, b: usize, s: usize) -> Result<GradBufs, OpError> {
        let (n, d, f) = (b * s, cfg.d_model, cfg.hidden);
        let bf = |shape: &[usize]| ops.empty(DType::BF16, shape);
        Ok(GradBufs {
            ds: [bf(&[n, d])?, bf(&[n, d])?],
            dy: bf(&[n, d])?,
            dout: bf(&[n, d])?,
            dqkv_r: bf(&[n, 3 * d])?,
            dqkv: bf(&[n, 3 * d])?,
            da: bf(&[n, f])?,
            du: bf(&[n, 2 * f])?,
        })
    }
}

/// `[B, H, S, Dh]` view of part `part` of `t` (`[N, parts * H * Dh]`, rows of `[B, S]`):
/// `[B, S, H, Dh]` storage, the layout the attention op takes as a permuted view.
fn heads(
    t: &Tensor,
    acts: &Acts,
    cfg: &GptConfig,
    parts: usize,
    part: usize,
) -> Result<Tensor, OpError> {
    let (h, hd) = (cfg.heads, cfg.head_dim());
    Ok(t.view(&[acts.b, acts.s, parts, h, hd])?
        .select(2, part)?
        .permute(&[0, 2, 1, 3])?)
}

/// `t` (`[N, 3d]`) as RoPE's `[B, 3S, H, Dh]`: each token's q, k, v are three
/// consecutive "positions" `3p, 3p + 1, 3p + 2` of the tables.
fn rope_view(t: &Tensor, acts: &Acts, cfg: &GptConfig) -> Result<Tensor, OpError> {
    Ok(t.view(&[acts.b, 3 * acts.s, cfg.heads, cfg.head_dim()])?)
}

/// The forward pass over the batch in `acts.io`: every activation the backward reads,
/// the logits, and (`with_loss`) the mean cross-entropy in `acts.loss` with its gradient
/// in `acts.ab`'s first half.
pub fn forward(
    ops: &Ops,
    model: &Model,
    w: &Weights,
    acts: &Acts,
    with_loss: bool,
) -> Result<(), OpError> {
    let cfg = &model.cfg;
    let n = acts.n();
    let none = Activation::None;
    // The embedding: one-hot rows times the table (each output is one table entry).
    let onehot = acts.ab.narrow(0, n, n)?;
    onehot_into(ops, &acts.io.select(0, 0)?, &onehot)?;
    ops.matmul_into(&onehot, &w.emb, &acts.streams[0])?;
    ops.rmsnorm_into(
        &acts.streams[0],
        &w.norms[0],
        &acts.ys[0],
        &acts.rstd[0],
        cfg.eps,
    )?;
    for (i, (lw, la)) in w.layers.iter().zip(&acts.layers).enumerate() {
        let (ka, km) = (2 * i, 2 * i + 1);
        // Attention.
        ops.linear_into(&acts.ys[ka], &lw.qkv, None, none, &acts.qkv)?;
        ops.rope_into(
            &rope_view(&acts.qkv, acts, cfg)?,
            &model.cos3,
            &model.sin3,
            &rope_view(&la.qkv_r, acts, cfg)?,
        )?;
        attention(ops, cfg, acts, la)?;
        ops.linear_into(&la.o, &lw.o, None, none, &acts.out)?;
        ops.add_rmsnorm_into(
            &acts.out,
            &acts.streams[ka],
            &w.norms[km],
            &acts.streams[km],
            &acts.ys[km],
            &acts.rstd[km],
            cfg.eps,
        )?;
        // MLP.
        ops.linear_into(&acts.ys[km], &lw.fc, None, none, &la.u)?;
        ops.swiglu_concat_into(&la.u, &la.a)?;
        ops.linear_into(&la.a, &lw.down, None, none, &acts.out)?;
        ops.add_rmsnorm_into(
            &acts.out,
            &acts.streams[km],
            &w.norms[km + 1],
            &acts.streams[km + 1],
            &acts.y(km + 1)?,
            &acts.rstd[km + 1],
            cfg.eps,
        )?;
    }
    // The tied head.
    ops.linear_into(&acts.hf()?, &w.emb, None, none, &acts.logits)?;
    if with_loss {
        ops.cross_entropy_into(
            &acts.logits,
            &acts.io.select(0, 1)?,
            IGNORE,
            &acts.loss,
            &acts.ab.narrow(0, 0, n)?,
            &acts.row_loss,
            &acts.stats,
        )?;
    }
    Ok(())
}

/// Causal attention of layer `la` (the one call site of the forward op).
fn attention(ops: &Ops, cfg: &GptConfig, acts: &Acts, la: &LayerActs) -> Result<(), OpError> {
    let q = heads(&la.qkv_r, acts, cfg, 3, 0)?;
    let k = heads(&la.qkv_r, acts, cfg, 3, 1)?;
    let v = heads(&la.qkv_r, acts, cfg, 3, 2)?;
    let o = heads(&la.o, acts, cfg, 1, 0)?;
    ops.attention_into(&q, &k, &v, true, None, &o, &la.lse)
}

/// Its backward (the one call site of the backward op): dq, dk, dv into `g.dqkv_r`.
fn attention_backward(
    ops: &Ops,
    cfg: &GptConfig,
    acts: &Acts,
    la: &LayerActs,
    g: &GradBufs,
) -> Result<(), OpError> {
    let part = |t: &Tensor, parts: usize, p: usize| heads(t, acts, cfg, parts, p);
    ops.attention_backward_into(
        &part(&la.qkv_r, 3, 0)?,
        &part(&la.qkv_r, 3, 1)?,
        &part(&la.qkv_r, 3, 2)?,
        &part(&la.o, 1, 0)?,
        &la.lse,
        &part(&g.dout, 1, 0)?,
        true,
        None,
        &part(&g.dqkv_r, 3, 0)?,
        &part(&g.dqkv_r, 3, 1)?,
        &part(&g.dqkv_r, 3, 2)?,
    )
}

/// The backward pass after [`forward`] (with the loss): every parameter's gradient
/// into `grads` (bf16 views; each written exactly once, so nothing needs zeroing).
pub fn backward(
    ops: &Ops,
    model: &Model,
    w: &Weights,
    grads: &Weights,
    acts: &Acts,
    g: &GradBufs,
) -> Result<(), OpError> {
    let cfg = &model.cfg;
    let (n, l) = (acts.n(), cfg.layers);
    let none = Activation::None;
    let dlogits = acts.ab.narrow(0, 0, n)?;
    let dx0 = acts.hb.narrow(0, n, n)?;
    // The head's input gradient; the head's weight gradient joins the embedding's below.
    ops.matmul_into(&dlogits, &w.emb, &g.dy)?;
    let top = 2 * l;
    let mut cur = 0;
    ops.rmsnorm_backward_into(
        &acts.streams[top],
        &w.norms[top],
        &acts.rstd[top],
        &g.dy,
        &g.ds[cur],
        &grads.norms[top],
    )?;
    for i in (0..l).rev() {
        let (lw, lg, la) = (&w.layers[i], &grads.layers[i], &acts.layers[i]);
        let (ka, km) = (2 * i, 2 * i + 1);
        // MLP: g.ds[cur] is d s_(km+1), the gradient of its output.
        ops.linear_backward_into(
            &g.ds[cur], &la.a, &lw.down, None, none, &g.da, &lg.down, None,
        )?;
        ops.swiglu_concat_backward_into(&la.u, &g.da, &g.du)?;
        ops.linear_backward_into(&g.du, &acts.ys[km], &lw.fc, None, none, &g.dy, &lg.fc, None)?;
        ops.add_rmsnorm_backward_into(
            &acts.streams[km],
            &w.norms[km],
            &acts.rstd[km],
            &g.dy,
            &g.ds[cur],
            &g.ds[1 - cur],
            &grads.norms[km],
        )?;
        cur = 1 - cur;
        // Attention: g.ds[cur] is d s_km.
        ops.linear_backward_into(&g.ds[cur], &la.o, &lw.o, None, none, &g.dout, &lg.o, None)?;
        attention_backward(ops, cfg, acts, la, g)?;
        ops.rope_backward_into(
            &rope_view(&g.dqkv_r, acts, cfg)?,
            &model.cos3,
            &model.sin3,
            &rope_view(&g.dqkv, acts, cfg)?,
        )?;
        ops.linear_backward_into(
            &g.dqkv,
            &acts.ys[ka],
            &lw.qkv,
            None,
            none,
            &g.dy,
            &lg.qkv,
            None,
        )?;
        let into = if i == 0 { &dx0 } else { &g.ds[1 - cur] };
        ops.add_rmsnorm_backward_into(
            &acts.streams[ka],
            &w.norms[ka],
            &acts.rstd[ka],
            &g.dy,
            &g.ds[cur],
            into,
            &grads.norms[ka],
        )?;
        cur = 1 - cur;
    }
    // The tied embedding: [dlogits; onehot]ᵀ @ [hf; dx0] = dlogitsᵀ hf (the head) +
    // onehotᵀ dx0 (the lookup), one GEMM with K = 2N, f32 accumulation, no atomics.
    ops.matmul_into(&acts.ab.transpose(0, 1)?, &acts.hb, &grads.emb)
}
