//! `rope.kg`: rotary position embedding (rotate-half), forward and BACKWARD = true.
//!
//! x is [B * S * H, D] (token-major, heads inner); the cos / sin tables are
//! [S_table, D / 2] with S_table >= S (some cases give a longer table, as a model with a
//! precomputed max-length table would). The tables hold cos / sin of random angles, not
//! of p * base^(-2i/D): the kernel must not depend on their values, and position 0's
//! sin(0) = 0 would break the table's never-zero input rule. Shapes cover the one-token-
//! per-block path (ROWS divides H) and the row-by-row fallback.

use super::*;

/// One RoPE shape: x is [batch * seq * heads, head_dim].
#[derive(Clone, Copy, Debug)]
pub struct RopeShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Rows of the cos / sin tables (>= seq).
    pub table_rows: usize,
}

impl RopeShape {
    pub fn rows(&self) -> usize {
        self.batch * self.seq * self.heads
    }
}

const fn shape(batch: usize, seq: usize, heads: usize, head_dim: usize, extra: usize) -> RopeShape {
    RopeShape {
        batch,
        seq,
        heads,
        head_dim,
        table_rows: seq + extra,
    }
}

/// (shape, T, C, ROWS, BACKWARD, TOKEN_GRID).
type Row = (RopeShape, DType, DType, usize, bool, bool);

const QUICK: &[Row] = &[
    // rows = 1, D = 2 (a half of one element).
    (
        shape(1, 1, 1, 2, 0),
        DType::BF16,
        DType::F32,
        1,
        false,
        false,
    ),
    // rows = 7, ROWS = 4 does not divide H = 1: the fallback, tail rows masked.
    (
        shape(1, 7, 1, 8, 0),
        DType::F32,
        DType::F32,
        4,
        false,
        false,
    ),
    (
        shape(2, 7, 4, 16, 3),
        DType::BF16,
        DType::F32,
        4,
        true,
        false,
    ),
    (
        shape(2, 7, 4, 16, 3),
        DType::BF16,
        DType::F32,
        4,
        true,
        true,
    ),
    // D / 2 = 3, H = 3 with ROWS = 2: fallback, rows spanning two tokens.
    (
        shape(1, 5, 3, 6, 0),
        DType::F16,
        DType::F32,
        2,
        false,
        false,
    ),
    (
        shape(2, 3, 8, 128, 0),
        DType::BF16,
        DType::F32,
        8,
        false,
        false,
    ),
    (
        shape(1, 4, 32, 128, 1),
        DType::BF16,
        DType::BF16,
        16,
        true,
        true,
    ),
    // The token grid with several blocks per token (H / ROWS = 3) and batches.
    (
        shape(3, 5, 24, 32, 2),
        DType::F32,
        DType::F32,
        8,
        false,
        true,
    ),
    // ROWS = 6 (not a power of two) dividing H = 6.
    (
        shape(1, 7, 6, 64, 0),
        DType::F32,
        DType::F32,
        6,
        false,
        true,
    ),
    (
        shape(1, 3, 4, 64, 0),
        DType::F16,
        DType::F16,
        4,
        true,
        false,
    ),
];

const FULL: &[Row] = &[
    // rows = 1000 with H = 1 (one head per token).
    (
        shape(1, 1000, 1, 128, 0),
        DType::BF16,
        DType::F32,
        8,
        false,
        false,
    ),
    (
        shape(1, 1000, 1, 128, 0),
        DType::BF16,
        DType::F32,
        1,
        false,
        true,
    ),
    (
        shape(2, 125, 4, 128, 5),
        DType::BF16,
        DType::F32,
        4,
        true,
        true,
    ),
    (
        shape(1, 64, 32, 128, 0),
        DType::BF16,
        DType::F32,
        16,
        false,
        false,
    ),
    (
        shape(1, 100, 5, 64, 0),
        DType::F16,
        DType::F32,
        4,
        false,
        false,
    ),
    (
        shape(1, 33, 12, 96, 0),
        DType::F32,
        DType::F32,
        12,
        true,
        true,
    ),
];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let rows = QUICK
        .iter()
        .chain(if sizes == SizeSet::Full { FULL } else { &[] });
    rows.map(|&(s, t, c, r, bwd, token_grid)| case(seed, s, t, c, r, bwd, token_grid))
        .collect()
}

/// The rotation in f64: forward out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin; the
/// backward negates sin. Row r uses table row (r / heads) % seq.
pub fn reference(x: &[f64], cos: &[f64], sin: &[f64], s: RopeShape, backward: bool) -> Vec<f64> {
    let (d, half) = (s.head_dim, s.head_dim / 2);
    let sign = if backward { -1.0 } else { 1.0 };
    let mut out = vec![0.0; x.len()];
    for (r, row) in x.chunks(d).enumerate() {
        let p = (r / s.heads) % s.seq;
        for i in 0..half {
            let (c, sn) = (cos[p * half + i], sign * sin[p * half + i]);
            let (x1, x2) = (row[i], row[half + i]);
            out[r * d + i] = x1 * c - x2 * sn;
            out[r * d + half + i] = x2 * c + x1 * sn;
        }
    }
    out
}

/// One `rope` case; `token_grid` (which needs ROWS to divide H) launches the
/// [H / ROWS, S, B] grid of `TOKEN_GRID = true`, else the 1-D grid.
pub fn case(
    seed: u64,
    s: RopeShape,
    dtype: DType,
    table: DType,
    rows_per_block: usize,
    backward: bool,
    token_grid: bool,
) -> Case {
    let label = format!(
        "rope T={dtype} C={table} ROWS={rows_per_block} BACKWARD={backward} TOKEN_GRID={token_grid} B={} S={} H={} D={} table={}",
        s.batch, s.seq, s.heads, s.head_dim, s.table_rows
    );
    assert!(
        !token_grid || s.heads.is_multiple_of(rows_per_block),
        "the token grid needs ROWS to divide H"
    );
    let mut rng = Rng::for_case(seed, &label);
    let rows = s.rows();
    let half = s.head_dim / 2;
    let x = random_tensor(&mut rng, dtype, &[rows, s.head_dim], |r| r.normalish());
    let angles: Vec<f64> = (0..s.table_rows * half)
        .map(|_| rng.uniform(0.0, std::f64::consts::TAU))
        .collect();
    let nonzero = |v: f64| {
        if v.abs() < 1e-3 {
            1e-3_f64.copysign(v)
        } else {
            v
        }
    };
    let cos: Vec<f64> = angles.iter().map(|a| nonzero(a.cos())).collect();
    let sin: Vec<f64> = angles.iter().map(|a| nonzero(a.sin())).collect();
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(HostTensor::from_f64(table, &[s.table_rows, half], &cos)),
        ArgValue::Tensor(HostTensor::from_f64(table, &[s.table_rows, half], &sin)),
        ArgValue::Tensor(poisoned(dtype, &[rows, s.head_dim])),
        ArgValue::Scalar(Scalar::Int(s.heads as i64, DType::I32)),
        ArgValue::Scalar(Scalar::Int(s.seq as i64, DType::I32)),
    ];
    Case {
        options: Default::default(),
        kernel: "rope",
        kernel_name: Some("rope"),
        label,
        defines: defines(&[
            ("T", dtype.to_string()),
            ("C", table.to_string()),
            ("HEAD_DIM", s.head_dim.to_string()),
            ("ROWS", rows_per_block.to_string()),
            ("BACKWARD", backward.to_string()),
            ("TOKEN_GRID", token_grid.to_string()),
        ]),
        tensor_align: aligns(&["x", "cos", "sin", "out", "n_heads", "seq_len"], &args),
        grid: if token_grid {
            [
                (s.heads / rows_per_block) as u32,
                s.seq as u32,
                s.batch as u32,
            ]
        } else {
            [cdiv(rows, rows_per_block) as u32, 1, 1]
        },
        args,
        outputs: vec![3],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let cos = tensor_at(args, 1).to_f64_vec();
            let sin = tensor_at(args, 2).to_f64_vec();
            vec![reference(&x, &cos, &sin, s, backward)]
        }),
        // f32: two products and a sum, which can cancel (absolute floor).
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 1e-6,
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backward reference is the transpose of the forward rotation:
    /// <rope(x), dy> = <x, rope_bwd(dy)> for every x, dy; and the forward with real
    /// angles preserves each pair's norm.
    #[test]
    fn backward_is_the_adjoint_of_forward() {
        let s = shape(2, 3, 2, 8, 1);
        let mut rng = Rng::new(5);
        let n = s.rows() * s.head_dim;
        let x: Vec<f64> = (0..n).map(|_| rng.normalish()).collect();
        let dy: Vec<f64> = (0..n).map(|_| rng.normalish()).collect();
        let angles: Vec<f64> = (0..s.table_rows * s.head_dim / 2)
            .map(|_| rng.uniform(0.0, std::f64::consts::TAU))
            .collect();
        let cos: Vec<f64> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f64> = angles.iter().map(|a| a.sin()).collect();
        let y = reference(&x, &cos, &sin, s, false);
        let dx = reference(&dy, &cos, &sin, s, true);
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
        assert!((dot(&y, &dy) - dot(&x, &dx)).abs() < 1e-12);
        let half = s.head_dim / 2;
        for r in 0..s.rows() {
            for i in 0..half {
                let o = r * s.head_dim;
                let before = x[o + i].powi(2) + x[o + half + i].powi(2);
                let after = y[o + i].powi(2) + y[o + half + i].powi(2);
                assert!((before - after).abs() < 1e-12);
            }
        }
    }
}
