//! The `.kg` front end: a pest grammar (`grammar.pest`) and the parser that builds
//! [`ast::Module`] with spans.

pub mod ast;

use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::span::{SourceFile, Span};

/// Parses a `.kg` file. Syntax errors come back as located diagnostics; never panics.
pub fn parse(file: &SourceFile) -> Result<ast::Module, Diagnostics> {
    let _ = file;
    Err(Diagnostics::single(Diagnostic::error(
        ErrorCode::Unsupported,
        Span::DUMMY,
        "parser not implemented yet",
    )))
}
