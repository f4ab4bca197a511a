//! Zero-copy interop with cudarc buffers: [`Device::tensor_from_cudarc`] views a
//! `CudaSlice<T>` of cudarc-based code (candle, your own) as a kgen [`Tensor`], so kgen
//! kernels and ops read and write it in place (with [`crate::Stream::from_cudarc`], on
//! that code's own stream).
//!
//! Assumes: the slice belongs to this device's CUDA context (checked) and stays alive
//! while any view of it exists (the tensor holds it: a shared `Arc<CudaSlice<T>>` or
//! the slice itself).
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
use cudarc::driver::{CudaSlice, DevicePtr};
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
        let Some(g) = self.gpu() else {
            return Err(RuntimeError::WrongDevice(
                "a cudarc buffer cannot back a tensor of the interpreter device".into(),
            ));
        };
        if slice.context().cu_ctx() != g.ctx.cu_ctx() {
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
        if numel > slice.len() {
            return Err(RuntimeError::InvalidView(format!(
                "shape {shape:?} has {numel} elements, the cudarc buffer holds {}",
                slice.len()
            )));
        }
        // The pointer, read on the slice's own stream: no cross-stream wait, and the
        // read event cudarc records there is already ordered.
        let ptr = {
            let (ptr, _record) = slice.device_ptr(slice.stream());
            ptr
        };
        let mem = Memory::Cuda {
            ptr,
            bytes: slice.num_bytes(),
            stream: slice.stream().clone(),
            ctx: g.ctx.clone(),
            stream_ordered: false,
            foreign: Some(slice as Arc<dyn std::any::Any + Send + Sync>),
        };
        Ok(Tensor::new_contiguous(
            Arc::new(mem),
            self.clone(),
            T::DTYPE,
            shape,
        ))
    }
}
