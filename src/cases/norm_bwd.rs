//! `rmsnorm_bwd.kg` and `layernorm_bwd.kg`: the norm backward passes (dx plus per-block
//! f32 partials of the weight/bias gradients) and the column sums that finish dw / db.
//!
//! The saved statistics (rstd, mean) are inputs: the cases compute them from x in f64
//! and round them to f32, as the forward kernels would have stored them, and the
//! references use those same f32 values. The partial references follow the kernels'
//! grid-stride assignment (row r belongs to block r % G), so grids smaller than, equal
//! to and larger than `rows` are all checked exactly, including the zero rows of blocks
//! without rows.

use super::*;

/// (rows, cols, dtype, BLOCK, G): one tile per row (cols <= BLOCK) and the multi-tile
/// fallback, grids below / at / above the row count.
const QUICK_BWD: &[(usize, usize, DType, usize, usize)] = &[
    (1, 1, DType::BF16, 1024, 1),
    (7, 7, DType::F32, 1024, 3),
    (7, 7, DType::BF16, 1024, 9),
    (3, 1000, DType::F16, 1024, 3),
    (3, 1000, DType::BF16, 1000, 2),
    (4, 768, DType::BF16, 768, 2),
    (3, 4096, DType::BF16, 4096, 2),
    (5, 4097, DType::F32, 1024, 2),
    (5, 4097, DType::BF16, 4096, 5),
    (6, 1000, DType::F16, 256, 4),
];

const FULL_BWD: &[(usize, usize, DType, usize, usize)] = &[
    (1000, 4097, DType::BF16, 1024, 132),
    (200, 4096, DType::BF16, 4096, 66),
    (1000, 768, DType::BF16, 768, 132),
    (1000, 1000, DType::F32, 1024, 7),
    (100, 4097, DType::F16, 2048, 33),
    (1000, 7, DType::F32, 1024, 1000),
];

/// (G, cols, dtype, BLOCK, ROWS) for the column sums.
const QUICK_SUM: &[(usize, usize, DType, usize, usize)] = &[
    (1, 1, DType::BF16, 128, 16),
    (7, 7, DType::F32, 128, 16),
    (3, 1000, DType::F16, 128, 16),
    (20, 4097, DType::BF16, 128, 8),
    (5, 768, DType::F32, 100, 3),
    (17, 4096, DType::BF16, 256, 4),
];

const FULL_SUM: &[(usize, usize, DType, usize, usize)] = &[
    (264, 4096, DType::BF16, 128, 16),
    (1000, 1000, DType::F32, 128, 16),
    (132, 4097, DType::F16, 64, 32),
];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    let full = sizes == SizeSet::Full;
    let bwd = QUICK_BWD.iter().chain(if full { FULL_BWD } else { &[] });
    for &(r, c, dt, b, g) in bwd {
        v.push(rmsnorm_bwd_case(seed, dt, r, c, b, g));
        v.push(layernorm_bwd_case(seed, dt, r, c, b, g));
    }
    // RESIDUAL (add_rmsnorm's backward: dres joins dx): one tile and several, dtypes.
    let residual: &[(usize, usize, DType, usize, usize)] = &[
        (7, 7, DType::F32, 1024, 3),
        (5, 1000, DType::BF16, 1024, 2),
        (6, 4097, DType::F16, 1024, 4),
        (9, 4096, DType::BF16, 4096, 4),
    ];
    for &(r, c, dt, b, g) in residual {
        v.push(rmsnorm_bwd_residual_case(seed, dt, r, c, b, g));
    }
    let sums = QUICK_SUM.iter().chain(if full { FULL_SUM } else { &[] });
    for &(g, c, dt, b, rows) in sums {
        v.push(rmsnorm_dw_case(seed, dt, g, c, b, rows));
        v.push(layernorm_dwdb_case(seed, dt, g, c, b, rows));
    }
    v
}

/// Tolerance for f32 sums of `terms` values of magnitude up to about `magnitude`
/// (partials and column sums): the worst-case f32 summation error is about
/// terms * 2^-24 * magnitude per sum.
fn sum_tolerance(terms: usize, magnitude: f64) -> Tolerance {
    Tolerance {
        rel: 1e-5,
        abs: 1e-6 + terms.max(1) as f64 * 6e-8 * magnitude,
    }
}

/// dx's tolerance: an f32 computation rounded once (terms are O(1); cancellation near
/// zero is covered by the absolute floor), joined with the partials' tolerance.
fn bwd_tolerance(dtype: DType, rows: usize, grid: usize) -> Tolerance {
    let dx = Tolerance::for_dtype(
        dtype,
        Tolerance {
            rel: 1e-5,
            abs: 1e-5,
        },
    );
    // |dy * xhat| stays below ~20 for these inputs.
    dx.max(sum_tolerance(cdiv(rows, grid), 20.0))
}

/// Saved statistics as the forward kernel would store them (f32): rstd for RMSNorm.
fn rms_rstd(x: &[f64], cols: usize, eps: f64) -> Vec<f64> {
    x.chunks(cols)
        .map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
            (1.0 / (ms + eps).sqrt()) as f32 as f64
        })
        .collect()
}

/// (mean, rstd) as f32 values, torch's biased variance.
fn ln_stats(x: &[f64], cols: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    x.chunks(cols)
        .map(|row| {
            let mu = row.iter().sum::<f64>() / cols as f64;
            let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / cols as f64;
            (mu as f32 as f64, (1.0 / (var + eps).sqrt()) as f32 as f64)
        })
        .unzip()
}

/// One `rmsnorm_bwd` case: outputs dx and dw_partial.
pub fn rmsnorm_bwd_case(
    seed: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
    block: usize,
    grid: usize,
) -> Case {
    let (case_defines, suffix) = tile_path_defines(dtype, rows, cols, block);
    let label =
        format!("rmsnorm_bwd T={dtype} BLOCK={block} rows={rows} cols={cols} grid={grid}{suffix}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dtype, &[rows, cols], |r| r.normalish());
    let w = random_tensor(&mut rng, dtype, &[cols], |r| r.signed_magnitude(0.5, 1.5));
    let dy = random_tensor(&mut rng, dtype, &[rows, cols], |r| r.normalish());
    let rstd = rms_rstd(&x.to_f64_vec(), cols, 1e-5);
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(w),
        ArgValue::Tensor(dy),
        ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[rows], &rstd)),
        ArgValue::Tensor(poisoned(dtype, &[rows, cols])),
        ArgValue::Tensor(poisoned(DType::F32, &[grid, cols])),
        // dres: read only with RESIDUAL (rmsnorm_bwd_residual_case); nonzero like every
        // input.
        ArgValue::Tensor(HostTensor::from_f64(dtype, &[1, 1], &[1.0])),
    ];
    Case {
        options: Default::default(),
        kernel: "rmsnorm_bwd",
        kernel_name: Some("rmsnorm_bwd"),
        label,
        defines: case_defines,
        tensor_align: aligns(RMS_BWD_PARAMS, &args),
        grid: [grid as u32, 1, 1],
        args,
        outputs: vec![4, 5],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let w = tensor_at(args, 1).to_f64_vec();
            let dy = tensor_at(args, 2).to_f64_vec();
            let rstd = tensor_at(args, 3).to_f64_vec();
            let (dx, dw_partial) = rmsnorm_bwd_reference(&x, &w, &dy, &rstd, cols, grid);
            vec![dx, dw_partial]
        }),
        tolerance: bwd_tolerance(dtype, rows, grid),
    }
}

const RMS_BWD_PARAMS: &[&str] = &["x", "w", "dy", "rstd", "dx", "dw_partial", "dres"];

/// [`rmsnorm_bwd_case`] with `RESIDUAL = true`: a random dres [rows, cols] is added to
/// dx before it is rounded (the reference adds it in f64).
pub fn rmsnorm_bwd_residual_case(
    seed: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
    block: usize,
    grid: usize,
) -> Case {
    let mut case = rmsnorm_bwd_case(seed, dtype, rows, cols, block, grid);
    case.label = case
        .label
        .replacen("rmsnorm_bwd", "rmsnorm_bwd RESIDUAL", 1);
    let mut rng = Rng::for_case(seed, &case.label);
    case.args[6] = ArgValue::Tensor(random_tensor(&mut rng, dtype, &[rows, cols], |r| {
        r.normalish()
    }));
    case.tensor_align = aligns(RMS_BWD_PARAMS, &case.args);
    case.defines.push(("RESIDUAL".into(), "true".into()));
    let plain = std::mem::replace(&mut case.reference, Box::new(|_| Vec::new()));
    case.reference = Box::new(move |args| {
        let mut out = plain(args);
        let dres = tensor_at(args, 6).to_f64_vec();
        for (d, r) in out[0].iter_mut().zip(&dres) {
            *d += r;
        }
        out
    });
    case
}

/// (dx, dw_partial [grid, cols]) in f64: row r's dw contribution goes to partial row
/// r % grid.
pub fn rmsnorm_bwd_reference(
    x: &[f64],
    w: &[f64],
    dy: &[f64],
    rstd: &[f64],
    cols: usize,
    grid: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut dx = Vec::with_capacity(x.len());
    let mut part = vec![0.0; grid * cols];
    for (r, (xr, dyr)) in x.chunks(cols).zip(dy.chunks(cols)).enumerate() {
        let rs = rstd[r];
        let xhat: Vec<f64> = xr.iter().map(|v| v * rs).collect();
        let c = (0..cols).map(|i| w[i] * dyr[i] * xhat[i]).sum::<f64>() / cols as f64;
        dx.extend((0..cols).map(|i| rs * (w[i] * dyr[i] - xhat[i] * c)));
        let p = &mut part[(r % grid) * cols..(r % grid + 1) * cols];
        for i in 0..cols {
            p[i] += dyr[i] * xhat[i];
        }
    }
    (dx, part)
}

/// One `layernorm_bwd` case: outputs dx, dw_partial and db_partial. Inputs have a mean
/// of about 4 (so centering matters).
pub fn layernorm_bwd_case(
    seed: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
    block: usize,
    grid: usize,
) -> Case {
    let label =
        format!("layernorm_bwd T={dtype} BLOCK={block} rows={rows} cols={cols} grid={grid}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dtype, &[rows, cols], |r| 4.0 + r.normalish());
    let w = random_tensor(&mut rng, dtype, &[cols], |r| r.signed_magnitude(0.5, 1.5));
    let dy = random_tensor(&mut rng, dtype, &[rows, cols], |r| r.normalish());
    let (mean, rstd) = ln_stats(&x.to_f64_vec(), cols, 1e-5);
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(w),
        ArgValue::Tensor(dy),
        ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[rows], &mean)),
        ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[rows], &rstd)),
        ArgValue::Tensor(poisoned(dtype, &[rows, cols])),
        ArgValue::Tensor(poisoned(DType::F32, &[grid, cols])),
        ArgValue::Tensor(poisoned(DType::F32, &[grid, cols])),
    ];
    let names = [
        "x",
        "w",
        "dy",
        "mean",
        "rstd",
        "dx",
        "dw_partial",
        "db_partial",
    ];
    Case {
        options: Default::default(),
        kernel: "layernorm_bwd",
        kernel_name: Some("layernorm_bwd"),
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&names, &args),
        grid: [grid as u32, 1, 1],
        args,
        outputs: vec![5, 6, 7],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let w = tensor_at(args, 1).to_f64_vec();
            let dy = tensor_at(args, 2).to_f64_vec();
            let mean = tensor_at(args, 3).to_f64_vec();
            let rstd = tensor_at(args, 4).to_f64_vec();
            let (dx, dw, db) = layernorm_bwd_reference(&x, &w, &dy, &mean, &rstd, cols, grid);
            vec![dx, dw, db]
        }),
        tolerance: bwd_tolerance(dtype, rows, grid),
    }
}

/// (dx, dw_partial, db_partial) in f64, partial row r % grid for row r.
pub fn layernorm_bwd_reference(
    x: &[f64],
    w: &[f64],
    dy: &[f64],
    mean: &[f64],
    rstd: &[f64],
    cols: usize,
    grid: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let n = cols as f64;
    let mut dx = Vec::with_capacity(x.len());
    let mut dw = vec![0.0; grid * cols];
    let mut db = vec![0.0; grid * cols];
    for (r, (xr, dyr)) in x.chunks(cols).zip(dy.chunks(cols)).enumerate() {
        let (mu, rs) = (mean[r], rstd[r]);
        let xhat: Vec<f64> = xr.iter().map(|v| (v - mu) * rs).collect();
        let wdy: Vec<f64> = (0..cols).map(|i| w[i] * dyr[i]).collect();
        let c1 = wdy.iter().sum::<f64>() / n;
        let c2 = (0..cols).map(|i| wdy[i] * xhat[i]).sum::<f64>() / n;
        dx.extend((0..cols).map(|i| rs * (wdy[i] - c1 - xhat[i] * c2)));
        let g = r % grid;
        for i in 0..cols {
            dw[g * cols + i] += dyr[i] * xhat[i];
            db[g * cols + i] += dyr[i];
        }
    }
    (dx, dw, db)
}

/// Column sums of a [G, cols] f32 matrix.
pub fn colsum_reference(partials: &[f64], cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; cols];
    for row in partials.chunks(cols) {
        for (o, v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
    out
}

/// Random partials: signed, magnitudes 0.1 to 10, like sums of dy * xhat over rows.
fn random_partials(rng: &mut Rng, g: usize, cols: usize) -> HostTensor {
    random_tensor(rng, DType::F32, &[g, cols], |r| {
        r.signed_magnitude(0.1, 10.0)
    })
}

fn colsum_tolerance(dtype: DType, g: usize) -> Tolerance {
    Tolerance::for_dtype(dtype, sum_tolerance(g, 10.0))
}

/// One `rmsnorm_bwd_dw` case: dw = column sums of dw_partial [g, cols].
pub fn rmsnorm_dw_case(
    seed: u64,
    dtype: DType,
    g: usize,
    cols: usize,
    block: usize,
    rows: usize,
) -> Case {
    let label = format!("rmsnorm_bwd_dw T={dtype} BLOCK={block} ROWS={rows} G={g} cols={cols}");
    let mut rng = Rng::for_case(seed, &label);
    let args = vec![
        ArgValue::Tensor(random_partials(&mut rng, g, cols)),
        ArgValue::Tensor(poisoned(dtype, &[cols])),
    ];
    Case {
        options: Default::default(),
        kernel: "rmsnorm_bwd",
        kernel_name: Some("rmsnorm_bwd_dw"),
        label,
        defines: defines(&[
            ("T", dtype.to_string()),
            ("BLOCK", block.to_string()),
            ("ROWS", rows.to_string()),
        ]),
        tensor_align: aligns(&["dw_partial", "dw"], &args),
        grid: [cdiv(cols, block) as u32, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| {
            vec![colsum_reference(&tensor_at(args, 0).to_f64_vec(), cols)]
        }),
        tolerance: colsum_tolerance(dtype, g),
    }
}

/// One `layernorm_bwd_dwdb` case: dw, db = column sums of dw_partial, db_partial.
pub fn layernorm_dwdb_case(
    seed: u64,
    dtype: DType,
    g: usize,
    cols: usize,
    block: usize,
    rows: usize,
) -> Case {
    let label = format!("layernorm_bwd_dwdb T={dtype} BLOCK={block} ROWS={rows} G={g} cols={cols}");
    let mut rng = Rng::for_case(seed, &label);
    let dw_partial = random_partials(&mut rng, g, cols);
    let db_partial = random_partials(&mut rng, g, cols);
    let args = vec![
        ArgValue::Tensor(dw_partial),
        ArgValue::Tensor(db_partial),
        ArgValue::Tensor(poisoned(dtype, &[cols])),
        ArgValue::Tensor(poisoned(dtype, &[cols])),
    ];
    Case {
        options: Default::default(),
        kernel: "layernorm_bwd",
        kernel_name: Some("layernorm_bwd_dwdb"),
        label,
        defines: defines(&[
            ("T", dtype.to_string()),
            ("BLOCK", block.to_string()),
            ("ROWS", rows.to_string()),
        ]),
        tensor_align: aligns(&["dw_partial", "db_partial", "dw", "db"], &args),
        grid: [cdiv(cols, block) as u32, 1, 1],
        args,
        outputs: vec![2, 3],
        reference: Box::new(move |args| {
            vec![
                colsum_reference(&tensor_at(args, 0).to_f64_vec(), cols),
                colsum_reference(&tensor_at(args, 1).to_f64_vec(), cols),
            ]
        }),
        tolerance: colsum_tolerance(dtype, g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Central finite differences of the f64 forward passes agree with the backward
    /// references (dx through sum(y * dy), dw and db through the same loss), and the
    /// saved statistics fed to the references are the forward's.
    #[test]
    fn backward_references_match_finite_differences() {
        let mut rng = Rng::new(7);
        let (rows, cols, eps) = (3usize, 5usize, 1e-5);
        let x: Vec<f64> = (0..rows * cols).map(|_| 1.0 + rng.normalish()).collect();
        let w: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.5, 1.5)).collect();
        let b: Vec<f64> = (0..cols).map(|_| rng.signed_magnitude(0.1, 0.5)).collect();
        let dy: Vec<f64> = (0..rows * cols).map(|_| rng.normalish()).collect();
        let dot = |a: &[f64], c: &[f64]| a.iter().zip(c).map(|(p, q)| p * q).sum::<f64>();
        let rms_loss =
            |x: &[f64], w: &[f64]| dot(&super::super::rmsnorm::reference(x, w, cols, eps).0, &dy);
        let ln_loss = |x: &[f64], w: &[f64], b: &[f64]| {
            dot(
                &super::super::layernorm::reference(x, w, b, cols, eps).0,
                &dy,
            )
        };
        let h = 1e-6;
        let fd = |f: &dyn Fn(&[f64]) -> f64, v: &[f64], i: usize| {
            let (mut p, mut m) = (v.to_vec(), v.to_vec());
            p[i] += h;
            m[i] -= h;
            (f(&p) - f(&m)) / (2.0 * h)
        };
        let tol = Tolerance {
            rel: 1e-6,
            abs: 1e-7,
        };
        let close = |what: &str, got: f64, want: f64| {
            assert!(compare::within(got, want, tol), "{what}: {got} vs {want}");
        };

        // Exact (unrounded) statistics, so the identity is exact up to f64.
        let (_, rstd) = super::super::rmsnorm::reference(&x, &w, cols, eps);
        let (dx, dwp) = rmsnorm_bwd_reference(&x, &w, &dy, &rstd, cols, 2);
        let dw = colsum_reference(&dwp, cols);
        for (i, &g) in dx.iter().enumerate() {
            close("rmsnorm dx", g, fd(&|v| rms_loss(v, &w), &x, i));
        }
        for (i, &g) in dw.iter().enumerate() {
            close("rmsnorm dw", g, fd(&|v| rms_loss(&x, v), &w, i));
        }

        let (_, mean, rstd) = super::super::layernorm::reference(&x, &w, &b, cols, eps);
        let (dx, dwp, dbp) = layernorm_bwd_reference(&x, &w, &dy, &mean, &rstd, cols, 4);
        let (dw, db) = (colsum_reference(&dwp, cols), colsum_reference(&dbp, cols));
        assert_eq!(dx.len(), rows * cols);
        for (i, &g) in dx.iter().enumerate() {
            close("layernorm dx", g, fd(&|v| ln_loss(v, &w, &b), &x, i));
        }
        for (i, (&gw, &gb)) in dw.iter().zip(&db).enumerate() {
            close("layernorm dw", gw, fd(&|v| ln_loss(&x, v, &b), &w, i));
            close("layernorm db", gb, fd(&|v| ln_loss(&x, &w, v), &b, i));
        }
    }
}
