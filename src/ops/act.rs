//! Activations: SwiGLU (`out = silu(gate) * up`) and ReLU, forward and backward
//! (`kernels-src/swiglu.kg`, `relu.kg`).
//!
//! Assumes: every operand of one call has the same float dtype T (f32, f16, bf16).
//! SwiGLU takes `[..., H]` tensors that are contiguous or 2-D views with a row stride
//! (last stride 1); the concatenated form takes `x [..., 2H] = [gate | up]` and passes the
//! two halves to the same kernels as `narrow` views (no copy), and its backward writes
//! `dx [..., 2H] = [dgate | dup]` the same way. ReLU takes contiguous tensors of any shape.
//! Outputs may not overlap inputs (the launch rejects it; no in-place forms).
//!
//! Guarantees: SwiGLU in f32, rounded to T once (sigmoid via ex2.approx on the GPU);
//! ReLU exact, NaN propagating like torch (relu(NaN) = NaN). Tile shapes: SwiGLU tiles of
//! 1024 / 2048 / 4096 elements ([ROWS, BLOCK], BLOCK the row's power of two up to the
//! tile) at ~8 elements per thread, plus 2048 at 16 (on an H100, bf16 8192×11008: 1024
//! wins, ~198 µs vs 203–222); ReLU BLOCK 2048 / 4096 / 1024; the first is the default;
//! on a GPU the first call per shape picks the fastest through [`Ops::tuner`].

use super::plan::PlanKey;
use super::{as_rows, default_warps, expect, float_dtype, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_1d, grid_x, Tensor};

/// Elements per SwiGLU tile, the default first.
const SWIGLU_TILES: [usize; 3] = [1024, 2048, 4096];
/// ReLU BLOCK candidates, the default first.
const RELU_BLOCKS: [usize; 3] = [2048, 4096, 1024];

/// The tuner's labels of [`swiglu_configs`].
fn swiglu_labels(cfgs: &[(usize, usize, u32)]) -> Vec<String> {
    cfgs.iter()
        .map(|(r, b, w)| format!("ROWS={r},BLOCK={b},warps={w}"))
        .collect()
}

/// (ROWS, BLOCK, warps) candidates for rows of `h` elements: tiles of 1024, 2048, 4096
/// elements at about 8 per thread, then 2048 at 16 per thread.
fn swiglu_configs(h: usize) -> Vec<(usize, usize, u32)> {
    let p = h.next_power_of_two().max(1);
    let mut v = Vec::new();
    let tile = |e: usize| if p >= e { (1, e) } else { (e / p, p) };
    for e in SWIGLU_TILES {
        let (r, b) = tile(e);
        let c = (r, b, default_warps(e));
        if !v.contains(&c) {
            v.push(c);
        }
    }
    let (r, b) = tile(2048);
    let c = (r, b, default_warps(1024));
    if !v.contains(&c) {
        v.push(c);
    }
    // Rows that are not a power of two (11008 = 43 * 256): a BLOCK that divides the row
    // leaves no masked tail tile (BLOCK 1024 masks a quarter of every 11th tile there).
    let d = (1usize << h.trailing_zeros().min(10)).min(h);
    if d >= 128 && d < h {
        for e in [1024usize, 2048] {
            let c = (e / d, d, default_warps(e));
            if !v.contains(&c) {
                v.push(c);
            }
        }
    }
    v
}

/// The 1-D grid of the SwiGLU kernels: one block per [ROWS, BLOCK] tile, column tiles
/// fastest (see `kernels-src/swiglu.kg`).
fn swiglu_grid(rows: usize, r: usize, h: usize, b: usize) -> Result<[u32; 3], OpError> {
    let tiles = rows
        .div_ceil(r.max(1))
        .checked_mul(h.div_ceil(b.max(1)))
        .filter(|&n| n <= i32::MAX as usize)
        .ok_or_else(|| shape_err("swiglu", format!("{rows}x{h} needs too many tiles")))?;
    Ok(grid_x(tiles)?)
}

/// `t` as `[rows, last]` (rank 1 included).
fn rows_2d(op: &'static str, t: &Tensor) -> Result<Tensor, OpError> {
    match t.rank() {
        0 => Err(shape_err(
            op,
            "expected a tensor of rank >= 1, got a scalar",
        )),
        1 => Ok(t.reshape(&[1, t.shape()[0]])?),
        _ => as_rows(op, t),
    }
}

/// The shape of `x [..., 2H]` with the last dim halved.
fn half_shape(op: &'static str, x: &Tensor) -> Result<Vec<usize>, OpError> {
    let mut s = x.shape().to_vec();
    match s.last_mut() {
        None => Err(shape_err(
            op,
            "expected a tensor of rank >= 1, got a scalar",
        )),
        Some(l) if *l % 2 != 0 => Err(shape_err(
            op,
            format!("the last dimension ({l}) must be even: [gate | up]"),
        )),
        Some(l) => {
            *l /= 2;
            Ok(s)
        }
    }
}

/// The two halves `[:, :H]`, `[:, H:]` of a `[rows, 2H]` view.
fn halves(t: &Tensor) -> Result<(Tensor, Tensor), OpError> {
    let h = t.shape()[1] / 2;
    Ok((t.narrow(1, 0, h)?, t.narrow(1, h, h)?))
}

fn flat(op: &'static str, name: &str, t: &Tensor) -> Result<Tensor, OpError> {
    if !t.is_contiguous() {
        return Err(shape_err(
            op,
            format!(
                "`{name}` must be contiguous (shape {:?}, strides {:?})",
                t.shape(),
                t.strides()
            ),
        ));
    }
    Ok(t.flatten()?)
}

impl Ops {
    // ---------------------------------------------------------------- SwiGLU

    /// `silu(gate) * up` for `gate`, `up` of one shape `[..., H]`.
    pub fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor, OpError> {
        let t = float_dtype("swiglu", gate)?;
        let out = self.empty(t, gate.shape())?;
        self.swiglu_into(gate, up, &out)?;
        Ok(out)
    }

    /// [`Ops::swiglu`] into an existing `out` (gate's shape and dtype).
    pub fn swiglu_into(&self, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<(), OpError> {
        const OP: &str = "swiglu";
        let t = float_dtype(OP, gate)?;
        expect(OP, "up", up, t, gate.shape())?;
        expect(OP, "out", out, t, gate.shape())?;
        self.swiglu_2d(
            &rows_2d(OP, gate)?,
            &rows_2d(OP, up)?,
            &rows_2d(OP, out)?,
            t,
        )
    }

    /// SwiGLU of the concatenated `x [..., 2H] = [gate | up]` → `[..., H]`.
    pub fn swiglu_concat(&self, x: &Tensor) -> Result<Tensor, OpError> {
        let t = float_dtype("swiglu_concat", x)?;
        let out = self.empty(t, &half_shape("swiglu_concat", x)?)?;
        self.swiglu_concat_into(x, &out)?;
        Ok(out)
    }

    /// [`Ops::swiglu_concat`] into an existing `out [..., H]`.
    pub fn swiglu_concat_into(&self, x: &Tensor, out: &Tensor) -> Result<(), OpError> {
        const OP: &str = "swiglu_concat";
        let t = float_dtype(OP, x)?;
        expect(OP, "out", out, t, &half_shape(OP, x)?)?;
        let (gate, up) = halves(&rows_2d(OP, x)?)?;
        self.swiglu_2d(&gate, &up, &rows_2d(OP, out)?, t)
    }

    fn swiglu_2d(&self, gate: &Tensor, up: &Tensor, out: &Tensor, t: DType) -> Result<(), OpError> {
        let args = KernelArgs::new()
            .tensor("gate", gate)
            .tensor("up", up)
            .tensor("out", out);
        self.swiglu_launch("swiglu", &args, t)
    }

    /// `swiglu` or `swiglu_bwd` over 2-D views, `args` the kernel's (gate first): the
    /// plan, the tuner's candidates, the launch.
    fn swiglu_launch(
        &self,
        name: &'static str,
        args: &KernelArgs,
        t: DType,
    ) -> Result<(), OpError> {
        let Some((_, gate)) = args.tensors().next() else {
            return Err(shape_err(name, "no gate tensor"));
        };
        let (rows, h) = (gate.shape()[0], gate.shape()[1]);
        let cfgs = swiglu_configs(h);
        self.launch_planned(
            PlanKey::new(name),
            args,
            || format!("T={t},rows={rows},H={h},stride={}", gate.strides()[0]),
            || swiglu_labels(&cfgs),
            |i| {
                let (r, b, w) = cfgs[i];
                let k = self.kernel(
                    "swiglu",
                    name,
                    &[
                        ("T", t.to_string()),
                        ("ROWS", r.to_string()),
                        ("BLOCK", b.to_string()),
                    ],
                    Some(w),
                    args,
                )?;
                Ok((k, swiglu_grid(rows, r, h, b)?))
            },
        )
    }

    /// Gradients of [`Ops::swiglu`]: `(dgate, dup)`.
    pub fn swiglu_backward(
        &self,
        gate: &Tensor,
        up: &Tensor,
        dout: &Tensor,
    ) -> Result<(Tensor, Tensor), OpError> {
        let t = float_dtype("swiglu_backward", gate)?;
        let dgate = self.empty(t, gate.shape())?;
        let dup = self.empty(t, gate.shape())?;
        self.swiglu_backward_into(gate, up, dout, &dgate, &dup)?;
        Ok((dgate, dup))
    }

    /// [`Ops::swiglu_backward`] into existing `dgate`, `dup`.
    pub fn swiglu_backward_into(
        &self,
        gate: &Tensor,
        up: &Tensor,
        dout: &Tensor,
        dgate: &Tensor,
        dup: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "swiglu_backward";
        let t = float_dtype(OP, gate)?;
        for (name, x) in [("up", up), ("dout", dout), ("dgate", dgate), ("dup", dup)] {
            expect(OP, name, x, t, gate.shape())?;
        }
        self.swiglu_backward_2d(
            [&rows_2d(OP, gate)?, &rows_2d(OP, up)?, &rows_2d(OP, dout)?],
            [&rows_2d(OP, dgate)?, &rows_2d(OP, dup)?],
            t,
        )
    }

    /// Gradient of [`Ops::swiglu_concat`]: `dx [..., 2H] = [dgate | dup]`.
    pub fn swiglu_concat_backward(&self, x: &Tensor, dout: &Tensor) -> Result<Tensor, OpError> {
        let t = float_dtype("swiglu_concat_backward", x)?;
        let dx = self.empty(t, x.shape())?;
        self.swiglu_concat_backward_into(x, dout, &dx)?;
        Ok(dx)
    }

    /// [`Ops::swiglu_concat_backward`] into an existing `dx` (x's shape).
    pub fn swiglu_concat_backward_into(
        &self,
        x: &Tensor,
        dout: &Tensor,
        dx: &Tensor,
    ) -> Result<(), OpError> {
        const OP: &str = "swiglu_concat_backward";
        let t = float_dtype(OP, x)?;
        expect(OP, "dout", dout, t, &half_shape(OP, x)?)?;
        expect(OP, "dx", dx, t, x.shape())?;
        let (gate, up) = halves(&rows_2d(OP, x)?)?;
        let (dgate, dup) = halves(&rows_2d(OP, dx)?)?;
        self.swiglu_backward_2d([&gate, &up, &rows_2d(OP, dout)?], [&dgate, &dup], t)
    }

    fn swiglu_backward_2d(
        &self,
        [gate, up, dout]: [&Tensor; 3],
        [dgate, dup]: [&Tensor; 2],
        t: DType,
    ) -> Result<(), OpError> {
        let args = KernelArgs::new()
            .tensor("gate", gate)
            .tensor("up", up)
            .tensor("dout", dout)
            .tensor("dgate", dgate)
            .tensor("dup", dup);
        self.swiglu_launch("swiglu_bwd", &args, t)
    }

    // ---------------------------------------------------------------- ReLU

    /// `max(x, 0)` (NaN passes through), any shape, contiguous.
    pub fn relu(&self, x: &Tensor) -> Result<Tensor, OpError> {
        let t = float_dtype("relu", x)?;
        let y = self.empty(t, x.shape())?;
        self.relu_into(x, &y)?;
        Ok(y)
    }

    /// [`Ops::relu`] into an existing `y` (x's shape and dtype).
    pub fn relu_into(&self, x: &Tensor, y: &Tensor) -> Result<(), OpError> {
        const OP: &str = "relu";
        let t = float_dtype(OP, x)?;
        expect(OP, "y", y, t, x.shape())?;
        let (xf, yf) = (flat(OP, "x", x)?, flat(OP, "y", y)?);
        self.relu_flat(
            "relu",
            t,
            &KernelArgs::new().tensor("x", &xf).tensor("y", &yf),
        )
    }

    /// `dy` where `x > 0`, else 0 (torch's threshold_backward); `x` may be the forward
    /// input or output.
    pub fn relu_backward(&self, x: &Tensor, dy: &Tensor) -> Result<Tensor, OpError> {
        let t = float_dtype("relu_backward", x)?;
        let dx = self.empty(t, x.shape())?;
        self.relu_backward_into(x, dy, &dx)?;
        Ok(dx)
    }

    /// [`Ops::relu_backward`] into an existing `dx`.
    pub fn relu_backward_into(&self, x: &Tensor, dy: &Tensor, dx: &Tensor) -> Result<(), OpError> {
        const OP: &str = "relu_backward";
        let t = float_dtype(OP, x)?;
        expect(OP, "dy", dy, t, x.shape())?;
        expect(OP, "dx", dx, t, x.shape())?;
        let (xf, dyf, dxf) = (flat(OP, "x", x)?, flat(OP, "dy", dy)?, flat(OP, "dx", dx)?);
        let args = KernelArgs::new()
            .tensor("x", &xf)
            .tensor("dy", &dyf)
            .tensor("dx", &dxf);
        self.relu_flat("relu_bwd", t, &args)
    }

    /// `relu` (`args`: x, y) or `relu_bwd` (x, dy, dx) over flat tensors.
    fn relu_flat(&self, name: &'static str, t: DType, args: &KernelArgs) -> Result<(), OpError> {
        let n = args.tensors().last().map_or(0, |(_, out)| out.numel());
        let blocks = || -> Vec<usize> {
            RELU_BLOCKS
                .iter()
                .map(|&b| b.min(n.next_power_of_two().max(32)))
                .fold(Vec::new(), |mut v, b| {
                    if !v.contains(&b) {
                        v.push(b);
                    }
                    v
                })
        };
        self.launch_planned(
            PlanKey::new(name),
            args,
            || format!("T={t},n={n}"),
            || blocks().iter().map(|b| format!("BLOCK={b}")).collect(),
            |i| {
                let b = blocks()[i];
                let k = self.kernel(
                    "relu",
                    name,
                    &[("T", t.to_string()), ("BLOCK", b.to_string())],
                    None,
                    args,
                )?;
                Ok((k, grid_1d(n, b)?))
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::swiglu_configs;

    #[test]
    fn swiglu_candidates() {
        // The default first: a 1024-element tile, BLOCK the row's power of two up to it.
        assert_eq!(swiglu_configs(11008)[0], (1, 1024, 4));
        assert_eq!(swiglu_configs(300)[0], (2, 512, 4));
        // 11008 = 43 * 256: tiles of whole 256-wide column spans are candidates too.
        assert!(swiglu_configs(11008).contains(&(4, 256, 4)));
        assert!(swiglu_configs(11008).contains(&(8, 256, 8)));
        // Powers of two and odd widths add nothing of the kind.
        assert!(swiglu_configs(4096).iter().all(|c| c.1 >= 1024));
        assert!(swiglu_configs(4097).iter().all(|c| c.1 >= 1024));
        for h in [1usize, 7, 1000, 4097, 11008, 1 << 20] {
            for (r, b, w) in swiglu_configs(h) {
                assert!(
                    r >= 1 && b >= 1 && (1..=16).contains(&w),
                    "{h}: {r} {b} {w}"
                );
            }
        }
    }
}
