//! Rust syntax (`syn::ItemFn`) to the shared kgen AST (`kgen_core::front::ast`).
//!
//! Every node gets a synthetic span from [`SpanMap`]. Unsupported syntax is reported
//! with a located error and skipped, so that one pass reports every such error; the
//! result is then only used for the fallback expansion.

use crate::spans::SpanMap;
use kgen_core::front::ast::{self, BinOp, ExprKind, GenericKind, UnOp};
use kgen_core::Span;
use quote::ToTokens;
use syn::{punctuated::Punctuated, Token};

pub struct Lower {
    pub map: SpanMap,
    pub errors: Option<syn::Error>,
    /// Helper functions: `fn` items inside the kernel's body (`.kg`'s top-level `fn`s).
    pub functions: Vec<ast::FnDef>,
}

/// A placeholder for an expression that failed to convert (an error was reported).
fn bad(span: Span) -> ast::Expr {
    ast::Expr {
        kind: ExprKind::Int(0),
        span,
    }
}

impl Lower {
    pub fn new() -> Lower {
        Lower {
            map: SpanMap::default(),
            errors: None,
            functions: Vec::new(),
        }
    }

    pub fn err(&mut self, node: &dyn ToTokens, msg: impl std::fmt::Display) {
        self.err_combine(syn::Error::new_spanned(node.to_token_stream(), msg));
    }

    /// Adds `e` (one error or several) to the errors reported.
    pub fn err_combine(&mut self, e: syn::Error) {
        match &mut self.errors {
            Some(all) => all.combine(e),
            None => self.errors = Some(e),
        }
    }

    fn ident(&mut self, i: &syn::Ident) -> ast::Ident {
        let name = i.to_string();
        let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
        ast::Ident {
            name,
            span: self.map.alloc_span(i.span()),
        }
    }

    /// A path that is one plain identifier (`T`, `f32`, `half::bf16` → `bf16`).
    fn path_ident(&mut self, p: &syn::Path, allow_prefix: bool) -> Option<ast::Ident> {
        let last = p.segments.last()?;
        if !last.arguments.is_none() || (p.segments.len() > 1 && !allow_prefix) {
            return None;
        }
        Some(self.ident(&last.ident))
    }

    /// A type that names a dtype or generic: `f32`, `T`, `half::bf16`.
    fn type_ident(&mut self, ty: &syn::Type) -> Option<ast::Ident> {
        match ty {
            syn::Type::Path(tp) if tp.qself.is_none() => self.path_ident(&tp.path, true),
            syn::Type::Group(g) => self.type_ident(&g.elem),
            syn::Type::Paren(p) => self.type_ident(&p.elem),
            _ => None,
        }
    }

    // ------------------------------------------------------------ signature

    pub fn kernel(&mut self, f: &syn::ItemFn) -> ast::Kernel {
        let sig = &f.sig;
        if let Some(t) = &sig.constness {
            self.err(t, "a kernel cannot be `const`");
        }
        if let Some(t) = &sig.asyncness {
            self.err(t, "a kernel cannot be `async`");
        }
        if let Some(t) = &sig.unsafety {
            self.err(t, "a kernel cannot be `unsafe`");
        }
        if let Some(t) = &sig.abi {
            self.err(t, "a kernel cannot have an `extern` ABI");
        }
        if let Some(t) = &sig.variadic {
            self.err(t, "a kernel cannot be variadic");
        }
        if let Some(w) = &sig.generics.where_clause {
            self.err(
                w,
                "`where` clauses are not supported: put bounds on the generics",
            );
        }
        if let syn::ReturnType::Type(_, ty) = &sig.output {
            self.err(ty, "a kernel returns nothing: write results with `store`");
        }
        let span = self.map.alloc(&sig.ident);
        let name = self.ident(&sig.ident);
        let generics = sig
            .generics
            .params
            .iter()
            .filter_map(|g| self.generic(g))
            .collect();
        let params = sig.inputs.iter().filter_map(|p| self.param(p)).collect();
        let body = self.block(&f.block);
        ast::Kernel {
            name,
            generics,
            params,
            body,
            span,
        }
    }

    fn generic(&mut self, g: &syn::GenericParam) -> Option<ast::GenericParam> {
        match g {
            syn::GenericParam::Lifetime(l) => {
                self.err(l, "lifetime parameters are not supported in a kernel");
                None
            }
            syn::GenericParam::Type(tp) => {
                let span = self.map.alloc(tp);
                let bound = match tp.bounds.iter().collect::<Vec<_>>().as_slice() {
                    [syn::TypeParamBound::Trait(t)] if t.path.get_ident().is_some() => {
                        t.path.get_ident().cloned()
                    }
                    _ => None,
                };
                let Some(bound) = bound else {
                    self.err(
                        tp,
                        "a dtype generic needs exactly one bound: `T: Float` or `T: DType`",
                    );
                    return None;
                };
                let kind = match bound.to_string().as_str() {
                    "Float" => GenericKind::Float,
                    "DType" => GenericKind::DType,
                    other => {
                        self.err(
                            &bound,
                            format!("unknown generic kind `{other}`: expected `Float` or `DType` (or `const N: i32` / `const B: bool`)"),
                        );
                        return None;
                    }
                };
                let kind_span = self.map.alloc(&bound);
                let default = match &tp.default {
                    None => None,
                    Some(ty) => match self.type_ident(ty) {
                        Some(id) => Some(ast::Expr {
                            span: id.span,
                            kind: ExprKind::Name(id),
                        }),
                        None => {
                            self.err(ty, "a dtype default must be a dtype name such as `f32`");
                            None
                        }
                    },
                };
                Some(ast::GenericParam {
                    name: self.ident(&tp.ident),
                    kind,
                    kind_span,
                    default,
                    span,
                })
            }
            syn::GenericParam::Const(cp) => {
                let span = self.map.alloc(cp);
                let kind = match self.type_ident(&cp.ty).map(|i| i.name) {
                    Some(n) if matches!(n.as_str(), "i32" | "i64" | "u32" | "usize" | "isize") => {
                        GenericKind::Int
                    }
                    Some(n) if n == "bool" => GenericKind::Bool,
                    Some(n) => match kgen_core::DType::from_name(&n) {
                        Some(d) if d.is_float() => GenericKind::FloatValue(d),
                        _ => {
                            self.err(
                                &cp.ty,
                                "a const generic must have type `i32` (any integer type), `bool`, or a float dtype (`f32`, `f16`, `bf16`)",
                            );
                            return None;
                        }
                    },
                    None => {
                        self.err(
                            &cp.ty,
                            "a const generic must have type `i32` (any integer type), `bool`, or a float dtype (`f32`, `f16`, `bf16`)",
                        );
                        return None;
                    }
                };
                let kind_span = self.map.alloc(&cp.ty);
                let default = cp.default.as_ref().map(|e| self.expr(e));
                Some(ast::GenericParam {
                    name: self.ident(&cp.ident),
                    kind,
                    kind_span,
                    default,
                    span,
                })
            }
        }
    }

    fn param(&mut self, p: &syn::FnArg) -> Option<ast::Param> {
        let syn::FnArg::Typed(pt) = p else {
            self.err(p, "a kernel cannot take `self`");
            return None;
        };
        let syn::Pat::Ident(pi) = &*pt.pat else {
            self.err(&pt.pat, "a kernel parameter must be a plain name");
            return None;
        };
        if pi.by_ref.is_some() || pi.mutability.is_some() || pi.subpat.is_some() {
            self.err(
                &pt.pat,
                "a kernel parameter must be a plain name (no `mut`/`ref`)",
            );
            return None;
        }
        if pi.ident == "NAME" || pi.ident == "SOURCE" {
            // A fn parameter named like a const in scope is a constant pattern in Rust.
            self.err(
                &pi.ident,
                "`NAME` and `SOURCE` are reserved: the generated module defines them",
            );
            return None;
        }
        let span = self.map.alloc(pt);
        let ty = self.param_type(&pt.ty)?;
        Some(ast::Param {
            name: self.ident(&pi.ident),
            ty,
            span,
        })
    }

    fn param_type(&mut self, ty: &syn::Type) -> Option<ast::ParamType> {
        const HELP: &str =
            "expected a scalar dtype (`f32`, `i32`, `T`, ...) or `Tensor<T, RANK>`, \
                            `Tensor<T, RANK, Contiguous>`, `Tensor<T, Dims<_, 4096>>`";
        let syn::Type::Path(tp) = ty else {
            self.err(ty, format!("unsupported parameter type: {HELP}"));
            return None;
        };
        let Some(last) = tp.path.segments.last() else {
            self.err(ty, format!("unsupported parameter type: {HELP}"));
            return None;
        };
        if last.ident != "Tensor" {
            return match self.type_ident(ty) {
                Some(id) => Some(ast::ParamType::Scalar(id)),
                None => {
                    self.err(ty, format!("unsupported parameter type: {HELP}"));
                    None
                }
            };
        }
        let span = self.map.alloc(ty);
        let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
            self.err(ty, format!("`Tensor` needs arguments: {HELP}"));
            return None;
        };
        let args: Vec<&syn::GenericArgument> = args.args.iter().collect();
        if !(2..=3).contains(&args.len()) {
            self.err(ty, format!("`Tensor` takes 2 or 3 arguments: {HELP}"));
            return None;
        }
        let elem = match args[0] {
            syn::GenericArgument::Type(t) => self.type_ident(t),
            _ => None,
        };
        let Some(elem) = elem else {
            self.err(
                args[0],
                "the tensor element type must be a dtype or a generic",
            );
            return None;
        };
        let dims = self.tensor_dims(args[1])?;
        let contiguous = match args.get(2) {
            None => false,
            Some(syn::GenericArgument::Type(syn::Type::Path(p)))
                if p.path.is_ident("Contiguous") =>
            {
                true
            }
            Some(other) => {
                self.err(
                    other,
                    "the third `Tensor` argument can only be `Contiguous`",
                );
                return None;
            }
        };
        Some(ast::ParamType::Tensor(ast::TensorType {
            elem,
            dims,
            contiguous,
            span,
        }))
    }

    /// `2` (a rank) or `Dims<_, 4096, { 2 * D }>` (one entry per dimension).
    fn tensor_dims(&mut self, a: &syn::GenericArgument) -> Option<ast::TensorDims> {
        match a {
            syn::GenericArgument::Const(syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            })) => match i.base10_parse::<u32>() {
                Ok(r) if i.suffix().is_empty() => {
                    let s = self.map.alloc(i);
                    Some(ast::TensorDims::Rank(r, s))
                }
                _ => {
                    self.err(i, "a tensor rank must be a small unsuffixed integer");
                    None
                }
            },
            syn::GenericArgument::Type(syn::Type::Path(p))
                if p.path.segments.len() == 1 && p.path.segments[0].ident == "Dims" =>
            {
                let seg = &p.path.segments[0];
                let syn::PathArguments::AngleBracketed(list) = &seg.arguments else {
                    self.err(p, "`Dims` needs one entry per dimension: `Dims<_, 4096>`");
                    return None;
                };
                let mut dims = Vec::new();
                for d in &list.args {
                    dims.push(match d {
                        syn::GenericArgument::Type(syn::Type::Infer(u)) => {
                            ast::DimSpec::Dynamic(self.map.alloc(u))
                        }
                        syn::GenericArgument::Const(e) => ast::DimSpec::Const(self.expr(e)),
                        syn::GenericArgument::Type(t) => match self.type_ident(t) {
                            Some(id) => ast::DimSpec::Const(ast::Expr {
                                span: id.span,
                                kind: ExprKind::Name(id),
                            }),
                            None => {
                                self.err(t, "a dimension is `_`, a constant or `{ expr }`");
                                return None;
                            }
                        },
                        other => {
                            self.err(other, "a dimension is `_`, a constant or `{ expr }`");
                            return None;
                        }
                    });
                }
                Some(ast::TensorDims::List(dims))
            }
            other => {
                self.err(
                    other,
                    "the second `Tensor` argument is a rank (`2`) or `Dims<_, 4096>`",
                );
                None
            }
        }
    }

    // ------------------------------------------------------------ statements

    fn block(&mut self, b: &syn::Block) -> ast::Block {
        let span = self.map.alloc(b);
        let stmts = b.stmts.iter().filter_map(|s| self.stmt(s)).collect();
        ast::Block { stmts, span }
    }

    fn stmt(&mut self, s: &syn::Stmt) -> Option<ast::Stmt> {
        match s {
            syn::Stmt::Local(l) => self.local(l),
            syn::Stmt::Item(syn::Item::Fn(f)) => {
                self.helper(f);
                None
            }
            syn::Stmt::Item(i) => {
                self.err(
                    i,
                    "items other than helper `fn`s (struct, use, ...) are not allowed inside a kernel",
                );
                None
            }
            syn::Stmt::Macro(m) => self.macro_stmt(&m.mac),
            syn::Stmt::Expr(e, _) => self.expr_stmt(e),
        }
    }

    /// `let [a, b] = e;` (`let [mut a, mut b] = e;`: every name `mut`, or none).
    fn let_list(&mut self, l: &syn::Local, sl: &syn::PatSlice, span: Span) -> Option<ast::Stmt> {
        let mut names = Vec::new();
        let mut muts = Vec::new();
        for p in &sl.elems {
            match p {
                syn::Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                    names.push(self.ident(&pi.ident));
                    muts.push(pi.mutability.is_some());
                }
                other => {
                    self.err(other, "`let [a, b]` binds plain names");
                    return None;
                }
            }
        }
        if names.is_empty() {
            self.err(sl, "`let []` binds no name");
            return None;
        }
        let mutable = muts.iter().all(|&m| m);
        if !mutable && muts.iter().any(|&m| m) {
            self.err(sl, "make every name of `let [...]` `mut`, or none");
        }
        let Some(init) = &l.init else {
            self.err(l, "a `let` needs a value: `let [a, b] = ...;`");
            return None;
        };
        Some(ast::Stmt::LetList {
            names,
            mutable,
            value: self.expr(&init.expr),
            span,
        })
    }

    fn local(&mut self, l: &syn::Local) -> Option<ast::Stmt> {
        let span = self.map.alloc(l);
        let (pat, ty) = match &l.pat {
            syn::Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
            p => (p, None),
        };
        if let (syn::Pat::Slice(sl), None) = (pat, ty) {
            return self.let_list(l, sl, span);
        }
        let syn::Pat::Ident(pi) = pat else {
            self.err(pat, "`let` binds one plain name (no patterns)");
            return None;
        };
        if pi.by_ref.is_some() || pi.subpat.is_some() {
            self.err(pat, "`let` binds one plain name (no patterns)");
            return None;
        }
        let ty = match ty {
            None => None,
            Some(t) => match self.type_ident(t) {
                Some(i) => Some(i),
                None => {
                    self.err(t, "a `let` annotation is a dtype name (`f32`, `T`, ...)");
                    return None;
                }
            },
        };
        let Some(init) = &l.init else {
            self.err(l, "a `let` needs a value: `let x = ...;`");
            return None;
        };
        if let Some((e, _)) = &init.diverge {
            self.err(e, "`let ... else` is not supported in a kernel");
        }
        Some(ast::Stmt::Let {
            name: self.ident(&pi.ident),
            mutable: pi.mutability.is_some(),
            ty,
            value: self.expr(&init.expr),
            span,
        })
    }

    fn macro_stmt(&mut self, m: &syn::Macro) -> Option<ast::Stmt> {
        if !m.path.is_ident("static_assert") {
            self.err(
                m,
                "only the `static_assert!` macro is allowed inside a kernel",
            );
            return None;
        }
        let span = self.map.alloc(m);
        let args = match m.parse_body_with(Punctuated::<syn::Expr, Token![,]>::parse_terminated) {
            Ok(a) => a,
            Err(e) => {
                self.err(m, format!("bad `static_assert!`: {e}"));
                return None;
            }
        };
        let args: Vec<syn::Expr> = args.into_iter().collect();
        self.static_assert(m, &args, span)
    }

    fn static_assert(
        &mut self,
        node: &dyn ToTokens,
        args: &[syn::Expr],
        span: Span,
    ) -> Option<ast::Stmt> {
        let (cond, message) = match args {
            [c] => (c, None),
            [c, syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            })] => (c, Some(s.value())),
            _ => {
                self.err(node, "expected `static_assert!(condition, \"message\")`");
                return None;
            }
        };
        Some(ast::Stmt::StaticAssert {
            cond: self.expr(cond),
            message,
            span,
        })
    }

    fn expr_stmt(&mut self, e: &syn::Expr) -> Option<ast::Stmt> {
        match e {
            syn::Expr::Assign(a) => {
                let span = self.map.alloc(a);
                let target = self.assign_target(&a.left)?;
                Some(ast::Stmt::Assign {
                    target,
                    op: None,
                    value: self.expr(&a.right),
                    span,
                })
            }
            syn::Expr::Binary(b) if compound_op(&b.op).is_some() => {
                let span = self.map.alloc(b);
                let target = self.assign_target(&b.left)?;
                Some(ast::Stmt::Assign {
                    target,
                    op: compound_op(&b.op),
                    value: self.expr(&b.right),
                    span,
                })
            }
            syn::Expr::ForLoop(f) => self.for_loop(f),
            syn::Expr::If(i) => self.if_stmt(i),
            syn::Expr::Call(c) if is_path(&c.func, "static_assert") => {
                let span = self.map.alloc(c);
                let args: Vec<syn::Expr> = c.args.iter().cloned().collect();
                self.static_assert(c, &args, span)
            }
            syn::Expr::Macro(m) => self.macro_stmt(&m.mac),
            syn::Expr::Return(r) => {
                let span = self.map.alloc(r);
                match &r.expr {
                    Some(v) => Some(ast::Stmt::Return {
                        value: self.expr(v),
                        span,
                    }),
                    None => {
                        self.err(
                            r,
                            "`return` needs a value: a function without one just ends",
                        );
                        None
                    }
                }
            }
            other => Some(ast::Stmt::Expr(self.expr(other))),
        }
    }

    /// A helper function: `fn name(a: _, b: _) -> _ { ...; e }` inside the kernel's body
    /// (the parameter and return types are not read: each call's arguments give them).
    /// A closing expression without `;` is its `return`.
    pub fn helper(&mut self, f: &syn::ItemFn) {
        let sig = &f.sig;
        if !sig.generics.params.is_empty() {
            self.err(
                &sig.generics,
                "a helper function takes no generics: pass compile-time values as arguments",
            );
        }
        if sig.constness.is_some() || sig.asyncness.is_some() || sig.unsafety.is_some() {
            self.err(&sig.ident, "a helper function is a plain `fn`");
        }
        let span = self.map.alloc(&sig.ident);
        let name = self.ident(&sig.ident);
        let mut params = Vec::new();
        for p in &sig.inputs {
            match p {
                syn::FnArg::Typed(t) => match &*t.pat {
                    syn::Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                        params.push(self.ident(&pi.ident));
                    }
                    other => self.err(other, "a parameter is one plain name"),
                },
                syn::FnArg::Receiver(r) => self.err(r, "a helper function has no `self`"),
            }
        }
        let bspan = self.map.alloc(&f.block);
        let mut stmts = Vec::new();
        let n = f.block.stmts.len();
        for (k, s) in f.block.stmts.iter().enumerate() {
            match s {
                syn::Stmt::Expr(e, None) if k + 1 == n && !is_statement_like(e) => {
                    let span = self.map.alloc(e);
                    stmts.push(ast::Stmt::Return {
                        value: self.expr(e),
                        span,
                    });
                }
                s => stmts.extend(self.stmt(s)),
            }
        }
        self.functions.push(ast::FnDef {
            name,
            params,
            body: ast::Block { stmts, span: bspan },
            span,
        });
    }

    fn assign_target(&mut self, e: &syn::Expr) -> Option<ast::Ident> {
        if let syn::Expr::Path(p) = e {
            if p.qself.is_none() {
                if let Some(i) = p.path.get_ident() {
                    return Some(self.ident(i));
                }
            }
        }
        self.err(e, "only a variable can be assigned to");
        None
    }

    fn for_loop(&mut self, f: &syn::ExprForLoop) -> Option<ast::Stmt> {
        if let Some(l) = &f.label {
            self.err(l, "loop labels are not supported");
        }
        let span = self.map.alloc(&f.for_token);
        let syn::Pat::Ident(pi) = &*f.pat else {
            self.err(&f.pat, "the loop variable must be a plain name");
            return None;
        };
        // `a..b` or `(a..b).step_by(s)`.
        let (range, step) = match &*f.expr {
            syn::Expr::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => {
                (strip_parens(&m.receiver), m.args.first())
            }
            other => (strip_parens(other), None),
        };
        let syn::Expr::Range(r) = range else {
            self.err(
                &f.expr,
                "expected a range: `for i in a..b` or `for i in (a..b).step_by(s)`",
            );
            return None;
        };
        let (Some(start), Some(end), syn::RangeLimits::HalfOpen(_)) = (&r.start, &r.end, &r.limits)
        else {
            self.err(r, "expected a half-open range with both bounds: `a..b`");
            return None;
        };
        Some(ast::Stmt::For {
            var: self.ident(&pi.ident),
            start: self.expr(start),
            end: self.expr(end),
            step: step.map(|s| self.expr(s)),
            body: self.block(&f.body),
            span,
        })
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> Option<ast::Stmt> {
        let span = self.map.alloc(&i.if_token);
        let cond = self.expr(&i.cond);
        let then_block = self.block(&i.then_branch);
        let else_block = match &i.else_branch {
            None => None,
            Some((_, e)) => match &**e {
                syn::Expr::Block(b) => Some(self.block(&b.block)),
                syn::Expr::If(inner) => {
                    let bspan = self.map.alloc(inner);
                    let stmt = self.if_stmt(inner)?;
                    Some(ast::Block {
                        stmts: vec![stmt],
                        span: bspan,
                    })
                }
                other => {
                    self.err(other, "expected a block after `else`");
                    None
                }
            },
        };
        Some(ast::Stmt::If {
            cond,
            then_block,
            else_block,
            span,
        })
    }

    // ------------------------------------------------------------ expressions

    pub fn expr(&mut self, e: &syn::Expr) -> ast::Expr {
        let span = self.map.alloc(e);
        let kind = match e {
            syn::Expr::Lit(l) => match self.lit(&l.lit) {
                Some(k) => k,
                None => return bad(span),
            },
            syn::Expr::Path(p) => match self.path_expr(p) {
                Some(k) => k,
                None => return bad(span),
            },
            syn::Expr::Paren(p) => return self.expr(&p.expr),
            syn::Expr::Group(g) => return self.expr(&g.expr),
            syn::Expr::Block(b) if b.block.stmts.len() == 1 && b.label.is_none() => {
                // `{ 2 * D }` in const generic positions.
                if let syn::Stmt::Expr(inner, None) = &b.block.stmts[0] {
                    return self.expr(inner);
                }
                self.err(e, "blocks are not expressions in a kernel");
                return bad(span);
            }
            syn::Expr::Unary(u) => {
                let op = match u.op {
                    syn::UnOp::Neg(_) => UnOp::Neg,
                    syn::UnOp::Not(_) => UnOp::Not,
                    _ => {
                        self.err(&u.op, "dereferencing is not supported in a kernel");
                        return bad(span);
                    }
                };
                ExprKind::Unary {
                    op,
                    operand: Box::new(self.expr(&u.expr)),
                }
            }
            syn::Expr::Binary(b) => {
                // `a ** b` is `a * (*b)` to Rust: the `.kg` power operator has no Rust
                // spelling (and would bind differently), so it is refused.
                if let (syn::BinOp::Mul(_), syn::Expr::Unary(u)) = (&b.op, &*b.right) {
                    if let syn::UnOp::Deref(_) = u.op {
                        self.err(
                            e,
                            "Rust has no power operator: `a ** b` reads as `a * (*b)`; write `pow(a, b)`",
                        );
                        return bad(span);
                    }
                }
                let Some(op) = bin_op(&b.op) else {
                    self.err(
                        &b.op,
                        "compound assignment is a statement, not an expression",
                    );
                    return bad(span);
                };
                ExprKind::Binary {
                    op,
                    lhs: Box::new(self.expr(&b.left)),
                    rhs: Box::new(self.expr(&b.right)),
                }
            }
            syn::Expr::Cast(c) => {
                let Some(dtype) = self.type_ident(&c.ty) else {
                    self.err(&c.ty, "`as` casts to a dtype name (`f32`, `T`, ...)");
                    return bad(span);
                };
                ExprKind::Cast {
                    expr: Box::new(self.expr(&c.expr)),
                    dtype,
                }
            }
            syn::Expr::Array(a) => ExprKind::List(a.elems.iter().map(|x| self.expr(x)).collect()),
            syn::Expr::Call(c) => {
                let func = match &*c.func {
                    syn::Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
                        p.path.get_ident().map(|i| self.ident(i))
                    }
                    _ => None,
                };
                let Some(func) = func else {
                    self.err(
                        &c.func,
                        "only builtin functions can be called: `name(args)`",
                    );
                    return bad(span);
                };
                let args = c.args.iter().map(|a| self.arg(a)).collect();
                ExprKind::Call {
                    func,
                    args,
                    method_syntax: false,
                }
            }
            // `x.dtype`, the one property: the call `dtype(x)`, as in `.kg`.
            syn::Expr::Field(f) => {
                let syn::Member::Named(name) = &f.member else {
                    self.err(&f.member, "tuple fields are not supported in a kernel");
                    return bad(span);
                };
                if name != "dtype" {
                    self.err(
                        &f.member,
                        format!("`.{name}` is not a property: the only property is `.dtype`; call a function as a method with arguments: `.{name}(...)`"),
                    );
                    return bad(span);
                }
                ExprKind::Call {
                    func: self.ident(name),
                    args: vec![ast::Arg {
                        name: None,
                        value: self.expr(&f.base),
                    }],
                    method_syntax: true,
                }
            }
            syn::Expr::MethodCall(m) => {
                if let Some(t) = &m.turbofish {
                    self.err(t, "turbofish (`::<...>`) is not supported in a kernel");
                }
                let func = self.ident(&m.method);
                let mut args = vec![ast::Arg {
                    name: None,
                    value: self.expr(&m.receiver),
                }];
                args.extend(m.args.iter().map(|a| self.arg(a)));
                ExprKind::Call {
                    func,
                    args,
                    method_syntax: true,
                }
            }
            other => {
                self.err(other, describe(other));
                return bad(span);
            }
        };
        ast::Expr { kind, span }
    }

    /// A call argument; `name = value` (an assignment expression in Rust) is a keyword
    /// argument, as in `.kg`: `load(x, [i], [B], pad = -f32::INFINITY)`.
    fn arg(&mut self, a: &syn::Expr) -> ast::Arg {
        if let syn::Expr::Assign(asg) = a {
            if let syn::Expr::Path(p) = &*asg.left {
                if let Some(i) = p.path.get_ident() {
                    return ast::Arg {
                        name: Some(self.ident(i)),
                        value: self.expr(&asg.right),
                    };
                }
            }
        }
        ast::Arg {
            name: None,
            value: self.expr(a),
        }
    }

    fn lit(&mut self, l: &syn::Lit) -> Option<ExprKind> {
        match l {
            syn::Lit::Int(i) => {
                if !i.suffix().is_empty() {
                    self.err(i, "literal suffixes are not supported: write `1 as i64`");
                    return None;
                }
                match i.base10_parse::<u64>() {
                    Ok(v) => Some(ExprKind::Int(v as i128)),
                    Err(_) => {
                        self.err(i, "integer literal too large (at most 2^64 - 1)");
                        None
                    }
                }
            }
            syn::Lit::Float(f) => {
                if !f.suffix().is_empty() {
                    self.err(f, "literal suffixes are not supported: write `1.0 as f16`");
                    return None;
                }
                match f.base10_parse::<f64>() {
                    Ok(v) if v.is_finite() => Some(ExprKind::Float(v)),
                    _ => {
                        self.err(f, "float literal out of range");
                        None
                    }
                }
            }
            syn::Lit::Bool(b) => Some(ExprKind::Bool(b.value)),
            other => {
                self.err(
                    other,
                    "only integer, float and bool literals are allowed here",
                );
                None
            }
        }
    }

    fn path_expr(&mut self, p: &syn::ExprPath) -> Option<ExprKind> {
        if p.qself.is_none() {
            if let Some(i) = p.path.get_ident() {
                return Some(ExprKind::Name(self.ident(i)));
            }
            // `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::NAN` (any float dtype prefix).
            let segs: Vec<String> = p
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            if segs.len() == 2 && matches!(segs[0].as_str(), "f16" | "bf16" | "f32" | "f64") {
                let s = self.map.alloc(p);
                let name = |n: &str| ast::Ident {
                    name: n.to_string(),
                    span: s,
                };
                match segs[1].as_str() {
                    "INFINITY" => return Some(ExprKind::Name(name("inf"))),
                    "NAN" => return Some(ExprKind::Name(name("nan"))),
                    "NEG_INFINITY" => {
                        return Some(ExprKind::Unary {
                            op: UnOp::Neg,
                            operand: Box::new(ast::Expr {
                                kind: ExprKind::Name(name("inf")),
                                span: s,
                            }),
                        })
                    }
                    _ => {}
                }
            }
        }
        self.err(
            p,
            "paths are not supported in a kernel (only names and `f32::INFINITY`/`NEG_INFINITY`/`NAN`)",
        );
        None
    }
}

fn strip_parens(e: &syn::Expr) -> &syn::Expr {
    match e {
        syn::Expr::Paren(p) => strip_parens(&p.expr),
        syn::Expr::Group(g) => strip_parens(&g.expr),
        other => other,
    }
}

fn is_path(e: &syn::Expr, name: &str) -> bool {
    matches!(e, syn::Expr::Path(p) if p.path.is_ident(name))
}

fn bin_op(op: &syn::BinOp) -> Option<BinOp> {
    use syn::BinOp as S;
    Some(match op {
        S::Add(_) => BinOp::Add,
        S::Sub(_) => BinOp::Sub,
        S::Mul(_) => BinOp::Mul,
        S::Div(_) => BinOp::Div,
        S::Rem(_) => BinOp::Rem,
        S::And(_) => BinOp::And,
        S::Or(_) => BinOp::Or,
        S::BitXor(_) => BinOp::BitXor,
        S::BitAnd(_) => BinOp::BitAnd,
        S::BitOr(_) => BinOp::BitOr,
        S::Shl(_) => BinOp::Shl,
        S::Shr(_) => BinOp::Shr,
        S::Eq(_) => BinOp::Eq,
        S::Lt(_) => BinOp::Lt,
        S::Le(_) => BinOp::Le,
        S::Ne(_) => BinOp::Ne,
        S::Ge(_) => BinOp::Ge,
        S::Gt(_) => BinOp::Gt,
        _ => return None,
    })
}

fn compound_op(op: &syn::BinOp) -> Option<BinOp> {
    use syn::BinOp as S;
    Some(match op {
        S::AddAssign(_) => BinOp::Add,
        S::SubAssign(_) => BinOp::Sub,
        S::MulAssign(_) => BinOp::Mul,
        S::DivAssign(_) => BinOp::Div,
        S::RemAssign(_) => BinOp::Rem,
        S::BitXorAssign(_) => BinOp::BitXor,
        S::BitAndAssign(_) => BinOp::BitAnd,
        S::BitOrAssign(_) => BinOp::BitOr,
        S::ShlAssign(_) => BinOp::Shl,
        S::ShrAssign(_) => BinOp::Shr,
        _ => return None,
    })
}

/// The error for a Rust expression the kernel language has no counterpart for.
fn describe(e: &syn::Expr) -> String {
    let (what, help) = match e {
        syn::Expr::While(_) => ("`while` loops are", "use `for i in a..b`"),
        syn::Expr::Loop(_) => ("`loop` is", "use `for i in a..b`"),
        syn::Expr::Match(_) => ("`match` is", "use `if`/`else` or `where(c, a, b)`"),
        syn::Expr::Closure(_) => ("closures are", ""),
        syn::Expr::Index(_) => ("indexing with `[]` is", "use `load` or `gather`"),
        syn::Expr::Field(_) => ("field access is", ""),
        syn::Expr::Reference(_) => ("references are", ""),
        syn::Expr::Return(_) => ("`return` is", ""),
        syn::Expr::Break(_) | syn::Expr::Continue(_) => ("`break`/`continue` are", ""),
        syn::Expr::Tuple(_) => ("tuples are", "use a list `[a, b]`"),
        syn::Expr::Struct(_) => ("struct literals are", ""),
        syn::Expr::Range(_) => ("ranges outside `for` are", "use `arange(a, b)`"),
        syn::Expr::Macro(_) => ("macros other than `static_assert!` are", ""),
        syn::Expr::Async(_) | syn::Expr::Await(_) => ("async code is", ""),
        syn::Expr::Unsafe(_) => ("`unsafe` blocks are", ""),
        syn::Expr::Block(_) => ("blocks are", ""),
        syn::Expr::If(_) => ("`if` as a value is", "use `where(c, a, b)`"),
        syn::Expr::ForLoop(_) => ("`for` as a value is", ""),
        syn::Expr::Assign(_) => ("assignments inside expressions are", ""),
        syn::Expr::Try(_) => ("`?` is", ""),
        syn::Expr::Repeat(_) => ("`[x; n]` arrays are", "use `full(shape, x)`"),
        _ => ("this syntax is", ""),
    };
    if help.is_empty() {
        format!("{what} not supported in a kernel")
    } else {
        format!("{what} not supported in a kernel; {help}")
    }
}

/// An expression that is a statement when it closes a block (`for`, `if` without a
/// value, an assignment): not a helper function's result.
fn is_statement_like(e: &syn::Expr) -> bool {
    matches!(
        e,
        syn::Expr::ForLoop(_)
            | syn::Expr::If(_)
            | syn::Expr::Assign(_)
            | syn::Expr::Macro(_)
            | syn::Expr::Return(_)
    ) || matches!(e, syn::Expr::Binary(b) if compound_op(&b.op).is_some())
        || matches!(e, syn::Expr::Call(c) if is_path(&c.func, "store") || is_path(&c.func, "scatter"))
}
