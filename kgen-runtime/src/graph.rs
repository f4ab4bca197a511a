//! CUDA graphs of kgen launches: [`Stream::begin_capture`] … [`Stream::end_capture`]
//! records the kernels queued on a stream, and [`Graph::launch`] replays all of them
//! with one `cuGraphLaunch`.
//!
//! Why: a warm [`Device::launch`] costs the host one `cuLaunchKernel` (3-4 µs on the H100
//! test hosts, nearly all of it inside the driver); a graph pays the driver once for a
//! whole sequence, e.g. the forward and backward of a training step.
//!
//! Assumes: the capture runs on a stream from [`Device::new_stream`] (CUDA cannot capture
//! the legacy default stream that [`Device::stream`] is); every kernel the sequence
//! launches is compiled, loaded and tuned already (run the sequence once eagerly first:
//! the ops' autotuning times launches and synchronizes, so inside a capture the ops use
//! the choice made earlier, or their first candidate).
//! Guarantees: no host synchronization and no staged upload can end up inside a graph:
//! `Stream::synchronize`, `Device::synchronize` (while any stream of the device
//! captures), `Device::launch_timed` and `Stream::upload_async` return
//! [`RuntimeError::Graph`] on a capturing stream instead of recording something the
//! replay would get wrong. The graph keeps the memory of every tensor a captured launch
//! received, and the device with its loaded kernels, alive for as long as it exists, and
//! frees that memory only after the replays queued before its drop, so a replay never
//! touches freed memory. A replay reads what the tensors hold when it
//! runs (a graph records addresses, not contents). Capture mode is relaxed: other
//! threads may use the driver meanwhile.

use crate::device::{Device, Stream};
use crate::error::{DriverResultExt, RuntimeError};
use crate::launch::Arg;
use crate::tensor::Memory;
use cudarc::driver::{sys, CudaGraph, CudaStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A stream's capture state, shared by its clones (an `Ops` keeps its own clone).
#[derive(Default)]
pub(crate) struct CaptureState {
    active: AtomicBool,
    /// The memory of every tensor passed to a captured launch, and the launch count.
    kept: Mutex<(Vec<Arc<Memory>>, usize)>,
}

impl CaptureState {
    pub(crate) fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Records a captured launch: keeps its tensors' memory for the graph.
    pub(crate) fn keep(&self, args: &[Arg]) {
        if let Ok(mut k) = self.kept.lock() {
            for a in args {
                if let Arg::Tensor(t) = a {
                    if !k.0.iter().any(|m| Arc::ptr_eq(m, &t.mem)) {
                        k.0.push(t.mem.clone());
                    }
                }
            }
            k.1 += 1;
        }
    }
}

/// Launches recorded from a stream, replayable with one driver call.
pub struct Graph {
    /// None when the capture recorded nothing.
    exec: Option<CudaGraph>,
    launches: usize,
    kept: Vec<Arc<Memory>>,
    device: Device,
    /// The stream replays run on.
    stream: Arc<CudaStream>,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // The kept memory is freed in the order of the device's default stream (where it
        // was allocated): make that stream wait for the replays queued so far first.
        if let Some(g) = self.device.gpu() {
            if !self.kept.is_empty() {
                let _ = g.stream.join(&self.stream);
            }
        }
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({} launches)", self.launches)
    }
}

impl Graph {
    /// Queues every recorded launch, in order, on the stream it was captured from; the
    /// host does not wait.
    pub fn launch(&self) -> Result<(), RuntimeError> {
        match &self.exec {
            Some(g) => g.launch().op("cuGraphLaunch"),
            None => Ok(()),
        }
    }

    /// The number of kernel launches recorded.
    pub fn launches(&self) -> usize {
        self.launches
    }
}

/// The error of an operation a capture cannot hold.
pub(crate) fn refused_while_capturing(what: &str) -> RuntimeError {
    RuntimeError::Graph(format!(
        "{what} is not allowed while the stream is capturing a graph (end the capture first)"
    ))
}

impl Stream {
    /// Starts recording: launches queued on this stream (through any clone of it, e.g. an
    /// `Ops` built on it) are recorded into the graph that [`Stream::end_capture`]
    /// returns instead of running. GPU streams from [`Device::new_stream`] only.
    pub fn begin_capture(&self) -> Result<(), RuntimeError> {
        let Some(s) = &self.cuda else {
            return Err(RuntimeError::Graph(
                "CUDA graphs need a GPU: the interpreter runs each launch when it is queued".into(),
            ));
        };
        if s.cu_stream().is_null() {
            return Err(RuntimeError::Graph(
                "the device's default stream (CUDA's legacy NULL stream) cannot be captured: \
                 capture on a stream from Device::new_stream()"
                    .into(),
            ));
        }
        if self.capture.active.swap(true, Ordering::AcqRel) {
            return Err(RuntimeError::Graph(
                "this stream is already capturing".into(),
            ));
        }
        if let Ok(mut k) = self.capture.kept.lock() {
            *k = (Vec::new(), 0);
        }
        if let Ok(mut c) = self.device.inner.captures.lock() {
            let me = Arc::downgrade(&self.capture);
            c.retain(|w| !w.ptr_eq(&me) && w.upgrade().is_some_and(|s| s.active()));
            c.push(me);
        }
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        if let Err(e) = s.begin_capture(mode).op("cuStreamBeginCapture") {
            self.capture.active.store(false, Ordering::Release);
            return Err(e);
        }
        Ok(())
    }

    /// Ends the capture [`Stream::begin_capture`] started and instantiates its graph.
    pub fn end_capture(&self) -> Result<Graph, RuntimeError> {
        let Some(s) = &self.cuda else {
            return Err(RuntimeError::Graph("this stream is not capturing".into()));
        };
        if !self.capture.active.load(Ordering::Acquire) {
            return Err(RuntimeError::Graph("this stream is not capturing".into()));
        }
        let ended = s
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .op("cuStreamEndCapture");
        self.capture.active.store(false, Ordering::Release);
        let (kept, launches) = self
            .capture
            .kept
            .lock()
            .map(|mut k| std::mem::take(&mut *k))
            .unwrap_or_default();
        Ok(Graph {
            exec: ended?,
            launches,
            kept,
            device: self.device.clone(),
            stream: s.clone(),
        })
    }

    /// Whether [`Stream::begin_capture`] is recording this stream's launches.
    pub fn is_capturing(&self) -> bool {
        self.capture.active()
    }
}
