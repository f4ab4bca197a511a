//! The two diagnostic kinds that well-formed source cannot reach through `compile` still
//! render located text: `E0802 Unsupported` (an API caller asking the back end for
//! something it cannot do) and `E0901 InvalidIr` (a compiler bug caught by validation).

use kgen_core::ir::Op;
use kgen_core::{back, compile_to_ir, valid, Arch, CompileOptions, ErrorCode, SourceFile};

const SRC: &str = "kernel k(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let i = bid(0);
    store(y, [i], load(x, [i], [128]) * 2.0);
}
";

#[test]
fn unsupported_warp_count_renders() {
    let file = SourceFile::new("k.kg", SRC);
    let (func, mut spec) = compile_to_ir(&file, &CompileOptions::new(Arch::Sm90a)).unwrap();
    let info = valid::validate(&func).unwrap();
    spec.num_warps = 3;
    let err = back::ptx::write(&func, &info, &Arch::Sm90a.target(), &spec).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::Unsupported);
    insta::assert_snapshot!("unsupported_warps", err.render(&file));
}

#[test]
fn invalid_ir_renders_at_the_instruction() {
    let file = SourceFile::new("k.kg", SRC);
    let (mut func, _) = compile_to_ir(&file, &CompileOptions::new(Arch::Sm80)).unwrap();
    // Break the IR: make the store write the tile index instead of the tile.
    let store = *func.body.insts.last().unwrap();
    let index = match &func.insts[store].op {
        Op::Store { index, .. } => index[0],
        other => panic!("expected a store, found {other:?}"),
    };
    if let Op::Store { value, .. } = &mut func.insts[store].op {
        *value = index;
    }
    let err = valid::validate(&func).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::InvalidIr);
    insta::assert_snapshot!("invalid_ir_store", err.render(&file));
}
