//! The interpreter's element semantics on single scalars, for the checker's folding of
//! typed constants (`EPS * 2.0` with `EPS: f32`, `lowest(i32) + 1`, `1.0 as bf16`): a
//! folded constant is exactly what the interpreter (and so the GPU) would compute.
//!
//! Assumes: nothing; any scalar and operator is accepted.
//! Guarantees: `None` where the interpreter would refuse the operation (an operator the
//! dtype does not have, operands of different dtypes), never a panic; results are
//! those of `eval.rs` (wrapping integers, f16/bf16 rounded after the operation, casts
//! as `ir::Op::Cast`).

use super::eval;
use super::value::{Data, Val};
use crate::ir::{BinaryOp, CmpOp, UnaryOp};
use crate::types::{DType, Scalar};

/// The one element of a scalar value.
fn scalar_of(v: &Val) -> Option<Scalar> {
    let d = v.dtype;
    if !v.is_scalar() {
        return None;
    }
    Some(match &v.data {
        Data::Bool(x) => Scalar::Bool(*x.first()?),
        Data::I32(x) => Scalar::Int(*x.first()? as i64, d),
        Data::U32(x) => Scalar::Int(*x.first()? as i64, d),
        Data::I64(x) => Scalar::Int(*x.first()?, d),
        Data::F(x) => Scalar::Float(*x.first()? as f64, d),
    })
}

fn val(s: Scalar) -> Val {
    Val::from_scalar(s.dtype(), s)
}

/// `a op b` for two scalars of one dtype.
pub(crate) fn fold_binary(op: BinaryOp, a: Scalar, b: Scalar) -> Option<Scalar> {
    if a.dtype() != b.dtype() {
        return None;
    }
    scalar_of(&eval::binary(op, &val(a), &val(b)).ok()?)
}

/// `a op b` for two scalars of one dtype.
pub(crate) fn fold_compare(op: CmpOp, a: Scalar, b: Scalar) -> Option<bool> {
    if a.dtype() != b.dtype() {
        return None;
    }
    eval::compare(op, &val(a), &val(b)).ok()?.as_bool()
}

/// `op a` for a scalar.
pub(crate) fn fold_unary(op: UnaryOp, a: Scalar) -> Option<Scalar> {
    scalar_of(&eval::unary(op, &val(a)).ok()?)
}

/// `a as to`.
pub(crate) fn fold_cast(a: Scalar, to: DType) -> Option<Scalar> {
    scalar_of(&eval::cast_val(&val(a), to).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_with_the_interpreters_rounding_and_wrapping() {
        // bf16: 1 + 2^-9 is not representable; the sum rounds to 1 (nearest even).
        let one = Scalar::Float(1.0, DType::BF16);
        let tiny = Scalar::Float(2f64.powi(-9), DType::BF16);
        assert_eq!(
            fold_binary(BinaryOp::Add, one, tiny),
            Some(Scalar::Float(1.0, DType::BF16))
        );
        // i32 wraps.
        let max = Scalar::Int(i32::MAX as i64, DType::I32);
        let n1 = Scalar::Int(1, DType::I32);
        assert_eq!(
            fold_binary(BinaryOp::Add, max, n1),
            Some(Scalar::Int(i32::MIN as i64, DType::I32))
        );
        // u32 stays zero-extended.
        let u = Scalar::Int(u32::MAX as i64, DType::U32);
        assert_eq!(
            fold_unary(UnaryOp::Neg, u),
            Some(Scalar::Int(1, DType::U32))
        );
        assert_eq!(
            fold_compare(CmpOp::Gt, u, Scalar::Int(0, DType::U32)),
            Some(true)
        );
        // Casts saturate; mixed dtypes and missing operators are refused.
        assert_eq!(
            fold_cast(Scalar::Float(1e10, DType::F32), DType::I32),
            Some(Scalar::Int(i32::MAX as i64, DType::I32))
        );
        assert_eq!(fold_binary(BinaryOp::Add, one, n1), None);
        assert_eq!(
            fold_binary(BinaryOp::Shl, one, Scalar::Float(2.0, DType::BF16)),
            None
        );
    }
}
