//! Built-in functions: one table of names and argument lists, one lowering per builtin.
//!
//! Assumes: argument expressions have not been evaluated yet (each builtin evaluates
//! them in order). Guarantees: the IR emitted for a builtin matches its `ir::Op`
//! contract (exact types; memory ops with one index/offset per tensor dimension).

use super::{scalar_const, Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast;
use crate::ir::{BinaryOp, Op, ReduceOp, UnaryOp, ValueId};
use crate::span::Span;
use crate::types::{DType, Scalar, Shape, ValueType, MAX_TILE_ELEMENTS, MAX_TILE_RANK};

/// Builtin signatures: (name, positional parameter names, number required, keywords).
const BUILTINS: &[(&str, &[&str], usize, &[&str])] = &[
    ("bid", &["axis"], 1, &[]),
    ("num_bids", &["axis"], 1, &[]),
    ("arange", &["start", "end"], 2, &[]),
    ("zeros", &["shape", "dtype"], 2, &[]),
    ("full", &["shape", "value", "dtype"], 2, &[]),
    ("shape", &["tensor", "dim"], 2, &[]),
    ("stride", &["tensor", "dim"], 2, &[]),
    ("cdiv", &["a", "b"], 2, &[]),
    ("exp", &["x"], 1, &[]),
    ("exp2", &["x"], 1, &[]),
    ("log", &["x"], 1, &[]),
    ("log2", &["x"], 1, &[]),
    ("sqrt", &["x"], 1, &[]),
    ("rsqrt", &["x"], 1, &[]),
    ("tanh", &["x"], 1, &[]),
    ("sigmoid", &["x"], 1, &[]),
    ("sin", &["x"], 1, &[]),
    ("cos", &["x"], 1, &[]),
    ("floor", &["x"], 1, &[]),
    ("ceil", &["x"], 1, &[]),
    ("abs", &["x"], 1, &[]),
    ("min", &["a", "b"], 2, &["axis"]),
    ("max", &["a", "b"], 2, &["axis"]),
    ("fma", &["a", "b", "c"], 3, &[]),
    ("pow", &["a", "b"], 2, &[]),
    ("where", &["cond", "a", "b"], 3, &[]),
    ("cast", &["x", "dtype"], 2, &[]),
    ("reshape", &["x", "shape"], 2, &[]),
    ("expand_dims", &["x", "axis"], 2, &[]),
    ("broadcast", &["x", "shape"], 2, &[]),
    ("transpose", &["x"], 1, &[]),
    ("permute", &["x", "perm"], 2, &[]),
    ("sum", &["x", "axis"], 2, &[]),
    ("argmax", &["x", "axis"], 2, &[]),
    ("argmin", &["x", "axis"], 2, &[]),
    ("load", &["tensor", "index", "shape"], 3, &["pad"]),
    ("store", &["tensor", "index", "value"], 3, &[]),
    ("gather", &["tensor", "offsets"], 2, &["mask", "other"]),
    ("scatter", &["tensor", "offsets", "value"], 3, &["mask"]),
    ("atomic_add", &["tensor", "offsets", "value"], 3, &["mask"]),
    ("dot", &["a", "b", "acc"], 3, &[]),
];

/// Evaluated arguments: positional (with spans) and keywords.
struct Args {
    pos: Vec<(Ev, Span)>,
    kw: Vec<(String, Ev, Span)>,
}

impl Args {
    fn kw(&self, name: &str) -> Option<(Ev, Span)> {
        self.kw
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, e, s)| (e.clone(), *s))
    }
}

impl Checker<'_> {
    pub(crate) fn call(&mut self, func: &ast::Ident, args: &[ast::Arg], span: Span) -> Ev {
        let name = func.name.as_str();
        let Some(&(_, params, required, keywords)) = BUILTINS.iter().find(|b| b.0 == name) else {
            let names: Vec<String> = BUILTINS.iter().map(|b| b.0.to_string()).collect();
            let mut d = Diagnostic::error(
                ErrorCode::UnknownFunction,
                func.span,
                format!("unknown function `{name}`"),
            )
            .with_label_message("not a builtin");
            if let Some(s) = super::expr::closest(name, &names) {
                d = d.with_note(format!("help: did you mean `{s}`?"));
            }
            for a in args {
                let _ = self.expr(&a.value);
            }
            return self.push(d);
        };
        // Keywords may also name positional parameters beyond the first (`x.sum(axis = 1)`).
        let mut pos = Vec::new();
        let mut kw = Vec::new();
        let mut ok = true;
        for a in args {
            let v = self.expr(&a.value);
            match &a.name {
                None => {
                    if !kw.is_empty() {
                        self.error(
                            ErrorCode::BadArguments,
                            a.value.span,
                            "positional argument after a keyword argument",
                        );
                        ok = false;
                    }
                    pos.push((v, a.value.span));
                }
                Some(k) => {
                    if let Some(i) = params.iter().position(|p| *p == k.name) {
                        if i != pos.len() {
                            self.error(
                                ErrorCode::BadArguments,
                                k.span,
                                format!("argument `{}` given out of order", k.name),
                            );
                            ok = false;
                        }
                        pos.push((v, a.value.span));
                    } else if keywords.contains(&k.name.as_str()) {
                        kw.push((k.name.clone(), v, a.value.span));
                    } else {
                        let mut valid: Vec<&str> = params.to_vec();
                        valid.extend_from_slice(keywords);
                        let mut d = Diagnostic::error(
                            ErrorCode::BadArguments,
                            k.span,
                            format!("`{name}` has no argument named `{}`", k.name),
                        )
                        .with_note(format!("its arguments are: {}", valid.join(", ")));
                        if let Some(s) = super::expr::closest(
                            &k.name,
                            &valid.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                        ) {
                            d = d.with_note(format!("help: did you mean `{s}`?"));
                        }
                        self.push(d);
                        ok = false;
                    }
                }
            }
        }
        if pos.len() < required || pos.len() > params.len() {
            let expected = if required == params.len() {
                format!("{required}")
            } else {
                format!("{required} to {}", params.len())
            };
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadArguments,
                    span,
                    format!(
                        "`{name}` takes {expected} argument{}, {} given",
                        if params.len() == 1 { "" } else { "s" },
                        pos.len()
                    ),
                )
                .with_note(format!("usage: {name}({})", params.join(", "))),
            );
        }
        if !ok
            || pos.iter().any(|(e, _)| matches!(e, Ev::Poison))
            || kw.iter().any(|(_, e, _)| matches!(e, Ev::Poison))
        {
            return Ev::Poison;
        }
        let a = Args { pos, kw };
        self.builtin(name, a, span)
    }

    fn builtin(&mut self, name: &str, a: Args, span: Span) -> Ev {
        let p = |i: usize| a.pos.get(i).cloned().unwrap_or((Ev::Poison, span));
        match name {
            "bid" | "num_bids" => {
                let Some(axis) = self.const_int(&p(0), 0, 2, "grid axis") else {
                    return Ev::Poison;
                };
                let op = if name == "bid" {
                    Op::ProgramId(axis as u8)
                } else {
                    Op::NumPrograms(axis as u8)
                };
                self.emit1(op, ValueType::Scalar(DType::I32), span)
            }
            "arange" => {
                let (Some(s), Some(e)) = (
                    self.const_int(&p(0), i32::MIN as i64, i32::MAX as i64, "arange start"),
                    self.const_int(&p(1), i32::MIN as i64, i32::MAX as i64, "arange end"),
                ) else {
                    return Ev::Poison;
                };
                if e <= s || (e - s) as u64 > MAX_TILE_ELEMENTS {
                    return self.error(
                        ErrorCode::BadTileShape,
                        span,
                        format!(
                            "arange({s}, {e}) must have between 1 and {MAX_TILE_ELEMENTS} elements"
                        ),
                    );
                }
                self.emit1(
                    Op::Arange { start: s, end: e },
                    ValueType::Tile(DType::I32, Shape(vec![(e - s) as u32])),
                    span,
                )
            }
            "zeros" => {
                let Some(shape) = self.const_shape(&p(0)) else {
                    return Ev::Poison;
                };
                let Some(d) = self.expect_dtype(&p(1)) else {
                    return Ev::Poison;
                };
                self.splat_const(&Ev::Int(0), d, shape, span)
            }
            "full" => {
                let Some(shape) = self.const_shape(&p(0)) else {
                    return Ev::Poison;
                };
                let (v, vs) = p(1);
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
                        None => {
                            return self.error(ErrorCode::WrongKind, vs, "`full` needs a value")
                        }
                    },
                };
                match &v {
                    Ev::Value(x) => {
                        let t = self.ty(*x);
                        if t.shape().is_some() {
                            return self.error(
                                ErrorCode::WrongKind,
                                vs,
                                "`full` takes a scalar value, not a tile (use `broadcast`)",
                            );
                        }
                        let x = if t.dtype() != d {
                            self.cast(v.clone(), d, vs, vs)
                        } else {
                            v.clone()
                        };
                        let Ev::Value(x) = x else { return Ev::Poison };
                        self.emit1(Op::Splat(x), ValueType::Tile(d, shape), span)
                    }
                    _ => self.splat_const(&v, d, shape, span),
                }
            }
            "shape" | "stride" => {
                let Some(t) = self.expect_tensor(&p(0)) else {
                    return Ev::Poison;
                };
                let rank = self.func.tensor_param(t).map_or(0, |t| t.rank());
                let Some(dim) = self.const_int(&p(1), 0, rank as i64 - 1, "dimension") else {
                    return Ev::Poison;
                };
                let tp = self.func.tensor_param(t).cloned();
                if name == "shape" {
                    if let Some(Some(n)) =
                        tp.as_ref().and_then(|t| t.dims.get(dim as usize).copied())
                    {
                        return Ev::Int(n as i128);
                    }
                    self.emit1(
                        Op::TensorDim {
                            tensor: t,
                            dim: dim as u8,
                        },
                        ValueType::Scalar(DType::I32),
                        span,
                    )
                } else {
                    if tp.is_some_and(|t| t.contiguous && dim as usize + 1 == t.rank()) {
                        return Ev::Int(1);
                    }
                    self.emit1(
                        Op::TensorStride {
                            tensor: t,
                            dim: dim as u8,
                        },
                        ValueType::Scalar(DType::I32),
                        span,
                    )
                }
            }
            "cdiv" => {
                let (x, xs) = p(0);
                let (y, ys) = p(1);
                if let (Ev::Int(m), Ev::Int(n)) = (&x, &y) {
                    if *n == 0 {
                        return self.error(
                            ErrorCode::ConstEval,
                            span,
                            "division by zero in `cdiv`",
                        );
                    }
                    return Ev::Int((m + n - 1).div_euclid(*n));
                }
                let Some((vals, ty)) = self.unify(&[(x, xs), (y, ys)], span, "`cdiv`") else {
                    return Ev::Poison;
                };
                if !ty.dtype().is_int() {
                    return self.error(
                        ErrorCode::TypeMismatch,
                        span,
                        format!("`cdiv` needs integers, found `{}`", ty.dtype()),
                    );
                }
                let one = self.coerce_to(&Ev::Int(1), &ty, span);
                let Some(one) = one else { return Ev::Poison };
                let Ev::Value(s) = self.emit1(
                    Op::Binary(BinaryOp::Add, vals[0], vals[1]),
                    ty.clone(),
                    span,
                ) else {
                    return Ev::Poison;
                };
                let Ev::Value(s) = self.emit1(Op::Binary(BinaryOp::Sub, s, one), ty.clone(), span)
                else {
                    return Ev::Poison;
                };
                self.emit1(Op::Binary(BinaryOp::Div, s, vals[1]), ty, span)
            }
            "exp" | "exp2" | "log" | "log2" | "sqrt" | "rsqrt" | "tanh" | "sigmoid" | "sin"
            | "cos" | "floor" | "ceil" | "abs" => {
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
                let (x, xs) = p(0);
                let x = self.expect_value(x, xs);
                let x = match x {
                    Ev::Int(i) if u != UnaryOp::Abs => Ev::Float(i as f64),
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
                self.emit1(Op::Unary(u, vals[0]), ty, span)
            }
            "min" | "max" => {
                // `max(tile, axis)` reduces; `max(a, b)` is element-wise.
                let second_is_axis = a.kw("axis").is_some()
                    || (matches!(a.pos.get(1), Some((Ev::Int(_), _)))
                        && matches!(self.ev_type(&p(0).0), Some(ValueType::Tile(..))));
                if second_is_axis {
                    let axis = a
                        .kw("axis")
                        .or_else(|| a.pos.get(1).cloned())
                        .unwrap_or((Ev::Poison, span));
                    let op = if name == "max" {
                        ReduceOp::Max
                    } else {
                        ReduceOp::Min
                    };
                    return self.reduce(op, p(0), axis, span);
                }
                let (x, xs) = p(0);
                let (y, ys) = p(1);
                let x = self.expect_value(x, xs);
                let y = self.expect_value(y, ys);
                if let (Ev::Int(m), Ev::Int(n)) = (&x, &y) {
                    return Ev::Int(if name == "max" { *m.max(n) } else { *m.min(n) });
                }
                let Some((vals, ty)) = self.unify(&[(x, xs), (y, ys)], span, &format!("`{name}`"))
                else {
                    return Ev::Poison;
                };
                let bo = if name == "max" {
                    BinaryOp::Max
                } else {
                    BinaryOp::Min
                };
                self.emit1(Op::Binary(bo, vals[0], vals[1]), ty, span)
            }
            "pow" | "fma" | "where" => {
                let items: Vec<(Ev, Span)> = a.pos.clone();
                if name == "where" {
                    let (c, cs) = items[0].clone();
                    let c = self.expect_value(c, cs);
                    if let Some(t) = self.ev_type(&c) {
                        if t.dtype() != DType::Bool {
                            return self.error(
                                ErrorCode::TypeMismatch,
                                cs,
                                format!("`where` needs a bool condition, found `{t}`"),
                            );
                        }
                    } else if !matches!(c, Ev::Bool(_)) {
                        return self.error(
                            ErrorCode::TypeMismatch,
                            cs,
                            "`where` needs a bool condition",
                        );
                    }
                    let Some((vals, ty)) = self.unify(&items[1..], span, "`where`") else {
                        return Ev::Poison;
                    };
                    // Broadcast the condition together with the arms.
                    let cshape = self.ev_type(&c).and_then(|t| t.shape().cloned());
                    let shape = match Self::broadcast_shapes(cshape.as_ref(), ty.shape()) {
                        Ok(s) => s,
                        Err(()) => return self.error(
                            ErrorCode::ShapeMismatch,
                            span,
                            "the condition's shape does not broadcast with the values' in `where`",
                        ),
                    };
                    let full = match &shape {
                        Some(s) => ValueType::Tile(ty.dtype(), s.clone()),
                        None => ValueType::Scalar(ty.dtype()),
                    };
                    let (Some(x), Some(y)) = (
                        self.coerce_to(&Ev::Value(vals[0]), &full, span),
                        self.coerce_to(&Ev::Value(vals[1]), &full, span),
                    ) else {
                        return Ev::Poison;
                    };
                    let Some(cv) = self.coerce_to(&c, &full.with_dtype(DType::Bool), cs) else {
                        return Ev::Poison;
                    };
                    return self.emit1(Op::Select(cv, x, y), full, span);
                }
                let items: Vec<(Ev, Span)> = items
                    .into_iter()
                    .map(|(e, s)| {
                        (
                            if let Ev::Int(i) = e {
                                Ev::Float(i as f64)
                            } else {
                                e
                            },
                            s,
                        )
                    })
                    .collect();
                let Some((vals, ty)) = self.unify(&items, span, &format!("`{name}`")) else {
                    return Ev::Poison;
                };
                if !ty.dtype().is_float() {
                    return self.error(
                        ErrorCode::TypeMismatch,
                        span,
                        format!("`{name}` needs floats, found `{}`", ty.dtype()),
                    );
                }
                if name == "pow" {
                    self.emit1(Op::Binary(BinaryOp::Pow, vals[0], vals[1]), ty, span)
                } else {
                    self.emit1(Op::Fma(vals[0], vals[1], vals[2]), ty, span)
                }
            }
            "cast" => {
                let Some(d) = self.expect_dtype(&p(1)) else {
                    return Ev::Poison;
                };
                let (x, xs) = p(0);
                self.cast(x, d, xs, span)
            }
            "reshape" | "broadcast" => {
                let Some((x, t, s)) = self.expect_tile(&p(0)) else {
                    return Ev::Poison;
                };
                let Some(shape) = self.const_shape(&p(1)) else {
                    return Ev::Poison;
                };
                if name == "reshape" {
                    if shape.num_elements() != s.num_elements() {
                        return self.push(
                            Diagnostic::error(
                                ErrorCode::ShapeMismatch,
                                span,
                                format!(
                                    "cannot reshape {s} ({} elements) to {shape} ({} elements)",
                                    s.num_elements(),
                                    shape.num_elements()
                                ),
                            )
                            .with_note("reshape keeps the number of elements"),
                        );
                    }
                    return self.emit1(Op::Reshape(x), ValueType::Tile(t, shape), span);
                }
                match Self::broadcast_shapes(Some(&s), Some(&shape)) {
                    Ok(Some(r)) if r == shape => match self.broadcast_to(x, Some(&shape), span) {
                        Some(v) => Ev::Value(v),
                        None => Ev::Poison,
                    },
                    _ => self.error(
                        ErrorCode::ShapeMismatch,
                        span,
                        format!("cannot broadcast {s} to {shape}: extents must be equal or 1"),
                    ),
                }
            }
            "expand_dims" => {
                let Some((x, t, s)) = self.expect_tile(&p(0)) else {
                    return Ev::Poison;
                };
                let Some(axis) = self.const_int(&p(1), 0, s.rank() as i64, "axis") else {
                    return Ev::Poison;
                };
                let mut dims = s.dims().to_vec();
                dims.insert(axis as usize, 1);
                if dims.len() > MAX_TILE_RANK {
                    return self.error(
                        ErrorCode::BadTileShape,
                        span,
                        format!("tiles have at most {MAX_TILE_RANK} dimensions"),
                    );
                }
                self.emit1(
                    Op::ExpandDims(x, axis as u8),
                    ValueType::Tile(t, Shape(dims)),
                    span,
                )
            }
            "transpose" | "permute" => {
                let Some((x, t, s)) = self.expect_tile(&p(0)) else {
                    return Ev::Poison;
                };
                let perm: Vec<u8> = if name == "transpose" {
                    if s.rank() != 2 {
                        return self.error(
                            ErrorCode::BadAxis,
                            span,
                            format!("`transpose` needs a 2-D tile, found {s} (use `permute`)"),
                        );
                    }
                    vec![1, 0]
                } else {
                    let Some(list) = self.const_shape_raw(&p(1)) else {
                        return Ev::Poison;
                    };
                    let mut sorted = list.clone();
                    sorted.sort_unstable();
                    if sorted != (0..s.rank() as i64).collect::<Vec<_>>() {
                        return self.error(
                            ErrorCode::BadAxis,
                            p(1).1,
                            format!("{list:?} is not a permutation of the {} axes", s.rank()),
                        );
                    }
                    list.iter().map(|v| *v as u8).collect()
                };
                let dims: Vec<u32> = perm.iter().map(|i| s.dims()[*i as usize]).collect();
                self.emit1(Op::Permute(x, perm), ValueType::Tile(t, Shape(dims)), span)
            }
            "sum" | "argmax" | "argmin" => {
                let op = match name {
                    "sum" => ReduceOp::Sum,
                    "argmax" => ReduceOp::ArgMax,
                    _ => ReduceOp::ArgMin,
                };
                self.reduce(op, p(0), p(1), span)
            }
            "load" => self.load(&a, span),
            "store" => self.store(&a, span),
            "gather" | "scatter" | "atomic_add" => self.indexed(name, &a, span),
            "dot" => self.dot(&a, span),
            _ => self.error(
                ErrorCode::UnknownFunction,
                span,
                format!("unknown function `{name}`"),
            ),
        }
    }

    fn splat_const(&mut self, v: &Ev, d: DType, shape: Shape, span: Span) -> Ev {
        let Some(s) = scalar_const(d, v) else {
            let desc = self.describe(v);
            return self.error(
                ErrorCode::TypeMismatch,
                span,
                format!("{desc} cannot fill a `{d}` tile"),
            );
        };
        self.emit1(Op::Const(s), ValueType::Tile(d, shape), span)
    }

    pub(crate) fn const_int(
        &mut self,
        (e, sp): &(Ev, Span),
        lo: i64,
        hi: i64,
        what: &str,
    ) -> Option<i64> {
        match e {
            Ev::Int(i) if (lo as i128..=hi as i128).contains(i) => Some(*i as i64),
            Ev::Int(i) => {
                let code = if what.contains("axis") || what.contains("dimension") {
                    ErrorCode::BadAxis
                } else {
                    ErrorCode::BadTileShape
                };
                self.error(code, *sp, format!("{what} {i} is out of range {lo}..={hi}"));
                None
            }
            Ev::Poison => None,
            Ev::Value(_) => {
                self.push(
                    Diagnostic::error(
                        ErrorCode::NotConstant,
                        *sp,
                        format!("the {what} must be a compile-time constant"),
                    )
                    .with_label_message("this is a runtime value"),
                );
                None
            }
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::WrongKind,
                    *sp,
                    format!("expected an integer {what}, found {desc}"),
                );
                None
            }
        }
    }

    fn const_shape_raw(&mut self, (e, sp): &(Ev, Span)) -> Option<Vec<i64>> {
        let Ev::List(items) = e else {
            if matches!(e, Ev::Poison) {
                return None;
            }
            self.error(ErrorCode::WrongKind, *sp, "expected a list like `[4, 128]`");
            return None;
        };
        let mut out = Vec::new();
        for it in items {
            out.push(self.const_int(it, i64::MIN, i64::MAX, "extent")?);
        }
        Some(out)
    }

    pub(crate) fn const_shape(&mut self, arg: &(Ev, Span)) -> Option<Shape> {
        let raw = self.const_shape_raw(arg)?;
        let sp = arg.1;
        if raw.is_empty() || raw.len() > MAX_TILE_RANK {
            self.error(
                ErrorCode::BadTileShape,
                sp,
                format!(
                    "a tile has 1 to {MAX_TILE_RANK} dimensions, this shape has {}",
                    raw.len()
                ),
            );
            return None;
        }
        if let Some(bad) = raw
            .iter()
            .find(|d| **d < 1 || **d > MAX_TILE_ELEMENTS as i64)
        {
            self.error(
                ErrorCode::BadTileShape,
                sp,
                format!("tile extent {bad} is not allowed: every extent must be at least 1"),
            );
            return None;
        }
        let shape = Shape(raw.iter().map(|d| *d as u32).collect());
        if shape.num_elements() > MAX_TILE_ELEMENTS {
            self.error(
                ErrorCode::BadTileShape,
                sp,
                format!(
                    "tile {shape} has {} elements; the limit is {MAX_TILE_ELEMENTS}",
                    shape.num_elements()
                ),
            );
            return None;
        }
        Some(shape)
    }

    fn expect_dtype(&mut self, (e, sp): &(Ev, Span)) -> Option<DType> {
        match e {
            Ev::DType(d) => Some(*d),
            Ev::Poison => None,
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::WrongKind,
                    *sp,
                    format!("expected a dtype, found {desc}"),
                );
                None
            }
        }
    }

    fn expect_tensor(&mut self, (e, sp): &(Ev, Span)) -> Option<u32> {
        match e {
            Ev::Tensor(t) => Some(*t),
            Ev::Poison => None,
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::WrongKind,
                    *sp,
                    format!("expected a tensor parameter, found {desc}"),
                );
                None
            }
        }
    }

    fn expect_tile(&mut self, (e, sp): &(Ev, Span)) -> Option<(ValueId, DType, Shape)> {
        if let Ev::Value(v) = e {
            if let ValueType::Tile(d, s) = self.ty(*v) {
                return Some((*v, d, s));
            }
        }
        if !matches!(e, Ev::Poison) {
            let desc = self.describe(e);
            self.error(
                ErrorCode::WrongKind,
                *sp,
                format!("expected a tile, found {desc}"),
            );
        }
        None
    }

    fn reduce(&mut self, op: ReduceOp, x: (Ev, Span), axis: (Ev, Span), span: Span) -> Ev {
        let Some((v, d, s)) = self.expect_tile(&x) else {
            return Ev::Poison;
        };
        let Some(ax) = self.const_int(&axis, 0, s.rank() as i64 - 1, "axis") else {
            return Ev::Poison;
        };
        if d == DType::Bool {
            return self.error(
                ErrorCode::TypeMismatch,
                x.1,
                "cannot reduce a bool tile (cast it to i32 first)",
            );
        }
        let mut dims = s.dims().to_vec();
        dims.remove(ax as usize);
        let rd = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
            DType::I32
        } else {
            d
        };
        let ty = if dims.is_empty() {
            ValueType::Scalar(rd)
        } else {
            ValueType::Tile(rd, Shape(dims))
        };
        self.emit1(
            Op::Reduce {
                op,
                value: v,
                axis: ax as u8,
            },
            ty,
            span,
        )
    }

    /// One i32 scalar per tensor dimension (tile coordinates of `load`/`store`).
    fn tile_index(&mut self, t: u32, arg: &(Ev, Span)) -> Option<Vec<ValueId>> {
        let rank = self.func.tensor_param(t)?.rank();
        let Ev::List(items) = &arg.0 else {
            self.error(
                ErrorCode::BadAccess,
                arg.1,
                "the index must be a list with one entry per tensor dimension, like `[row, 0]`",
            );
            return None;
        };
        if items.len() != rank {
            self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    arg.1,
                    format!(
                        "this tensor has {rank} dimension(s), but the index has {}",
                        items.len()
                    ),
                )
                .with_note("give one tile coordinate per dimension"),
            );
            return None;
        }
        let mut out = Vec::new();
        for (e, sp) in items {
            match e {
                Ev::Value(v) if self.ty(*v) == ValueType::Scalar(DType::I32) => out.push(*v),
                Ev::Int(_) => out.push(self.materialize(e, DType::I32, *sp)?),
                Ev::Poison => return None,
                other => {
                    let desc = self.describe(other);
                    self.error(
                        ErrorCode::BadAccess,
                        *sp,
                        format!("a tile coordinate must be an i32 scalar, found {desc}"),
                    );
                    return None;
                }
            }
        }
        Some(out)
    }

    fn load(&mut self, a: &Args, span: Span) -> Ev {
        let Some(t) = self.expect_tensor(&a.pos[0]) else {
            return Ev::Poison;
        };
        let Some(tp) = self.func.tensor_param(t).cloned() else {
            return Ev::Poison;
        };
        let Some(index) = self.tile_index(t, &a.pos[1]) else {
            return Ev::Poison;
        };
        let Some(shape) = self.const_shape(&a.pos[2]) else {
            return Ev::Poison;
        };
        if shape.rank() != tp.rank() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    a.pos[2].1,
                    format!(
                        "the tile shape has {} dimension(s), the tensor {}",
                        shape.rank(),
                        tp.rank()
                    ),
                )
                .with_note("use 1 for a dimension you index one at a time, then `reshape`"),
            );
        }
        let padding = match a.kw("pad") {
            None => scalar_const(tp.dtype, &Ev::Int(0)).unwrap_or(Scalar::Bool(false)),
            Some((e, sp)) => match scalar_const(tp.dtype, &e) {
                Some(s) => s,
                None => {
                    let desc = self.describe(&e);
                    return self.error(
                        ErrorCode::TypeMismatch,
                        sp,
                        format!(
                            "the padding must be a `{}` constant, found {desc}",
                            tp.dtype
                        ),
                    );
                }
            },
        };
        self.emit1(
            Op::Load {
                tensor: t,
                index,
                padding,
            },
            ValueType::Tile(tp.dtype, shape),
            span,
        )
    }

    fn store(&mut self, a: &Args, span: Span) -> Ev {
        let Some(t) = self.expect_tensor(&a.pos[0]) else {
            return Ev::Poison;
        };
        let Some(tp) = self.func.tensor_param(t).cloned() else {
            return Ev::Poison;
        };
        let Some(index) = self.tile_index(t, &a.pos[1]) else {
            return Ev::Poison;
        };
        let (v, vs) = a.pos[2].clone();
        let Some((v, d, s)) = self.expect_tile(&(v, vs)) else {
            return Ev::Poison;
        };
        if d != tp.dtype {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadMemoryOp,
                    vs,
                    format!("cannot store a `{d}` tile into a `{}` tensor", tp.dtype),
                )
                .with_note(format!("help: convert it: `(...) as {}`", tp.dtype)),
            );
        }
        if s.rank() != tp.rank() {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadAccess,
                    vs,
                    format!(
                        "the tile {s} has {} dimension(s), the tensor {}",
                        s.rank(),
                        tp.rank()
                    ),
                )
                .with_note("reshape the tile to the tensor's rank, using 1 for indexed dimensions"),
            );
        }
        self.emit(
            Op::Store {
                tensor: t,
                index,
                value: v,
            },
            vec![],
            span,
        );
        Ev::Poison.into_unit()
    }

    fn indexed(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        let Some(t) = self.expect_tensor(&a.pos[0]) else {
            return Ev::Poison;
        };
        let Some(tp) = self.func.tensor_param(t).cloned() else {
            return Ev::Poison;
        };
        let Ev::List(offs) = a.pos[1].0.clone() else {
            return self.error(
                ErrorCode::BadAccess,
                a.pos[1].1,
                "offsets must be a list with one integer tile per tensor dimension",
            );
        };
        if offs.len() != tp.rank() {
            return self.error(
                ErrorCode::BadAccess,
                a.pos[1].1,
                format!(
                    "this tensor has {} dimension(s), but {} offset(s) were given",
                    tp.rank(),
                    offs.len()
                ),
            );
        }
        if name == "atomic_add" && !matches!(tp.dtype, DType::F32 | DType::I32) {
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadMemoryOp,
                    a.pos[0].1,
                    format!(
                        "`atomic_add` supports f32 and i32 tensors, not `{}`",
                        tp.dtype
                    ),
                )
                .with_note("accumulate in an f32 or i32 tensor and convert afterwards"),
            );
        }
        // The common shape: offsets, mask and value broadcast together.
        let mut shape: Option<Shape> = None;
        let mut parts: Vec<(Ev, Span)> = offs.clone();
        let mask = a.kw("mask");
        if let Some(m) = &mask {
            parts.push(m.clone());
        }
        let value = if name == "gather" {
            None
        } else {
            Some(a.pos[2].clone())
        };
        if let Some(v) = &value {
            parts.push(v.clone());
        }
        for (e, sp) in &parts {
            let e = self.expect_value(e.clone(), *sp);
            if let Some(ty) = self.ev_type(&e) {
                match Self::broadcast_shapes(shape.as_ref(), ty.shape()) {
                    Ok(s) => shape = s,
                    Err(()) => {
                        return self.error(
                            ErrorCode::ShapeMismatch,
                            *sp,
                            format!(
                                "shape {} does not broadcast with the other offsets",
                                ty.shape().map_or("scalar".into(), |s| s.to_string())
                            ),
                        )
                    }
                }
            } else if matches!(e, Ev::Poison) {
                return Ev::Poison;
            }
        }
        let Some(shape) = shape else {
            return self.error(
                ErrorCode::BadAccess,
                span,
                format!("`{name}` needs at least one tile among its offsets or value"),
            );
        };
        let mut offsets = Vec::new();
        for (e, sp) in &offs {
            let d = match self.ev_type(e) {
                Some(t) if t.dtype().is_int() => t.dtype(),
                Some(t) => {
                    return self.error(
                        ErrorCode::TypeMismatch,
                        *sp,
                        format!("offsets must be integers, found `{t}`"),
                    )
                }
                None if matches!(e, Ev::Int(_)) => DType::I32,
                None => {
                    let desc = self.describe(e);
                    return self.error(
                        ErrorCode::TypeMismatch,
                        *sp,
                        format!("offsets must be integers, found {desc}"),
                    );
                }
            };
            let Some(v) = self.coerce_to(e, &ValueType::Tile(d, shape.clone()), *sp) else {
                return Ev::Poison;
            };
            offsets.push(v);
        }
        let mask = match mask {
            None => None,
            Some((e, sp)) => {
                let ok = matches!(e, Ev::Bool(_))
                    || self.ev_type(&e).is_some_and(|t| t.dtype() == DType::Bool);
                if !ok {
                    let desc = self.describe(&e);
                    return self.error(
                        ErrorCode::TypeMismatch,
                        sp,
                        format!("the mask must be bool, found {desc}"),
                    );
                }
                let Some(v) = self.coerce_to(&e, &ValueType::Tile(DType::Bool, shape.clone()), sp)
                else {
                    return Ev::Poison;
                };
                Some(v)
            }
        };
        let tile = ValueType::Tile(tp.dtype, shape);
        match value {
            None => {
                let other = match a.kw("other") {
                    None => scalar_const(tp.dtype, &Ev::Int(0)).unwrap_or(Scalar::Bool(false)),
                    Some((e, sp)) => match scalar_const(tp.dtype, &e) {
                        Some(s) => s,
                        None => {
                            let desc = self.describe(&e);
                            return self.error(
                                ErrorCode::TypeMismatch,
                                sp,
                                format!("`other` must be a `{}` constant, found {desc}", tp.dtype),
                            );
                        }
                    },
                };
                self.emit1(
                    Op::Gather {
                        tensor: t,
                        offsets,
                        mask,
                        other,
                    },
                    tile,
                    span,
                )
            }
            Some((e, sp)) => {
                if let Some(vt) = self.ev_type(&e) {
                    if vt.dtype() != tp.dtype {
                        return self.push(
                            Diagnostic::error(
                                ErrorCode::BadMemoryOp,
                                sp,
                                format!(
                                    "cannot write `{}` values into a `{}` tensor",
                                    vt.dtype(),
                                    tp.dtype
                                ),
                            )
                            .with_note(format!("help: convert them: `(...) as {}`", tp.dtype)),
                        );
                    }
                }
                let Some(v) = self.coerce_to(&e, &tile, sp) else {
                    let desc = self.describe(&e);
                    return self.error(
                        ErrorCode::TypeMismatch,
                        sp,
                        format!("{desc} cannot be written into a `{}` tensor", tp.dtype),
                    );
                };
                if name == "scatter" {
                    self.emit(
                        Op::Scatter {
                            tensor: t,
                            offsets,
                            value: v,
                            mask,
                        },
                        vec![],
                        span,
                    );
                    Ev::Poison.into_unit()
                } else {
                    self.emit1(
                        Op::AtomicAdd {
                            tensor: t,
                            offsets,
                            value: v,
                            mask,
                        },
                        tile,
                        span,
                    )
                }
            }
        }
    }

    fn dot(&mut self, a: &Args, span: Span) -> Ev {
        let (Some((x, xd, xs)), Some((y, yd, ys)), Some((z, zd, zs))) = (
            self.expect_tile(&a.pos[0]),
            self.expect_tile(&a.pos[1]),
            self.expect_tile(&a.pos[2]),
        ) else {
            return Ev::Poison;
        };
        if xs.rank() != 2
            || ys.rank() != 2
            || zs.rank() != 2
            || xs.dims()[1] != ys.dims()[0]
            || zs.dims() != [xs.dims()[0], ys.dims()[1]]
        {
            return self.error(
                ErrorCode::ShapeMismatch,
                span,
                format!("`dot` needs a: [M, K], b: [K, N], acc: [M, N]; found {xs}, {ys}, {zs}"),
            );
        }
        if xd != yd {
            return self.error(
                ErrorCode::TypeMismatch,
                span,
                format!("`dot` operands must have one dtype, found `{xd}` and `{yd}`"),
            );
        }
        if xd.is_float() && zd != DType::F32 {
            return self.error(
                ErrorCode::TypeMismatch,
                a.pos[2].1,
                format!("`dot` of float tiles accumulates in f32; the accumulator is `{zd}`"),
            );
        }
        if xd.is_int() && zd != DType::I32 {
            return self.error(
                ErrorCode::TypeMismatch,
                a.pos[2].1,
                "`dot` of integer tiles accumulates in i32",
            );
        }
        if xd == DType::Bool {
            return self.error(ErrorCode::TypeMismatch, span, "`dot` of bool tiles");
        }
        self.emit1(
            Op::Dot { a: x, b: y, acc: z },
            ValueType::Tile(zd, zs),
            span,
        )
    }
}

impl Ev {
    /// The "no value" result of a statement-like builtin (store, scatter). Using it as a
    /// value is reported by the caller as a wrong kind.
    fn into_unit(self) -> Ev {
        Ev::List(Vec::new())
    }
}
