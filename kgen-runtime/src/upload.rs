//! Small host→device uploads that do not synchronize the host.
//!
//! `cuMemcpyHtoDAsync` from pageable memory synchronizes; from pinned memory it is truly
//! asynchronous. A ring of pinned staging slots, each with an event recorded after its
//! copy, lets the host write the next upload while earlier ones are still in flight. The
//! host waits only when the ring wraps onto a slot whose copy has not run yet, i.e. when
//! it is more than `SLOTS` uploads ahead of the GPU.
//!
//! Assumes: uploads are small (≤ `SLOT_BYTES`, e.g. an optimizer's per-step parameter
//! table). Guarantees: the staged bytes are never overwritten before their copy ran.

use crate::device::Stream;
use crate::error::{DriverResultExt, RuntimeError};
use crate::tensor::Tensor;
use cudarc::driver::{result, sys, CudaContext};
use std::sync::Arc;

/// Staging slots in the ring.
pub const SLOTS: usize = 64;
/// Bytes per slot: the largest asynchronous upload.
pub const SLOT_BYTES: usize = 16 * 1024;

struct Slot {
    host: *mut u8,
    event: sys::CUevent,
    used: bool,
}

/// The pinned staging ring of one device (created on its first upload).
pub(crate) struct PinnedRing {
    slots: Vec<Slot>,
    next: usize,
    /// Keeps the context alive until the slots are freed (the device's fields may drop
    /// in any order).
    ctx: Arc<CudaContext>,
}

// The raw pointers are owned by the ring and only touched under the device's mutex.
unsafe impl Send for PinnedRing {}

impl PinnedRing {
    fn new(ctx: Arc<CudaContext>) -> Result<PinnedRing, RuntimeError> {
        // Built in place so that a failure halfway frees what was allocated (Drop).
        let mut ring = PinnedRing {
            slots: Vec::with_capacity(SLOTS),
            next: 0,
            ctx,
        };
        for _ in 0..SLOTS {
            let host = unsafe { result::malloc_host(SLOT_BYTES, 0) }.op("cuMemHostAlloc")?;
            let event = match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
                Ok(e) => e,
                Err(err) => {
                    let _ = unsafe { result::free_host(host) };
                    return Err(RuntimeError::Driver {
                        op: "cuEventCreate",
                        err,
                    });
                }
            };
            ring.slots.push(Slot {
                host: host as *mut u8,
                event,
                used: false,
            });
        }
        Ok(ring)
    }
}

impl Drop for PinnedRing {
    fn drop(&mut self) {
        // Dropping may happen on any thread: the events and pinned pages belong to the
        // context, which must be current to free them.
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        for s in &self.slots {
            unsafe {
                if s.used {
                    let _ = result::event::synchronize(s.event);
                }
                let _ = result::event::destroy(s.event);
                let _ = result::free_host(s.host as *mut _);
            }
        }
    }
}

pub(crate) fn upload_async(
    stream: &Stream,
    dst: &Tensor,
    bytes: &[u8],
) -> Result<(), RuntimeError> {
    if stream.capture.active() {
        // A replay would copy whatever the staging slot holds by then.
        return Err(crate::graph::refused_while_capturing(
            "Stream::upload_async",
        ));
    }
    if !stream.device.same(dst.device()) {
        return Err(RuntimeError::WrongDevice(
            "upload_async: the tensor is on another device than the stream".into(),
        ));
    }
    let want = dst.numel() * dst.dtype().size_bytes() as usize;
    if !dst.is_contiguous() || want != bytes.len() {
        return Err(RuntimeError::Transfer(format!(
            "upload_async: {} bytes into a {} {:?} view of {want} bytes (must be contiguous and the same size)",
            bytes.len(),
            dst.dtype(),
            dst.shape()
        )));
    }
    if bytes.is_empty() {
        return Ok(());
    }
    let Some(gpu) = stream.device.gpu() else {
        return dst.write_bytes(bytes);
    };
    if bytes.len() > SLOT_BYTES {
        return Err(RuntimeError::Transfer(format!(
            "upload_async takes at most {SLOT_BYTES} bytes, got {}",
            bytes.len()
        )));
    }
    let ptr = dst.device_ptr().unwrap_or(0);
    crate::gpu::guarded("uploading", || {
        gpu.ctx.bind_to_thread().op("binding the context")?;
        let mut guard = stream
            .device
            .inner
            .uploads
            .lock()
            .map_err(|_| RuntimeError::Transfer("the upload ring lock was poisoned".into()))?;
        if guard.is_none() {
            *guard = Some(PinnedRing::new(gpu.ctx.clone())?);
        }
        let ring = guard.as_mut().expect("just created");
        let i = ring.next;
        ring.next = (ring.next + 1) % SLOTS;
        let slot = &mut ring.slots[i];
        if slot.used {
            // Only blocks when the host is SLOTS uploads ahead of the GPU.
            unsafe { result::event::synchronize(slot.event) }.op("cuEventSynchronize")?;
        }
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot.host, bytes.len());
            let staged = std::slice::from_raw_parts(slot.host as *const u8, bytes.len());
            result::memcpy_htod_async(ptr, staged, stream.raw()).op("cuMemcpyHtoDAsync")?;
            result::event::record(slot.event, stream.raw()).op("cuEventRecord")?;
        }
        slot.used = true;
        Ok(())
    })
}
