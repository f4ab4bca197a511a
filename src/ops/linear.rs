//! Linear layers and matmul: `linear` (`y = act(x @ w.T + bias)`, torch's
//! `F.linear` followed by an activation, fused), its backward `linear_backward` (dx, dw,
//! db), and `matmul` (`c = a @ b`).
//!
//! Assumes: `x [..., K]` (rank >= 1; the leading dimensions are flattened into M rows,
//! which must be a free view: `Tensor::view`), `w [N, K]` (torch's layout; any 2-D view
//! with one contiguous dimension, e.g. the transpose of a weight stored `[K, N]`),
//! `bias [N]`, `y [..., N]` with x's leading shape, all of one dtype T: f16 or bf16 on
//! the tensor cores, or f32 for the plain layer only (no bias, no activation: f32
//! `matmul`, exact FMA on CUDA cores; the f32 backward takes every activation). The
//! pre-activation saved by the forward (`z = x @ w.T + bias`, rounded to T) is what the
//! backward's `act'(z)` reads. Outputs may overlap no input and no other output (checked
//! before the first launch: a typed error).
//!
//! Guarantees: the forward is one `gemm.kg` launch (TRANS_B reads w's storage; bias and
//! activation in the epilogue; with the pre-activation asked for, the same launch writes
//! z beside y: `PREACT`), autotuned as `gemm` is; f32 accumulation, each output rounded
//! to T once. The backward: `dz = dy * act'(z)` and the per-block column partial sums of
//! dz in one memory-bound launch (`linear_bwd.kg`; with no activation dz is dy itself,
//! never materialized, and the launch only sums columns, and only when db is wanted),
//! the deterministic sum of the partial rows into db (a second launch: no atomics),
//! then `dx = dz @ w` (gemm, no transposes) and `dw = dz.T @ x` (gemm reading dz's
//! storage as TRANS_A): at most four launches, no host synchronization. dz lives in a
//! fresh `[M, N]` tensor of T on the handle's stream (only with an activation), the
//! partials in the handle's f32 workspace. `matmul`: f16 and bf16 go to the tensor-core
//! `gemm` (`ops/gemm.rs`) when each operand has a contiguous dimension; f32 (exact FMA,
//! as `dot` promises) and other strides use the strided `kernels-src/matmul.kg`.

use super::gemm::Activation;
use super::plan::{launches_of, Launch, Pass, PlanKey};
use super::{dtype_err, float_dtype, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_1d, grid_2d, grid_x, RuntimeError, Tensor};

const BM: usize = 32;
const BN: usize = 32;

/// What [`Ops::linear_with_preact`] returns: the layer's output and the pre-activation
/// its backward needs.
#[derive(Clone, Debug)]
pub struct LinearOut {
    /// `act(x @ w.T + bias)`, `[..., N]`.
    pub y: Tensor,
    /// `x @ w.T + bias` (rounded to T), y's shape: `Some` exactly when the activation
    /// is not [`Activation::None`] (without one it would be y itself).
    pub preact: Option<Tensor>,
}

/// One launch configuration of `linear_bwd`: a [ROWS, BLOCK] tile, warps, and G row
/// groups (the grid is G × cdiv(N, BLOCK)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BwdConfig {
    rows: usize,
    block: usize,
    warps: u32,
    groups: usize,
}

impl BwdConfig {
    fn label(&self) -> String {
        format!(
            "ROWS={},BLOCK={},warps={},G={}",
            self.rows, self.block, self.warps, self.groups
        )
    }
}

/// `linear_bwd` candidates for an `[m, n]` gradient on `sms` SMs, the default first:
/// tiles of 4096 elements at 16 per thread (BLOCK up to 256 columns, ROWS the rest)
/// with about 4 blocks per SM, then 8192-element tiles at 2 per SM and 2048-element
/// tiles at 8 per SM (the same bytes in flight, fewer or more blocks). G never exceeds
/// the row tiles (a block without rows only writes zero partials).
fn bwd_configs(m: usize, n: usize, sms: usize) -> Vec<BwdConfig> {
    let pn = n.next_power_of_two().max(8);
    let pm = m.next_power_of_two().max(1);
    let mut v = Vec::new();
    for (elems, max_block, warps, per_sm) in [
        (4096usize, 256usize, 8u32, 4usize),
        (8192, 512, 8, 2),
        (2048, 128, 4, 8),
    ] {
        let block = pn.min(max_block);
        let rows = (elems / block).min(pm).max(1);
        let tiles = m.div_ceil(rows).max(1);
        let groups = (per_sm * sms).div_ceil(n.div_ceil(block)).clamp(1, tiles);
        let c = BwdConfig {
            rows,
            block,
            warps: warps.min(((rows * block) / 256).max(1) as u32),
            groups,
        };
        if !v.contains(&c) {
            v.push(c);
        }
    }
    v
}

/// `t` as `[rows, last]`: rank 1 as one row, rank 2 as it is, higher ranks with the
/// leading dimensions merged where that is a free view (`Tensor::view`).
fn rows_view(op: &'static str, name: &str, t: &Tensor) -> Result<Tensor, OpError> {
    match t.rank() {
        0 => Err(shape_err(
            op,
            format!("`{name}` must have rank >= 1, got a scalar"),
        )),
        2 => Ok(t.clone()),
        r => {
            let last = t.shape()[r - 1];
            let rows: usize = t.shape()[..r - 1].iter().product();
            t.view(&[rows, last]).map_err(|_| {
                shape_err(
                    op,
                    format!(
                        "`{name}` (shape {:?}, strides {:?}): its leading dimensions do not \
                         flatten into rows without a copy (pass a contiguous tensor, or a \
                         view whose rows are evenly spaced)",
                        t.shape(),
                        t.strides()
                    ),
                )
            })
        }
    }
}

/// The shape `[..., n]` of a layer's output for `x [..., K]`.
fn out_shape(x: &Tensor, n: usize) -> Vec<usize> {
    let mut s = x.shape().to_vec();
    if let Some(l) = s.last_mut() {
        *l = n;
    }
    s
}

/// Checks every tensor of a call is on `ops`'s device.
fn same_device(ops: &Ops, op: &'static str, ts: &[(&str, &Tensor)]) -> Result<(), OpError> {
    for (name, t) in ts {
        if !t.device().same(ops.device()) {
            return Err(OpError::Runtime(RuntimeError::WrongDevice(format!(
                "{op}: `{name}` lives on {}, the ops handle on {}",
                t.device().describe(),
                ops.device().describe()
            ))));
        }
    }
    Ok(())
}

/// Checks no output overlaps an input or another output (before the first launch, so a
/// call of several launches fails whole).
fn no_aliasing(
    op: &'static str,
    outputs: &[(&str, &Tensor)],
    inputs: &[(&str, &Tensor)],
) -> Result<(), OpError> {
    for (i, (o, ot)) in outputs.iter().enumerate() {
        for (name, t) in inputs.iter().chain(&outputs[i + 1..]) {
            if ot.overlaps(t) {
                return Err(shape_err(
                    op,
                    format!("`{o}` overlaps `{name}`: an output may share memory with no other argument"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks `t` has dtype `dt` (the op's T).
fn same_dtype(op: &'static str, name: &str, t: &Tensor, dt: DType) -> Result<(), OpError> {
    if t.dtype() == dt {
        Ok(())
    } else {
        Err(dtype_err(
            op,
            format!("`{name}` must be {dt} (x's dtype), got {}", t.dtype()),
        ))
    }
}

/// Checks `t`'s shape.
fn same_shape(op: &'static str, name: &str, t: &Tensor, shape: &[usize]) -> Result<(), OpError> {
    if t.shape() == shape {
        Ok(())
    } else {
        Err(shape_err(
            op,
            format!("`{name}` must have shape {shape:?}, got {:?}", t.shape()),
        ))
    }
}

/// Checks `x [..., K]`, `w [N, K]` and their dtypes (f16, bf16, f32): returns (T, N, K).
fn check_layer(op: &'static str, x: &Tensor, w: &Tensor) -> Result<(DType, usize, usize), OpError> {
    let t = float_dtype(op, x)?;
    same_dtype(op, "w", w, t)?;
    if x.rank() == 0 {
        return Err(shape_err(op, "`x` must have rank >= 1, got a scalar"));
    }
    let k = x.shape()[x.rank() - 1];
    if w.rank() != 2 || w.shape()[1] != k {
        return Err(shape_err(
            op,
            format!(
                "`w` must be [N, K] = [N, {k}] for x {:?}, got {:?}",
                x.shape(),
                w.shape()
            ),
        ));
    }
    Ok((t, w.shape()[0], k))
}

impl Ops {
    // ---------------------------------------------------------------- linear

    /// `act(x @ w.T + bias)` → a new `[..., N]` tensor (x `[..., K]`, w `[N, K]`).
    pub fn linear(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
    ) -> Result<Tensor, OpError> {
        let (t, n, _) = check_layer("linear", x, w)?;
        let y = self.empty(t, &out_shape(x, n))?;
        self.linear_into(x, w, bias, act, &y)?;
        Ok(y)
    }

    /// [`Ops::linear`] into an existing `y [..., N]`.
    pub fn linear_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
        y: &Tensor,
    ) -> Result<(), OpError> {
        self.linear_impl("linear", x, w, bias, act, y, None)
    }

    /// [`Ops::linear`] that also returns the pre-activation `x @ w.T + bias` when there
    /// is an activation (what [`Ops::linear_backward`] reads), written by the same
    /// launch.
    pub fn linear_with_preact(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
    ) -> Result<LinearOut, OpError> {
        let (t, n, _) = check_layer("linear", x, w)?;
        let shape = out_shape(x, n);
        let y = self.empty(t, &shape)?;
        if act == Activation::None {
            self.linear_into(x, w, bias, act, &y)?;
            return Ok(LinearOut { y, preact: None });
        }
        let z = self.empty(t, &shape)?;
        self.linear_with_preact_into(x, w, bias, act, &y, &z)?;
        Ok(LinearOut { y, preact: Some(z) })
    }

    /// [`Ops::linear_with_preact`] into existing `y` and `preact` (both `[..., N]`).
    pub fn linear_with_preact_into(
        &self,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
        y: &Tensor,
        preact: &Tensor,
    ) -> Result<(), OpError> {
        self.linear_impl("linear", x, w, bias, act, y, Some(preact))
    }

    #[allow(clippy::too_many_arguments)]
    fn linear_impl(
        &self,
        op: &'static str,
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
        y: &Tensor,
        z: Option<&Tensor>,
    ) -> Result<(), OpError> {
        let (t, n, _) = check_layer(op, x, w)?;
        let shape = out_shape(x, n);
        same_dtype(op, "y", y, t)?;
        same_shape(op, "y", y, &shape)?;
        if let Some(b) = bias {
            same_dtype(op, "bias", b, t)?;
            same_shape(op, "bias", b, &[n])?;
        }
        if let Some(z) = z {
            same_dtype(op, "preact", z, t)?;
            same_shape(op, "preact", z, &shape)?;
        }
        let mut all = vec![("x", x), ("w", w), ("y", y)];
        all.extend(bias.map(|b| ("bias", b)));
        all.extend(z.map(|z| ("preact", z)));
        same_device(self, op, &all)?;
        if t == DType::F32 && (bias.is_some() || act != Activation::None || z.is_some()) {
            return Err(dtype_err(
                op,
                "f32 takes the plain layer only (no bias, no activation, no pre-activation): \
                 the fused epilogue runs on the tensor cores, f16 or bf16",
            ));
        }
        let x2 = rows_view(op, "x", x)?;
        let y2 = rows_view(op, "y", y)?;
        let z2 = z.map(|z| rows_view(op, "preact", z)).transpose()?;
        let wt = w.transpose(0, 1)?;
        if t == DType::F32 {
            return self.matmul_fma_into(&x2, &wt, &y2);
        }
        self.gemm_impl(op, &x2, &wt, bias, act, &y2, z2.as_ref())
    }

    /// Gradients of [`Ops::linear`] given the upstream gradient `dy [..., N]`, the
    /// layer's input `x`, weight `w` and (with an activation) the saved pre-activation:
    /// `(dx [like x], dw [N, K], db [N] when want_bias_grad)`.
    pub fn linear_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        preact: Option<&Tensor>,
        act: Activation,
        want_bias_grad: bool,
    ) -> Result<(Tensor, Tensor, Option<Tensor>), OpError> {
        const OP: &str = "linear_backward";
        let (t, n, k) = check_layer(OP, x, w)?;
        let dx = self.empty(t, x.shape())?;
        let dw = self.empty(t, &[n, k])?;
        let db = if want_bias_grad {
            Some(self.empty(t, &[n])?)
        } else {
            None
        };
        self.linear_backward_into(dy, x, w, preact, act, &dx, &dw, db.as_ref())?;
        Ok((dx, dw, db))
    }

    /// [`Ops::linear_backward`] into existing `dx` (x's shape), `dw` (`[N, K]`, any 2-D
    /// view with a contiguous dimension) and `db` (`[N]`, computed when given).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_backward_into(
        &self,
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        preact: Option<&Tensor>,
        act: Activation,
        dx: &Tensor,
        dw: &Tensor,
        db: Option<&Tensor>,
    ) -> Result<(), OpError> {
        const OP: &str = "linear_backward";
        let (t, n, k) = check_layer(OP, x, w)?;
        let shape = out_shape(x, n);
        same_dtype(OP, "dy", dy, t)?;
        same_shape(OP, "dy", dy, &shape)?;
        let z = match (act, preact) {
            (Activation::None, _) => None,
            (_, Some(z)) => {
                same_dtype(OP, "preact", z, t)?;
                same_shape(OP, "preact", z, &shape)?;
                Some(z)
            }
            (_, None) => {
                return Err(shape_err(
                    OP,
                    format!(
                        "the {act:?} derivative needs the pre-activation the forward saved \
                         (`linear_with_preact`)"
                    ),
                ))
            }
        };
        same_dtype(OP, "dx", dx, t)?;
        same_shape(OP, "dx", dx, x.shape())?;
        same_dtype(OP, "dw", dw, t)?;
        same_shape(OP, "dw", dw, &[n, k])?;
        if let Some(db) = db {
            same_dtype(OP, "db", db, t)?;
            same_shape(OP, "db", db, &[n])?;
        }
        let mut inputs = vec![("dy", dy), ("x", x), ("w", w)];
        inputs.extend(z.map(|z| ("preact", z)));
        let mut outputs = vec![("dx", dx), ("dw", dw)];
        outputs.extend(db.map(|db| ("db", db)));
        let all: Vec<(&str, &Tensor)> = inputs.iter().chain(&outputs).copied().collect();
        same_device(self, OP, &all)?;
        no_aliasing(OP, &outputs, &inputs)?;
        let dy2 = rows_view(OP, "dy", dy)?;
        let x2 = rows_view(OP, "x", x)?;
        let dx2 = rows_view(OP, "dx", dx)?;
        let m = dy2.shape()[0];
        // `linear_bwd` (with an activation or db) reads dy along its rows; the GEMMs take
        // any layout.
        if (z.is_some() || db.is_some()) && dy2.strides()[1] != 1 && n > 1 {
            return Err(shape_err(
                OP,
                format!(
                    "`dy` needs a contiguous last dimension for the activation's derivative                      and db, strides {:?}",
                    dy.strides()
                ),
            ));
        }
        // dz = dy * act'(z) (and db's partials); dz is dy without an activation.
        let dz = match z {
            Some(z) => {
                let z2 = rows_view(OP, "preact", z)?;
                if z2.strides()[1] != 1 && n > 1 {
                    return Err(shape_err(OP, "`preact` needs a contiguous last dimension"));
                }
                let dz = self.empty(t, &[m, n])?;
                self.linear_act_bwd(t, act, &dy2, &z2, Some(&dz), db)?;
                dz
            }
            None => {
                if let Some(db) = db {
                    self.linear_act_bwd(t, act, &dy2, &dy2, None, Some(db))?;
                }
                dy2
            }
        };
        // dx = dz @ w; dw = dz.T @ x (dz's storage read transposed).
        self.matmul_into(&dz, w, &dx2)?;
        self.matmul_into(&dz.transpose(0, 1)?, &x2, dw)
    }

    /// `linear_bwd` over `[m, n]` (dz written when given: with an activation) and, with
    /// `db`, `linear_bwd_db` over its partial rows: one or two launches, tuned together.
    fn linear_act_bwd(
        &self,
        t: DType,
        act: Activation,
        dy: &Tensor,
        z: &Tensor,
        dz: Option<&Tensor>,
        db: Option<&Tensor>,
    ) -> Result<(), OpError> {
        const OP: &str = "linear_bwd";
        let (m, n) = (dy.shape()[0], dy.shape()[1]);
        if n == 0 {
            return Ok(());
        }
        let cfgs = bwd_configs(m, n, self.sm_count());
        let g_max = cfgs.iter().map(|c| c.groups).max().unwrap_or(1);
        let (workspace, partial_all) = self.take_workspace(&[g_max, n])?;
        // Candidate i's G partial rows (the launches write exactly those; without db the
        // kernel touches none). dy stands in for dz without an activation (not touched
        // then either).
        let parts = cfgs
            .iter()
            .map(|c| partial_all.narrow(0, 0, c.groups))
            .collect::<Result<Vec<_>, _>>()?;
        let dz_t = dz.unwrap_or(dy);
        let main_args = |i: usize| {
            KernelArgs::new()
                .tensor("dy", dy)
                .tensor("z", z)
                .tensor("dz", dz_t)
                .tensor("db_partial", &parts[i])
        };
        let (cb, cr) = super::norm::colsum_tile(n, self.sm_count(), 16);
        let colsum_args = |i: usize| {
            db.map(|db| {
                KernelArgs::new()
                    .tensor("db_partial", &parts[i])
                    .tensor("db", db)
            })
        };
        let resolve = |i: usize| -> Result<Vec<Launch>, OpError> {
            let c = cfgs[i];
            let main = self.kernel(
                "linear_bwd",
                "linear_bwd",
                &[
                    ("T", t.to_string()),
                    ("ACT", act.code().to_string()),
                    ("DB", db.is_some().to_string()),
                    ("ROWS", c.rows.to_string()),
                    ("BLOCK", c.block.to_string()),
                ],
                Some(c.warps),
                &main_args(i),
            )?;
            let grid = grid_x(c.groups * n.div_ceil(c.block))?;
            let mut v = vec![(main, grid)];
            if let Some(args) = colsum_args(i) {
                let colsum = self.kernel(
                    "linear_bwd",
                    "linear_bwd_db",
                    &[
                        ("T", t.to_string()),
                        ("BLOCK", cb.to_string()),
                        ("ROWS", cr.to_string()),
                    ],
                    None,
                    &args,
                )?;
                v.push((colsum, grid_1d(n, cb)?));
            }
            Ok(v)
        };
        let run = |i: usize, launches: &[Launch], pass: Pass| -> Result<f32, OpError> {
            match colsum_args(i) {
                Some(args) => {
                    let [(main, g0), (colsum, g1)] = launches_of::<2>(OP, launches)?;
                    let ms = self.launch_maybe_timed(main, *g0, main_args(i).args(), pass)?;
                    Ok(ms + self.launch_maybe_timed(colsum, *g1, args.args(), pass)?)
                }
                None => {
                    let [(main, g0)] = launches_of::<1>(OP, launches)?;
                    self.launch_maybe_timed(main, *g0, main_args(i).args(), pass)
                }
            }
        };
        // The key: the tensors (dz and db absent or present), the activation.
        let mut key_args = main_args(0);
        if let Some(db) = db {
            key_args.push_tensor("db", db);
        }
        let key = key_args.plan_key(
            PlanKey::new(OP)
                .word(act.code() as u64)
                .word(dz.is_some() as u64 | (db.is_some() as u64) << 1),
        );
        self.launch_tuned_planned(
            key,
            || format!("T={t},M={m},N={n},act={act:?},db={}", db.is_some()),
            || cfgs.iter().map(BwdConfig::label).collect(),
            resolve,
            run,
        )?;
        self.give_back_workspace(workspace);
        Ok(())
    }

    // ---------------------------------------------------------------- matmul

    /// `a [M, K] @ b [K, N]` → a new `[M, N]` tensor of the operands' dtype.
    pub fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
        let (m, n) = (
            a.shape().first().copied().unwrap_or(0),
            b.shape().get(1).copied().unwrap_or(0),
        );
        let c = self.empty(a.dtype(), &[m, n])?;
        self.matmul_into(a, b, &c)?;
        Ok(c)
    }

    /// `c = a @ b` into an existing `[M, N]` tensor (any strides).
    pub fn matmul_into(&self, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<(), OpError> {
        let half = matches!(a.dtype(), DType::F16 | DType::BF16);
        if half && b.dtype() == a.dtype() && c.dtype() == a.dtype() {
            return self.gemm_into(a, b, None, Activation::None, c);
        }
        self.matmul_fma_into(a, b, c)
    }

    /// `c = a @ b` on CUDA cores (`matmul.kg`): any dtype, any strides.
    pub(crate) fn matmul_fma_into(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "matmul";
        let t = float_dtype(OP, a)?;
        if b.dtype() != t || c.dtype() != t {
            return Err(dtype_err(
                OP,
                format!(
                    "operands must share a dtype: a {t}, b {}, c {}",
                    b.dtype(),
                    c.dtype()
                ),
            ));
        }
        if a.rank() != 2 || b.rank() != 2 || c.rank() != 2 {
            return Err(shape_err(OP, "a, b and c must be 2-D"));
        }
        let (m, k) = (a.shape()[0], a.shape()[1]);
        let n = b.shape()[1];
        if b.shape()[0] != k || c.shape() != [m, n] {
            return Err(shape_err(
                OP,
                format!(
                    "{:?} @ {:?} -> {:?} does not fit",
                    a.shape(),
                    b.shape(),
                    c.shape()
                ),
            ));
        }
        let args = KernelArgs::new()
            .tensor("a", a)
            .tensor("b", b)
            .tensor("c", c);
        let kern = self.kernel("matmul", "matmul", &[("T", t.to_string())], None, &args)?;
        self.launch_args(&kern, grid_2d(m, BM, n, BN)?, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bwd_configs_cover_every_shape() {
        for (m, n) in [
            (1usize, 1usize),
            (7, 4097),
            (4097, 7),
            (16384, 50304),
            (1000, 127),
        ] {
            let c = bwd_configs(m, n, 132);
            assert!(!c.is_empty());
            for c in &c {
                assert!(
                    c.groups >= 1 && c.groups <= m.div_ceil(c.rows).max(1),
                    "{m}x{n} {c:?}"
                );
                assert!(
                    c.rows.is_power_of_two() && c.block.is_power_of_two(),
                    "{c:?}"
                );
                assert!((1..=8).contains(&c.warps), "{c:?}");
                assert!(c.rows * c.block <= 8192, "{c:?}");
            }
        }
        // The default: 4096-element tiles at 8 warps, about 4 blocks per SM.
        let c = bwd_configs(8192, 8192, 132)[0];
        assert_eq!((c.rows, c.block, c.warps), (16, 256, 8));
        assert!(
            c.groups * 32 >= 4 * 132 && (c.groups - 1) * 32 < 4 * 132,
            "{c:?}"
        );
    }
}
