//! The GPU: context, module loading (driver JIT of kgen's PTX) and launches.

use crate::error::{DriverResultExt, RuntimeError};
use crate::validate::{pack_params, validate_args};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use kgen_core::abi::{CompiledKernel, SourceParam};
use kgen_core::host::ArgValue;
use kgen_core::target::Arch;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// What the device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// The kgen target for it, when kgen supports the device.
    pub arch: Option<Arch>,
    pub sm_count: u32,
    pub total_mem_bytes: u64,
    /// The largest dynamic shared memory a block may opt in to.
    pub max_shared_per_block_optin: u32,
    /// The L2 cache's size in bytes.
    pub l2_cache_bytes: u64,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {}: {} (compute capability {}.{}, {} SMs, {:.1} GiB) -> {}",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.sm_count,
            self.total_mem_bytes as f64 / (1u64 << 30) as f64,
            match self.arch {
                Some(a) => format!("kgen target {a}"),
                None => "not a kgen target (kgen targets sm_80 and sm_90a)".to_string(),
            }
        )
    }
}

/// Whether the CUDA driver library can be loaded on this machine. Never panics.
pub fn driver_present() -> bool {
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Runs `f`, turning a panic in the bindings (a missing driver symbol) into an error.
pub(crate) fn guarded<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, RuntimeError>,
) -> Result<T, RuntimeError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(RuntimeError::Bindings(format!("{what}: {msg}")))
        }
    }
}

/// One CUDA device with a context and a stream. Loaded modules are kept for the Gpu's
/// life (a kernel loaded twice is JIT-compiled once).
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: Mutex<HashMap<(String, String), Arc<CudaModule>>>,
    /// TMA tensor maps encoded so far, and 256 zeroed bytes that empty tensors map to
    /// (`tensor_map.rs`).
    tma: Box<TmaState>,
}

/// What TMA launches keep per GPU.
#[derive(Default)]
struct TmaState {
    maps: crate::tensor_map::MapCache,
    zeros: std::sync::OnceLock<cudarc::driver::CudaSlice<u8>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

/// A kernel whose PTX the driver has loaded.
#[derive(Debug)]
pub struct LoadedKernel {
    pub kernel: CompiledKernel,
    pub(crate) func: CudaFunction,
    /// Registers per thread the driver's JIT allocated.
    pub num_regs: u32,
    /// Local memory per thread (spills); 0 for a healthy kernel.
    pub local_bytes: u32,
    /// Blocks of it one multiprocessor holds at once, asked of the driver on first use
    /// ([`LoadedKernel::blocks_per_sm`]).
    blocks_per_sm: std::sync::OnceLock<u32>,
}

impl LoadedKernel {
    /// How many blocks of this kernel one multiprocessor holds at once, given its threads
    /// per block, registers and shared memory (`cuOccupancyMaxActiveBlocksPerMultiprocessor`
    /// with the launch's dynamic shared memory). Asked of the driver once, then cached.
    pub(crate) fn blocks_per_sm(&self, gpu: &Gpu) -> Result<u32, RuntimeError> {
        if let Some(&b) = self.blocks_per_sm.get() {
            return Ok(b);
        }
        gpu.ctx.bind_to_thread().op("binding the context")?;
        let l = self.kernel.launch;
        let b = self
            .func
            .occupancy_max_active_blocks_per_multiprocessor(
                l.threads_per_block,
                l.dynamic_shared_bytes as usize,
                None,
            )
            .op("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        Ok(*self.blocks_per_sm.get_or_init(|| b))
    }
}

/// What one launch measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunStats {
    /// Kernel time by CUDA events (0 when nothing was launched).
    pub kernel_ms: f32,
    /// False when the grid was empty and no launch happened.
    pub launched: bool,
}

impl Gpu {
    /// Opens device `ordinal`. Without a CUDA driver (a machine with no GPU) this returns
    /// [`RuntimeError::NoDriver`]; it never panics.
    pub fn new(ordinal: usize) -> Result<Gpu, RuntimeError> {
        if !driver_present() {
            return Err(RuntimeError::NoDriver(
                "the CUDA driver library (libcuda.so) was not found; this machine has no NVIDIA GPU driver".to_string(),
            ));
        }
        guarded("opening the device", || Gpu::open(ordinal))
    }

    fn open(ordinal: usize) -> Result<Gpu, RuntimeError> {
        use sys::CUdevice_attribute as A;
        if let Err(e) = cudarc::driver::result::init() {
            return Err(match e.0 {
                sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                    RuntimeError::NoDevice(format!("the driver reports no device ({e})"))
                }
                _ => RuntimeError::Driver {
                    op: "cuInit",
                    err: e,
                },
            });
        }
        let count = CudaContext::device_count().op("cuDeviceGetCount")?;
        if count <= 0 || ordinal >= count as usize {
            return Err(RuntimeError::NoDevice(format!(
                "device {ordinal} requested, the driver reports {count} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).op("creating the context")?;
        let name = ctx.name().op("cuDeviceGetName")?;
        let (major, minor) = ctx
            .compute_capability()
            .op("reading the compute capability")?;
        let sm_count = ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .op("cuDeviceGetAttribute")?;
        let optin = ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .op("cuDeviceGetAttribute")?;
        let l2 = ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .op("cuDeviceGetAttribute")?;
        let total = ctx.total_mem().op("cuDeviceTotalMem")?;
        if ctx.has_async_alloc() && !env_says_off("KGEN_MEMPOOL_KEEP") {
            // A speed setting, not a requirement: a driver that refuses it still
            // allocates correctly, so the device opens either way.
            let _ = keep_freed_memory(&ctx);
        }
        let stream = ctx.default_stream();
        let info = DeviceInfo {
            ordinal,
            name,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
            arch: Arch::for_compute_capability(major.max(0) as u32, minor.max(0) as u32),
            sm_count: sm_count.max(0) as u32,
            total_mem_bytes: total as u64,
            max_shared_per_block_optin: optin.max(0) as u32,
            l2_cache_bytes: l2.max(0) as u64,
        };
        Ok(Gpu {
            ctx,
            stream,
            info,
            modules: Mutex::new(HashMap::new()),
            tma: Box::default(),
        })
    }

    /// The tensor map of `spec` over tensor `t` (dtype, device address, shape, strides),
    /// encoded once per distinct set of arguments.
    pub(crate) fn tensor_map(
        &self,
        dtype: kgen_core::types::DType,
        address: u64,
        shape: &[usize],
        strides: &[usize],
        spec: &kgen_core::abi::TensorMapSpec,
    ) -> Result<crate::tensor_map::TensorMapArg, RuntimeError> {
        let p = crate::tensor_map::TensorMapParams::of(dtype, address, shape, strides, spec)
            .map_err(|why| RuntimeError::LaunchConfig(format!("tensor map: {why}")))?;
        let zero = if p.address.is_none() {
            self.zeros_ptr()?
        } else {
            0
        };
        self.tma.maps.get(&p, zero)
    }

    /// The device address of 256 zeroed bytes owned by this GPU.
    fn zeros_ptr(&self) -> Result<u64, RuntimeError> {
        if self.tma.zeros.get().is_none() {
            let buf = self
                .stream
                .alloc_zeros::<u8>(256)
                .op("cuMemAlloc (zeros)")?;
            self.stream.synchronize().op("cuStreamSynchronize")?;
            let _ = self.tma.zeros.set(buf);
        }
        let buf = self
            .tma
            .zeros
            .get()
            .ok_or_else(|| RuntimeError::LaunchConfig("no zero buffer".into()))?;
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(buf, self.stream.as_ref());
        Ok(ptr)
    }

    /// The cudarc context (for interop: cuBLAS, your own cudarc code).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream `run` uses (the context's default stream).
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The kgen target to compile for on this device, if kgen supports it.
    pub fn arch(&self) -> Option<Arch> {
        self.info.arch
    }

    /// Loads a compiled kernel through the driver's PTX JIT. A JIT failure comes back as
    /// [`RuntimeError::PtxLoad`] with the JIT's error log.
    pub fn load(&self, kernel: &CompiledKernel) -> Result<LoadedKernel, RuntimeError> {
        guarded("loading a module", || self.load_inner(kernel))
    }

    fn load_inner(&self, kernel: &CompiledKernel) -> Result<LoadedKernel, RuntimeError> {
        let entry = kernel.entry.clone();
        let incompatible = |why: String| RuntimeError::Incompatible {
            entry: entry.clone(),
            why,
        };
        if kernel.arch == Arch::Sm90a && self.info.compute_capability != (9, 0) {
            return Err(incompatible(format!(
                "it was compiled for sm_90a, the device is compute capability {}.{}",
                self.info.compute_capability.0, self.info.compute_capability.1
            )));
        }
        if kernel.ptx.contains('\0') || entry.contains('\0') {
            return Err(incompatible(
                "the PTX text or entry name holds a NUL byte".into(),
            ));
        }
        let key = (entry.clone(), kernel.ptx.clone());
        let cached = self.modules.lock().ok().and_then(|m| m.get(&key).cloned());
        let module = match cached {
            Some(m) => m,
            None => {
                let m = match self.ctx.load_module(Ptx::from_src(kernel.ptx.clone())) {
                    Ok(m) => m,
                    Err(err) => {
                        return Err(RuntimeError::PtxLoad {
                            entry,
                            err,
                            log: jit_error_log(&self.ctx, &kernel.ptx),
                        })
                    }
                };
                if let Ok(mut map) = self.modules.lock() {
                    map.insert(key, m.clone());
                }
                m
            }
        };
        let func = module.load_function(&entry).op("cuModuleGetFunction")?;
        self.ctx.bind_to_thread().op("binding the context")?;
        // The PTX's parameter list must be the ABI's.
        check_param_layout(&func, kernel).map_err(&incompatible)?;
        let launch = kernel.launch;
        if launch.threads_per_block == 0 || launch.threads_per_block > 1024 {
            return Err(incompatible(format!(
                "{} threads per block",
                launch.threads_per_block
            )));
        }
        let smem = launch.dynamic_shared_bytes as u64 + launch.static_shared_bytes as u64;
        if smem > self.info.max_shared_per_block_optin as u64 {
            return Err(incompatible(format!(
                "it needs {smem} bytes of shared memory, the device offers {} per block",
                self.info.max_shared_per_block_optin
            )));
        }
        if launch.dynamic_shared_bytes > 0 {
            func.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                launch.dynamic_shared_bytes as i32,
            )
            .op("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")?;
        }
        if launch.cluster_size > kgen_core::types::MAX_PORTABLE_CLUSTER_SIZE {
            // Clusters of 16 are non-portable on sm_90: the function must opt in.
            func.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                1,
            )
            .op("cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")?;
        }
        let max_threads = func.max_threads_per_block().op("cuFuncGetAttribute")?;
        if (launch.threads_per_block as i64) > max_threads as i64 {
            return Err(incompatible(format!(
                "{} threads per block, but with its register use the device allows at most {max_threads}",
                launch.threads_per_block
            )));
        }
        let num_regs = func.num_regs().op("cuFuncGetAttribute")?.max(0) as u32;
        let local_bytes = func.local_size_bytes().op("cuFuncGetAttribute")?.max(0) as u32;
        Ok(LoadedKernel {
            kernel: kernel.clone(),
            func,
            num_regs,
            local_bytes,
            blocks_per_sm: std::sync::OnceLock::new(),
        })
    }

    /// Runs a loaded kernel over `grid` on host arguments: checks them against the ABI
    /// (before anything touches the GPU), copies every tensor to the device, launches
    /// (cooperatively for a kernel that calls `grid_sync`, after checking that its grid
    /// fits at once), synchronizes and copies back the tensors the kernel writes. A grid
    /// with a zero extent launches nothing.
    pub fn run(
        &self,
        k: &LoadedKernel,
        grid: [u32; 3],
        args: &mut [ArgValue],
    ) -> Result<RunStats, RuntimeError> {
        validate_args(&k.kernel.entry, &k.kernel.abi, args)?;
        check_grid(grid)?;
        if grid.contains(&0) {
            return Ok(RunStats {
                kernel_ms: 0.0,
                launched: false,
            });
        }
        guarded("launching", || self.run_inner(k, grid, args))
    }

    fn run_inner(
        &self,
        k: &LoadedKernel,
        grid: [u32; 3],
        args: &mut [ArgValue],
    ) -> Result<RunStats, RuntimeError> {
        self.ctx.bind_to_thread().op("binding the context")?;
        let cooperative = k.kernel.launch.cooperative;
        if cooperative {
            let limit = crate::launch::CoResident::Gpu {
                per_sm: k.blocks_per_sm(self)?,
                sms: self.info.sm_count,
            };
            crate::launch::check_cooperative_grid(&k.kernel.entry, grid, limit)?;
        }
        let stream = &self.stream;
        // Device copies of every tensor, whole storage (outputs keep their poison).
        let mut buffers: Vec<Option<CudaSlice<u8>>> = Vec::with_capacity(args.len());
        let mut ptrs: Vec<u64> = Vec::with_capacity(args.len());
        for a in args.iter() {
            match a {
                ArgValue::Tensor(t) => {
                    // Never allocate 0 bytes; pad to a whole 16 bytes so vector accesses
                    // at the end of a view stay inside the allocation.
                    let len = t.data.len().max(1).div_ceil(16) * 16;
                    let mut buf = unsafe { stream.alloc::<u8>(len) }.op("cuMemAlloc")?;
                    if !t.data.is_empty() {
                        let mut view = buf.slice_mut(0..t.data.len());
                        stream
                            .memcpy_htod(&t.data[..], &mut view)
                            .op("cuMemcpyHtoD")?;
                    }
                    let ptr = {
                        let (ptr, _sync) =
                            cudarc::driver::DevicePtr::device_ptr(&buf, stream.as_ref());
                        ptr
                    };
                    ptrs.push(ptr);
                    buffers.push(Some(buf));
                }
                ArgValue::Scalar(_) => {
                    ptrs.push(0);
                    buffers.push(None);
                }
            }
        }
        let values =
            pack_params(&k.kernel.abi, args, &ptrs).map_err(|why| RuntimeError::Incompatible {
                entry: k.kernel.entry.clone(),
                why,
            })?;
        let cfg = LaunchConfig {
            grid_dim: (grid[0], grid[1], grid[2]),
            block_dim: (k.kernel.launch.threads_per_block, 1, 1),
            shared_mem_bytes: k.kernel.launch.dynamic_shared_bytes,
        };
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).op("cuEventCreate")?;
        let end = self.ctx.new_event(flags).op("cuEventCreate")?;
        stream
            .synchronize()
            .op("cuStreamSynchronize (after the copies in)")?;
        start.record(stream).op("cuEventRecord")?;
        // Tensor maps (`AbiSlot::TensorMap`) over the device copies.
        let mut maps: HashMap<usize, crate::tensor_map::TensorMapArg> = HashMap::new();
        for (i, p) in k.kernel.abi.params.iter().enumerate() {
            if let kgen_core::abi::AbiSlot::TensorMap { param, map } = &p.slot {
                let Some(ArgValue::Tensor(t)) = args.get(*param as usize) else {
                    continue;
                };
                let ptr = ptrs.get(*param as usize).copied().unwrap_or(0);
                maps.insert(i, self.tensor_map(t.dtype, ptr, &t.shape, &t.strides, map)?);
            }
        }
        {
            let mut b = stream.launch_builder(&k.func);
            for (i, v) in values.iter().enumerate() {
                match maps.get(&i) {
                    Some(m) => b.arg(m),
                    None => b.arg(v),
                };
            }
            if cooperative {
                unsafe { b.launch_cooperative(cfg) }.op("cuLaunchCooperativeKernel")?;
            } else {
                unsafe { b.launch(cfg) }.op("cuLaunchKernel")?;
            }
        }
        end.record(stream).op("cuEventRecord")?;
        stream
            .synchronize()
            .op("cuStreamSynchronize after the kernel (the kernel failed)")?;
        let kernel_ms = start.elapsed_ms(&end).op("cuEventElapsedTime")?;
        for (i, (p, a)) in k
            .kernel
            .abi
            .source_params
            .iter()
            .zip(args.iter_mut())
            .enumerate()
        {
            if let (SourceParam::Tensor { written: true, .. }, ArgValue::Tensor(t)) = (p, a) {
                if let Some(buf) = &buffers[i] {
                    if !t.data.is_empty() {
                        let view = buf.slice(0..t.data.len());
                        stream
                            .memcpy_dtoh(&view, &mut t.data[..])
                            .op("cuMemcpyDtoH")?;
                    }
                }
            }
        }
        stream
            .synchronize()
            .op("cuStreamSynchronize (after the copies out)")?;
        drop(buffers);
        Ok(RunStats {
            kernel_ms,
            launched: true,
        })
    }
}

/// Grid limits of every CUDA device kgen targets.
/// Whether environment variable `var` is `0` or `off`.
fn env_says_off(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "0" || v.eq_ignore_ascii_case("off"))
}

/// The device's stream-ordered memory pool (the one `cuMemAllocAsync` draws from).
fn memory_pool(ctx: &CudaContext) -> Result<sys::CUmemoryPool, RuntimeError> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer; the device handle comes from a live context.
    unsafe { sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()).result() }
        .op("cuDeviceGetMemPool")?;
    Ok(pool)
}

/// Makes the pool keep what is freed for the next allocations instead of handing it back
/// to the driver at every synchronization (the driver's default release threshold is
/// 0 bytes), so that an op allocating its temporaries per call (Newton–Schulz's work
/// buffers, a training step's activations) after a synchronization does not have the
/// driver map fresh pages. On an H100 the GPT training demo measured 2.073M -> 2.088M
/// tokens/s with it (two rounds each). This is what a caching allocator (torch's) does;
/// [`crate::Device::trim_memory`] returns the unused memory, and `KGEN_MEMPOOL_KEEP=0`
/// keeps the driver's default. The pool is the device's current one, shared with any
/// other user of `cuMemAllocAsync` in the process.
fn keep_freed_memory(ctx: &CudaContext) -> Result<(), RuntimeError> {
    let pool = memory_pool(ctx)?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the release threshold attribute reads a u64 through `value`.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
    }
    .op("cuMemPoolSetAttribute")
}

impl Gpu {
    /// Hands the pool's unused memory back to the driver, keeping `keep_bytes` reserved.
    pub(crate) fn trim_memory(&self, keep_bytes: usize) -> Result<(), RuntimeError> {
        if !self.ctx.has_async_alloc() {
            return Ok(());
        }
        self.ctx.bind_to_thread().op("binding the context")?;
        let pool = memory_pool(&self.ctx)?;
        // SAFETY: `pool` is the device's live pool; trimming frees only unused memory.
        unsafe { sys::cuMemPoolTrimTo(pool, keep_bytes).result() }.op("cuMemPoolTrimTo")
    }

    /// Bytes the pool holds from the driver (in use or kept for reuse); 0 without
    /// stream-ordered allocation.
    pub(crate) fn memory_reserved(&self) -> Result<u64, RuntimeError> {
        if !self.ctx.has_async_alloc() {
            return Ok(0);
        }
        self.ctx.bind_to_thread().op("binding the context")?;
        let pool = memory_pool(&self.ctx)?;
        let mut bytes: u64 = 0;
        // SAFETY: the reserved-memory attribute writes a u64 through `value`.
        unsafe {
            sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut bytes as *mut u64).cast(),
            )
            .result()
        }
        .op("cuMemPoolGetAttribute")?;
        Ok(bytes)
    }
}

pub fn check_grid(grid: [u32; 3]) -> Result<(), RuntimeError> {
    if !kgen_core::target::grid_in_limits(grid) {
        return Err(RuntimeError::LaunchConfig(format!(
            "grid {grid:?} exceeds the limits (2^31-1, 65535, 65535)"
        )));
    }
    Ok(())
}

/// Compares the PTX entry's parameter list (as the driver sees it, through
/// cuFuncGetParamInfo, CUDA 12.4+) with the ABI. Accepts silently when the driver cannot
/// tell. Only the ABI's parameters are probed (probing one past the end would be an API
/// error by design, which compute-sanitizer reports); extra PTX parameters are found by
/// counting the entry's `.param` declarations in the PTX text.
fn check_param_layout(func: &CudaFunction, kernel: &CompiledKernel) -> Result<(), String> {
    let f = func.cu_function();
    let n = kernel.abi.params.len();
    for i in 0..n {
        let (mut off, mut size) = (0usize, 0usize);
        let r = unsafe { sys::cuFuncGetParamInfo(f, i, &mut off, &mut size) };
        let ok = r == sys::CUresult::CUDA_SUCCESS;
        if !ok {
            if i == 0 {
                return Ok(()); // not supported by this driver (or no parameters at all)
            }
            return Err(format!(
                "the PTX entry has {i} parameter(s), the ABI lists {n}"
            ));
        }
        let p = &kernel.abi.params[i];
        if size != p.size as usize {
            return Err(format!(
                "PTX parameter {i} (`{}`) has {size} bytes, the ABI says {}",
                p.ptx_name, p.size
            ));
        }
    }
    // No parameter beyond the ABI's: counted in the PTX text, since probing index n
    // with the driver would be a failing API call (which compute-sanitizer reports).
    if let Some(count) = ptx_entry_param_count(&kernel.ptx, &kernel.entry) {
        if count != n {
            return Err(format!(
                "the PTX entry has {count} parameter(s), the ABI lists {n}"
            ));
        }
    }
    Ok(())
}

/// The number of `.param` declarations of `.entry <entry>(...)` in a PTX text, or
/// `None` when the entry is not found.
pub(crate) fn ptx_entry_param_count(ptx: &str, entry: &str) -> Option<usize> {
    let mut rest = ptx;
    loop {
        let at = rest.find(".entry")?;
        let after = rest[at + ".entry".len()..].trim_start();
        if let Some(list) = after.strip_prefix(entry) {
            if let Some(list) = list.trim_start().strip_prefix('(') {
                let list = &list[..list.find(')')?];
                return Some(list.matches(".param").count());
            }
        }
        rest = &rest[at + ".entry".len()..];
    }
}

/// Loads the PTX again with an error-log buffer to recover the JIT's message.
fn jit_error_log(ctx: &Arc<CudaContext>, ptx: &str) -> String {
    let Ok(src) = std::ffi::CString::new(ptx) else {
        return String::new();
    };
    if ctx.bind_to_thread().is_err() {
        return String::new();
    }
    const N: usize = 16 * 1024;
    let mut log = vec![0u8; N];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut std::ffi::c_void; 2] = [log.as_mut_ptr() as *mut _, N as *mut _];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            src.as_ptr() as *const _,
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if r == sys::CUresult::CUDA_SUCCESS && !module.is_null() {
        unsafe {
            let _ = sys::cuModuleUnload(module);
        }
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(N);
    String::from_utf8_lossy(&log[..end]).into_owned()
}
