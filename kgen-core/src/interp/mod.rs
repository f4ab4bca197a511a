//! The interpreter: runs tile IR on the CPU with the GPU's semantics.

use crate::host::ArgValue;
use crate::ir::Function;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InterpError {
    #[error("not implemented")]
    NotImplemented,
}

/// Runs `func` over the whole grid.
pub fn run(func: &Function, grid: [u32; 3], args: &mut [ArgValue]) -> Result<(), InterpError> {
    let _ = (func, grid, args);
    Err(InterpError::NotImplemented)
}
