//! Statements: `let`, assignment, `for`, `if`, `static_assert`, expression statements.
//!
//! Assumes: the kernel's parameters and generics are bound in outer scopes.
//! Guarantees: `let mut` variables become SSA values; a loop carries exactly the outer
//! mutable variables its body assigns (block arguments in, `Yield` out, results after),
//! and an `if` yields the variables either branch assigns. A variable's type never
//! changes (an assignment of another type is an error; constants and scalars are
//! converted/splatted to it).

use super::{binding_span, Binding, Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast::{self, Stmt};
use crate::ir::{Block, Op, ValueId};
use crate::span::Span;
use crate::types::{DType, ValueType};

impl Checker<'_> {
    pub(crate) fn lower_block_stmts(&mut self, block: &ast::Block) {
        for s in &block.stmts {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Let {
                name,
                mutable,
                ty,
                value,
                span,
            } => {
                let v = self.expr(value);
                let v = match ty {
                    Some(d) => match self.dtype_of(d) {
                        Some(d) => self.annotate(v, d, value.span),
                        None => Ev::Poison,
                    },
                    None => v,
                };
                let v = if *mutable {
                    // A mutable variable needs a concrete type from the start.
                    match &v {
                        Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) => {
                            let d = Self::default_dtype(&v).unwrap_or(DType::I32);
                            self.materialize(&v, d, value.span)
                                .map_or(Ev::Poison, Ev::Value)
                        }
                        Ev::Value(_) | Ev::Poison => v,
                        other => {
                            let desc = self.describe(other);
                            self.error(ErrorCode::WrongKind, value.span, format!("a mutable variable must hold a scalar or tile value, found {desc}"))
                        }
                    }
                } else {
                    v
                };
                let _ = span;
                self.bind(
                    &name.name,
                    Binding::Var {
                        value: v,
                        mutable: *mutable,
                        span: name.span,
                    },
                );
            }
            Stmt::Assign {
                target,
                op,
                value,
                span,
            } => self.assign(target, *op, value, *span),
            Stmt::Expr(e) => {
                let _ = self.expr(e);
            }
            Stmt::For {
                var,
                start,
                end,
                step,
                body,
                span,
            } => self.for_loop(var, start, end, step.as_ref(), body, *span),
            Stmt::If {
                cond,
                then_block,
                else_block,
                span,
            } => self.if_stmt(cond, then_block, else_block.as_ref(), *span),
            Stmt::StaticAssert {
                cond,
                message,
                span,
            } => {
                let v = self.expr(cond);
                match v {
                    Ev::Bool(true) | Ev::Poison => {}
                    Ev::Bool(false) => {
                        let msg = message
                            .clone()
                            .unwrap_or_else(|| "static assertion failed".to_string());
                        self.push(
                            Diagnostic::error(
                                ErrorCode::StaticAssert,
                                cond.span,
                                format!("static_assert failed: {msg}"),
                            )
                            .with_label_message("this is false"),
                        );
                    }
                    Ev::Value(_) => {
                        self.push(
                            Diagnostic::error(
                                ErrorCode::NotConstant,
                                cond.span,
                                "`static_assert` needs a compile-time condition",
                            )
                            .with_label_message("this depends on runtime values"),
                        );
                    }
                    other => {
                        let desc = self.describe(&other);
                        self.error(
                            ErrorCode::TypeMismatch,
                            *span,
                            format!("`static_assert` needs a bool, found {desc}"),
                        );
                    }
                }
            }
        }
    }

    /// Applies a `let x: D = ...` annotation.
    fn annotate(&mut self, v: Ev, d: DType, span: Span) -> Ev {
        match &v {
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) => match self.materialize(&v, d, span) {
                Some(x) => Ev::Value(x),
                None => {
                    let desc = self.describe(&v);
                    self.error(
                        ErrorCode::TypeMismatch,
                        span,
                        format!("{desc} cannot be a `{d}`"),
                    )
                }
            },
            Ev::Value(x) => {
                let t = self.ty(*x);
                if t.dtype() == d {
                    v
                } else {
                    self.push(
                        Diagnostic::error(
                            ErrorCode::TypeMismatch,
                            span,
                            format!("expected `{d}`, found `{t}`"),
                        )
                        .with_note(format!("help: convert explicitly: `(...) as {d}`")),
                    )
                }
            }
            _ => v,
        }
    }

    /// Index of the scope holding `name`, innermost first.
    fn scope_of(&self, name: &str) -> Option<usize> {
        (0..self.scopes.len())
            .rev()
            .find(|i| self.scopes[*i].contains_key(name))
    }

    fn set_var(&mut self, name: &str, value: Ev) {
        if let Some(i) = self.scope_of(name) {
            if let Some(Binding::Var { value: v, .. }) = self.scopes[i].get_mut(name) {
                *v = value;
            }
        }
    }

    fn assign(
        &mut self,
        target: &ast::Ident,
        op: Option<ast::BinOp>,
        value: &ast::Expr,
        span: Span,
    ) {
        let Some(b) = self.lookup(&target.name).cloned() else {
            let _ = self.expr(value);
            self.error(
                ErrorCode::UndefinedName,
                target.span,
                format!("cannot assign to `{}`: it is not defined", target.name),
            );
            return;
        };
        let (cur, def_span) = match b {
            Binding::Var {
                value,
                mutable: true,
                span,
            } => (value, span),
            other => {
                let _ = self.expr(value);
                let sp = binding_span(&other);
                let (msg, help) = match other {
                    Binding::Var { .. } => (
                        format!(
                            "cannot assign twice to immutable variable `{}`",
                            target.name
                        ),
                        format!("help: declare it mutable: `let mut {}`", target.name),
                    ),
                    _ => (
                        format!(
                            "cannot assign to `{}`: parameters are immutable",
                            target.name
                        ),
                        "help: copy it into a `let mut` variable".to_string(),
                    ),
                };
                self.push(
                    Diagnostic::error(ErrorCode::ImmutableAssign, target.span, msg)
                        .with_label_message("assigned here")
                        .with_secondary(sp, "defined here")
                        .with_note(help),
                );
                return;
            }
        };
        let rhs = self.expr(value);
        let new = match op {
            Some(op) => self.binary(op, cur.clone(), target.span, rhs, value.span, span),
            None => rhs,
        };
        let Ev::Value(curv) = cur else { return };
        let want = self.ty(curv);
        let converted = match &new {
            Ev::Poison => return,
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) => self.coerce_to(&new, &want, value.span),
            Ev::Value(v) => {
                let t = self.ty(*v);
                if t == want {
                    Some(*v)
                } else if t.shape().is_none() && t.dtype() == want.dtype() {
                    self.broadcast_to(*v, want.shape(), value.span)
                } else {
                    None
                }
            }
            _ => None,
        };
        match converted {
            Some(v) => self.set_var(&target.name, Ev::Value(v)),
            None => {
                let got = self.describe(&new);
                self.push(
                    Diagnostic::error(
                        ErrorCode::TypeMismatch,
                        value.span,
                        format!("`{}` has type `{want}`, but this is {got}", target.name),
                    )
                    .with_label_message(format!("expected `{want}`"))
                    .with_secondary(def_span, "variable defined here")
                    .with_note(
                        "a variable keeps its dtype and shape; assign a value of the same type",
                    ),
                );
            }
        }
    }

    /// Mutable outer variables (holding values) that `block` assigns, in first-assignment order.
    fn carried(&self, blocks: &[&ast::Block]) -> Vec<(String, ValueId)> {
        let mut names = Vec::new();
        for b in blocks {
            assigned_names(b, &mut names);
        }
        let mut out = Vec::new();
        for n in names {
            if out.iter().any(|(m, _)| m == &n) {
                continue;
            }
            if let Some(Binding::Var {
                value: Ev::Value(v),
                mutable: true,
                ..
            }) = self.lookup(&n)
            {
                out.push((n, *v));
            }
        }
        out
    }

    fn scalar_i32(&mut self, e: &ast::Expr, what: &str) -> Option<ValueId> {
        let v = self.expr(e);
        match &v {
            Ev::Int(_) => self.materialize(&v, DType::I32, e.span),
            Ev::Value(x) if self.ty(*x) == ValueType::Scalar(DType::I32) => Some(*x),
            Ev::Poison => None,
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::BadControlFlow,
                    e.span,
                    format!("the loop {what} must be an i32 scalar, found {desc}"),
                );
                None
            }
        }
    }

    fn for_loop(
        &mut self,
        var: &ast::Ident,
        start: &ast::Expr,
        end: &ast::Expr,
        step: Option<&ast::Expr>,
        body: &ast::Block,
        span: Span,
    ) {
        let lower = self.scalar_i32(start, "start");
        let upper = self.scalar_i32(end, "end");
        let step_v = match step {
            None => Some(1),
            Some(e) => match self.expr(e) {
                Ev::Int(i) if i > 0 && i <= i32::MAX as i128 => Some(i as i64),
                Ev::Poison => None,
                Ev::Int(i) => {
                    self.error(
                        ErrorCode::BadControlFlow,
                        e.span,
                        format!("the loop step must be positive, found {i}"),
                    );
                    None
                }
                _ => {
                    self.push(
                        Diagnostic::error(
                            ErrorCode::BadControlFlow,
                            e.span,
                            "the loop step must be a positive compile-time constant",
                        )
                        .with_label_message("not a constant"),
                    );
                    None
                }
            },
        };
        let (Some(lower), Some(upper), Some(step_v)) = (lower, upper, step_v) else {
            // Still check the body, for its own errors.
            self.scopes.push(Default::default());
            self.lower_block_stmts_detached(body);
            self.scopes.pop();
            return;
        };
        let Some(step) = self.materialize(&Ev::Int(step_v as i128), DType::I32, span) else {
            return;
        };
        let carried = self.carried(&[body]);
        let iv = self.func.values.append(crate::ir::Value {
            ty: ValueType::Scalar(DType::I32),
            name: Some(var.name.clone()),
        });
        let mut args = vec![iv];
        for (n, v) in &carried {
            let ty = self.ty(*v);
            let a = self.func.values.append(crate::ir::Value {
                ty,
                name: Some(n.clone()),
            });
            args.push(a);
            self.set_var(n, Ev::Value(a));
        }
        self.blocks.push(Block {
            args: args.clone(),
            insts: Vec::new(),
        });
        self.scopes.push(Default::default());
        self.bind(
            &var.name,
            Binding::Var {
                value: Ev::Value(iv),
                mutable: false,
                span: var.span,
            },
        );
        self.lower_block_stmts(body);
        self.scopes.pop();
        let yields: Vec<ValueId> = carried
            .iter()
            .zip(&args[1..])
            .map(|((n, _), a)| match self.lookup(n) {
                Some(Binding::Var {
                    value: Ev::Value(v),
                    ..
                }) => *v,
                _ => *a,
            })
            .collect();
        self.emit(Op::Yield(yields), vec![], span);
        let body_block = self.blocks.pop().unwrap_or_default();
        let inits: Vec<ValueId> = carried.iter().map(|(_, v)| *v).collect();
        let types: Vec<ValueType> = inits.iter().map(|v| self.ty(*v)).collect();
        let results = self.emit(
            Op::For {
                lower,
                upper,
                step,
                inits,
                body: body_block,
            },
            types,
            span,
        );
        for ((n, _), r) in carried.iter().zip(results) {
            self.set_var(n, Ev::Value(r));
        }
    }

    /// Checks statements for errors without keeping their IR (used after an error in a
    /// loop header, so the body's own errors are still reported).
    fn lower_block_stmts_detached(&mut self, body: &ast::Block) {
        self.blocks.push(Block::default());
        let saved: Vec<_> = self.scopes.clone();
        self.lower_block_stmts(body);
        self.scopes = saved;
        let _ = self.blocks.pop();
    }

    fn if_stmt(
        &mut self,
        cond: &ast::Expr,
        then_block: &ast::Block,
        else_block: Option<&ast::Block>,
        span: Span,
    ) {
        let c = self.expr(cond);
        let c = match c {
            Ev::Bool(b) => {
                // A compile-time condition: only the taken branch exists.
                let taken = if b { Some(then_block) } else { else_block };
                if let Some(blk) = taken {
                    self.scopes.push(Default::default());
                    self.lower_block_stmts(blk);
                    self.scopes.pop();
                }
                return;
            }
            Ev::Value(v) if self.ty(v) == ValueType::Scalar(DType::Bool) => v,
            Ev::Poison => return,
            Ev::Value(v) => {
                let t = self.ty(v);
                let mut d = Diagnostic::error(
                    ErrorCode::BadControlFlow,
                    cond.span,
                    format!("an `if` condition must be a scalar `bool`, found `{t}`"),
                )
                .with_label_message("not a scalar bool");
                if t.shape().is_some() {
                    d = d.with_note("help: choose per element with `where(cond, a, b)`, or reduce the condition first");
                }
                self.push(d);
                return;
            }
            other => {
                let desc = self.describe(&other);
                self.error(
                    ErrorCode::BadControlFlow,
                    cond.span,
                    format!("an `if` condition must be a scalar `bool`, found {desc}"),
                );
                return;
            }
        };
        let mut branches: Vec<&ast::Block> = vec![then_block];
        if let Some(e) = else_block {
            branches.push(e);
        }
        let carried = self.carried(&branches);
        let mut bodies = Vec::new();
        for blk in [Some(then_block), else_block] {
            self.blocks.push(Block::default());
            if let Some(blk) = blk {
                self.scopes.push(Default::default());
                self.lower_block_stmts(blk);
                self.scopes.pop();
            }
            let yields: Vec<ValueId> = carried
                .iter()
                .map(|(n, init)| match self.lookup(n) {
                    Some(Binding::Var {
                        value: Ev::Value(v),
                        ..
                    }) => *v,
                    _ => *init,
                })
                .collect();
            self.emit(Op::Yield(yields), vec![], span);
            bodies.push(self.blocks.pop().unwrap_or_default());
            for (n, init) in &carried {
                self.set_var(n, Ev::Value(*init));
            }
        }
        let else_body = bodies.pop().unwrap_or_default();
        let then_body = bodies.pop().unwrap_or_default();
        let types: Vec<ValueType> = carried.iter().map(|(_, v)| self.ty(*v)).collect();
        let results = self.emit(
            Op::If {
                cond: c,
                then_body,
                else_body,
            },
            types,
            span,
        );
        for ((n, _), r) in carried.iter().zip(results) {
            self.set_var(n, Ev::Value(r));
        }
    }
}

/// Names assigned anywhere in a block (nested blocks included).
fn assigned_names(b: &ast::Block, out: &mut Vec<String>) {
    for s in &b.stmts {
        match s {
            Stmt::Assign { target, .. } => out.push(target.name.clone()),
            Stmt::For { body, .. } => assigned_names(body, out),
            Stmt::If {
                then_block,
                else_block,
                ..
            } => {
                assigned_names(then_block, out);
                if let Some(e) = else_block {
                    assigned_names(e, out);
                }
            }
            _ => {}
        }
    }
}
