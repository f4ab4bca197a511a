//! `matmul`: c = a @ b on 2-D tensors, transposed operands as free views
//! (`a.transpose(0, 1)`). f16 and bf16 go to the tensor-core `gemm` (`ops/gemm.rs`) when
//! each operand has a contiguous dimension; f32 (exact FMA, as `dot` promises) and other
//! strides use the strided `kernels-src/matmul.kg` on CUDA cores.

use super::{dtype_err, float_dtype, shape_err, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_2d, Arg, Tensor};

const BM: usize = 32;
const BN: usize = 32;

impl Ops {
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
            return self.gemm_into(a, b, None, super::gemm::Activation::None, c);
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
        let kern = self.kernel(
            "matmul",
            "matmul",
            &[("T", t.to_string())],
            None,
            &[("a", a), ("b", b), ("c", c)],
        )?;
        self.launch(
            &kern,
            grid_2d(m, BM, n, BN)?,
            &[Arg::from(a), Arg::from(b), Arg::from(c)],
        )
    }
}

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
