//! Self-checks of `matmul` (`ops/linear.rs`) against float64: the selftest's awkward
//! shapes with a transposed operand, and a unit test of transposed views and the typed
//! errors on the interpreter.

use crate::ops::{OpError, Ops};

/// `matmul` on awkward shapes with a transposed operand, against f64.
pub fn gpu_checks(device: &kgen_runtime::Device) -> Vec<(String, Result<f64, String>)> {
    use kgen_core::types::DType;
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
mod tests {
    use crate::cases::Rng;
    use crate::ops::Ops;
    use kgen_core::types::DType;
    use kgen_runtime::Device;

    #[test]
    fn matmul_with_transposed_views_matches_f64() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let mut rng = Rng::new(7);
        for &(m, k, n) in &[(1usize, 1usize, 1usize), (7, 13, 5), (40, 33, 70)] {
            let av: Vec<f64> = (0..m * k).map(|_| rng.normalish()).collect();
            let bv: Vec<f64> = (0..k * n).map(|_| rng.normalish()).collect();
            let a = d.from_f64(DType::F32, &[m, k], &av).unwrap();
            // b stored transposed: [n, k], viewed as [k, n].
            let mut bt = vec![0.0; k * n];
            for i in 0..k {
                for j in 0..n {
                    bt[j * k + i] = bv[i * n + j];
                }
            }
            let b = d
                .from_f64(DType::F32, &[n, k], &bt)
                .unwrap()
                .transpose(0, 1)
                .unwrap();
            let c = d
                .from_f64(DType::F32, &[m, n], &vec![f64::NAN; m * n])
                .unwrap();
            ops.matmul_into(&a, &b, &c).unwrap();
            let got = c.to_f64_vec().unwrap();
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|p| av[i * k + p] * bv[p * n + j]).sum();
                    assert!(
                        (got[i * n + j] - want).abs() < 1e-5 * (k as f64),
                        "{m}x{k}x{n} [{i},{j}]"
                    );
                }
            }
        }
        let a = d.zeros(DType::F32, &[3, 4]).unwrap();
        let b = d.zeros(DType::F32, &[5, 2]).unwrap();
        assert!(matches!(
            ops.matmul(&a, &b),
            Err(crate::ops::OpError::Shape { .. })
        ));
        let bh = d.zeros(DType::F16, &[4, 2]).unwrap();
        assert!(matches!(
            ops.matmul(&a, &bh),
            Err(crate::ops::OpError::Dtype { .. })
        ));
    }
}
