//! Built-in functions: one table of names and signatures, argument matching (positional
//! and keyword), and the value builtins (indexing and creation, math, casts,
//! element-wise `min`/`max`/`where`/`fma`/`pow`). Shape builtins and reductions are in
//! `shapes.rs`, scans in `scan.rs`, memory access and `dot` in `memory.rs`.
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
use crate::ir::{BinaryOp, Eviction, Op, ReduceOp, UnaryOp};
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

/// Every builtin function. `min`/`max` take either two values (element-wise) or a tile
/// and an axis (`max(t, 1)`, `max(t, axis = 1)`: a reduction).
const BUILTINS: &[Builtin] = &[
    b("bid", &["axis"], 1, &[]),
    b("num_bids", &["axis"], 1, &[]),
    b("arange", &["start", "end"], 2, &[]),
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
    b("min", &["a", "b"], 2, &["axis"]),
    b("max", &["a", "b"], 2, &["axis"]),
    b("fma", &["a", "b", "c"], 3, &[]),
    b("pow", &["a", "b"], 2, &[]),
    b("fdiv", &["a", "b"], 2, &[]),
    b("where", &["cond", "a", "b"], 3, &[]),
    b("cast", &["x", "dtype"], 2, &[]),
    b("reshape", &["x", "shape"], 2, &[]),
    b("expand_dims", &["x", "axis"], 2, &[]),
    b("broadcast", &["x", "shape"], 2, &[]),
    b("transpose", &["x"], 1, &[]),
    b("permute", &["x", "perm"], 2, &[]),
    b("sum", &["x", "axis"], 2, &[]),
    b("argmax", &["x", "axis"], 2, &[]),
    b("argmin", &["x", "axis"], 2, &[]),
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
    b("dot", &["a", "b", "acc"], 3, &[]),
    b("cluster_gather", &["x", "size"], 2, &[]),
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
];

/// The keyword of a load's or store's L2 eviction policy (Triton's spelling).
const EVICTION_KW: &str = "eviction_policy";

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
    pub(crate) fn call(&mut self, func: &ast::Ident, args: &[ast::Arg], span: Span) -> Ev {
        let name = func.name.as_str();
        let Some(sig) = BUILTINS.iter().find(|b| b.name == name) else {
            for a in args {
                let _ = self.expr(&a.value);
            }
            let mut names: Vec<String> = BUILTINS.iter().map(|b| b.name.to_string()).collect();
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
        let a = Args {
            pos,
            kw,
            eviction: eviction.unwrap_or_default(),
            combine,
            span,
        };
        self.builtin(name, &a, span)
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
            | "cos" | "floor" | "ceil" | "abs" => self.math(name, a, span),
            "min" | "max" => self.min_max(name, a, span),
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
            "sum" => self.reduce(ReduceOp::Sum, a.p(0), a.p(1), span),
            "argmax" => self.reduce(ReduceOp::ArgMax, a.p(0), a.p(1), span),
            "argmin" => self.reduce(ReduceOp::ArgMin, a.p(0), a.p(1), span),
            "cumsum" | "cumprod" | "cummax" | "cummin" | "scan" => self.scan_builtin(name, a, span),
            "load" => self.load(a, span),
            "store" => self.store(a, span),
            "gather" | "scatter" | "atomic_add" => self.indexed(name, a, span),
            "dot" => self.dot(a, span),
            "cluster_gather" => self.cluster_gather(a, span),
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
            _ => self.error(
                ErrorCode::UnknownFunction,
                span,
                format!("unknown function `{name}`"),
            ),
        }
    }

    /// `cluster_gather(x, size)`: the scalar `x` of every block of the cluster, as a
    /// `[size]` tile. `size` is 1, 2, 4, 8 or 16 and the same for every call of the kernel.
    fn cluster_gather(&mut self, a: &Args, span: Span) -> Ev {
        let (x, xs) = a.p(0);
        let (sz, ss) = a.p(1);
        let Some(size) = self.const_int(&(sz, ss), 1, MAX_CLUSTER_SIZE as i64, "cluster size")
        else {
            return Ev::Poison;
        };
        let size = size as u32;
        if !size.is_power_of_two() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadTileShape,
                    ss,
                    format!("cluster size {size} is not a power of two"),
                )
                .with_note("a cluster is 1, 2, 4, 8 or 16 consecutive blocks along grid axis 0"),
            );
        }
        if let Some((first, first_span)) = self.cluster {
            if first != size {
                return self.push(
                    Diagnostic::error(
                        ErrorCode::BadArguments,
                        ss,
                        format!(
                            "this `cluster_gather` uses clusters of {}, an earlier one uses {first}",
                            blocks(size)
                        ),
                    )
                    .with_secondary(first_span, format!("clusters of {} here", blocks(first)))
                    .with_note("a kernel is launched with one cluster size: every `cluster_gather` must use it"),
                );
            }
        } else {
            self.cluster = Some((size, ss));
        }
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
                        .with_note(
                            "help: reduce the tile first, e.g. `cluster_gather(max(t, 0), 8)`",
                        ),
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

    fn arange(&mut self, a: &Args, span: Span) -> Ev {
        let lo = i32::MIN as i64;
        let hi = i32::MAX as i64;
        let s = self.const_int(&a.p(0), lo, hi, "arange start");
        let e = self.const_int(&a.p(1), lo, hi, "arange end");
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
                .with_note("`arange(start, end)` gives start, start + 1, ..., end - 1"),
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

    /// `cdiv(a, b)` = `(a + b - 1) / b` on integers (folded for constants).
    fn cdiv(&mut self, a: &Args, span: Span) -> Ev {
        let (x, xs) = a.p(0);
        let (y, ys) = a.p(1);
        let x = self.expect_value(x, xs);
        let y = self.expect_value(y, ys);
        if let (Ev::Int(m), Ev::Int(n)) = (&x, &y) {
            if *n == 0 {
                return self.error(ErrorCode::ConstEval, span, "division by zero in `cdiv`");
            }
            let v = m
                .checked_add(*n)
                .and_then(|s| s.checked_sub(1))
                .and_then(|s| s.checked_div(*n));
            return self.checked_int(v, span, &format!("`cdiv({m}, {n})`"));
        }
        let Some((vals, ty)) = self.unify(&[(x, xs), (y, ys)], span, "`cdiv`") else {
            return Ev::Poison;
        };
        if !ty.dtype().is_int() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    span,
                    format!("`cdiv` needs integers, found `{}`", ty.dtype()),
                )
                .with_note("help: for floats, use `ceil(a / b)`"),
            );
        }
        let (Some(&p), Some(&q)) = (vals.first(), vals.get(1)) else {
            return Ev::Poison;
        };
        let Some(one) = self.coerce_to(&Ev::Int(1), &ty, span) else {
            return Ev::Poison;
        };
        let Some(s) = self.emit_v(Op::Binary(BinaryOp::Add, p, q), ty.clone(), span) else {
            return Ev::Poison;
        };
        let Some(s) = self.emit_v(Op::Binary(BinaryOp::Sub, s, one), ty.clone(), span) else {
            return Ev::Poison;
        };
        self.emit1(Op::Binary(BinaryOp::Div, s, q), ty, span)
    }

    /// The one-argument math functions: floats only, except `abs` (any number).
    fn math(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        let u = match name {
            "exp" => UnaryOp::Exp,
            "exp2" => UnaryOp::Exp2,
            "log" => UnaryOp::Log,
            "log2" => UnaryOp::Log2,
            "sqrt" => UnaryOp::Sqrt,
            "rsqrt" => UnaryOp::Rsqrt,
            "tanh" => UnaryOp::Tanh,
            "sigmoid" => UnaryOp::Sigmoid,
            "sin" => UnaryOp::Sin,
            "cos" => UnaryOp::Cos,
            "floor" => UnaryOp::Floor,
            "ceil" => UnaryOp::Ceil,
            _ => UnaryOp::Abs,
        };
        let (x, xs) = a.p(0);
        let x = match self.expect_value(x, xs) {
            // A lone integer constant is a float argument here (`exp(1)`).
            Ev::Int(i) if u != UnaryOp::Abs => Ev::Float(i as f64),
            Ev::Int(i) if u == UnaryOp::Abs => {
                return self.checked_int(i.checked_abs(), span, &format!("`abs({i})`"))
            }
            Ev::Float(f) if u == UnaryOp::Abs => return Ev::Float(f.abs()),
            other => other,
        };
        let Some((vals, ty)) = self.unify(&[(x, xs)], span, &format!("`{name}`")) else {
            return Ev::Poison;
        };
        let d = ty.dtype();
        let ok = if u == UnaryOp::Abs {
            d.is_int() || d.is_float()
        } else {
            d.is_float()
        };
        if !ok {
            let need = if u == UnaryOp::Abs {
                "a number"
            } else {
                "a float (f16, bf16 or f32)"
            };
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    xs,
                    format!("`{name}` needs {need}, found `{ty}`"),
                )
                .with_note(format!("help: cast first, e.g. `{name}(x as f32)`")),
            );
        }
        let Some(&v) = vals.first() else {
            return Ev::Poison;
        };
        self.emit1(Op::Unary(u, v), ty, span)
    }

    /// `min(a, b)` / `max(a, b)` element-wise (any numbers, broadcasting), or the
    /// reduction `max(tile, axis)` when the second argument is an integer constant and
    /// the first a tile, or the axis is given by keyword.
    fn min_max(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        let is_tile = matches!(self.ev_type(&a.p(0).0), Some(ValueType::Tile(..)));
        let axis = a.kw("axis").or_else(|| match a.pos.get(1) {
            Some((Ev::Int(i), s)) if is_tile => Some((Ev::Int(*i), *s)),
            _ => None,
        });
        if let Some(axis) = axis {
            let op = if name == "max" {
                ReduceOp::Max
            } else {
                ReduceOp::Min
            };
            return self.reduce(op, a.p(0), axis, span);
        }
        let (x, xs) = a.p(0);
        let (y, ys) = a.p(1);
        let x = self.expect_value(x, xs);
        let y = self.expect_value(y, ys);
        match (&x, &y) {
            (Ev::Int(m), Ev::Int(n)) => {
                return Ev::Int(if name == "max" { *m.max(n) } else { *m.min(n) })
            }
            (Ev::Float(_) | Ev::Int(_), Ev::Float(_) | Ev::Int(_)) => {
                let f = |e: &Ev| match e {
                    Ev::Float(v) => *v,
                    Ev::Int(i) => *i as f64,
                    _ => 0.0,
                };
                let (p, q) = (f(&x), f(&y));
                return Ev::Float(if name == "max" { p.max(q) } else { p.min(q) });
            }
            _ => {}
        }
        let Some((vals, ty)) = self.unify(&[(x, xs), (y, ys)], span, &format!("`{name}`")) else {
            return Ev::Poison;
        };
        if ty.dtype() == DType::Bool {
            return self.error(
                ErrorCode::TypeMismatch,
                span,
                format!("`{name}` needs numbers, found `bool`"),
            );
        }
        let bo = if name == "max" {
            BinaryOp::Max
        } else {
            BinaryOp::Min
        };
        let (Some(&p), Some(&q)) = (vals.first(), vals.get(1)) else {
            return Ev::Poison;
        };
        self.emit1(Op::Binary(bo, p, q), ty, span)
    }

    /// `where(cond, a, b)`: `cond` is bool; all three broadcast together.
    fn select(&mut self, a: &Args, span: Span) -> Ev {
        let (c, cs) = a.p(0);
        let c = self.expect_value(c, cs);
        let cond_ok = match self.ev_type(&c) {
            Some(t) => t.dtype() == DType::Bool,
            None => matches!(c, Ev::Bool(_) | Ev::Poison),
        };
        if !cond_ok {
            let desc = self.describe(&c);
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    cs,
                    format!("`where` needs a bool condition, found {desc}"),
                )
                .with_label_message("not bool")
                .with_note("help: compare to get a bool, e.g. `x > 0.0`"),
            );
        }
        let Some((vals, ty)) = self.unify(&[a.p(1), a.p(2)], span, "`where`") else {
            return Ev::Poison;
        };
        let cshape = self.ev_type(&c).and_then(|t| t.shape().cloned());
        let shape = match Self::broadcast_shapes(cshape.as_ref(), ty.shape()) {
            Ok(s) => s,
            Err(()) => {
                let cs_text = cshape.map_or("scalar".to_string(), |s| s.to_string());
                let vs_text = ty.shape().map_or("scalar".to_string(), |s| s.to_string());
                return self.push(
                    Diagnostic::error(
                        ErrorCode::ShapeMismatch,
                        span,
                        format!("shapes {cs_text} and {vs_text} cannot be broadcast together in `where`"),
                    )
                    .with_secondary(cs, format!("the condition has shape {cs_text}"))
                    .with_note("extents must be equal or 1, aligned from the right"),
                );
            }
        };
        if let Some(s) = &shape {
            if !self.check_tile_shape(s, span) {
                return Ev::Poison;
            }
        }
        let full = match &shape {
            Some(s) => ValueType::Tile(ty.dtype(), s.clone()),
            None => ValueType::Scalar(ty.dtype()),
        };
        let (Some(&x), Some(&y)) = (vals.first(), vals.get(1)) else {
            return Ev::Poison;
        };
        let (Some(x), Some(y), Some(cv)) = (
            self.broadcast_to(x, full.shape(), span),
            self.broadcast_to(y, full.shape(), span),
            self.coerce_to(&c, &full.with_dtype(DType::Bool), cs),
        ) else {
            return Ev::Poison;
        };
        self.emit1(Op::Select(cv, x, y), full, span)
    }

    /// `pow(a, b)`, `fdiv(a, b)` and `fma(a, b, c)`: floats, broadcasting; integer constants
    /// are floats.
    fn float_op(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        let items: Vec<(Ev, Span)> = a
            .pos
            .iter()
            .map(|(e, s)| match e {
                Ev::Int(i) => (Ev::Float(*i as f64), *s),
                other => (other.clone(), *s),
            })
            .collect();
        let mut checked = Vec::new();
        for (e, s) in items {
            checked.push((self.expect_value(e, s), s));
        }
        let Some((vals, ty)) = self.unify(&checked, span, &format!("`{name}`")) else {
            return Ev::Poison;
        };
        if !ty.dtype().is_float() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    span,
                    format!("`{name}` needs floats, found `{}`", ty.dtype()),
                )
                .with_note(format!("help: cast first, e.g. `{name}(x as f32, ...)`")),
            );
        }
        match (name, vals.as_slice()) {
            ("pow", [x, y]) => self.emit1(Op::Binary(BinaryOp::Pow, *x, *y), ty, span),
            ("fdiv", [x, y]) => self.emit1(Op::Binary(BinaryOp::FDiv, *x, *y), ty, span),
            ("fma", [x, y, z]) => self.emit1(Op::Fma(*x, *y, *z), ty, span),
            _ => Ev::Poison,
        }
    }
}
