//! The PTX back end: layout assignment, lowering to PTX instructions, and one printer.

use crate::abi::{CompiledKernel, Specialization};
use crate::diag::{Diagnostic, Diagnostics, ErrorCode};
use crate::ir::Function;
use crate::span::Span;
use crate::target::Target;
use crate::valid::ModuleInfo;

/// Writes PTX for one validated function.
pub fn write(
    func: &Function,
    info: &ModuleInfo,
    target: &Target,
    spec: &Specialization,
) -> Result<CompiledKernel, Diagnostics> {
    let _ = (func, info, target, spec);
    Err(Diagnostics::single(Diagnostic::error(
        ErrorCode::Unsupported,
        Span::DUMMY,
        "PTX back end not implemented yet",
    )))
}
