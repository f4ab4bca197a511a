//! The checker: resolves names and generics, evaluates constants, checks dtypes and
//! shapes (numpy broadcasting) and lowers the AST to tile IR.

use crate::abi::Specialization;
use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::front::ast;
use crate::ir;
use crate::pipeline::CompileOptions;
use crate::span::Span;

/// Checks one kernel of `module` (chosen by `opts.kernel`) under the compile-time values
/// in `opts`, and lowers it to IR. Reports every independent error it finds.
pub fn lower_kernel(
    module: &ast::Module,
    opts: &CompileOptions,
) -> Result<(ir::Function, Specialization), Diagnostics> {
    let _ = (module, opts);
    Err(Diagnostics::single(Diagnostic::error(
        ErrorCode::Unsupported,
        Span::DUMMY,
        "checker not implemented yet",
    )))
}
