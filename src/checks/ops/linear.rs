//! Self-checks of `ops/linear.rs` (test code): `linear` (forward with the saved
//! pre-activation) and `linear_backward` (dx, dw, db) against float64 over awkward
//! shapes (M, N and K each drawn from {1, 7, 127, 1000, 4097}, large extents paired
//! with small ones), every activation, with and without a bias, f16 and bf16, inputs as
//! contiguous rows, column slices whose rows are 2-byte aligned, `[B, S, K]` batches and
//! transposed weights; inputs random, outputs poisoned first. On a GPU each case also
//! runs on the interpreter with the same inputs (the backward with the GPU's saved
//! pre-activation) and the two must agree. And `matmul` on awkward shapes with a
//! transposed operand, and the unit tests of views and typed errors.
//!
//! Tolerances follow the roundings the ops make: every product of two 16-bit values is
//! exact in f32; the f32 sums of K (or M, N) of them carry a few ulp of f32 relative to
//! the sum of the terms' magnitudes (8·sqrt(terms)·2^-24 of it, with slack); each output
//! is rounded once to T (unit roundoff u = 2^-8 for bf16, 2^-11 for f16); the backward's
//! GEMMs read dz rounded to T, which adds u of the sum of the magnitudes of their terms
//! (dz·w for dx, dz·x for dw); GELU's forward uses `tanh.approx` on the GPU (~2^-10.7
//! absolute in tanh, so ~3e-4·|z| in y); the derivatives use `ex2.approx`-based sigmoid
//! (a few ulp of f32). db sums the unrounded f32 dz.

use super::common::read;
use crate::cases::gemm::Act;
use crate::cases::Rng;
use crate::ops::gemm::Activation;
use crate::ops::{OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{Device, Tensor};

/// How a case passes `x` (and so dy, dx) and `w`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// x `[M, K]` contiguous, w `[N, K]` contiguous.
    Rows,
    /// x = columns 1..=K of an `[M, K + 3]` buffer: rows an odd number of elements apart
    /// and starting one element in (2-byte aligned in f16/bf16).
    ColumnSlice,
    /// x `[B, M / B, K]` (flattened to rows by the op), dy and dx alike.
    Batched,
    /// w given as the transpose of a `[K, N]` tensor (a weight stored `[in, out]`), and
    /// dw written through the same transposed view.
    TransposedWeight,
}

/// One linear-layer check.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    pub act: Activation,
    pub bias: bool,
    pub layout: Layout,
}

impl Case {
    pub fn label(&self) -> String {
        format!(
            "linear fwd+bwd {} [{}x{}] @ [{}x{}].T{} {:?} {:?} (error/tolerance)",
            self.dtype,
            self.m,
            self.k,
            self.n,
            self.k,
            if self.bias { " +bias" } else { "" },
            self.act,
            self.layout
        )
    }
}

/// The awkward shapes: each of 1, 7, 127, 1000, 4097 in each of M, N and K, large ones
/// with small ones; activations, bias, dtypes and layouts cycled so that each
/// activation runs with and without a bias in both dtypes.
pub fn awkward_cases() -> Vec<Case> {
    let shapes: [(usize, usize, usize); 15] = [
        (1, 7, 127),
        (7, 127, 1),
        (127, 1, 7),
        (1000, 7, 1),
        (1, 1000, 7),
        (7, 1, 1000),
        (4097, 1, 7),
        (7, 4097, 1),
        (1, 7, 4097),
        (127, 1000, 7),
        (1000, 127, 7),
        (127, 7, 1000),
        (4097, 127, 1),
        (1, 4097, 127),
        (127, 1, 4097),
    ];
    let acts = [
        Activation::None,
        Activation::Relu,
        Activation::GeluTanh,
        Activation::Silu,
    ];
    let layouts = [
        Layout::Rows,
        Layout::ColumnSlice,
        Layout::Batched,
        Layout::TransposedWeight,
    ];
    let mut v: Vec<Case> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(m, n, k))| Case {
            m,
            n,
            k,
            dtype: if (i / 4) % 2 == 0 {
                DType::BF16
            } else {
                DType::F16
            },
            act: acts[i % 4],
            bias: (i / 2) % 2 == 0,
            layout: layouts[(i / 3) % 4],
        })
        .collect();
    // The combinations the cycle leaves out, on a moderate shape with edges everywhere.
    let seen = |c: &Case| {
        v.iter()
            .any(|x| (x.dtype, x.act, x.bias) == (c.dtype, c.act, c.bias))
    };
    let mut extra = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for act in acts {
            for bias in [false, true] {
                let c = Case {
                    m: 70,
                    n: 33,
                    k: 45,
                    dtype,
                    act,
                    bias,
                    layout: layouts[extra.len() % 4],
                };
                if !seen(&c) {
                    extra.push(c);
                }
            }
        }
    }
    v.extend(extra);
    v
}

/// The inputs of a case, as stored (rounded to T): x `[M, K]`, w `[N, K]`, bias `[N]`,
/// dy `[M, N]`, row-major.
struct Inputs {
    x: Vec<f64>,
    w: Vec<f64>,
    bias: Vec<f64>,
    dy: Vec<f64>,
}

fn round_to(t: DType, v: Vec<f64>) -> Vec<f64> {
    kgen_core::host::HostTensor::from_f64(t, &[v.len()], &v).to_f64_vec()
}

fn inputs(c: &Case) -> Inputs {
    let mut rng = Rng::for_case(23, &c.label());
    let mut normal = |n: usize, s: f64| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let x = rng.normalish();
                if x == 0.0 {
                    0.5 * s
                } else {
                    x * s
                }
            })
            .collect()
    };
    // w ~ N(0, 1/K): pre-activations of order 1, across the activations' bends.
    let ws = 1.0 / (c.k.max(1) as f64).sqrt();
    Inputs {
        x: round_to(c.dtype, normal(c.m * c.k, 1.0)),
        w: round_to(c.dtype, normal(c.n * c.k, ws)),
        bias: round_to(c.dtype, normal(c.n, 0.5)),
        dy: round_to(c.dtype, normal(c.m * c.n, 1.0)),
    }
}

/// What a run produced, row-major: y, z (with an activation), dx `[M, K]`, dw `[N, K]`,
/// db (with a bias).
#[derive(Clone, Debug)]
struct Outputs {
    y: Vec<f64>,
    z: Option<Vec<f64>>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Option<Vec<f64>>,
}

/// `data` (row-major `[rows, cols]`) on `d` in the case's layout for an operand of
/// shape `[rows, cols]` whose rows are x's (x, dy, dx: `batched`/`sliced` apply).
fn rows_tensor(d: &Device, c: &Case, cols: usize, data: &[f64]) -> Result<Tensor, String> {
    let e = |x: kgen_runtime::RuntimeError| x.to_string();
    let m = c.m;
    match c.layout {
        Layout::ColumnSlice => {
            let mut full = vec![0.25; m * (cols + 3)];
            for i in 0..m {
                full[i * (cols + 3) + 1..i * (cols + 3) + 1 + cols]
                    .copy_from_slice(&data[i * cols..(i + 1) * cols]);
            }
            let t = d.from_f64(c.dtype, &[m, cols + 3], &full).map_err(e)?;
            t.narrow(1, 1, cols).map_err(e)
        }
        Layout::Batched => {
            let b = if m.is_multiple_of(2) { 2 } else { 1 };
            d.from_f64(c.dtype, &[b, m / b, cols], data).map_err(e)
        }
        _ => d.from_f64(c.dtype, &[m, cols], data).map_err(e),
    }
}

/// A poisoned tensor shaped like [`rows_tensor`]'s.
fn poisoned_rows(d: &Device, c: &Case, cols: usize) -> Result<Tensor, String> {
    rows_tensor(d, c, cols, &vec![f64::NAN; c.m * cols])
}

/// w `[N, K]` (or the transpose of a `[K, N]` tensor) from row-major `[N, K]` values.
fn weight_tensor(d: &Device, c: &Case, data: &[f64]) -> Result<Tensor, String> {
    let e = |x: kgen_runtime::RuntimeError| x.to_string();
    if c.layout == Layout::TransposedWeight {
        let mut t = vec![0.0; c.n * c.k];
        for j in 0..c.n {
            for p in 0..c.k {
                t[p * c.n + j] = data[j * c.k + p];
            }
        }
        d.from_f64(c.dtype, &[c.k, c.n], &t)
            .and_then(|x| x.transpose(0, 1))
            .map_err(e)
    } else {
        d.from_f64(c.dtype, &[c.n, c.k], data).map_err(e)
    }
}

/// Forward and backward of `c` on `ops`'s device. The backward reads the forward's
/// pre-activation, or `preact` (row-major values) when given.
fn run(ops: &Ops, c: &Case, inp: &Inputs, preact: Option<&[f64]>) -> Result<Outputs, String> {
    let d = ops.device();
    let e = |x: OpError| x.to_string();
    let (m, n, k, t) = (c.m, c.n, c.k, c.dtype);
    let x = rows_tensor(d, c, k, &inp.x)?;
    let w = weight_tensor(d, c, &inp.w)?;
    let bias = d.from_f64(t, &[n], &inp.bias).map_err(|x| x.to_string())?;
    let dy = rows_tensor(d, c, n, &inp.dy)?;
    let y = poisoned_rows(d, c, n)?;
    let with_z = c.act != Activation::None;
    let z = if with_z {
        Some(poisoned_rows(d, c, n)?)
    } else {
        None
    };
    let b = c.bias.then_some(&bias);
    match &z {
        Some(z) => ops.linear_with_preact_into(&x, &w, b, c.act, &y, z),
        None => ops.linear_into(&x, &w, b, c.act, &y),
    }
    .map_err(|x| format!("forward: {}", e(x)))?;
    let zv = z.as_ref().map(read).transpose()?;
    let z_in = match (preact, &z) {
        (Some(v), Some(_)) => Some(rows_tensor(d, c, n, v)?),
        _ => z.clone(),
    };
    let dx = poisoned_rows(d, c, k)?;
    let dw = weight_tensor(d, c, &vec![f64::NAN; n * k])?;
    let db = d
        .from_f64(t, &[n], &vec![f64::NAN; n])
        .map_err(|x| x.to_string())?;
    ops.linear_backward_into(
        &dy,
        &x,
        &w,
        z_in.as_ref(),
        c.act,
        &dx,
        &dw,
        c.bias.then_some(&db),
    )
    .map_err(|x| format!("backward: {}", e(x)))?;
    let _ = m;
    Ok(Outputs {
        y: read(&y)?,
        z: zv,
        dx: read(&dx)?,
        dw: read(&dw)?,
        db: if c.bias { Some(read(&db)?) } else { None },
    })
}

fn act_of(a: Activation) -> Act {
    match a {
        Activation::None => Act::None,
        Activation::Relu => Act::Relu,
        Activation::GeluTanh => Act::GeluTanh,
        Activation::Silu => Act::Silu,
    }
}

/// Unit roundoff of T.
fn unit(t: DType) -> f64 {
    match t {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

/// f32 accumulation of `terms` products, relative to the sum of their magnitudes.
fn acc(terms: usize) -> f64 {
    8.0 * (terms.max(1) as f64).sqrt() * 2f64.powi(-24)
}

/// The f64 references and each element's tolerance.
struct Reference {
    want: Outputs,
    tol: Outputs,
}

/// References of `c` for inputs `inp`; the backward's from the stored pre-activation
/// `zv` (what the device saved), the forward's from the inputs.
fn reference(c: &Case, inp: &Inputs, zv: Option<&[f64]>) -> Reference {
    let (m, n, k) = (c.m, c.n, c.k);
    let u = unit(c.dtype);
    let act = act_of(c.act);
    let mut y = vec![0.0; m * n];
    let mut z = vec![0.0; m * n];
    let (mut ty, mut tz) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut mag) = (0.0, 0.0);
            for p in 0..k {
                let t = inp.x[i * k + p] * inp.w[j * k + p];
                s += t;
                mag += t.abs();
            }
            if c.bias {
                s += inp.bias[j];
                mag += inp.bias[j].abs();
            }
            let idx = i * n + j;
            z[idx] = s;
            y[idx] = act.apply(s);
            let gelu = if act == Act::GeluTanh {
                4e-4 * s.abs()
            } else {
                0.0
            };
            tz[idx] = 1.5 * u * s.abs() + acc(k) * mag + 1e-6;
            ty[idx] = 1.5 * u * y[idx].abs() + 1.2 * acc(k) * mag + gelu + 1e-6;
        }
    }
    // dz from the stored pre-activation (the forward's z when none was stored).
    let zs: &[f64] = zv.unwrap_or(&z);
    let dz: Vec<f64> = (0..m * n)
        .map(|i| inp.dy[i] * act.derivative(zs[i]))
        .collect();
    // The derivative in f32 (sigmoid via ex2.approx: a few ulp) before dz's rounding.
    let dz_err = |v: f64| u * v.abs() + 1e-6 * v.abs();
    let (mut dx, mut tdx) = (vec![0.0; m * k], vec![0.0; m * k]);
    for i in 0..m {
        for p in 0..k {
            let (mut s, mut mag, mut err) = (0.0, 0.0, 0.0);
            for j in 0..n {
                let t = dz[i * n + j] * inp.w[j * k + p];
                s += t;
                mag += t.abs();
                err += dz_err(dz[i * n + j]) * inp.w[j * k + p].abs();
            }
            dx[i * k + p] = s;
            tdx[i * k + p] = 1.5 * u * s.abs() + err + acc(n) * mag + 1e-6;
        }
    }
    let (mut dw, mut tdw) = (vec![0.0; n * k], vec![0.0; n * k]);
    for j in 0..n {
        for p in 0..k {
            let (mut s, mut mag, mut err) = (0.0, 0.0, 0.0);
            for i in 0..m {
                let t = dz[i * n + j] * inp.x[i * k + p];
                s += t;
                mag += t.abs();
                err += dz_err(dz[i * n + j]) * inp.x[i * k + p].abs();
            }
            dw[j * k + p] = s;
            tdw[j * k + p] = 1.5 * u * s.abs() + err + acc(m) * mag + 1e-6;
        }
    }
    let (mut db, mut tdb) = (vec![0.0; n], vec![0.0; n]);
    for j in 0..n {
        let (mut s, mut mag) = (0.0, 0.0);
        for i in 0..m {
            s += dz[i * n + j];
            mag += dz[i * n + j].abs();
        }
        db[j] = s;
        // db sums the f32 dz (not rounded to T), then is rounded once.
        tdb[j] = 1.5 * u * s.abs() + (acc(m) + 4e-6) * mag + 1e-6;
    }
    let with_z = c.act != Activation::None;
    Reference {
        want: Outputs {
            y,
            z: with_z.then_some(z),
            dx,
            dw,
            db: c.bias.then_some(db),
        },
        tol: Outputs {
            y: ty,
            z: with_z.then_some(tz),
            dx: tdx,
            dw: tdw,
            db: c.bias.then_some(tdb),
        },
    }
}

/// One output's name, values, reference values and tolerances.
type Compared<'a> = (&'static str, &'a [f64], &'a [f64], &'a [f64]);

/// The outputs' (name, got, want, tolerance) lists.
fn triples<'a>(got: &'a Outputs, want: &'a Outputs, tol: &'a Outputs) -> Vec<Compared<'a>> {
    let mut v = vec![
        ("y", &got.y[..], &want.y[..], &tol.y[..]),
        ("dx", &got.dx[..], &want.dx[..], &tol.dx[..]),
        ("dw", &got.dw[..], &want.dw[..], &tol.dw[..]),
    ];
    if let (Some(g), Some(w), Some(t)) = (&got.z, &want.z, &tol.z) {
        v.push(("z", g, w, t));
    }
    if let (Some(g), Some(w), Some(t)) = (&got.db, &want.db, &tol.db) {
        v.push(("db", g, w, t));
    }
    v
}

/// Every element within `scale` times its tolerance; returns the largest ratio of an
/// error to that (at most 1 when every element passes).
fn within(
    got: &Outputs,
    want: &Outputs,
    tol: &Outputs,
    scale: f64,
    what: &str,
) -> Result<f64, String> {
    let mut worst = 0.0f64;
    for (name, g, w, t) in triples(got, want, tol) {
        if g.len() != w.len() {
            return Err(format!(
                "{what} {name}: {} values, expected {}",
                g.len(),
                w.len()
            ));
        }
        for i in 0..g.len() {
            let err = (g[i] - w[i]).abs();
            worst = worst.max(err / (scale * t[i]));
            if err.is_nan() || err > scale * t[i] {
                return Err(format!(
                    "{what} {name}[{i}] = {}, expected {} (|error| {err:.2e} > tolerance {:.2e})",
                    g[i],
                    w[i],
                    scale * t[i]
                ));
            }
        }
    }
    Ok(worst)
}

/// Runs `c` on `ops`'s device against f64; on a GPU also on the interpreter with the
/// same inputs and the GPU's pre-activation, and the two must agree within twice the
/// tolerance (`against_interpreter`).
pub fn check(ops: &Ops, c: &Case, against_interpreter: bool) -> Result<f64, String> {
    let inp = inputs(c);
    let got = run(ops, c, &inp, None)?;
    let r = reference(c, &inp, got.z.as_deref());
    let worst = within(&got, &r.want, &r.tol, 1.0, "vs f64:")?;
    if against_interpreter && ops.device().is_gpu() {
        let interp = Ops::new(&Device::interpreter());
        let other = run(&interp, c, &inp, got.z.as_deref())?;
        within(&got, &other, &r.tol, 2.0, "GPU vs interpreter:")?;
    }
    Ok(worst)
}

/// The linear checks of `kgen selftest`: every awkward case (on a GPU also against the
/// interpreter), and on a GPU a larger bf16 layer, then `matmul`.
pub fn gpu_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    let mut out = Vec::new();
    for c in awkward_cases() {
        out.push((c.label(), check(&ops, &c, true)));
    }
    if device.is_gpu() {
        for (act, layout) in [
            (Activation::GeluTanh, Layout::Rows),
            (Activation::Silu, Layout::ColumnSlice),
        ] {
            let c = Case {
                m: 512,
                n: 768,
                k: 1000,
                dtype: DType::BF16,
                act,
                bias: true,
                layout,
            };
            out.push((c.label(), check(&ops, &c, false)));
        }
    }
    out.extend(matmul_checks(device));
    out
}

/// `matmul` on awkward shapes with a transposed operand, against f64.
fn matmul_checks(device: &Device) -> Vec<(String, Result<f64, String>)> {
    let ops = Ops::new(device);
    let mut out = Vec::new();
    for &(m, k, n, dt, tol) in &[
        (257usize, 300usize, 129usize, DType::F32, 1e-4),
        (100, 64, 1000, DType::BF16, 2e-2),
    ] {
        let label = format!("matmul {dt} [{m}x{k}] @ [{n}x{k}].T");
        let r = (|| -> Result<f64, String> {
            let e = |x: OpError| x.to_string();
            let mut rng = crate::cases::Rng::new(11);
            let av: Vec<f64> = (0..m * k).map(|_| rng.normalish()).collect();
            let bt: Vec<f64> = (0..n * k).map(|_| rng.normalish()).collect();
            let a = device.from_f64(dt, &[m, k], &av).map_err(|x| e(x.into()))?;
            let b = device.from_f64(dt, &[n, k], &bt).map_err(|x| e(x.into()))?;
            let c = device
                .from_f64(dt, &[m, n], &vec![f64::NAN; m * n])
                .map_err(|x| e(x.into()))?;
            ops.matmul_into(&a, &b.transpose(0, 1).map_err(|x| e(x.into()))?, &c)
                .map_err(e)?;
            let (ar, br) = (
                a.to_f64_vec().map_err(|x| e(x.into()))?,
                b.to_f64_vec().map_err(|x| e(x.into()))?,
            );
            let got = c.to_f64_vec().map_err(|x| e(x.into()))?;
            let mut worst = 0.0f64;
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|p| ar[i * k + p] * br[j * k + p]).sum();
                    let scale: f64 = (0..k).map(|p| (ar[i * k + p] * br[j * k + p]).abs()).sum();
                    let err = (got[i * n + j] - want).abs() / scale.max(1e-30);
                    if !err.is_finite() {
                        return Err(format!("[{i}, {j}] = {}", got[i * n + j]));
                    }
                    worst = worst.max(err);
                }
            }
            if worst > tol {
                return Err(format!(
                    "error {worst:.2e} relative to sum|a*b| exceeds {tol:.0e}"
                ));
            }
            Ok(worst)
        })();
        out.push((label, r));
    }
    out
}

#[cfg(test)]
mod tests;
