//! Compile-fail tests for `#[kgen::kernel]`: every user error is reported at the right
//! token (`tests/ui/*.rs` with their expected `.stderr`). Regenerate with
//! `TRYBUILD=overwrite cargo test --test macro_ui` and read every changed `.stderr`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
