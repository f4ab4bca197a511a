//! Launching a [`Kernel`] on device tensors.
//!
//! Before anything is queued, every argument is checked against the kernel's parameter
//! ABI (count, kind, dtype, rank, constant extents, contiguity, extents and strides that
//! fit in 32 bits, the view inside its storage, the *actual* device address and strides
//! against the alignment the specialization assumed), the device (every tensor on the
//! launch's device), and aliasing (a tensor the kernel writes may not overlap any other
//! tensor argument). Each failure is a typed [`ArgError`] / [`RuntimeError`].
//!
//! The warm path on a GPU is: the checks, packing the parameter values into a small
//! array, and `cuLaunchKernel` on the caller's stream: no allocation besides two small
//! vectors, no synchronization. A kernel whose launch hints ask for programmatic
//! dependency or a cooperative launch (it calls `grid_sync`) goes through
//! `cuLaunchKernelEx` with the matching attributes; a cooperative grid is first checked
//! against the blocks the device holds at once ([`Device::max_cooperative_blocks`]).

use crate::device::{Device, Stream};
use crate::error::{ArgError, DriverResultExt, RuntimeError};
use crate::kernel::{Exec, Kernel};
use crate::tensor::Tensor;
use crate::validate::{check_tensor_view, scalar_param_bits, source_param_name};
use cudarc::driver::sys;
use kgen_core::abi::{AbiSlot, SourceParam};
use kgen_core::host::{ArgValue, HostTensor};
use kgen_core::types::{DType, Scalar};

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    Tensor(&'a Tensor),
    Scalar(Scalar),
}

impl<'a> From<&'a Tensor> for Arg<'a> {
    fn from(t: &'a Tensor) -> Arg<'a> {
        Arg::Tensor(t)
    }
}
impl From<f32> for Arg<'_> {
    fn from(v: f32) -> Self {
        Arg::Scalar(Scalar::Float(v as f64, DType::F32))
    }
}
impl From<i32> for Arg<'_> {
    fn from(v: i32) -> Self {
        Arg::Scalar(Scalar::Int(v as i64, DType::I32))
    }
}
impl From<u32> for Arg<'_> {
    fn from(v: u32) -> Self {
        Arg::Scalar(Scalar::Int(v as i64, DType::U32))
    }
}
impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Scalar(Scalar::Int(v, DType::I64))
    }
}
impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Scalar(Scalar::Bool(v))
    }
}

/// Refuses a grid whose axis 0 is not a whole number of the kernel's clusters (the
/// driver would fail the launch with a less helpful error).
pub fn check_cluster_grid(k: &Kernel, grid: [u32; 3]) -> Result<(), RuntimeError> {
    let c = k.compiled.launch.cluster_size.max(1);
    if !grid[0].is_multiple_of(c) {
        return Err(RuntimeError::LaunchConfig(format!(
            "kernel `{}` runs in clusters of {c} blocks: grid axis 0 ({}) must be a multiple of {c}",
            k.compiled.entry, grid[0]
        )));
    }
    Ok(())
}

/// Where the blocks of a cooperative grid (a kernel that calls `grid_sync`) must all fit
/// at once.
#[derive(Clone, Copy, Debug)]
pub(crate) enum CoResident {
    /// `per_sm` blocks of the kernel on each of `sms` multiprocessors.
    Gpu { per_sm: u32, sms: u32 },
    /// The interpreter: one OS thread per block, at most
    /// [`kgen_core::interp::MAX_GRID_SYNC_BLOCKS`].
    Interpreter,
}

impl CoResident {
    /// The most blocks resident at once.
    pub(crate) fn blocks(self) -> u64 {
        match self {
            CoResident::Gpu { per_sm, sms } => per_sm as u64 * sms as u64,
            CoResident::Interpreter => kgen_core::interp::MAX_GRID_SYNC_BLOCKS as u64,
        }
    }
}

/// Refuses a grid of the cooperative kernel `entry` with more blocks than `limit` holds
/// at once: its first `grid_sync` would wait forever for blocks that cannot start (the
/// driver would refuse too, with `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`).
pub(crate) fn check_cooperative_grid(
    entry: &str,
    grid: [u32; 3],
    limit: CoResident,
) -> Result<(), RuntimeError> {
    let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
    let max = limit.blocks();
    if blocks <= max {
        return Ok(());
    }
    let holds = match limit {
        CoResident::Gpu { per_sm, sms } => format!(
            "this GPU holds at most {max} ({per_sm} per multiprocessor × {sms} multiprocessors)"
        ),
        CoResident::Interpreter => {
            format!("the interpreter runs at most {max} (one thread per block)")
        }
    };
    Err(RuntimeError::LaunchConfig(format!(
        "kernel `{entry}` calls grid_sync: its {blocks} blocks must all be resident at once, \
         and {holds}; launch at most {max} blocks (Device::max_cooperative_blocks)"
    )))
}

/// A grid of `cdiv(n, block)` blocks along x (at least one dimension check).
pub fn grid_1d(n: usize, block: usize) -> Result<[u32; 3], RuntimeError> {
    if block == 0 {
        return Err(RuntimeError::LaunchConfig("block size 0".into()));
    }
    grid_x(n.div_ceil(block))
}

/// A grid of `blocks` blocks along x.
pub fn grid_x(blocks: usize) -> Result<[u32; 3], RuntimeError> {
    if blocks > i32::MAX as usize {
        return Err(RuntimeError::LaunchConfig(format!(
            "{blocks} blocks exceed the grid's x limit (2^31-1)"
        )));
    }
    Ok([blocks as u32, 1, 1])
}

/// A 2-D grid of `cdiv(rows, row_block) × cdiv(cols, col_block)` blocks.
pub fn grid_2d(
    rows: usize,
    row_block: usize,
    cols: usize,
    col_block: usize,
) -> Result<[u32; 3], RuntimeError> {
    if row_block == 0 || col_block == 0 {
        return Err(RuntimeError::LaunchConfig("block size 0".into()));
    }
    let (x, y) = (rows.div_ceil(row_block), cols.div_ceil(col_block));
    if x > i32::MAX as usize || y > 65535 {
        return Err(RuntimeError::LaunchConfig(format!(
            "grid [{x}, {y}] exceeds the limits (2^31-1, 65535)"
        )));
    }
    Ok([x as u32, y as u32, 1])
}

/// The alignment (16, 8, 4, 2 or 1 bytes) a device tensor actually has under the rules of
/// `CompileOptions::tensor_align`: its address, strides but the last, and the contiguous
/// extent in bytes. Compile with it to get a specialization that accepts the tensor.
pub fn tensor_alignment(t: &Tensor) -> u32 {
    use crate::validate::pow2_align;
    let elem = t.dtype().size_bytes() as u64;
    let base = t.device_ptr().unwrap_or((t.offset() as u64) * elem);
    let mut a = pow2_align(base);
    let rank = t.rank();
    for d in 0..rank.saturating_sub(1) {
        if t.shape()[d] > 1 {
            a = a.min(pow2_align(t.strides()[d] as u64 * elem));
        }
    }
    if rank > 0 {
        a = a.min(pow2_align(t.shape()[rank - 1] as u64 * elem));
    }
    a
}

/// `CompileOptions::tensor_align` for these tensors: each one's [`tensor_alignment`].
pub fn alignments(tensors: &[(&str, &Tensor)]) -> Vec<(String, u32)> {
    tensors
        .iter()
        .map(|(n, t)| (n.to_string(), tensor_alignment(t)))
        .collect()
}

/// Checks `args` against the kernel and the device. Pure apart from reading addresses.
pub fn check_args(device: &Device, k: &Kernel, args: &[Arg]) -> Result<(), RuntimeError> {
    let entry = &k.compiled.entry;
    if k.device_id != device.inner.id {
        return Err(RuntimeError::WrongDevice(format!(
            "kernel `{entry}` was loaded on another device"
        )));
    }
    let params = &k.compiled.abi.source_params;
    if args.len() != params.len() {
        return Err(ArgError::ArgCount {
            kernel: entry.clone(),
            expected: params.len(),
            got: args.len(),
        }
        .into());
    }
    for (p, a) in params.iter().zip(args) {
        match (p, a) {
            (SourceParam::Scalar { name, dtype }, Arg::Scalar(s)) => {
                if s.dtype() != *dtype {
                    return Err(ArgError::DtypeMismatch {
                        param: name.clone(),
                        expected: *dtype,
                        got: s.dtype(),
                    }
                    .into());
                }
            }
            (
                SourceParam::Tensor {
                    name,
                    dtype,
                    dims,
                    contiguous,
                    align_bytes,
                    ..
                },
                Arg::Tensor(t),
            ) => {
                if !t.device().same(device) {
                    return Err(RuntimeError::WrongDevice(format!(
                        "argument `{name}` lives on {}, the launch is on {}",
                        t.device().describe(),
                        device.describe()
                    )));
                }
                if t.dtype() != *dtype {
                    return Err(ArgError::DtypeMismatch {
                        param: name.clone(),
                        expected: *dtype,
                        got: t.dtype(),
                    }
                    .into());
                }
                let base = t
                    .device_ptr()
                    .unwrap_or(t.offset() as u64 * dtype.size_bytes() as u64);
                check_tensor_view(
                    name,
                    dims,
                    *contiguous,
                    *align_bytes,
                    t.dtype(),
                    t.shape(),
                    t.strides(),
                    t.storage_len_from_offset(),
                    base,
                )?;
            }
            (p, a) => {
                return Err(ArgError::WrongKind {
                    param: source_param_name(p).to_string(),
                    expected: match p {
                        SourceParam::Tensor { .. } => "tensor",
                        SourceParam::Scalar { .. } => "scalar",
                    },
                    got: match a {
                        Arg::Tensor(_) => "tensor",
                        Arg::Scalar(_) => "scalar",
                    },
                }
                .into())
            }
        }
    }
    // Aliasing: a written tensor may not overlap any other tensor argument.
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        let (
            SourceParam::Tensor {
                written: true,
                name,
                ..
            },
            Arg::Tensor(w),
        ) = (p, a)
        else {
            continue;
        };
        for (j, (q, b)) in params.iter().zip(args).enumerate() {
            if i == j {
                continue;
            }
            if let Arg::Tensor(o) = b {
                if w.overlaps(o) {
                    return Err(ArgError::Aliasing {
                        a: name.clone(),
                        b: source_param_name(q).to_string(),
                        written: name.clone(),
                    }
                    .into());
                }
            }
        }
    }
    Ok(())
}

/// Writes the PTX parameter values, each in the low bytes of a u64, into `out`
/// (exactly one per ABI parameter).
pub(crate) fn pack_into(k: &Kernel, args: &[Arg], out: &mut [u64]) -> Result<(), RuntimeError> {
    let abi = &k.compiled.abi;
    let bad = |why: String| RuntimeError::Incompatible {
        entry: k.compiled.entry.clone(),
        why,
    };
    for (p, o) in abi.params.iter().zip(out.iter_mut()) {
        let tensor = |param: u32| match args.get(param as usize) {
            Some(Arg::Tensor(t)) => Ok(*t),
            _ => Err(bad(format!("`{}` is not a tensor argument", p.ptx_name))),
        };
        *o = match &p.slot {
            AbiSlot::TensorPtr { param } => tensor(*param)?.device_ptr().unwrap_or(0),
            AbiSlot::TensorDim { param, dim } => {
                tensor(*param)?.shape()[*dim as usize] as u32 as u64
            }
            AbiSlot::TensorStride { param, dim } => {
                tensor(*param)?.strides()[*dim as usize] as u32 as u64
            }
            AbiSlot::Scalar { param, dtype } => match args.get(*param as usize) {
                Some(Arg::Scalar(s)) => scalar_param_bits(*s, *dtype).0,
                _ => return Err(bad(format!("`{}` is not a scalar argument", p.ptx_name))),
            },
            // Passed by `tensor_maps` (128 bytes, not a word).
            AbiSlot::TensorMap { param, .. } => {
                tensor(*param)?;
                0
            }
        };
    }
    Ok(())
}

/// The tensor maps of `k`'s ABI for `args`: (PTX parameter index, map), encoded (or
/// found in the GPU's cache) from each tensor's dtype, address, shape and strides.
pub(crate) fn tensor_maps(
    gpu: Option<&crate::Gpu>,
    k: &Kernel,
    args: &[Arg],
) -> Result<Vec<(usize, Box<crate::TensorMapArg>)>, RuntimeError> {
    let mut out = Vec::new();
    for (i, p) in k.compiled.abi.params.iter().enumerate() {
        let AbiSlot::TensorMap { param, map } = &p.slot else {
            continue;
        };
        let (Some(gpu), Some(Arg::Tensor(t))) = (gpu, args.get(*param as usize)) else {
            return Err(RuntimeError::Incompatible {
                entry: k.compiled.entry.clone(),
                why: format!("`{}` needs a GPU tensor argument", p.ptx_name),
            });
        };
        let m = gpu.tensor_map(
            t.dtype(),
            t.device_ptr().unwrap_or(0),
            t.shape(),
            t.strides(),
            map,
        )?;
        out.push((i, Box::new(m)));
    }
    Ok(out)
}

/// Parameters packed on the stack up to this many (no allocation per launch).
const INLINE_PARAMS: usize = 48;

/// Packs the parameters and queues the kernel ([`launch_raw`]).
fn launch_cuda(
    gpu: Option<&crate::Gpu>,
    k: &Kernel,
    func: sys::CUfunction,
    grid: [u32; 3],
    stream: sys::CUstream,
    args: &[Arg],
) -> Result<(), RuntimeError> {
    let n = k.compiled.abi.params.len();
    let mut inline_values = [0u64; INLINE_PARAMS];
    let mut heap_values = Vec::new();
    let values: &mut [u64] = if n <= INLINE_PARAMS {
        &mut inline_values[..n]
    } else {
        heap_values.resize(n, 0u64);
        &mut heap_values
    };
    pack_into(k, args, values)?;
    let mut inline_ptrs = [std::ptr::null_mut::<std::ffi::c_void>(); INLINE_PARAMS];
    let mut heap_ptrs = Vec::new();
    let ptrs: &mut [*mut std::ffi::c_void] = if n <= INLINE_PARAMS {
        &mut inline_ptrs[..n]
    } else {
        heap_ptrs.resize(n, std::ptr::null_mut());
        &mut heap_ptrs
    };
    for (p, v) in ptrs.iter_mut().zip(values.iter_mut()) {
        *p = v as *mut u64 as *mut std::ffi::c_void;
    }
    let mut maps = tensor_maps(gpu, k, args)?;
    for (i, m) in maps.iter_mut() {
        ptrs[*i] = m.as_mut() as *mut crate::TensorMapArg as *mut std::ffi::c_void;
    }
    launch_raw(func, grid, k.compiled.launch, stream, ptrs)
}

/// Queues `func` on `stream` with one pointer per PTX parameter in `ptrs`: a plain
/// `cuLaunchKernel`, or `cuLaunchKernelEx` with the attributes `launch` asks for:
/// - programmatic stream serialization (`programmatic_dependency`): the kernel (which
///   calls `gdc_wait()` before reading its predecessor's output) may start while the
///   kernel queued before it runs, from that kernel's `gdc_launch_dependents()` or its
///   blocks' exit on;
/// - cooperative (`cooperative`, the kernel calls `grid_sync`): every block resident at
///   once. The caller has checked the grid fits ([`check_cooperative_grid`]).
///
/// Both go through the same call, so a launch captured into a CUDA graph keeps them.
fn launch_raw(
    func: sys::CUfunction,
    grid: [u32; 3],
    launch: kgen_core::abi::LaunchHints,
    stream: sys::CUstream,
    ptrs: &mut [*mut std::ffi::c_void],
) -> Result<(), RuntimeError> {
    if !launch.programmatic_dependency && !launch.cooperative {
        // SAFETY: `func` is a loaded function of the current context; `ptrs` holds one
        // pointer per PTX parameter (checked against the PTX at load), each to a u64
        // whose low bytes hold the value (little-endian), or to a tensor map, alive
        // until cuLaunchKernel returns.
        return unsafe {
            sys::cuLaunchKernel(
                func,
                grid[0],
                grid[1],
                grid[2],
                launch.threads_per_block,
                1,
                1,
                launch.dynamic_shared_bytes,
                stream,
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        }
        .op("cuLaunchKernel");
    }
    // SAFETY: the attributes are plain data (all zeros is a valid value); each one sets
    // the union member its id reads.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut n = 0;
    if launch.programmatic_dependency {
        attrs[n].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if launch.cooperative {
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attrs[n].value.cooperative = 1;
        n += 1;
    }
    let config = sys::CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: launch.threads_per_block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: launch.dynamic_shared_bytes,
        hStream: stream,
        attrs: attrs.as_mut_ptr(),
        numAttrs: n as u32,
    };
    // SAFETY: as for `cuLaunchKernel` above; `config` and the first `n` entries of
    // `attrs` (all set) outlive the call.
    unsafe {
        sys::cuLaunchKernelEx(&config, func, ptrs.as_mut_ptr(), std::ptr::null_mut()).result()
    }
    .op("cuLaunchKernelEx")
}

/// Where the blocks of `k` must fit when launched cooperatively on `device`. Binds the
/// GPU's context to this thread when the driver has to be asked.
fn co_resident(device: &Device, k: &Kernel) -> Result<CoResident, RuntimeError> {
    if k.device_id != device.inner.id {
        return Err(RuntimeError::WrongDevice(format!(
            "kernel `{}` was loaded on another device",
            k.compiled.entry
        )));
    }
    match (&k.exec, device.gpu()) {
        (Exec::Cuda(loaded), Some(gpu)) => Ok(CoResident::Gpu {
            per_sm: loaded.blocks_per_sm(gpu)?,
            sms: gpu.info().sm_count,
        }),
        (Exec::Interp(_), None) => Ok(CoResident::Interpreter),
        _ => Err(RuntimeError::WrongDevice(format!(
            "kernel `{}` was loaded on another device",
            k.compiled.entry
        ))),
    }
}

/// Refuses a grid of a kernel that calls `grid_sync` larger than `device` holds at once
/// (nothing to check for other kernels).
fn check_cooperative(device: &Device, k: &Kernel, grid: [u32; 3]) -> Result<(), RuntimeError> {
    if !k.compiled.launch.cooperative {
        return Ok(());
    }
    check_cooperative_grid(&k.compiled.entry, grid, co_resident(device, k)?)
}

impl Device {
    /// Launches `k` over `grid` on `stream`. Asynchronous on a GPU; on the interpreter
    /// it runs to completion. A grid with a zero extent launches nothing.
    pub fn launch(
        &self,
        stream: &Stream,
        k: &Kernel,
        grid: [u32; 3],
        args: &[Arg],
    ) -> Result<(), RuntimeError> {
        if !stream.device.same(self) {
            return Err(RuntimeError::WrongDevice(
                "the stream belongs to another device".into(),
            ));
        }
        check_args(self, k, args)?;
        crate::gpu::check_grid(grid)?;
        check_cluster_grid(k, grid)?;
        if grid.contains(&0) {
            return Ok(());
        }
        check_cooperative(self, k, grid)?;
        match &k.exec {
            Exec::Cuda(loaded) => {
                // The caller's thread may not have the context current (a worker
                // thread); binding is a cuCtxGetCurrent when it already is.
                if let Some(g) = self.gpu() {
                    g.ctx.bind_to_thread().op("binding the context")?;
                }
                if stream.capture.active() {
                    stream.capture.keep(args);
                }
                launch_cuda(
                    self.gpu(),
                    k,
                    loaded.func.cu_function(),
                    grid,
                    stream.raw(),
                    args,
                )
            }
            Exec::Interp(func) => run_interpreted(func, grid, &k.compiled.abi.source_params, args),
        }
    }

    /// The most blocks of `k` that can be resident at once on this device: the size of
    /// the largest grid `k` may be launched on if it calls `grid_sync` (a cooperative
    /// launch; a larger grid is refused with [`RuntimeError::LaunchConfig`]), e.g. to
    /// size a persistent grid. On a GPU: the blocks of `k` one multiprocessor holds
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor` for its threads, registers and
    /// dynamic shared memory; asked once per kernel) × the multiprocessors. On the
    /// interpreter, which runs such a grid's blocks as one OS thread each:
    /// [`kgen_core::interp::MAX_GRID_SYNC_BLOCKS`]. Answers for any kernel, cooperative
    /// or not; `k` must be loaded on this device.
    pub fn max_cooperative_blocks(&self, k: &Kernel) -> Result<u32, RuntimeError> {
        let blocks = co_resident(self, k)?.blocks();
        Ok(blocks.min(u32::MAX as u64) as u32)
    }

    /// Launches and times the kernel with CUDA events (synchronizes); milliseconds.
    /// On the interpreter: wall-clock time.
    pub fn launch_timed(
        &self,
        stream: &Stream,
        k: &Kernel,
        grid: [u32; 3],
        args: &[Arg],
    ) -> Result<f32, RuntimeError> {
        if stream.capture.active() {
            return Err(crate::graph::refused_while_capturing(
                "Device::launch_timed (it synchronizes)",
            ));
        }
        match &stream.cuda {
            Some(s) => {
                let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
                let ctx = s.context();
                let start = ctx.new_event(flags).op("cuEventCreate")?;
                let end = ctx.new_event(flags).op("cuEventCreate")?;
                start.record(s).op("cuEventRecord")?;
                self.launch(stream, k, grid, args)?;
                end.record(s).op("cuEventRecord")?;
                end.synchronize().op("cuEventSynchronize")?;
                start.elapsed_ms(&end).op("cuEventElapsedTime")
            }
            None => {
                let t = std::time::Instant::now();
                self.launch(stream, k, grid, args)?;
                Ok(t.elapsed().as_secs_f32() * 1e3)
            }
        }
    }
}

/// The interpreter path: each tensor view becomes a host tensor over a copy of its
/// storage from the view's offset; written ones are copied back.
fn run_interpreted(
    func: &kgen_core::ir::Function,
    grid: [u32; 3],
    params: &[SourceParam],
    args: &[Arg],
) -> Result<(), RuntimeError> {
    let mut values = Vec::with_capacity(args.len());
    for a in args {
        values.push(match a {
            Arg::Scalar(s) => ArgValue::Scalar(*s),
            Arg::Tensor(t) => {
                let elem = t.dtype().size_bytes() as usize;
                let data = t.with_host_storage(|m| {
                    let start = t.offset() * elem;
                    let end = m.len() / elem * elem;
                    m[start.min(end)..end].to_vec()
                })?;
                ArgValue::Tensor(HostTensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                    strides: t.strides().to_vec(),
                    data,
                })
            }
        });
    }
    kgen_core::interp::run(func, grid, &mut values)
        .map_err(|e| RuntimeError::Interpreter(e.to_string()))?;
    for ((p, a), v) in params.iter().zip(args).zip(&values) {
        if let (SourceParam::Tensor { written: true, .. }, Arg::Tensor(t), ArgValue::Tensor(h)) =
            (p, a, v)
        {
            // Only the view's own elements: a strided view's gaps may belong to other
            // arguments (the halves of a concatenated buffer).
            let elem = t.dtype().size_bytes() as usize;
            let base = t.offset() * elem;
            let (shape, strides) = (t.shape(), t.strides());
            t.with_host_storage(|m| {
                let mut idx = vec![0usize; shape.len()];
                for _ in 0..t.numel() {
                    let off: usize =
                        idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>() * elem;
                    m[base + off..base + off + elem].copy_from_slice(&h.data[off..off + elem]);
                    for d in (0..idx.len()).rev() {
                        idx[d] += 1;
                        if idx[d] < shape[d] {
                            break;
                        }
                        idx[d] = 0;
                    }
                }
            })?;
        }
    }
    Ok(())
}

/// A launch checked and packed once, replayed with a bare `cuLaunchKernel` (no checks,
/// no packing; `cuLaunchKernelEx` for a kernel with programmatic dependency or a
/// cooperative one, as [`Device::launch`] does): the driver's floor that `kgen bench`
/// compares [`Device::launch`] with, and a way to replay an identical launch in a hot
/// loop. GPU kernels only.
pub struct PackedLaunch {
    func: sys::CUfunction,
    stream: sys::CUstream,
    grid: [u32; 3],
    launch: kgen_core::abi::LaunchHints,
    values: Vec<u64>,
    /// The tensor maps, boxed so the pointers in `ptrs` stay valid when this moves.
    maps: Vec<(usize, Box<crate::TensorMapArg>)>,
    ptrs: Vec<*mut std::ffi::c_void>,
    /// Keeps the module (and so `func`) loaded.
    _kernel: std::sync::Arc<Kernel>,
}

impl PackedLaunch {
    /// Checks `args` like [`Device::launch`] and packs them.
    pub fn new(
        device: &Device,
        stream: &Stream,
        k: &std::sync::Arc<Kernel>,
        grid: [u32; 3],
        args: &[Arg],
    ) -> Result<PackedLaunch, RuntimeError> {
        if !stream.device.same(device) {
            return Err(RuntimeError::WrongDevice(
                "the stream belongs to another device".into(),
            ));
        }
        check_args(device, k, args)?;
        crate::gpu::check_grid(grid)?;
        check_cluster_grid(k, grid)?;
        let Exec::Cuda(loaded) = &k.exec else {
            return Err(RuntimeError::LaunchConfig(
                "a packed launch needs a GPU kernel".into(),
            ));
        };
        check_cooperative(device, k, grid)?;
        let mut values = vec![0u64; k.compiled.abi.params.len()];
        pack_into(k, args, &mut values)?;
        let mut p = PackedLaunch {
            func: loaded.func.cu_function(),
            stream: stream.raw(),
            grid,
            launch: k.compiled.launch,
            values,
            maps: tensor_maps(device.gpu(), k, args)?,
            ptrs: Vec::new(),
            _kernel: k.clone(),
        };
        p.ptrs = p
            .values
            .iter_mut()
            .map(|v| v as *mut u64 as *mut std::ffi::c_void)
            .collect();
        for (i, m) in p.maps.iter_mut() {
            p.ptrs[*i] = m.as_mut() as *mut crate::TensorMapArg as *mut std::ffi::c_void;
        }
        Ok(p)
    }

    /// One bare `cuLaunchKernel` (or `cuLaunchKernelEx`, see [`PackedLaunch`]).
    ///
    /// # Safety
    /// The tensors given to [`PackedLaunch::new`] must still be alive (their memory is
    /// not tracked here) and the stream not destroyed.
    pub unsafe fn launch(&mut self) -> Result<(), RuntimeError> {
        launch_raw(
            self.func,
            self.grid,
            self.launch,
            self.stream,
            &mut self.ptrs,
        )
    }
}
