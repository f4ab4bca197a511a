//! Built-in functions: one table of names and signatures, argument matching (positional
//! and keyword), the ambiguous `max(t, 0)` refused, and the value builtins (indexing and
//! creation, casts, `cluster_gather`). Math is in `math.rs`, `dtype`/`lowest`/`highest`
//! in `consteval.rs`, shape builtins, reductions and `item` in `shapes.rs`, scans in `scan.rs`, memory
//! access and `dot` in `memory.rs`.
//!
//! Assumes: calls arrive with unevaluated arguments (method syntax already desugared to
//! a call whose first argument is the receiver).
//! Guarantees: every argument is evaluated once, in source order; an unknown function
//! is `UnknownFunction` (with a close name suggested), a wrong argument count or an
//! unknown/duplicate/misplaced keyword is `BadArguments`; a builtin only runs with the
//! arguments its signature promises, none of them poison.

use super::{Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast;
use crate::ir::{Eviction, InputPrecision, Op, ReduceOp};
use crate::span::Span;
use crate::types::{DType, Shape, ValueType, MAX_CLUSTER_SIZE, MAX_TILE_ELEMENTS};

/// One builtin's signature.
struct Builtin {
    name: &'static str,
    /// Positional parameters, in order (they may also be passed by name).
    params: &'static [&'static str],
    /// How many positional parameters are required.
    required: usize,
    /// Keyword-only parameters.
    keywords: &'static [&'static str],
}

const fn b(
    name: &'static str,
    params: &'static [&'static str],
    required: usize,
    keywords: &'static [&'static str],
) -> Builtin {
    Builtin {
        name,
        params,
        required,
        keywords,
    }
}

/// Every builtin function. `min`/`max` take either two values (element-wise), or a tile
/// and a keyword axis (`max(t, axis = 1)`: a reduction), or a tile alone (a reduction
/// over every element); `maximum`/`minimum` are always element-wise.
const BUILTINS: &[Builtin] = &[
    b("bid", &["axis"], 1, &[]),
    b("num_bids", &["axis"], 1, &[]),
    b("arange", &["start", "end"], 1, &[]),
    b("zeros", &["shape", "dtype"], 2, &[]),
    b("full", &["shape", "value", "dtype"], 2, &[]),
    b("shape", &["tensor", "dim"], 2, &[]),
    b("stride", &["tensor", "dim"], 2, &[]),
    b("cdiv", &["a", "b"], 2, &[]),
    b("exp", &["x"], 1, &[]),
    b("exp2", &["x"], 1, &[]),
    b("log", &["x"], 1, &[]),
    b("log2", &["x"], 1, &[]),
    b("sqrt", &["x"], 1, &[]),
    b("rsqrt", &["x"], 1, &[]),
    b("tanh", &["x"], 1, &[]),
    b("sigmoid", &["x"], 1, &[]),
    b("sin", &["x"], 1, &[]),
    b("cos", &["x"], 1, &[]),
    b("floor", &["x"], 1, &[]),
    b("ceil", &["x"], 1, &[]),
    b("abs", &["x"], 1, &[]),
    b("erf", &["x"], 1, &[]),
    b("min", &["a", "b"], 1, &["axis"]),
    b("max", &["a", "b"], 1, &["axis"]),
    b("minimum", &["a", "b"], 2, &[]),
    b("maximum", &["a", "b"], 2, &[]),
    b("fma", &["a", "b", "c"], 3, &[]),
    b("pow", &["a", "b"], 2, &[]),
    b("fdiv", &["a", "b"], 2, &[]),
    b("where", &["cond", "a", "b"], 3, &[]),
    b("cast", &["x", "dtype"], 2, &[]),
    b("dtype", &["x"], 1, &[]),
    b("lowest", &["dtype"], 1, &[]),
    b("highest", &["dtype"], 1, &[]),
    b("item", &["x"], 1, &[]),
    b("reshape", &["x", "shape"], 2, &[]),
    b("expand_dims", &["x", "axis"], 2, &[]),
    b("broadcast", &["x", "shape"], 2, &[]),
    b("transpose", &["x"], 1, &[]),
    b("permute", &["x", "perm"], 2, &[]),
    b("sum", &["x", "axis"], 1, &[]),
    b("argmax", &["x", "axis"], 1, &[]),
    b("argmin", &["x", "axis"], 1, &[]),
    b("cumsum", &["x", "axis"], 1, &["reverse", "exclusive"]),
    b("cumprod", &["x", "axis"], 1, &["reverse", "exclusive"]),
    b("cummax", &["x", "axis"], 1, &["reverse", "exclusive"]),
    b("cummin", &["x", "axis"], 1, &["reverse", "exclusive"]),
    b(
        "scan",
        &["x", "axis"],
        1,
        &["combine", "reverse", "exclusive"],
    ),
    b(
        "load",
        &["tensor", "index", "shape"],
        3,
        &["pad", "eviction_policy"],
    ),
    b(
        "store",
        &["tensor", "index", "value"],
        3,
        &["eviction_policy"],
    ),
    b(
        "gather",
        &["tensor", "offsets"],
        2,
        &["mask", "other", "eviction_policy"],
    ),
    b(
        "scatter",
        &["tensor", "offsets", "value"],
        3,
        &["mask", "eviction_policy"],
    ),
    b("atomic_add", &["tensor", "offsets", "value"], 3, &["mask"]),
    b("dot", &["a", "b", "acc"], 3, &[PRECISION_KW]),
    b("cluster_gather", &["x", "size"], 2, &[]),
    b("cluster_rank", &["size"], 1, &[]),
    b("scratch", &["slots", "shape", "dtype"], 3, &[]),
    b("scratch_store", &["buffer", "slot", "value"], 3, &[]),
    b("scratch_load", &["buffer", "slot"], 2, &[]),
    b(
        "scratch_fetch",
        &["buffer", "slot", "tensor", "index"],
        4,
        &["pad", "eviction_policy"],
    ),
    b(
        "scratch_gather",
        &["buffer", "slot", "tensor", "offsets"],
        4,
        &["mask", "other", "eviction_policy"],
    ),
    b("scratch_wait", &["pending"], 1, &[]),
    b("gdc_wait", &[], 0, &[]),
    b("gdc_launch_dependents", &[], 0, &[]),
    b("barrier", &[], 0, &[]),
    b("grid_sync", &["counter"], 1, &[]),
];

/// The keyword of a load's or store's L2 eviction policy (Triton's spelling).
const EVICTION_KW: &str = "eviction_policy";

/// The keyword of `dot`'s input precision (Triton's spelling).
pub(crate) const PRECISION_KW: &str = "input_precision";

/// "1 block", "4 blocks".
fn blocks(n: u32) -> String {
    if n == 1 {
        "1 block".into()
    } else {
        format!("{n} blocks")
    }
}

/// Whether `name` is a builtin function.
pub(crate) fn is_builtin(name: &str) -> bool {
    BUILTINS.iter().any(|b| b.name == name)
}

/// Evaluated arguments: positional (with spans) and keywords.
pub(crate) struct Args {
    pub pos: Vec<(Ev, Span)>,
    pub kw: Vec<(String, Ev, Span)>,
    /// `eviction_policy = evict_...` (a name, not an expression: not in `kw`).
    pub eviction: Eviction,
    /// `combine = add` of `scan` (a name too; see `scan.rs`).
    pub combine: Option<crate::ir::ScanOp>,
    /// `input_precision = tf32` of `dot` (a name too), with the span of its value.
    pub precision: Option<(InputPrecision, Span)>,
    /// The span of the whole call (for arguments that are absent).
    pub span: Span,
}

impl Args {
    /// Positional argument `i` (poison if absent, which the signature check prevents).
    pub fn p(&self, i: usize) -> (Ev, Span) {
        self.pos.get(i).cloned().unwrap_or((Ev::Poison, self.span))
    }

    pub fn kw(&self, name: &str) -> Option<(Ev, Span)> {
        self.kw
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, e, s)| (e.clone(), *s))
    }
}

impl Checker<'_> {
    pub(crate) fn call(
        &mut self,
        func: &ast::Ident,
        args: &[ast::Arg],
        method_syntax: bool,
        span: Span,
    ) -> Ev {
        let name = func.name.as_str();
        if !is_builtin(name) {
            if let Some(f) = self.function(name) {
                return self.user_call(&f, func, args, span);
            }
        }
        let Some(sig) = BUILTINS.iter().find(|b| b.name == name) else {
            for a in args {
                let _ = self.expr(&a.value);
            }
            let mut names: Vec<String> = BUILTINS.iter().map(|b| b.name.to_string()).collect();
            names.extend(self.functions.iter().map(|f| f.name.name.clone()));
            let mut d = Diagnostic::error(
                ErrorCode::UnknownFunction,
                func.span,
                format!("unknown function `{name}`"),
            )
            .with_label_message("not a builtin");
            if let Some(s) = super::scope::closest(name, &names) {
                d = d.with_note(format!("help: did you mean `{s}`?"));
            } else {
                names.sort();
                d = d.with_note(format!("the builtin functions are: {}", names.join(", ")));
            }
            return self.push(d);
        };
        let mut pos = Vec::new();
        let mut kw: Vec<(String, Ev, Span)> = Vec::new();
        let mut ok = true;
        let mut eviction: Option<Eviction> = None;
        let mut combine = None;
        let mut precision: Option<(InputPrecision, Span)> = None;
        for a in args {
            if let Some(k) = &a.name {
                if k.name == super::scan::COMBINE_KW && sig.keywords.contains(&k.name.as_str()) {
                    if combine.is_some() {
                        self.error(
                            ErrorCode::BadArguments,
                            k.span,
                            format!("argument `{}` given twice", k.name),
                        );
                        ok = false;
                    }
                    match self.scan_combine(&a.value) {
                        Some(c) => combine = Some(c),
                        None => ok = false,
                    }
                    continue;
                }
                if k.name == PRECISION_KW && sig.keywords.contains(&PRECISION_KW) {
                    if precision.is_some() {
                        self.error(
                            ErrorCode::BadArguments,
                            k.span,
                            format!("argument `{PRECISION_KW}` given twice"),
                        );
                        ok = false;
                    }
                    match self.input_precision(&a.value) {
                        Some(p) => precision = Some((p, a.value.span)),
                        None => ok = false,
                    }
                    continue;
                }
                if k.name == EVICTION_KW && sig.keywords.contains(&EVICTION_KW) {
                    if eviction.is_some() {
                        self.error(
                            ErrorCode::BadArguments,
                            k.span,
                            format!("argument `{EVICTION_KW}` given twice"),
                        );
                        ok = false;
                    }
                    match self.eviction_policy(&a.value) {
                        Some(e) => eviction = Some(e),
                        None => ok = false,
                    }
                    continue;
                }
            }
            let v = self.expr(&a.value);
            let Some(k) = &a.name else {
                if !kw.is_empty() {
                    self.error(
                        ErrorCode::BadArguments,
                        a.value.span,
                        "positional argument after a keyword argument",
                    );
                    ok = false;
                }
                pos.push((v, a.value.span));
                continue;
            };
            // A keyword may also name a positional parameter in its place (`sum(x, axis = 1)`).
            if let Some(i) = sig.params.iter().position(|p| *p == k.name) {
                if i != pos.len() || !kw.is_empty() {
                    self.error(
                        ErrorCode::BadArguments,
                        k.span,
                        format!("argument `{}` given out of order", k.name),
                    );
                    ok = false;
                }
                pos.push((v, a.value.span));
            } else if sig.keywords.contains(&k.name.as_str()) {
                if kw.iter().any(|(n, _, _)| n == &k.name) {
                    self.error(
                        ErrorCode::BadArguments,
                        k.span,
                        format!("argument `{}` given twice", k.name),
                    );
                    ok = false;
                }
                kw.push((k.name.clone(), v, a.value.span));
            } else {
                let mut valid: Vec<&str> = sig.params.to_vec();
                valid.extend_from_slice(sig.keywords);
                let mut d = Diagnostic::error(
                    ErrorCode::BadArguments,
                    k.span,
                    format!("`{name}` has no argument named `{}`", k.name),
                )
                .with_note(format!("its arguments are: {}", valid.join(", ")));
                let owned: Vec<String> = valid.iter().map(|s| s.to_string()).collect();
                if let Some(s) = super::scope::closest(&k.name, &owned) {
                    d = d.with_note(format!("help: did you mean `{s}`?"));
                }
                if k.name == "axis" && matches!(name, "maximum" | "minimum") {
                    d = d.with_note(format!(
                        "help: `{name}` is element-wise; for the reduction write `{}(x, axis = ...)`",
                        &name[..3]
                    ));
                }
                self.push(d);
                ok = false;
            }
        }
        // `min(t, axis = 1)` / `max(t, axis = 1)`: the reduction form takes one positional.
        let reduction_kw = matches!(name, "min" | "max") && kw.iter().any(|(n, _, _)| n == "axis");
        let (lo, hi) = if reduction_kw {
            (1, 1)
        } else {
            (sig.required, sig.params.len())
        };
        if pos.len() < lo || pos.len() > hi {
            let expected = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            };
            let usage = sig.params.join(", ");
            let mut d = Diagnostic::error(
                ErrorCode::BadArguments,
                span,
                format!(
                    "`{name}` takes {expected} argument{}, {} given",
                    if hi == 1 { "" } else { "s" },
                    pos.len()
                ),
            )
            .with_note(format!("usage: {name}({usage})"));
            if reduction_kw {
                d = d.with_note(format!("with `axis = ...`, `{name}` reduces one tile"));
            }
            return self.push(d);
        }
        if !ok
            || pos.iter().any(|(e, _)| matches!(e, Ev::Poison))
            || kw.iter().any(|(_, e, _)| matches!(e, Ev::Poison))
        {
            return Ev::Poison;
        }
        if matches!(name, "min" | "max") && !reduction_kw {
            if let [(x, _), (Ev::Int(k), ks)] = pos.as_slice() {
                if let Some(ValueType::Tile(..)) = self.ev_type(x) {
                    return self.ambiguous_min_max(name, args, method_syntax, *k, *ks, span);
                }
            }
        }
        let a = Args {
            pos,
            kw,
            eviction: eviction.unwrap_or_default(),
            combine,
            precision,
            span,
        };
        self.builtin(name, &a, span)
    }

    /// `max(t, k)` / `min(t, k)` with a tile `t` and an integer constant `k` (a literal, a
    /// `let` constant, an `int` generic): the reduction along axis `k`, or the element-wise
    /// maximum with `k`? An error whose help spells both.
    fn ambiguous_min_max(
        &mut self,
        name: &str,
        args: &[ast::Arg],
        method_syntax: bool,
        k: i128,
        kspan: Span,
        span: Span,
    ) -> Ev {
        let tile = args.first().map_or("t".to_string(), |a| {
            crate::front::print::print_expr(&a.value)
        });
        let kt = args
            .get(1)
            .map_or(k.to_string(), |a| crate::front::print::print_expr(&a.value));
        let (reduce, elementwise) = if method_syntax {
            let recv = if args.first().is_some_and(|a| {
                matches!(
                    a.value.kind,
                    ast::ExprKind::Binary { .. }
                        | ast::ExprKind::Unary { .. }
                        | ast::ExprKind::Cast { .. }
                )
            }) {
                format!("({tile})")
            } else {
                tile.clone()
            };
            (
                format!("{recv}.{name}(axis = {kt})"),
                format!("{recv}.{name}imum({kt})"),
            )
        } else {
            (
                format!("{name}({tile}, axis = {kt})"),
                format!("{name}imum({tile}, {kt})"),
            )
        };
        let what = if name == "max" { "maximum" } else { "minimum" };
        self.push(
            Diagnostic::error(
                ErrorCode::AmbiguousCall,
                span,
                format!(
                    "`{name}` of a tile and the integer constant {k} is ambiguous: a reduction along axis {k}, or the element-wise {what} with {k}"
                ),
            )
            .with_label_message("ambiguous")
            .with_secondary(kspan, "an axis, or a value?")
            .with_note(format!("help: for the reduction along axis {k}, write `{reduce}`"))
            .with_note(format!(
                "help: for the element-wise {what} with {k}, write `{elementwise}` (the constant takes the tile's dtype)"
            )),
        )
    }

    /// The policy an `eviction_policy = ...` argument names: one of the names of
    /// [`Eviction`], written bare (like a dtype), not an expression.
    fn eviction_policy(&mut self, value: &ast::Expr) -> Option<Eviction> {
        let names: Vec<String> = [Eviction::First, Eviction::Last, Eviction::Normal]
            .iter()
            .map(|e| e.name().to_string())
            .collect();
        let given = match &value.kind {
            ast::ExprKind::Name(id) => id.name.as_str(),
            _ => "",
        };
        if let Some(e) = Eviction::from_name(given) {
            return Some(e);
        }
        let what = if given.is_empty() {
            "an expression".to_string()
        } else {
            format!("`{given}`")
        };
        let mut d = Diagnostic::error(
            ErrorCode::BadArguments,
            value.span,
            format!("`{EVICTION_KW}` must name a policy, not {what}"),
        )
        .with_note(format!("the policies are: {}", names.join(", ")));
        if let Some(s) = super::scope::closest(given, &names) {
            d = d.with_note(format!("help: did you mean `{s}`?"));
        }
        self.push(d);
        None
    }

    /// The precision an `input_precision = ...` argument names: one of the names of
    /// [`InputPrecision`], written bare (like a dtype), not an expression.
    fn input_precision(&mut self, value: &ast::Expr) -> Option<InputPrecision> {
        let names: Vec<String> = InputPrecision::ALL
            .iter()
            .map(|p| p.name().to_string())
            .collect();
        let given = match &value.kind {
            ast::ExprKind::Name(id) => id.name.as_str(),
            _ => "",
        };
        if let Some(p) = InputPrecision::from_name(given) {
            return Some(p);
        }
        let what = if given.is_empty() {
            "an expression".to_string()
        } else {
            format!("`{given}`")
        };
        let mut d = Diagnostic::error(
            ErrorCode::BadArguments,
            value.span,
            format!("`{PRECISION_KW}` must name a precision, not {what}"),
        )
        .with_label_message("not a precision")
        .with_note(format!("the precisions are: {}", names.join(", ")))
        .with_note(
            "ieee: exact f32 products (the default); tf32: operands rounded to TF32 on the \
             tensor cores; tf32x3: three TF32 products, about f32 accuracy",
        );
        if let Some(s) = super::scope::closest(given, &names) {
            d = d.with_note(format!("help: did you mean `{s}`?"));
        }
        self.push(d);
        None
    }

    fn builtin(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        match name {
            "bid" | "num_bids" => {
                let Some(axis) = self.const_int(&a.p(0), 0, 2, "grid axis") else {
                    return Ev::Poison;
                };
                let op = if name == "bid" {
                    Op::ProgramId(axis as u8)
                } else {
                    Op::NumPrograms(axis as u8)
                };
                self.emit1(op, ValueType::Scalar(DType::I32), span)
            }
            "arange" => self.arange(a, span),
            "zeros" => {
                let shape = self.const_shape(&a.p(0));
                let d = self.expect_dtype(&a.p(1));
                let (Some(shape), Some(d)) = (shape, d) else {
                    return Ev::Poison;
                };
                self.splat_const(&Ev::Int(0), d, shape, span)
            }
            "full" => self.full(a, span),
            "shape" | "stride" => self.tensor_extent(name, a, span),
            "cdiv" => self.cdiv(a, span),
            "exp" | "exp2" | "log" | "log2" | "sqrt" | "rsqrt" | "tanh" | "sigmoid" | "sin"
            | "cos" | "floor" | "ceil" | "abs" | "erf" => self.math(name, a, span),
            "min" | "max" | "minimum" | "maximum" => self.min_max(name, a, span),
            "dtype" => self.dtype_builtin(a),
            "lowest" | "highest" => self.extreme(name, a, span),
            "item" => self.item(a.p(0), span),
            "where" => self.select(a, span),
            "pow" | "fma" | "fdiv" => self.float_op(name, a, span),
            "cast" => {
                let Some(d) = self.expect_dtype(&a.p(1)) else {
                    return Ev::Poison;
                };
                let (x, xs) = a.p(0);
                self.cast(x, d, xs, span)
            }
            "reshape" | "broadcast" => self.reshape_or_broadcast(name, a.p(0), a.p(1), span),
            "expand_dims" => self.expand_dims(a.p(0), a.p(1), span),
            "transpose" => self.permute(name, a.p(0), None, span),
            "permute" => self.permute(name, a.p(0), Some(a.p(1)), span),
            "sum" => self.reduce(ReduceOp::Sum, a.p(0), a.pos.get(1).cloned(), span),
            "argmax" => self.reduce(ReduceOp::ArgMax, a.p(0), a.pos.get(1).cloned(), span),
            "argmin" => self.reduce(ReduceOp::ArgMin, a.p(0), a.pos.get(1).cloned(), span),
            "cumsum" | "cumprod" | "cummax" | "cummin" | "scan" => self.scan_builtin(name, a, span),
            "load" => self.load(a, span),
            "store" => self.store(a, span),
            "gather" | "scatter" | "atomic_add" => self.indexed(name, a, span),
            "dot" => self.dot(a, span),
            "cluster_gather" => self.cluster_gather(a, span),
            "cluster_rank" => self.cluster_rank(a, span),
            "scratch" => self.scratch(a, span),
            "scratch_store" => self.scratch_store(a, span),
            "scratch_load" => self.scratch_load(a, span),
            "scratch_fetch" => self.scratch_fetch(a, span),
            "scratch_gather" => self.scratch_gather(a, span),
            "scratch_wait" => self.scratch_wait(a, span),
            "gdc_wait" | "gdc_launch_dependents" => {
                let d = if name == "gdc_wait" {
                    crate::ir::GridDependency::Wait
                } else {
                    crate::ir::GridDependency::LaunchDependents
                };
                self.emit(Op::GridDependency(d), vec![], span);
                Ev::Unit
            }
            "barrier" => {
                self.emit(Op::Barrier, vec![], span);
                Ev::Unit
            }
            "grid_sync" => self.grid_sync(a, span),
            _ => self.error(
                ErrorCode::UnknownFunction,
                span,
                format!("unknown function `{name}`"),
            ),
        }
    }

    /// `cluster_gather(x, size)`: the scalar `x` of every block of the cluster, as a
    /// `[size]` tile. `size` is 1, 2, 4, 8 or 16 and the same for every call of the kernel.
    /// The cluster size argument of builtin `what`: a constant power of two up to
    /// [`MAX_CLUSTER_SIZE`], the same as every earlier cluster builtin's of the kernel.
    fn cluster_size_arg(&mut self, sz: &(Ev, Span), what: &str) -> Option<u32> {
        let ss = sz.1;
        let grid_sync = self
            .func
            .insts
            .iter()
            .find(|(_, i)| matches!(i.op, Op::GridSync { .. }))
            .map(|(_, i)| i.span);
        if let Some(gs) = grid_sync {
            self.push(
                Diagnostic::error(
                    ErrorCode::Unsupported,
                    ss,
                    format!("`{what}` in a kernel that calls `grid_sync`"),
                )
                .with_secondary(gs, "grid_sync here")
                .with_note("a cooperative grid is launched without clusters; use one or the other"),
            );
            return None;
        }
        let size = self.const_int(sz, 1, MAX_CLUSTER_SIZE as i64, "cluster size")? as u32;
        if !size.is_power_of_two() {
            self.push(
                Diagnostic::error(
                    ErrorCode::BadTileShape,
                    ss,
                    format!("cluster size {size} is not a power of two"),
                )
                .with_note("a cluster is 1, 2, 4, 8 or 16 consecutive blocks along grid axis 0"),
            );
            return None;
        }
        if let Some((first, first_span)) = self.cluster {
            if first != size {
                self.push(
                    Diagnostic::error(
                        ErrorCode::BadArguments,
                        ss,
                        format!(
                            "this `{what}` uses clusters of {}, an earlier one uses {first}",
                            blocks(size)
                        ),
                    )
                    .with_secondary(first_span, format!("clusters of {} here", blocks(first)))
                    .with_note("a kernel is launched with one cluster size: every `cluster_gather` and `cluster_rank` must use it"),
                );
                return None;
            }
        } else {
            self.cluster = Some((size, ss));
        }
        Some(size)
    }

    /// `grid_sync(counter)`: a barrier across the whole grid. `counter` is a tensor
    /// parameter of one `i32` element (its rank 1 is checked here; its extent by the
    /// runtime). Whether every block reaches it alike is checked once the body is
    /// lowered (`uniform.rs`).
    fn grid_sync(&mut self, a: &Args, span: Span) -> Ev {
        let arg = a.p(0);
        let Some((t, tp)) = self.tensor_arg(&arg) else {
            return Ev::Poison;
        };
        if tp.dtype != DType::I32 || tp.rank() != 1 {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    arg.1,
                    format!(
                        "`grid_sync` counts arrivals in a `tensor<i32, 1>`; this is a {}-D {} tensor",
                        tp.rank(),
                        tp.dtype
                    ),
                )
                .with_note("help: declare a parameter `counter: tensor<i32, 1>`, zero it once, and pass it to every launch (each `grid_sync` leaves it 0 or -2147483648)"),
            );
        }
        if let Some((_, cs)) = self.cluster {
            return self.push(
                Diagnostic::error(
                    ErrorCode::Unsupported,
                    span,
                    "`grid_sync` in a kernel with thread-block clusters",
                )
                .with_secondary(cs, "clusters from here")
                .with_note("a cooperative grid is launched without clusters; use one or the other"),
            );
        }
        self.emit(Op::GridSync { counter: t }, vec![], span);
        Ev::Unit
    }

    /// `cluster_rank(size)`: this block's rank in its cluster of `size` blocks.
    fn cluster_rank(&mut self, a: &Args, span: Span) -> Ev {
        let sz = a.p(0);
        let Some(size) = self.cluster_size_arg(&sz, "cluster_rank") else {
            return Ev::Poison;
        };
        self.emit1(Op::ClusterRank(size), ValueType::Scalar(DType::I32), span)
    }

    fn cluster_gather(&mut self, a: &Args, span: Span) -> Ev {
        let (x, xs) = a.p(0);
        let sz = a.p(1);
        let Some(size) = self.cluster_size_arg(&sz, "cluster_gather") else {
            return Ev::Poison;
        };
        let x = self.expect_value(x, xs);
        let d = match &x {
            Ev::Poison => return Ev::Poison,
            Ev::Value(v) => match self.ty(*v) {
                ValueType::Scalar(d) => d,
                t => {
                    return self.push(
                        Diagnostic::error(
                            ErrorCode::TypeMismatch,
                            xs,
                            format!("`cluster_gather` exchanges one scalar per block, found `{t}`"),
                        )
                        .with_label_message("this is a tile")
                        .with_note("help: reduce the tile first, e.g. `cluster_gather(max(t), 8)`"),
                    )
                }
            },
            other => match Self::default_dtype(other) {
                Some(d) => d,
                None => return Ev::Poison,
            },
        };
        if d == DType::Bool {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    xs,
                    "cannot `cluster_gather` a bool",
                )
                .with_label_message("this is a bool")
                .with_note("help: convert it first, e.g. `cluster_gather(b as i32, 8)`"),
            );
        }
        let Some(v) = self.materialize(&x, d, xs) else {
            return Ev::Poison;
        };
        self.emit1(
            Op::ClusterGather { value: v, size },
            ValueType::Tile(d, Shape(vec![size])),
            span,
        )
    }

    /// `arange(start, end)`, and `arange(end)` = `arange(0, end)`.
    fn arange(&mut self, a: &Args, span: Span) -> Ev {
        let lo = i32::MIN as i64;
        let hi = i32::MAX as i64;
        let (s, e) = if a.pos.len() == 1 {
            (Some(0), self.const_int(&a.p(0), lo, hi, "arange end"))
        } else {
            let s = self.const_int(&a.p(0), lo, hi, "arange start");
            (s, self.const_int(&a.p(1), lo, hi, "arange end"))
        };
        let (Some(s), Some(e)) = (s, e) else {
            return Ev::Poison;
        };
        if e <= s || (e - s) as u64 > MAX_TILE_ELEMENTS {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadTileShape,
                    span,
                    format!(
                        "arange({s}, {e}) must have between 1 and {MAX_TILE_ELEMENTS} elements"
                    ),
                )
                .with_note("`arange(start, end)` gives start, start + 1, ..., end - 1; `arange(n)` gives 0, 1, ..., n - 1"),
            );
        }
        self.emit1(
            Op::Arange { start: s, end: e },
            ValueType::Tile(DType::I32, Shape(vec![(e - s) as u32])),
            span,
        )
    }

    /// A tile of one constant.
    fn splat_const(&mut self, v: &Ev, d: DType, shape: Shape, span: Span) -> Ev {
        let Some(s) = self.const_scalar(v, d, span, " to fill a tile") else {
            return Ev::Poison;
        };
        self.emit1(Op::Const(s), ValueType::Tile(d, shape), span)
    }

    /// `full(shape, value, dtype)`; the dtype defaults to the value's (i32/f32/bool for
    /// a constant). A scalar value of another dtype is converted.
    fn full(&mut self, a: &Args, span: Span) -> Ev {
        let Some(shape) = self.const_shape(&a.p(0)) else {
            return Ev::Poison;
        };
        let (v, vs) = a.p(1);
        let v = self.expect_value(v, vs);
        let d = match a.pos.get(2) {
            Some(x) => match self.expect_dtype(x) {
                Some(d) => d,
                None => return Ev::Poison,
            },
            None => match self
                .ev_type(&v)
                .map(|t| t.dtype())
                .or_else(|| Self::default_dtype(&v))
            {
                Some(d) => d,
                None => return Ev::Poison,
            },
        };
        let Ev::Value(x) = v else {
            return self.splat_const(&v, d, shape, vs);
        };
        if self.ty(x).shape().is_some() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::WrongKind,
                    vs,
                    "`full` takes a scalar value, not a tile",
                )
                .with_note("help: use `broadcast(x, [...])` to enlarge a tile"),
            );
        }
        let Ev::Value(x) = self.cast(v, d, vs, vs) else {
            return Ev::Poison;
        };
        self.emit1(Op::Splat(x), ValueType::Tile(d, shape), span)
    }

    /// `shape(t, dim)` (a constant for a declared extent) and `stride(t, dim)` (1 for a
    /// contiguous last dimension).
    fn tensor_extent(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        let Some(t) = self.expect_tensor(&a.p(0)) else {
            return Ev::Poison;
        };
        let Some(tp) = self.func.tensor_param(t).cloned() else {
            return Ev::Poison;
        };
        let Some(dim) = self.const_int(&a.p(1), 0, tp.rank() as i64 - 1, "dimension") else {
            return Ev::Poison;
        };
        let dim8 = dim as u8;
        if name == "shape" {
            if let Some(Some(n)) = tp.dims.get(dim as usize) {
                return Ev::Int(*n as i128);
            }
            return self.emit1(
                Op::TensorDim {
                    tensor: t,
                    dim: dim8,
                },
                ValueType::Scalar(DType::I32),
                span,
            );
        }
        if tp.contiguous && dim as usize + 1 == tp.rank() {
            return Ev::Int(1);
        }
        self.emit1(
            Op::TensorStride {
                tensor: t,
                dim: dim8,
            },
            ValueType::Scalar(DType::I32),
            span,
        )
    }
}
