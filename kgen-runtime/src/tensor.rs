//! Typed tensors on a [`Device`]: a dtype, a shape, element strides and an element offset
//! over shared storage. Cloning a tensor or taking a view never copies; copies are the
//! explicit `to_host` / `copy_from_host` / `copy_from` calls.
//!
//! Storage is device memory (`cuMemAllocAsync` on the device's stream when the driver has
//! stream-ordered allocation, freed the same way) or, on the interpreter backend, host
//! memory behind a mutex. Kernels write through shared references (`&Tensor`), as in
//! torch and cudarc's raw launches: the runtime checks at launch that a written tensor
//! does not overlap any other argument.
//!
//! Storage kgen allocates is padded to whole 16-byte vectors; a buffer imported from
//! cudarc (`interop`) is exactly the buffer. Kernels never touch bytes past a view's last
//! element (a vector's width divides the contiguous extent: `tensor_alignment`), so
//! neither needs the padding. Guarantees: a view never reaches outside its storage
//! (every view constructor checks it), and no method panics on bad input.

use crate::device::Device;
use crate::error::{DriverResultExt, RuntimeError};
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use half::{bf16, f16};
use kgen_core::host::{contiguous_strides, HostTensor};
use kgen_core::types::DType;
use std::sync::{Arc, Mutex};

/// The memory behind one or more tensors.
pub(crate) enum Memory {
    Cuda {
        ptr: sys::CUdeviceptr,
        bytes: usize,
        /// The stream it was allocated on (freed there, stream-ordered; host copies of
        /// the tensor are ordered there too).
        stream: Arc<CudaStream>,
        ctx: Arc<CudaContext>,
        stream_ordered: bool,
        /// Memory kgen did not allocate (a cudarc buffer, `Device::tensor_from_cudarc`):
        /// its owner, dropped with the last view, frees it; kgen never does.
        foreign: Option<Arc<dyn std::any::Any + Send + Sync>>,
    },
    Host(Mutex<Vec<u8>>),
}

impl Memory {
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Memory::Cuda { bytes, .. } => *bytes,
            Memory::Host(m) => m.lock().map(|v| v.len()).unwrap_or(0),
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Memory::Cuda {
            ptr,
            stream,
            ctx,
            stream_ordered,
            foreign: None,
            ..
        } = self
        {
            if ctx.bind_to_thread().is_ok() {
                // Freed in its stream's order, unless that stream is capturing a graph
                // now (a free there would be recorded into the graph): then on the
                // legacy default stream, as every free was before tensors had streams.
                let on = if capturing(stream) {
                    std::ptr::null_mut()
                } else {
                    stream.cu_stream()
                };
                unsafe {
                    let _ = if *stream_ordered {
                        result::free_async(*ptr, on)
                    } else {
                        result::free_sync(*ptr)
                    };
                }
            }
        }
    }
}

/// Whether `stream` is capturing a graph (an error reads as not capturing).
fn capturing(stream: &CudaStream) -> bool {
    // SAFETY: a live stream handle of the current context.
    let status = unsafe { result::stream::is_capturing(stream.cu_stream()) };
    matches!(
        status,
        Ok(s) if s != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    )
}

/// A Rust element type with a kgen dtype.
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn write_le(self, out: &mut Vec<u8>);
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&bytes[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(a)
            }
        }
    };
}
element!(f32, DType::F32);
element!(f16, DType::F16);
element!(bf16, DType::BF16);
element!(i32, DType::I32);
element!(u32, DType::U32);
element!(i64, DType::I64);

/// A typed, strided view of device (or interpreter) memory.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) mem: Arc<Memory>,
    pub(crate) device: Device,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .finish()
    }
}

fn view_err(what: String) -> RuntimeError {
    RuntimeError::InvalidView(what)
}

/// The strides of `new` over the elements of a view `(old, strides)` of the same
/// element count, when no copy is needed: the old dimensions split into runs that are
/// each laid out as one block (every stride the next one's times its extent, extents of
/// 1 ignored), and the new dimensions cover those runs exactly (torch's
/// `computeStride`). None otherwise.
fn view_strides(old: &[usize], strides: &[usize], new: &[usize]) -> Option<Vec<usize>> {
    if old.iter().product::<usize>() == 0 || old.is_empty() {
        // No element (or a scalar): any strides describe it.
        return Some(contiguous_strides(new));
    }
    let mut out = vec![0usize; new.len()];
    let mut view_d = new.len() as isize - 1;
    // The stride of the innermost dimension of the current run.
    let mut chunk_base = strides[old.len() - 1];
    let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
    for d in (0..old.len()).rev() {
        tensor_numel *= old[d];
        // The run ends at d when d is the outermost dimension or the one before it is
        // not laid out right outside it.
        if d == 0 || (old[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base) {
            while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                out[view_d as usize] = view_numel * chunk_base;
                view_numel *= new[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if d > 0 {
                chunk_base = strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

impl Tensor {
    /// A contiguous tensor over fresh memory (`bytes` of it, already allocated).
    pub(crate) fn new_contiguous(
        mem: Arc<Memory>,
        device: Device,
        dtype: DType,
        shape: &[usize],
    ) -> Tensor {
        Tensor {
            mem,
            device,
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of the view's first element in its storage, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    fn elem(&self) -> usize {
        self.dtype.size_bytes() as usize
    }

    /// Row-major with no gaps.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true; // no element: any strides describe it (torch agrees)
        }
        let mut expect = 1usize;
        for d in (0..self.rank()).rev() {
            if self.shape[d] != 1 && self.strides[d] != expect {
                return false;
            }
            expect *= self.shape[d];
        }
        true
    }

    /// Storage elements from the view's first element to the end of the storage.
    pub(crate) fn storage_len_from_offset(&self) -> usize {
        (self.mem.bytes() / self.elem()).saturating_sub(self.offset)
    }

    /// The byte range `[start, end)` of the storage the view can touch (empty for an
    /// empty view), relative to the storage's start.
    pub fn byte_range(&self) -> (usize, usize) {
        if self.numel() == 0 {
            return (self.offset * self.elem(), self.offset * self.elem());
        }
        let last: usize = self
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(n, s)| (n - 1) * s)
            .sum();
        (
            self.offset * self.elem(),
            (self.offset + last + 1) * self.elem(),
        )
    }

    /// Whether two tensors live in the same allocation.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.mem, &other.mem)
    }

    /// Whether the two views may touch a common element. Exact for views with the same
    /// strides whose dimensions nest (each stride ≥ the extent below it times its
    /// stride, as row-major views and their column slices do); otherwise it compares
    /// byte ranges, which may report an overlap that is not there.
    ///
    /// Views of different allocations overlap only when device buffers imported from
    /// cudarc share addresses (two imports of one buffer): then it compares the views'
    /// device byte ranges.
    pub fn overlaps(&self, other: &Tensor) -> bool {
        if self.numel() == 0 || other.numel() == 0 {
            return false;
        }
        if !self.shares_storage(other) {
            return self.overlaps_across_storages(other);
        }
        let (a0, a1) = self.byte_range();
        let (b0, b1) = other.byte_range();
        if a1 <= b0 || b1 <= a0 {
            return false;
        }
        if self.dtype != other.dtype || self.strides != other.strides || !nested(self) {
            return true;
        }
        // Same nested strides: write both offsets in the mixed radix of the strides
        // and intersect the per-dimension coordinate intervals. Exact when no view
        // carries into the dimension above (offset digit + extent ≤ the radix);
        // otherwise conservatively an overlap.
        let mut dims: Vec<usize> = (0..self.rank())
            .filter(|&d| self.shape[d] > 1 || other.shape[d] > 1)
            .collect();
        dims.sort_by_key(|&d| std::cmp::Reverse(self.strides[d]));
        let (mut ra, mut rb) = (self.offset, other.offset);
        for (k, &d) in dims.iter().enumerate() {
            let s = self.strides[d];
            let (ca, cb) = (ra / s, rb / s);
            ra %= s;
            rb %= s;
            let (ea, eb) = (ca + self.shape[d], cb + other.shape[d]);
            if k > 0 {
                let radix = self.strides[dims[k - 1]] / s;
                if ea > radix || eb > radix {
                    return true;
                }
            }
            if ea <= cb || eb <= ca {
                return false;
            }
        }
        ra == rb
    }

    /// Whether two views of different allocations touch common device bytes: only
    /// possible when one is an imported buffer (conservative: byte ranges).
    fn overlaps_across_storages(&self, other: &Tensor) -> bool {
        let imported = |t: &Tensor| {
            matches!(
                &*t.mem,
                Memory::Cuda {
                    foreign: Some(_),
                    ..
                }
            )
        };
        if !imported(self) && !imported(other) {
            return false;
        }
        let range = |t: &Tensor| {
            let (a, b) = t.byte_range();
            let base = match &*t.mem {
                Memory::Cuda { ptr, .. } => *ptr,
                Memory::Host(_) => return None,
            };
            Some((base + a as u64, base + b as u64))
        };
        match (range(self), range(other)) {
            (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
            _ => false,
        }
    }

    fn with_view(&self, shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Tensor {
        Tensor {
            mem: self.mem.clone(),
            device: self.device.clone(),
            dtype: self.dtype,
            shape,
            strides,
            offset,
        }
    }

    /// The same elements with a new shape. The tensor must be contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let n: Option<usize> = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(self.numel()) {
            return Err(view_err(format!(
                "cannot reshape {:?} ({} elements) to {:?}",
                self.shape,
                self.numel(),
                shape
            )));
        }
        if !self.is_contiguous() {
            return Err(view_err(format!(
                "reshape needs a contiguous tensor (shape {:?}, strides {:?})",
                self.shape, self.strides
            )));
        }
        Ok(self.with_view(shape.to_vec(), contiguous_strides(shape), self.offset))
    }

    /// The same elements with a new shape, as a view of the same storage without a
    /// copy, where the strides allow one (torch's `view`): each run of dimensions that
    /// is merged or split must be laid out as one block (e.g. `[B, S, K]` with any row
    /// stride along S as `[B * S, K]` when B's stride is S times that). Otherwise an
    /// `InvalidView` error naming the strides (`reshape` takes contiguous tensors only).
    pub fn view(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let n: Option<usize> = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(self.numel()) {
            return Err(view_err(format!(
                "cannot view {:?} ({} elements) as {:?}",
                self.shape,
                self.numel(),
                shape
            )));
        }
        match view_strides(&self.shape, &self.strides, shape) {
            Some(strides) => Ok(self.with_view(shape.to_vec(), strides, self.offset)),
            None => Err(view_err(format!(
                "cannot view shape {:?} with strides {:?} as {:?} without a copy",
                self.shape, self.strides, shape
            ))),
        }
    }

    /// A 1-D view of a contiguous tensor.
    pub fn flatten(&self) -> Result<Tensor, RuntimeError> {
        self.reshape(&[self.numel()])
    }

    /// Elements `start .. start + len` along `dim` (`x[..., start:start+len, ...]`).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor, RuntimeError> {
        let Some(&n) = self.shape.get(dim) else {
            return Err(view_err(format!(
                "narrow: dimension {dim} of a rank-{} tensor",
                self.rank()
            )));
        };
        if start.checked_add(len).is_none_or(|e| e > n) {
            return Err(view_err(format!(
                "narrow: {start}..{} is outside dimension {dim} of extent {n}",
                start.saturating_add(len)
            )));
        }
        let mut shape = self.shape.clone();
        shape[dim] = len;
        let offset = if len == 0 {
            self.offset
        } else {
            self.offset + start * self.strides[dim]
        };
        Ok(self.with_view(shape, self.strides.clone(), offset))
    }

    /// Index `index` of dimension `dim`, which is removed.
    pub fn select(&self, dim: usize, index: usize) -> Result<Tensor, RuntimeError> {
        let t = self.narrow(dim, index, 1)?;
        if self.shape[dim] <= index {
            return Err(view_err(format!(
                "select: index {index} outside dimension {dim} of extent {}",
                self.shape[dim]
            )));
        }
        let mut shape = t.shape.clone();
        let mut strides = t.strides.clone();
        shape.remove(dim);
        strides.remove(dim);
        Ok(self.with_view(shape, strides, t.offset))
    }

    /// Swaps two dimensions (no copy).
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor, RuntimeError> {
        if d0 >= self.rank() || d1 >= self.rank() {
            return Err(view_err(format!(
                "transpose({d0}, {d1}) of a rank-{} tensor",
                self.rank()
            )));
        }
        let mut shape = self.shape.clone();
        let mut strides = self.strides.clone();
        shape.swap(d0, d1);
        strides.swap(d0, d1);
        Ok(self.with_view(shape, strides, self.offset))
    }

    /// Reorders the dimensions: result dimension `i` is input dimension `order[i]`.
    pub fn permute(&self, order: &[usize]) -> Result<Tensor, RuntimeError> {
        let mut seen = vec![false; self.rank()];
        if order.len() != self.rank()
            || order
                .iter()
                .any(|&d| d >= self.rank() || std::mem::replace(&mut seen[d], true))
        {
            return Err(view_err(format!(
                "permute({order:?}) of a rank-{} tensor",
                self.rank()
            )));
        }
        let shape = order.iter().map(|&d| self.shape[d]).collect();
        let strides = order.iter().map(|&d| self.strides[d]).collect();
        Ok(self.with_view(shape, strides, self.offset))
    }

    /// Device address of the view's first element (GPU tensors).
    pub fn device_ptr(&self) -> Option<u64> {
        match &*self.mem {
            Memory::Cuda { ptr, .. } => Some(ptr + (self.offset * self.elem()) as u64),
            Memory::Host(_) => None,
        }
    }

    /// The bytes the view covers, from its first to its last element (synchronizes).
    fn read_covering(&self) -> Result<Vec<u8>, RuntimeError> {
        let (start, end) = self.byte_range();
        let mut out = vec![0u8; end - start];
        if out.is_empty() {
            return Ok(out);
        }
        match &*self.mem {
            Memory::Cuda {
                ptr, stream, ctx, ..
            } => {
                ctx.bind_to_thread().op("binding the context")?;
                unsafe {
                    result::memcpy_dtoh_async(&mut out, ptr + start as u64, stream.cu_stream())
                }
                .op("cuMemcpyDtoHAsync")?;
                // The copy is on the allocation stream; the device's stream may differ.
                self.device.synchronize()?;
                stream.synchronize().op("cuStreamSynchronize")?;
            }
            Memory::Host(m) => {
                let m = m.lock().map_err(|_| poisoned())?;
                out.copy_from_slice(&m[start..end]);
            }
        }
        Ok(out)
    }

    /// Copies the view to a contiguous host tensor (waits for the device).
    pub fn to_host(&self) -> Result<HostTensor, RuntimeError> {
        let raw = self.read_covering()?;
        let elem = self.elem();
        let mut t = HostTensor::zeros(self.dtype, &self.shape);
        let n = self.numel();
        let mut idx = vec![0usize; self.rank()];
        for i in 0..n {
            let off: usize = idx.iter().zip(&self.strides).map(|(a, s)| a * s).sum();
            t.data[i * elem..(i + 1) * elem].copy_from_slice(&raw[off * elem..(off + 1) * elem]);
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(t)
    }

    /// Every element, row-major, as f64 (waits for the device).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>, RuntimeError> {
        Ok(self.to_host()?.to_f64_vec())
    }

    /// Every element, row-major, as `E` (which must be the tensor's dtype).
    pub fn to_vec<E: Element>(&self) -> Result<Vec<E>, RuntimeError> {
        if E::DTYPE != self.dtype {
            return Err(RuntimeError::Transfer(format!(
                "to_vec::<{}> of a {} tensor",
                E::DTYPE,
                self.dtype
            )));
        }
        let h = self.to_host()?;
        Ok(h.data.chunks_exact(self.elem()).map(E::read_le).collect())
    }

    /// Overwrites the (contiguous) view with a host tensor of the same dtype and shape.
    /// Pageable memory: the copy is complete when this returns.
    pub fn copy_from_host(&self, src: &HostTensor) -> Result<(), RuntimeError> {
        if src.dtype != self.dtype || src.shape != self.shape {
            return Err(RuntimeError::Transfer(format!(
                "copy_from_host: a {} {:?} host tensor into a {} {:?} tensor",
                src.dtype, src.shape, self.dtype, self.shape
            )));
        }
        let contiguous_src = if src.strides == contiguous_strides(&src.shape)
            && src.data.len() == src.num_elements() * self.elem()
        {
            std::borrow::Cow::Borrowed(&src.data[..])
        } else {
            std::borrow::Cow::Owned(src.to_contiguous().data)
        };
        self.write_bytes(&contiguous_src)
    }

    /// Writes raw little-endian bytes over the whole (contiguous) view, synchronously.
    pub(crate) fn write_bytes(&self, bytes: &[u8]) -> Result<(), RuntimeError> {
        if !self.is_contiguous() {
            return Err(RuntimeError::Transfer(format!(
                "copies into a non-contiguous view (shape {:?}, strides {:?}) are not supported",
                self.shape, self.strides
            )));
        }
        if bytes.len() != self.numel() * self.elem() {
            return Err(RuntimeError::Transfer(format!(
                "{} bytes for a view of {} bytes",
                bytes.len(),
                self.numel() * self.elem()
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let start = self.offset * self.elem();
        match &*self.mem {
            Memory::Cuda {
                ptr, stream, ctx, ..
            } => {
                ctx.bind_to_thread().op("binding the context")?;
                unsafe { result::memcpy_htod_async(ptr + start as u64, bytes, stream.cu_stream()) }
                    .op("cuMemcpyHtoDAsync")?;
                stream.synchronize().op("cuStreamSynchronize")?;
            }
            Memory::Host(m) => {
                let mut m = m.lock().map_err(|_| poisoned())?;
                m[start..start + bytes.len()].copy_from_slice(bytes);
            }
        }
        Ok(())
    }

    /// Copies `src` into this tensor on this tensor's stream (the one it was allocated
    /// on, asynchronous on a GPU). Both must be contiguous with the same dtype and
    /// element count.
    pub fn copy_from(&self, src: &Tensor) -> Result<(), RuntimeError> {
        if src.dtype != self.dtype || src.numel() != self.numel() {
            return Err(RuntimeError::Transfer(format!(
                "copy_from: a {} {:?} tensor into a {} {:?} tensor",
                src.dtype, src.shape, self.dtype, self.shape
            )));
        }
        if !src.is_contiguous() || !self.is_contiguous() {
            return Err(RuntimeError::Transfer(
                "copy_from needs contiguous tensors".to_string(),
            ));
        }
        if !self.device.same(&src.device) {
            return Err(RuntimeError::WrongDevice(
                "copy_from: the tensors are on different devices".into(),
            ));
        }
        if self.overlaps(src) && self.offset != src.offset {
            return Err(RuntimeError::Transfer(
                "copy_from: source and destination overlap".into(),
            ));
        }
        let n = self.numel() * self.elem();
        if n == 0 {
            return Ok(());
        }
        match (&*self.mem, &*src.mem) {
            (Memory::Cuda { ctx, stream, .. }, Memory::Cuda { .. }) => {
                ctx.bind_to_thread().op("binding the context")?;
                let stream = stream.cu_stream();
                unsafe {
                    result::memcpy_dtod_async(
                        self.device_ptr().unwrap_or(0),
                        src.device_ptr().unwrap_or(0),
                        n,
                        stream,
                    )
                }
                .op("cuMemcpyDtoDAsync")
            }
            _ => {
                let bytes = src.read_covering()?;
                self.write_bytes(&bytes)
            }
        }
    }

    /// Sets every byte of the (contiguous) view to zero, on the tensor's stream (the one
    /// it was allocated on).
    pub fn fill_zero(&self) -> Result<(), RuntimeError> {
        if self.numel() == 0 {
            return Ok(());
        }
        if !self.is_contiguous() {
            return Err(RuntimeError::Transfer(
                "fill_zero needs a contiguous tensor".into(),
            ));
        }
        let n = self.numel() * self.elem();
        if n == 0 {
            return Ok(());
        }
        match &*self.mem {
            Memory::Cuda { ctx, stream, .. } => {
                ctx.bind_to_thread().op("binding the context")?;
                unsafe {
                    result::memset_d8_async(
                        self.device_ptr().unwrap_or(0),
                        0,
                        n,
                        stream.cu_stream(),
                    )
                }
                .op("cuMemsetD8Async")
            }
            Memory::Host(m) => {
                let mut m = m.lock().map_err(|_| poisoned())?;
                let s = self.offset * self.elem();
                m[s..s + n].fill(0);
                Ok(())
            }
        }
    }

    /// Runs `f` on the host bytes of the whole storage (interpreter backend only).
    pub(crate) fn with_host_storage<R>(
        &self,
        f: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> Result<R, RuntimeError> {
        match &*self.mem {
            Memory::Host(m) => {
                let mut m = m.lock().map_err(|_| poisoned())?;
                Ok(f(&mut m))
            }
            Memory::Cuda { .. } => Err(RuntimeError::WrongDevice(
                "a GPU tensor given to the interpreter".into(),
            )),
        }
    }
}

fn poisoned() -> RuntimeError {
    RuntimeError::Transfer("a tensor's host storage lock was poisoned by a panic".into())
}

/// Whether the dimensions nest: sorted by decreasing stride, each stride is at least the
/// next dimension's extent times its stride (no dimension wraps into another).
fn nested(t: &Tensor) -> bool {
    let mut dims: Vec<(usize, usize)> = t
        .strides
        .iter()
        .copied()
        .zip(t.shape.iter().copied())
        .filter(|&(_, n)| n > 1)
        .collect();
    dims.sort_by_key(|d| std::cmp::Reverse(d.0));
    dims.windows(2).all(|w| w[0].0 >= w[1].0 * w[1].1) && dims.iter().all(|&(s, _)| s > 0)
}
