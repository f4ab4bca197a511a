//! The `.kg` front end: a pest grammar (`grammar.pest`) and the parser that builds
//! [`ast::Module`] with spans.
//!
//! [`parse`] runs in three steps:
//! 1. a pre-scan of the raw text ([`prescan`]): comments and strings must be closed,
//!    brackets `( [ {` must balance and nest at most [`MAX_NESTING`] deep. This bounds
//!    every recursion that follows (pest's and the AST builder's), so no input can
//!    overflow the stack, and it gives precise "unclosed `{`" errors;
//! 2. pest, with its error details on; a failure is translated into one diagnostic
//!    in words ("expected `;` after statement, found keyword `let`"), see [`syntax_error`];
//! 3. the AST builder (`parse.rs`), which validates literals (`ErrorCode::BadLiteral`)
//!    and the few rules the grammar leaves open (generic kinds, `for` ranges, chained
//!    comparisons, expression depth).
//!
//! Guarantees: never panics; every diagnostic's primary span lies within the text and
//! on char boundaries. Assumes nothing about the input (any UTF-8 string).

pub mod ast;
mod parse;
pub mod print;
#[cfg(test)]
mod tests;

use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::span::{SourceFile, Span};
use parse::{KgParser, Rule};
use pest::Parser;

pub use parse::MAX_EXPR_DEPTH;

/// The deepest bracket nesting accepted (`(`, `[`, `{` together).
pub const MAX_NESTING: usize = 256;

/// Parses a `.kg` file. Syntax errors come back as located diagnostics; never panics.
pub fn parse(file: &SourceFile) -> Result<ast::Module, Diagnostics> {
    let text = file.text.as_str();
    if text.len() >= u32::MAX as usize {
        return Err(Diagnostics::single(Diagnostic::error(
            ErrorCode::Syntax,
            Span::DUMMY,
            "source file is too large (4 GiB or more)",
        )));
    }
    let scan = prescan(text).map_err(Diagnostics::single)?;
    // Collecting the expected tokens (pest's error detail) gives much better messages
    // but costs more than half of the parse: parse without it, and only when that fails
    // parse again with it, for the diagnostic.
    pest::set_error_detail(false);
    let pairs = match KgParser::parse(Rule::file, text) {
        Ok(p) => p,
        Err(_) => {
            pest::set_error_detail(true);
            let detailed = KgParser::parse(Rule::file, text);
            pest::set_error_detail(false);
            return Err(Diagnostics::single(match detailed {
                Err(e) => syntax_error(text, &scan, &e),
                Ok(_) => Diagnostic::error(
                    ErrorCode::Syntax,
                    Span::DUMMY,
                    "internal parse error: the text parses only with error detail on",
                ),
            }));
        }
    };
    let mut pairs = pairs;
    let file_pair = pairs.next().ok_or_else(|| {
        Diagnostics::single(Diagnostic::error(
            ErrorCode::Syntax,
            Span::DUMMY,
            "internal parse error: empty parse",
        ))
    })?;
    parse::build_file(file_pair).map_err(Diagnostics::single)
}

// ---------------------------------------------------------------- pre-scan

/// What the pre-scan learned: byte ranges of comments (to step over them when looking
/// for the previous token).
struct Scan {
    comments: Vec<(usize, usize)>,
}

fn delim_name(c: char) -> &'static str {
    match c {
        '(' => "`(`",
        ')' => "`)`",
        '[' => "`[`",
        ']' => "`]`",
        '{' => "`{`",
        _ => "`}`",
    }
}

fn closer_of(c: char) -> char {
    match c {
        '(' => ')',
        '[' => ']',
        _ => '}',
    }
}

/// Checks comments, strings and bracket balance and depth on the raw text.
fn prescan(text: &str) -> Result<Scan, Diagnostic> {
    let bytes = text.as_bytes();
    let mut comments = Vec::new();
    let mut stack: Vec<(char, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                let end = text[i..].find('\n').map_or(text.len(), |n| i + n);
                comments.push((i, end));
                i = end;
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let Some(n) = text[i + 2..].find("*/") else {
                    return Err(Diagnostic::error(
                        ErrorCode::Syntax,
                        Span::new(i, i + 2),
                        "unterminated block comment",
                    )
                    .with_label_message("this comment is never closed with `*/`")
                    .with_note("block comments do not nest"));
                };
                let end = i + 2 + n + 2;
                comments.push((i, end));
                i = end;
                continue;
            }
            b'"' => {
                let mut j = i + 1;
                loop {
                    match bytes.get(j) {
                        Some(b'"') => break,
                        Some(b'\\') => j += 2,
                        Some(b'\n') | None => {
                            return Err(Diagnostic::error(
                                ErrorCode::Syntax,
                                Span::new(i, i + 1),
                                "unterminated string literal",
                            )
                            .with_label_message("this string is never closed")
                            .with_note("a string literal must end with `\"` on the same line"));
                        }
                        Some(_) => j += 1,
                    }
                }
                i = j + 1;
                continue;
            }
            b'(' | b'[' | b'{' => {
                stack.push((b as char, i));
                if stack.len() > MAX_NESTING {
                    return Err(Diagnostic::error(
                        ErrorCode::Syntax,
                        Span::new(i, i + 1),
                        format!("brackets are nested too deeply (more than {MAX_NESTING} levels)"),
                    )
                    .with_label_message("this one is too deep"));
                }
            }
            b')' | b']' | b'}' => {
                let c = b as char;
                match stack.pop() {
                    Some((open, _)) if closer_of(open) == c => {}
                    Some((open, at)) => {
                        return Err(Diagnostic::error(
                            ErrorCode::Syntax,
                            Span::new(i, i + 1),
                            format!("mismatched closing delimiter {}", delim_name(c)),
                        )
                        .with_label_message(format!(
                            "expected {} here",
                            delim_name(closer_of(open))
                        ))
                        .with_secondary(
                            Span::new(at, at + 1),
                            format!("unclosed {}", delim_name(open)),
                        ));
                    }
                    None => {
                        return Err(Diagnostic::error(
                            ErrorCode::Syntax,
                            Span::new(i, i + 1),
                            format!("unexpected closing delimiter {}", delim_name(c)),
                        )
                        .with_label_message("no opening delimiter matches this"));
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    if let Some(&(open, at)) = stack.last() {
        let mut d = Diagnostic::error(
            ErrorCode::Syntax,
            Span::new(at, at + 1),
            format!("unclosed {}", delim_name(open)),
        )
        .with_label_message(format!(
            "this {} is never closed before the end of the file",
            delim_name(open)
        ));
        for &(o, a) in stack.iter().rev().skip(1) {
            d = d.with_secondary(
                Span::new(a, a + 1),
                format!("{} also unclosed", delim_name(o)),
            );
        }
        return Err(d);
    }
    Ok(Scan { comments })
}

// ---------------------------------------------------------------- syntax errors

const KEYWORDS: &[&str] = &[
    "kernel",
    "let",
    "mut",
    "for",
    "in",
    "if",
    "else",
    "as",
    "true",
    "false",
    "tensor",
    "contiguous",
    "static_assert",
];

const OPERATORS: &[&str] = &[
    "||", "&&", "==", "!=", "<<", ">>", "<=", ">=", "<", ">", "|", "^", "&", "+", "-", "*", "/",
    "%", "!", ".",
];

/// What the parser was looking for, in words a user understands.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Expected {
    Statement,
    Expression,
    Identifier,
    Type,
    Number,
    Parameter,
    Generic,
    Dimension,
    StringLit,
    /// A punctuation token or keyword, shown in backticks.
    Token(&'static str),
    Kernel,
    Eof,
    /// Binary operator, method call or cast: shown only when nothing else fits.
    Operator,
}

impl Expected {
    fn words(&self) -> String {
        match self {
            Expected::Statement => "statement".into(),
            Expected::Expression => "expression".into(),
            Expected::Identifier => "identifier".into(),
            Expected::Type => "type".into(),
            Expected::Number => "integer".into(),
            Expected::Parameter => "parameter".into(),
            Expected::Generic => "compile-time parameter".into(),
            Expected::Dimension => "dimension (`_` or a constant expression)".into(),
            Expected::StringLit => "string literal".into(),
            Expected::Token(t) => format!("`{t}`"),
            Expected::Kernel => "`kernel`".into(),
            Expected::Eof => "end of file".into(),
            Expected::Operator => "operator".into(),
        }
    }
}

fn rule_expected(r: Rule) -> Option<Expected> {
    use Expected as X;
    Some(match r {
        Rule::expr
        | Rule::paren
        | Rule::list
        | Rule::call
        | Rule::bool_lit
        | Rule::name
        | Rule::unary_op
        | Rule::kwarg
        | Rule::kw_true
        | Rule::kw_false => X::Expression,
        Rule::number => X::Number,
        Rule::ident => X::Identifier,
        Rule::bin_op | Rule::method_call | Rule::cast | Rule::kw_as => X::Operator,
        Rule::let_stmt
        | Rule::assign_stmt
        | Rule::expr_stmt
        | Rule::static_assert
        | Rule::for_stmt
        | Rule::if_stmt => X::Statement,
        Rule::kw_let => X::Token("let"),
        Rule::kw_for => X::Token("for"),
        Rule::kw_if => X::Token("if"),
        Rule::kw_static_assert => X::Token("static_assert"),
        Rule::kernel | Rule::kw_kernel | Rule::file => X::Kernel,
        Rule::EOI => X::Eof,
        Rule::generics => X::Token("<"),
        Rule::params => X::Token("("),
        Rule::block => X::Token("{"),
        Rule::generic => X::Generic,
        Rule::param => X::Parameter,
        Rule::tensor_type | Rule::kw_tensor => X::Type,
        Rule::dim_list => X::Token("["),
        Rule::dyn_dim => X::Dimension,
        Rule::let_type => X::Token(":"),
        Rule::assign_op => X::Token("="),
        Rule::range_dots => X::Token(".."),
        Rule::string => X::StringLit,
        Rule::kw_mut => X::Token("mut"),
        Rule::kw_in => X::Token("in"),
        Rule::kw_else => X::Token("else"),
        Rule::kw_contiguous => X::Token("contiguous"),
        _ => return None,
    })
}

fn token_expected(t: &str) -> Option<Expected> {
    use Expected as X;
    const PUNCT: &[&str] = &[
        ";", ",", ")", "]", "}", "{", "(", "[", ":", "=", ">", "<", "..",
    ];
    if let Some(p) = PUNCT.iter().find(|p| **p == t) {
        return Some(X::Token(p));
    }
    if OPERATORS.contains(&t) {
        return Some(X::Operator);
    }
    Some(match t {
        "true" | "false" => X::Expression,
        "kernel" => X::Kernel,
        "as" => X::Operator,
        "\"" => X::StringLit,
        _ => {
            let kw = KEYWORDS.iter().find(|k| **k == t)?;
            X::Token(kw)
        }
    })
}

/// The token found at `pos`, as (span, description).
fn found_token(text: &str, pos: usize) -> (Span, String) {
    let pos = floor_boundary(text, pos.min(text.len()));
    let rest = &text[pos..];
    let Some(c) = rest.chars().next() else {
        return (Span::new(text.len(), text.len()), "end of file".into());
    };
    let run = |pred: fn(char) -> bool| rest.find(|ch: char| !pred(ch)).unwrap_or(rest.len());
    if c.is_ascii_alphabetic() || c == '_' {
        let n = run(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        let w = &rest[..n];
        let desc = if KEYWORDS.contains(&w) {
            format!("keyword `{w}`")
        } else {
            format!("`{w}`")
        };
        return (Span::new(pos, pos + n), desc);
    }
    if c.is_ascii_digit() {
        let n = run(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '.');
        return (Span::new(pos, pos + n), format!("`{}`", &rest[..n]));
    }
    if c == '"' {
        let n = rest[1..].find('"').map_or(rest.len(), |k| k + 2);
        return (Span::new(pos, pos + n), "string literal".into());
    }
    const MULTI: &[&str] = &[
        "<<=", ">>=", "..", "||", "&&", "==", "!=", "<=", ">=", "<<", ">>", "+=", "-=", "*=", "/=",
        "%=", "&=", "|=", "^=",
    ];
    if let Some(m) = MULTI.iter().find(|m| rest.starts_with(**m)) {
        return (Span::new(pos, pos + m.len()), format!("`{m}`"));
    }
    let shown: String = if c.is_control() || c.is_whitespace() {
        c.escape_debug().collect()
    } else {
        c.to_string()
    };
    (Span::new(pos, pos + c.len_utf8()), format!("`{shown}`"))
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The end of the last token before `pos`, stepping back over whitespace and comments.
fn prev_token_end(text: &str, scan: &Scan, pos: usize) -> usize {
    let bytes = text.as_bytes();
    let mut i = pos.min(text.len());
    loop {
        while i > 0 && bytes[i - 1].is_ascii_whitespace() {
            i -= 1;
        }
        match scan.comments.iter().find(|&&(s, e)| s < i && i <= e) {
            Some(&(s, _)) => i = s,
            None => return i,
        }
    }
}

/// Whether `pos` lies after an unclosed `tensor<` (no `>`, `)` or `{` since).
fn inside_tensor_type(text: &str, pos: usize) -> bool {
    let before = text.get(..pos).unwrap_or("");
    let Some(t) = before.rfind("tensor") else {
        return false;
    };
    let rest = before.get(t + "tensor".len()..).unwrap_or("").trim_start();
    rest.starts_with('<') && !rest.contains(['>', ')', '{', ';'])
}

/// Whether `pos` splits a word (pest tried a keyword that is a prefix of a name).
fn mid_word(text: &str, pos: usize) -> bool {
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = text.as_bytes();
    pos > 0
        && bytes.get(pos).is_some_and(|&b| is_word(b))
        && bytes.get(pos - 1).is_some_and(|&b| is_word(b))
}

fn join_words(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {}", init.join(", "), last),
    }
}

/// Translates a pest error into one diagnostic worded for users.
///
/// pest reports the furthest position where a *rule* failed, with those rules; with
/// error details on it also records the literal tokens tried at the furthest position
/// overall. When the latter is further and names a real token (not just more
/// identifier characters), it is the better location: `x, y` in a parameter list
/// fails the `param` rule at `x`, but the actual problem is the missing `:` after it.
fn syntax_error(text: &str, scan: &Scan, err: &pest::error::Error<Rule>) -> Diagnostic {
    let mut pos = match err.location {
        pest::error::InputLocation::Pos(p) => p,
        pest::error::InputLocation::Span((s, _)) => s,
    }
    .min(text.len());
    let positives = match &err.variant {
        pest::error::ErrorVariant::ParsingError { positives, .. } => positives.clone(),
        pest::error::ErrorVariant::CustomError { message } => {
            let (found_span, _) = found_token(text, pos);
            return Diagnostic::error(
                ErrorCode::Syntax,
                found_span,
                format!("the parser gave up here: {message}"),
            )
            .with_note("the input is probably nested too deeply; simplify this expression");
        }
    };
    let mut tokens: Vec<String> = Vec::new();
    let mut tokens_at = usize::MAX;
    if let Some(att) = err.parse_attempts() {
        // `ParsingToken` is not exported; its text is the token itself.
        tokens = att
            .expected_tokens()
            .iter()
            .map(|t| t.to_string())
            .collect();
        tokens_at = att.max_position;
    }
    // Inside a binary-operator attempt, `<` and `>` are operators, not brackets.
    if tokens.iter().any(|t| t == "||") {
        tokens.retain(|t| t != "<" && t != ">");
    }
    let token_items: Vec<Expected> = tokens.iter().filter_map(|t| token_expected(t)).collect();
    let mut expected: Vec<Expected> = Vec::new();
    if tokens_at == pos {
        expected.extend(positives.into_iter().filter_map(rule_expected));
        expected.extend(token_items);
    } else if tokens_at > pos
        && tokens_at <= text.len()
        && !token_items.is_empty()
        && !mid_word(text, tokens_at)
    {
        pos = floor_boundary(text, tokens_at);
        expected = token_items;
    } else {
        expected.extend(positives.into_iter().filter_map(rule_expected));
    }
    let (found_span, found) = found_token(text, pos);
    // `let` is only ever expected where a statement may start; a statement position
    // is always inside a block, which may end there.
    if expected.contains(&Expected::Token("let")) {
        expected.retain(|x| {
            !matches!(
                x,
                Expected::Token("let" | "for" | "if" | "static_assert")
                    | Expected::Expression
                    | Expected::Identifier
            )
        });
        expected.push(Expected::Statement);
    }
    if expected.contains(&Expected::Statement) {
        expected.push(Expected::Token("}"));
    }
    expected.sort();
    expected.dedup();
    let found_kw = KEYWORDS.iter().find(|k| found == format!("keyword `{k}`"));
    let keyword_note = found_kw.is_some()
        && (expected.contains(&Expected::Identifier)
            || expected.contains(&Expected::Expression)
            || expected.contains(&Expected::Statement));
    // Tidy up: a statement includes expressions; an expression includes numbers,
    // names, `(` and `[`; operators and "end of file" are noise when something else
    // is possible.
    if [
        Expected::Expression,
        Expected::Statement,
        Expected::Dimension,
    ]
    .iter()
    .any(|x| expected.contains(x))
    {
        expected.retain(|x| {
            !matches!(
                x,
                Expected::Number
                    | Expected::Identifier
                    | Expected::Token("(")
                    | Expected::Token("[")
            )
        });
    }
    if expected.contains(&Expected::Statement) {
        // An empty statement `;` is allowed but never what the user meant.
        expected.retain(|x| *x != Expected::Expression && *x != Expected::Token(";"));
    }
    if expected.contains(&Expected::Type) {
        expected.retain(|x| *x != Expected::Identifier);
    }
    if expected.contains(&Expected::Dimension) {
        expected.retain(|x| *x != Expected::Expression);
    }
    if expected.len() > 1 && expected.contains(&Expected::Operator) {
        // After an operand: `(` only continues a call of a bare name; operators are
        // always possible there, and listing them hides the useful alternative.
        expected.retain(|x| *x != Expected::Operator && *x != Expected::Token("("));
    }
    if expected.len() > 1 {
        expected.retain(|x| *x != Expected::Operator && *x != Expected::Eof);
    }
    let words: Vec<String> = expected.iter().map(Expected::words).collect();
    let what = if words.is_empty() {
        "something else".to_string()
    } else {
        join_words(&words)
    };

    // A character that has no place anywhere in the language (`@`, `$`, `é`).
    let foreign = {
        let t = text.get(found_span.range()).unwrap_or("");
        let mut cs = t.chars();
        match (cs.next(), cs.next()) {
            (Some(c), None) => {
                !c.is_ascii_alphanumeric() && !"(){}[]<>,;:=+-*/%&|^!._\"".contains(c)
            }
            _ => false,
        }
    };
    let message = if found_kw == Some(&"else") && expected.contains(&Expected::Statement) {
        "`else` without a matching `if`".to_string()
    } else if foreign {
        format!("unexpected character {found}")
    } else if expected == [Expected::Token(";")] {
        format!("expected `;` after statement, found {found}")
    } else {
        format!("expected {what}, found {found}")
    };
    let label = if foreign {
        "not a kgen token".to_string()
    } else {
        format!("expected {what}")
    };

    // If the unexpected token starts a new line, the problem is at the end of the
    // previous one (a missing `;`, `,` or `)`): point there, as rustc does.
    let prev = prev_token_end(text, scan, pos);
    let terminator_missing = expected
        .iter()
        .any(|x| matches!(x, Expected::Token(";" | "," | ")" | "]" | ">" | ":" | "=")))
        && !expected
            .iter()
            .any(|x| matches!(x, Expected::Statement | Expected::Kernel));
    let at_eof = pos >= text.len();
    let on_later_line =
        terminator_missing && prev < pos && text.get(prev..pos).is_some_and(|s| s.contains('\n'));
    let mut d = if at_eof && prev > 0 {
        Diagnostic::error(ErrorCode::Syntax, Span::new(prev, prev), message)
            .with_label_message(label)
    } else if on_later_line && prev > 0 {
        Diagnostic::error(ErrorCode::Syntax, Span::new(prev, prev), message)
            .with_label_message(label)
            .with_secondary(found_span, format!("unexpected {found}"))
    } else {
        Diagnostic::error(ErrorCode::Syntax, found_span, message).with_label_message(label)
    };
    if inside_tensor_type(text, pos) {
        d = d.with_note(
            "a tensor type is `tensor<DTYPE, RANK>` or `tensor<DTYPE, [D0, D1, ...]>`, \
             optionally followed by `, contiguous`",
        );
    }
    if let Some(kw) = found_kw {
        if *kw == "else" && expected.contains(&Expected::Statement) {
            d = d.with_note("`else` must directly follow the `}` of an `if` block");
        } else if keyword_note {
            d = d.with_note(format!("`{kw}` is a keyword and cannot be used as a name"));
        }
    }
    d
}
