//! Choosing an op's launch configuration (the autotuner) and remembering the choice per
//! call signature, so that a warm op call is: shape checks, one map lookup, the launch.
//!
//! Assumes: an op's kernels and grids depend only on what its [`PlanKey`] holds (the op,
//! every tensor's dtype, shape, strides and alignment, and the extra words the op adds
//! for scalars that select a kernel); for a single-launch op, its arguments are the same
//! for every candidate configuration (a multi-launch op builds its arguments per call,
//! from the candidate's index).
//! Guarantees: [`Ops::launch_planned`] and [`Ops::launch_tuned_planned`] launch exactly
//! what the slow path (candidate labels, the tuner, the kernel map) would choose for the
//! same key; a choice made while the stream captures a graph without a recorded tuner
//! answer (candidate 0, untimed) is not remembered, so the first call outside the
//! capture still tunes.

use super::{KernelArgs, OpError, Ops};
use kgen_runtime::{tensor_alignment, Arg, Kernel, RuntimeError, Tensor};
use std::sync::Arc;

/// The smallest L2 flush buffer (a device reporting no L2 size still gets one).
const MIN_FLUSH_BYTES: usize = 64 << 20;

/// What a single-launch op's launch depends on: the op and a list of words.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    op: &'static str,
    words: Vec<u64>,
}

impl PlanKey {
    pub(crate) fn new(op: &'static str) -> PlanKey {
        PlanKey {
            op,
            // 8 tensors of rank 2 (7 words each) without growing.
            words: Vec::with_capacity(64),
        }
    }

    /// A scalar that selects the kernel or the grid (a flag, a head count, ...).
    pub(crate) fn word(mut self, w: u64) -> PlanKey {
        self.words.push(w);
        self
    }

    /// A tensor argument: dtype, rank, extents, strides and alignment.
    pub(crate) fn tensor(mut self, t: &Tensor) -> PlanKey {
        self.words.push(t.dtype() as u64);
        self.words.push(t.rank() as u64);
        self.words.extend(t.shape().iter().map(|&d| d as u64));
        self.words.extend(t.strides().iter().map(|&s| s as u64));
        self.words.push(tensor_alignment(t) as u64);
        self
    }

    pub(crate) fn tensors(self, ts: &[&Tensor]) -> PlanKey {
        ts.iter().fold(self, |k, t| k.tensor(t))
    }
}

/// What a tuned op's candidate closure does with the kernels it makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Make them only (the parallel build before tuning).
    Build,
    /// Launch them.
    Launch,
    /// Launch them timed (a tuning run).
    Timed,
}

/// One launch of a candidate: the kernel and its grid.
pub(crate) type Launch = (Arc<Kernel>, [u32; 3]);

/// `launches` as the `N` launches an op's `run` expects (its own `resolve` made them, so
/// another count is an internal error, reported, not a panic).
pub(crate) fn launches_of<'a, const N: usize>(
    op: &str,
    launches: &'a [Launch],
) -> Result<&'a [Launch; N], OpError> {
    launches.try_into().map_err(|_| {
        OpError::Runtime(RuntimeError::LaunchConfig(format!(
            "{op}: a plan of {N} launches expected, got {}",
            launches.len()
        )))
    })
}

/// A remembered choice: the candidate's index and its launches, in order.
#[derive(Clone)]
pub(crate) struct Plan {
    choice: usize,
    launches: Arc<[Launch]>,
}

pub(super) fn as_runtime(e: OpError) -> RuntimeError {
    match e {
        OpError::Runtime(r) => r,
        other => RuntimeError::LaunchConfig(other.to_string()),
    }
}

impl Ops {
    /// Which of several launch configurations to run: `time(i)` launches candidate `i`
    /// timed (ms). On a GPU with tuning enabled the first call per (op, shape key) times
    /// every candidate and keeps the fastest; else candidate 0. Candidates that fail to
    /// build are skipped while tuning. While the stream captures a graph nothing is
    /// timed (timing synchronizes): the choice made earlier for this shape, on disk or in
    /// memory, else candidate 0. Returns the index and whether the choice is settled
    /// (false only for that last fallback).
    fn choose(
        &self,
        op: &str,
        shape_key: &str,
        labels: &[String],
        build: &(dyn Fn(usize) -> Result<(), OpError> + Sync),
        time: impl Fn(usize) -> Result<f32, OpError>,
    ) -> (usize, bool) {
        if self.is_recording() {
            // Every candidate is a kernel the op can launch: build (and so record) them
            // all, as before timing.
            build_all(labels.len(), build);
            return (0, true);
        }
        if !(labels.len() > 1 && self.device().is_gpu() && self.tuner().enabled()) {
            return (0, true);
        }
        // The tuner's answer for this call site and shape, remembered here: its own
        // lookup formats a device-wide key and compares labels on every call.
        let memo_key = format!("{op}|{shape_key}");
        if let Some(i) = self.tuned_memo(&memo_key, labels) {
            return (i, true);
        }
        let key = kgen_runtime::autotune::Autotuner::key(op, self.device(), shape_key);
        let stored = self
            .tuner()
            .stored(&key)
            .and_then(|l| labels.iter().position(|x| *x == l));
        if self.stream().is_capturing() {
            return match stored {
                Some(i) => (i, true),
                None => (0, false),
            };
        }
        if stored.is_none() {
            // About to time every candidate: build them all first, at once.
            build_all(labels.len(), build);
        }
        // Every timed run starts with an empty L2, as in `kgen bench` (and triton's
        // do_bench): candidates are ranked on inputs read from memory. Timed back to
        // back, part of the inputs stays in L2 from the run before, which ranked the
        // 4096-wide norms' candidates unlike the bench (docs/history/op-library.md). The buffer
        // is made at the first timed run (none when the tuner has a stored answer);
        // without memory for it, the runs are timed without it.
        let mut flush: Option<Option<Tensor>> = None;
        let i = self
            .tuner()
            .pick(op, self.device(), shape_key, labels, |i| {
                if let Some(f) = flush.get_or_insert_with(|| self.l2_flush_buffer()) {
                    f.fill_zero()?;
                }
                time(i).map_err(as_runtime)
            });
        self.remember_tuned(memo_key, &labels[i]);
        (i, true)
    }

    /// A buffer twice the size of the device's L2 on this handle's stream, whose clearing
    /// evicts everything the L2 holds (`None` on the interpreter or without memory).
    fn l2_flush_buffer(&self) -> Option<Tensor> {
        let l2 = self.device().gpu()?.info().l2_cache_bytes as usize;
        let bytes = (2 * l2).max(MIN_FLUSH_BYTES);
        self.empty(kgen_core::types::DType::F32, &[bytes / 4]).ok()
    }

    /// Runs one of several launch configurations: `run(i, pass)` makes candidate `i`'s
    /// kernels and, unless `pass` is [`Pass::Build`], launches them (timed: through
    /// `launch_timed`, returning ms), as [`Ops::choose`] picks it (which builds every
    /// candidate at once, `Pass::Build` on one thread each, before timing them). Returns
    /// the index launched. (Ops of several launches; a single-launch op uses
    /// [`Ops::launch_planned`].)
    pub(crate) fn launch_tuned(
        &self,
        op: &str,
        shape_key: &str,
        labels: &[String],
        run: impl Fn(usize, Pass) -> Result<f32, OpError> + Sync,
    ) -> Result<usize, OpError> {
        let build = |i: usize| run(i, Pass::Build).map(|_| ());
        let (i, _) = self.choose(op, shape_key, labels, &build, |i| run(i, Pass::Timed));
        run(i, Pass::Launch)?;
        Ok(i)
    }

    /// A single-launch op: the plan remembered for `key` with every tensor of `args`
    /// added, else `labels()` candidates (their shape key `shape_key()` for the tuner),
    /// `resolve(i)` giving candidate `i`'s kernel and grid, chosen as [`Ops::choose`]
    /// does and remembered. `args` are every candidate's arguments (the ones `resolve`
    /// specializes its kernels for).
    pub(crate) fn launch_planned(
        &self,
        key: PlanKey,
        args: &KernelArgs,
        shape_key: impl FnOnce() -> String,
        labels: impl FnOnce() -> Vec<String>,
        resolve: impl Fn(usize) -> Result<Launch, OpError> + Sync,
    ) -> Result<(), OpError> {
        let key_op = key.op;
        self.launch_tuned_planned(
            args.plan_key(key),
            shape_key,
            labels,
            |i| Ok(vec![resolve(i)?]),
            |_, launches, pass| {
                let [(k, grid)] = launches_of::<1>(key_op, launches)?;
                self.launch_maybe_timed(k, *grid, args.args(), pass)
            },
        )
        .map(|_| ())
    }

    /// An op of one or more launches: the plan remembered for `key`, else `labels()`
    /// candidates (their shape key `shape_key()` for the tuner), `resolve(i)` giving
    /// candidate `i`'s kernels and grids in launch order (making them: the parallel
    /// build before tuning calls it too), chosen as [`Ops::choose`] does and remembered.
    /// `run(i, launches, pass)` launches them with candidate `i`'s arguments as `pass`
    /// says (timed: returning ms). A warm call is the key's lookup and `run`: no labels,
    /// shape key or kernel-map lookups. Returns the index launched.
    pub(crate) fn launch_tuned_planned(
        &self,
        key: PlanKey,
        shape_key: impl FnOnce() -> String,
        labels: impl FnOnce() -> Vec<String>,
        resolve: impl Fn(usize) -> Result<Vec<Launch>, OpError> + Sync,
        run: impl Fn(usize, &[Launch], Pass) -> Result<f32, OpError>,
    ) -> Result<usize, OpError> {
        let known = self.plans.lock().ok().and_then(|m| m.get(&key).cloned());
        if let Some(p) = known {
            run(p.choice, &p.launches, Pass::Launch)?;
            return Ok(p.choice);
        }
        let (labels, shape_key) = (labels(), shape_key());
        let build = |i: usize| resolve(i).map(|_| ());
        let (choice, settled) = self.choose(key.op, &shape_key, &labels, &build, |i| {
            run(i, &resolve(i)?, Pass::Timed)
        });
        let launches = resolve(choice)?;
        run(choice, &launches, Pass::Launch)?;
        if settled {
            if let Ok(mut m) = self.plans.lock() {
                m.insert(
                    key,
                    Plan {
                        choice,
                        launches: launches.into(),
                    },
                );
            }
        }
        Ok(choice)
    }

    /// Launches `k` as `pass` says: timed (ms, synchronizing), untimed (0.0), or not at
    /// all (`Build`: 0.0; the caller only wanted its kernels made).
    pub(crate) fn launch_maybe_timed(
        &self,
        k: &Kernel,
        grid: [u32; 3],
        args: &[Arg],
        pass: Pass,
    ) -> Result<f32, OpError> {
        match pass {
            Pass::Build => Ok(0.0),
            Pass::Launch => {
                self.launch(k, grid, args)?;
                Ok(0.0)
            }
            Pass::Timed if self.is_recording() => Ok(0.0),
            Pass::Timed => Ok(self.device().launch_timed(self.stream(), k, grid, args)?),
        }
    }
}

/// Builds (compiles and loads) candidates `0..n` at once, one thread each: the driver's
/// PTX JIT runs in parallel across threads, and a candidate's first timed run would
/// otherwise wait for its own. On an H100 host five `rmsnorm` candidates took 257–367 ms
/// one after another and 104–109 ms at once (docs/history/op-library.md). A build that fails
/// is left to the candidate's timed run, which skips it with its error.
fn build_all(n: usize, build: &(dyn Fn(usize) -> Result<(), OpError> + Sync)) {
    if n < 2 {
        return;
    }
    std::thread::scope(|s| {
        for i in 1..n {
            s.spawn(move || {
                let _ = build(i);
            });
        }
        let _ = build(0);
    });
}

impl Ops {
    /// How many launches are remembered (tests).
    #[cfg(test)]
    pub(crate) fn plan_count(&self) -> usize {
        self.plans.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Forgets every remembered plan (tests: the slow path again).
    #[cfg(test)]
    pub(crate) fn forget_plans(&self) -> Vec<Plan> {
        self.plans
            .lock()
            .map(|mut m| m.drain().map(|(_, p)| p).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_core::types::DType;
    use kgen_runtime::Device;

    /// Every candidate is built once, failures included (left to its timed run), and
    /// the builds overlap: each stays active 100 ms, and all five were active at once.
    #[test]
    fn candidates_are_built_once_each_at_the_same_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Mutex;
        let n = 5;
        let (active, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let built = Mutex::new(Vec::new());
        build_all(n, &|i| {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(100));
            active.fetch_sub(1, Ordering::SeqCst);
            built.lock().unwrap().push(i);
            if i == 3 {
                Err(OpError::Runtime(RuntimeError::LaunchConfig("no".into())))
            } else {
                Ok(())
            }
        });
        let mut b = built.into_inner().unwrap();
        b.sort();
        assert_eq!(b, (0..n).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), n);
    }

    /// A warm call reuses the remembered launch; a view with another alignment, shape or
    /// dtype gets its own (reusing the aligned kernel for a misaligned view would be a
    /// `Misaligned` launch error, or a wrong result), and each result is right.
    #[test]
    fn plans_are_per_signature_and_results_stay_right() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let n = 1001;
        let xs: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
        let x = d.from_f64(DType::F32, &[n], &xs).unwrap();
        let xs = x.to_f64_vec().unwrap(); // as stored
        let check = |x: &Tensor, want: &[f64]| {
            let y = d
                .from_f64(x.dtype(), x.shape(), &vec![f64::NAN; x.numel()])
                .unwrap();
            ops.relu_into(x, &y).unwrap();
            let got = y.to_f64_vec().unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert_eq!(*g, w.max(0.0));
            }
        };
        check(&x, &xs);
        assert_eq!(ops.plan_count(), 1);
        check(&x, &xs);
        assert_eq!(ops.plan_count(), 1, "the same signature reuses its plan");
        // 4-byte aligned view, another length, another dtype: three more plans.
        check(&x.narrow(0, 1, n - 1).unwrap(), &xs[1..]);
        check(&x.narrow(0, 0, 7).unwrap(), &xs[..7]);
        let xb = d.from_f64(DType::BF16, &[n], &xs).unwrap();
        let rounded = xb.to_f64_vec().unwrap();
        check(&xb, &rounded);
        assert_eq!(ops.plan_count(), 4);
        // And back: the first plan still serves the first signature.
        check(&x, &xs);
        assert_eq!(ops.plan_count(), 4);
    }

    /// Ops of two launches remember their plan too: a warm call (the plan's launches,
    /// no kernel-map lookups) gives bit for bit what the first call (the slow path)
    /// gave, into poisoned outputs; the residual form, LayerNorm and another shape each
    /// get a plan of their own.
    #[test]
    fn two_launch_ops_reuse_their_plan_with_the_same_results() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let vals = |n: usize, seed: f64| -> Vec<f64> {
            (0..n)
                .map(|i| ((i as f64 + seed) * 0.731).sin() + 0.1)
                .collect()
        };
        let (rows, cols) = (5, 40);
        let t = |shape: &[usize], seed: f64| {
            d.from_f64(DType::BF16, shape, &vals(shape.iter().product(), seed))
                .unwrap()
        };
        let (x, w, dy, dres) = (
            t(&[rows, cols], 1.0),
            t(&[cols], 2.0),
            t(&[rows, cols], 3.0),
            t(&[rows, cols], 4.0),
        );
        let stat = |seed: f64| {
            let v: Vec<f64> = vals(rows, seed).iter().map(|v| v.abs() + 0.5).collect();
            d.from_f64(DType::F32, &[rows], &v).unwrap()
        };
        let (mean, rstd) = (stat(5.0), stat(6.0));
        let poisoned = |shape: &[usize]| {
            d.from_f64(DType::BF16, shape, &vec![f64::NAN; shape.iter().product()])
                .unwrap()
        };
        let read = |ts: &[&Tensor]| -> Vec<Vec<u64>> {
            ts.iter()
                .map(|t| {
                    t.to_f64_vec()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect()
                })
                .collect()
        };
        let rms = || {
            let (dx, dw) = (poisoned(&[rows, cols]), poisoned(&[cols]));
            ops.rmsnorm_backward_into(&x, &w, &rstd, &dy, &dx, &dw)
                .unwrap();
            read(&[&dx, &dw])
        };
        let add_rms = || {
            let (dh, dw) = (poisoned(&[rows, cols]), poisoned(&[cols]));
            ops.add_rmsnorm_backward_into(&x, &w, &rstd, &dy, &dres, &dh, &dw)
                .unwrap();
            read(&[&dh, &dw])
        };
        let ln = || {
            let (dx, dw, db) = (
                poisoned(&[rows, cols]),
                poisoned(&[cols]),
                poisoned(&[cols]),
            );
            ops.layernorm_backward_into(&x, &w, &mean, &rstd, &dy, &dx, &dw, &db)
                .unwrap();
            read(&[&dx, &dw, &db])
        };
        let first = rms();
        assert!(first
            .iter()
            .flatten()
            .all(|b| f64::from_bits(*b).is_finite()));
        assert_eq!(ops.plan_count(), 1);
        assert_eq!(rms(), first, "the warm call differs from the first");
        assert_eq!(ops.plan_count(), 1, "the same signature reuses its plan");
        let first_add = add_rms();
        assert_ne!(first_add, first, "the residual form is another op");
        assert_eq!(add_rms(), first_add);
        assert_eq!(ops.plan_count(), 2);
        let first_ln = ln();
        assert_eq!(ln(), first_ln);
        assert_eq!(ops.plan_count(), 3);
        // Fewer rows: a plan of its own (its grid and partial rows differ).
        let x4 = x.narrow(0, 0, 4).unwrap();
        let (dy4, rstd4) = (dy.narrow(0, 0, 4).unwrap(), rstd.narrow(0, 0, 4).unwrap());
        let (dx4, dw4) = (poisoned(&[4, cols]), poisoned(&[cols]));
        ops.rmsnorm_backward_into(&x4, &w, &rstd4, &dy4, &dx4, &dw4)
            .unwrap();
        assert_eq!(ops.plan_count(), 4);
        assert_eq!(
            rms(),
            first,
            "the first plan still serves the first signature"
        );
    }

    /// A measurement (`--ignored --nocapture`): the host cost of a warm
    /// `rmsnorm_backward_into` (two launches) on the interpreter over a 1 × 8 row, with
    /// its plan, with the plan forgotten before every call (the slow path: labels, shape
    /// key, kernel-map lookups), and its two launches alone; medians of 7 rounds.
    #[test]
    #[ignore = "a measurement: run with --ignored --nocapture"]
    fn two_launch_op_host_cost_on_the_interpreter() {
        let d = Device::interpreter();
        let ops = Ops::new(&d);
        let t = |shape: &[usize]| {
            let n = shape.iter().product();
            let v: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin() + 1.5).collect();
            d.from_f64(DType::BF16, shape, &v).unwrap()
        };
        let (x, w, dy, dx, dw) = (t(&[1, 8]), t(&[8]), t(&[1, 8]), t(&[1, 8]), t(&[8]));
        let rstd = d.from_f64(DType::F32, &[1], &[1.0]).unwrap();
        let call = || {
            ops.rmsnorm_backward_into(&x, &w, &rstd, &dy, &dx, &dw)
                .unwrap()
        };
        call();
        let plan = ops.forget_plans().pop().unwrap();
        call();
        let (ws, part) = ops.take_workspace(&[1, 8]).unwrap();
        let main_args = [
            Arg::from(&x),
            Arg::from(&w),
            Arg::from(&dy),
            Arg::from(&rstd),
            Arg::from(&dx),
            Arg::from(&part),
            Arg::from(&x),
        ];
        let colsum_args = [Arg::from(&part), Arg::from(&dw)];
        let launches_only = || {
            ops.launch(&plan.launches[0].0, plan.launches[0].1, &main_args)
                .unwrap();
            ops.launch(&plan.launches[1].0, plan.launches[1].1, &colsum_args)
                .unwrap();
        };
        let n = 2000;
        let time = |f: &dyn Fn()| {
            let mut v: Vec<f64> = (0..7)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    for _ in 0..n {
                        f();
                    }
                    t0.elapsed().as_secs_f64() * 1e6 / n as f64
                })
                .collect();
            v.sort_by(f64::total_cmp);
            v[3]
        };
        let planned = time(&call);
        let slow = time(&|| {
            ops.forget_plans();
            call();
        });
        let bare = time(&launches_only);
        ops.give_back_workspace(ws);
        eprintln!(
            "rmsnorm_backward_into 1x8 on the interpreter: planned {planned:.2} us, slow path \
             {slow:.2} us, its two launches alone {bare:.2} us: the op's own share {:.2} us \
             planned, {:.2} us slow",
            planned - bare,
            slow - bare
        );
    }

    #[test]
    fn keys_cover_every_tensor_property() {
        let d = Device::interpreter();
        let a = d.empty(DType::F32, &[4, 8]).unwrap();
        let key = |t: &Tensor| PlanKey::new("op").tensor(t);
        let base = key(&a);
        assert_eq!(base, key(&a.clone()));
        assert_ne!(base, key(&d.empty(DType::F16, &[4, 8]).unwrap()));
        assert_ne!(base, key(&a.reshape(&[8, 4]).unwrap()));
        assert_ne!(base, key(&a.transpose(0, 1).unwrap()));
        assert_ne!(base, key(&a.narrow(1, 1, 7).unwrap()));
        // Same shape, another row stride (and alignment).
        let wide = d.empty(DType::F32, &[4, 9]).unwrap();
        assert_ne!(base, key(&wide.narrow(1, 0, 8).unwrap()));
        assert_ne!(base, PlanKey::new("other").tensor(&a));
        assert_ne!(base, key(&a).word(3));
    }
}
