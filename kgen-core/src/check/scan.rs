//! Scans: `cumsum`, `cumprod`, `cummax`, `cummin` and `scan(x, axis, combine = op)`,
//! with the keywords `reverse = true` and `exclusive = true`.
//!
//! Triton's `associative_scan` takes a combine function; the language has no way to
//! write one, so `scan` offers the built-in combine ops of [`ScanOp`] (`add`, `mul`,
//! `max`, `min`, `and`, `or`, `xor`), named like an eviction policy: bare words, not
//! expressions.
//!
//! Assumes: the arguments were matched against the signatures in `builtins.rs` (which
//! reads `combine = ...` through [`Checker::scan_combine`], as a name).
//! Guarantees: an `Op::Scan` is emitted only on a tile of a dtype its op accepts, along
//! an axis of the tile, with constant `reverse` / `exclusive`; the result has the
//! operand's type. A 1-D tile may omit the axis; a larger one may not (`BadArguments`).
//! Errors: a bool `cumsum`/`cumprod`/`cummax`/`cummin` and a float `and`/`or`/`xor`
//! are `TypeMismatch`, a bad axis `BadAxis`, a missing or unknown combine op
//! `BadArguments`, a runtime `reverse` or `exclusive` `NotConstant`.

use super::builtins::Args;
use super::{Checker, Ev};
use crate::diag::{Diagnostic, ErrorCode};
use crate::front::ast;
use crate::ir::{Op, ScanOp};
use crate::span::Span;
use crate::types::{DType, ValueType};

/// The keyword that names a scan's combine op.
pub(crate) const COMBINE_KW: &str = "combine";

/// Every combine op's name, for messages.
fn op_names() -> Vec<String> {
    ScanOp::ALL.iter().map(|o| o.name().to_string()).collect()
}

impl Checker<'_> {
    /// The op a `combine = ...` argument names: one of [`ScanOp`]'s names, written bare.
    pub(crate) fn scan_combine(&mut self, value: &ast::Expr) -> Option<ScanOp> {
        let given = match &value.kind {
            ast::ExprKind::Name(id) => id.name.as_str(),
            _ => "",
        };
        if let Some(op) = ScanOp::from_name(given) {
            return Some(op);
        }
        let names = op_names();
        let what = if given.is_empty() {
            "an expression".to_string()
        } else {
            format!("`{given}`")
        };
        let mut d = Diagnostic::error(
            ErrorCode::BadArguments,
            value.span,
            format!("`{COMBINE_KW}` must name a combine op, not {what}"),
        )
        .with_note(format!("the combine ops are: {}", names.join(", ")))
        .with_note(
            "a scan combines with a built-in op; there are no user-defined combine functions",
        );
        // The names other libraries use for the same ops (torch.cumsum, numpy).
        let alias = match given {
            "sum" | "plus" => Some("add"),
            "prod" | "product" | "times" => Some("mul"),
            "maximum" => Some("max"),
            "minimum" => Some("min"),
            _ => None,
        };
        if let Some(s) = alias
            .map(str::to_string)
            .or_else(|| super::scope::closest(given, &names))
        {
            d = d.with_note(format!("help: did you mean `{s}`?"));
        }
        self.push(d);
        None
    }

    /// `cumsum(x, axis)`, `cumprod`, `cummax`, `cummin` and `scan(x, axis, combine = op)`.
    pub(crate) fn scan_builtin(&mut self, name: &str, a: &Args, span: Span) -> Ev {
        let op = match name {
            "cumsum" => ScanOp::Add,
            "cumprod" => ScanOp::Mul,
            "cummax" => ScanOp::Max,
            "cummin" => ScanOp::Min,
            _ => match a.combine {
                Some(op) => op,
                None => {
                    return self.push(
                        Diagnostic::error(
                            ErrorCode::BadArguments,
                            span,
                            format!("`scan` needs `{COMBINE_KW} = ...`"),
                        )
                        .with_note(format!("the combine ops are: {}", op_names().join(", ")))
                        .with_note("help: e.g. `scan(x, 0, combine = max)`; `cumsum(x, 0)` is `scan(x, 0, combine = add)`"),
                    )
                }
            },
        };
        let x = a.p(0);
        let Some((v, d, s)) = self.expect_tile(&x) else {
            return Ev::Poison;
        };
        let axis = match a.pos.get(1) {
            Some(arg) => match self.const_int(arg, 0, s.rank() as i64 - 1, "axis") {
                Some(ax) => ax as u8,
                None => return Ev::Poison,
            },
            None if s.rank() == 1 => 0,
            None => {
                return self.push(
                    Diagnostic::error(
                        ErrorCode::BadArguments,
                        span,
                        format!("`{name}` of a rank-{} tile needs an axis", s.rank()),
                    )
                    .with_secondary(x.1, format!("this tile has shape {s}"))
                    .with_note(format!(
                        "help: e.g. `{name}(x, {})` scans along the last axis",
                        s.rank() - 1
                    )),
                )
            }
        };
        let reverse = self.scan_flag(a, "reverse");
        let exclusive = self.scan_flag(a, "exclusive");
        let (Some(reverse), Some(exclusive)) = (reverse, exclusive) else {
            return Ev::Poison;
        };
        if !op.accepts(d) {
            let what = if name == "scan" {
                format!("`scan` with `{COMBINE_KW} = {}`", op.name())
            } else {
                format!("`{name}`")
            };
            let (need, help) = if d == DType::Bool {
                (
                    "numbers",
                    format!("help: convert it first, e.g. `{name}(m as i32, {axis})`; for bool, `scan` combines with `and`, `or` or `xor`"),
                )
            } else {
                (
                    "integers or bool",
                    "help: `and`, `or` and `xor` are bitwise; cast floats to an integer type first"
                        .to_string(),
                )
            };
            return self.push(
                Diagnostic::error(
                    ErrorCode::TypeMismatch,
                    x.1,
                    format!("{what} needs {need}, found `{d}`"),
                )
                .with_label_message(format!("this is a `{d}` tile"))
                .with_note(help),
            );
        }
        self.emit1(
            Op::Scan {
                op,
                value: v,
                axis,
                reverse,
                exclusive,
            },
            ValueType::Tile(d, s),
            span,
        )
    }

    /// The constant bool keyword `kw` (`reverse = true`), false when absent.
    fn scan_flag(&mut self, a: &Args, kw: &str) -> Option<bool> {
        let Some((e, sp)) = a.kw(kw) else {
            return Some(false);
        };
        match e {
            Ev::Bool(b) => Some(b),
            Ev::Poison => None,
            Ev::Value(_) => {
                self.push(
                    Diagnostic::error(
                        ErrorCode::NotConstant,
                        sp,
                        format!("`{kw}` must be a compile-time constant"),
                    )
                    .with_label_message("this is a runtime value")
                    .with_note(format!(
                        "help: write `{kw} = true` or use a `bool` generic parameter"
                    )),
                );
                None
            }
            other => {
                let desc = self.describe(&other);
                self.error(
                    ErrorCode::WrongKind,
                    sp,
                    format!("`{kw}` must be `true` or `false`, found {desc}"),
                );
                None
            }
        }
    }
}
