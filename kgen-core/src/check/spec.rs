//! Specialization and parameters: every generic gets its value (from `-D NAME=VALUE` or
//! its default, in declaration order, so a default may use earlier generics), and every
//! runtime parameter becomes an `ir::Param`.
//!
//! Assumes: `scopes[0]` is empty on entry; it receives the generics, then the parameters.
//! Guarantees: `Specialization::consts` lists the generics in declaration order with
//! values of their declared kind (a float value rounded to its dtype); tensor alignments
//! are powers of two between the element size and 16 (the element size for
//! non-contiguous tensors); scalar parameters are bound
//! to `ScalarParam` values emitted at the top of the body, in source order. A rejected
//! generic or parameter is remembered in `poisoned`, so its uses are not reported again.

use super::{binding_span, Binding, Checker, Ev};
use crate::abi::ConstArg;
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast;
use crate::ir::{self, Op, ParamKind, TensorParam};
use crate::types::{DType, ValueType, MAX_TENSOR_RANK};

/// The alignment assumed for a tensor with no `tensor_align` entry.
pub(crate) const DEFAULT_ALIGN: u32 = 16;

impl Checker<'_> {
    /// Resolves generics from `-D` values and defaults; binds them; returns the
    /// specialization's constant list in declaration order.
    pub(crate) fn specialize(&mut self, kernel: &ast::Kernel) -> Vec<(String, ConstArg)> {
        let mut out = Vec::new();
        for (name, _) in &self.opts.defines {
            if kernel.generics.iter().any(|g| &g.name.name == name) {
                continue;
            }
            let list: Vec<&str> = kernel
                .generics
                .iter()
                .map(|g| g.name.name.as_str())
                .collect();
            let d = Diagnostic::unlocated(
                ErrorCode::BadSpecialization,
                format!(
                    "`-D {name}`: kernel `{}` has no compile-time parameter `{name}`",
                    kernel.name.name
                ),
            )
            .with_note(if list.is_empty() {
                "it takes no compile-time parameters".to_string()
            } else {
                format!("its compile-time parameters are: {}", list.join(", "))
            });
            self.push(d);
        }
        for g in &kernel.generics {
            if let Some(prev) = self.scopes.first().and_then(|s| s.get(&g.name.name)) {
                let prev_span = binding_span(prev);
                self.redefinition(&g.name, prev_span);
                continue;
            }
            let define = self
                .opts
                .defines
                .iter()
                .rev()
                .find(|(n, _)| n == &g.name.name);
            let value = match define {
                Some((_, text)) => match g.kind {
                    ast::GenericKind::FloatValue(d) => parse_float_define(text, d),
                    _ => parse_define(text),
                },
                None => match &g.default {
                    Some(e) => match self.generic_default(g, e) {
                        Some(v) => Some(v),
                        None => {
                            self.poisoned.insert(g.name.name.clone());
                            continue;
                        }
                    },
                    None => {
                        self.push(
                            Diagnostic::error(
                                ErrorCode::BadSpecialization,
                                g.name.span,
                                format!("compile-time parameter `{}` has no value", g.name.name),
                            )
                            .with_label_message("no default here")
                            .with_note(format!(
                                "give it a default, or pass `-D {}=...`",
                                g.name.name
                            )),
                        );
                        self.poisoned.insert(g.name.name.clone());
                        continue;
                    }
                },
            };
            let value = match (g.kind, value) {
                (ast::GenericKind::Int, Some(ConstArg::Int(i))) => ConstArg::Int(i),
                (ast::GenericKind::Bool, Some(ConstArg::Bool(b))) => ConstArg::Bool(b),
                (ast::GenericKind::DType, Some(ConstArg::DType(d))) => ConstArg::DType(d),
                (ast::GenericKind::Float, Some(ConstArg::DType(d))) if d.is_float() => {
                    ConstArg::DType(d)
                }
                (ast::GenericKind::FloatValue(d), Some(ConstArg::Float(e, bits))) if d == e => {
                    ConstArg::Float(d, bits)
                }
                (kind, v) => {
                    let got = match (&v, define) {
                        (Some(v), _) => format!("`{v}`"),
                        (None, Some((_, text))) => format!("`{text}`, which is not a value"),
                        (None, None) => "an unreadable value".to_string(),
                    };
                    let want = match kind {
                        ast::GenericKind::Int => "an integer".to_string(),
                        ast::GenericKind::Bool => "`true` or `false`".to_string(),
                        ast::GenericKind::DType => "a dtype".to_string(),
                        ast::GenericKind::Float => "a float dtype (f16, bf16 or f32)".to_string(),
                        ast::GenericKind::FloatValue(d) => format!("a `{d}` value such as `1e-5`"),
                    };
                    let at = g.default.as_ref().map_or(g.name.span, |e| e.span);
                    let mut d = Diagnostic::error(
                        ErrorCode::BadSpecialization,
                        at,
                        format!(
                            "compile-time parameter `{}` needs {want}, got {got}",
                            g.name.name
                        ),
                    )
                    .with_secondary(g.kind_span, "kind declared here");
                    let number = define.is_some_and(|(_, t)| t.trim().parse::<f64>().is_ok());
                    if number && matches!(kind, ast::GenericKind::Float | ast::GenericKind::DType) {
                        d = d.with_note(dtype_kind_help(&g.name.name, kind));
                    }
                    self.push(d);
                    self.poisoned.insert(g.name.name.clone());
                    continue;
                }
            };
            if let Some(s) = self.scopes.first_mut() {
                s.insert(
                    g.name.name.clone(),
                    Binding::Generic {
                        value: value.clone(),
                        span: g.name.span,
                    },
                );
            }
            out.push((g.name.name.clone(), value));
        }
        out
    }

    /// The value of a generic's default expression, checked against its kind where the
    /// kind decides what the expression means: a float value for `EPS: f32`, and a
    /// clear error for a number where a dtype is declared (`EPS: float = 1e-5`).
    fn generic_default(&mut self, g: &ast::GenericParam, e: &ast::Expr) -> Option<ConstArg> {
        let ev = self.expr(e);
        match (g.kind, &ev) {
            (ast::GenericKind::FloatValue(d), Ev::Float(f)) => Some(ConstArg::float(d, *f)),
            (ast::GenericKind::FloatValue(d), Ev::Int(i)) => Some(ConstArg::float(d, *i as f64)),
            (ast::GenericKind::FloatValue(d), Ev::Value(_)) => match self.typed_const(&ev) {
                Some(crate::types::Scalar::Float(f, t)) if t == d => Some(ConstArg::float(d, f)),
                _ => {
                    let desc = self.describe(&ev);
                    self.push(
                        Diagnostic::error(
                            ErrorCode::BadSpecialization,
                            e.span,
                            format!(
                                "compile-time parameter `{}` needs a `{d}` constant, got {desc}",
                                g.name.name
                            ),
                        )
                        .with_secondary(g.kind_span, "kind declared here"),
                    );
                    None
                }
            },
            (ast::GenericKind::Float | ast::GenericKind::DType, Ev::Float(_) | Ev::Int(_)) => {
                let kind = if g.kind == ast::GenericKind::Float {
                    "float"
                } else {
                    "dtype"
                };
                self.push(
                    Diagnostic::error(
                        ErrorCode::BadSpecialization,
                        e.span,
                        format!(
                            "`{}: {kind}` declares a dtype, but its default is a number",
                            g.name.name
                        ),
                    )
                    .with_label_message("a number, not a dtype")
                    .with_secondary(
                        g.kind_span,
                        if kind == "float" {
                            "`float` is a kind of dtype: f16, bf16 or f32"
                        } else {
                            "`dtype` is the kind of a dtype"
                        },
                    )
                    .with_note(dtype_kind_help(&g.name.name, g.kind)),
                );
                None
            }
            _ => self.const_arg(ev, e),
        }
    }

    /// Reports `name` defined a second time.
    fn redefinition(&mut self, name: &ast::Ident, prev: crate::span::Span) {
        self.push(
            Diagnostic::error(
                ErrorCode::Redefinition,
                name.span,
                format!("`{}` is defined twice", name.name),
            )
            .with_label_message("redefined here")
            .with_secondary(prev, "previous definition here"),
        );
    }

    /// Resolves a dtype name (builtin or dtype generic); reports anything else.
    pub(crate) fn dtype_of(&mut self, id: &ast::Ident) -> Option<DType> {
        if let Some(d) = DType::from_name(&id.name) {
            return Some(d);
        }
        if let Some(b) = self.lookup(&id.name) {
            let what = match b {
                Binding::Generic {
                    value: ConstArg::DType(d),
                    ..
                } => return Some(*d),
                Binding::Var {
                    value: Ev::DType(d),
                    ..
                } => return Some(*d),
                Binding::Generic { value, .. } => format!("the compile-time value `{value}`"),
                Binding::Tensor { .. } => "a tensor".to_string(),
                Binding::Var { .. } => "a variable".to_string(),
            };
            let def = binding_span(b);
            self.push(
                Diagnostic::error(
                    ErrorCode::WrongKind,
                    id.span,
                    format!("expected a dtype, but `{}` is {what}", id.name),
                )
                .with_label_message("not a dtype")
                .with_secondary(def, "defined here"),
            );
            return None;
        }
        if self.poisoned.contains(&id.name) {
            return None;
        }
        let known = "bool, i32, u32, i64, f16, bf16, f32";
        self.push(
            Diagnostic::error(
                ErrorCode::UndefinedName,
                id.span,
                format!("unknown dtype `{}`", id.name),
            )
            .with_note(format!(
                "dtypes are {known}, or a `dtype`/`float` compile-time parameter"
            )),
        );
        None
    }

    /// Lowers the parameter list; returns the alignment list for the specialization.
    /// Scalars are bound first (so that a tensor extent naming one is reported as not
    /// constant rather than undefined), tensor extents are evaluated last.
    pub(crate) fn params(&mut self, kernel: &ast::Kernel) -> Vec<(String, u32)> {
        let mut aligns = Vec::new();
        let mut tensors = Vec::new();
        for p in &kernel.params {
            if let Some(prev) = self.scopes.first().and_then(|s| s.get(&p.name.name)) {
                let prev_span = binding_span(prev);
                self.redefinition(&p.name, prev_span);
                continue;
            }
            let index = self.func.params.len() as u32;
            match &p.ty {
                ast::ParamType::Scalar(d) => {
                    let Some(dtype) = self.dtype_of(d) else {
                        self.poisoned.insert(p.name.name.clone());
                        continue;
                    };
                    self.func.params.push(ir::Param {
                        name: p.name.name.clone(),
                        kind: ParamKind::Scalar(dtype),
                    });
                    let v = self.emit1(
                        Op::ScalarParam(index),
                        ValueType::Scalar(dtype),
                        p.name.span,
                    );
                    if let Ev::Value(x) = v {
                        self.name_value(x, &p.name.name);
                    }
                    self.bind(
                        &p.name.name,
                        Binding::Var {
                            value: v,
                            mutable: false,
                            span: p.name.span,
                        },
                    );
                }
                ast::ParamType::Tensor(t) => {
                    let Some(dtype) = self.dtype_of(&t.elem) else {
                        self.poisoned.insert(p.name.name.clone());
                        continue;
                    };
                    let requested = self
                        .opts
                        .tensor_align
                        .iter()
                        .rev()
                        .find(|(n, _)| n == &p.name.name)
                        .map_or(DEFAULT_ALIGN, |(_, a)| *a);
                    let align = tensor_align(dtype, t.contiguous, requested);
                    aligns.push((p.name.name.clone(), align));
                    self.func.params.push(ir::Param {
                        name: p.name.name.clone(),
                        kind: ParamKind::Tensor(TensorParam {
                            dtype,
                            dims: Vec::new(),
                            contiguous: t.contiguous,
                            align_bytes: align,
                        }),
                    });
                    self.bind(
                        &p.name.name,
                        Binding::Tensor {
                            index,
                            span: p.name.span,
                        },
                    );
                    tensors.push((index, t));
                }
            }
        }
        for (index, t) in tensors {
            let dims = self.tensor_dims(t);
            if let Some(ir::Param {
                kind: ParamKind::Tensor(tp),
                ..
            }) = self.func.params.get_mut(index as usize)
            {
                tp.dims = dims;
            }
        }
        aligns
    }

    /// The extents of a tensor type: `None` for runtime ones. On an error, a rank-1
    /// placeholder (the error stops compilation before the body is lowered).
    fn tensor_dims(&mut self, t: &ast::TensorType) -> Vec<Option<u32>> {
        match &t.dims {
            ast::TensorDims::Rank(r, sp) => {
                if *r == 0 || *r as usize > MAX_TENSOR_RANK {
                    self.error(
                        ErrorCode::BadTileShape,
                        *sp,
                        format!("tensor rank {r} is outside 1..={MAX_TENSOR_RANK}"),
                    );
                    return vec![None];
                }
                vec![None; *r as usize]
            }
            ast::TensorDims::List(list) => {
                if list.is_empty() || list.len() > MAX_TENSOR_RANK {
                    self.error(
                        ErrorCode::BadTileShape,
                        t.span,
                        format!(
                            "tensor rank {} is outside 1..={MAX_TENSOR_RANK}",
                            list.len()
                        ),
                    );
                    return vec![None];
                }
                let mut dims = Vec::new();
                for d in list {
                    match d {
                        ast::DimSpec::Dynamic(_) => dims.push(None),
                        ast::DimSpec::Const(e) => match self.const_eval(e) {
                            Some(ConstArg::Int(n)) if (1..=i32::MAX as i64).contains(&n) => {
                                dims.push(Some(n as u32))
                            }
                            Some(other) => {
                                self.error(
                                    ErrorCode::BadTileShape,
                                    e.span,
                                    format!(
                                        "a constant tensor extent must be an integer from 1 to {}, got `{other}`",
                                        i32::MAX
                                    ),
                                );
                                dims.push(None);
                            }
                            None => dims.push(None),
                        },
                    }
                }
                dims
            }
        }
    }
}

/// The alignment a specialization assumes for a tensor: the requested value rounded
/// down to a power of two and clamped between the element size and 16 bytes. Only a
/// contiguous tensor can have vector accesses, so any other assumes its element size.
pub(crate) fn tensor_align(dtype: DType, contiguous: bool, requested: u32) -> u32 {
    let elem = dtype.size_bytes();
    if !contiguous {
        return elem;
    }
    let pow2 = match requested {
        0 => elem,
        r => 1u32 << (31 - r.leading_zeros()),
    };
    pow2.clamp(elem, 16)
}

/// The help for a number given to a dtype parameter.
fn dtype_kind_help(name: &str, kind: ast::GenericKind) -> String {
    let what = if kind == ast::GenericKind::Float {
        "`float` means a dtype"
    } else {
        "`dtype` means a dtype"
    };
    format!(
        "help: {what}; for a compile-time float value, give its dtype instead: `{name}: f32 = 1e-5` (f16, bf16 or f32)"
    )
}

/// Parses a `-D NAME=VALUE` value for a float generic of dtype `d`: a decimal or integer
/// number, `inf`, `-inf` or `nan`, rounded to `d`.
pub(crate) fn parse_float_define(text: &str, d: DType) -> Option<ConstArg> {
    let t = text.trim().replace('_', "");
    if t.is_empty() || t.starts_with('+') {
        return None;
    }
    // f32 directly (one rounding from the decimal); f16/bf16 through f64.
    if d == DType::F32 {
        let v: f32 = t.parse().ok()?;
        return Some(ConstArg::float(d, v as f64));
    }
    let v: f64 = t.parse().ok()?;
    Some(ConstArg::float(d, v))
}

/// Parses a `-D NAME=VALUE` value: an integer (decimal or `0x` hex, `_` separators,
/// optionally negative), `true`/`false`, or a dtype name.
pub(crate) fn parse_define(text: &str) -> Option<ConstArg> {
    let t = text.trim();
    if let Some(d) = DType::from_name(t) {
        return Some(ConstArg::DType(d));
    }
    match t {
        "true" => return Some(ConstArg::Bool(true)),
        "false" => return Some(ConstArg::Bool(false)),
        _ => {}
    }
    let (neg, digits) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let digits = digits.replace('_', "");
    if digits.is_empty() || digits.starts_with(['+', '-']) {
        return None;
    }
    let v: i128 = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        i128::from_str_radix(hex, 16).ok()?
    } else {
        digits.parse::<i128>().ok()?
    };
    let v = if neg { -v } else { v };
    i64::try_from(v).ok().map(ConstArg::Int)
}
