//! `kgen::ops`: the bundled training-op library, backed by the kernels in `kernels-src/`.
//!
//! Every op runs on a [`Device`] (GPU or interpreter, the same code path) through an
//! [`Ops`] handle that owns the stream the ops are queued on and a per-specialization map
//! of loaded kernels (so a warm call is: shape checks, a map lookup, a launch). Ops never
//! synchronize the host; results are device tensors.
//!
//! ```no_run
//! # fn demo() -> Result<(), kgen::ops::OpError> {
//! use kgen::runtime::Device;
//! let (device, _) = Device::best();
//! let ops = kgen::ops::Ops::new(&device);
//! let x = device.from_f64(kgen::core::DType::BF16, &[8, 64], &vec![0.5; 512])?;
//! let w = device.from_f64(kgen::core::DType::BF16, &[64], &vec![1.0; 64])?;
//! let (y, rstd) = ops.rmsnorm(&x, &w, 1e-6)?;
//! # Ok(()) }
//! ```
//!
//! Files: `norm` (RMSNorm, LayerNorm fwd/bwd), `act` (SwiGLU, ReLU fwd/bwd), `rope`,
//! `attention` (fused scaled-dot-product attention fwd/bwd, GQA, causal),
//! `loss` (softmax, cross-entropy), `gemm` (the tensor-core GEMM with its fused
//! epilogue), `linear` (linear layers forward and backward, matmul), `args` (a launch's
//! arguments, spelled once), and [`crate::optim`] (AdamW,
//! gradient norm and clipping); `plan` (the tuner's choice per shape, and the launch
//! remembered per call signature); `launchable` (every kernel the ops can ask for).
//! The self-checks against float64 references live apart, in [`crate::checks`] (test
//! code: no op file uses it or [`crate::cases`]).

use kgen_core::types::DType;
use kgen_core::{CompileOptions, SourceFile};
use kgen_runtime::{tensor_alignment, Arg, Device, Kernel, RuntimeError, Stream, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub mod act;
mod args;
pub mod attention;
pub mod gemm;
pub mod launchable;
pub mod linear;
pub mod loss;
pub mod newton_schulz;
pub mod norm;
mod plan;
pub mod rope;

pub use args::KernelArgs;

/// What an op can report.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Operand shapes that do not fit the op.
    #[error("{op}: {what}")]
    Shape { op: &'static str, what: String },
    /// An operand dtype the op does not take.
    #[error("{op}: {what}")]
    Dtype { op: &'static str, what: String },
}

pub(crate) fn shape_err(op: &'static str, what: impl Into<String>) -> OpError {
    OpError::Shape {
        op,
        what: what.into(),
    }
}

pub(crate) fn dtype_err(op: &'static str, what: impl Into<String>) -> OpError {
    OpError::Dtype {
        op,
        what: what.into(),
    }
}

/// Ops queued on one stream of one device.
pub struct Ops {
    device: Device,
    stream: Stream,
    pub(crate) kernels: Mutex<HashMap<String, Arc<Kernel>>>,
    pub(crate) tuner: kgen_runtime::autotune::Autotuner,
    /// The tuner's choices (candidate labels) as `launch_tuned` already asked for them,
    /// by "op|shape key".
    tuned: Mutex<HashMap<String, String>>,
    /// Single-launch ops' remembered launches (`plan`).
    plans: Mutex<HashMap<plan::PlanKey, plan::Plan>>,
    /// The f32 scratch buffer of ops that pass partial results between their launches
    /// (the norm backwards' dw / db partials), reused across calls: see
    /// [`Ops::take_workspace`].
    workspace: Mutex<Option<Tensor>>,
    /// The counter of `grid_sync` (one `i32`, zeroed once): every cooperative kernel of
    /// this `Ops` takes it, one after another on its stream ([`Ops::grid_counter`]).
    grid_counter: Mutex<Option<Tensor>>,
    /// A recording handle ([`Ops::recording`]): every kernel asked for, every candidate
    /// of every tuning list built, nothing launched.
    recorded: Option<Mutex<Vec<KernelRequest>>>,
}

/// One kernel specialization the op library asks for: a kernel of `kernels-src/`, its
/// compile-time values, warps, blocks-per-SM bound, pipeline depth, copy engine and
/// warp specialization, and the tensors' alignments (what [`Ops::kernel_variant`]
/// compiles).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelRequest {
    /// The file stem in `kernels-src/`.
    pub stem: String,
    pub kernel: String,
    pub defines: Vec<(String, String)>,
    pub num_warps: Option<u32>,
    pub min_blocks_per_sm: Option<u32>,
    /// Every tensor argument's alignment in bytes (16 where the tensor allows more).
    pub tensor_align: Vec<(String, u32)>,
    /// The software-pipeline depth (`None`: the compiler's).
    pub num_stages: Option<u32>,
    /// `cp.async` instead of TMA on sm_90a.
    pub no_tma: bool,
    /// Warp-specialized on sm_90a (a producer warpgroup issues the TMA copies).
    pub ws: bool,
    /// The target the op asked for it on (its candidate lists differ per target), or
    /// `None` for a specialization of every target.
    pub arch: Option<kgen_core::Arch>,
}

/// How a kernel specialization is built beyond its compile-time values and warps (the
/// options of [`CompileOptions`] an op chooses per candidate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variant {
    /// Blocks that must fit on one SM (`.minnctapersm`), or `None`.
    pub min_blocks_per_sm: Option<u32>,
    /// Software-pipeline depth of the loops feeding `dot` (`None`: the compiler's).
    pub num_stages: Option<u32>,
    /// Keep tile fetches on `cp.async` where the target could use TMA.
    pub no_tma: bool,
    /// Warp-specialize a TMA-fed wgmma kernel (sm_90a; ignored elsewhere).
    pub ws: bool,
}

impl KernelRequest {
    /// The kernel's source file.
    pub fn source(&self) -> Option<SourceFile> {
        let text = crate::bundled::source(&self.stem)?;
        Some(SourceFile::new(
            format!("kernels-src/{}.kg", self.stem),
            text,
        ))
    }

    /// Its compile options for `arch`.
    pub fn compile_options(&self, arch: kgen_core::Arch) -> CompileOptions {
        let mut opts = CompileOptions::new(arch).kernel(&self.kernel);
        for (k, v) in &self.defines {
            opts = opts.define(k, v);
        }
        opts.num_warps = self.num_warps;
        opts.min_blocks_per_sm = self.min_blocks_per_sm;
        opts.tensor_align = self.tensor_align.clone();
        opts.num_stages = self.num_stages;
        opts.no_tma = self.no_tma;
        opts.ws = self.ws;
        opts
    }
}

impl Ops {
    /// Ops on the device's default stream.
    pub fn new(device: &Device) -> Ops {
        Ops::with_stream(device, device.stream())
    }

    /// Ops on a given stream (e.g. `Stream::from_cudarc` of a framework's stream).
    pub fn with_stream(device: &Device, stream: Stream) -> Ops {
        Ops {
            device: device.clone(),
            stream,
            kernels: Mutex::new(HashMap::new()),
            tuner: kgen_runtime::autotune::Autotuner::from_env(),
            tuned: Mutex::new(HashMap::new()),
            plans: Mutex::new(HashMap::new()),
            workspace: Mutex::new(None),
            grid_counter: Mutex::new(None),
            recorded: None,
        }
    }

    /// A handle that records instead of running: every kernel an op asks for (every
    /// candidate of a tuning list: all are built, as before tuning) is compiled and
    /// noted ([`Ops::take_recorded`]), and no launch runs (outputs stay unwritten).
    /// [`launchable::launchable_kernels`] drives every op through one.
    pub fn recording(device: &Device) -> Ops {
        Ops {
            recorded: Some(Mutex::new(Vec::new())),
            ..Ops::new(device)
        }
    }

    /// The kernels a recording handle noted so far (each once, in request order); empty
    /// for a handle that does not record.
    pub fn take_recorded(&self) -> Vec<KernelRequest> {
        self.recorded
            .as_ref()
            .and_then(|r| r.lock().ok().map(|mut v| std::mem::take(&mut *v)))
            .unwrap_or_default()
    }

    /// Whether this handle records instead of launching ([`Ops::recording`]).
    pub(crate) fn is_recording(&self) -> bool {
        self.recorded.is_some()
    }

    /// The `grid_sync` counter of this `Ops`'s cooperative kernels, made (zeroed) on
    /// first use. Each `grid_sync` leaves it 0 or `i32::MIN`, as the next one needs; the
    /// kernels run one at a time on this `Ops`'s stream, so one counter serves them all.
    pub(crate) fn grid_counter(&self) -> Result<Tensor, OpError> {
        let mut g = self
            .grid_counter
            .lock()
            .map_err(|_| shape_err("grid_sync", "counter lock poisoned"))?;
        if let Some(t) = g.as_ref() {
            return Ok(t.clone());
        }
        let t = self.zeros(DType::I32, &[1])?;
        *g = Some(t.clone());
        Ok(t)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    pub fn tuner(&self) -> &kgen_runtime::autotune::Autotuner {
        &self.tuner
    }

    /// Which of `labels` `launch_tuned` chose earlier for `key` ("op|shape key"); None
    /// when it has not, or chose a label that is not among these candidates (the same
    /// shape can offer other candidates, e.g. for other alignments).
    pub(crate) fn tuned_memo(&self, key: &str, labels: &[String]) -> Option<usize> {
        let m = self.tuned.lock().ok()?;
        let chosen = m.get(key)?;
        labels.iter().position(|l| l == chosen)
    }

    pub(crate) fn remember_tuned(&self, key: String, label: &str) {
        if let Ok(mut m) = self.tuned.lock() {
            m.insert(key, label.to_string());
        }
    }

    /// The loaded kernel `name` of `kernels-src/<stem>.kg` with these compile-time values,
    /// warps and the alignments the tensors of `args` (the launch's arguments) actually
    /// have.
    pub fn kernel(
        &self,
        stem: &str,
        name: &str,
        defines: &[(&str, String)],
        num_warps: Option<u32>,
        args: &KernelArgs,
    ) -> Result<Arc<Kernel>, OpError> {
        self.kernel_bounded(stem, name, defines, num_warps, None, args)
    }

    /// [`Ops::kernel`] compiled so that `min_blocks_per_sm` blocks fit on one SM
    /// (registers capped accordingly; `None`: no bound).
    pub fn kernel_bounded(
        &self,
        stem: &str,
        name: &str,
        defines: &[(&str, String)],
        num_warps: Option<u32>,
        min_blocks_per_sm: Option<u32>,
        args: &KernelArgs,
    ) -> Result<Arc<Kernel>, OpError> {
        self.kernel_full(
            stem,
            name,
            defines,
            num_warps,
            min_blocks_per_sm,
            None,
            args,
        )
    }

    /// [`Ops::kernel_bounded`] with a software-pipeline depth for the loops that feed
    /// tensor-core `dot`s (`None`: the compiler's choice).
    #[allow(clippy::too_many_arguments)]
    pub fn kernel_full(
        &self,
        stem: &str,
        name: &str,
        defines: &[(&str, String)],
        num_warps: Option<u32>,
        min_blocks_per_sm: Option<u32>,
        num_stages: Option<u32>,
        args: &KernelArgs,
    ) -> Result<Arc<Kernel>, OpError> {
        let variant = Variant {
            min_blocks_per_sm,
            num_stages,
            ..Variant::default()
        };
        self.kernel_variant(stem, name, defines, num_warps, variant, args)
    }

    /// [`Ops::kernel`] built as `variant` says (blocks per SM, pipeline depth, copy
    /// engine, warp specialization).
    pub fn kernel_variant(
        &self,
        stem: &str,
        name: &str,
        defines: &[(&str, String)],
        num_warps: Option<u32>,
        variant: Variant,
        args: &KernelArgs,
    ) -> Result<Arc<Kernel>, OpError> {
        let Variant {
            min_blocks_per_sm,
            num_stages,
            no_tma,
            ws,
        } = variant;
        // The map's key, built into one buffer (this runs on every op call).
        use std::fmt::Write;
        let mut key = String::with_capacity(96);
        let _ = write!(
            key,
            "{stem}/{name}/{num_warps:?}/{min_blocks_per_sm:?}/{num_stages:?}/{no_tma}/{ws}"
        );
        for (k, v) in defines {
            let _ = write!(key, "/{k}={v}");
        }
        for (k, t) in args.tensors() {
            let a = tensor_alignment(t);
            if a < 16 {
                let _ = write!(key, "/{k}@{a}");
            }
        }
        if let Some(k) = self.kernels.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(k);
        }
        let align: Vec<(String, u32)> = args
            .tensors()
            .map(|(n, t)| (n.to_string(), tensor_alignment(t)))
            .collect();
        if let Some(rec) = &self.recorded {
            let request = KernelRequest {
                stem: stem.to_string(),
                kernel: name.to_string(),
                defines: defines
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
                num_warps,
                min_blocks_per_sm,
                tensor_align: align.clone(),
                num_stages,
                no_tma,
                ws,
                arch: Some(self.device.arch()),
            };
            if let Ok(mut v) = rec.lock() {
                if !v.contains(&request) {
                    v.push(request);
                }
            }
        }
        let text = crate::bundled::source(stem)
            .ok_or_else(|| OpError::Runtime(RuntimeError::NoSource(stem.to_string())))?;
        let file = SourceFile::new(format!("kernels-src/{stem}.kg"), text);
        let mut opts = CompileOptions::new(self.device.arch()).kernel(name);
        for (k, v) in defines {
            opts = opts.define(k, v);
        }
        opts.num_warps = num_warps;
        opts.min_blocks_per_sm = min_blocks_per_sm;
        opts.num_stages = num_stages;
        opts.no_tma = no_tma;
        opts.ws = ws;
        opts.tensor_align = align;
        let k = self.device.kernel(&file, &opts)?;
        if let Ok(mut m) = self.kernels.lock() {
            m.insert(key, k.clone());
        }
        Ok(k)
    }

    /// Launches on this handle's stream.
    pub fn launch(&self, k: &Kernel, grid: [u32; 3], args: &[Arg]) -> Result<(), OpError> {
        if self.is_recording() {
            return Ok(());
        }
        Ok(self.device.launch(&self.stream, k, grid, args)?)
    }

    /// [`Ops::launch`] with the arguments of a [`KernelArgs`] list (the one the kernel
    /// was specialized for).
    pub fn launch_args(
        &self,
        k: &Kernel,
        grid: [u32; 3],
        args: &KernelArgs,
    ) -> Result<(), OpError> {
        self.launch(k, grid, args.args())
    }

    /// An f32 scratch tensor of `shape` (the returned pair's second; the first is the
    /// whole buffer), for partial results passed between one call's launches: the
    /// handle's cached buffer when it is free and large enough, else a fresh one. Hand
    /// the buffer back with [`Ops::give_back_workspace`] once the call's launches are
    /// queued: the next call's launches queue behind them on this handle's stream, so
    /// reusing it is ordered, and a call on another thread meanwhile gets its own. (The
    /// cached buffer also outlives the launches queued on it, which a temporary dropped
    /// at the end of the call does not when this handle's stream is not the device's.)
    pub(crate) fn take_workspace(&self, shape: &[usize]) -> Result<(Tensor, Tensor), OpError> {
        let numel: usize = shape.iter().product();
        let cached = self.workspace.lock().ok().and_then(|mut w| w.take());
        let buf = match cached {
            Some(t) if t.numel() >= numel => t,
            _ => self.empty(DType::F32, &[numel.max(1)])?,
        };
        let view = buf.narrow(0, 0, numel)?.reshape(shape)?;
        Ok((buf, view))
    }

    /// Returns a [`Ops::take_workspace`] buffer (the cache keeps the larger of it and the
    /// one it holds).
    pub(crate) fn give_back_workspace(&self, buf: Tensor) {
        if let Ok(mut w) = self.workspace.lock() {
            if !matches!(&*w, Some(old) if old.numel() >= buf.numel()) {
                *w = Some(buf);
            }
        }
    }

    /// A fresh contiguous tensor, ordered on this handle's stream
    /// ([`Device::empty_on`]): the ops queued there may use it at once, and it is freed
    /// there after them.
    pub fn empty(&self, dtype: DType, shape: &[usize]) -> Result<Tensor, OpError> {
        Ok(self.device.empty_on(&self.stream, dtype, shape)?)
    }

    /// [`Ops::empty`] filled with zeros (on this handle's stream).
    pub fn zeros(&self, dtype: DType, shape: &[usize]) -> Result<Tensor, OpError> {
        Ok(self.device.zeros_on(&self.stream, dtype, shape)?)
    }

    /// Number of SMs (for persistent-style grids); 132 on the interpreter, so that its
    /// grids match an H100's.
    pub fn sm_count(&self) -> usize {
        self.device
            .gpu()
            .map(|g| g.info().sm_count as usize)
            .unwrap_or(132)
    }
}

/// Checks a float dtype (f32, f16, bf16).
pub(crate) fn float_dtype(op: &'static str, t: &Tensor) -> Result<DType, OpError> {
    match t.dtype() {
        d @ (DType::F32 | DType::F16 | DType::BF16) => Ok(d),
        d => Err(dtype_err(op, format!("expected f32, f16 or bf16, got {d}"))),
    }
}

/// Checks that `t` has exactly `shape` and `dtype`.
pub(crate) fn expect(
    op: &'static str,
    name: &str,
    t: &Tensor,
    dtype: DType,
    shape: &[usize],
) -> Result<(), OpError> {
    if t.dtype() != dtype {
        return Err(dtype_err(
            op,
            format!("`{name}` must be {dtype}, got {}", t.dtype()),
        ));
    }
    if t.shape() != shape {
        return Err(shape_err(
            op,
            format!("`{name}` must have shape {shape:?}, got {:?}", t.shape()),
        ));
    }
    Ok(())
}

/// Views `t` as [rows, last] (all leading dimensions merged); `t` must be contiguous
/// over the leading dimensions... a row stride is allowed.
pub(crate) fn as_rows(op: &'static str, t: &Tensor) -> Result<Tensor, OpError> {
    let r = t.rank();
    if r == 0 {
        return Err(shape_err(op, "a scalar has no rows"));
    }
    if r == 2 {
        return Ok(t.clone());
    }
    let last = t.shape()[r - 1];
    let rows: usize = t.shape()[..r - 1].iter().product();
    if t.is_contiguous() {
        return Ok(t.reshape(&[rows, last])?);
    }
    Err(shape_err(
        op,
        format!(
            "expected a contiguous tensor (or a 2-D view), got shape {:?} strides {:?}",
            t.shape(),
            t.strides()
        ),
    ))
}

/// The compiler's default warps for a largest tile of `elems` (about 8 per thread).
pub(crate) fn default_warps(elems: usize) -> u32 {
    let w = (elems / 256).clamp(1, 16) as u32;
    if w.is_power_of_two() {
        w
    } else {
        w.next_power_of_two() / 2
    }
}
