//! The pest parser and the AST builder: pest pairs → [`ast::Module`] with spans.
//!
//! Assumes: `front::parse` ran the pre-scan first (balanced brackets, bounded nesting),
//! so the pest recursion and the recursion here are bounded.
//! Guarantees: never panics. The grammar fixes the shape of every pair, but the builder
//! does not trust it: a missing or unexpected pair becomes an "internal parse error"
//! diagnostic instead of an `unwrap`. Every node gets the byte span of its pair (always
//! on char boundaries). Expression trees deeper than [`MAX_EXPR_DEPTH`] are rejected, so
//! later recursive passes cannot overflow the stack. Binary operators follow Rust's
//! precedence; comparisons do not chain (`a < b < c` is an error, as in Rust).

use super::ast::*;
use crate::diag::{Diagnostic, ErrorCode};
use crate::span::Span;
use pest::iterators::{Pair, Pairs};
use pest_derive::Parser;

#[derive(Parser)]
#[grammar = "front/grammar.pest"]
pub(crate) struct KgParser;

/// The deepest expression tree the parser builds (operators, calls, parentheses).
pub const MAX_EXPR_DEPTH: u32 = 256;

type R<T> = Result<T, Diagnostic>;

/// The span of a pair, without the whitespace and comments that pest includes at the
/// end of a rule ending in an optional or repeated part (`if c { }` followed by
/// spaces, `a + b /* x */`).
fn span_of(p: &Pair<'_, Rule>) -> Span {
    let s = p.as_span();
    Span::new(s.start(), significant_end(p))
}

fn is_atomic(r: Rule) -> bool {
    matches!(
        r,
        Rule::ident
            | Rule::number
            | Rule::string
            | Rule::bin_op
            | Rule::unary_op
            | Rule::assign_op
            | Rule::dyn_dim
            | Rule::kw_kernel
            | Rule::kw_let
            | Rule::kw_mut
            | Rule::kw_for
            | Rule::kw_in
            | Rule::kw_if
            | Rule::kw_else
            | Rule::kw_as
            | Rule::kw_true
            | Rule::kw_false
            | Rule::kw_tensor
            | Rule::kw_contiguous
            | Rule::kw_static_assert
    )
}

/// The end of the last token of `p`: after its last child (recursively), only literal
/// tokens, whitespace and comments remain; keep the tokens.
fn significant_end(p: &Pair<'_, Rule>) -> usize {
    let span = p.as_span();
    if is_atomic(p.as_rule()) {
        return span.end();
    }
    let from = match p.clone().into_inner().last() {
        Some(q) => significant_end(&q),
        None => span.start(),
    };
    let gap = span.get_input().get(from..span.end()).unwrap_or("");
    let mut end = 0;
    let mut i = 0;
    while let Some(rest) = gap.get(i..) {
        let Some(c) = rest.chars().next() else { break };
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest
                .get(2..)
                .and_then(|r| r.find("*/"))
                .map_or(rest.len(), |n| n + 4);
        } else if c.is_whitespace() {
            i += c.len_utf8();
        } else {
            i += c.len_utf8();
            end = i;
        }
    }
    from + end
}

fn internal(span: Span, what: &str) -> Diagnostic {
    Diagnostic::error(
        ErrorCode::Syntax,
        span,
        format!("internal parse error: {what}"),
    )
    .with_note("this is a bug in the kgen parser; please report it with the input")
}

/// A cursor over the children of one pair, with checked accessors.
struct Children<'i> {
    inner: Pairs<'i, Rule>,
    parent: Span,
}

impl<'i> Children<'i> {
    fn of(p: Pair<'i, Rule>) -> Children<'i> {
        let parent = span_of(&p);
        Children {
            inner: p.into_inner(),
            parent,
        }
    }

    fn next(&mut self, what: &str) -> R<Pair<'i, Rule>> {
        self.inner
            .next()
            .ok_or_else(|| internal(self.parent, &format!("missing {what}")))
    }

    fn expect(&mut self, rule: Rule) -> R<Pair<'i, Rule>> {
        let p = self.next(&format!("{rule:?}"))?;
        if p.as_rule() == rule {
            Ok(p)
        } else {
            Err(internal(
                span_of(&p),
                &format!("expected {rule:?}, found {:?}", p.as_rule()),
            ))
        }
    }

    /// Takes the next pair if it has the given rule.
    fn take_if(&mut self, rule: Rule) -> Option<Pair<'i, Rule>> {
        if self.inner.peek().map(|p| p.as_rule()) == Some(rule) {
            self.inner.next()
        } else {
            None
        }
    }

    fn peek_rule(&self) -> Option<Rule> {
        self.inner.peek().map(|p| p.as_rule())
    }
}

fn ident(p: Pair<'_, Rule>) -> R<Ident> {
    if p.as_rule() != Rule::ident {
        return Err(internal(span_of(&p), "expected an identifier"));
    }
    Ok(Ident {
        name: p.as_str().to_string(),
        span: span_of(&p),
    })
}

/// Builds the module from the `file` pair.
pub(crate) fn build_file(file: Pair<'_, Rule>) -> R<Module> {
    let mut kernels = Vec::new();
    let mut functions = Vec::new();
    for p in file.into_inner() {
        match p.as_rule() {
            Rule::kernel => kernels.push(build_kernel(p)?),
            Rule::function => functions.push(build_function(p)?),
            Rule::EOI => {}
            _ => return Err(internal(span_of(&p), "unexpected item")),
        }
    }
    Ok(Module { kernels, functions })
}

fn build_function(p: Pair<'_, Rule>) -> R<FnDef> {
    let span = span_of(&p);
    let mut c = Children::of(p);
    c.expect(Rule::kw_fn)?;
    let name = ident(c.expect(Rule::ident)?)?;
    let mut params = Vec::new();
    for pp in c.expect(Rule::fn_params)?.into_inner() {
        params.push(ident(pp)?);
    }
    let body = build_block(c.expect(Rule::block)?)?;
    Ok(FnDef {
        name,
        params,
        body,
        span,
    })
}

fn build_kernel(p: Pair<'_, Rule>) -> R<Kernel> {
    let span = span_of(&p);
    let mut c = Children::of(p);
    c.expect(Rule::kw_kernel)?;
    let name = ident(c.expect(Rule::ident)?)?;
    let mut generics = Vec::new();
    if let Some(g) = c.take_if(Rule::generics) {
        for gp in g.into_inner() {
            generics.push(build_generic(gp)?);
        }
    }
    let mut params = Vec::new();
    for pp in c.expect(Rule::params)?.into_inner() {
        params.push(build_param(pp)?);
    }
    let body = build_block(c.expect(Rule::block)?)?;
    Ok(Kernel {
        name,
        generics,
        params,
        body,
        span,
    })
}

fn build_generic(p: Pair<'_, Rule>) -> R<GenericParam> {
    let span = span_of(&p);
    let mut c = Children::of(p);
    let name = ident(c.expect(Rule::ident)?)?;
    let kind_id = ident(c.expect(Rule::ident)?)?;
    let kind = match kind_id.name.as_str() {
        "int" => GenericKind::Int,
        "bool" => GenericKind::Bool,
        "dtype" => GenericKind::DType,
        "float" => GenericKind::Float,
        other => match crate::types::DType::from_name(other) {
            Some(d) if d.is_float() => GenericKind::FloatValue(d),
            Some(d) => {
                return Err(Diagnostic::error(
                    ErrorCode::Syntax,
                    kind_id.span,
                    format!("a compile-time parameter cannot have the dtype `{d}`"),
                )
                .with_label_message("expected `int`, `bool`, `dtype`, `float`, or a float dtype")
                .with_note(format!(
                    "help: for a compile-time integer write `{}: int` (it adapts to the dtype it meets, as a literal does)",
                    name.name
                ))
                .with_note("compile-time values of a dtype are floats: `EPS: f32 = 1e-5` (f16, bf16 or f32)"));
            }
            None => {
                return Err(Diagnostic::error(
                    ErrorCode::Syntax,
                    kind_id.span,
                    format!("unknown compile-time parameter kind `{other}`"),
                )
                .with_label_message("expected `int`, `bool`, `dtype`, `float`, or a float dtype")
                .with_note("a compile-time parameter is written `NAME: KIND` or `NAME: KIND = DEFAULT`, e.g. `BLOCK: int = 1024` or `EPS: f32 = 1e-5`"));
            }
        },
    };
    let default = match c.take_if(Rule::expr) {
        Some(e) => Some(build_expr(e, 0)?.e),
        None => None,
    };
    Ok(GenericParam {
        name,
        kind,
        kind_span: kind_id.span,
        default,
        span,
    })
}

fn build_param(p: Pair<'_, Rule>) -> R<Param> {
    let span = span_of(&p);
    let mut c = Children::of(p);
    let name = ident(c.expect(Rule::ident)?)?;
    let tp = c.next("parameter type")?;
    let ty = match tp.as_rule() {
        Rule::ident => ParamType::Scalar(ident(tp)?),
        Rule::tensor_type => ParamType::Tensor(build_tensor_type(tp)?),
        _ => return Err(internal(span_of(&tp), "unexpected parameter type")),
    };
    Ok(Param { name, ty, span })
}

fn build_tensor_type(p: Pair<'_, Rule>) -> R<TensorType> {
    let span = span_of(&p);
    let mut c = Children::of(p);
    c.expect(Rule::kw_tensor)?;
    let elem = ident(c.expect(Rule::ident)?)?;
    let d = c.next("tensor dimensions")?;
    let dims = match d.as_rule() {
        Rule::number => {
            let sp = span_of(&d);
            match parse_number(d.as_str(), sp)? {
                Lit::Int(v) => match u32::try_from(v) {
                    Ok(r) => TensorDims::Rank(r, sp),
                    Err(_) => {
                        return Err(Diagnostic::error(
                            ErrorCode::BadLiteral,
                            sp,
                            format!("tensor rank `{}` is too large", d.as_str()),
                        ))
                    }
                },
                Lit::Float(_) => {
                    return Err(Diagnostic::error(
                        ErrorCode::Syntax,
                        sp,
                        "expected a tensor rank (an integer) or a dimension list `[...]`",
                    )
                    .with_label_message("a float is not a rank"))
                }
            }
        }
        Rule::dim_list => {
            let mut list = Vec::new();
            for e in d.into_inner() {
                list.push(match e.as_rule() {
                    Rule::dyn_dim => DimSpec::Dynamic(span_of(&e)),
                    Rule::expr => DimSpec::Const(build_expr(e, 0)?.e),
                    _ => return Err(internal(span_of(&e), "unexpected dimension")),
                });
            }
            TensorDims::List(list)
        }
        _ => return Err(internal(span_of(&d), "unexpected tensor dimensions")),
    };
    let contiguous = c.take_if(Rule::kw_contiguous).is_some();
    Ok(TensorType {
        elem,
        dims,
        contiguous,
        span,
    })
}

fn build_block(p: Pair<'_, Rule>) -> R<Block> {
    let span = span_of(&p);
    let mut stmts = Vec::new();
    for s in p.into_inner() {
        stmts.push(build_stmt(s)?);
    }
    Ok(Block { stmts, span })
}

fn build_stmt(p: Pair<'_, Rule>) -> R<Stmt> {
    let span = span_of(&p);
    match p.as_rule() {
        Rule::let_stmt => {
            let mut c = Children::of(p);
            c.expect(Rule::kw_let)?;
            let mutable = c.take_if(Rule::kw_mut).is_some();
            if let Some(list) = c.take_if(Rule::let_names) {
                let names = list.into_inner().map(ident).collect::<R<Vec<_>>>()?;
                if let Some(t) = c.take_if(Rule::let_type) {
                    return Err(Diagnostic::error(
                        ErrorCode::Syntax,
                        span_of(&t),
                        "`let [a, b]` takes no type annotation: annotate the values instead",
                    ));
                }
                let value = build_expr(c.expect(Rule::expr)?, 0)?.e;
                return Ok(Stmt::LetList {
                    names,
                    mutable,
                    value,
                    span,
                });
            }
            let name = ident(c.expect(Rule::ident)?)?;
            let ty = match c.take_if(Rule::let_type) {
                Some(t) => Some(ident(Children::of(t).expect(Rule::ident)?)?),
                None => None,
            };
            let value = build_expr(c.expect(Rule::expr)?, 0)?.e;
            Ok(Stmt::Let {
                name,
                mutable,
                ty,
                value,
                span,
            })
        }
        Rule::assign_stmt => {
            let mut c = Children::of(p);
            let target = ident(c.expect(Rule::ident)?)?;
            let op_pair = c.expect(Rule::assign_op)?;
            let op = match op_pair.as_str() {
                "=" => None,
                s => match bin_op_of(s.strip_suffix('=').unwrap_or(s)) {
                    Some(op) => Some(op),
                    None => return Err(internal(span_of(&op_pair), "unknown assignment")),
                },
            };
            let value = build_expr(c.expect(Rule::expr)?, 0)?.e;
            Ok(Stmt::Assign {
                target,
                op,
                value,
                span,
            })
        }
        Rule::expr_stmt => {
            let mut c = Children::of(p);
            Ok(Stmt::Expr(build_expr(c.expect(Rule::expr)?, 0)?.e))
        }
        Rule::static_assert => {
            let mut c = Children::of(p);
            c.expect(Rule::kw_static_assert)?;
            let cond = build_expr(c.expect(Rule::expr)?, 0)?.e;
            let message = match c.take_if(Rule::string) {
                Some(s) => Some(unescape(s.as_str(), span_of(&s))?),
                None => None,
            };
            Ok(Stmt::StaticAssert {
                cond,
                message,
                span,
            })
        }
        Rule::for_stmt => build_for(p),
        Rule::if_stmt => build_if(p),
        Rule::return_stmt => {
            let mut c = Children::of(p);
            c.expect(Rule::kw_return)?;
            let value = build_expr(c.expect(Rule::expr)?, 0)?.e;
            Ok(Stmt::Return { value, span })
        }
        _ => Err(internal(span, "unexpected statement")),
    }
}

fn build_for(p: Pair<'_, Rule>) -> R<Stmt> {
    let span = span_of(&p);
    let mut c = Children::of(p);
    c.expect(Rule::kw_for)?;
    let var = ident(c.expect(Rule::ident)?)?;
    c.expect(Rule::kw_in)?;
    let first = build_expr(c.expect(Rule::expr)?, 0)?.e;
    let (start, end, step) = if c.take_if(Rule::range_dots).is_some() {
        let end = build_expr(c.expect(Rule::expr)?, 0)?.e;
        (first, end, None)
    } else {
        range_call(first)?
    };
    let body = build_block(c.expect(Rule::block)?)?;
    Ok(Stmt::For {
        var,
        start,
        end,
        step,
        body,
        span,
    })
}

/// `range(a, b)` / `range(a, b, step)` → its bounds; anything else is an error.
fn range_call(e: Expr) -> R<(Expr, Expr, Option<Expr>)> {
    let bad = |span: Span| {
        Diagnostic::error(
            ErrorCode::Syntax,
            span,
            "expected a range: `start..end`, `range(start, end)` or `range(start, end, step)`",
        )
        .with_label_message("not a range")
    };
    let span = e.span;
    match e.kind {
        ExprKind::Call {
            func,
            args,
            method_syntax: false,
        } if func.name == "range" => {
            if let Some(kw) = args.iter().find_map(|a| a.name.as_ref()) {
                return Err(Diagnostic::error(
                    ErrorCode::Syntax,
                    kw.span,
                    "`range` takes no keyword arguments",
                ));
            }
            let mut it = args.into_iter().map(|a| a.value);
            match (it.next(), it.next(), it.next(), it.next()) {
                (Some(a), Some(b), step, None) => Ok((a, b, step)),
                _ => Err(bad(span).with_note("`range` takes 2 or 3 arguments")),
            }
        }
        _ => Err(bad(span)),
    }
}

fn build_if(p: Pair<'_, Rule>) -> R<Stmt> {
    let span = span_of(&p);
    let mut c = Children::of(p);
    c.expect(Rule::kw_if)?;
    let cond = build_expr(c.expect(Rule::expr)?, 0)?.e;
    let then_block = build_block(c.expect(Rule::block)?)?;
    let else_block = if c.take_if(Rule::kw_else).is_some() {
        let e = c.next("else branch")?;
        match e.as_rule() {
            Rule::block => Some(build_block(e)?),
            Rule::if_stmt => {
                let sp = span_of(&e);
                Some(Block {
                    stmts: vec![build_if(e)?],
                    span: sp,
                })
            }
            _ => return Err(internal(span_of(&e), "unexpected else branch")),
        }
    } else {
        None
    };
    Ok(Stmt::If {
        cond,
        then_block,
        else_block,
        span,
    })
}

fn unescape(raw: &str, span: Span) -> R<String> {
    let inner = raw
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or_else(|| internal(span, "malformed string"))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(ch) = chars.next() {
        if ch != '\\' {
            out.push(ch);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            other => {
                let shown = other.map_or(String::new(), |c| c.to_string());
                return Err(Diagnostic::error(
                    ErrorCode::BadLiteral,
                    span,
                    format!("unknown escape `\\{shown}` in string literal"),
                )
                .with_note("supported escapes: `\\n`, `\\t`, `\\\\`, `\\\"`"));
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- literals

pub(crate) enum Lit {
    Int(i128),
    Float(f64),
}

/// Validates a `number` token. Integers must fit in 64 bits (unsigned), so that every
/// i32/u32/i64 value and bit pattern can be written; the checker range-checks them
/// against the dtype they take.
pub(crate) fn parse_number(text: &str, span: Span) -> R<Lit> {
    let bad = |msg: String| Diagnostic::error(ErrorCode::BadLiteral, span, msg);
    let too_large = || {
        bad(format!("integer literal `{text}` is too large"))
            .with_label_message("does not fit in 64 bits")
    };
    let (digits, radix) = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None => (text, 10),
    };
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    if radix == 16 {
        if clean.is_empty() || !clean.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad(format!("invalid hexadecimal literal `{text}`")));
        }
        return match u64::from_str_radix(&clean, 16) {
            Ok(v) => Ok(Lit::Int(i128::from(v))),
            Err(_) => Err(too_large()),
        };
    }
    if clean.chars().all(|c| c.is_ascii_digit()) {
        return match clean.parse::<u64>() {
            Ok(v) => Ok(Lit::Int(i128::from(v))),
            Err(_) => Err(too_large()),
        };
    }
    if is_float_syntax(&clean) {
        return match clean.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Lit::Float(v)),
            _ => Err(bad(format!("float literal `{text}` is out of range"))
                .with_label_message("does not fit in f64")),
        };
    }
    Err(bad(format!("invalid number literal `{text}`")).with_note(
        "numbers are written `42`, `0x2A`, `1_000`, `1.0`, `1e-6` or `2.5e3`; they take no suffix",
    ))
}

/// `D+ (. D+)? ([eE] [+-]? D+)?` with a fraction or an exponent.
fn is_float_syntax(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i > start
    };
    if !digits(&mut i) {
        return false;
    }
    let mut special = false;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        if !digits(&mut i) {
            return false;
        }
        special = true;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        if !digits(&mut i) {
            return false;
        }
        special = true;
    }
    special && i == b.len()
}

// ---------------------------------------------------------------- expressions

/// An expression with the depth of its tree.
struct E {
    e: Expr,
    depth: u32,
}

fn too_deep(span: Span) -> Diagnostic {
    Diagnostic::error(
        ErrorCode::Syntax,
        span,
        format!("expression is nested too deeply (more than {MAX_EXPR_DEPTH} levels)"),
    )
    .with_note("split it into several `let` statements")
}

fn mk(kind: ExprKind, span: Span, depth: u32) -> R<E> {
    if depth > MAX_EXPR_DEPTH {
        return Err(too_deep(span));
    }
    Ok(E {
        e: Expr { kind, span },
        depth,
    })
}

pub(crate) fn bin_op_of(s: &str) -> Option<BinOp> {
    use BinOp::*;
    Some(match s {
        "+" => Add,
        "-" => Sub,
        "*" => Mul,
        "/" => Div,
        "%" => Rem,
        "==" => Eq,
        "!=" => Ne,
        "<" => Lt,
        "<=" => Le,
        ">" => Gt,
        ">=" => Ge,
        "&&" => And,
        "||" => Or,
        "&" => BitAnd,
        "|" => BitOr,
        "^" => BitXor,
        "<<" => Shl,
        ">>" => Shr,
        "**" => Pow,
        _ => return None,
    })
}

/// Binding power, Rust's: `||` < `&&` < comparisons < `|` < `^` < `&` < shifts <
/// `+ -` < `* / %`; then `**` (Python's), which `build_expr` groups before the others.
fn prec(op: BinOp) -> u8 {
    use BinOp::*;
    match op {
        Or => 1,
        And => 2,
        Eq | Ne | Lt | Le | Gt | Ge => 3,
        BitOr => 4,
        BitXor => 5,
        BitAnd => 6,
        Shl | Shr => 7,
        Add | Sub => 8,
        Mul | Div | Rem => 9,
        Pow => 10,
    }
}

fn is_comparison(op: BinOp) -> bool {
    prec(op) == 3
}

/// One element of an `expr` pair's flat sequence.
enum Item<'i> {
    /// An operand not yet built: `unary_op* primary (method_call | property | cast)*`.
    Raw(Vec<Pair<'i, Rule>>),
    /// An operand built already (a `**` chain).
    Built(E),
    Op(BinOp, Span),
}

/// Builds an `expr` pair. `depth` is the nesting depth of the context (parentheses,
/// call arguments) so that the limit covers the whole tree.
fn build_expr(p: Pair<'_, Rule>, depth: u32) -> R<E> {
    let span = span_of(&p);
    if p.as_rule() != Rule::expr {
        return Err(internal(span, "expected an expression"));
    }
    if depth > MAX_EXPR_DEPTH {
        return Err(too_deep(span));
    }
    // Split the flat sequence into operands (unary ops, primary, postfix ops) and
    // binary operators.
    let mut operands: Vec<Vec<Pair<'_, Rule>>> = Vec::new();
    let mut ops: Vec<(BinOp, Span)> = Vec::new();
    let mut cur: Vec<Pair<'_, Rule>> = Vec::new();
    for q in p.into_inner() {
        if q.as_rule() == Rule::bin_op {
            let sp = span_of(&q);
            let op = bin_op_of(q.as_str()).ok_or_else(|| internal(sp, "unknown operator"))?;
            operands.push(std::mem::take(&mut cur));
            ops.push((op, sp));
        } else {
            cur.push(q);
        }
    }
    operands.push(cur);
    // `**` chains become one operand each, before the other operators are climbed.
    let mut items: Vec<Item<'_>> = Vec::new();
    let mut operands = operands.into_iter();
    let mut ops = ops.into_iter().peekable();
    while let Some(first) = operands.next() {
        let mut chain = vec![first];
        while let Some(&(BinOp::Pow, _)) = ops.peek() {
            ops.next();
            chain.push(
                operands
                    .next()
                    .ok_or_else(|| internal(span, "expected an operand"))?,
            );
        }
        items.push(if chain.len() == 1 {
            Item::Raw(chain.pop().unwrap_or_default())
        } else {
            Item::Built(build_pow_chain(chain, depth, span)?)
        });
        if let Some((op, sp)) = ops.next() {
            items.push(Item::Op(op, sp));
        }
    }
    let mut items = items.into_iter().peekable();
    climb(&mut items, 0, depth, span)
}

type Items<'i> = std::iter::Peekable<std::vec::IntoIter<Item<'i>>>;

/// Precedence climbing over the flat sequence. Left-associative; iterative along a
/// chain of equal-precedence operators, recursive only across precedence levels.
fn climb(items: &mut Items<'_>, min_prec: u8, depth: u32, whole: Span) -> R<E> {
    let mut lhs = match items.next() {
        Some(Item::Raw(ps)) => build_operand(ps, depth, whole)?,
        Some(Item::Built(e)) => e,
        _ => return Err(internal(whole, "expected an operand")),
    };
    let mut last_cmp = false;
    while let Some(Item::Op(op, op_span)) = items.peek() {
        let (op, op_span) = (*op, *op_span);
        let pr = prec(op);
        if pr < min_prec {
            break;
        }
        if is_comparison(op) && last_cmp {
            return Err(Diagnostic::error(
                ErrorCode::Syntax,
                op_span,
                "comparison operators cannot be chained",
            )
            .with_label_message("second comparison here")
            .with_note("use parentheses or `&&`: `(a < b) && (b < c)`"));
        }
        items.next();
        let rhs = climb(items, pr + 1, depth, whole)?;
        let span = lhs.e.span.to(rhs.e.span);
        let d = lhs.depth.max(rhs.depth) + 1;
        last_cmp = is_comparison(op);
        lhs = mk(
            ExprKind::Binary {
                op,
                lhs: Box::new(lhs.e),
                rhs: Box::new(rhs.e),
            },
            span,
            d,
        )?;
    }
    Ok(lhs)
}

/// `o1 ** o2 ** ... ** on`, Python's way: right to left, and each operand's prefix
/// operators apply to the power it starts (`-x ** 2` is `-(x ** 2)`, `2 ** -x` is
/// `2 ** (-x)`). A cast in a chain could bind either way (`x as f32 ** 2`): an error.
fn build_pow_chain(chain: Vec<Vec<Pair<'_, Rule>>>, depth: u32, whole: Span) -> R<E> {
    if let Some(c) = chain.iter().flatten().find(|q| q.as_rule() == Rule::cast) {
        return Err(Diagnostic::error(
            ErrorCode::Syntax,
            span_of(c),
            "`as` cannot be mixed with `**` without parentheses",
        )
        .with_label_message("this cast")
        .with_note("help: write `(x as f32) ** y` or `(x ** y) as f32`"));
    }
    let mut rev = chain.into_iter().rev();
    let last = rev
        .next()
        .ok_or_else(|| internal(whole, "expected an operand"))?;
    let mut acc = build_operand(last, depth, whole)?;
    for ps in rev {
        let split = ps
            .iter()
            .position(|q| q.as_rule() != Rule::unary_op)
            .unwrap_or(ps.len());
        let mut ps = ps;
        let core = ps.split_off(split);
        let base = build_operand(core, depth, whole)?;
        let span = base.e.span.to(acc.e.span);
        let d = base.depth.max(acc.depth) + 1;
        acc = mk(
            ExprKind::Binary {
                op: BinOp::Pow,
                lhs: Box::new(base.e),
                rhs: Box::new(acc.e),
            },
            span,
            d,
        )?;
        acc = apply_prefixes(acc, ps)?;
    }
    Ok(acc)
}

/// Applies prefix operators (in source order) to `e`, innermost (last written) first.
fn apply_prefixes(mut e: E, prefixes: Vec<Pair<'_, Rule>>) -> R<E> {
    for q in prefixes.into_iter().rev() {
        let op = match q.as_str() {
            "-" => UnOp::Neg,
            "!" => UnOp::Not,
            _ => return Err(internal(span_of(&q), "unknown unary operator")),
        };
        let span = span_of(&q).to(e.e.span);
        let d = e.depth + 1;
        e = mk(
            ExprKind::Unary {
                op,
                operand: Box::new(e.e),
            },
            span,
            d,
        )?;
    }
    Ok(e)
}

/// `unary_op* primary (method_call | property | cast)*`. Method calls and properties
/// bind tighter than unary operators, which bind tighter than `as` (Rust's order):
/// `-x.f() as T` is `(-(x.f())) as T`. Postfix operators after the first cast apply to
/// the whole.
fn build_operand(ps: Vec<Pair<'_, Rule>>, depth: u32, whole: Span) -> R<E> {
    let mut it = ps.into_iter().peekable();
    let mut prefixes = Vec::new();
    while let Some(q) = it.next_if(|q| q.as_rule() == Rule::unary_op) {
        prefixes.push(q);
    }
    let prim = it
        .next()
        .ok_or_else(|| internal(whole, "missing operand"))?;
    let mut e = build_primary(prim, depth)?;
    // Method calls and properties directly on the primary.
    while let Some(q) = it.next_if(|q| matches!(q.as_rule(), Rule::method_call | Rule::property)) {
        e = build_postfix(e, q, depth)?;
    }
    e = apply_prefixes(e, prefixes)?;
    for q in it {
        e = match q.as_rule() {
            Rule::method_call | Rule::property => build_postfix(e, q, depth)?,
            Rule::cast => {
                let sp = span_of(&q);
                let mut c = Children::of(q);
                c.expect(Rule::kw_as)?;
                let dtype = ident(c.expect(Rule::ident)?)?;
                let span = e.e.span.to(sp);
                let d = e.depth + 1;
                mk(
                    ExprKind::Cast {
                        expr: Box::new(e.e),
                        dtype,
                    },
                    span,
                    d,
                )?
            }
            _ => return Err(internal(span_of(&q), "unexpected postfix operator")),
        };
    }
    Ok(e)
}

/// The only property: `.dtype`.
pub const PROPERTIES: &[&str] = &["dtype"];

/// A method call `x.f(args)`, or a property `x.dtype` (the call `dtype(x)`).
fn build_postfix(recv: E, q: Pair<'_, Rule>, depth: u32) -> R<E> {
    if q.as_rule() == Rule::method_call {
        return build_method(recv, q, depth);
    }
    let sp = span_of(&q);
    let func = ident(Children::of(q).expect(Rule::ident)?)?;
    if !PROPERTIES.contains(&func.name.as_str()) {
        return Err(Diagnostic::error(
            ErrorCode::Syntax,
            func.span,
            format!("`.{}` is not a property", func.name),
        )
        .with_label_message("no such property")
        .with_note("the only property is `.dtype` (the dtype of a tensor, tile or scalar)")
        .with_note(format!(
            "help: to call a function as a method, add the arguments: `.{}(...)`",
            func.name
        )));
    }
    let span = recv.e.span.to(sp);
    let d = recv.depth + 1;
    mk(
        ExprKind::Call {
            func,
            args: vec![Arg {
                name: None,
                value: recv.e,
            }],
            method_syntax: true,
        },
        span,
        d,
    )
}

fn build_method(recv: E, q: Pair<'_, Rule>, depth: u32) -> R<E> {
    let sp = span_of(&q);
    let mut c = Children::of(q);
    let func = ident(c.expect(Rule::ident)?)?;
    let mut args = vec![Arg {
        name: None,
        value: recv.e,
    }];
    let mut d = recv.depth;
    for a in c.inner {
        let (arg, ad) = build_arg(a, depth)?;
        d = d.max(ad);
        args.push(arg);
    }
    let span = args.first().map_or(sp, |a| a.value.span).to(sp);
    mk(
        ExprKind::Call {
            func,
            args,
            method_syntax: true,
        },
        span,
        d + 1,
    )
}

fn build_arg(a: Pair<'_, Rule>, depth: u32) -> R<(Arg, u32)> {
    match a.as_rule() {
        Rule::kwarg => {
            let mut c = Children::of(a);
            let name = ident(c.expect(Rule::ident)?)?;
            let v = build_expr(c.expect(Rule::expr)?, depth + 1)?;
            Ok((
                Arg {
                    name: Some(name),
                    value: v.e,
                },
                v.depth,
            ))
        }
        Rule::expr => {
            let v = build_expr(a, depth + 1)?;
            Ok((
                Arg {
                    name: None,
                    value: v.e,
                },
                v.depth,
            ))
        }
        _ => Err(internal(span_of(&a), "unexpected argument")),
    }
}

fn build_primary(p: Pair<'_, Rule>, depth: u32) -> R<E> {
    let span = span_of(&p);
    match p.as_rule() {
        Rule::number => match parse_number(p.as_str(), span)? {
            Lit::Int(v) => mk(ExprKind::Int(v), span, 1),
            Lit::Float(v) => mk(ExprKind::Float(v), span, 1),
        },
        Rule::bool_lit => {
            let v = Children::of(p).next("boolean")?.as_rule() == Rule::kw_true;
            mk(ExprKind::Bool(v), span, 1)
        }
        Rule::name => {
            let id = ident(Children::of(p).expect(Rule::ident)?)?;
            mk(ExprKind::Name(id), span, 1)
        }
        Rule::paren => {
            // Parentheses leave no node; the inner expression takes their span, so that
            // an enclosing node's span covers them.
            let inner = Children::of(p).expect(Rule::expr)?;
            let mut e = build_expr(inner, depth + 1)?;
            e.e.span = span;
            e.depth += 1;
            if e.depth > MAX_EXPR_DEPTH {
                return Err(too_deep(span));
            }
            Ok(e)
        }
        Rule::list => {
            let mut items = Vec::new();
            let mut d = 0;
            for q in p.into_inner() {
                let v = build_expr(q, depth + 1)?;
                d = d.max(v.depth);
                items.push(v.e);
            }
            mk(ExprKind::List(items), span, d + 1)
        }
        Rule::call => {
            let mut c = Children::of(p);
            let func = ident(c.expect(Rule::ident)?)?;
            let mut args = Vec::new();
            let mut d = 0;
            while c.peek_rule().is_some() {
                let (arg, ad) = build_arg(c.next("argument")?, depth)?;
                d = d.max(ad);
                args.push(arg);
            }
            mk(
                ExprKind::Call {
                    func,
                    args,
                    method_syntax: false,
                },
                span,
                d + 1,
            )
        }
        _ => Err(internal(span, "unexpected expression")),
    }
}
