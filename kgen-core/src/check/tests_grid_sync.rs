//! Checker tests of `grid_sync(counter)`: the rendered text (file:line:col, carets, the
//! secondary label, notes) of each diagnostic it can give, snapshotted in `snapshots/`
//! (a non-uniform `if`, non-uniform loop bounds, a condition made block-dependent
//! through loop-carried values, a counter of the wrong dtype or rank, a kernel that
//! already uses clusters), and the control flow every block runs alike, which it accepts.
//!
//! The uniformity tests render what the checker reports; where the checker accepts a
//! kernel they render what its uniformity analysis (`uniform::grid_sync_errors`) finds
//! on the lowered IR, so the snapshot shows the text a user should get, and then assert
//! that the checker does refuse the kernel.

use super::tests::compile_with;
use crate::diag::{Diagnostics, ErrorCode};
use crate::pipeline::CompileOptions;
use crate::span::SourceFile;
use crate::target::Arch;

fn sm80() -> CompileOptions {
    CompileOptions::new(Arch::Sm80)
}

/// The errors of `src`, which must not check.
fn errors(src: &str, opts: &CompileOptions) -> Diagnostics {
    match compile_with(src, opts) {
        Ok((f, _)) => panic!("expected an error, got IR:\n{f}"),
        Err(d) => d,
    }
}

/// The rendered text of `src`'s one error, which has `code`.
fn rendered_one(src: &str, opts: &CompileOptions, code: ErrorCode) -> String {
    let d = errors(src, opts);
    let text = d.render(&SourceFile::new("t.kg", src));
    assert_eq!(d.0.len(), 1, "expected one error:\n{text}");
    assert_eq!(d.0[0].code, code, "{text}");
    text
}

/// The uniformity errors of `src`: the checker's, or, where the checker accepts `src`,
/// those its uniformity analysis finds on the lowered IR; and whether the checker
/// accepted it.
fn uniformity(src: &str, opts: &CompileOptions) -> (Diagnostics, bool) {
    match compile_with(src, opts) {
        Ok((f, _)) => (
            Diagnostics(super::uniform::grid_sync_errors(&f, &f.body)),
            true,
        ),
        Err(d) => (d, false),
    }
}

/// The rendered text of `src`'s one uniformity error (E0701); asserts that the checker
/// reports it.
fn rendered_uniformity(src: &str, snapshot: &str) {
    let (d, accepted) = uniformity(src, &sm80());
    let text = d.render(&SourceFile::new("t.kg", src));
    assert_eq!(d.0.len(), 1, "expected one error:\n{text}");
    assert_eq!(d.0[0].code, ErrorCode::BadControlFlow, "{text}");
    insta::assert_snapshot!(snapshot, text);
    assert!(
        !accepted,
        "the checker accepted this kernel, although its uniformity analysis reports:\n{text}"
    );
}

/// Checks `src` and validates its IR, and the uniformity analysis finds nothing on it;
/// panics with the rendered errors.
fn accepts(src: &str, opts: &CompileOptions) {
    let file = SourceFile::new("t.kg", src);
    match compile_with(src, opts) {
        Ok((f, _)) => {
            if let Err(d) = crate::valid::validate(&f) {
                panic!("invalid IR: {}\n{f}", d.render(&file));
            }
            assert!(crate::ir::has_grid_sync(&f), "no grid_sync in\n{f}");
            let errs = Diagnostics(super::uniform::grid_sync_errors(&f, &f.body));
            assert!(errs.0.is_empty(), "{}", errs.render(&file));
        }
        Err(d) => panic!("unexpected errors:\n{}", d.render(&file)),
    }
}

// ---------------------------------------------------------------- block-dependent control flow

const IF_ON_BID: &str = "\
kernel k(x: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    store(x, [i], load(x, [i], [128]) * 2.0);
    if bid(0) == 0 {
        grid_sync(counter);
    }
}
";

#[test]
fn grid_sync_under_an_if_on_bid_renders() {
    rendered_uniformity(IF_ON_BID, "grid_sync_if_on_bid");
}

const LOOP_TO_BID: &str = "\
kernel k(x: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    for r in 0..bid(0) {
        store(x, [i], load(x, [i], [128]) + 1.0);
        grid_sync(counter);
    }
}
";

#[test]
fn grid_sync_in_a_loop_to_bid_renders() {
    rendered_uniformity(LOOP_TO_BID, "grid_sync_loop_to_bid");
}

/// `c` is block-dependent only through two loop-carried steps (`a` from a load, then `b`
/// from `a`, then `c` from `b`): the uniformity check must iterate to its fixpoint.
const LOOP_CARRIED: &str = "\
kernel k(flags: tensor<i32, 1>, counter: tensor<i32, 1>) {
    let mut a = 0;
    let mut b = 0;
    let mut c = 0;
    for r in 0..4 {
        c = b;
        b = a;
        a = item(load(flags, [r], [1]));
    }
    if c > 0 {
        grid_sync(counter);
    }
}
";

#[test]
fn grid_sync_under_an_if_on_a_loop_carried_load_renders() {
    rendered_uniformity(LOOP_CARRIED, "grid_sync_if_on_loop_carried_load");
}

#[test]
fn every_block_dependent_source_is_refused() {
    let k = |body: &str| {
        format!(
            "kernel k(x: tensor<f32, 1>, xi: tensor<i32, 1>, counter: tensor<i32, 1>) {{\n    let i = bid(0);\n{body}\n}}\n"
        )
    };
    let mut accepted_by_checker = Vec::new();
    for (what, body) in [
        // The else branch of a block-dependent `if`.
        ("else", "    if i > 3 { } else { grid_sync(counter); }"),
        // A load, a gather and an atomic's old value, through arithmetic.
        (
            "load",
            "    let v = item(load(xi, [0], [1])) * 2 + 1;\n    if v == 0 { grid_sync(counter); }",
        ),
        (
            "gather",
            "    let g = sum(gather(xi, [arange(0, 4)]), 0);\n    if g != 0 { grid_sync(counter); }",
        ),
        (
            "atomic",
            "    let old = sum(atomic_add(xi, [zeros([1], i32)], full([1], 1, i32)), 0);\n    if old == 0 { grid_sync(counter); }",
        ),
        // A value that an `if` on bid yields.
        (
            "if result",
            "    let mut n = 1;\n    if i == 0 { n = 2; }\n    for r in 0..n { grid_sync(counter); }",
        ),
        // A uniform loop inside a block-dependent `if`.
        (
            "nested",
            "    if i % 2 == 0 { for r in 0..4 { grid_sync(counter); } }",
        ),
        // A block-dependent loop lower bound.
        ("lower bound", "    for r in i..8 { grid_sync(counter); }"),
    ] {
        let src = k(body);
        let (d, accepted) = uniformity(&src, &sm80());
        let text = d.render(&SourceFile::new("t.kg", &src));
        assert!(!d.0.is_empty(), "{what}: no error:\n{src}");
        assert!(
            d.0.iter().all(|e| e.code == ErrorCode::BadControlFlow),
            "{what}:\n{text}"
        );
        assert!(
            text.contains("`grid_sync` inside a"),
            "{what}: {src}\n{text}"
        );
        if accepted {
            accepted_by_checker.push(what);
        }
    }
    assert!(
        accepted_by_checker.is_empty(),
        "the checker accepted {accepted_by_checker:?}, which its uniformity analysis refuses"
    );
}

// ---------------------------------------------------------------- the counter

const F32_COUNTER: &str = "\
kernel k(x: tensor<f32, 1>, counter: tensor<f32, 1>) {
    let i = bid(0);
    grid_sync(counter);
    store(x, [i], load(x, [i], [128]));
}
";

const RANK2_COUNTER: &str = "\
kernel k(x: tensor<f32, 1>, counter: tensor<i32, 2>) {
    let i = bid(0);
    grid_sync(counter);
    store(x, [i], load(x, [i], [128]));
}
";

#[test]
fn a_counter_not_a_1d_i32_tensor_renders() {
    let text = rendered_one(F32_COUNTER, &sm80(), ErrorCode::TypeMismatch);
    insta::assert_snapshot!("grid_sync_f32_counter", text);
    let text = rendered_one(RANK2_COUNTER, &sm80(), ErrorCode::TypeMismatch);
    insta::assert_snapshot!("grid_sync_rank2_counter", text);
}

#[test]
fn a_counter_that_is_not_a_tensor_parameter_is_refused() {
    for (what, src) in [
        ("scalar", "kernel k(n: i32) {\n    grid_sync(n);\n}\n"),
        (
            "tile",
            "kernel k(x: tensor<i32, 1>) {\n    grid_sync(load(x, [0], [1]));\n}\n",
        ),
        ("missing", "kernel k() {\n    grid_sync();\n}\n"),
    ] {
        let d = errors(src, &sm80());
        let text = d.render(&SourceFile::new("t.kg", src));
        assert!(!d.0.is_empty(), "{what}");
        assert!(text.contains("t.kg:2:"), "{what}:\n{text}");
    }
}

// ---------------------------------------------------------------- clusters

const AFTER_CLUSTER_RANK: &str = "\
kernel k(x: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let r = cluster_rank(2);
    store(x, [bid(0)], load(x, [bid(0)], [128]) + (r as f32));
    grid_sync(counter);
}
";

#[test]
fn grid_sync_after_cluster_rank_renders() {
    let o = CompileOptions::new(Arch::Sm90a);
    let text = rendered_one(AFTER_CLUSTER_RANK, &o, ErrorCode::Unsupported);
    insta::assert_snapshot!("grid_sync_after_cluster_rank", text);
}

/// The other order: clusters after a `grid_sync` are refused as well (by the checker or
/// later in the pipeline), never compiled into a cooperative kernel with clusters.
#[test]
fn cluster_rank_after_grid_sync_is_refused() {
    let src = "\
kernel k(x: tensor<f32, 1>, counter: tensor<i32, 1>) {
    grid_sync(counter);
    let r = cluster_rank(2);
    store(x, [bid(0)], load(x, [bid(0)], [128]) + (r as f32));
}
";
    let file = SourceFile::new("t.kg", src);
    match crate::compile(&file, &CompileOptions::new(Arch::Sm90a)) {
        Ok(k) => panic!(
            "compiled: cooperative {}, cluster size {}",
            k.launch.cooperative, k.launch.cluster_size
        ),
        Err(d) => {
            let text = d.render(&file);
            assert!(
                d.0.iter().any(|e| e.code == ErrorCode::Unsupported),
                "{text}"
            );
            assert!(text.contains("t.kg:"), "{text}");
        }
    }
}

// ---------------------------------------------------------------- accepted

#[test]
fn uniform_control_flow_is_accepted() {
    let o = sm80();
    // A loop to a compile-time constant.
    accepts(
        "kernel k<STEPS: int = 3>(x: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    for it in 0..STEPS {
        store(x, [i], load(x, [(i + 1) % num_bids(0)], [128]) + 1.0);
        grid_sync(counter);
    }
}
",
        &o,
    );
    // A grid-stride trip count from shape and num_bids.
    accepts(
        "kernel k(x: tensor<f32, 1>, counter: tensor<i32, 1>) {
    for r in 0..cdiv(shape(x, 0), num_bids(0)) {
        let t = bid(0) + r * num_bids(0);
        store(x, [t], load(x, [t], [128]) * 2.0);
        grid_sync(counter);
    }
}
",
        &o,
    );
    // An `if` on a scalar parameter.
    accepts(
        "kernel k(x: tensor<f32, 1>, counter: tensor<i32, 1>, N: i32) {
    let i = bid(0);
    if N > 0 {
        grid_sync(counter);
    }
    store(x, [i], load(x, [i], [128]));
}
",
        &o,
    );
    // Block-dependent work around, not around the grid_sync: an `if` on bid before it,
    // a loop whose body loads, and a loop-carried value that stays uniform.
    accepts(
        "kernel k(x: tensor<f32, 1>, counter: tensor<i32, 1>, n: i32) {
    let i = bid(0);
    if i == 0 {
        store(x, [i], load(x, [i], [128]) * 0.5);
    }
    let mut steps = 0;
    for r in 0..n {
        let v = item(load(x, [r], [1]));
        if v > 0.0 {
            store(x, [r], full([1], 0.0));
        }
        steps = steps + 2;
        grid_sync(counter);
    }
    for r in 0..steps {
        grid_sync(counter);
    }
}
",
        &o,
    );
}
