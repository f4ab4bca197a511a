//! Zero-copy interop with cudarc buffers: [`Device::tensor_from_cudarc`] views a
//! `CudaSlice<T>` of cudarc-based code (candle, your own) as a kgen [`Tensor`], so kgen
//! kernels and ops read and write it in place (with [`crate::Stream::from_cudarc`], on
//! that code's own stream); `tensor_from_cudarc_borrowed` (unsafe) does the same over a
//! borrowed buffer or `CudaView`.
//!
//! Assumes: the slice belongs to this device's CUDA context (checked) and stays alive
//! while any view of it exists (the tensor holds it: a shared `Arc<CudaSlice<T>>` or
//! the slice itself; the borrowed form's caller promises it).
//! Guarantees: no copy, no allocation on the device; the tensor's storage is exactly the
//! slice's bytes (views, launches and aliasing checks stay inside them, and two imports
//! of one buffer count as overlapping); kgen never frees the memory: dropping the last
//! view drops the tensor's hold on the slice, and cudarc frees it on the slice's stream.
//! Host copies of the tensor (`to_host`, `copy_from_host`) are ordered on the slice's
//! stream.
//!
//! Ordering is the caller's, as between any two streams: kgen's launches do not record
//! cudarc's per-buffer events, so run the kernels that use the tensor on the slice's
//! stream (`Stream::from_cudarc(&device, slice.stream().clone())`), or make the streams
//! wait for each other, and keep the slice alive until they are done.

use crate::device::Device;
use crate::error::RuntimeError;
use crate::tensor::{Element, Memory, Tensor};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

impl Device {
    /// A tensor of `shape` over a cudarc buffer of `T` (f32, f16, bf16, i32, u32, i64),
    /// without copying: the first `shape.iter().product()` elements, row-major. Takes the
    /// slice or an `Arc` of it (to keep using it from cudarc too).
    ///
    /// Errors: the interpreter device or a slice of another CUDA context
    /// ([`RuntimeError::WrongDevice`]); a shape with more elements than the slice holds
    /// ([`RuntimeError::InvalidView`]).
    pub fn tensor_from_cudarc<T: Element>(
        &self,
        slice: impl Into<Arc<CudaSlice<T>>>,
        shape: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        let slice: Arc<CudaSlice<T>> = slice.into();
        let ptr = {
            // Read on the slice's own stream: no cross-stream wait, and the read event
            // cudarc records there is already ordered.
            let (ptr, _record) = slice.device_ptr(slice.stream());
            ptr
        };
        let stream = slice.stream().clone();
        let len = slice.len();
        self.import::<T>(ptr, len, stream, shape, slice)
    }

    /// [`Device::tensor_from_cudarc`] over a borrowed cudarc buffer or view (a
    /// `&CudaSlice<T>`, a `CudaView<T>`: what a framework's storage hands out), without
    /// taking it.
    ///
    /// # Safety
    /// The memory must stay allocated, and not be reused, for as long as the tensor or
    /// any view of it exists and while kernels queued on it may still run: kgen holds no
    /// reference to the buffer and cannot check it.
    pub unsafe fn tensor_from_cudarc_borrowed<T: Element, S: DevicePtr<T>>(
        &self,
        slice: &S,
        shape: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        let (ptr, _record) = slice.device_ptr(slice.stream());
        let stream = slice.stream().clone();
        // A marker owner: the buffer is the caller's, kgen frees nothing.
        self.import::<T>(ptr, slice.len(), stream, shape, Arc::new(()))
    }

    /// The checks and the tensor shared by both imports.
    fn import<T: Element>(
        &self,
        ptr: cudarc::driver::sys::CUdeviceptr,
        len: usize,
        stream: Arc<CudaStream>,
        shape: &[usize],
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Tensor, RuntimeError> {
        let Some(g) = self.gpu() else {
            return Err(RuntimeError::WrongDevice(
                "a cudarc buffer cannot back a tensor of the interpreter device".into(),
            ));
        };
        if stream.context().cu_ctx() != g.ctx.cu_ctx() {
            return Err(RuntimeError::WrongDevice(
                "the cudarc buffer belongs to another CUDA context than this device".into(),
            ));
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                RuntimeError::InvalidView(format!("shape {shape:?} overflows the address space"))
            })?;
        if numel > len {
            return Err(RuntimeError::InvalidView(format!(
                "shape {shape:?} has {numel} elements, the cudarc buffer holds {len}"
            )));
        }
        let mem = Memory::Cuda {
            ptr,
            bytes: len * T::DTYPE.size_bytes() as usize,
            stream,
            ctx: g.ctx.clone(),
            stream_ordered: false,
            foreign: Some(owner),
        };
        Ok(Tensor::new_contiguous(
            Arc::new(mem),
            self.clone(),
            T::DTYPE,
            shape,
        ))
    }
}
