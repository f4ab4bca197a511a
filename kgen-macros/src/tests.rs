//! Unit tests of the macro on `proc_macro2` tokens: the expansion snapshot, the
//! error path (errors plus the fallback module) and the lowering of every construct.

use super::kernel_impl;
use quote::quote;

/// The expansion with a line break after `;`, `{` and `}` (no rustfmt here).
fn expand(item: proc_macro2::TokenStream) -> String {
    let func: syn::ItemFn = syn::parse2(item).expect("an fn");
    let text = kernel_impl(proc_macro2::TokenStream::new(), &func).to_string();
    let mut out = String::new();
    let (mut in_str, mut escaped) = (false, false);
    for c in text.chars() {
        out.push(c);
        if in_str {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
        } else if c == '"' {
            in_str = true;
        } else if matches!(c, ';' | '{' | '}') {
            out.push('\n');
        }
    }
    out
}

#[test]
fn vec_add_expansion() {
    let out = expand(quote! {
        /// Adds.
        pub fn vec_add<T: Float = f32, const BLOCK: i32 = 1024>(
            x: Tensor<T, 1, Contiguous>,
            y: Tensor<T, 1, Contiguous>,
            out: Tensor<T, 1, Contiguous>,
            alpha: f32,
        ) {
            let i = bid(0);
            store(out, [i], load(x, [i], [BLOCK]) + load(y, [i], [BLOCK]) * alpha);
        }
    });
    assert!(!out.contains("compile_error"), "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn errors_come_with_the_fallback_module() {
    let out = expand(quote! {
        fn bad(x: Tensor<f32, 1>, n: i32) {
            let t = load(x, [0], [64]) + missing;
            store(x, [0], t);
        }
    });
    assert!(out.contains("compile_error"), "{out}");
    assert!(out.contains("cannot find `missing`"), "{out}");
    assert!(out.contains("pub const SOURCE : & str = \"\""), "{out}");
    assert!(out.contains("pub fn launch"), "{out}");
    assert!(out.contains("n : i32"), "{out}");
}

#[test]
fn parameter_names_do_not_clash_with_the_launcher() {
    // Parameters named like the launcher's own items and locals still expand.
    let out = expand(quote! {
        fn k(gpu: Tensor<f32, 1>, grid: Tensor<f32, 1>, compile: f32, args: i32, t: Tensor<f32, 1>) {
            store(gpu, [0], load(grid, [0], [64]) * compile + (args as f32) + load(t, [0], [64]));
        }
    });
    assert!(!out.contains("compile_error"), "{out}");
}

#[test]
fn unsupported_syntax_is_reported_not_panicked() {
    let out = expand(quote! {
        fn k(x: Tensor<f32, 1>) {
            let a = x.field;
            let b = (1, 2);
            let c = &a;
            let d = 99999999999999999999999999;
            let e = foo::bar(1);
            let (p, q) = (1, 2);
            x = 1;
            let f = a ** 2.0;
            return;
        }
    });
    for msg in [
        "`.field` is not a property: the only property is `.dtype`",
        "Rust has no power operator",
        "tuples are not supported",
        "references are not supported",
        "integer literal too large",
        "only builtin functions can be called",
        "`let` binds one plain name",
        "`return` needs a value",
    ] {
        assert!(out.contains(msg), "missing `{msg}` in {out}");
    }
}

/// `#[kernels]`: a module without its items is an error; a helper's error reached from
/// two kernels is reported once; each kernel module is generated (the fallback where its
/// check failed).
#[test]
fn kernels_modules() {
    let run = |item: proc_macro2::TokenStream| {
        let m: syn::ItemMod = syn::parse2(item).expect("a module");
        crate::module::kernels_impl(proc_macro2::TokenStream::new(), &m).to_string()
    };
    let out = run(quote! { mod outside; });
    assert!(out.contains("needs the module's items here"), "{out}");

    let out = run(quote! {
        pub mod m {
            fn h(t: _) -> _ { t + true }
            #[kernel]
            pub fn a(x: Tensor<f32, 1>) { store(x, [0], h(load(x, [0], [64]))); }
            #[kernel]
            pub fn b(x: Tensor<f32, 1>) { store(x, [0], h(load(x, [0], [32]))); }
        }
    });
    assert_eq!(out.matches("cannot be used as `f32`").count(), 1, "{out}");
    assert!(out.contains("pub mod m"), "{out}");
    assert!(
        out.contains("pub mod a") && out.contains("pub mod b"),
        "{out}"
    );

    let out = run(quote! {
        mod m {
            fn h(t: _) -> _ { t * 2.0 }
            #[kgen::kernel]
            pub fn a(x: Tensor<f32, 1>) { store(x, [0], h(load(x, [0], [64]))); }
        }
    });
    assert!(!out.contains("compile_error"), "{out}");
    assert!(
        out.contains("fn h(t) {"),
        "the helper is in a's SOURCE: {out}"
    );
}
