//! Helper functions (`fn name(a, b) { ...; return e; }`): checked and inlined at each
//! call.
//!
//! Assumes: the module's functions are in `Checker::functions`; a call reaches
//! [`Checker::user_call`] only when its name is not a builtin (a function may not take a
//! builtin's name: [`Checker::check_functions`] says so at the definition).
//! Guarantees: a call binds each parameter to its argument's checked value (a tensor as
//! a tensor, a compile-time integer, bool or dtype as the same constant, so shapes and
//! `static_assert`s inside may use it) in a scope stack of its own, so the body sees
//! only its parameters; checks the body's statements into the current block (the IR is
//! exactly that of the arguments, left to right, and then the body's statements written
//! out at the call); and returns the
//! value of the body's closing `return e;`, or no value without one. `return` anywhere
//! else, keyword arguments, a wrong argument count and recursion (direct or through
//! other functions) are located errors, never a panic or an endless expansion.

use super::{Binding, Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast::{self, Stmt};
use crate::span::Span;
use std::collections::HashMap;

impl Checker<'_> {
    /// Definition checks, once per kernel: no two functions of one name, none named
    /// like a builtin, no repeated parameter.
    pub(crate) fn check_functions(&mut self) {
        let fns = self.functions.clone();
        let mut seen: HashMap<&str, Span> = HashMap::new();
        for f in &fns {
            let name = f.name.name.as_str();
            if super::builtins::is_builtin(name) {
                self.push(
                    Diagnostic::error(
                        ErrorCode::Redefinition,
                        f.name.span,
                        format!("`{name}` is a builtin function"),
                    )
                    .with_label_message("a function of this name would hide it")
                    .with_note("help: give the function another name"),
                );
            } else if let Some(&first) = seen.get(name) {
                self.push(
                    Diagnostic::error(
                        ErrorCode::Redefinition,
                        f.name.span,
                        format!("the function `{name}` is defined twice"),
                    )
                    .with_label_message("defined again here")
                    .with_secondary(first, "first defined here"),
                );
            } else {
                seen.insert(name, f.name.span);
            }
            let mut params: HashMap<&str, Span> = HashMap::new();
            for p in &f.params {
                if let Some(&first) = params.get(p.name.as_str()) {
                    self.push(
                        Diagnostic::error(
                            ErrorCode::Redefinition,
                            p.span,
                            format!("the parameter `{}` of `{name}` is declared twice", p.name),
                        )
                        .with_label_message("declared again here")
                        .with_secondary(first, "first declared here"),
                    );
                } else {
                    params.insert(&p.name, p.span);
                }
            }
        }
    }

    /// The function called `name`, if the module defines one.
    pub(crate) fn function(&self, name: &str) -> Option<ast::FnDef> {
        self.functions.iter().find(|f| f.name.name == name).cloned()
    }

    /// A call of helper function `f` (module docs).
    pub(crate) fn user_call(
        &mut self,
        f: &ast::FnDef,
        callee: &ast::Ident,
        args: &[ast::Arg],
        span: Span,
    ) -> Ev {
        let name = f.name.name.as_str();
        let mut vals = Vec::with_capacity(args.len());
        let mut ok = true;
        for a in args {
            if let Some(k) = &a.name {
                self.push(
                    Diagnostic::error(
                        ErrorCode::BadArguments,
                        k.span,
                        format!("`{name}` takes its arguments by position"),
                    )
                    .with_label_message("a keyword argument")
                    .with_note(format!(
                        "help: pass the value as argument {} of `{name}({})`",
                        vals.len() + 1,
                        param_list(f)
                    )),
                );
                ok = false;
            }
            let v = self.expr(&a.value);
            ok &= !matches!(v, Ev::Poison);
            vals.push(v);
        }
        if args.len() != f.params.len() {
            self.push(
                Diagnostic::error(
                    ErrorCode::BadArguments,
                    span,
                    format!(
                        "`{name}` takes {} argument{}, {} given",
                        f.params.len(),
                        if f.params.len() == 1 { "" } else { "s" },
                        args.len()
                    ),
                )
                .with_secondary(f.name.span, format!("`{name}({})`", param_list(f))),
            );
            ok = false;
        }
        if self.fn_stack.iter().any(|n| n == name) {
            let chain = self.fn_stack.join(" → ");
            return self.push(
                Diagnostic::error(
                    ErrorCode::BadControlFlow,
                    callee.span,
                    format!("`{name}` calls itself ({chain} → {name})"),
                )
                .with_label_message("a recursive call")
                .with_note("functions are inlined at each call, so a recursive one never ends")
                .with_note("help: write the repetition as a `for` loop"),
            );
        }
        if !ok {
            return Ev::Poison;
        }
        // The body sees only the parameters: a scope stack of its own.
        let mut scope = HashMap::new();
        for (p, v) in f.params.iter().zip(vals) {
            let b = match v {
                Ev::Tensor(index) => Binding::Tensor {
                    index,
                    span: p.span,
                },
                value => Binding::Var {
                    value,
                    mutable: false,
                    span: p.span,
                },
            };
            scope.insert(p.name.clone(), b);
        }
        let caller = std::mem::replace(&mut self.scopes, vec![scope, HashMap::new()]);
        self.fn_stack.push(name.to_string());
        let last = f.body.stmts.len().saturating_sub(1);
        let result = self.nested(f.body.span, |c| {
            let mut result = Ev::Unit;
            for (k, s) in f.body.stmts.iter().enumerate() {
                match s {
                    Stmt::Return { value, .. } if k == last => result = c.expr(value),
                    s => c.stmt(s),
                }
            }
            result
        });
        self.fn_stack.pop();
        self.scopes = caller;
        result.unwrap_or(Ev::Poison)
    }

    /// `return` where it may not stand: in a kernel, or before a function's end.
    pub(crate) fn misplaced_return(&mut self, span: Span) {
        let (msg, help) = if self.fn_stack.is_empty() {
            (
                "`return` in a kernel",
                "help: a kernel writes its results with `store`; `return` ends a `fn`",
            )
        } else {
            (
                "`return` before the end of a function",
                "help: assign the result to a `let mut` variable and `return` it as the \
                 function's last statement",
            )
        };
        self.push(
            Diagnostic::error(ErrorCode::BadControlFlow, span, msg)
                .with_label_message("only a function's last statement may be `return`")
                .with_note(help),
        );
    }
}

fn param_list(f: &ast::FnDef) -> String {
    f.params
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
