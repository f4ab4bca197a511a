//! Validator tests on hand-built IR: good IR passes, each broken invariant is reported.

use super::*;
use crate::ir::{Builder, Function, Op, Param, ParamKind, TensorParam};
use crate::types::{DType, Scalar, Shape, ValueType};

fn tile(d: DType, n: u32) -> ValueType {
    ValueType::Tile(d, Shape(vec![n]))
}

fn vec_add() -> Function {
    let mut f = Function::new("k", "k");
    for name in ["x", "y"] {
        f.params.push(Param {
            name: name.into(),
            kind: ParamKind::Tensor(TensorParam {
                dtype: DType::F32,
                dims: vec![None],
                contiguous: true,
                align_bytes: 16,
            }),
        });
    }
    let mut body = Block::default();
    let mut b = Builder { func: &mut f };
    let i = b.inst(
        &mut body,
        Op::ProgramId(0),
        vec![ValueType::Scalar(DType::I32)],
        Span::DUMMY,
    )[0];
    let x = b.inst(
        &mut body,
        Op::Load {
            tensor: 0,
            index: vec![i],
            padding: Scalar::Float(0.0, DType::F32),
            eviction: Default::default(),
        },
        vec![tile(DType::F32, 128)],
        Span::DUMMY,
    )[0];
    let s = b.inst(
        &mut body,
        Op::Binary(crate::ir::BinaryOp::Add, x, x),
        vec![tile(DType::F32, 128)],
        Span::DUMMY,
    )[0];
    b.inst(
        &mut body,
        Op::Store {
            tensor: 1,
            index: vec![i],
            value: s,
            eviction: Default::default(),
        },
        vec![],
        Span::DUMMY,
    );
    f.body = body;
    f
}

#[test]
fn valid_function_passes_with_facts() {
    let info = validate(&vec_add()).expect("valid");
    assert_eq!(info.tensor_access, vec![(true, false), (false, true)]);
    assert_eq!(info.grid_rank, 1);
    assert_eq!(info.max_tile_elements, 128);
}

#[test]
fn use_before_definition_is_reported() {
    let mut f = vec_add();
    f.body.insts.swap(0, 1);
    let err = validate(&f).unwrap_err();
    assert!(
        err.0[0].message.contains("used before its definition"),
        "{err}"
    );
    assert_eq!(err.0[0].code, ErrorCode::InvalidIr);
}

#[test]
fn type_mismatch_is_reported() {
    let mut f = vec_add();
    // Make the add's result an i32 tile.
    let add = f.body.insts[2];
    let r = f.insts[add].results[0];
    f.values[r].ty = tile(DType::I32, 128);
    let err = validate(&f).unwrap_err();
    assert!(
        err.0.iter().any(|d| d.message.contains("binary operands")),
        "{err}"
    );
}

#[test]
fn yield_outside_region_is_reported() {
    let mut f = vec_add();
    let mut body = std::mem::take(&mut f.body);
    Builder { func: &mut f }.inst(&mut body, Op::Yield(vec![]), vec![], Span::DUMMY);
    f.body = body;
    let err = validate(&f).unwrap_err();
    assert!(err.0[0].message.contains("`yield` outside"), "{err}");
}

#[test]
fn bad_tile_shape_is_reported() {
    let mut f = vec_add();
    f.values.append(crate::ir::Value {
        ty: ValueType::Tile(DType::F32, Shape(vec![0])),
        name: None,
    });
    let err = validate(&f).unwrap_err();
    assert!(err.0[0].message.contains("zero extent"), "{err}");
}
