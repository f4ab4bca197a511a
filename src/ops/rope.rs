//! Rotary position embedding, Llama's rotate-half form (`kernels-src/rope.kg`), forward
//! and backward, plus the cos/sin tables.
//!
//! Assumes: x `[B, S, H, D]` contiguous (viewed as `[B*S*H, D]`; position of row r is
//! `(r / H) % S`), D even; cos, sin `[>= S, D/2]` of one float dtype C (f32 tables from
//! [`Ops::rope_tables`], or T), last stride 1. out has x's shape and dtype and may not
//! overlap x (the launch rejects it).
//!
//! Guarantees: `out1 = x1*cos - x2*sin, out2 = x2*cos + x1*sin` (the backward uses -sin,
//! which is the exact transpose of the rotation) in f32, rounded to T once. The kernel is
//! specialized on HEAD_DIM = D; ROWS (rows per block) divides H, so each block loads one
//! table row: candidates gcd(H, 16), gcd(H, 32), gcd(H, 8), the first the default; on a
//! GPU the first call per shape picks the fastest through [`Ops::tuner`].

use super::plan::PlanKey;
use super::{as_rows, dtype_err, float_dtype, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_1d, Device, Tensor};

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Ops {
    /// `cos, sin` f32 `[seq_len, head_dim / 2]`: angle `p * base^(-2i / head_dim)` for
    /// position p and pair i, computed in f64 on the host and rounded once.
    pub fn rope_tables(
        device: &Device,
        seq_len: usize,
        head_dim: usize,
        base: f64,
    ) -> Result<(Tensor, Tensor), OpError> {
        Ops::rope_tables_as(device, DType::F32, seq_len, head_dim, base)
    }

    /// [`Ops::rope_tables`] rounded once to `dtype` (f32, f16 or bf16). Half tables are
    /// what Hugging Face's Llama passes (`cos.to(x.dtype)`): half the table traffic, and
    /// the rotation then carries the table's rounding (2^-9 relative for bf16).
    pub fn rope_tables_as(
        device: &Device,
        dtype: DType,
        seq_len: usize,
        head_dim: usize,
        base: f64,
    ) -> Result<(Tensor, Tensor), OpError> {
        const OP: &str = "rope_tables";
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(super::dtype_err(
                OP,
                format!("tables must be f32, f16 or bf16, got {dtype}"),
            ));
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(shape_err(
                OP,
                format!("head_dim {head_dim} must be even and > 0"),
            ));
        }
        if !(base.is_finite() && base > 0.0) {
            return Err(shape_err(
                OP,
                format!("base {base} must be finite and positive"),
            ));
        }
        let half = head_dim / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| base.powf(-((2 * i) as f64) / head_dim as f64))
            .collect();
        let mut cos = Vec::with_capacity(seq_len * half);
        let mut sin = Vec::with_capacity(seq_len * half);
        for p in 0..seq_len {
            for f in &inv_freq {
                let a = p as f64 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Ok((
            device.from_f64(dtype, &[seq_len, half], &cos)?,
            device.from_f64(dtype, &[seq_len, half], &sin)?,
        ))
    }

    /// RoPE of `x [B, S, H, D]` with tables `cos, sin [>= S, D/2]`.
    pub fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, OpError> {
        let t = float_dtype("rope", x)?;
        let out = self.empty(t, x.shape())?;
        self.rope_into(x, cos, sin, &out)?;
        Ok(out)
    }

    /// [`Ops::rope`] into an existing `out`.
    pub fn rope_into(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        out: &Tensor,
    ) -> Result<(), OpError> {
        self.rope_launch("rope", x, cos, sin, out, false)
    }

    /// Gradient of [`Ops::rope`]: `dx` from `dy [B, S, H, D]` (the inverse rotation).
    pub fn rope_backward(
        &self,
        dy: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Tensor, OpError> {
        let t = float_dtype("rope_backward", dy)?;
        let dx = self.empty(t, dy.shape())?;
        self.rope_backward_into(dy, cos, sin, &dx)?;
        Ok(dx)
    }

    /// [`Ops::rope_backward`] into an existing `dx`.
    pub fn rope_backward_into(
        &self,
        dy: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        dx: &Tensor,
    ) -> Result<(), OpError> {
        self.rope_launch("rope_backward", dy, cos, sin, dx, true)
    }

    fn rope_launch(
        &self,
        op: &'static str,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        out: &Tensor,
        backward: bool,
    ) -> Result<(), OpError> {
        let t = float_dtype(op, x)?;
        let &[b, s, h, d] = x.shape() else {
            return Err(shape_err(
                op,
                format!("expected x of shape [B, S, H, D], got {:?}", x.shape()),
            ));
        };
        if d == 0 || d % 2 != 0 {
            return Err(shape_err(op, format!("head dim {d} must be even and > 0")));
        }
        super::expect(op, "out", out, t, x.shape())?;
        let c = float_dtype(op, cos)?;
        if sin.dtype() != c {
            return Err(dtype_err(
                op,
                format!("cos and sin must share a dtype: {c} vs {}", sin.dtype()),
            ));
        }
        for (name, tab) in [("cos", cos), ("sin", sin)] {
            if tab.rank() != 2 || tab.shape()[0] < s || tab.shape()[1] != d / 2 {
                return Err(shape_err(
                    op,
                    format!(
                        "`{name}` must have shape [>= {s}, {}], got {:?}",
                        d / 2,
                        tab.shape()
                    ),
                ));
            }
        }
        if h > i32::MAX as usize || s > i32::MAX as usize {
            return Err(shape_err(op, "H and S must fit in i32"));
        }
        let rows = b * s * h;
        let x2 = as_rows(op, x)?;
        let o2 = as_rows(op, out)?;
        let cands = || -> Vec<usize> {
            let mut v: Vec<usize> = Vec::new();
            for m in [16, 32, 8] {
                let r = gcd(h.max(1), m);
                if !v.contains(&r) {
                    v.push(r);
                }
            }
            v
        };
        let token_grid = s <= 65535 && b <= 65535;
        let name = if backward { "rope_bwd" } else { "rope" };
        let args = KernelArgs::new()
            .tensor("x", &x2)
            .tensor("cos", cos)
            .tensor("sin", sin)
            .tensor("out", &o2)
            .scalar("n_heads", h as i32)
            .scalar("seq_len", s as i32);
        let key = PlanKey::new(name)
            .word(b as u64)
            .word(s as u64)
            .word(h as u64);
        self.launch_planned(
            key,
            &args,
            || format!("T={t},C={c},B={b},S={s},H={h},D={d},bwd={backward}"),
            || cands().iter().map(|r| format!("ROWS={r}")).collect(),
            |i| {
                let r = cands()[i];
                let k = self.kernel(
                    "rope",
                    "rope",
                    &[
                        ("T", t.to_string()),
                        ("C", c.to_string()),
                        ("HEAD_DIM", d.to_string()),
                        ("ROWS", r.to_string()),
                        ("BACKWARD", backward.to_string()),
                        ("TOKEN_GRID", token_grid.to_string()),
                    ],
                    None,
                    &args,
                )?;
                // Every candidate divides H; the token grid [H / r, S, B] needs S and B
                // within the grid's y and z limits.
                let grid = if token_grid {
                    [(h / r) as u32, s as u32, b as u32]
                } else {
                    grid_1d(rows, r)?
                };
                Ok((k, grid))
            },
        )
    }
}
