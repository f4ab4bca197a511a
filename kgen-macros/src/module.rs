//! `#[kernels]` on an inline module: kernels that share helper functions.
//!
//! Every `fn` of the module marked `#[kernel]` becomes a kernel module as
//! `#[kernel]` alone makes it; every other `fn` is a helper that each of them may call
//! (a `.kg` file's top-level `fn`s beside several kernels). Each kernel's `SOURCE` holds
//! the module's helpers and its own nested ones, so each compiles alone.
//!
//! Assumes: the attribute is expanded before the inner `#[kernel]` attributes (an outer
//! attribute sees its item unexpanded), so this macro consumes them.
//! Guarantees: the output is the module with the same attributes, visibility and name,
//! holding one generated kernel module per kernel; every error (an item that is neither,
//! an attribute other than a doc comment, a diagnostic of any kernel's check, located in
//! a helper or a kernel) is reported, with the fallback modules, as `#[kernel]` does.

use crate::{expand, from_syn};
use proc_macro2::TokenStream;
use quote::quote;

/// Whether `a` is the `#[kernel]` (or `#[kgen::kernel]`) marker.
fn is_kernel_attr(a: &syn::Attribute) -> bool {
    let p = a.path();
    p.segments.last().is_some_and(|s| s.ident == "kernel")
        && (p.segments.len() == 1 || (p.segments.len() == 2 && p.segments[0].ident == "kgen"))
}

fn error_count(e: &Option<syn::Error>) -> usize {
    e.as_ref().map_or(0, |e| e.clone().into_iter().count())
}

pub fn kernels_impl(attr: TokenStream, m: &syn::ItemMod) -> TokenStream {
    let mut lower = from_syn::Lower::new();
    if !attr.is_empty() {
        lower.err(&attr, "`#[kernels]` takes no arguments");
    }
    let Some((_, items)) = &m.content else {
        lower.err(
            m,
            "`#[kernels]` needs the module's items here: `mod name { ... }`, not `mod name;`",
        );
        return lower
            .errors
            .map(|e| e.to_compile_error())
            .unwrap_or_default();
    };
    // Helpers first (any order in the module), then each kernel with them.
    let mut kernels = Vec::new();
    // Whether the helpers converted without a syntax error (the kernels' checks need them).
    let mut helpers_ok = true;
    for item in items {
        match item {
            syn::Item::Fn(f) if f.attrs.iter().any(is_kernel_attr) => kernels.push(f),
            syn::Item::Fn(f) if !f.sig.generics.params.is_empty() => lower.err(
                &f.sig.generics,
                format_args!(
                    "a helper function takes no generics; if `{}` is a kernel, mark it `#[kernel]`",
                    f.sig.ident
                ),
            ),
            syn::Item::Fn(f) => {
                for a in f.attrs.iter().filter(|a| !a.path().is_ident("doc")) {
                    lower.err(
                        a,
                        "attributes other than doc comments are not supported on a helper function",
                    );
                }
                let before = error_count(&lower.errors);
                lower.helper(f);
                helpers_ok &= error_count(&lower.errors) == before;
            }
            other => lower.err(
                other,
                "a `#[kernels]` module holds `#[kernel]` fns and helper fns only",
            ),
        }
    }
    let shared = std::mem::take(&mut lower.functions);
    let mut seen = std::collections::HashSet::new();
    let mut out = TokenStream::new();
    for f in kernels {
        let before = error_count(&lower.errors);
        for a in f
            .attrs
            .iter()
            .filter(|a| !a.path().is_ident("doc") && !is_kernel_attr(a))
        {
            lower.err(
                a,
                "attributes other than doc comments are not supported on a kernel",
            );
        }
        let kernel = lower.kernel(f);
        let mut functions = shared.clone();
        functions.append(&mut lower.functions);
        let module = kgen_core::front::ast::Module {
            kernels: vec![kernel],
            functions,
        };
        // Checked when it and the helpers converted without a syntax error.
        let mut ok = helpers_ok && error_count(&lower.errors) == before;
        if ok {
            if let Err(e) = expand::validate(&module, &lower.map) {
                // A helper's error reached through several kernels is reported once.
                for one in e {
                    if seen.insert((format!("{:?}", one.span()), one.to_string())) {
                        lower.err_combine(one);
                    }
                }
                ok = false;
            }
        }
        out.extend(expand::expand(
            &f.attrs,
            &f.vis,
            &module.kernels[0],
            &module.functions,
            ok,
        ));
    }
    let attrs = &m.attrs;
    let vis = &m.vis;
    let name = &m.ident;
    let errors = lower.errors.map(|e| e.to_compile_error());
    quote! {
        #(#attrs)*
        #vis mod #name {
            #out
        }
        #errors
    }
}
