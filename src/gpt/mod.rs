//! The main job: a small GPT (nanoGPT-style decoder) trained on real text with kgen's own
//! kernels only, forward and backward by hand, on the GPU or the interpreter.
//!
//! # The model
//! Bytes in (vocabulary 256), bytes out. `x = embed(tokens)`; per layer, pre-norm
//! attention then a pre-norm SwiGLU MLP, each added to the residual stream:
//! ```text
//! h = rmsnorm(x) · w;  [q | k | v] = h Wqkvᵀ;  q, k = rope(q), rope(k)
//! x = x + causal_attention(q, k, v) Woᵀ                       (heads of dim 64 or 128)
//! h = rmsnorm(x) · w;  [g | u] = h Wfcᵀ;  x = x + (silu(g) · u) Wdownᵀ
//! ```
//! then a final RMSNorm and the head tied to the embedding (`logits = h Wembᵀ`), and the
//! mean cross-entropy against the next byte (`Ops::cross_entropy`: loss and gradient in
//! one fused pass). `model.rs` has the passes, `params.rs` the parameters' layout.
//!
//! # Dtypes: bf16 compute, f32 master weights
//! Every activation and every GEMM operand is bf16 (the tensor cores; the attention op
//! takes f16/bf16 only), with f32 accumulation and f32 statistics inside the ops. The
//! parameters live in f32 in the optimizers (Muon's momentum and AdamW's moments are f32
//! too); before each step one cast launch per flat buffer refreshes their bf16 working
//! copies, and after the backward one more moves the bf16 gradients into the optimizers'
//! f32 gradient buffers (torch's AMP arrangement: `kernels.rs` holds the cast).
//!
//! # The embedding without an embedding op
//! With 256 tokens the lookup is a GEMM: `x = onehot(tokens) @ Wemb`, with the bf16
//! one-hot rows `[N, 256]` built on the device (`kernels.rs`); each output is exactly one
//! table entry. The tied table's gradient is the head's `dlogitsᵀ @ h` plus the lookup's
//! `onehotᵀ @ dx`: the two sit in one `[2N, 256]` buffer (`[dlogits; onehot]`) and one
//! `[2N, d]` buffer (`[h; dx]`), so the whole gradient is one GEMM with K = 2N:
//! deterministic, f32 accumulation, no atomics, and no add kernel.
//!
//! # RoPE on the fused projection
//! `Ops::rope` takes a contiguous `[B, S, H, D]`. The fused projection's `[N, 3d]` output
//! is viewed as `[B, 3S, H, D]`: each token's q, k and v become three consecutive
//! "positions" `3p, 3p + 1, 3p + 2`, and the tables hold position p's angles in rows
//! `3p` and `3p + 1` and angle 0 (cos 1, sin 0) in row `3p + 2`, so v passes unchanged.
//! One launch rotates q and k of every head, and the backward (the inverse rotation)
//! leaves the whole `[N, 3d]` gradient contiguous for one `dqkv @ Wqkv` GEMM.
//!
//! # Optimizer and schedule
//! [`MuonWithAdamW`](crate::optim::MuonWithAdamW): Muon (Nesterov momentum 0.95,
//! Newton–Schulz on the tensor cores) on the 7 hidden matrices of each layer, AdamW
//! (betas 0.9, 0.95, no weight decay) on the embedding and the norm weights, with
//! `clip_grad_norm_(1.0)` over AdamW's gradients. The learning rates warm up linearly
//! over `warmup` steps, stay constant to 60% of the run and fall linearly to 10% at the
//! end ([`crate::train::lr_scale`]).
//!
//! # Data and output
//! `data.rs`: the Python standard library's sources by default (no download), or any
//! text file or folder; 5% held out for validation. [`train`] reports the loss, tokens/s
//! and the validation loss as it goes ([`Event`]) and ends by sampling continuations of
//! validation-text prompts (temperature sampling; each new byte recomputes the forward
//! over the whole context, batched over the prompts: simple and exact).

pub mod data;
pub mod kernels;
pub mod model;
pub mod params;
mod run;
#[cfg(test)]
mod tests;

pub use data::Corpus;
pub use run::{sample, train, Event, GptReport, RunOptions, Sample};

use crate::ops::OpError;

/// Everything that can stop the job.
#[derive(Debug, thiserror::Error)]
pub enum GptError {
    #[error(transparent)]
    Op(#[from] OpError),
    #[error("{0}")]
    Config(String),
    #[error("data: {0}")]
    Data(String),
    #[error("writing {0}")]
    Io(String),
}

impl From<kgen_runtime::RuntimeError> for GptError {
    fn from(e: kgen_runtime::RuntimeError) -> GptError {
        GptError::Op(OpError::Runtime(e))
    }
}

/// The model's sizes, the schedule and the output.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    pub d_model: usize,
    pub layers: usize,
    /// Attention heads; the head dimension `d_model / heads` must be 64 or 128.
    pub heads: usize,
    /// The SwiGLU MLP's hidden width f (`[gate | up]` is `2f` wide).
    pub hidden: usize,
    /// Context length (tokens per sequence).
    pub seq: usize,
    /// Sequences per step.
    pub batch: usize,
    pub steps: usize,
    /// Steps of the linear learning-rate warmup.
    pub warmup: usize,
    /// AdamW's learning rate (the embedding and the norm weights).
    pub lr: f64,
    /// Muon's learning rate (the hidden matrices; torch's "original" shape adjustment).
    pub muon_lr: f64,
    pub muon_weight_decay: f64,
    /// RMSNorm's epsilon.
    pub eps: f32,
    pub rope_base: f64,
    /// Print the training loss every this many steps (and at step 1 and the last).
    pub log_every: usize,
    /// The validation loss every this many steps (and before the first and after the
    /// last step), over `eval_batches` fixed batches.
    pub eval_every: usize,
    pub eval_batches: usize,
    pub seed: u64,
    /// Samples at the end: prompts of `prompt_len` bytes of validation text, each
    /// continued by `sample_len` bytes at `temperature` (0: greedy).
    pub samples: usize,
    pub prompt_len: usize,
    pub sample_len: usize,
    pub temperature: f64,
}

impl GptConfig {
    /// The GPU default: 6 layers of width 384 (6 heads of 64), SwiGLU hidden 1024,
    /// context 256, 64 sequences (16,384 tokens) per step; 10.7M parameters.
    pub fn gpu() -> GptConfig {
        GptConfig {
            d_model: 384,
            layers: 6,
            heads: 6,
            hidden: 1024,
            seq: 256,
            batch: 64,
            steps: 1000,
            warmup: 20,
            lr: 3e-3,
            muon_lr: 0.02,
            muon_weight_decay: 0.01,
            eps: 1e-5,
            rope_base: 10000.0,
            log_every: 50,
            eval_every: 250,
            eval_batches: 8,
            seed: 1,
            samples: 3,
            prompt_len: 64,
            sample_len: 240,
            temperature: 0.7,
        }
    }

    /// The interpreter's: one layer of width 64 (one head of 64), hidden 192, context
    /// 32, 4 sequences per step, 20 steps (about 25 s on 2 cores, most of it Muon's
    /// Newton–Schulz products, whose tiles are padded to 128 rows, so a slower CI host
    /// stays well under a minute); AdamW lr 1e-2.
    pub fn tiny() -> GptConfig {
        GptConfig {
            d_model: 64,
            layers: 1,
            heads: 1,
            hidden: 192,
            seq: 32,
            batch: 4,
            steps: 20,
            warmup: 4,
            lr: 1e-2,
            log_every: 5,
            eval_every: 10,
            eval_batches: 2,
            samples: 2,
            prompt_len: 16,
            sample_len: 32,
            ..GptConfig::gpu()
        }
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads.max(1)
    }

    /// Tokens per step.
    pub fn tokens_per_step(&self) -> usize {
        self.batch * self.seq
    }

    /// Checks the sizes against what the ops take.
    pub fn validate(&self) -> Result<(), GptError> {
        let bad = |w: String| Err(GptError::Config(w));
        if self.heads == 0 || !self.d_model.is_multiple_of(self.heads) {
            return bad(format!(
                "d_model {} must be a multiple of heads {}",
                self.d_model, self.heads
            ));
        }
        if !crate::ops::attention::ATTENTION_HEAD_DIMS.contains(&self.head_dim()) {
            return bad(format!(
                "head dim d_model / heads = {} must be 64 or 128 (the attention kernels')",
                self.head_dim()
            ));
        }
        if self.layers == 0 || self.seq == 0 || self.batch == 0 || self.steps == 0 {
            return bad("layers, seq, batch and steps must be positive".into());
        }
        if self.hidden == 0 || !self.hidden.is_multiple_of(8) {
            return bad(format!(
                "hidden {} must be a positive multiple of 8",
                self.hidden
            ));
        }
        if 3 * self.seq > 65535 || self.batch * self.heads > 65535 {
            return bad("seq must be at most 21845 and batch * heads at most 65535".into());
        }
        for (name, v) in [("lr", self.lr), ("muon lr", self.muon_lr)] {
            if !(v.is_finite() && v > 0.0) {
                return bad(format!("{name} {v} must be positive"));
            }
        }
        if self.log_every == 0 || self.eval_every == 0 || self.eval_batches == 0 {
            return bad("log_every, eval_every and eval_batches must be positive".into());
        }
        Ok(())
    }

    /// The learning-rate multiplier of step `step` (1-based).
    pub fn lr_scale(&self, step: usize) -> f64 {
        let warm = if self.warmup > 0 {
            (step as f64 / self.warmup as f64).min(1.0)
        } else {
            1.0
        };
        warm * crate::train::lr_scale(step, self.steps)
    }
}
