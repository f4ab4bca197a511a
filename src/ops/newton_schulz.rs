//! Newton–Schulz orthogonalization (Muon's `zeropower`), batched, on tensor cores:
//! `kernels-src/ns.kg` for the matrix products, `kernels-src/muon.kg` around them.
//!
//! One call orthogonalizes `k` matrices of one shape with `2 + 3 * steps` launches,
//! whatever `k` is, and never synchronizes the host:
//! - `ns_prep` writes each matrix as bf16 into a working buffer in its wide orientation
//!   (a tall matrix is read through its transpose: a view, never a host-side copy) and
//!   the partial sums of squares of what it wrote. An input that already is that buffer's
//!   layout (bf16, wide, rows a multiple of 128, columns of 8, densely packed) is read in
//!   place instead ([`NsWork::use_input`]): no `ns_prep`, and the squared norm comes from
//!   the first Gram's diagonal tiles (`tr(X0 X0^T)`, `ns.kg`'s TRACE), so `B'` and the
//!   update of the first step scale the unnormalized products (H100: NS 2048² 405 -> 397
//!   µs, 12 x 768² 337 -> 327);
//! - each step is three products: `A = X X^T` and `B' = a I + b A + c A A` (both
//!   symmetric: `ns_gram` computes the tiles on or above the diagonal and mirrors them;
//!   `ns_gram_split`, one of its tuning candidates, splits the tiles of a partial last
//!   round along K over the idle SMs instead of running that round),
//!   then `X = B' X = a X + B X` (`ns_update`, a plain product: see `ns.kg` on rounding). The first step's products also divide by
//!   `max(||X||_F, eps)` (torch's `X.div_(X.norm().clamp(min=eps))`), the norm added up
//!   from the partial sums in a fixed order by every block that needs it: no pass of its
//!   own;
//! - `ns_emit` writes the result (or, for Muon, applies it to the parameters).
//!
//! The working buffer pads each matrix's rows to a multiple of [`NS_ROW_ALIGN`] and its
//! columns to a multiple of 8 with zeros, so the batch flattens into plain 2-D row-major
//! operands whose tiles never straddle two matrices, 16-byte aligned for TMA. Zero rows
//! and columns stay zero through an iteration (see `ns.kg`), so the padding is exact.
//!
//! Assumes: 16-bit iteration (bf16 by default, as Muon; f16 works too); an f32 norm.
//! Guarantees: the result of every matrix depends only on that matrix (the batch is
//! independent), up to the f32 rounding of `ns_gram_split`'s chunked sums, whose chunks
//! follow the batch's tile count and the GPU's SM count; results are deterministic for
//! a GPU and a tuning choice (no atomics); bad shapes, dtypes and coefficient lists are
//! typed errors before any launch.

use super::{dtype_err, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{Kernel, Tensor};
use std::sync::Arc;

/// Rows of each matrix in the working buffer are padded to a multiple of this.
pub const NS_ROW_ALIGN: usize = 128;
/// Columns are padded to a multiple of this (16 bytes of bf16).
pub const NS_COL_ALIGN: usize = 8;
/// torch.optim.Muon's `eps` (the norm is clamped below by it).
pub const NS_EPS: f32 = 1e-7;
/// Muon's quintic coefficients (Keller Jordan; torch.optim.Muon's default), 5 steps.
pub const QUINTIC: (f32, f32, f32) = (3.4445, -4.7750, 2.0315);
/// The tile of the memory-bound kernels (`muon.kg`'s TR x TC).
const TILE: usize = 64;

/// The coefficients of each of `steps` iterations: one triple for every step, or one per
/// step (a schedule such as Polar Express).
pub fn ns_schedule(
    coeffs: &[(f32, f32, f32)],
    steps: usize,
) -> Result<Vec<(f32, f32, f32)>, OpError> {
    let bad = |what: String| Err(shape_err("newton_schulz", what));
    if coeffs
        .iter()
        .any(|&(a, b, c)| !(a.is_finite() && b.is_finite() && c.is_finite()))
    {
        return bad("non-finite coefficient".into());
    }
    if steps == 0 {
        // The first step's products also normalize; with none, nothing would.
        return bad("0 steps (give at least 1)".into());
    }
    match coeffs.len() {
        1 => Ok(vec![coeffs[0]; steps]),
        n if n == steps => Ok(coeffs.to_vec()),
        n => bad(format!(
            "{n} coefficient triples for {steps} steps (give 1, or one per step)"
        )),
    }
}

/// How a 2-D (or batched) matrix argument is stored: a view whose last dimension is
/// contiguous, and whether that storage is the wide working orientation's transpose.
#[derive(Clone)]
pub(crate) struct Oriented {
    /// `[k, sr, sc]` with stride 1 along sc.
    pub storage: Tensor,
    /// The kernels read (or write) the storage transposed.
    pub trans: bool,
}

/// `t` (`[rows, cols]` or `[k, rows, cols]`) as 3-D storage with a contiguous last
/// dimension, oriented against the wide form of its logical matrix (m = min, n = max).
pub(crate) fn orient(op: &'static str, t: &Tensor) -> Result<Oriented, OpError> {
    let t3 = match t.rank() {
        2 => t.view(&[1, t.shape()[0], t.shape()[1]])?,
        3 => t.clone(),
        r => {
            return Err(shape_err(
                op,
                format!("a matrix or a batch of them, not rank {r}"),
            ))
        }
    };
    let (r, c) = (t3.shape()[1], t3.shape()[2]);
    let s = t3.strides();
    let tall = r > c;
    let (storage, flip) = if s[2] == 1 || c <= 1 {
        (t3, false)
    } else if s[1] == 1 || r <= 1 {
        (t3.transpose(1, 2)?, true)
    } else {
        return Err(shape_err(
            op,
            format!(
                "{:?} with strides {:?}: one of the last two dimensions must be contiguous",
                t.shape(),
                t.strides()
            ),
        ));
    };
    Ok(Oriented {
        storage,
        trans: flip != tall,
    })
}

/// The working buffers of one batch of `k` matrices of logical shape `[rows, cols]`.
pub(crate) struct NsWork {
    pub k: usize,
    pub rows: usize,
    pub cols: usize,
    /// The wide orientation's `m = min(rows, cols)` and `n = max`, padded.
    pub mp: usize,
    pub np: usize,
    /// Two `[k, mp, np]` buffers the iteration alternates between: the halves of
    /// `both`, `[2 k, mp, np]` (`ns_fused` reads and writes them as one tensor).
    x: [Tensor; 2],
    both: Tensor,
    /// `[k * mp, mp]`: A and B.
    a: Tensor,
    b: Tensor,
    /// `[k, tiles]`: `ns_prep`'s partial sums of squares.
    part: Tensor,
    /// Which of `x` holds the current iterate.
    cur: usize,
    /// `[1, 1, 1]` f32: `ns_prep`'s `buf` argument without momentum.
    no_buf: Tensor,
    dtype: DType,
    /// The zero-copy path ([`NsWork::use_input`]): the caller's tensor as X0 (`[k, mp,
    /// np]`, read by the first step's products in place of the current buffer), and
    /// `[k, mp / 64]` f32 for the first Gram's trace partials, from which the first
    /// step's other products take the norm (no `ns_prep`).
    input: Option<(Tensor, Tensor)>,
    /// `ns_gram_split`'s partials, `[chunks, BM, BM]` f32, made at its first use.
    split_ws: std::sync::Mutex<Option<Tensor>>,
    /// The update candidate the tuner chose at this shape (the last iteration's
    /// `ns_update_emit` is built like it, untimed).
    update_choice: Option<usize>,
}

impl NsWork {
    /// Buffers for `k` matrices `[rows, cols]`, iterated in `dtype` (f16 or bf16).
    pub fn new(
        ops: &Ops,
        dtype: DType,
        k: usize,
        rows: usize,
        cols: usize,
    ) -> Result<NsWork, OpError> {
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(dtype_err(
                "newton_schulz",
                format!("iterates in bf16 or f16, not {dtype}"),
            ));
        }
        let (m, n) = (rows.min(cols), rows.max(cols));
        let mp = m.max(1).next_multiple_of(NS_ROW_ALIGN);
        let np = n.max(1).next_multiple_of(NS_COL_ALIGN);
        let tiles = (mp / TILE) * np.div_ceil(TILE);
        // Nothing needs zeroing: ns_prep writes every element of the current buffer
        // (its padding as zeros) and of `part`, each product every element of its output.
        let both = ops.empty(dtype, &[2 * k, mp, np])?;
        let x = [both.narrow(0, 0, k)?, both.narrow(0, k, k)?];
        Ok(NsWork {
            k,
            rows,
            cols,
            mp,
            np,
            x,
            both,
            a: ops.empty(dtype, &[k * mp, mp])?,
            b: ops.empty(dtype, &[k * mp, mp])?,
            part: ops.empty(DType::F32, &[k, tiles])?,
            cur: 0,
            no_buf: ops.zeros(DType::F32, &[1, 1, 1])?,
            dtype,
            input: None,
            split_ws: std::sync::Mutex::new(None),
            update_choice: None,
        })
    }

    /// Makes `x` (the whole batch, `[k, rows, cols]` storage with stride 1 along cols)
    /// the first step's X0 as it stands, where it can be: the iteration's dtype, already
    /// the wide orientation (rows <= cols), rows a multiple of [`NS_ROW_ALIGN`], cols of
    /// [`NS_COL_ALIGN`] (so it is the padded layout), densely packed. Then `ns_prep` is
    /// not run: its pass over X0 is saved, and the first Gram writes `tr(X0 X0^T) =
    /// ||X0||^2` by diagonal tiles (`ns.kg`, TRACE). Returns whether it did.
    pub(crate) fn use_input(&mut self, ops: &Ops, x: &Oriented) -> Result<bool, OpError> {
        let t = &x.storage;
        let dense = [self.mp * self.np, self.np, 1];
        if x.trans
            || t.dtype() != self.dtype
            || t.shape() != [self.k, self.mp, self.np]
            || t.strides() != dense
            || self.rows.min(self.cols) != self.mp
            || self.rows.max(self.cols) != self.np
        {
            return Ok(false);
        }
        let trace = ops.empty(DType::F32, &[self.k, self.mp / 64])?;
        self.input = Some((t.clone(), trace));
        Ok(true)
    }

    /// The partial sums the first step's products take the norm from: the first Gram's
    /// trace partials on the zero-copy path, `ns_prep`'s otherwise.
    fn norm_part(&self) -> &Tensor {
        match &self.input {
            Some((_, trace)) => trace,
            None => &self.part,
        }
    }

    /// The current iterate, `[k, mp, np]`.
    pub fn current(&self) -> &Tensor {
        &self.x[self.cur]
    }

    /// `[k * mp, mp]`: the Gram product `A` of the iteration in flight.
    pub(crate) fn gram(&self) -> &Tensor {
        &self.a
    }

    /// `[k * mp, mp]`: `B`.
    pub(crate) fn update_matrix(&self) -> &Tensor {
        &self.b
    }

    /// `ns_gram_split`'s workspace for `chunks` partial tiles of `bm` rows (kept for the
    /// next iterations and calls: its size depends only on the shape and the GPU).
    fn split_workspace(&self, ops: &Ops, chunks: usize, bm: usize) -> Result<Tensor, OpError> {
        let mut g = self
            .split_ws
            .lock()
            .map_err(|_| shape_err("newton_schulz", "workspace lock poisoned"))?;
        if let Some(t) = g.as_ref().filter(|t| t.shape() == [chunks, bm, bm]) {
            return Ok(t.clone());
        }
        let t = ops.empty(DType::F32, &[chunks, bm, bm])?;
        *g = Some(t.clone());
        Ok(t)
    }

    fn empty(&self) -> bool {
        self.k == 0 || self.rows == 0 || self.cols == 0
    }

    /// The chunk `P` in which the normalizing products add up a matrix's partial sums
    /// (one per `ns_prep` block): each chunk is one round trip to memory before the
    /// block's first product, so a large matrix's 16384 partials (8192 x 8192) take 8
    /// chunks of 2048 rather than 64 of 256 (the kernels' default, kept for small ones).
    fn norm_chunk(&self) -> usize {
        (self.prep_grid()[0] as usize)
            .next_power_of_two()
            .clamp(256, 2048)
    }

    fn prep_grid(&self) -> [u32; 3] {
        [
            ((self.mp / TILE) * self.np.div_ceil(TILE)) as u32,
            self.k as u32,
            1,
        ]
    }
}

/// Where [`Ops::ns_iterate_into`] writes the result of matrices `first ..` of the batch:
/// `p = result` or, with `hp` (`[k, 2]` f32 rows `(decay, scale)`), `p = decay * p +
/// scale * result`, in p's storage orientation (as [`Ops::ns_emit_run`]).
pub(crate) struct EmitTo<'a> {
    pub first: usize,
    pub p: Oriented,
    pub hp: Option<&'a Tensor>,
}

/// How a Gram product takes part in the first step's normalization (`ns.kg`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum NsNorm {
    /// Not at all.
    Off,
    /// NORM: scale by `1 / max(||X0||, eps)` (squared for the Gram of X0, to the fourth
    /// for `B'` from the unnormalized `A0 = X0 X0^T`), the norm from the partial sums.
    Scale(f32),
    /// TRACE: the Gram of the unnormalized X0, writing its trace partials.
    Trace,
}

/// Muon's momentum, fused into `ns_prep`: `buf` (f32, the gradient's shape and storage),
/// `mu`, Nesterov.
pub(crate) struct Momentum<'a> {
    pub buf: &'a Tensor,
    pub mu: f32,
    pub nesterov: bool,
}

impl Ops {
    /// Newton–Schulz on `x` (`[rows, cols]` or a batch `[k, rows, cols]`, f32, f16 or
    /// bf16; either of the last two dimensions contiguous): `steps` iterations in bf16
    /// with `coeffs` (one `(a, b, c)` for every step, or one per step), as
    /// torch.optim.Muon's `_zeropower_via_newtonschulz`. Returns a new tensor of x's
    /// dtype and shape.
    pub fn newton_schulz(
        &self,
        x: &Tensor,
        steps: usize,
        coeffs: &[(f32, f32, f32)],
    ) -> Result<Tensor, OpError> {
        let out = self.empty(x.dtype(), x.shape())?;
        self.newton_schulz_into(x, &out, steps, coeffs)?;
        Ok(out)
    }

    /// [`Ops::newton_schulz`] into an existing tensor of x's shape (any float dtype, any
    /// orientation: a transposed `out` is written through its transpose).
    pub fn newton_schulz_into(
        &self,
        x: &Tensor,
        out: &Tensor,
        steps: usize,
        coeffs: &[(f32, f32, f32)],
    ) -> Result<(), OpError> {
        self.newton_schulz_with(x, out, steps, coeffs, None)
    }

    /// [`Ops::newton_schulz_into`]; `fused`: `Some(true)` runs the iterations as one
    /// cooperative launch (`ns_fused`), `Some(false)` as three launches each, `None` as
    /// [`Ops::ns_fused_applies`] says.
    pub(crate) fn newton_schulz_with(
        &self,
        x: &Tensor,
        out: &Tensor,
        steps: usize,
        coeffs: &[(f32, f32, f32)],
        fused: Option<bool>,
    ) -> Result<(), OpError> {
        const OP: &str = "newton_schulz";
        let sched = ns_schedule(coeffs, steps)?;
        if x.shape() != out.shape() {
            return Err(shape_err(
                OP,
                format!("out {:?} for x {:?}", out.shape(), x.shape()),
            ));
        }
        for t in [x, out] {
            if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
                return Err(dtype_err(OP, format!("float tensors, not {}", t.dtype())));
            }
        }
        let xi = orient(OP, x)?;
        let xo = orient(OP, out)?;
        let s = xi.storage.shape();
        let (k, rows, cols) = if xi.trans == (s[1] > s[2]) {
            // storage is the logical orientation
            (s[0], s[1], s[2])
        } else {
            (s[0], s[2], s[1])
        };
        let mut work = NsWork::new(self, DType::BF16, k, rows, cols)?;
        if work.empty() {
            return Ok(());
        }
        let fused = fused.unwrap_or_else(|| self.ns_fused_applies());
        // One step in place would read X0 while its last update writes it.
        let zero_copy =
            !fused && (sched.len() > 1 || !x.overlaps(out)) && work.use_input(self, &xi)?;
        if !zero_copy {
            self.ns_prep_run(&work, 0, &xi, None)?;
        }
        if fused {
            self.ns_fused(&mut work, &sched, NS_EPS)?;
            return self.ns_emit_run(&work, 0, &xo, None);
        }
        let to = [EmitTo {
            first: 0,
            p: xo,
            hp: None,
        }];
        self.ns_iterate_into(&mut work, &sched, NS_EPS, &to)
    }

    /// `ns_prep` into matrices `first ..` of `w`'s current buffer: the bf16 (and, with
    /// `momentum`, Muon's Nesterov) input and its partial sums of squares.
    pub(crate) fn ns_prep_run(
        &self,
        w: &NsWork,
        first: usize,
        g: &Oriented,
        momentum: Option<Momentum>,
    ) -> Result<(), OpError> {
        let k = g.storage.shape()[0];
        let x = w.current().narrow(0, first, k)?;
        let part = w.part.narrow(0, first, k)?;
        let (buf, mu, nesterov) = match &momentum {
            Some(m) => (m.buf, m.mu, m.nesterov),
            None => (&w.no_buf, 0.0, false),
        };
        let args = KernelArgs::new()
            .tensor("g", &g.storage)
            .tensor("buf", buf)
            .tensor("x", &x)
            .tensor("part", &part)
            .scalar("mu", mu);
        let defines = [
            ("S", g.storage.dtype().to_string()),
            ("T", w.dtype.to_string()),
            ("TRANS", g.trans.to_string()),
            ("MOMENTUM", momentum.is_some().to_string()),
            ("NESTEROV", nesterov.to_string()),
        ];
        let kern = self.kernel("muon", "ns_prep", &defines, None, &args)?;
        let mut grid = w.prep_grid();
        grid[1] = k as u32;
        self.launch_args(&kern, grid, &args)
    }

    /// The iterations, 3 products each. The current buffer holds the unnormalized input
    /// and `w`'s partial sums its squares (`ns_prep_run`), or `w` reads the caller's
    /// tensor in place ([`NsWork::use_input`]) and the first Gram writes the trace
    /// partials: either way the first step's products apply `1 / max(||X||, eps)`.
    /// The last iteration's update is written straight into `to`'s tensors
    /// (`ns_update_emit`: [`Ops::ns_emit_run`] fused into the product's epilogue, the
    /// same bits); with `to` empty, into `w.current()`. The targets must cover every
    /// matrix whose result is wanted: the others get none.
    pub(crate) fn ns_iterate_into(
        &self,
        w: &mut NsWork,
        sched: &[(f32, f32, f32)],
        eps: f32,
        to: &[EmitTo],
    ) -> Result<(), OpError> {
        for (i, &(a, b, c)) in sched.iter().enumerate() {
            let nx = w.x[1 - w.cur].clone();
            let norm = (i == 0).then_some(eps);
            let (x, gram_norm, b_norm) = match (&w.input, i) {
                (Some((x0, _)), 0) => (x0.clone(), NsNorm::Trace, NsNorm::Scale(eps)),
                (_, 0) => (w.x[w.cur].clone(), NsNorm::Scale(eps), NsNorm::Off),
                _ => (w.x[w.cur].clone(), NsNorm::Off, NsNorm::Off),
            };
            self.ns_gram(w, &x, &w.b, &w.a, (1.0, 0.0, 0.0), false, gram_norm)?;
            self.ns_gram(w, &w.a, &w.a, &w.b, (c, b, a), true, b_norm)?;
            if i + 1 == sched.len() && !to.is_empty() {
                for t in to {
                    self.ns_update_emit(w, &x, t, norm)?;
                }
                return Ok(());
            }
            w.update_choice = Some(self.ns_update(w, &w.b, &x, &nx, norm)?);
            w.cur = 1 - w.cur;
        }
        Ok(())
    }

    /// Whether Newton–Schulz runs as one cooperative launch (`ns_fused`): only when
    /// asked (`KGEN_NS_FUSED=1`). Measured on an H100 (docs/PERFORMANCE.md, twenty-sixth
    /// session) it is correct but slower than a launch per product (1024² 217-222 µs
    /// against 145-148, 2048² 518-521 against 428-432, 768 x 3072 236-243 against
    /// 190-192), so it is not the default.
    fn ns_fused_applies(&self) -> bool {
        std::env::var("KGEN_NS_FUSED").is_ok_and(|v| v == "1")
    }

    /// All of `sched`'s iterations in one launch of `ns.kg`'s `ns_fused` (a persistent
    /// grid, `grid_sync` between the products), leaving the result in `w.current()`.
    pub(crate) fn ns_fused(
        &self,
        w: &mut NsWork,
        sched: &[(f32, f32, f32)],
        eps: f32,
    ) -> Result<(), OpError> {
        let steps = sched.len();
        if steps == 0 {
            return Ok(());
        }
        let flat: Vec<f32> = sched.iter().flat_map(|&(a, b, c)| [a, b, c]).collect();
        let coeffs = self
            .device()
            .from_slice(&[steps, 3], &flat)
            .map_err(OpError::from)?;
        let counter = self.grid_counter()?;
        let (k, mp, np) = (w.k, w.mp, w.np);
        let xs = w.both.reshape(&[2 * k * mp, np])?;
        // Small matrices get 64-row tiles (more of them to spread over the GPU).
        // sm_80's 128 x 256 update tile spills in this kernel (ptxas: 4 bytes).
        let wide = if self.device.arch() == kgen_core::Arch::Sm90a {
            256
        } else {
            128
        };
        let (gm, bm, bn, warps) = if mp <= 1024 {
            (64, 64, 128, 4)
        } else {
            (128, 128, wide, 8)
        };
        let args = KernelArgs::new()
            .tensor("xs", &xs)
            .tensor("a", &w.a)
            .tensor("b", &w.b)
            .tensor("part", &w.part)
            .tensor("coeffs", &coeffs)
            .tensor("counter", &counter)
            .scalar("eps", eps);
        let defines = [
            ("T", w.dtype.to_string()),
            ("GM", gm.to_string()),
            ("BM", bm.to_string()),
            ("BN", bn.to_string()),
            ("STEPS", steps.to_string()),
            ("P", w.norm_chunk().to_string()),
        ];
        let kern = self.kernel_full("ns", "ns_fused", &defines, Some(warps), None, None, &args)?;
        let t = mp / gm;
        let sym = k * t * (t + 1) / 2;
        let upd = k * (mp / bm) * np.div_ceil(bn);
        let fits = self
            .device()
            .max_cooperative_blocks(&kern)
            .map_err(OpError::from)? as usize;
        let grid = u32::try_from(sym.max(upd).min(fits).max(1))
            .map_err(|_| shape_err("newton_schulz", "too many tiles"))?;
        self.launch_args(&kern, [grid, 1, 1], &args)?;
        w.cur = steps % 2;
        Ok(())
    }

    /// `out = alpha * u^2 x x^T (+ beta * u * d + diag * I when epi)` with `(alpha, beta,
    /// diag)` = `coef`, per matrix, upper tiles mirrored; `u` as [`NsNorm`] says (`ns.kg`:
    /// 1, or from `s = 1 / max(||X0||, eps)` and `w`'s partial sums), and with
    /// [`NsNorm::Trace`] the trace partials written.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ns_gram(
        &self,
        w: &NsWork,
        x: &Tensor,
        d: &Tensor,
        out: &Tensor,
        coef: (f32, f32, f32),
        epi: bool,
        norm: NsNorm,
    ) -> Result<(), OpError> {
        self.ns_gram_with(w, x, d, out, coef, epi, norm, None)
    }

    /// [`Ops::ns_gram`] with candidate `force` of [`gram_candidates`] instead of the
    /// tuner's choice (the op checks run every candidate).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ns_gram_with(
        &self,
        w: &NsWork,
        x: &Tensor,
        d: &Tensor,
        out: &Tensor,
        coef: (f32, f32, f32),
        epi: bool,
        norm: NsNorm,
        force: Option<usize>,
    ) -> Result<(), OpError> {
        let (scale_eps, trace) = match norm {
            NsNorm::Off => (None, false),
            NsNorm::Scale(eps) => (Some(eps), false),
            NsNorm::Trace => (None, true),
        };
        let (alpha, beta, diag) = coef;
        let x2 = x.reshape(&[w.k * w.mp, x.numel() / (w.k * w.mp)])?;
        let cands = gram_candidates(self.device().arch());
        let dt = w.dtype;
        let (k, mp, n) = (w.k, w.mp, x2.shape()[1]);
        let t = |c: &NsConfig| mp / c.bm as usize;
        let tiles = |c: &NsConfig| k * t(c) * (t(c) + 1) / 2;
        // The split candidates' grid (one block per SM, all resident) and tail.
        let g = self.sm_count().max(1);
        let split = cands.iter().find(|c| c.split).map(|c| {
            let tail = split_tail(tiles(c), g, n.div_ceil(c.bk as usize));
            (tail, c.bm as usize)
        });
        let ws = match split {
            Some(((r, ch), bm)) => Some(w.split_workspace(self, (r * ch).max(1), bm)?),
            None => None,
        };
        let counter = self.grid_counter()?;
        let with = |split: bool| {
            let mut a = KernelArgs::new()
                .tensor("x", &x2)
                .tensor("d", d)
                .tensor("out", out)
                .tensor("part", w.norm_part());
            if let (true, Some(ws)) = (split, &ws) {
                a = a.tensor("ws", ws).tensor("counter", &counter);
            }
            a.scalar("alpha", alpha)
                .scalar("beta", beta)
                .scalar("diag", diag)
                .scalar("eps", scale_eps.unwrap_or(0.0))
        };
        let (plain, splits) = (with(false), with(true));
        let key = super::plan::PlanKey::new("ns_gram")
            .word(epi as u64 | (scale_eps.is_some() as u64) << 1 | (trace as u64) << 2);
        let resolve = |i: usize| -> Result<Vec<super::plan::Launch>, OpError> {
            let c = &cands[i];
            let mut defs = vec![
                ("T", dt.to_string()),
                ("BM", c.bm.to_string()),
                ("BK", c.bk.to_string()),
                ("EPI", epi.to_string()),
                ("NORM", scale_eps.is_some().to_string()),
            ];
            defs.extend(scale_eps.map(|_| ("P", w.norm_chunk().to_string())));
            if c.split && trace {
                // The tuner skips it; the trace partials come from whole diagonal tiles.
                return Err(shape_err(
                    "newton_schulz",
                    "ns_gram_split has no TRACE form",
                ));
            }
            if trace {
                defs.push(("TRACE", "true".into()));
            }
            let (kern, grid) = if c.split {
                let (_, ch) = split_tail(tiles(c), g, n.div_ceil(c.bk as usize));
                defs.push(("CH", ch.to_string()));
                let k = self.kernel_full(
                    "ns",
                    "ns_gram_split",
                    &defs,
                    Some(c.warps),
                    c.min_blocks,
                    Some(c.stages),
                    &splits,
                )?;
                (k, g)
            } else {
                (
                    self.ns_kernel("ns_gram", defs, c, &plain, tiles(c))?.0,
                    tiles(c),
                )
            };
            let grid =
                u32::try_from(grid).map_err(|_| shape_err("newton_schulz", "too many tiles"))?;
            Ok(vec![(kern, [grid, 1, 1])])
        };
        let args_of = |i: usize| if cands[i].split { &splits } else { &plain };
        if let Some(i) = force {
            if i >= cands.len() {
                return Err(shape_err("newton_schulz", format!("no Gram candidate {i}")));
            }
            let launches = resolve(i)?;
            let [(kern, grid)] = super::plan::launches_of::<1>("ns_gram", &launches)?;
            return self.launch_args(kern, *grid, args_of(i));
        }
        self.launch_tuned_planned(
            splits.plan_key(key),
            || format!("{dt} {k}x{mp}x{n}"),
            || cands.iter().map(NsConfig::label).collect(),
            resolve,
            |i, launches, pass| {
                let [(kern, grid)] = super::plan::launches_of::<1>("ns_gram", launches)?;
                self.launch_maybe_timed(kern, *grid, args_of(i).args(), pass)
            },
        )
        .map(|_| ())
    }

    /// `out = s bm x`, per matrix (`s` as in [`Ops::ns_gram`]; `bm` holds `a I + B`).
    fn ns_update(
        &self,
        w: &NsWork,
        bm: &Tensor,
        x: &Tensor,
        out: &Tensor,
        norm: Option<f32>,
    ) -> Result<usize, OpError> {
        let flat = |t: &Tensor| t.reshape(&[w.k * w.mp, w.np]);
        let (x2, o2) = (flat(x)?, flat(out)?);
        let args = KernelArgs::new()
            .tensor("bm", bm)
            .tensor("x", &x2)
            .tensor("out", &o2)
            .tensor("part", w.norm_part())
            .scalar("eps", norm.unwrap_or(0.0));
        let dt = w.dtype;
        let (k, mp, np) = (w.k, w.mp, w.np);
        self.ns_product(
            "ns_update",
            super::plan::PlanKey::new("ns_update").word(norm.is_some() as u64),
            &args,
            || format!("{dt} {k}x{mp}x{np}"),
            &update_candidates(self.device().arch()),
            |c| {
                let mut d = vec![
                    ("T", dt.to_string()),
                    ("BM", c.bm.to_string()),
                    ("BN", c.bn.to_string()),
                    ("BK", c.bk.to_string()),
                    ("NORM", norm.is_some().to_string()),
                    ("PERSISTENT", c.persistent.to_string()),
                ];
                d.extend(norm.map(|_| ("P", w.norm_chunk().to_string())));
                d
            },
            |c| k * (mp / c.bm as usize) * np.div_ceil(c.bn as usize),
        )
    }

    /// One product of `kernels-src/ns.kg` through the tuner: candidate `c` compiled with
    /// `defines(c)`, launched on `blocks(c)` blocks (its tiles), or with `c.persistent` on
    /// as many as the GPU holds at once, at most the tiles.
    #[allow(clippy::too_many_arguments)]
    fn ns_product(
        &self,
        kernel: &'static str,
        key: super::plan::PlanKey,
        args: &KernelArgs,
        shape_key: impl FnOnce() -> String,
        cands: &[NsConfig],
        defines: impl Fn(&NsConfig) -> Vec<(&'static str, String)> + Sync,
        blocks: impl Fn(&NsConfig) -> usize + Sync,
    ) -> Result<usize, OpError> {
        self.launch_tuned_planned(
            args.plan_key(key),
            shape_key,
            || cands.iter().map(NsConfig::label).collect(),
            |i| {
                let c = &cands[i];
                let tiles = blocks(c);
                let (kern, fits) = self.ns_kernel(kernel, defines(c), c, args, tiles)?;
                let tiles = if c.persistent { tiles.min(fits) } else { tiles };
                let grid = u32::try_from(tiles)
                    .map_err(|_| shape_err("newton_schulz", "too many tiles"))?;
                Ok(vec![(kern, [grid, 1, 1])])
            },
            |_, launches, pass| {
                let [(k, grid)] = super::plan::launches_of::<1>(kernel, launches)?;
                self.launch_maybe_timed(k, *grid, args.args(), pass)
            },
        )
    }

    /// The last update of matrices `to.first ..` into `to.p` (`ns_update_emit`), built
    /// as the update candidate the tuner chose at this shape (not timed itself: with
    /// `hp` it updates `p` in place), or, where that tile's epilogue would need more
    /// registers than a thread has (128 x 256 with `hp`: the f32 tile of `p` beside the
    /// accumulators), as the 128 x 128 one.
    fn ns_update_emit(
        &self,
        w: &NsWork,
        x: &Tensor,
        to: &EmitTo,
        norm: Option<f32>,
    ) -> Result<(), OpError> {
        let s = to.p.storage.shape();
        let kk = s[0];
        if kk == 0 {
            return Ok(());
        }
        let (mp, np) = (w.mp, w.np);
        let rows = |t: &Tensor| -> Result<Tensor, OpError> {
            Ok(t.reshape(&[w.k * mp, t.numel() / (w.k * mp)])?
                .narrow(0, to.first * mp, kk * mp)?)
        };
        let (bm2, x2) = (rows(&w.b)?, rows(x)?);
        let part = w.norm_part().narrow(0, to.first, kk)?;
        let dummy;
        let hp = match to.hp {
            Some(h) => h,
            None => {
                dummy = w.part.narrow(1, 0, 1)?;
                &dummy
            }
        };
        let args = KernelArgs::new()
            .tensor("bm", &bm2)
            .tensor("x", &x2)
            .tensor("p", &to.p.storage)
            .tensor("hp", hp)
            .tensor("part", &part)
            .scalar("eps", norm.unwrap_or(0.0));
        let cands = update_candidates(self.device().arch());
        let mut c = cands[w.update_choice.unwrap_or(0).min(cands.len() - 1)];
        if to.hp.is_some() && c.bn > 128 {
            c = cfg(128, 128, 64, 8, 4);
        }
        let mut defines = vec![
            ("T", w.dtype.to_string()),
            ("S", to.p.storage.dtype().to_string()),
            ("BM", c.bm.to_string()),
            ("BN", c.bn.to_string()),
            ("BK", c.bk.to_string()),
            ("NORM", norm.is_some().to_string()),
            ("PERSISTENT", c.persistent.to_string()),
            ("TRANS", to.p.trans.to_string()),
            ("ACCUM", to.hp.is_some().to_string()),
        ];
        defines.extend(norm.map(|_| ("P", w.norm_chunk().to_string())));
        let tiles = kk * (mp / c.bm as usize) * np.div_ceil(c.bn as usize);
        let (kern, fits) = self.ns_kernel("ns_update_emit", defines, &c, &args, tiles)?;
        let grid = if c.persistent { tiles.min(fits) } else { tiles };
        let grid = u32::try_from(grid).map_err(|_| shape_err("newton_schulz", "too many tiles"))?;
        self.launch_args(&kern, [grid, 1, 1], &args)
    }

    /// Product `kernel` of `ns.kg` as candidate `c` with `defines`, and how many of its
    /// blocks the GPU holds at once. On sm_90a a product whose `tiles` all fit at once
    /// (or a persistent one) is built with `PDL`: launched as a programmatic dependent, it
    /// starts while the product before it drains (`gdc_wait` before its first read) and
    /// lets the next start once its own main loop is done. Measured on an H100 (twenty-
    /// seventh session): NS 1024² 147 -> 130-138 µs, 2048² 428 -> 405-411, 768 x 3072
    /// 192 -> 177-180; on the GPT-2 Muon step's products (2 to 13 waves) it cost 2 to 6%
    /// (a later wave's blocks wait behind dependents launched early), so a product of
    /// several waves is built without it.
    fn ns_kernel(
        &self,
        kernel: &'static str,
        mut defines: Vec<(&'static str, String)>,
        c: &NsConfig,
        args: &KernelArgs,
        tiles: usize,
    ) -> Result<(Arc<Kernel>, usize), OpError> {
        let build = |defines: &[(&'static str, String)]| {
            self.kernel_full(
                "ns",
                kernel,
                defines,
                Some(c.warps),
                c.min_blocks,
                Some(c.stages),
                args,
            )
        };
        let plain = build(&defines)?;
        let fits = (self.sm_count() * super::gemm::resident_blocks(&plain)).max(1);
        if self.device().arch() != kgen_core::Arch::Sm90a || (tiles > fits && !c.persistent) {
            return Ok((plain, fits));
        }
        defines.push(("PDL", "true".into()));
        Ok((build(&defines)?, fits))
    }

    /// Into matrices `first ..` of the batch: `p = result` or, with `hp` (`[k, 2]` f32 rows `(decay, scale)`), `p = decay * p +
    /// scale * result`, in p's storage orientation.
    pub(crate) fn ns_emit_run(
        &self,
        w: &NsWork,
        first: usize,
        p: &Oriented,
        hp: Option<&Tensor>,
    ) -> Result<(), OpError> {
        let x = w.current().narrow(0, first, p.storage.shape()[0])?;
        let dummy;
        let hp_t = match hp {
            Some(h) => h,
            None => {
                dummy = w.part.narrow(1, 0, 1)?;
                &dummy
            }
        };
        let args = KernelArgs::new()
            .tensor("p", &p.storage)
            .tensor("x", &x)
            .tensor("hp", hp_t);
        let defines = [
            ("S", p.storage.dtype().to_string()),
            ("T", w.dtype.to_string()),
            ("TRANS", p.trans.to_string()),
            ("ACCUM", hp.is_some().to_string()),
        ];
        let k = self.kernel("muon", "ns_emit", &defines, None, &args)?;
        let s = p.storage.shape();
        let grid = [
            (s[1].div_ceil(TILE) * s[2].div_ceil(TILE)) as u32,
            s[0] as u32,
            1,
        ];
        self.launch_args(&k, grid, &args)
    }
}

/// A Newton–Schulz product's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsConfig {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub warps: u32,
    pub stages: u32,
    /// Compiled so that this many blocks fit on one SM (registers capped).
    pub min_blocks: Option<u32>,
    /// `ns_update` only: each block walks tiles `num_bids(0)` apart, its ring alive
    /// across them (`PERSISTENT`, launched on the blocks the GPU holds at once).
    pub persistent: bool,
    /// `ns_gram` only: `ns_gram_split`, the last partial round's tiles split along K
    /// over a block per SM ([`split_tail`]).
    pub split: bool,
}

impl NsConfig {
    pub fn label(&self) -> String {
        format!(
            "BM={} BN={} BK={} w{} s{}{}",
            self.bm,
            self.bn,
            self.bk,
            self.warps,
            self.stages,
            self.min_blocks
                .map(|b| format!(" b{b}"))
                .unwrap_or_default(),
        ) + if self.persistent { " persistent" } else { "" }
            + if self.split { " split" } else { "" }
    }
}

const fn cfg(bm: u32, bn: u32, bk: u32, warps: u32, stages: u32) -> NsConfig {
    NsConfig {
        bm,
        bn,
        bk,
        warps,
        stages,
        min_blocks: None,
        persistent: false,
        split: false,
    }
}

/// The tail of `ns_gram_split` on `g` blocks: the `tiles mod g` tiles left after the full
/// rounds, and the chunks of K each is cut into (`CH`: a power of two, at most 16, at
/// most `kts` k-steps, and at most `g / tail`, so every chunk has a block; 1 without a
/// tail).
pub fn split_tail(tiles: usize, g: usize, kts: usize) -> (usize, usize) {
    let g = g.max(1);
    let r = tiles % g;
    if r == 0 {
        return (0, 1);
    }
    let ch = (g / r).min(16).min(kts.max(1)).max(1);
    (r, 1 << ch.ilog2())
}

/// Two blocks per SM: 3 stages of 128 x 128 x 64 fit twice in shared memory, and
/// registers capped at 128 hold a 64-per-thread accumulator without spills (ptxas 13.0):
/// one block's epilogue and the next one's prologue overlap the other's main loop.
const fn two_per_sm(c: NsConfig) -> NsConfig {
    NsConfig {
        min_blocks: Some(2),
        ..c
    }
}

/// `ns_gram`'s candidates on `arch` (square tiles; BM divides [`NS_ROW_ALIGN`]): the last
/// is `ns_gram_split` (a block per SM, the partial last round split along K). Two
/// blocks per SM only on sm_90a: an sm_80 SM (an A100's 164 KiB) does not hold two
/// blocks' 96 KiB of stages, so there the cap would only cost registers (and the sm_80
/// PTX capped at 128 registers, JIT-compiled for an H100, spilled 40 bytes and read
/// shared memory out of bounds under compute-sanitizer: nineteenth session).
pub fn gram_candidates(arch: kgen_core::Arch) -> Vec<NsConfig> {
    let first = cfg(128, 128, 64, 8, 3);
    vec![
        if arch == kgen_core::Arch::Sm90a {
            two_per_sm(first)
        } else {
            first
        },
        cfg(128, 128, 64, 8, 4),
        cfg(64, 64, 64, 4, 4),
        NsConfig {
            split: true,
            ..cfg(
                128,
                128,
                64,
                8,
                if arch == kgen_core::Arch::Sm90a { 4 } else { 3 },
            )
        },
    ]
}

/// `ns_update`'s candidates (BM and BK divide [`NS_ROW_ALIGN`]; the first builds on both
/// targets, 4 stages of 128 x 256 only on sm_90a, whose shared memory holds them). Two
/// 128 x 128 blocks per SM spill 20-24 bytes on sm_80 (`mma.sync` fragments in
/// registers; `tests/no_spills.rs` assembles every request for both targets): not
/// offered. On sm_90a the 128 x 256 x 64 tile also runs persistent (its TMA ring alive
/// across tiles: GPT-2's 24 x 768 x 3072 batch 172-175 -> 164-165 us on an H100).
pub fn update_candidates(arch: kgen_core::Arch) -> Vec<NsConfig> {
    let mut v = vec![
        cfg(128, 256, 64, 8, 3),
        cfg(128, 256, 64, 8, 4),
        cfg(128, 128, 64, 8, 4),
        cfg(64, 128, 64, 4, 4),
    ];
    if arch == kgen_core::Arch::Sm90a {
        v.push(NsConfig {
            persistent: true,
            ..cfg(128, 256, 64, 8, 4)
        });
        // Twice the K per stage for a one-warpgroup tile: fewer, larger copies in
        // flight. H100, 1024³ on 128 blocks (`kgen run --bench 20`, two rounds): 10.7 /
        // 11.0 µs against 11.8 / 11.8 with BK = 64 (6 or 8 stages of BK = 64: 11.9-12.5).
        v.push(cfg(64, 128, 128, 4, 4));
    } else {
        // 4 stages of 128 x 256 x 64 (192 KiB) exceed sm_80's shared memory.
        v.remove(1);
    }
    v
}

#[cfg(test)]
mod tests;
