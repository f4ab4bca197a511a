//! IR validation. A back end takes the [`ModuleInfo`] this returns, so unvalidated IR
//! cannot be printed.

use crate::diag::Diagnostics;
use crate::ir::Function;

/// Facts about a validated function that later layers use.
#[derive(Clone, Debug, Default)]
pub struct ModuleInfo {
    _private: (),
}

pub fn validate(func: &Function) -> Result<ModuleInfo, Diagnostics> {
    let _ = func;
    Ok(ModuleInfo { _private: () })
}
