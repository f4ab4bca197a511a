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
        ErrorCode::AmbiguousCall,
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
        "kernel k(x: tensor<f32, 1>, y: tensor<f32, 1>) {\n    let m = max(load(x, [bid(0)], [256]), axis = 0);\n    let all = cluster_gather(m, 4);\n    store(y, [bid(0)], full([1], max(all, axis = 0)));\n}\n",
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

/// `cluster_rank` is `bid(0) % C` on the interpreter, `%cluster_ctarank` of a cluster
/// entry on sm_90a, and an Unsupported diagnostic on sm_80 (no clusters).
#[test]
fn cluster_rank_needs_sm90a_and_declares_the_cluster() {
    let file = SourceFile::new(
        "rank.kg",
        "kernel k(y: tensor<i32, 1>) {\n    store(y, [bid(0)], full([1], cluster_rank(4)));\n}\n",
    );
    let err = compile(&file, &CompileOptions::new(Arch::Sm80)).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::Unsupported);
    insta::assert_snapshot!("diag_cluster_rank_sm80", err.render(&file));
    let k = compile(&file, &CompileOptions::new(Arch::Sm90a)).unwrap();
    assert!(k.ptx.contains(".reqnctapercluster 4, 1, 1\n"), "{}", k.ptx);
    assert!(k.ptx.contains("%cluster_ctarank"), "{}", k.ptx);
    assert_eq!(k.launch.cluster_size, 4);
}

/// Tensor-core `dot`s whose staged tiles do not fit: an explicit pipeline depth is
/// refused with the bytes it needs and the depth that fits; a tile whose epilogue needs
/// more shared memory than the target has is refused with the buffers alive at the peak.
#[test]
fn tensor_core_shared_memory_limits_are_reported() {
    let gemm = |bm: u32, bn: u32, bk: u32| {
        SourceFile::new(
            "gemm.kg",
            format!(
                "kernel g(a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>) {{
    let mut acc = zeros([{bm}, {bn}], f32);
    for k in 0..cdiv(shape(a, 1), {bk}) {{
        acc = dot(load(a, [bid(0), k], [{bm}, {bk}]), load(b, [k, bid(1)], [{bk}, {bn}]), acc);
    }}
    store(c, [bid(0), bid(1)], acc as bf16);
}}
"
            ),
        )
    };
    // 8 stages of 256x64 and 64x256 bf16 tiles: 8 x 64 KiB.
    let file = gemm(256, 256, 64);
    let mut opts = CompileOptions::new(Arch::Sm90a);
    opts.num_warps = Some(8);
    opts.num_stages = Some(8);
    let err = compile(&file, &opts).unwrap_err();
    assert_eq!(err.0[0].code, ErrorCode::TargetLimit);
    let rendered = err.render(&file);
    assert!(rendered.contains("524288 bytes"), "{rendered}");
    assert!(rendered.contains("use 3 stages"), "{rendered}");
    insta::assert_snapshot!("diag_pipeline_stages_too_many", rendered);
    // The same depth fits sm_90a when the tiles are smaller.
    let mut opts = CompileOptions::new(Arch::Sm90a);
    opts.num_warps = Some(4);
    opts.num_stages = Some(4);
    assert!(compile(&gemm(128, 128, 32), &opts).is_ok());
    // A 200 KiB scratch buffer beside the dot: the pipeline keeps to what is left (one
    // stage), and the epilogue's layout conversion, which does not fit whole on top of
    // the scratch, goes through half its buffer twice.
    let file = SourceFile::new(
        "gemm_scratch.kg",
        "kernel g(a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>, x: tensor<f32, 1, contiguous>) {
    let cache = scratch(25, [2048], f32);
    scratch_store(cache, 0, load(x, [0], [2048]));
    let mut acc = zeros([128, 128], f32);
    for k in 0..cdiv(shape(a, 1), 32) {
        acc = dot(load(a, [bid(0), k], [128, 32]), load(b, [k, bid(1)], [32, 128]), acc);
    }
    store(c, [bid(0), bid(1)], acc as bf16);
    store(x, [0], scratch_load(cache, 0));
}
",
    );
    let mut opts = CompileOptions::new(Arch::Sm90a);
    opts.num_warps = Some(8);
    let k = compile(&file, &opts).unwrap_or_else(|e| panic!("{}", e.render(&file)));
    assert!(k.ptx.contains("layout conversion in two halves"));
    // A transpose (no halves: its map is not the identity) on top of the same scratch
    // does not fit, and the diagnostic lists what is alive at the peak.
    let file = SourceFile::new(
        "transpose_scratch.kg",
        "kernel g(x: tensor<f32, 2, contiguous>, y: tensor<f32, 2, contiguous>, z: tensor<f32, 1, contiguous>) {
    let cache = scratch(25, [2048], f32);
    scratch_store(cache, 0, load(z, [0], [2048]));
    store(y, [0, 0], transpose(load(x, [0, 0], [64, 128])));
    store(z, [0], scratch_load(cache, 0));
}
",
    );
    let err = compile(&file, &opts).unwrap_err();
    let rendered = err.render(&file);
    assert_eq!(err.0[0].code, ErrorCode::TargetLimit, "{rendered}");
    assert!(
        rendered.contains("at the peak these buffers are alive"),
        "{rendered}"
    );
    insta::assert_snapshot!("diag_shared_memory_over_limit", rendered);
}
