//! `matmul`: c = a @ b on 2-D tensors, transposed operands as free views
//! (`a.transpose(0, 1)`). f16 and bf16 go to the tensor-core `gemm` (`ops/gemm.rs`) when
//! each operand has a contiguous dimension; f32 (exact FMA, as `dot` promises) and other
//! strides use the strided `kernels-src/matmul.kg` on CUDA cores.

use super::{dtype_err, float_dtype, shape_err, KernelArgs, OpError, Ops};
use kgen_core::types::DType;
use kgen_runtime::{grid_2d, Tensor};

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
        let args = KernelArgs::new()
            .tensor("a", a)
            .tensor("b", b)
            .tensor("c", c);
        let kern = self.kernel("matmul", "matmul", &[("T", t.to_string())], None, &args)?;
        self.launch_args(&kern, grid_2d(m, BM, n, BN)?, &args)
    }
}
