//! `#[kernel]`: kgen kernels written in a Rust-syntax subset.
//!
//! The attribute turns a Rust `fn` into the same AST a `.kg` file parses to
//! (`kgen_core::front::ast`), checks it with the real compiler while your crate builds
//! (errors point at your tokens), and replaces the `fn` by a module named after it.
//! Generated code names `::kgen::...`: depend on the `kgen` crate and write
//! `#[kgen::kernel]` (or `use kgen::kernel;`).
//!
//! ```ignore
//! #[kgen::kernel]
//! fn vec_add<T: Float = f32, const BLOCK: i32 = 1024>(
//!     x: Tensor<T, 1, Contiguous>,
//!     y: Tensor<T, 1, Contiguous>,
//!     out: Tensor<T, 1, Contiguous>,
//! ) {
//!     let i = bid(0);
//!     store(out, [i], load(x, [i], [BLOCK]) + load(y, [i], [BLOCK]));
//! }
//! // vec_add::SOURCE, vec_add::ptx(Arch::Sm90a), vec_add::compile(&opts),
//! // vec_add::launch(&device.stream(), [n.div_ceil(1024) as u32, 1, 1], &x, &y, &out)
//! ```
//!
//! # Syntax mapping (Rust → `.kg`)
//!
//! | Rust | `.kg` |
//! |---|---|
//! | `const BLOCK: i32 = 1024` (any integer type) | `BLOCK: int = 1024` |
//! | `const N: i32 = { 2 * BLOCK }` | `N: int = 2 * BLOCK` |
//! | `const FLAG: bool = true` | `FLAG: bool = true` |
//! | `T: Float = bf16` / `T: DType = f32` | `T: float = bf16` / `T: dtype = f32` |
//! | `x: Tensor<T, 2>` | `x: tensor<T, 2>` |
//! | `x: Tensor<T, 2, Contiguous>` | `x: tensor<T, 2, contiguous>` |
//! | `w: Tensor<T, Dims<_, 4096, { 2 * D }>>` | `w: tensor<T, [_, 4096, 2 * D]>` |
//! | `eps: f32`, `n: i32`, `a: T` | the same |
//! | `let x = e;`, `let mut x: f32 = e;` | the same |
//! | `let [a, b] = e;`, `let [mut a, mut b] = e;` | `let [a, b] = e;`, `let mut [a, b] = e;` |
//! | `fn f(a: _, b: _) -> _ { ...; [x, y] }` inside the kernel's body | `fn f(a, b) { ...; return [x, y]; }` beside the kernel |
//! | `x = e;`, `x += e;` (all compound operators) | the same |
//! | `for k in a..b { }` | the same |
//! | `for k in (a..b).step_by(s) { }` | `for k in range(a, b, s) { }` |
//! | `if c { } else if d { } else { }` | the same |
//! | `static_assert!(c, "msg");` or `static_assert(c, "msg");` | `static_assert(c, "msg");` |
//! | operators, `as` casts, calls, `x.f(a)` method calls, `[a, b]` | the same |
//! | `load(x, [i], [B], pad = -f32::INFINITY)` | `load(x, [i], [B], pad = -inf)` |
//! | `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::NAN` | `inf`, `-inf`, `nan` |
//! | `inf`, `nan` (bare names) | the same |
//!
//! Keyword arguments are written exactly as in `.kg` (`name = value`): Rust parses that
//! as an assignment expression, which the macro reads as a keyword argument. Method
//! calls desugar to calls with the receiver first, as in `.kg`. Not supported (each is a
//! located error): `while`, `loop`, `match`, closures, indexing `a[i]`, fields,
//! references, `break`/`continue`, tuples, paths other than the float constants, literal
//! suffixes (`1.0f32`), nested items other than helper `fn`s, macros other than
//! `static_assert!`, lifetimes, `where` clauses, a kernel's return type, `self`, attributes other than doc comments (doc
//! comments move to the generated module). Parameters cannot be named `NAME` or `SOURCE`
//! (the module's constants); every other name is fine (the launcher's own parameters and
//! locals are `__kgen_*`).
//!
//! # Kernels sharing helpers: `#[kernels]`
//!
//! On an inline module, `#[kernels]` makes every `fn` marked `#[kernel]` a kernel module
//! (as above) and every other `fn` a helper that each of them may call; each kernel's
//! `SOURCE` holds the helpers. See docs/MACRO.md.
//!
//! # The generated module
//!
//! ```ignore
//! pub mod vec_add {
//!     pub const SOURCE: &str;                 // the kernel as `.kg` text
//!     pub const NAME: &str;                   // "vec_add"
//!     pub fn options(arch: Arch) -> CompileOptions;
//!     pub fn compile(opts: &CompileOptions) -> Result<CompiledKernel, Diagnostics>;
//!     pub fn ptx(arch: Arch) -> String;       // default generics; panics if it fails
//!     pub fn launch(stream: &Stream, grid: [u32; 3], x: &Tensor, ..., eps: f32)
//!         -> Result<(), RuntimeError>;
//!     pub fn launch_with(stream: &Stream, opts: &CompileOptions, grid: [u32; 3], ...)
//!         -> Result<(), RuntimeError>;
//! }
//! ```
//! Launcher arguments mirror the signature: tensors are `&kgen::runtime::Tensor` (device
//! tensors, or interpreter tensors on a machine without a GPU: `Device::best()`); their
//! dtype, rank, constant extents, `Contiguous`, alignment, device and aliasing are checked
//! before the launch, which is asynchronous. Scalars take their Rust type (`f32`, `i32`,
//! `u32`, `i64`, `bool`; `f16`/`bf16` take an `f32` rounded to nearest even; a generic
//! dtype `T` takes an `f64` converted to the specialization's dtype). The kernel is
//! compiled on first use per (device, specialization, alignment) and cached by the
//! runtime (in memory, and the driver's JIT output on disk).
//!
//! # Trade-off: compile at build time or at run time?
//!
//! The macro compiles the kernel (sm_90a, default generics) while your crate builds,
//! **for validation only**: errors show up in your editor at the right token. The module
//! embeds the kernel as `.kg` text (`front::print`), and `compile`/`ptx`/`launch` compile
//! it at run time. That keeps every specialization (`-D`-style defines, warps, sm_80)
//! available and keeps PTX out of the binary, at the price of compiling at run time
//! (milliseconds) and of compiling twice for the default specialization. A kernel with a
//! generic that has no default is only checked for syntax at build time.
//!
//! On errors the macro emits every error (`compile_error!`, several at once) and the
//! same module with an empty `SOURCE`, so calls to `launch` do not add secondary errors.

mod expand;
mod from_syn;
mod module;
mod spans;

use proc_macro::TokenStream;

/// Turns a Rust-syntax kernel into a module with its `.kg` source and a typed launcher.
/// See the crate documentation for the syntax.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = syn::parse_macro_input!(item as syn::ItemFn);
    kernel_impl(attr.into(), &func).into()
}

/// Kernels that share helper functions: on an inline module, each `fn` marked
/// `#[kernel]` becomes a kernel module (as `#[kernel]` alone makes it), and every other
/// `fn` is a helper each of them may call. See the crate documentation.
#[proc_macro_attribute]
pub fn kernels(attr: TokenStream, item: TokenStream) -> TokenStream {
    let m = syn::parse_macro_input!(item as syn::ItemMod);
    module::kernels_impl(attr.into(), &m).into()
}

/// The whole macro on `proc_macro2` tokens (so that it can be unit-tested):
/// Rust AST → kgen AST → validation → expansion (+ every error).
fn kernel_impl(attr: proc_macro2::TokenStream, func: &syn::ItemFn) -> proc_macro2::TokenStream {
    let mut lower = from_syn::Lower::new();
    if !attr.is_empty() {
        lower.err(&attr, "`#[kernel]` takes no arguments");
    }
    for a in func.attrs.iter().filter(|a| !a.path().is_ident("doc")) {
        lower.err(
            a,
            "attributes other than doc comments are not supported on a kernel",
        );
    }
    let kernel = lower.kernel(func);
    let module = kgen_core::front::ast::Module {
        kernels: vec![kernel],
        functions: std::mem::take(&mut lower.functions),
    };
    let mut errors = lower.errors.take();
    if errors.is_none() {
        errors = expand::validate(&module, &lower.map).err();
    }
    let ok = errors.is_none();
    let mut out = expand::expand(
        &func.attrs,
        &func.vis,
        &module.kernels[0],
        &module.functions,
        ok,
    );
    if let Some(e) = errors {
        out.extend(e.to_compile_error());
    }
    out
}

#[cfg(test)]
mod tests;
