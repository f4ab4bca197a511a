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

/// A persistent GEMM; `FIX` adds a runtime `if` to its tile index.
fn persistent_src(fix: bool) -> String {
    let (m, fix) = if fix {
        ("mut ", "if t >= tiles { t = 0; }")
    } else {
        ("", "")
    };
    format!(
        r#"
kernel pmm<BM: int = 128, BN: int = 128, BK: int = 64>(
    a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>,
) {{
    let tiles_n = cdiv(shape(c, 1), BN);
    let tiles = cdiv(shape(c, 0), BM) * tiles_n;
    for i in 0..cdiv(tiles - bid(0), num_bids(0)) {{
        let {m}t = bid(0) + i * num_bids(0);
        {fix}
        let mut acc = zeros([BM, BN], f32);
        for k in 0..cdiv(shape(a, 1), BK) {{
            acc = dot(load(a, [t / tiles_n, k], [BM, BK]), load(b, [k, t % tiles_n], [BK, BN]), acc);
        }}
        store(c, [t / tiles_n, t % tiles_n], acc as bf16);
    }}
}}
"#
    )
}

/// Where the fetches of a persistent GEMM's ring sit: (before the outer loop, in its
/// body before the inner loop, in its body after the inner loop), and whether a drain
/// follows the outer loop.
fn fetch_places(fix: bool, arch: crate::target::Arch, ws: bool) -> (usize, usize, usize, bool) {
    let src = persistent_src(fix);
    let file = crate::span::SourceFile::new("pmm.kg", &src);
    let mut o = crate::pipeline::CompileOptions::new(arch);
    o.num_warps = Some(8);
    o.num_stages = Some(4);
    o.ws = ws;
    let (f, _) =
        crate::pipeline::compile_to_ir(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let is_fetch = |i: &crate::ir::InstId| matches!(f.insts[*i].op, Op::ScratchFetch { .. });
    let top = &f.body.insts;
    let outer = top
        .iter()
        .position(|&i| matches!(f.insts[i].op, Op::For { .. }))
        .expect("the outer loop");
    let Op::For { body, .. } = &f.insts[top[outer]].op else {
        unreachable!()
    };
    let inner = body
        .insts
        .iter()
        .position(|&i| matches!(f.insts[i].op, Op::For { .. }))
        .expect("the inner loop");
    let drained = top[outer + 1..]
        .iter()
        .any(|&i| matches!(f.insts[i].op, Op::ScratchWait { pending: 0 }));
    (
        top[..outer].iter().filter(|i| is_fetch(i)).count(),
        body.insts[..inner].iter().filter(|i| is_fetch(i)).count(),
        body.insts[inner..].iter().filter(|i| is_fetch(i)).count(),
        drained,
    )
}

/// `passes/cross_round.rs`: the inner loop's prologue (2 iterations of 2 tiles with a
/// wgmma lag at 4 stages on sm_90a, 3 on sm_80) is fetched before the outer loop and,
/// for the next round, at the end of the round (after the inner loop); not when the tile
/// index goes through a runtime `if`, nor in a warp-specialized kernel (its producer
/// runs ahead itself).
#[test]
fn a_persistent_loop_prefetches_its_next_round() {
    use crate::target::Arch;
    assert_eq!(fetch_places(false, Arch::Sm90a, false), (4, 0, 4, true));
    assert_eq!(fetch_places(false, Arch::Sm80, false), (6, 0, 6, true));
    assert_eq!(fetch_places(true, Arch::Sm90a, false), (0, 4, 0, false));
    assert_eq!(fetch_places(false, Arch::Sm90a, true), (0, 4, 0, false));
}
