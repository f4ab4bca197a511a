//! Sets up and times the `kgen bench` workloads on a [`Device`] (a GPU; the interpreter
//! works too, with wall-clock times, for tests of the wiring), plus the launch-cost,
//! first-launch and compile-time measurements.
//!
//! Method (the same as `bench/torch_peers.py`, whose peers run through
//! `triton.testing.do_bench`): inputs are random, never zero (values from a 4 Mi-element
//! host pool tiled over the tensor with device copies), outputs are poisoned with NaN
//! before the first run, preallocated outputs (the ops' `_into` forms), a few warm-up
//! calls (which also run the ops' autotuning), then per timed run: an L2 flush (a memset
//! of 256 MB, outside the timed span), a CUDA event, the op call (every launch of the
//! op), a CUDA event. Quantiles are over the per-run event times. `host_us` is the mean
//! host time to issue one call (10 calls, no sync between them).
//!
//! Assumes the [`Ops`] handle queues on the device's default stream (`Ops::new`), which
//! is where allocations, copies and the flush memset are ordered.

use super::{Kind, Measured};
use crate::ops::{KernelArgs, OpError, Ops};
use crate::optim::{AdamW, GradStats, GradStatsLaunch, ParamGroup};
use crate::rng::Rng;
use cudarc::driver::{sys, CudaStream};
use kgen_core::types::DType;
use kgen_core::{front, Arch, CompileOptions, SourceFile};
use kgen_runtime::{grid_x, CacheStats, Device, DiskCache, RuntimeError, Tensor};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// How a tensor is filled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fill {
    /// `mean + std * n`, n approximately standard normal, |n| >= 0.01 (never exactly
    /// `mean`, so never zero for mean 0).
    Normal { mean: f64, std: f64 },
    /// Uniform in `[lo, hi)` (lo > 0 for positive data such as second moments).
    Uniform { lo: f64, hi: f64 },
    /// NaN everywhere: the poison for outputs.
    Nan,
}

/// Elements of the host pool a fill is tiled from.
const POOL: usize = 1 << 22;

/// A host-generated pool of `n` values (never more than [`POOL`]) on `device`.
pub(super) fn pool(
    device: &Device,
    dtype: DType,
    n: usize,
    how: Fill,
    seed: u64,
) -> Result<Tensor, OpError> {
    let n = n.clamp(1, POOL);
    let mut rng = Rng::new(seed);
    let values: Vec<f64> = (0..n)
        .map(|_| match how {
            Fill::Normal { mean, std } => {
                let z = rng.normalish();
                let z = if z.abs() < 0.01 {
                    0.01f64.copysign(z)
                } else {
                    z
                };
                mean + std * z
            }
            Fill::Uniform { lo, hi } => rng.uniform(lo, hi),
            Fill::Nan => f64::NAN,
        })
        .collect();
    Ok(device.from_f64(dtype, &[n], &values)?)
}

/// Copies `pool` (1-D, t's dtype) over the contiguous `t`, repeating it (device copies
/// on the device's default stream; asynchronous on a GPU).
pub(super) fn tile_from(t: &Tensor, pool: &Tensor) -> Result<(), OpError> {
    let n = t.numel();
    let flat = t.reshape(&[n])?;
    let pool_n = pool.numel();
    let mut off = 0;
    while off < n {
        let len = (n - off).min(pool_n);
        flat.narrow(0, off, len)?
            .copy_from(&pool.narrow(0, 0, len)?)?;
        off += len;
    }
    Ok(())
}

/// Fills the contiguous tensor `t` (values rounded to its dtype).
pub fn fill(t: &Tensor, how: Fill, seed: u64) -> Result<(), OpError> {
    if t.numel() == 0 {
        return Ok(());
    }
    let device = t.device().clone();
    // A pool one element short of a power of two: a tensor larger than it repeats it with
    // a shift, so the rows of a power-of-two-wide matrix are distinct (a pool of exactly
    // 2^22 would make a 4096 x 4096 matrix 4 copies of 1024 rows: rank 1024, which
    // Newton-Schulz cannot orthogonalize).
    let p = pool(&device, t.dtype(), t.numel().min(POOL - 1), how, seed)?;
    tile_from(t, &p)?;
    // The pool is freed when it goes out of scope: let the copies finish first.
    device.synchronize()?;
    Ok(())
}

/// A new tensor filled with `how`.
pub fn filled(
    device: &Device,
    dtype: DType,
    shape: &[usize],
    how: Fill,
    seed: u64,
) -> Result<Tensor, OpError> {
    let t = device.empty(dtype, shape)?;
    fill(&t, how, seed)?;
    Ok(t)
}

fn normal(std: f64) -> Fill {
    Fill::Normal { mean: 0.0, std }
}

/// One timed call of a workload.
pub type RunFn<'a> = Box<dyn FnMut() -> Result<(), OpError> + 'a>;
/// Called once after timing; returns a note for the report (e.g. a skipped pass).
pub type AfterFn<'a> = Box<dyn FnMut() -> Result<Option<String>, OpError> + 'a>;

/// A workload set up on a device, ready to be called.
pub struct Prepared<'a> {
    pub run: RunFn<'a>,
    pub after: Option<AfterFn<'a>>,
    /// What the run writes (outputs poisoned with NaN before the first call; in-place
    /// optimizer buffers hold their random start values).
    pub outputs: Vec<(&'static str, Tensor)>,
}

/// Sets the workload up on `ops`' device: random inputs, NaN-poisoned outputs.
pub fn prepare<'a>(ops: &'a Ops, kind: &Kind, seed: u64) -> Result<Prepared<'a>, OpError> {
    let dev = ops.device().clone();
    let bf = DType::BF16;
    let nan = |dt: DType, shape: &[usize]| filled(&dev, dt, shape, Fill::Nan, 0);
    let rnd =
        |dt: DType, shape: &[usize], how: Fill, k: u64| filled(&dev, dt, shape, how, seed ^ k);
    Ok(match kind.clone() {
        Kind::Copy { bytes } => {
            let n = bytes / 2;
            let src = rnd(bf, &[n], normal(1.0), 1)?;
            let dst = nan(bf, &[n])?;
            let out = dst.clone();
            Prepared {
                run: Box::new(move || Ok(dst.copy_from(&src)?)),
                after: None,
                outputs: vec![("dst", out)],
            }
        }
        Kind::AdamW {
            param,
            state,
            shapes,
        } => {
            let opt = adamw_with_random_state(ops, param, state, shapes, seed)?;
            let outputs = vec![
                ("p", opt.params_flat().clone()),
                ("m", opt.exp_avg_flat().clone()),
                ("v", opt.exp_avg_sq_flat().clone()),
            ];
            let mut opt = opt;
            Prepared {
                run: Box::new(move || opt.step(ops)),
                after: None,
                outputs,
            }
        }
        Kind::Norm {
            layer,
            rows,
            hidden,
            bwd,
        } => {
            let x = rnd(bf, &[rows, hidden], normal(1.0), 1)?;
            let w = rnd(
                bf,
                &[hidden],
                Fill::Normal {
                    mean: 1.0,
                    std: 0.1,
                },
                2,
            )?;
            let b = rnd(bf, &[hidden], normal(0.1), 3)?;
            let y = nan(bf, &[rows, hidden])?;
            let mean = nan(DType::F32, &[rows])?;
            let rstd = nan(DType::F32, &[rows])?;
            let dy = rnd(bf, &[rows, hidden], normal(1.0), 4)?;
            let dx = nan(bf, &[rows, hidden])?;
            let dw = nan(bf, &[hidden])?;
            let db = nan(bf, &[hidden])?;
            let mut outputs = vec![("y", y.clone()), ("rstd", rstd.clone())];
            if layer {
                outputs.push(("mean", mean.clone()));
            }
            if bwd {
                outputs.push(("dx", dx.clone()));
                outputs.push(("dw", dw.clone()));
                if layer {
                    outputs.push(("db", db.clone()));
                }
            }
            let run: RunFn = match (layer, bwd) {
                (false, false) => Box::new(move || ops.rmsnorm_into(&x, &w, &y, &rstd, 1e-6)),
                (false, true) => Box::new(move || {
                    ops.rmsnorm_into(&x, &w, &y, &rstd, 1e-6)?;
                    ops.rmsnorm_backward_into(&x, &w, &rstd, &dy, &dx, &dw)
                }),
                (true, false) => {
                    Box::new(move || ops.layernorm_into(&x, &w, &b, &y, &mean, &rstd, 1e-5))
                }
                (true, true) => Box::new(move || {
                    ops.layernorm_into(&x, &w, &b, &y, &mean, &rstd, 1e-5)?;
                    ops.layernorm_backward_into(&x, &w, &mean, &rstd, &dy, &dx, &dw, &db)
                }),
            };
            Prepared {
                run,
                after: None,
                outputs,
            }
        }
        Kind::AddRmsnorm { rows, hidden, bwd } => {
            let x = rnd(bf, &[rows, hidden], normal(1.0), 1)?;
            let res = rnd(bf, &[rows, hidden], normal(1.0), 2)?;
            let w = rnd(
                bf,
                &[hidden],
                Fill::Normal {
                    mean: 1.0,
                    std: 0.1,
                },
                3,
            )?;
            let (h, y) = (nan(bf, &[rows, hidden])?, nan(bf, &[rows, hidden])?);
            let rstd = nan(DType::F32, &[rows])?;
            let mut outputs = vec![("h", h.clone()), ("y", y.clone()), ("rstd", rstd.clone())];
            if !bwd {
                return Ok(Prepared {
                    run: Box::new(move || ops.add_rmsnorm_into(&x, &res, &w, &h, &y, &rstd, 1e-6)),
                    after: None,
                    outputs,
                });
            }
            let dy = rnd(bf, &[rows, hidden], normal(1.0), 4)?;
            let dres = rnd(bf, &[rows, hidden], normal(1.0), 5)?;
            let (dh, dw) = (nan(bf, &[rows, hidden])?, nan(bf, &[hidden])?);
            outputs.push(("dh", dh.clone()));
            outputs.push(("dw", dw.clone()));
            Prepared {
                run: Box::new(move || {
                    ops.add_rmsnorm_into(&x, &res, &w, &h, &y, &rstd, 1e-6)?;
                    ops.add_rmsnorm_backward_into(&h, &w, &rstd, &dy, &dres, &dh, &dw)
                }),
                after: None,
                outputs,
            }
        }
        Kind::Swiglu { rows, cols, bwd } => {
            let gate = rnd(bf, &[rows, cols], normal(1.0), 1)?;
            let up = rnd(bf, &[rows, cols], normal(1.0), 2)?;
            let out = nan(bf, &[rows, cols])?;
            let mut outputs = vec![("out", out.clone())];
            if !bwd {
                return Ok(Prepared {
                    run: Box::new(move || ops.swiglu_into(&gate, &up, &out)),
                    after: None,
                    outputs,
                });
            }
            let dout = rnd(bf, &[rows, cols], normal(1.0), 3)?;
            let dgate = nan(bf, &[rows, cols])?;
            let dup = nan(bf, &[rows, cols])?;
            outputs.push(("dgate", dgate.clone()));
            outputs.push(("dup", dup.clone()));
            Prepared {
                run: Box::new(move || {
                    ops.swiglu_into(&gate, &up, &out)?;
                    ops.swiglu_backward_into(&gate, &up, &dout, &dgate, &dup)
                }),
                after: None,
                outputs,
            }
        }
        Kind::Rope { b, s, h, d, bwd } => {
            let q = rnd(bf, &[b, s, h, d], normal(1.0), 1)?;
            // bf16 tables, as the torch peer's (Hugging Face Llama's `cos.to(x.dtype)`).
            let (cos, sin) = Ops::rope_tables_as(&dev, bf, s, d, 10000.0)?;
            let out = nan(bf, &[b, s, h, d])?;
            let mut outputs = vec![("out", out.clone())];
            if !bwd {
                return Ok(Prepared {
                    run: Box::new(move || ops.rope_into(&q, &cos, &sin, &out)),
                    after: None,
                    outputs,
                });
            }
            let dy = rnd(bf, &[b, s, h, d], normal(1.0), 2)?;
            let dq = nan(bf, &[b, s, h, d])?;
            outputs.push(("dq", dq.clone()));
            Prepared {
                run: Box::new(move || {
                    ops.rope_into(&q, &cos, &sin, &out)?;
                    ops.rope_backward_into(&dy, &cos, &sin, &dq)
                }),
                after: None,
                outputs,
            }
        }
        Kind::Softmax { rows, cols } => {
            let x = rnd(bf, &[rows, cols], normal(1.0), 1)?;
            let y = nan(bf, &[rows, cols])?;
            let outputs = vec![("y", y.clone())];
            Prepared {
                run: Box::new(move || ops.softmax_into(&x, &y)),
                after: None,
                outputs,
            }
        }
        Kind::CrossEntropy {
            rows,
            vocab,
            ignore_every,
        } => {
            let logits = rnd(bf, &[rows, vocab], normal(1.0), 1)?;
            let mut rng = Rng::new(seed ^ 2);
            let t: Vec<i64> = (0..rows)
                .map(|i| {
                    if ignore_every > 0 && i % ignore_every == 0 {
                        -100
                    } else {
                        (rng.next_u64() % vocab as u64) as i64
                    }
                })
                .collect();
            let targets = dev.from_slice(&[rows], &t)?;
            let loss = nan(DType::F32, &[1])?;
            let dlogits = nan(bf, &[rows, vocab])?;
            let row_loss = nan(DType::F32, &[rows])?;
            let stats = nan(DType::F32, &[2])?;
            let outputs = vec![
                ("loss", loss.clone()),
                ("dlogits", dlogits.clone()),
                ("row_loss", row_loss.clone()),
                ("stats", stats.clone()),
            ];
            Prepared {
                run: Box::new(move || {
                    ops.cross_entropy_into(
                        &logits, &targets, -100, &loss, &dlogits, &row_loss, &stats,
                    )
                }),
                after: None,
                outputs,
            }
        }
        Kind::ClipGradNorm { shapes } | Kind::GradNorm { shapes } => {
            let clip = matches!(kind, Kind::ClipGradNorm { .. });
            let opt = adamw_with_random_state(ops, DType::F32, DType::F32, shapes, seed)?;
            let grads = opt.grads_flat().clone();
            drop(opt); // the gradient buffer is shared; p, m, v are not needed
            let stats = GradStats::new(ops, GradStatsLaunch::default())?;
            let out = stats.stats().clone();
            fill(&out, Fill::Nan, 0)?;
            let mut outputs = vec![("stats", out.clone())];
            if clip {
                outputs.push(("grads", grads.clone()));
            }
            let run: RunFn = if clip {
                Box::new(move || stats.clip_(ops, &grads, 1.0))
            } else {
                Box::new(move || stats.compute(ops, &grads, f32::INFINITY))
            };
            let after: Option<AfterFn> = if clip {
                Some(Box::new(move || {
                    let v = out.to_f64_vec()?;
                    Ok(match v.get(3) {
                        Some(c) if *c >= 1.0 => Some(format!(
                            "clip coefficient {c}: the scale pass was skipped, timing is norm only"
                        )),
                        Some(c) if !c.is_finite() => Some(format!("clip coefficient {c}")),
                        _ => None,
                    })
                }))
            } else {
                None
            };
            Prepared {
                run,
                after,
                outputs,
            }
        }
    })
}

/// An AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.1: torch_peers.py's)
/// whose parameters, gradients and moments hold random values (padding stays zero).
pub(super) fn adamw_with_random_state(
    ops: &Ops,
    param: DType,
    state: DType,
    shapes: Vec<Vec<usize>>,
    seed: u64,
) -> Result<AdamW, OpError> {
    let mut group = ParamGroup::new(1e-3);
    group.weight_decay = 0.1;
    group.shapes = shapes;
    let opt = AdamW::new(ops, param, state, vec![group])?;
    let slots = opt.layout().segments[0].slots.clone();
    let bufs = [
        (opt.params_flat(), normal(0.02)),
        (opt.grads_flat(), normal(0.01)),
        (opt.exp_avg_flat(), normal(1e-3)),
        (opt.exp_avg_sq_flat(), Fill::Uniform { lo: 1e-7, hi: 1e-5 }),
    ];
    let largest = slots.iter().map(|s| s.numel).max().unwrap_or(1);
    for (k, (buf, how)) in bufs.into_iter().enumerate() {
        // Per tensor (its view of the flat buffer), so the padding between tensors stays
        // zero as the optimizer requires; one pool per buffer.
        let p = pool(
            ops.device(),
            buf.dtype(),
            largest,
            how,
            seed ^ ((k as u64 + 1) << 32),
        )?;
        for s in &slots {
            tile_from(&buf.narrow(0, s.offset, s.numel)?, &p)?;
        }
        ops.device().synchronize()?;
    }
    Ok(opt)
}

/// Times calls of one workload.
pub struct Timer {
    clock: Clock,
    flush: Option<Tensor>,
    device: Device,
    pub runs: usize,
    pub warmup: usize,
}

enum Clock {
    Events(Arc<CudaStream>),
    Wall,
}

fn drv<T>(op: &'static str, r: Result<T, cudarc::driver::DriverError>) -> Result<T, OpError> {
    r.map_err(|err| OpError::Runtime(RuntimeError::Driver { op, err }))
}

impl Timer {
    /// CUDA events on `ops`' stream (wall clock on the interpreter); `flush_bytes` > 0
    /// allocates the buffer that is cleared before each timed run to empty the L2.
    pub fn new(
        ops: &Ops,
        runs: usize,
        warmup: usize,
        flush_bytes: usize,
    ) -> Result<Timer, OpError> {
        let clock = match ops.stream().cudarc() {
            Some(s) => Clock::Events(s.clone()),
            None => Clock::Wall,
        };
        let flush = if flush_bytes > 0 {
            Some(ops.empty(DType::F32, &[flush_bytes / 4])?)
        } else {
            None
        };
        Ok(Timer {
            clock,
            flush,
            device: ops.device().clone(),
            runs: runs.max(1),
            warmup,
        })
    }

    fn sync(&self) -> Result<(), OpError> {
        match &self.clock {
            Clock::Events(s) => drv("cuStreamSynchronize", s.synchronize())?,
            Clock::Wall => {}
        }
        Ok(self.device.synchronize()?)
    }

    /// Warm-up calls, then `runs` timed calls (each after an L2 flush), then 10 untimed
    /// calls for the host time.
    pub fn time(&self, run: &mut dyn FnMut() -> Result<(), OpError>) -> Result<Measured, OpError> {
        for _ in 0..self.warmup {
            run()?;
        }
        self.sync()?;
        let mut times = Vec::with_capacity(self.runs);
        match &self.clock {
            Clock::Events(s) => {
                let ctx = s.context();
                let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
                let mut events = Vec::with_capacity(self.runs);
                for _ in 0..self.runs {
                    events.push((
                        drv("cuEventCreate", ctx.new_event(flags))?,
                        drv("cuEventCreate", ctx.new_event(flags))?,
                    ));
                }
                for (a, b) in &events {
                    if let Some(f) = &self.flush {
                        f.fill_zero()?;
                    }
                    drv("cuEventRecord", a.record(s))?;
                    run()?;
                    drv("cuEventRecord", b.record(s))?;
                }
                self.sync()?;
                for (a, b) in &events {
                    times.push(drv("cuEventElapsedTime", a.elapsed_ms(b))? as f64 * 1e3);
                }
            }
            Clock::Wall => {
                for _ in 0..self.runs {
                    if let Some(f) = &self.flush {
                        f.fill_zero()?;
                    }
                    let t = Instant::now();
                    run()?;
                    self.sync()?;
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        let host_us = self.host_us(run, 10)?;
        Measured::from_times(&times, host_us)
            .ok_or_else(|| OpError::Runtime(RuntimeError::LaunchConfig("no timed runs".into())))
    }

    /// Mean host time to issue one call, `calls` calls without a sync between them.
    pub fn host_us(
        &self,
        run: &mut dyn FnMut() -> Result<(), OpError>,
        calls: usize,
    ) -> Result<f64, OpError> {
        self.sync()?;
        let t = Instant::now();
        for _ in 0..calls {
            run()?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64;
        self.sync()?;
        Ok(us)
    }
}

/// Host cost of one launch, measured while the GPU is busy (so the launch queue never
/// makes the host wait for the GPU; timing launches of a tiny kernel back to back
/// measures the GPU's per-kernel time instead once the queue fills up).
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchCost {
    /// Launches per timed round.
    pub launches: usize,
    /// Timed rounds (the median is reported).
    pub rounds: usize,
    /// `Device::launch` of a loaded kernel (ABI checks, packing, `cuLaunchKernel`):
    /// host µs per launch.
    pub launch_us: f64,
    /// A bare `cuLaunchKernel` of the same kernel with parameters packed once
    /// ([`kgen_runtime::PackedLaunch`]): the driver's floor. None on the interpreter.
    pub bare_us: Option<f64>,
    /// `Ops::relu_into` (shape checks, kernel-map lookup, `Device::launch`): host µs.
    pub op_us: f64,
    /// `Ops::rmsnorm_backward_into` of 4 × 64 bf16 rows, an op of two launches (the
    /// tuned row kernel and dw's column sum): host µs per call.
    pub two_launch_op_us: f64,
    /// The same launches recorded into a CUDA graph ([`kgen_runtime::Graph`]) and
    /// replayed: host µs per `Graph::launch` (one `cuGraphLaunch` of `launches` kernels)
    /// and per kernel in it. None on the interpreter.
    pub graph: Option<(f64, f64)>,
}

/// [`LaunchCost`] of a one-block kernel (relu over 1024 f32): `rounds` rounds of
/// `launches` launches each, every round queued behind about 5 ms of GPU work (30 relu
/// launches over 64 Mi f32) so that the GPU never catches up with the host; the kinds
/// of launch are interleaved round by round; medians over rounds. The graph rounds time
/// 10 replays of a graph of `launches` launches (on its own stream, so they queue
/// behind nothing: the host cost of `cuGraphLaunch` does not depend on it).
pub fn launch_cost(ops: &Ops, launches: usize, rounds: usize) -> Result<LaunchCost, OpError> {
    let dev = ops.device();
    let x = filled(dev, DType::F32, &[1024], normal(1.0), 11)?;
    let y = dev.empty(DType::F32, &[1024])?;
    let relu_args = KernelArgs::new().tensor("x", &x).tensor("y", &y);
    let k = ops.kernel(
        "relu",
        "relu",
        &[("T", "f32".into()), ("BLOCK", "1024".into())],
        None,
        &relu_args,
    )?;
    let args = relu_args.args();
    let grid = grid_x(1)?;
    // The two-launch op's tensors: x, w, dy random; rstd positive; dx, dw outputs.
    let (rows, cols) = (4, 64);
    let nx = filled(dev, DType::BF16, &[rows, cols], normal(1.0), 12)?;
    let nw = filled(dev, DType::BF16, &[cols], normal(1.0), 13)?;
    let ndy = filled(dev, DType::BF16, &[rows, cols], normal(1.0), 14)?;
    let nrstd = dev.from_f64(DType::F32, &[rows], &[0.9, 1.1, 1.0, 0.8])?;
    let (ndx, ndw) = (
        dev.empty(DType::BF16, &[rows, cols])?,
        dev.empty(DType::BF16, &[cols])?,
    );
    let norm_bwd = || ops.rmsnorm_backward_into(&nx, &nw, &nrstd, &ndy, &ndx, &ndw);
    // The GPU-side filler (GPU only: the interpreter runs launches synchronously).
    let big = if dev.is_gpu() { 64 << 20 } else { 0 };
    let bx = dev.zeros(DType::F32, &[big.max(1)])?;
    let by = dev.empty(DType::F32, &[big.max(1)])?;
    let busy = || -> Result<(), OpError> {
        if big > 0 {
            for _ in 0..30 {
                ops.relu_into(&bx, &by)?;
            }
        }
        Ok(())
    };
    let mut packed = if dev.is_gpu() {
        Some(kgen_runtime::PackedLaunch::new(
            dev,
            ops.stream(),
            &k,
            grid,
            args,
        )?)
    } else {
        None
    };
    let round = |f: &mut dyn FnMut() -> Result<(), OpError>| -> Result<f64, OpError> {
        dev.synchronize()?;
        busy()?;
        let t = Instant::now();
        for _ in 0..launches {
            f()?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / launches.max(1) as f64;
        dev.synchronize()?;
        Ok(us)
    };
    // Warm-up (kernel lookups, first launches).
    for _ in 0..10 {
        ops.launch(&k, grid, args)?;
        ops.relu_into(&x, &y)?;
        norm_bwd()?;
    }
    // The graph: `launches` launches of the kernel, captured on a stream of their own.
    let graph = if dev.is_gpu() {
        let s = dev.new_stream()?;
        s.begin_capture()?;
        let captured = (0..launches).try_for_each(|_| dev.launch(&s, &k, grid, args));
        let g = s.end_capture()?;
        captured?;
        Some(g)
    } else {
        None
    };
    const GRAPH_CALLS: usize = 10;
    let (mut ours, mut bare, mut op, mut two, mut graph_us) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        ours.push(round(&mut || ops.launch(&k, grid, args))?);
        if let Some(p) = packed.as_mut() {
            // SAFETY: x and y outlive `packed` (both live until the end of this function)
            // and the stream is the ops' own.
            bare.push(round(&mut || Ok(unsafe { p.launch() }?))?);
        }
        op.push(round(&mut || ops.relu_into(&x, &y))?);
        two.push(round(&mut || norm_bwd())?);
        if let Some(g) = &graph {
            dev.synchronize()?;
            busy()?;
            let t = Instant::now();
            for _ in 0..GRAPH_CALLS {
                g.launch()?;
            }
            graph_us.push(t.elapsed().as_secs_f64() * 1e6 / GRAPH_CALLS as f64);
            dev.synchronize()?;
        }
    }
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(LaunchCost {
        launches,
        rounds: rounds.max(1),
        launch_us: median(ours),
        bare_us: (!bare.is_empty()).then(|| median(bare)),
        op_us: median(op),
        two_launch_op_us: median(two),
        graph: (!graph_us.is_empty()).then(|| {
            let per_graph = median(graph_us);
            (per_graph, per_graph / launches.max(1) as f64)
        }),
    })
}

/// First launch of a bundled kernel in a fresh [`Device`].
#[derive(Clone, Debug, PartialEq)]
pub struct FirstLaunch {
    /// `Device::cuda_with_disk_cache` (context, stream), ms.
    pub open_ms: f64,
    /// Kernel lookup (kgen compile + driver JIT + load, or disk hit + load), one launch,
    /// sync: ms.
    pub first_ms: f64,
    pub stats: CacheStats,
}

/// What [`first_launches`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct FirstLaunches {
    pub kernel: String,
    /// Fresh device, empty cache directory.
    pub cold: FirstLaunch,
    /// Another fresh device on the cache directory `cold` filled.
    pub warm_disk: FirstLaunch,
    /// A second lookup on the warm device (in-memory hit) plus a launch: µs.
    pub memory_hit_us: f64,
    /// Where a cold first launch goes, piece by piece.
    pub breakdown: JitBreakdown,
}

/// The pieces of a cold kernel build, each timed alone on a fresh device (ms).
#[derive(Clone, Debug, PartialEq)]
pub struct JitBreakdown {
    /// kgen: source -> PTX.
    pub kgen_compile_ms: f64,
    /// `cuModuleLoadData` of the PTX: the driver's JIT (what the runtime does), with a
    /// fresh comment in the PTX so that the driver's own cache cannot answer.
    pub load_ptx_ms: f64,
}

/// [`JitBreakdown`] of the first-launch kernel.
fn jit_breakdown(ordinal: usize) -> Result<JitBreakdown, OpError> {
    let file = kgen_core::SourceFile::new(
        "kernels-src/rmsnorm.kg",
        crate::bundled::source("rmsnorm").unwrap_or_default(),
    );
    let dev = Device::cuda_with_disk_cache(ordinal, None)?;
    let mut opts = kgen_core::CompileOptions::new(dev.arch())
        .kernel("rmsnorm")
        .define("T", "bf16")
        .define("BLOCK", "4096")
        .define("ONE_TILE", "true");
    opts.num_warps = Some(crate::ops::norm::default_fwd_warps(4096));
    let t = Instant::now();
    let mut compiled = kgen_core::compile(&file, &opts)
        .map_err(|d| OpError::Runtime(kgen_runtime::RuntimeError::compile(d, &file)))?;
    let kgen_compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let gpu = dev.gpu().ok_or_else(|| {
        OpError::Runtime(kgen_runtime::RuntimeError::LaunchConfig("not a GPU".into()))
    })?;
    // A fresh comment so that the driver's own PTX cache (~/.nv/ComputeCache, off with
    // CUDA_CACHE_DISABLE=1) cannot answer instead of the JIT.
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    compiled.ptx = format!(
        "{}\n// kgen bench {ns} {}\n",
        compiled.ptx,
        std::process::id()
    );
    let t = Instant::now();
    gpu.load(&compiled)?;
    let load_ptx_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(JitBreakdown {
        kgen_compile_ms,
        load_ptx_ms,
    })
}

fn one_first_launch(dir: &Path, ordinal: usize) -> Result<(FirstLaunch, Device), OpError> {
    let t = Instant::now();
    let dev = Device::cuda_with_disk_cache(ordinal, Some(DiskCache::new(dir)))?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    let (x, w, y, rstd) = first_launch_tensors(&dev)?;
    let t = Instant::now();
    let ops = Ops::new(&dev);
    rmsnorm_kernel_launch(&ops, &x, &w, &y, &rstd)?;
    dev.synchronize()?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok((
        FirstLaunch {
            open_ms,
            first_ms,
            stats: dev.cache_stats(),
        },
        dev,
    ))
}

type FourTensors = (Tensor, Tensor, Tensor, Tensor);

fn first_launch_tensors(dev: &Device) -> Result<FourTensors, OpError> {
    let x = filled(dev, DType::BF16, &[1024, 4096], normal(1.0), 5)?;
    let w = filled(
        dev,
        DType::BF16,
        &[4096],
        Fill::Normal {
            mean: 1.0,
            std: 0.1,
        },
        6,
    )?;
    let y = dev.empty(DType::BF16, &[1024, 4096])?;
    let rstd = dev.empty(DType::F32, &[1024])?;
    dev.synchronize()?;
    Ok((x, w, y, rstd))
}

/// The bundled `rmsnorm` as `Ops::rmsnorm` compiles it untuned for 4096 columns (bf16,
/// BLOCK 4096, ONE_TILE, its default warps) on a 1024×4096 input: one kernel lookup
/// through a fresh [`Ops`] and one launch.
fn rmsnorm_kernel_launch(
    ops: &Ops,
    x: &Tensor,
    w: &Tensor,
    y: &Tensor,
    rstd: &Tensor,
) -> Result<(), OpError> {
    let args = KernelArgs::new()
        .tensor("x", x)
        .tensor("w", w)
        .tensor("y", y)
        .tensor("rstd", rstd)
        .scalar("eps", 1e-6f32);
    let k = ops.kernel(
        "rmsnorm",
        "rmsnorm",
        &[
            ("T", "bf16".into()),
            ("BLOCK", "4096".into()),
            ("ONE_TILE", "true".into()),
        ],
        Some(crate::ops::norm::default_fwd_warps(4096)),
        &args,
    )?;
    ops.launch_args(&k, grid_x(x.shape()[0])?, &args)
}

/// The first launch of [`first_launches`]' kernel in this process with an empty disk
/// cache in `dir`: what a fresh process pays when nothing was built in it before (the
/// driver's JIT start-up included), run by `kgen bench` in child processes.
pub fn first_launch_in_this_process(dir: &Path) -> Result<FirstLaunch, OpError> {
    one_first_launch(dir, 0).map(|(f, _)| f)
}

/// First launch in a fresh GPU device with an empty disk cache in `dir` (which must not
/// hold kgen cache entries), then again in another fresh device with the cache `dir` now
/// holds, then an in-memory hit.
pub fn first_launches(dir: &Path, ordinal: usize) -> Result<FirstLaunches, OpError> {
    let (cold, _) = one_first_launch(dir, ordinal)?;
    let (warm_disk, dev) = one_first_launch(dir, ordinal)?;
    let (x, w, y, rstd) = first_launch_tensors(&dev)?;
    let t = Instant::now();
    rmsnorm_kernel_launch(&Ops::new(&dev), &x, &w, &y, &rstd)?;
    dev.synchronize()?;
    let memory_hit_us = t.elapsed().as_secs_f64() * 1e6;
    Ok(FirstLaunches {
        kernel: format!(
            "rmsnorm<T=bf16, BLOCK=4096, ONE_TILE=true>, {} warps, on 1024x4096",
            crate::ops::norm::default_fwd_warps(4096)
        ),
        cold,
        warm_disk,
        memory_hit_us,
        breakdown: jit_breakdown(ordinal)?,
    })
}

/// kgen's DSL → PTX time for one kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileTime {
    pub file: String,
    pub kernel: String,
    pub median_ms: f64,
    pub min_ms: f64,
    pub ptx_lines: usize,
    pub error: Option<String>,
}

/// Compiles every kernel of every bundled file (default parameters) for `arch`, `reps`
/// timed times after one warm-up: median and minimum wall time of the whole pipeline.
pub fn compile_times(arch: Arch, reps: usize) -> Vec<CompileTime> {
    let mut out = Vec::new();
    for (stem, text) in crate::bundled::sources() {
        if !kgen_core::source_targets(text).contains(&arch) {
            continue;
        }
        let file = SourceFile::new(format!("kernels-src/{stem}.kg"), *text);
        let names: Vec<String> = match front::parse(&file) {
            Ok(m) => m.kernels.iter().map(|k| k.name.name.clone()).collect(),
            Err(d) => {
                out.push(CompileTime {
                    file: stem.to_string(),
                    kernel: "-".into(),
                    median_ms: f64::NAN,
                    min_ms: f64::NAN,
                    ptx_lines: 0,
                    error: Some(d.render(&file).lines().next().unwrap_or("").to_string()),
                });
                continue;
            }
        };
        for name in names {
            let opts = CompileOptions::new(arch).kernel(&name);
            let mut row = CompileTime {
                file: stem.to_string(),
                kernel: name.clone(),
                median_ms: f64::NAN,
                min_ms: f64::NAN,
                ptx_lines: 0,
                error: None,
            };
            match kgen_core::compile(&file, &opts) {
                Err(d) => {
                    row.error = Some(d.render(&file).lines().next().unwrap_or("").to_string())
                }
                Ok(k) => {
                    row.ptx_lines = k.ptx.lines().count();
                    let times: Vec<f64> = (0..reps.max(1))
                        .map(|_| {
                            let t = Instant::now();
                            let r = kgen_core::compile(&file, &opts);
                            let ms = t.elapsed().as_secs_f64() * 1e3;
                            std::hint::black_box(r.is_ok());
                            ms
                        })
                        .collect();
                    row.median_ms = super::quantile(&times, 0.5).unwrap_or(f64::NAN);
                    row.min_ms = times.iter().copied().fold(f64::INFINITY, f64::min);
                }
            }
            out.push(row);
        }
    }
    out
}

/// Sets up, times and reports one workload: a [`super::Row`] whose result is the timing
/// or the error that stopped it (set-up, a launch, the note check). Frees the
/// workload's tensors before returning.
pub fn run_workload(ops: &Ops, timer: &Timer, w: &super::Workload, seed: u64) -> super::Row {
    let mut row = super::Row {
        workload: w.name.clone(),
        shape: w.shape.clone(),
        dtype: w.dtype.to_string(),
        floor_bytes: w.floor_bytes(),
        target_us: w.target_us,
        result: Err("not run".into()),
        note: None,
        peers: Vec::new(),
    };
    let mut p = match prepare(ops, &w.kind, seed) {
        Ok(p) => p,
        Err(e) => {
            row.result = Err(format!("set-up failed: {e}"));
            return row;
        }
    };
    row.result = timer.time(&mut p.run).map_err(|e| e.to_string());
    if row.result.is_ok() {
        if let Some(after) = p.after.as_mut() {
            match after() {
                Ok(note) => row.note = note,
                Err(e) => row.note = Some(format!("after-run check failed: {e}")),
            }
        }
    }
    drop(p);
    let _ = ops.device().synchronize();
    row
}
