//! The second half of `kgen selftest`: the op library and `#[kernel]` launchers, on the
//! selected device (the GPU, or the interpreter without one).
//!
//! - the op library's self-checks, `kgen::checks::ops::gpu_checks` (every op once, on
//!   awkward shapes, against a float64 reference, outputs poisoned first; the
//!   optimizer's and the CUDA graph capture's too);
//! - kernels written with `#[kgen::kernel]`, launched through their typed launchers on the
//!   device and on the interpreter, compared element by element;
//! - a short training run that must lower its loss.

use super::common::say;
use kgen::core::DType;
use kgen::runtime::Device;

/// out[r, :] = relu(x[r, :]) * alpha + r, one row per program (a macro kernel with a
/// generic dtype, a generic int, a scalar and a 2-D tensor).
#[kgen::kernel]
fn scaled_relu_rows<T: Float = f32, const BLOCK: i32 = 512>(
    x: Tensor<T, 2, Contiguous>,
    out: Tensor<T, 2, Contiguous>,
    alpha: f32,
) {
    let r = bid(0);
    let t = load(x, [r, 0], [1, BLOCK]) as f32;
    store(out, [r, 0], (max(t, 0.0) * alpha + (r as f32)) as T);
}

/// Softmax of each row written in the macro form, online over tiles.
#[kgen::kernel]
fn softmax_rows<const BLOCK: i32 = 256>(
    x: Tensor<f32, 2, Contiguous>,
    y: Tensor<f32, 2, Contiguous>,
) {
    let row = bid(0);
    let cols = shape(x, 1);
    let mut m: f32 = -f32::INFINITY;
    let mut s: f32 = 0.0;
    for k in 0..cdiv(cols, BLOCK) {
        let t = load(x, [row, k], [1, BLOCK], pad = -f32::INFINITY);
        let m_new = max(m, max(t.reshape([BLOCK]), axis = 0));
        s = s * exp(m - m_new) + sum(exp(t.reshape([BLOCK]) - m_new), 0);
        m = m_new;
    }
    for k in 0..cdiv(cols, BLOCK) {
        let t = load(x, [row, k], [1, BLOCK], pad = -f32::INFINITY);
        store(y, [row, k], exp(t - m) / s);
    }
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = kgen::cases::Rng::new(seed);
    (0..n).map(|_| rng.normalish() * 2.0).collect()
}

fn max_rel(got: &[f64], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() || w.is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs() / w.abs().max(1e-30)
            }
        })
        .fold(0.0, f64::max)
}

/// Runs both macro kernels on `device`; the outputs, row-major.
fn macro_outputs(device: &Device) -> Result<Vec<Vec<f64>>, String> {
    let e = |x: kgen::runtime::RuntimeError| x.to_string();
    let s = device.stream();
    let (rows, cols) = (7, 1000);
    let poison = |n| vec![f64::NAN; n];
    let mut out = Vec::new();
    for dt in [DType::F32, DType::BF16] {
        let x = device
            .from_f64(dt, &[rows, cols], &values(rows * cols, 3))
            .map_err(e)?;
        let y = device
            .from_f64(dt, &[rows, cols], &poison(rows * cols))
            .map_err(e)?;
        let opts = scaled_relu_rows::options(device.arch())
            .define("T", dt)
            .define("BLOCK", 1024);
        scaled_relu_rows::launch_with(&s, &opts, [rows as u32, 1, 1], &x, &y, 1.5).map_err(e)?;
        out.push(y.to_f64_vec().map_err(e)?);
    }
    let (rows, cols) = (5, 4097);
    let x = device
        .from_f64(DType::F32, &[rows, cols], &values(rows * cols, 4))
        .map_err(e)?;
    let y = device
        .from_f64(DType::F32, &[rows, cols], &poison(rows * cols))
        .map_err(e)?;
    softmax_rows::launch(&s, [rows as u32, 1, 1], &x, &y).map_err(e)?;
    out.push(y.to_f64_vec().map_err(e)?);
    Ok(out)
}

/// The references of [`macro_outputs`] in f64 (inputs rounded to their dtype first).
fn macro_references() -> Vec<Vec<f64>> {
    let mut refs = Vec::new();
    for dt in [DType::F32, DType::BF16] {
        let (rows, cols) = (7, 1000);
        let h = kgen::core::host::HostTensor::from_f64(dt, &[rows, cols], &values(rows * cols, 3));
        let x = h.to_f64_vec();
        refs.push(
            (0..rows * cols)
                .map(|i| x[i].max(0.0) * 1.5 + (i / cols) as f64)
                .collect(),
        );
    }
    let (rows, cols) = (5, 4097);
    let x: Vec<f64> = values(rows * cols, 4)
        .iter()
        .map(|v| *v as f32 as f64)
        .collect();
    refs.push(kgen::cases::softmax::reference(&x, cols));
    refs
}

/// One line per check: (label, max relative error or why it failed, tolerance).
type Check = (String, Result<f64, String>, f64);

fn macro_checks(device: &Device) -> Vec<Check> {
    let names = [
        "macro scaled_relu_rows f32",
        "macro scaled_relu_rows bf16",
        "macro softmax_rows f32 [5, 4097]",
    ];
    let tols = [1e-6, 8e-3, 1e-5];
    let got = macro_outputs(device);
    let interp = if device.is_gpu() {
        Some(macro_outputs(&Device::interpreter()))
    } else {
        None
    };
    let refs = macro_references();
    let mut v = Vec::new();
    for i in 0..names.len() {
        let r = match &got {
            Err(e) => Err(e.clone()),
            Ok(g) => {
                let err = max_rel(&g[i], &refs[i]);
                match &interp {
                    Some(Ok(ip)) => {
                        let gi = max_rel(&g[i], &ip[i]);
                        if gi > tols[i] {
                            Err(format!("GPU vs interpreter {gi:.2e} (vs f64 {err:.2e})"))
                        } else {
                            Ok(err)
                        }
                    }
                    Some(Err(e)) => Err(format!("interpreter: {e}")),
                    None => Ok(err),
                }
            }
        };
        v.push((names[i].to_string(), r, tols[i]));
    }
    v
}

/// Runs the op checks (all, or the named groups); returns how many passed and failed.
pub fn run(
    device: &Device,
    groups: Option<&[String]>,
) -> Result<(usize, usize), super::common::CliError> {
    let mut checks: Vec<Check> = match groups {
        None => macro_checks(device),
        Some(_) => Vec::new(),
    };
    let results = match groups {
        None => kgen::checks::ops::gpu_checks(device),
        Some(g) => {
            let known = kgen::checks::ops::GROUPS;
            if let Some(bad) = g.iter().find(|x| !known.contains(&x.as_str())) {
                return Err(super::common::CliError::Msg(format!(
                    "no op check group `{bad}` (groups: {})",
                    known.join(", ")
                )));
            }
            kgen::checks::ops::gpu_checks_of(device, |name| g.iter().any(|x| x == name))
        }
    };
    for (label, r) in results {
        checks.push((label, r, f64::INFINITY));
    }
    say(format_args!(
        "op library and #[kernel] launchers on {}:",
        device.describe()
    ));
    let w = checks
        .iter()
        .map(|c| c.0.len())
        .max()
        .unwrap_or(10)
        .clamp(10, 70);
    let mut failed = 0;
    for (label, r, tol) in &checks {
        let (txt, ok) = match r {
            Ok(e) if *e <= *tol => (format!("{e:.2e}"), true),
            Ok(e) => (format!("{e:.2e} > {tol:.0e}"), false),
            Err(why) => (why.clone(), false),
        };
        failed += (!ok) as usize;
        say(format_args!(
            "{:<w$}  {:>12}  {}",
            label,
            if ok { txt.as_str() } else { "" },
            if ok {
                "PASS".to_string()
            } else {
                format!("FAIL {txt}")
            }
        ));
    }
    Ok((checks.len() - failed, failed))
}
