//! Statements: `let` (and `let [a, b]`, binding a list's values), assignment, `for`,
//! `if`, `static_assert`, expression statements; `return` here is misplaced (a
//! function's closing `return` is `functions.rs`').
//!
//! Assumes: the kernel's parameters and generics (or, in a function's body, its
//! parameters) are bound in outer scopes.
//! Guarantees: `let mut` variables become SSA values (each assignment rebinds the name
//! to a new value); a loop carries the outer mutable variables its body assigns (block
//! arguments in, `Yield` out, results after), and an `if` yields the variables either
//! branch assigns (a missing `else` yields the incoming values). A variable's type never
//! changes (an assignment of another type is an error; constants adapt to the dtype and
//! scalars of the same dtype are splatted to a tile variable), so region types always
//! match. An `if` on a constant condition lowers only the branch taken. Loop bounds are
//! `i32` scalars and the step a positive constant (`BadControlFlow` otherwise).

use super::{binding_span, Binding, Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast::{self, Stmt};
use crate::ir::{Block, Op, ValueId};
use crate::span::Span;
use crate::types::{DType, ValueType};

impl Checker<'_> {
    pub(crate) fn lower_block_stmts(&mut self, block: &ast::Block) {
        let _ = self.nested(block.span, |c| {
            for s in &block.stmts {
                c.stmt(s);
            }
        });
    }

    /// Lowers a block in a scope of its own.
    fn scoped_block(&mut self, block: &ast::Block) {
        self.scopes.push(Default::default());
        self.lower_block_stmts(block);
        self.scopes.pop();
    }

    pub(crate) fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Let {
                name,
                mutable,
                ty,
                value,
                ..
            } => self.let_stmt(name, *mutable, ty.as_ref(), value),
            Stmt::LetList {
                names,
                mutable,
                value,
                ..
            } => self.let_list(names, *mutable, value),
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
            Stmt::StaticAssert { cond, message, .. } => {
                self.static_assert(cond, message.as_deref())
            }
            Stmt::Return { value, span } => {
                let _ = self.expr(value);
                self.misplaced_return(*span);
            }
        }
    }

    fn let_stmt(
        &mut self,
        name: &ast::Ident,
        mutable: bool,
        ty: Option<&ast::Ident>,
        value: &ast::Expr,
    ) {
        let v = self.expr(value);
        let v = match ty {
            Some(d) => match self.dtype_of(d) {
                Some(d) => self.annotate(v, d, value.span),
                None => Ev::Poison,
            },
            None => v,
        };
        self.bind_let(name, mutable, v, value.span);
    }

    /// `let [a, b] = e;`: `e` is a list of as many values (a function's `return [x, y];`),
    /// each bound as `let` binds one.
    fn let_list(&mut self, names: &[ast::Ident], mutable: bool, value: &ast::Expr) {
        let v = self.expr(value);
        let items = match v {
            Ev::List(items) if items.len() == names.len() => items,
            Ev::Poison => vec![(Ev::Poison, value.span); names.len()],
            other => {
                let desc = match &other {
                    Ev::List(items) => format!("a list of {}", items.len()),
                    o => self.describe(o),
                };
                self.push(
                    Diagnostic::error(
                        ErrorCode::WrongKind,
                        value.span,
                        format!("`let [...]` binds {} names to {desc}", names.len()),
                    )
                    .with_label_message(format!("expected a list of {}", names.len())),
                );
                vec![(Ev::Poison, value.span); names.len()]
            }
        };
        for (name, (v, span)) in names.iter().zip(items) {
            self.bind_let(name, mutable, v, span);
        }
    }

    /// Binds `name` to `v` (the value of the expression at `span`), as `let` does.
    fn bind_let(&mut self, name: &ast::Ident, mutable: bool, v: Ev, span: Span) {
        let v = match v {
            Ev::Unit => self.push(
                Diagnostic::error(
                    ErrorCode::WrongKind,
                    span,
                    format!("`{}` cannot be bound to this: it has no value", name.name),
                )
                .with_label_message("returns nothing"),
            ),
            // A mutable variable needs a concrete type from the start.
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) if mutable => {
                let d = Self::default_dtype(&v).unwrap_or(DType::I32);
                self.materialize(&v, d, span).map_or(Ev::Poison, Ev::Value)
            }
            Ev::DType(_) | Ev::Tensor(_) | Ev::Scratch(_) | Ev::List(_) if mutable => {
                let desc = self.describe(&v);
                self.error(
                    ErrorCode::WrongKind,
                    span,
                    format!("a mutable variable must hold a scalar or tile value, found {desc}"),
                )
            }
            other => other,
        };
        if let Ev::Value(x) = v {
            self.name_value(x, &name.name);
        }
        if let Ev::Scratch(b) = v {
            if let Some(buf) = self.func.scratch.get_mut(b as usize) {
                buf.name = name.name.clone();
            }
        }
        self.bind(
            &name.name,
            Binding::Var {
                value: v,
                mutable,
                span: name.span,
            },
        );
    }

    /// Applies a `let x: D = ...` annotation: constants take the dtype; values must
    /// already have it.
    fn annotate(&mut self, v: Ev, d: DType, span: Span) -> Ev {
        match &v {
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_) => {
                if super::scalar_const(d, &v).is_none() {
                    let desc = self.describe(&v);
                    return self.push(
                        Diagnostic::error(
                            ErrorCode::TypeMismatch,
                            span,
                            format!("{desc} cannot be a `{d}`"),
                        )
                        .with_label_message(format!("expected `{d}`")),
                    );
                }
                self.materialize(&v, d, span).map_or(Ev::Poison, Ev::Value)
            }
            Ev::Value(x) => {
                let t = self.ty(*x);
                if t.dtype() == d {
                    return v;
                }
                self.push(
                    Diagnostic::error(
                        ErrorCode::TypeMismatch,
                        span,
                        format!("expected `{d}`, found `{t}`"),
                    )
                    .with_label_message(format!("this is `{t}`"))
                    .with_note(format!("help: convert explicitly: `(...) as {d}`")),
                )
            }
            Ev::Poison => v,
            other => {
                let desc = self.describe(other);
                self.error(
                    ErrorCode::WrongKind,
                    span,
                    format!("a dtype annotation needs a value, found {desc}"),
                )
            }
        }
    }

    fn static_assert(&mut self, cond: &ast::Expr, message: Option<&str>) {
        match self.expr(cond) {
            Ev::Bool(true) | Ev::Poison => {}
            Ev::Bool(false) => {
                let msg = message.unwrap_or("static assertion failed");
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
                    cond.span,
                    format!("`static_assert` needs a bool, found {desc}"),
                );
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
            if self.poisoned.contains(&target.name) {
                return;
            }
            let mut d = Diagnostic::error(
                ErrorCode::UndefinedName,
                target.span,
                format!("cannot assign to `{}`: it is not defined", target.name),
            )
            .with_label_message("not found")
            .with_note(format!(
                "help: declare it first: `let mut {} = ...;`",
                target.name
            ));
            if let Some(s) = super::scope::closest(&target.name, &self.visible_names()) {
                d = d.with_note(format!("help: a binding with a similar name exists: `{s}`"));
            }
            self.push(d);
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
                let is_param = self.scope_index(&target.name) == Some(0);
                let name = &target.name;
                let (msg, help) = match other {
                    Binding::Var { .. } if !is_param => (
                        format!("cannot assign twice to immutable variable `{name}`"),
                        format!("help: declare it mutable: `let mut {name}`"),
                    ),
                    Binding::Var { .. } => (
                        format!("cannot assign to `{name}`: parameters are immutable"),
                        format!("help: copy it into a variable first: `let mut {name}2 = {name};`"),
                    ),
                    Binding::Tensor { .. } => (
                        format!("cannot assign to `{name}`: it is a tensor parameter"),
                        "help: write a tensor's elements with `store(...)` or `scatter(...)`"
                            .to_string(),
                    ),
                    Binding::Generic { .. } => (
                        format!("cannot assign to `{name}`: it is a compile-time parameter"),
                        "help: compile-time parameters are constants; use a `let mut` variable"
                            .to_string(),
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
            Ev::Int(_) | Ev::Float(_) | Ev::Bool(_)
                if super::scalar_const(want.dtype(), &new).is_some() =>
            {
                match self.coerce_to(&new, &want, value.span) {
                    Some(v) => Some(v),
                    None => return,
                }
            }
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
            Some(v) => {
                self.name_value(v, &target.name);
                self.set_var(&target.name, Ev::Value(v));
            }
            None => {
                let got = self.describe(&new);
                let mut d = Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    value.span,
                    format!("`{}` has type `{want}`, but this is {got}", target.name),
                )
                .with_label_message(format!("expected `{want}`"))
                .with_secondary(def_span, "variable defined here")
                .with_note("a variable keeps its dtype and shape; assign a value of the same type");
                if let Some(t) = self.ev_type(&new) {
                    if t.dtype() != want.dtype() {
                        d = d.with_note(format!("help: convert it: `(...) as {}`", want.dtype()));
                    }
                }
                self.push(d);
            }
        }
    }

    /// Index of the innermost scope binding `name`.
    fn scope_index(&self, name: &str) -> Option<usize> {
        self.scopes.iter().rposition(|s| s.contains_key(name))
    }

    /// Mutable outer variables (holding values) that `blocks` assign, in
    /// first-assignment order.
    fn carried(&self, blocks: &[&ast::Block]) -> Vec<(String, ValueId)> {
        let mut names = Vec::new();
        for b in blocks {
            assigned_names(b, &mut names);
        }
        let mut out: Vec<(String, ValueId)> = Vec::new();
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

    /// A loop bound: an `i32` scalar (integer constants become one), from its value `v`.
    fn scalar_i32(&mut self, v: Ev, e: &ast::Expr, what: &str) -> Option<ValueId> {
        match &v {
            Ev::Int(_) => self.materialize(&v, DType::I32, e.span),
            Ev::Value(x) if self.ty(*x) == ValueType::Scalar(DType::I32) => Some(*x),
            Ev::Poison => None,
            other => {
                let desc = self.describe(other);
                let mut d = Diagnostic::error(
                    ErrorCode::BadControlFlow,
                    e.span,
                    format!("the loop {what} must be an i32 scalar, found {desc}"),
                );
                if let Some(ValueType::Scalar(t)) = self.ev_type(other) {
                    if t.is_int() {
                        d = d.with_note("help: convert it: `(...) as i32`");
                    }
                }
                self.push(d);
                None
            }
        }
    }

    /// The loop step: a positive constant that fits in i32.
    fn loop_step(&mut self, step: Option<&ast::Expr>) -> Option<i64> {
        let Some(e) = step else { return Some(1) };
        let msg = match self.expr(e) {
            Ev::Int(i) if i > 0 && i <= i32::MAX as i128 => return Some(i as i64),
            Ev::Poison => return None,
            Ev::Int(i) if i <= 0 => format!("the loop step must be positive, found {i}"),
            Ev::Int(i) => format!("the loop step {i} does not fit in i32"),
            Ev::Value(_) => {
                self.push(
                    Diagnostic::error(
                        ErrorCode::BadControlFlow,
                        e.span,
                        "the loop step must be a positive compile-time constant",
                    )
                    .with_label_message("not a constant"),
                );
                return None;
            }
            other => format!(
                "the loop step must be a positive integer constant, found {}",
                self.describe(&other)
            ),
        };
        self.error(ErrorCode::BadControlFlow, e.span, msg);
        None
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
        // The loop a compile-time parameter turns off: `let mut rounds = 1; if P {
        // rounds = ...; }` then `for r in 0..rounds`, where the end is a variable still
        // holding its constant (literal bounds such as `0..GROUP` stay a loop: kernels
        // tuned at the register limit were measured with it, and ptxas allocates the
        // two forms differently).
        let held_const = |c: &Self, v: &Ev| match v {
            Ev::Value(x) => match c.typed_consts.get(x) {
                Some(crate::types::Scalar::Int(i, _)) => Some(*i as i128),
                _ => None,
            },
            _ => None,
        };
        let start_ev = self.expr(start);
        let a = match &start_ev {
            Ev::Int(i) => Some(*i),
            other => held_const(self, other),
        };
        let lower = self.scalar_i32(start_ev, start, "start");
        let end_ev = self.expr(end);
        let b = held_const(self, &end_ev);
        let upper = self.scalar_i32(end_ev, end, "end");
        let step_v = self.loop_step(step);
        if let (Some(a), Some(b), Some(s), Some(start_value)) = (a, b, step_v, lower) {
            if b > a && b - a <= s as i128 {
                // One iteration: only its body, as a compile-time constant condition
                // keeps one branch. The variable is the start's i32 value, as in the
                // loop (not an untyped constant: a slot index `j + DEPTH` past a buffer
                // stays a fetch that only counts, as at run time).
                self.scopes.push(Default::default());
                self.bind(
                    &var.name,
                    Binding::Var {
                        value: Ev::Value(start_value),
                        mutable: false,
                        span: var.span,
                    },
                );
                self.lower_block_stmts(body);
                self.scopes.pop();
                return;
            }
        }
        let step = match step_v {
            Some(s) => self.materialize(&Ev::Int(s as i128), DType::I32, span),
            None => None,
        };
        let (Some(lower), Some(upper), Some(step)) = (lower, upper, step) else {
            // Still check the body, for its own errors.
            self.lower_detached(body, Some(var));
            return;
        };
        let carried = self.carried(&[body]);
        let iv = self.new_arg(ValueType::Scalar(DType::I32), &var.name);
        let mut args = vec![iv];
        for (n, v) in &carried {
            let ty = self.ty(*v);
            let a = self.new_arg(ty, n);
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
            .zip(args.iter().skip(1))
            .map(|((n, _), a)| self.var_value(n).unwrap_or(*a))
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
            self.name_value(r, n);
            self.set_var(n, Ev::Value(r));
        }
    }

    /// Checks statements for errors without keeping their IR or their effect on outer
    /// variables (after an error in a loop header or `if` condition, so the body's own
    /// errors are still reported).
    fn lower_detached(&mut self, body: &ast::Block, var: Option<&ast::Ident>) {
        self.blocks.push(Block::default());
        let saved = self.scopes.clone();
        self.scopes.push(Default::default());
        if let Some(var) = var {
            self.bind(
                &var.name,
                Binding::Var {
                    value: Ev::Poison,
                    mutable: false,
                    span: var.span,
                },
            );
        }
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
        let c = match self.expr(cond) {
            Ev::Bool(b) => {
                // A compile-time condition: only the taken branch exists.
                let taken = if b { Some(then_block) } else { else_block };
                if let Some(blk) = taken {
                    self.scoped_block(blk);
                }
                return;
            }
            Ev::Value(v) if self.ty(v) == ValueType::Scalar(DType::Bool) => Some(v),
            Ev::Poison => None,
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
                } else if t.dtype() != DType::Bool {
                    d = d.with_note("help: compare to get a bool, e.g. `n != 0`");
                }
                self.push(d);
                None
            }
            other => {
                let desc = self.describe(&other);
                self.error(
                    ErrorCode::BadControlFlow,
                    cond.span,
                    format!("an `if` condition must be a scalar `bool`, found {desc}"),
                );
                None
            }
        };
        let Some(c) = c else {
            self.lower_detached(then_block, None);
            if let Some(e) = else_block {
                self.lower_detached(e, None);
            }
            return;
        };
        let mut branches: Vec<&ast::Block> = vec![then_block];
        branches.extend(else_block);
        let carried = self.carried(&branches);
        let mut bodies = Vec::new();
        for blk in [Some(then_block), else_block] {
            self.blocks.push(Block::default());
            if let Some(blk) = blk {
                self.scoped_block(blk);
            }
            let yields: Vec<ValueId> = carried
                .iter()
                .map(|(n, init)| self.var_value(n).unwrap_or(*init))
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
            self.name_value(r, n);
            self.set_var(n, Ev::Value(r));
        }
    }
}

/// Names assigned anywhere in a block (nested blocks included), in order.
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
