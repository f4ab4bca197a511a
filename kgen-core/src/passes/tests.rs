//! Pass tests on hand-built IR.

use crate::ir::{BinaryOp, Block, Builder, Function, Op, Param, ParamKind, TensorParam};
use crate::span::Span;
use crate::types::{DType, Scalar, Shape, ValueType};

fn build() -> Function {
    let mut f = Function::new("k", "k");
    f.params.push(Param {
        name: "x".into(),
        kind: ParamKind::Tensor(TensorParam {
            dtype: DType::F32,
            dims: vec![None],
            contiguous: true,
            align_bytes: 16,
        }),
    });
    let t = ValueType::Tile(DType::F32, Shape(vec![64]));
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
        vec![t.clone()],
        Span::DUMMY,
    )[0];
    let a1 = b.inst(
        &mut body,
        Op::Binary(BinaryOp::Mul, x, x),
        vec![t.clone()],
        Span::DUMMY,
    )[0];
    let a2 = b.inst(
        &mut body,
        Op::Binary(BinaryOp::Mul, x, x),
        vec![t.clone()],
        Span::DUMMY,
    )[0];
    let _dead = b.inst(
        &mut body,
        Op::Binary(BinaryOp::Sub, x, x),
        vec![t.clone()],
        Span::DUMMY,
    )[0];
    let s = b.inst(
        &mut body,
        Op::Binary(BinaryOp::Add, a1, a2),
        vec![t],
        Span::DUMMY,
    )[0];
    b.inst(
        &mut body,
        Op::Store {
            tensor: 0,
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
fn cse_merges_and_dce_removes() {
    let mut f = build();
    assert_eq!(f.body.insts.len(), 7);
    super::optimize(&mut f, &super::PassOptions::default()).unwrap();
    crate::valid::validate(&f).expect("still valid");
    // One mul merged, the dead sub removed.
    assert_eq!(f.body.insts.len(), 5, "{f}");
    let text = f.to_string();
    assert_eq!(text.matches("mul").count(), 1, "{text}");
    assert!(!text.contains("sub"), "{text}");
    assert!(text.contains("add %2, %2"), "{text}");
}
