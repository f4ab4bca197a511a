//! kgen-runtime: loads kgen's PTX through the CUDA driver (cudarc, dynamic loading) and
//! launches it on host tensors.
//!
//! ```no_run
//! # fn demo(k: &kgen_core::CompiledKernel, args: &mut [kgen_core::host::ArgValue]) -> Result<(), kgen_runtime::RuntimeError> {
//! let gpu = kgen_runtime::Gpu::new(0)?;            // Err(NoDriver) on a machine without a GPU
//! let loaded = gpu.load(k)?;                         // driver JIT of the PTX
//! let stats = gpu.run(&loaded, [64, 1, 1], args)?;   // checks args, copies, launches, copies back
//! println!("{} ms", stats.kernel_ms);
//! # Ok(()) }
//! ```
//!
//! Argument checking ([`validate_args`]) and parameter packing ([`pack_params`]) are pure
//! functions, usable and tested without a GPU.

mod device;
mod error;
mod validate;

pub use device::{check_grid, driver_present, DeviceInfo, Gpu, LoadedKernel, RunStats};
pub use error::{ArgError, RuntimeError};
pub use validate::{
    check_tensor_view, natural_alignment, pack_params, pow2_align, scalar_param_bits,
    source_param_name, validate_args, DEVICE_ALLOC_ALIGN, MAX_INDEX,
};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_e2e;
