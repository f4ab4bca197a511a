//! kgen-runtime: compiles, caches, loads and launches kgen kernels through the CUDA
//! driver (cudarc, dynamic loading: building needs no CUDA, running needs only the
//! driver), or on the interpreter when there is no GPU: one API for both.
//!
//! ```no_run
//! use kgen_runtime::{Arg, Device, grid_1d};
//! # fn demo() -> Result<(), kgen_runtime::RuntimeError> {
//! let (device, fallback) = Device::best();          // GPU 0, or the interpreter
//! if let Some(why) = fallback { eprintln!("{why}"); }
//! let src = kgen_core::SourceFile::new("add.kg", "kernel add<B: int = 1024>(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) { store(y, [bid(0)], load(x, [bid(0)], [B]) + 1.0); }");
//! let k = device.kernel(&src, &kgen_core::CompileOptions::new(device.arch()))?; // cached
//! let x = device.from_slice(&[1000], &vec![1.5f32; 1000])?;
//! let y = device.empty(kgen_core::DType::F32, &[1000])?;
//! let stream = device.stream();
//! device.launch(&stream, &k, grid_1d(1000, 1024)?, &[Arg::from(&x), Arg::from(&y)])?;
//! let out: Vec<f32> = y.to_vec()?;                   // waits for the device
//! # Ok(()) }
//! ```
//!
//! - [`Device`], [`Stream`] (also wrapping a cudarc stream of yours), typed strided
//!   [`Tensor`]s with views (`narrow`, `select`, `transpose`, `permute`, `reshape`),
//!   also over a cudarc buffer of yours without a copy ([`Device::tensor_from_cudarc`]).
//! - [`Device::kernel`]: compile once per (source, specialization, arch, compiler
//!   version), in memory, and keep the driver's JIT output on disk (`KGEN_CACHE_DIR`,
//!   default `~/.cache/kgen`; `KGEN_CACHE=0` turns it off; corrupt or stale entries are
//!   detected and rebuilt).
//! - [`Device::launch`]: arguments checked against the kernel's ABI before launch
//!   (dtype, rank, extents, contiguity, alignment of the actual pointer, device,
//!   aliasing), typed errors, no host synchronization. [`Device::launch_timed`] times
//!   with CUDA events.
//! - [`autotune`]: benchmark candidate configurations once per shape key, remember the
//!   winner on disk.
//! - [`Stream::begin_capture`] / [`Stream::end_capture`]: record a sequence of launches
//!   into a CUDA [`Graph`] and replay it with one driver call ([`Graph::launch`]).
//! - [`Gpu`]: the lower-level host-tensor path (`Gpu::run` copies in, launches, copies
//!   out) used by the self-test.
//!
//! Streams and memory: a tensor is allocated, filled (`fill_zero`, `copy_from`, host
//! copies) and freed in the order of one stream, the one it was allocated on: the
//! device's default stream ([`Device::stream`]) for [`Device::empty`] and friends, the
//! given one for [`Device::empty_on`] (what `kgen::ops` uses for its handle's stream),
//! cudarc's for an imported buffer. Work queued on another stream (a
//! [`Device::new_stream`], or a framework's stream through [`Stream::from_cudarc`]) is
//! not ordered with it: make that stream wait ([`Stream::wait_for`]) before it uses a
//! tensor just allocated or filled there, and keep a tensor alive until the work that
//! uses it has finished on that stream.

pub mod autotune;
mod device;
mod disk_cache;
mod error;
mod gpu;
mod graph;
mod interop;
mod kernel;
mod launch;
mod tensor;
mod tensor_map;
mod upload;
mod validate;

pub use device::{Device, Stream};
pub use disk_cache::{CacheKey, DiskCache, FileCount, Inventory, Lookup};
pub use error::{ArgError, RuntimeError};
pub use gpu::{check_grid, driver_present, DeviceInfo, Gpu, LoadedKernel, RunStats};
pub use graph::Graph;
pub use kernel::{source_hash, spec_key, CacheStats, Kernel, COMPILER_VERSION};
pub use launch::{
    alignments, check_args, grid_1d, grid_2d, grid_x, tensor_alignment, Arg, PackedLaunch,
};
pub use tensor::{Element, Tensor};
pub use tensor_map::{data_type_code, TensorMapArg, TensorMapParams};
/// The largest upload `Stream::upload_async` takes (bytes).
pub use upload::SLOT_BYTES as UPLOAD_ASYNC_MAX_BYTES;
pub use validate::{
    check_tensor_view, natural_alignment, pack_params, pow2_align, scalar_param_bits,
    source_param_name, validate_args, DEVICE_ALLOC_ALIGN, MAX_INDEX,
};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_api;
#[cfg(test)]
mod tests_e2e;
#[cfg(test)]
mod tests_gpu_api;
#[cfg(test)]
mod tests_grid_sync;
#[cfg(test)]
mod tests_interop;
