//! The checker: resolves names and generics, evaluates constants, checks dtypes and
//! shapes (numpy broadcasting) and lowers the AST of one kernel to tile IR.
//!
//! Assumes: an AST from either front end (spans inside the source text).
//! Guarantees: on `Ok`, IR that satisfies every invariant in `ir/mod.rs` (broadcasting
//! and literal dtypes made explicit, regions yield their results); on `Err`, every
//! independent error found, each located. Never panics: failed expressions become
//! [`Ev::Poison`], which silences follow-on errors.
//!
//! Files: `mod.rs` (kernel selection, specialization, parameters), `expr.rs`
//! (expressions, literals, broadcasting), `builtins.rs` (calls), `stmt.rs` (statements,
//! SSA for `let mut`, loops and ifs).

mod builtins;
mod expr;
mod stmt;
#[cfg(test)]
mod tests;

use crate::abi::{ConstArg, Specialization};
use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::front::ast;
use crate::ir::{self, Block, Function, InstId, Op, ParamKind, TensorParam, ValueId};
use crate::pipeline::CompileOptions;
use crate::span::Span;
use crate::types::{DType, Scalar, ValueType, MAX_TENSOR_RANK};
use std::collections::HashMap;

/// The value of an expression during checking.
#[derive(Clone, Debug)]
pub(crate) enum Ev {
    /// A typed IR value.
    Value(ValueId),
    /// An untyped integer constant (literal or compile-time `int`); adapts to context.
    Int(i128),
    /// An untyped float constant; adapts to float context.
    Float(f64),
    /// A constant bool.
    Bool(bool),
    /// A dtype used as an argument (`zeros([4], f32)`).
    DType(DType),
    /// A tensor parameter (index into `Function::params`).
    Tensor(u32),
    /// `[a, b, c]`
    List(Vec<(Ev, Span)>),
    /// The result of an erroneous expression: reported once, silent afterwards.
    Poison,
}

/// A name in scope.
#[derive(Clone, Debug)]
pub(crate) enum Binding {
    Var {
        value: Ev,
        mutable: bool,
        span: Span,
    },
    Tensor {
        index: u32,
        span: Span,
    },
    Generic {
        value: ConstArg,
        span: Span,
    },
}

pub(crate) struct Checker<'a> {
    pub func: Function,
    pub errors: Vec<Diagnostic>,
    pub scopes: Vec<HashMap<String, Binding>>,
    /// The blocks being filled, innermost last.
    pub blocks: Vec<Block>,
    pub opts: &'a CompileOptions,
    /// Largest tile seen, for the warp heuristic.
    pub max_tile: u64,
    /// Generics whose value was rejected: their uses are not reported again.
    pub poisoned: std::collections::HashSet<String>,
}

/// Checks one kernel of `module` (chosen by `opts.kernel`) under the compile-time values
/// in `opts`, and lowers it to IR. Reports every independent error it finds.
pub fn lower_kernel(
    module: &ast::Module,
    opts: &CompileOptions,
) -> Result<(ir::Function, Specialization), Diagnostics> {
    let kernel = match &opts.kernel {
        Some(name) => module.kernels.iter().find(|k| &k.name.name == name),
        None => module.kernels.first(),
    };
    let Some(kernel) = kernel else {
        let names: Vec<&str> = module
            .kernels
            .iter()
            .map(|k| k.name.name.as_str())
            .collect();
        let msg = match &opts.kernel {
            Some(n) => format!("no kernel named `{n}` in this file"),
            None => "this file defines no kernel".to_string(),
        };
        let mut d = Diagnostic::unlocated(ErrorCode::NoSuchKernel, msg);
        if !names.is_empty() {
            d = d.with_note(format!("kernels in this file: {}", names.join(", ")));
        }
        return Err(Diagnostics::single(d));
    };
    let mut c = Checker {
        func: Function::new(kernel.name.name.clone(), kernel.name.name.clone()),
        errors: Vec::new(),
        scopes: vec![HashMap::new()],
        blocks: vec![Block::default()],
        opts,
        max_tile: 1,
        poisoned: Default::default(),
    };
    let consts = c.specialize(kernel);
    let tensor_align = c.params(kernel);
    if c.errors.is_empty() {
        c.scopes.push(HashMap::new());
        c.lower_block_stmts(&kernel.body);
        c.scopes.pop();
    }
    if !c.errors.is_empty() {
        return Err(Diagnostics(c.errors));
    }
    let num_warps = match opts.num_warps {
        Some(w) if w == 0 || w > 32 || !w.is_power_of_two() => {
            return Err(Diagnostics::single(Diagnostic::unlocated(
                ErrorCode::BadSpecialization,
                format!("--warps {w}: the warp count must be a power of two from 1 to 32"),
            )))
        }
        Some(w) => w,
        None => default_warps(c.max_tile),
    };
    let spec = Specialization {
        kernel: kernel.name.name.clone(),
        consts,
        num_warps,
        tensor_align,
    };
    c.func.name = spec.entry_name();
    c.func.body = c.blocks.pop().unwrap_or_default();
    Ok((c.func, spec))
}

/// Warps from the largest tile: about 8 elements per thread, 1 to 16 warps.
fn default_warps(max_tile: u64) -> u32 {
    let w = (max_tile / 256).clamp(1, 16) as u32;
    if w.is_power_of_two() {
        w
    } else {
        w.next_power_of_two() / 2
    }
}

impl Checker<'_> {
    pub(crate) fn error(&mut self, code: ErrorCode, span: Span, msg: impl Into<String>) -> Ev {
        self.errors.push(Diagnostic::error(code, span, msg));
        Ev::Poison
    }

    pub(crate) fn push(&mut self, d: Diagnostic) -> Ev {
        self.errors.push(d);
        Ev::Poison
    }

    /// Appends an instruction to the current block; returns its results.
    pub(crate) fn emit(&mut self, op: Op, types: Vec<ValueType>, span: Span) -> Vec<ValueId> {
        if let Some(ValueType::Tile(_, s)) = types.first() {
            self.max_tile = self.max_tile.max(s.num_elements());
        }
        let results: Vec<ValueId> = types
            .into_iter()
            .map(|ty| self.func.values.append(ir::Value { ty, name: None }))
            .collect();
        let id: InstId = self.func.insts.append(ir::Inst {
            op,
            results: results.clone(),
            span,
        });
        if let Some(b) = self.blocks.last_mut() {
            b.insts.push(id);
        }
        results
    }

    /// Emits a one-result instruction.
    pub(crate) fn emit1(&mut self, op: Op, ty: ValueType, span: Span) -> Ev {
        match self.emit(op, vec![ty], span).first() {
            Some(v) => Ev::Value(*v),
            None => Ev::Poison,
        }
    }

    pub(crate) fn ty(&self, v: ValueId) -> ValueType {
        self.func.values[v].ty.clone()
    }

    pub(crate) fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name))
    }

    pub(crate) fn bind(&mut self, name: &str, b: Binding) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name.to_string(), b);
        }
    }

    /// Every name visible now (for "did you mean" suggestions).
    pub(crate) fn visible_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.scopes.iter().flat_map(|s| s.keys().cloned()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Resolves generics from `-D` values and defaults; binds them; returns the
    /// specialization's constant list in declaration order.
    fn specialize(&mut self, kernel: &ast::Kernel) -> Vec<(String, ConstArg)> {
        let mut out = Vec::new();
        for (name, _) in &self.opts.defines {
            if !kernel.generics.iter().any(|g| &g.name.name == name) {
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
        }
        for g in &kernel.generics {
            if let Some(prev) = self.scopes[0].get(&g.name.name) {
                let prev_span = binding_span(prev);
                self.push(
                    Diagnostic::error(
                        ErrorCode::Redefinition,
                        g.name.span,
                        format!("`{}` is defined twice", g.name.name),
                    )
                    .with_label_message("redefined here")
                    .with_secondary(prev_span, "previous definition here"),
                );
                continue;
            }
            let value = match self
                .opts
                .defines
                .iter()
                .rev()
                .find(|(n, _)| n == &g.name.name)
            {
                Some((_, text)) => parse_define(text),
                None => match &g.default {
                    Some(e) => match self.const_eval(e) {
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
                (kind, v) => {
                    let got = v.map_or("an unreadable value".to_string(), |v| format!("`{v}`"));
                    let want = match kind {
                        ast::GenericKind::Int => "an integer",
                        ast::GenericKind::Bool => "`true` or `false`",
                        ast::GenericKind::DType => "a dtype",
                        ast::GenericKind::Float => "a float dtype (f16, bf16 or f32)",
                    };
                    let at = g.default.as_ref().map_or(g.name.span, |e| e.span);
                    self.push(
                        Diagnostic::error(
                            ErrorCode::BadSpecialization,
                            at,
                            format!(
                                "compile-time parameter `{}` needs {want}, got {got}",
                                g.name.name
                            ),
                        )
                        .with_secondary(g.kind_span, "kind declared here"),
                    );
                    self.poisoned.insert(g.name.name.clone());
                    continue;
                }
            };
            self.scopes[0].insert(
                g.name.name.clone(),
                Binding::Generic {
                    value: value.clone(),
                    span: g.name.span,
                },
            );
            out.push((g.name.name.clone(), value));
        }
        out
    }

    /// Resolves a dtype name (builtin or dtype generic).
    pub(crate) fn dtype_of(&mut self, id: &ast::Ident) -> Option<DType> {
        if let Some(d) = DType::from_name(&id.name) {
            return Some(d);
        }
        match self.lookup(&id.name) {
            Some(Binding::Generic {
                value: ConstArg::DType(d),
                ..
            }) => Some(*d),
            _ if self.poisoned.contains(&id.name) => None,
            _ => {
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
        }
    }

    /// Lowers the parameter list; returns the alignment list for the specialization.
    fn params(&mut self, kernel: &ast::Kernel) -> Vec<(String, u32)> {
        let mut aligns = Vec::new();
        let mut scalar_params = Vec::new();
        for p in &kernel.params {
            if let Some(prev) = self.lookup(&p.name.name) {
                let prev_span = binding_span(prev);
                self.push(
                    Diagnostic::error(
                        ErrorCode::Redefinition,
                        p.name.span,
                        format!("`{}` is defined twice", p.name.name),
                    )
                    .with_label_message("redefined here")
                    .with_secondary(prev_span, "previous definition here"),
                );
                continue;
            }
            let index = self.func.params.len() as u32;
            match &p.ty {
                ast::ParamType::Scalar(d) => {
                    let Some(dtype) = self.dtype_of(d) else {
                        continue;
                    };
                    self.func.params.push(ir::Param {
                        name: p.name.name.clone(),
                        kind: ParamKind::Scalar(dtype),
                    });
                    scalar_params.push((p.name.name.clone(), index, dtype, p.name.span));
                }
                ast::ParamType::Tensor(t) => {
                    let Some(dtype) = self.dtype_of(&t.elem) else {
                        continue;
                    };
                    let dims = match &t.dims {
                        ast::TensorDims::Rank(r, sp) => {
                            if *r == 0 || *r as usize > MAX_TENSOR_RANK {
                                self.error(
                                    ErrorCode::BadTileShape,
                                    *sp,
                                    format!("tensor rank {r} is outside 1..={MAX_TENSOR_RANK}"),
                                );
                                continue;
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
                                continue;
                            }
                            let mut dims = Vec::new();
                            for d in list {
                                match d {
                                    ast::DimSpec::Dynamic(_) => dims.push(None),
                                    ast::DimSpec::Const(e) => match self.const_eval(e) {
                                        Some(ConstArg::Int(n))
                                            if (1..=i32::MAX as i64).contains(&n) =>
                                        {
                                            dims.push(Some(n as u32))
                                        }
                                        Some(other) => {
                                            self.error(ErrorCode::BadTileShape, e.span, format!("a constant tensor extent must be a positive integer, got `{other}`"));
                                            dims.push(None);
                                        }
                                        None => dims.push(None),
                                    },
                                }
                            }
                            dims
                        }
                    };
                    let requested = self
                        .opts
                        .tensor_align
                        .iter()
                        .rev()
                        .find(|(n, _)| n == &p.name.name)
                        .map_or(16, |(_, a)| *a);
                    let align = if t.contiguous {
                        requested
                            .clamp(dtype.size_bytes(), 16)
                            .next_power_of_two()
                            .min(16)
                    } else {
                        dtype.size_bytes()
                    };
                    aligns.push((p.name.name.clone(), align));
                    self.func.params.push(ir::Param {
                        name: p.name.name.clone(),
                        kind: ParamKind::Tensor(TensorParam {
                            dtype,
                            dims,
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
                }
            }
        }
        for (name, index, dtype, span) in scalar_params {
            let v = self.emit1(Op::ScalarParam(index), ValueType::Scalar(dtype), span);
            self.bind(
                &name,
                Binding::Var {
                    value: v,
                    mutable: false,
                    span,
                },
            );
        }
        aligns
    }

    /// Evaluates a compile-time constant expression (generic defaults, tensor extents).
    pub(crate) fn const_eval(&mut self, e: &ast::Expr) -> Option<ConstArg> {
        let before = self.func.insts.len();
        let ev = self.expr(e);
        let emitted = self.func.insts.len() != before;
        match ev {
            Ev::Int(i) => match i64::try_from(i) {
                Ok(v) => Some(ConstArg::Int(v)),
                Err(_) => {
                    self.error(
                        ErrorCode::ConstEval,
                        e.span,
                        "constant does not fit in 64 bits",
                    );
                    None
                }
            },
            Ev::Bool(b) => Some(ConstArg::Bool(b)),
            Ev::DType(d) => Some(ConstArg::DType(d)),
            Ev::Poison => None,
            _ => {
                let _ = emitted;
                self.error(
                    ErrorCode::NotConstant,
                    e.span,
                    "this must be a compile-time constant",
                );
                None
            }
        }
    }
}

pub(crate) fn binding_span(b: &Binding) -> Span {
    match b {
        Binding::Var { span, .. }
        | Binding::Tensor { span, .. }
        | Binding::Generic { span, .. } => *span,
    }
}

/// Parses a `-D NAME=VALUE` value: an integer, `true`/`false`, or a dtype name.
fn parse_define(text: &str) -> Option<ConstArg> {
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
    let v = if let Some(hex) = digits.strip_prefix("0x") {
        i64::from_str_radix(hex, 16).ok()?
    } else {
        digits.parse::<i64>().ok()?
    };
    Some(ConstArg::Int(if neg { v.checked_neg()? } else { v }))
}

/// A constant scalar of `dtype` from an untyped constant.
pub(crate) fn scalar_const(dtype: DType, ev: &Ev) -> Option<Scalar> {
    Some(match (ev, dtype) {
        (Ev::Bool(b), DType::Bool) => Scalar::Bool(*b),
        (Ev::Int(i), d) if d.is_int() => Scalar::Int(wrap_int(*i, d), d),
        (Ev::Int(i), d) if d.is_float() => crate::host::scalar_from_f64(d, *i as f64),
        (Ev::Float(f), d) if d.is_float() => crate::host::scalar_from_f64(d, *f),
        _ => return None,
    })
}

/// Wraps an integer to the dtype's width (kept as an i64 bit pattern, sign-extended for
/// signed types, zero-extended for u32).
pub(crate) fn wrap_int(i: i128, d: DType) -> i64 {
    match d {
        DType::I32 => i as i32 as i64,
        DType::U32 => i as u32 as i64,
        _ => i as i64,
    }
}
