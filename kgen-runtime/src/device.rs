//! [`Device`] (a CUDA GPU or the interpreter, one API) and [`Stream`].
//!
//! A `Device` is a cheap handle (`Clone` shares it). On a GPU it owns a cudarc context and
//! its default stream; a tensor's allocation, copies and free are ordered on the stream
//! it was allocated on (that one, or the one given to [`Device::empty_on`]), kernels
//! launch on whichever [`Stream`] the caller passes (the default one, a new one, or a
//! cudarc stream of the caller's own, e.g. candle's). Streams are not synchronized with
//! each other by the runtime: as in torch, a tensor used on two streams needs the
//! caller's ordering (`Stream::synchronize` or cudarc events).
//!
//! On the interpreter every launch runs to completion on the calling thread, on
//! host memory, with the GPU's semantics (`kgen_core::interp`). It is slow and exact, and
//! [`Device::describe`] says which one you have.

use crate::error::{DriverResultExt, RuntimeError};
use crate::gpu::{guarded, Gpu};
use crate::kernel::{Kernel, KernelCache};
use crate::tensor::{Element, Memory, Tensor};
use cudarc::driver::{result, sys, CudaStream};
use kgen_core::host::HostTensor;
use kgen_core::types::DType;
use kgen_core::Arch;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) enum Backend {
    Cuda(Gpu),
    Interpreter,
}

pub(crate) struct DeviceInner {
    pub(crate) id: u64,
    pub(crate) backend: Backend,
    pub(crate) kernels: KernelCache,
    /// Why the interpreter was chosen, when `Device::best` fell back to it.
    pub(crate) fallback_reason: Option<String>,
    pub(crate) uploads: Mutex<Option<crate::upload::PinnedRing>>,
    /// The capture state of every stream that began a graph capture (dead or ended ones
    /// are pruned at the next capture): [`Device::synchronize`] must not run while one
    /// of them captures.
    pub(crate) captures: Mutex<Vec<std::sync::Weak<crate::graph::CaptureState>>>,
    /// The target kernels are compiled for, when it is not the GPU's own
    /// ([`Device::cuda_as`]: sm_80 PTX on an sm_90 GPU).
    pub(crate) arch_override: Option<Arch>,
}

/// A CUDA GPU or the interpreter.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.describe())
    }
}

impl Device {
    fn from_backend(backend: Backend, fallback_reason: Option<String>) -> Device {
        Device::with_kernel_cache(backend, fallback_reason, KernelCache::from_env())
    }

    fn with_kernel_cache(
        backend: Backend,
        fallback_reason: Option<String>,
        kernels: KernelCache,
    ) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
                backend,
                kernels,
                fallback_reason,
                uploads: Mutex::new(None),
                captures: Mutex::new(Vec::new()),
                arch_override: None,
            }),
        }
    }

    /// CUDA device `ordinal`. Without a driver or device this is an error
    /// ([`RuntimeError::NoDriver`] / [`RuntimeError::NoDevice`]); it never panics. A GPU
    /// kgen does not target (neither sm_80-class nor sm_90) is refused as well.
    pub fn cuda(ordinal: usize) -> Result<Device, RuntimeError> {
        Device::cuda_with_disk_cache(ordinal, crate::disk_cache::DiskCache::from_env())
    }

    /// [`Device::cuda`] with an explicit disk cache (`None`: memory only) instead of the
    /// one the environment names; for tests and tools that must not share `~/.cache`.
    pub fn cuda_with_disk_cache(
        ordinal: usize,
        disk: Option<crate::disk_cache::DiskCache>,
    ) -> Result<Device, RuntimeError> {
        let gpu = Gpu::new(ordinal)?;
        if gpu.arch().is_none() {
            return Err(RuntimeError::NoDevice(format!(
                "{}: kgen targets sm_80 and sm_90a",
                gpu.info()
            )));
        }
        Ok(Device::with_kernel_cache(
            Backend::Cuda(gpu),
            None,
            KernelCache::with_disk(disk),
        ))
    }

    /// [`Device::cuda`] compiling every kernel for `arch` instead of the GPU's own target:
    /// an H100 runs sm_80 PTX too, so `Device::cuda_as(0, Arch::Sm80)` runs the Ampere
    /// code path (`mma.sync`, `cp.async`) on it, for tests and benchmarks of that path.
    /// A target the GPU cannot run (sm_90a on an sm_80-class GPU) is
    /// [`RuntimeError::NoDevice`].
    pub fn cuda_as(ordinal: usize, arch: Arch) -> Result<Device, RuntimeError> {
        let d = Device::cuda(ordinal)?;
        let own = d.arch();
        if own == arch {
            return Ok(d);
        }
        if arch == Arch::Sm90a {
            return Err(RuntimeError::NoDevice(format!(
                "{}: sm_90a code needs a compute capability 9.0 GPU (this one targets {own})",
                d.describe()
            )));
        }
        let inner = Arc::try_unwrap(d.inner)
            .map_err(|_| RuntimeError::NoDevice("a new device handle is shared".to_string()))?;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                arch_override: Some(arch),
                ..inner
            }),
        })
    }

    /// The CPU interpreter: the same API and results, slowly.
    pub fn interpreter() -> Device {
        Device::from_backend(Backend::Interpreter, None)
    }

    /// The interpreter, choosing kernels' specializations as for `arch` (the IR it runs
    /// is target-independent; what the target changes is which specializations compile,
    /// e.g. how many pipeline stages fit its shared memory).
    pub fn interpreter_as(arch: Arch) -> Device {
        let d = Device::interpreter();
        match Arc::try_unwrap(d.inner) {
            Ok(inner) => Device {
                inner: Arc::new(DeviceInner {
                    arch_override: Some(arch),
                    ..inner
                }),
            },
            Err(inner) => Device { inner },
        }
    }

    /// GPU 0 when there is a usable one, otherwise the interpreter. The second value is
    /// `Some(why)` when it fell back, for the caller to print.
    pub fn best() -> (Device, Option<String>) {
        match Device::cuda(0) {
            Ok(d) => (d, None),
            Err(e) => {
                let why = format!("no usable GPU ({e}); running on the kgen interpreter");
                (
                    Device::from_backend(Backend::Interpreter, Some(why.clone())),
                    Some(why),
                )
            }
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self.inner.backend, Backend::Cuda(_))
    }

    /// The underlying GPU handle (GPU devices only).
    pub fn gpu(&self) -> Option<&Gpu> {
        match &self.inner.backend {
            Backend::Cuda(g) => Some(g),
            Backend::Interpreter => None,
        }
    }

    /// The compile target: the GPU's, or sm_90a for the interpreter (whose input is the
    /// target-independent IR; the arch only selects the specialization).
    pub fn arch(&self) -> Arch {
        self.inner
            .arch_override
            .or_else(|| self.gpu().and_then(|g| g.arch()))
            .unwrap_or(Arch::Sm90a)
    }

    /// One line: the GPU and its target, or the interpreter and why.
    pub fn describe(&self) -> String {
        let d = match &self.inner.backend {
            Backend::Cuda(g) => g.info().to_string(),
            Backend::Interpreter => match &self.inner.fallback_reason {
                Some(why) => format!("kgen interpreter ({why})"),
                None => "kgen interpreter".to_string(),
            },
        };
        match self.inner.arch_override {
            Some(a) => format!("{d}, compiling for {a} instead"),
            None => d,
        }
    }

    /// Whether two handles are the same device.
    pub fn same(&self, other: &Device) -> bool {
        self.inner.id == other.inner.id
    }

    /// The device's default stream.
    pub fn stream(&self) -> Stream {
        Stream {
            device: self.clone(),
            cuda: self.gpu().map(|g| g.stream.clone()),
            capture: Arc::default(),
        }
    }

    /// A new stream (on the interpreter, another handle to the same in-order queue).
    pub fn new_stream(&self) -> Result<Stream, RuntimeError> {
        let cuda = match self.gpu() {
            Some(g) => Some(guarded("creating a stream", || {
                g.ctx.new_stream().op("cuStreamCreate")
            })?),
            None => None,
        };
        Ok(Stream {
            device: self.clone(),
            cuda,
            capture: Arc::default(),
        })
    }

    /// Hands the device memory that freed tensors left in the stream-ordered pool back to
    /// the driver, keeping `keep_bytes` reserved (`torch.cuda.empty_cache()`). kgen keeps
    /// freed memory for the next allocations (no fresh pages mapped per call; unless
    /// `KGEN_MEMPOOL_KEEP=0`), so a process that is done with a large working set and
    /// shares the GPU calls this. Memory still in use stays; nothing to do on the
    /// interpreter.
    pub fn trim_memory(&self, keep_bytes: usize) -> Result<(), RuntimeError> {
        match self.gpu() {
            Some(g) => guarded("trimming the memory pool", || g.trim_memory(keep_bytes)),
            None => Ok(()),
        }
    }

    /// Bytes of device memory the stream-ordered pool holds from the driver, in use or
    /// kept for reuse (`torch.cuda.memory_reserved()`); 0 on the interpreter.
    pub fn memory_reserved(&self) -> Result<u64, RuntimeError> {
        match self.gpu() {
            Some(g) => guarded("reading the memory pool", || g.memory_reserved()),
            None => Ok(0),
        }
    }

    /// Waits until all work queued on the device is done, on every stream (the default
    /// one, [`Device::new_stream`]'s, and cudarc streams of the same context), as
    /// `torch.cuda.synchronize()` does; [`Stream::synchronize`] waits for one stream.
    /// An error while a stream of this device captures a graph (a synchronization there
    /// would break the capture).
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        let Some(g) = self.gpu() else {
            return Ok(());
        };
        let capturing = self
            .inner
            .captures
            .lock()
            .map(|c| c.iter().any(|w| w.upgrade().is_some_and(|s| s.active())))
            .unwrap_or(false);
        if capturing {
            return Err(RuntimeError::Graph(
                "Device::synchronize is not allowed while a stream of the device is capturing \
                 a graph (end the capture first)"
                    .into(),
            ));
        }
        g.ctx.synchronize().op("cuCtxSynchronize")
    }

    /// A contiguous tensor whose contents are unspecified (fresh device memory).
    pub fn empty(&self, dtype: DType, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        self.alloc(None, dtype, shape)
    }

    /// [`Device::empty`] ordered on `stream`: allocated there (stream-ordered), and its
    /// fills, host copies and free are queued there too, so work on `stream` may use it
    /// at once and it is freed only after that work. (A capturing stream allocates on
    /// the device's stream, as `empty` does: the graph keeps what it uses.)
    pub fn empty_on(
        &self,
        stream: &Stream,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        if !stream.device.same(self) {
            return Err(RuntimeError::WrongDevice(
                "the stream belongs to another device".into(),
            ));
        }
        let on = stream.cuda.as_ref().filter(|_| !stream.is_capturing());
        self.alloc(on, dtype, shape)
    }

    /// [`Device::zeros`] ordered on `stream` (see [`Device::empty_on`]).
    pub fn zeros_on(
        &self,
        stream: &Stream,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        let t = self.empty_on(stream, dtype, shape)?;
        t.fill_zero()?;
        Ok(t)
    }

    /// A contiguous tensor allocated on `stream` (None: the device's stream).
    fn alloc(
        &self,
        stream: Option<&Arc<CudaStream>>,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size_bytes() as usize))
            .ok_or_else(|| {
                RuntimeError::InvalidView(format!("shape {shape:?} overflows the address space"))
            })?;
        // Padded to whole 16-byte vectors, never 0 bytes.
        let bytes = n.max(1).div_ceil(16) * 16;
        let mem = match &self.inner.backend {
            Backend::Cuda(g) => guarded("allocating", || {
                g.ctx.bind_to_thread().op("binding the context")?;
                let stream_ordered = g.ctx.has_async_alloc();
                let stream = stream.unwrap_or(&g.stream);
                let ptr = unsafe {
                    if stream_ordered {
                        result::malloc_async(stream.cu_stream(), bytes)
                    } else {
                        result::malloc_sync(bytes)
                    }
                }
                .op("cuMemAlloc")?;
                Ok(Memory::Cuda {
                    ptr,
                    bytes,
                    stream: stream.clone(),
                    ctx: g.ctx.clone(),
                    stream_ordered,
                    foreign: None,
                })
            })?,
            Backend::Interpreter => Memory::Host(Mutex::new(vec![0u8; bytes])),
        };
        Ok(Tensor::new_contiguous(
            Arc::new(mem),
            self.clone(),
            dtype,
            shape,
        ))
    }

    /// A contiguous tensor of zeros.
    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let t = self.empty(dtype, shape)?;
        t.fill_zero()?;
        Ok(t)
    }

    /// A contiguous device copy of a host tensor.
    pub fn from_host(&self, h: &HostTensor) -> Result<Tensor, RuntimeError> {
        let t = self.empty(h.dtype, &h.shape)?;
        t.copy_from_host(h)?;
        Ok(t)
    }

    /// A tensor of `dtype` holding `values` (row-major) rounded to the dtype.
    pub fn from_f64(
        &self,
        dtype: DType,
        shape: &[usize],
        values: &[f64],
    ) -> Result<Tensor, RuntimeError> {
        let n: usize = shape.iter().product();
        if values.len() != n {
            return Err(RuntimeError::Transfer(format!(
                "{} values for shape {shape:?} ({n} elements)",
                values.len()
            )));
        }
        self.from_host(&HostTensor::from_f64(dtype, shape, values))
    }

    /// A tensor holding `values` (row-major), dtype from the element type.
    pub fn from_slice<E: Element>(
        &self,
        shape: &[usize],
        values: &[E],
    ) -> Result<Tensor, RuntimeError> {
        let n: usize = shape.iter().product();
        if values.len() != n {
            return Err(RuntimeError::Transfer(format!(
                "{} values for shape {shape:?} ({n} elements)",
                values.len()
            )));
        }
        let mut bytes = Vec::with_capacity(n * E::DTYPE.size_bytes() as usize);
        for v in values {
            v.write_le(&mut bytes);
        }
        let t = self.empty(E::DTYPE, shape)?;
        t.write_bytes(&bytes)?;
        Ok(t)
    }

    /// Compiles (or takes from the memory or disk cache) and loads one specialization of
    /// a kernel for this device. `opts.arch` is replaced by the device's.
    pub fn kernel(
        &self,
        file: &kgen_core::SourceFile,
        opts: &kgen_core::CompileOptions,
    ) -> Result<Arc<Kernel>, RuntimeError> {
        crate::kernel::get_or_build(self, file, opts)
    }

    /// Every kernel this device has loaded (each specialization once, in no particular
    /// order): e.g. to check [`Kernel::resources`] for spills after a tuning sweep.
    pub fn loaded_kernels(&self) -> Vec<Arc<Kernel>> {
        self.inner.kernels.loaded()
    }

    /// Kernel-cache counters (memory hits, disk hits, compiles, rebuilt entries).
    pub fn cache_stats(&self) -> crate::kernel::CacheStats {
        self.inner.kernels.stats()
    }
}

/// An ordered queue of work on a device.
#[derive(Clone)]
pub struct Stream {
    pub(crate) device: Device,
    pub(crate) cuda: Option<Arc<CudaStream>>,
    /// Graph capture (see `graph`), shared by the stream's clones.
    pub(crate) capture: Arc<crate::graph::CaptureState>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({})", self.device.describe())
    }
}

impl Stream {
    /// Runs kgen work on a cudarc stream you created (candle's, your own). It must belong
    /// to this device's context.
    pub fn from_cudarc(device: &Device, stream: Arc<CudaStream>) -> Result<Stream, RuntimeError> {
        let Some(g) = device.gpu() else {
            return Err(RuntimeError::WrongDevice(
                "a cudarc stream cannot drive the interpreter device".into(),
            ));
        };
        if stream.context().cu_ctx() != g.ctx.cu_ctx() {
            return Err(RuntimeError::WrongDevice(
                "the cudarc stream belongs to another CUDA context than this device".into(),
            ));
        }
        Ok(Stream {
            device: device.clone(),
            cuda: Some(stream),
            capture: Arc::default(),
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The cudarc stream (GPU devices).
    pub fn cudarc(&self) -> Option<&Arc<CudaStream>> {
        self.cuda.as_ref()
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.cuda
            .as_ref()
            .map(|s| s.cu_stream())
            .unwrap_or(std::ptr::null_mut())
    }

    /// Waits for everything queued on this stream (an error while it captures a graph).
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        if self.capture.active() {
            return Err(crate::graph::refused_while_capturing("Stream::synchronize"));
        }
        match &self.cuda {
            Some(s) => s.synchronize().op("cuStreamSynchronize"),
            None => Ok(()),
        }
    }

    /// Makes this stream wait (on the device, not the host) for the work queued so far
    /// on `other`.
    pub fn wait_for(&self, other: &Stream) -> Result<(), RuntimeError> {
        match (&self.cuda, &other.cuda) {
            (Some(a), Some(b)) => a.join(b).op("cuStreamWaitEvent"),
            _ => Ok(()),
        }
    }

    /// Copies a small host buffer into a device tensor (contiguous, exactly that many
    /// bytes) without synchronizing the host: the bytes are staged in pinned memory and
    /// copied asynchronously on this stream. Made for per-step parameter tables.
    pub fn upload_async(&self, dst: &Tensor, bytes: &[u8]) -> Result<(), RuntimeError> {
        crate::upload::upload_async(self, dst, bytes)
    }

    /// [`Stream::upload_async`] of f32 values.
    pub fn upload_f32_async(&self, dst: &Tensor, values: &[f32]) -> Result<(), RuntimeError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.upload_async(dst, &bytes)
    }
}
