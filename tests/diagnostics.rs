//! Every malformed program in `tests/diagnostics/` gets a located, rendered diagnostic
//! (file:line:col, a caret, a message), snapshotted; none panics. Together they cover
//! every user-facing error code.

mod common;

use kgen_core::{compile, Arch, CompileOptions, ErrorCode, SourceFile};
use std::collections::BTreeSet;

fn programs() -> Vec<(String, String)> {
    let dir = common::repo_root().join("tests/diagnostics");
    let mut v: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "kg"))
        .map(|p| {
            (
                p.file_stem().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn malformed_programs_render_located_diagnostics() {
    let progs = programs();
    assert!(progs.len() >= 20, "only {} malformed programs", progs.len());
    let mut codes = BTreeSet::new();
    for (stem, text) in progs {
        let file = SourceFile::new(format!("{stem}.kg"), text);
        let err = match compile(&file, &CompileOptions::new(Arch::Sm90a)) {
            Ok(_) => panic!("{stem}: compiled, but it should be rejected"),
            Err(e) => e,
        };
        let rendered = err.render(&file);
        for d in &err.0 {
            codes.insert(d.code.code());
            assert_ne!(
                d.code,
                ErrorCode::InvalidIr,
                "{stem}: internal error:\n{rendered}"
            );
        }
        assert!(
            rendered.contains(&format!("{stem}.kg:")),
            "{stem}: no file:line:col\n{rendered}"
        );
        assert!(rendered.contains('^'), "{stem}: no caret\n{rendered}");
        insta::assert_snapshot!(format!("diag_{stem}"), rendered);
    }
    for code in [
        ErrorCode::Syntax,
        ErrorCode::BadLiteral,
        ErrorCode::UndefinedName,
        ErrorCode::Redefinition,
        ErrorCode::UnknownFunction,
        ErrorCode::BadArguments,
        ErrorCode::TypeMismatch,
        ErrorCode::WrongKind,
        ErrorCode::ImmutableAssign,
        ErrorCode::ShapeMismatch,
        ErrorCode::BadAxis,
        ErrorCode::BadTileShape,
        ErrorCode::NotConstant,
        ErrorCode::BadSpecialization,
        ErrorCode::StaticAssert,
        ErrorCode::ConstEval,
        ErrorCode::BadAccess,
        ErrorCode::BadMemoryOp,
        ErrorCode::BadControlFlow,
        ErrorCode::TargetLimit,
    ] {
        assert!(
            codes.contains(code.code()),
            "no malformed program produces {code:?}"
        );
    }
}

#[test]
fn unknown_kernel_and_bad_define_are_reported() {
    let file = SourceFile::new(
        "ok.kg",
        "kernel k<B: int = 128>(x: tensor<f32, 1>) { let i = bid(0); store(x, [i], load(x, [i], [B])); }",
    );
    let err = compile(&file, &CompileOptions::new(Arch::Sm80).kernel("nope")).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::NoSuchKernel);
    insta::assert_snapshot!("diag_no_such_kernel", err.render(&file));
    let err = compile(&file, &CompileOptions::new(Arch::Sm80).define("C", 3)).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::BadSpecialization);
    insta::assert_snapshot!("diag_unknown_define", err.render(&file));
    let err = compile(&file, &CompileOptions::new(Arch::Sm80).define("B", "f32")).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::BadSpecialization);
    insta::assert_snapshot!("diag_define_wrong_kind", err.render(&file));
}

#[test]
fn bad_min_blocks_per_sm_is_reported() {
    let file = SourceFile::new(
        "ok.kg",
        "kernel k(x: tensor<f32, 1>) { let i = bid(0); store(x, [i], load(x, [i], [1024])); }",
    );
    // Zero blocks: a bad specialization.
    let mut opts = CompileOptions::new(Arch::Sm90a);
    opts.min_blocks_per_sm = Some(0);
    let err = compile(&file, &opts).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::BadSpecialization);
    insta::assert_snapshot!("diag_min_blocks_zero", err.render(&file));
    // More threads than an SM holds: a target limit, located at the kernel's first
    // instruction.
    let mut opts = CompileOptions::new(Arch::Sm90a);
    opts.num_warps = Some(32);
    opts.min_blocks_per_sm = Some(3);
    let err = compile(&file, &opts).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::TargetLimit);
    let rendered = err.render(&file);
    assert!(rendered.contains('^'), "{rendered}");
    insta::assert_snapshot!("diag_min_blocks_too_many_threads", rendered);
    // A bound that fits: `.minnctapersm` in the PTX, with the register budget of two
    // blocks of 512 threads (65536 / 1024), and `__b2` in the entry name.
    let mut opts = CompileOptions::new(Arch::Sm90a);
    opts.num_warps = Some(16);
    opts.min_blocks_per_sm = Some(2);
    let k = compile(&file, &opts).unwrap();
    assert!(
        k.ptx
            .contains(".maxntid 512, 1, 1\n.maxnreg 64\n.minnctapersm 2\n"),
        "{}",
        k.ptx
    );
    assert!(k.entry.contains("__w16__b2"), "{}", k.entry);
    assert!(
        k.spec.key().contains(";min_blocks_per_sm=2;"),
        "{}",
        k.spec.key()
    );
}

#[test]
fn cluster_gather_needs_sm90a_and_a_whole_number_of_clusters() {
    let file = SourceFile::new(
        "cluster.kg",
        "kernel k(x: tensor<f32, 1>, y: tensor<f32, 1>) {\n    let m = max(load(x, [bid(0)], [256]), 0);\n    let all = cluster_gather(m, 4);\n    store(y, [bid(0)], full([1], max(all, 0)));\n}\n",
    );
    // sm_80 has no thread-block clusters: an Unsupported diagnostic at the gather.
    let err = compile(&file, &CompileOptions::new(Arch::Sm80)).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::Unsupported);
    insta::assert_snapshot!("diag_cluster_gather_sm80", err.render(&file));
    // sm_90a: the entry declares its cluster shape and the launch hints carry it.
    let k = compile(&file, &CompileOptions::new(Arch::Sm90a)).unwrap();
    assert!(k.ptx.contains(".reqnctapercluster 4, 1, 1\n"), "{}", k.ptx);
    assert!(k.ptx.contains("mapa.shared::cluster.u32"), "{}", k.ptx);
    assert_eq!(k.launch.cluster_size, 4);
    // A kernel without clusters launches as before.
    let plain = SourceFile::new(
        "plain.kg",
        "kernel k(x: tensor<f32, 1>) { let i = bid(0); store(x, [i], load(x, [i], [256])); }",
    );
    let k = compile(&plain, &CompileOptions::new(Arch::Sm90a)).unwrap();
    assert_eq!(k.launch.cluster_size, 1);
    assert!(!k.ptx.contains("cluster"), "{}", k.ptx);
}
