//! Helper functions (`functions.rs`): a call gives exactly the IR of its arguments
//! (left to right) and then its body written out at the call, compile-time arguments stay compile-time inside, tensors pass as
//! tensors, and a function without `return` is a procedure. The errors are in
//! tests/diagnostics/fn_*.kg (rendered-text snapshots).

use super::tests::compile_with;
use crate::pipeline::CompileOptions;
use crate::target::Arch;

fn ir(src: &str) -> String {
    let file = crate::span::SourceFile::new("t.kg", src);
    match compile_with(src, &CompileOptions::new(Arch::Sm90a)) {
        Ok((f, _)) => {
            if let Err(d) = crate::valid::validate(&f) {
                panic!("invalid IR: {}\n{f}", d.render(&file));
            }
            f.to_string()
        }
        Err(d) => panic!("unexpected errors:\n{}", d.render(&file)),
    }
}

const CALLED: &str = r#"
fn masked_scale(x, n, s, B) {
    let offs = arange(0, B);
    let mut y = x;
    for i in 0..3 {
        y = y * s + (i as f32);
    }
    return where(offs < n, y, 0.0);
}
fn write(t, i, v) {
    store(t, [i], v);
}
kernel k<BLOCK: int = 256>(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let i = bid(0);
    let t = load(x, [i], [BLOCK]);
    write(y, i, masked_scale(t, shape(x, 0) - i * BLOCK, 2.0, BLOCK));
}
"#;

const WRITTEN_OUT: &str = r#"
kernel k<BLOCK: int = 256>(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let i = bid(0);
    let t = load(x, [i], [BLOCK]);
    let n = shape(x, 0) - i * BLOCK;
    let offs = arange(0, BLOCK);
    let mut z = t;
    for j in 0..3 {
        z = z * 2.0 + (j as f32);
    }
    store(y, [i], where(offs < n, z, 0.0));
}
"#;

#[test]
fn a_call_is_its_body_written_out() {
    assert_eq!(ir(CALLED), ir(WRITTEN_OUT));
}

#[test]
fn compile_time_arguments_stay_compile_time() {
    // B sizes a tile, S is a static_assert's condition and a constant `if`'s.
    let src = r#"
fn ones(B, S) {
    static_assert(B % 16 == 0, "B is a multiple of 16");
    let mut t = full([B], 1.0, f32);
    if S {
        t = t * 2.0;
    }
    return t;
}
kernel k(y: tensor<f32, 1>) {
    store(y, [bid(0)], ones(64, true) + ones(64, false));
}
"#;
    let text = ir(src);
    assert!(text.contains("tile<f32, [64]>"), "{text}");
    assert!(
        !text.contains(" if "),
        "a constant `if` lowers its branch only:\n{text}"
    );
    let bad = src.replace("ones(64, true)", "ones(24, true)");
    let file = crate::span::SourceFile::new("t.kg", bad.as_str());
    let err = compile_with(&bad, &CompileOptions::new(Arch::Sm90a)).unwrap_err();
    assert!(
        err.render(&file).contains("B is a multiple of 16"),
        "{}",
        err.render(&file)
    );
}

#[test]
fn functions_call_functions_and_see_only_their_parameters() {
    let src = r#"
fn sq(t) {
    return t * t;
}
fn sum_sq(t) {
    return sum(sq(t), 0);
}
kernel k(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let t = load(x, [0], [128]);
    store(y, [0], full([1], sum_sq(t), f32));
}
"#;
    let _ = ir(src);
    // A caller's variable is not visible inside.
    let hidden = r#"
fn peek() {
    return t;
}
kernel k(x: tensor<f32, 1>) {
    let t = load(x, [0], [16]);
    store(x, [0], peek());
}
"#;
    let file = crate::span::SourceFile::new("t.kg", hidden);
    let err = compile_with(hidden, &CompileOptions::new(Arch::Sm90a)).unwrap_err();
    let text = err.render(&file);
    assert!(text.contains("E0201") && text.contains("`t`"), "{text}");
}

#[test]
fn the_macro_front_end_and_the_printer_keep_functions() {
    let m = crate::front::parse(&crate::span::SourceFile::new("t.kg", CALLED)).unwrap();
    assert_eq!(m.functions.len(), 2);
    let printed = crate::front::print::print_module(&m);
    let again = crate::front::parse(&crate::span::SourceFile::new("p.kg", printed.as_str()))
        .unwrap_or_else(|d| panic!("{printed}\n{d:?}"));
    assert_eq!(ir(&printed), ir(CALLED), "{printed}");
    assert_eq!(again.functions.len(), 2);
}

#[test]
fn a_function_returns_several_values_as_a_list() {
    let called = r#"
fn tile_of(pid, in_group, tiles_m, G) {
    let first_m = (pid / in_group) * G;
    let rows = min(tiles_m - first_m, G);
    return [first_m + (pid % in_group) % rows, (pid % in_group) / rows];
}
kernel k(x: tensor<f32, 2>, y: tensor<f32, 2>) {
    let [pm, pn] = tile_of(bid(0), 4 * shape(x, 1), shape(x, 0), 4);
    store(y, [pm, pn], load(x, [pm, pn], [16, 16]));
}
"#;
    let written = r#"
kernel k(x: tensor<f32, 2>, y: tensor<f32, 2>) {
    let pid = bid(0);
    let in_group = 4 * shape(x, 1);
    let tiles_m = shape(x, 0);
    let first_m = (pid / in_group) * 4;
    let rows = min(tiles_m - first_m, 4);
    let pm = first_m + (pid % in_group) % rows;
    let pn = (pid % in_group) / rows;
    store(y, [pm, pn], load(x, [pm, pn], [16, 16]));
}
"#;
    assert_eq!(ir(called), ir(written));
    // `let mut [a, b]` makes both mutable; the printer keeps the form.
    let m = r#"
fn pair(t) {
    return [t, t * 2.0];
}
kernel k(x: tensor<f32, 1>) {
    let mut [a, b] = pair(load(x, [0], [16]));
    a += b;
    store(x, [0], a);
}
"#;
    let _ = ir(m);
    let parsed = crate::front::parse(&crate::span::SourceFile::new("m.kg", m)).unwrap();
    let printed = crate::front::print::print_module(&parsed);
    assert!(printed.contains("let mut [a, b] = pair("), "{printed}");
    assert_eq!(ir(&printed), ir(m));
}
