//! The interpreter: runs tile IR (`ir::Function`) on the CPU with the GPU's semantics. It
//! is the test suite's reference executor and a debugging mode for users.
//!
//! Assumes: nothing about the function — it need not have been validated; malformed IR
//! (a value used before its definition, operand types that do not fit, regions without
//! `Yield`, ...) gives [`InterpError`], never a panic.
//! Guarantees:
//! - arguments are checked first (count, kind, dtype, rank, constant extents, contiguity,
//!   extents/strides that fit in i32, storage covering the view); nothing is written
//!   unless they all pass;
//! - a grid beyond the GPU's limits ([`crate::target::MAX_GRID`]) is refused with
//!   [`InterpError::GridTooLarge`], as a launch on the GPU is;
//! - blocks run one after another in grid order (x fastest, then y, then z); an empty
//!   grid runs nothing; each instruction runs once per block over whole tiles;
//! - `for` runs `iv = lower, lower+step, ...` while `iv < upper` (computed without
//!   overflow; zero iterations when `lower ≥ upper`, the results then being the inits);
//!   a runtime `step ≤ 0` with `lower < upper` is [`InterpError::NonPositiveStep`] (the
//!   GPU would never finish);
//! - operation semantics are those documented on `ir::Op` (see `eval.rs`, `tile.rs`,
//!   `memory.rs` for the choices made where the IR docs are silent).
//!
//! Layout: `value.rs` (runtime values, casts), `eval.rs` (element-wise ops), `tile.rs`
//! (shape ops, reductions, dot), `scan.rs` (cumsum and the other scans), `memory.rs`
//! (argument checks, loads/stores/atomics), `fold.rs` (the element ops on single scalars,
//! for the checker's constant folding).

mod cluster;
mod eval;
mod fold;
mod memory;
mod scan;
mod tile;
mod value;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_e2e;
#[cfg(test)]
mod tests_grid_sync;
#[cfg(test)]
mod tests_mem;
#[cfg(test)]
mod tests_scan;
#[cfg(test)]
mod tests_tf32;
#[cfg(test)]
mod tests_tile;

pub(crate) use fold::{fold_binary, fold_cast, fold_compare, fold_unary};
pub use tile::{round_tf32, split_tf32};

use crate::host::ArgValue;
use crate::ir::{Block, Function, Op, ParamKind, ValueId};
use crate::types::{DType, ValueType};
use std::collections::VecDeque;
use std::rc::Rc;
use value::{checked_numel, scalar_data, Data, Val};

/// Why a run failed: bad arguments, or IR the interpreter cannot execute.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InterpError {
    #[error("expected {expected} arguments, got {got}")]
    ArgCount { expected: usize, got: usize },
    #[error("argument {index} must be a {expected}")]
    ArgKind {
        index: usize,
        expected: &'static str,
    },
    #[error("argument {index}: expected dtype {expected}, got {got}")]
    ArgDType {
        index: usize,
        expected: DType,
        got: DType,
    },
    #[error(
        "{what} of slot {slot} of scratch buffer `{buf}` while a scratch_fetch into it is \
         in flight (complete it with scratch_wait first)"
    )]
    FetchInFlight {
        what: String,
        slot: usize,
        buf: String,
    },
    #[error(
        "{what} of slot {slot} of scratch buffer `{buf}`, which has slots 0..{slots} \
         (a GPU traps here: the launch fails)"
    )]
    ScratchSlot {
        what: String,
        slot: i64,
        slots: usize,
        buf: String,
    },
    #[error("argument {index}: expected rank {expected}, got {got} extents and {strides} strides")]
    ArgRank {
        index: usize,
        expected: usize,
        got: usize,
        strides: usize,
    },
    #[error("argument {index}: dimension {dim} must be {expected}, got {got}")]
    ConstDimMismatch {
        index: usize,
        dim: usize,
        expected: u32,
        got: usize,
    },
    #[error("argument {index} is declared contiguous but its last stride is {stride}")]
    NotContiguous { index: usize, stride: usize },
    #[error("argument {index}: extent {extent} or stride {stride} of dimension {dim} does not fit in i32")]
    TensorTooLarge {
        index: usize,
        dim: usize,
        extent: usize,
        stride: usize,
    },
    #[error("argument {index}: the view needs {needed} elements of storage, it has {available}")]
    StorageTooSmall {
        index: usize,
        needed: u64,
        available: u64,
    },
    #[error("malformed IR: value #{0} used before its definition")]
    UndefinedValue(usize),
    #[error("a for loop's step is {0} at run time; it must be positive")]
    NonPositiveStep(i64),
    #[error("malformed IR: {0}")]
    Malformed(String),
    #[error("grid axis 0 is {grid_x}, not a multiple of the kernel's cluster size {cluster}")]
    ClusterGrid { grid_x: u32, cluster: u32 },
    #[error(
        "grid [{}, {}, {}] exceeds the limits of a launch ({}, {}, {} blocks along axes 0, 1, 2)",
        grid[0], grid[1], grid[2],
        crate::target::MAX_GRID[0], crate::target::MAX_GRID[1], crate::target::MAX_GRID[2]
    )]
    GridTooLarge { grid: [u32; 3] },
    #[error("grid_sync in a grid of {blocks} blocks: the interpreter runs at most {max} at once", max = MAX_GRID_SYNC_BLOCKS)]
    GridSyncTooLarge { blocks: u64 },
    #[error("grid_sync: {0}")]
    GridDiverged(String),
    #[error("cluster_gather: {0}")]
    ClusterDiverged(String),
}

/// Runs `func` over the whole grid. `args` are in `func.params` order. The blocks of a
/// kernel with `cluster_gather` run cluster by cluster, the blocks of each cluster
/// concurrently (`cluster.rs`); other kernels run block by block.
pub fn run(func: &Function, grid: [u32; 3], args: &mut [ArgValue]) -> Result<(), InterpError> {
    if !crate::target::grid_in_limits(grid) {
        return Err(InterpError::GridTooLarge { grid });
    }
    let scalars = check_args(func, args)?;
    if grid.contains(&0) {
        return Ok(());
    }
    let cluster = crate::ir::cluster_size(func).unwrap_or(1);
    if crate::ir::has_grid_sync(func) {
        if cluster > 1 {
            return Err(InterpError::Malformed(
                "grid_sync in a kernel with thread-block clusters".into(),
            ));
        }
        return run_grid_sync(func, grid, args, &scalars);
    }
    if cluster > 1 {
        return run_clusters(func, grid, args, &scalars, cluster);
    }
    let mut m = Machine {
        func,
        env: vec![None; func.values.len()],
        args: ArgAccess::Own(args),
        scalars,
        grid,
        pid: [0; 3],
        depth: 0,
        cluster: None,
        grid_sync: None,
        scratch: fresh_scratch(func),
        fetches: VecDeque::new(),
    };
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                m.pid = [x, y, z];
                m.env.iter_mut().for_each(|e| *e = None);
                m.scratch = fresh_scratch(func);
                m.fetches.clear();
                m.exec_block(&func.body)?;
            }
        }
    }
    Ok(())
}

/// Runs a kernel with clusters of `cluster` blocks along axis 0.
fn run_clusters(
    func: &Function,
    grid: [u32; 3],
    args: &mut [ArgValue],
    scalars: &[Option<Val>],
    cluster: u32,
) -> Result<(), InterpError> {
    if !grid[0].is_multiple_of(cluster) {
        return Err(InterpError::ClusterGrid {
            grid_x: grid[0],
            cluster,
        });
    }
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for cx in 0..grid[0] / cluster {
                let pids: Vec<[u32; 3]> = (0..cluster).map(|r| [cx * cluster + r, y, z]).collect();
                run_together(func, grid, args, scalars, &pids, cluster::Meet::Cluster)?;
            }
        }
    }
    Ok(())
}

/// The most blocks the interpreter runs at once for a kernel that calls `grid_sync`
/// (one OS thread each).
pub const MAX_GRID_SYNC_BLOCKS: u32 = 1024;

/// Runs a kernel that calls `grid_sync`: every block of the grid at once.
fn run_grid_sync(
    func: &Function,
    grid: [u32; 3],
    args: &mut [ArgValue],
    scalars: &[Option<Val>],
) -> Result<(), InterpError> {
    let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
    if blocks > MAX_GRID_SYNC_BLOCKS as u64 {
        return Err(InterpError::GridSyncTooLarge { blocks });
    }
    let mut pids = Vec::with_capacity(blocks as usize);
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                pids.push([x, y, z]);
            }
        }
    }
    run_together(func, grid, args, scalars, &pids, cluster::Meet::Grid)
}

/// Runs the blocks `pids` concurrently, one OS thread each, meeting at `meet`'s
/// collectives; reports the first failure that is not an echo of another block's.
fn run_together(
    func: &Function,
    grid: [u32; 3],
    args: &mut [ArgValue],
    scalars: &[Option<Val>],
    pids: &[[u32; 3]],
    meet: cluster::Meet,
) -> Result<(), InterpError> {
    let sync = cluster::ClusterSync::new(pids.len(), meet);
    let shared = std::sync::Mutex::new(&mut *args);
    let results: Vec<Result<(), InterpError>> = std::thread::scope(|s| {
        let handles: Vec<_> = pids
            .iter()
            .enumerate()
            .map(|(rank, &pid)| {
                let (sync, shared) = (&sync, &shared);
                s.spawn(move || {
                    let me = Some((rank, sync));
                    let mut m = Machine {
                        func,
                        env: vec![None; func.values.len()],
                        args: ArgAccess::Shared(shared),
                        scalars: scalars.to_vec(),
                        grid,
                        pid,
                        depth: 0,
                        cluster: if meet == cluster::Meet::Cluster {
                            me
                        } else {
                            None
                        },
                        grid_sync: if meet == cluster::Meet::Grid {
                            me
                        } else {
                            None
                        },
                        scratch: fresh_scratch(func),
                        fetches: VecDeque::new(),
                    };
                    // A panic must still release the other blocks.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        m.exec_block(&func.body).map(|_| ())
                    }))
                    .unwrap_or_else(|_| Err(sync.diverged("a block panicked")));
                    sync.finish(r.is_ok());
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(sync.diverged("a block panicked")))
            })
            .collect()
    });
    // Report the cause, not the blocks that failed because of it.
    let errors: Vec<InterpError> = results.into_iter().filter_map(|r| r.err()).collect();
    let is_echo = |e: &InterpError| matches!(e, InterpError::ClusterDiverged(m) | InterpError::GridDiverged(m) if m.contains("another block"));
    let first_err = match errors.iter().position(|e| !is_echo(e)) {
        Some(i) => errors.into_iter().nth(i),
        None => errors.into_iter().next(),
    };
    first_err.map_or(Ok(()), Err)
}

/// Element 0 of a `grid_sync` counter (an `i32` tensor), as bits.
fn grid_sync_counter(h: &crate::host::HostTensor) -> Result<u32, InterpError> {
    let b = h
        .data
        .get(0..4)
        .ok_or_else(|| bad("grid_sync: the counter tensor is empty"))?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Checks the arguments; returns the scalar parameters' values (None for tensors).
fn check_args(func: &Function, args: &[ArgValue]) -> Result<Vec<Option<Val>>, InterpError> {
    if args.len() != func.params.len() {
        return Err(InterpError::ArgCount {
            expected: func.params.len(),
            got: args.len(),
        });
    }
    let mut scalars = Vec::with_capacity(args.len());
    for (index, (p, a)) in func.params.iter().zip(args.iter()).enumerate() {
        match (&p.kind, a) {
            (ParamKind::Scalar(d), ArgValue::Scalar(s)) => {
                if s.dtype() != *d {
                    return Err(InterpError::ArgDType {
                        index,
                        expected: *d,
                        got: s.dtype(),
                    });
                }
                scalars.push(Some(Val::from_scalar(*d, *s)));
            }
            (ParamKind::Tensor(tp), ArgValue::Tensor(t)) => {
                memory::check_tensor(index, tp, t)?;
                scalars.push(None);
            }
            (ParamKind::Scalar(_), _) => {
                return Err(InterpError::ArgKind {
                    index,
                    expected: "scalar",
                })
            }
            (ParamKind::Tensor(_), _) => {
                return Err(InterpError::ArgKind {
                    index,
                    expected: "tensor",
                })
            }
        }
    }
    Ok(scalars)
}

/// Deepest region nesting accepted (guards against cyclic region structure).
const MAX_DEPTH: u32 = 64;

struct Machine<'a> {
    func: &'a Function,
    env: Vec<Option<Rc<Val>>>,
    args: ArgAccess<'a>,
    scalars: Vec<Option<Val>>,
    grid: [u32; 3],
    pid: [u32; 3],
    depth: u32,
    /// This block's rank in its cluster and the cluster's meeting point.
    cluster: Option<(usize, &'a cluster::ClusterSync)>,
    /// This block's rank in the grid and the grid's meeting point (kernels that call
    /// `grid_sync`, whose blocks all run at once).
    grid_sync: Option<(usize, &'a cluster::ClusterSync)>,
    /// This block's scratch buffers: per buffer, per slot, the tile last stored (None:
    /// never stored by this block; reading it is an error here, unspecified on a GPU).
    scratch: Vec<Vec<Option<Rc<Val>>>>,
    /// This block's `scratch_fetch`es not yet completed by a `scratch_wait`, oldest
    /// first: (buffer, slot, the tile read at the fetch), or None for a fetch into an
    /// out-of-range slot that had nothing to copy (it counts).
    fetches: VecDeque<Option<(u32, usize, Rc<Val>)>>,
}

/// Empty scratch buffers for one block.
fn fresh_scratch(func: &Function) -> Vec<Vec<Option<Rc<Val>>>> {
    func.scratch
        .iter()
        .map(|b| vec![None; b.slots as usize])
        .collect()
}

/// The kernel arguments: owned by the one running block, or shared by the blocks of a
/// cluster (each memory access holds the lock).
enum ArgAccess<'a> {
    Own(&'a mut [ArgValue]),
    Shared(&'a std::sync::Mutex<&'a mut [ArgValue]>),
}

fn bad(msg: impl Into<String>) -> InterpError {
    InterpError::Malformed(msg.into())
}

fn scalar_i32(v: i64) -> Val {
    Val {
        dtype: DType::I32,
        shape: Vec::new(),
        data: Data::I32(vec![v as i32]),
    }
}

impl Machine<'_> {
    fn get(&self, v: ValueId) -> Result<Rc<Val>, InterpError> {
        self.env
            .get(v.index())
            .and_then(|e| e.clone())
            .ok_or(InterpError::UndefinedValue(v.index()))
    }

    /// Defines `v`, checking that the value has the type the IR declares for it.
    fn set(&mut self, v: ValueId, val: Rc<Val>) -> Result<(), InterpError> {
        self.check_type(v, &val)?;
        let slot = self
            .env
            .get_mut(v.index())
            .ok_or_else(|| bad("value out of range"))?;
        *slot = Some(val);
        Ok(())
    }

    fn result_type(&self, results: &[ValueId]) -> Result<(DType, Vec<u32>), InterpError> {
        let r = results.first().ok_or_else(|| bad("missing result"))?;
        let ty = &self
            .func
            .values
            .get(*r)
            .ok_or_else(|| bad("result value does not exist"))?
            .ty;
        let (d, s) = split_type(ty);
        checked_numel(s)?;
        Ok((d, s.to_vec()))
    }

    /// Starts a fetch into `slot` of `buf` (`what`: the instruction): its data is read now
    /// by `read(self, dtype, slot shape)`, which also says whether any element came from
    /// the tensor (not out of bounds, not masked off), and lands in the slot when a wait
    /// completes the fetch (until then the slot may not be read or written). A fetch
    /// into a slot out of range is an error when it has anything to copy; with nothing
    /// to copy (the fetches past a row's end in a pipelined loop) it only counts.
    fn start_fetch(
        &mut self,
        buf: u32,
        slot: ValueId,
        what: &str,
        read: impl FnOnce(&Self, DType, &[u32]) -> Result<(Data, bool), InterpError>,
    ) -> Result<(), InterpError> {
        let k = self.scratch_slot(buf, slot)?;
        let b = self
            .func
            .scratch
            .get(buf as usize)
            .ok_or_else(|| bad("no such scratch buffer"))?;
        let (d, s) = (b.dtype, b.slot_shape.clone());
        let fetch = match k {
            Ok(k) => {
                self.check_no_fetch_in_flight(buf, k, what)?;
                let (data, _) = read(self, d, &s)?;
                Some((buf, k, Rc::new(Val::new(d, s, data)?)))
            }
            Err(slot) => {
                let (_, copies) = read(self, d, &s)?;
                if copies {
                    return Err(self.slot_error(buf, slot, what));
                }
                None
            }
        };
        self.fetches.push_back(fetch);
        Ok(())
    }

    /// An error if slot `k` of `buf` has a fetch in flight (`what`: the access).
    fn check_no_fetch_in_flight(&self, buf: u32, k: usize, what: &str) -> Result<(), InterpError> {
        if self
            .fetches
            .iter()
            .flatten()
            .any(|(b, s, _)| *b == buf && *s == k)
        {
            return Err(InterpError::FetchInFlight {
                what: what.to_string(),
                slot: k,
                buf: self
                    .func
                    .scratch
                    .get(buf as usize)
                    .map_or_else(|| format!("#{buf}"), |b| b.name.clone()),
            });
        }
        Ok(())
    }

    /// The slot index of a scratch access: `Ok(k)` in range, `Err(slot)` out of range.
    fn scratch_slot(&self, buf: u32, slot: ValueId) -> Result<Result<usize, i64>, InterpError> {
        let slots = self
            .scratch
            .get(buf as usize)
            .ok_or_else(|| bad("no such scratch buffer"))?
            .len();
        let k = self
            .get(slot)?
            .as_i64()
            .ok_or_else(|| bad("scratch slot is not an integer scalar"))?;
        Ok(usize::try_from(k).ok().filter(|&i| i < slots).ok_or(k))
    }

    /// The slot index of a `scratch_load` / `scratch_store` (`what`), which must be in
    /// range.
    fn scratch_slot_in_range(
        &self,
        buf: u32,
        slot: ValueId,
        what: &str,
    ) -> Result<usize, InterpError> {
        self.scratch_slot(buf, slot)?
            .map_err(|k| self.slot_error(buf, k, what))
    }

    /// The error for an access (`what`) to slot `slot` of `buf`, out of range.
    fn slot_error(&self, buf: u32, slot: i64, what: &str) -> InterpError {
        InterpError::ScratchSlot {
            what: what.to_string(),
            slot,
            slots: self.scratch.get(buf as usize).map_or(0, Vec::len),
            buf: self
                .func
                .scratch
                .get(buf as usize)
                .map_or_else(|| format!("#{buf}"), |b| b.name.clone()),
        }
    }

    /// Runs `f` on tensor parameter `t`.
    fn with_tensor<T>(
        &self,
        t: u32,
        f: impl FnOnce(&crate::host::HostTensor) -> Result<T, InterpError>,
    ) -> Result<T, InterpError> {
        let pick = |a: &[ArgValue]| match a.get(t as usize) {
            Some(ArgValue::Tensor(h)) => f(h),
            _ => Err(bad(format!("parameter {t} is not a tensor"))),
        };
        match &self.args {
            ArgAccess::Own(a) => pick(a),
            ArgAccess::Shared(m) => {
                let g = m.lock().map_err(|_| bad("argument lock poisoned"))?;
                pick(&g)
            }
        }
    }

    /// Runs `f` on tensor parameter `t`, mutably.
    fn with_tensor_mut<T>(
        &mut self,
        t: u32,
        f: impl FnOnce(&mut crate::host::HostTensor) -> Result<T, InterpError>,
    ) -> Result<T, InterpError> {
        let pick = |a: &mut [ArgValue]| match a.get_mut(t as usize) {
            Some(ArgValue::Tensor(h)) => f(h),
            _ => Err(bad(format!("parameter {t} is not a tensor"))),
        };
        match &mut self.args {
            ArgAccess::Own(a) => pick(a),
            ArgAccess::Shared(m) => {
                let mut g = m.lock().map_err(|_| bad("argument lock poisoned"))?;
                pick(&mut g)
            }
        }
    }

    /// Runs a region; returns the values of its `Yield`, if it reached one.
    fn exec_block(&mut self, block: &Block) -> Result<Option<Vec<Rc<Val>>>, InterpError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(bad("regions nested too deeply (cyclic IR?)"));
        }
        let r = self.exec_insts(block);
        self.depth -= 1;
        r
    }

    fn exec_insts(&mut self, block: &Block) -> Result<Option<Vec<Rc<Val>>>, InterpError> {
        for &id in &block.insts {
            let inst = self
                .func
                .insts
                .get(id)
                .ok_or_else(|| bad(format!("instruction #{} does not exist", id.index())))?;
            match &inst.op {
                Op::Yield(vs) => {
                    let vals = vs
                        .iter()
                        .map(|&v| self.get(v))
                        .collect::<Result<Vec<_>, _>>()?;
                    return Ok(Some(vals));
                }
                Op::For {
                    lower,
                    upper,
                    step,
                    inits,
                    body,
                } => {
                    let results = self.exec_for(*lower, *upper, *step, inits, body)?;
                    self.bind_results(&inst.results, results)?;
                }
                Op::If {
                    cond,
                    then_body,
                    else_body,
                } => {
                    let c = self
                        .get(*cond)?
                        .as_bool()
                        .ok_or_else(|| bad("if condition is not a bool scalar"))?;
                    let region = if c { then_body } else { else_body };
                    let results = self.exec_block(region)?;
                    let results = match results {
                        Some(r) => r,
                        None if inst.results.is_empty() => Vec::new(),
                        None => return Err(bad("if region without yield")),
                    };
                    self.bind_results(&inst.results, results)?;
                }
                op => {
                    let out = self.eval(op, &inst.results).map_err(|e| match e {
                        InterpError::Malformed(m) => {
                            InterpError::Malformed(format!("instruction #{}: {m}", id.index()))
                        }
                        e => e,
                    })?;
                    match (out, inst.results.first()) {
                        (Some(v), Some(&r)) if inst.results.len() == 1 => {
                            self.set(r, Rc::new(v))?
                        }
                        (None, None) => {}
                        _ => {
                            return Err(bad(format!(
                                "instruction #{} has the wrong number of results",
                                id.index()
                            )))
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    fn bind_results(&mut self, results: &[ValueId], vals: Vec<Rc<Val>>) -> Result<(), InterpError> {
        if results.len() != vals.len() {
            return Err(bad(format!(
                "{} values yielded for {} results",
                vals.len(),
                results.len()
            )));
        }
        for (&r, v) in results.iter().zip(vals) {
            self.set(r, v)?;
        }
        Ok(())
    }

    fn exec_for(
        &mut self,
        lower: ValueId,
        upper: ValueId,
        step: ValueId,
        inits: &[ValueId],
        body: &Block,
    ) -> Result<Vec<Rc<Val>>, InterpError> {
        let int = |m: &Self, v: ValueId| -> Result<i64, InterpError> {
            m.get(v)?
                .as_i64()
                .ok_or_else(|| bad("loop bound is not an integer scalar"))
        };
        let (lo, hi, st) = (int(self, lower)?, int(self, upper)?, int(self, step)?);
        let mut carried = inits
            .iter()
            .map(|&v| self.get(v))
            .collect::<Result<Vec<_>, _>>()?;
        if lo >= hi {
            return Ok(carried);
        }
        if st <= 0 {
            return Err(InterpError::NonPositiveStep(st));
        }
        let (&iv, args) = body
            .args
            .split_first()
            .ok_or_else(|| bad("for body without an induction variable"))?;
        if args.len() != carried.len() {
            return Err(bad("for body arguments differ from its inits"));
        }
        let mut i = lo;
        while i < hi {
            self.set(iv, Rc::new(scalar_i32(i)))?;
            for (&a, v) in args.iter().zip(carried) {
                self.set(a, v)?;
            }
            carried = self
                .exec_block(body)?
                .ok_or_else(|| bad("for body without yield"))?;
            if carried.len() != args.len() {
                return Err(bad("for body yields the wrong number of values"));
            }
            match i.checked_add(st) {
                Some(n) => i = n,
                None => break,
            }
        }
        Ok(carried)
    }

    fn check_type(&self, v: ValueId, val: &Val) -> Result<(), InterpError> {
        let ty = &self
            .func
            .values
            .get(v)
            .ok_or_else(|| bad("value does not exist"))?
            .ty;
        let (d, s) = split_type(ty);
        if val.dtype != d || val.shape != s {
            return Err(bad(format!(
                "value #{} is declared {ty}, gets {} {:?}",
                v.index(),
                val.dtype,
                val.shape
            )));
        }
        Ok(())
    }

    /// Evaluates a non-control-flow instruction: `Some(value)` for one result, `None`
    /// for stores.
    fn eval(&mut self, op: &Op, results: &[ValueId]) -> Result<Option<Val>, InterpError> {
        let v = match op {
            Op::Const(c) => {
                let (d, s) = self.result_type(results)?;
                let n = checked_numel(&s)?;
                Val::new(d, s, scalar_data(d, *c, n))?
            }
            Op::ProgramId(a) => scalar_i32(
                *self
                    .pid
                    .get(*a as usize)
                    .ok_or_else(|| bad("grid axis ≥ 3"))? as i64,
            ),
            Op::ClusterRank(size) => {
                scalar_i32((self.pid.first().copied().unwrap_or(0) % (*size).max(1)) as i64)
            }
            Op::NumPrograms(a) => scalar_i32(
                *self
                    .grid
                    .get(*a as usize)
                    .ok_or_else(|| bad("grid axis ≥ 3"))? as i64,
            ),
            Op::ScalarParam(i) => match self.scalars.get(*i as usize) {
                Some(Some(v)) => v.clone(),
                _ => return Err(bad(format!("parameter {i} is not a scalar"))),
            },
            Op::TensorDim { tensor, dim } => self.with_tensor(*tensor, |t| {
                Ok(scalar_i32(
                    *t.shape
                        .get(*dim as usize)
                        .ok_or_else(|| bad("dimension out of range"))? as i64,
                ))
            })?,
            Op::TensorStride { tensor, dim } => self.with_tensor(*tensor, |t| {
                Ok(scalar_i32(
                    *t.strides
                        .get(*dim as usize)
                        .ok_or_else(|| bad("dimension out of range"))? as i64,
                ))
            })?,
            Op::Arange { start, end } => tile::arange(*start, *end)?,
            Op::Splat(a) => {
                let (_, s) = self.result_type(results)?;
                tile::splat(&*self.get(*a)?, &s)?
            }
            Op::Broadcast(a) => {
                let (_, s) = self.result_type(results)?;
                tile::broadcast(&*self.get(*a)?, &s)?
            }
            Op::Reshape(a) => {
                let (_, s) = self.result_type(results)?;
                tile::reshape(&*self.get(*a)?, &s)?
            }
            Op::ExpandDims(a, axis) => {
                let (_, s) = self.result_type(results)?;
                tile::expand_dims(&*self.get(*a)?, *axis, &s)?
            }
            Op::Permute(a, perm) => tile::permute(&*self.get(*a)?, perm)?,
            Op::Unary(u, a) => eval::unary(*u, &*self.get(*a)?)?,
            Op::Binary(b, x, y) => eval::binary(*b, &*self.get(*x)?, &*self.get(*y)?)?,
            Op::Compare(c, x, y) => eval::compare(*c, &*self.get(*x)?, &*self.get(*y)?)?,
            Op::Select(c, x, y) => eval::select(&*self.get(*c)?, &*self.get(*x)?, &*self.get(*y)?)?,
            Op::Fma(x, y, z) => eval::fma(&*self.get(*x)?, &*self.get(*y)?, &*self.get(*z)?)?,
            Op::Cast(a) => {
                let (d, _) = self.result_type(results)?;
                eval::cast_val(&*self.get(*a)?, d)?
            }
            Op::Reduce { op, value, axis } => tile::reduce(*op, &*self.get(*value)?, *axis)?,
            Op::Scan {
                op,
                value,
                axis,
                reverse,
                exclusive,
            } => scan::scan(*op, &*self.get(*value)?, *axis, *reverse, *exclusive)?,
            Op::ScratchLoad { buf, slot } => {
                let k = self.scratch_slot_in_range(*buf, *slot, "scratch_load")?;
                self.check_no_fetch_in_flight(*buf, k, "scratch_load")?;
                match &self.scratch[*buf as usize][k] {
                    Some(v) => (**v).clone(),
                    None => {
                        return Err(bad(format!(
                            "scratch_load of slot {k} of buffer #{buf}, which this block \
                             has not stored"
                        )))
                    }
                }
            }
            Op::ScratchStore { buf, slot, value } => {
                let v = self.get(*value)?;
                let k = self.scratch_slot_in_range(*buf, *slot, "scratch_store")?;
                self.check_no_fetch_in_flight(*buf, k, "scratch_store")?;
                self.scratch[*buf as usize][k] = Some(v);
                return Ok(None);
            }
            Op::ScratchFetch {
                buf,
                slot,
                tensor,
                index,
                padding,
                ..
            } => {
                self.start_fetch(*buf, *slot, "scratch_fetch", |me, d, s| {
                    // A slot of lower rank than the tensor takes a tile whose leading
                    // extents are 1 (the pipeline's squeezed loads).
                    let full: Vec<u32> =
                        std::iter::repeat_n(1, index.len().saturating_sub(s.len()))
                            .chain(s.iter().copied())
                            .collect();
                    let s = full.as_slice();
                    let base = me.tile_base(index, s)?;
                    me.with_tensor(*tensor, |t| {
                        if t.dtype != d {
                            return Err(bad(format!("fetch of {d} from a {} tensor", t.dtype)));
                        }
                        let offs = memory::tile_offsets(t, &base, s)?;
                        let copies = offs.iter().any(|&o| o != memory::SKIP);
                        Ok((
                            memory::read(t, &offs, &scalar_data(d, *padding, 1))?,
                            copies,
                        ))
                    })
                })?;
                return Ok(None);
            }
            Op::ScratchGather {
                buf,
                slot,
                tensor,
                offsets,
                mask,
                other,
                ..
            } => {
                self.start_fetch(*buf, *slot, "scratch_gather", |me, d, s| {
                    let (coords, mask) = me.coords(offsets, *mask)?;
                    let refs: Vec<&Val> = coords.iter().map(|c| &**c).collect();
                    me.with_tensor(*tensor, |t| {
                        if t.dtype != d {
                            return Err(bad(format!("gather of {d} from a {} tensor", t.dtype)));
                        }
                        let offs = memory::coord_offsets(t, &refs, mask.as_deref(), s)?;
                        let copies = offs.iter().any(|&o| o != memory::SKIP);
                        Ok((memory::read(t, &offs, &scalar_data(d, *other, 1))?, copies))
                    })
                })?;
                return Ok(None);
            }
            // Launches run one after the other here: the dependency already holds.
            Op::GridDependency(_) => return Ok(None),
            // A block's tiles are computed whole, one instruction after another: every
            // access before the barrier is already done.
            Op::Barrier => return Ok(None),
            Op::GridSync { counter } => {
                let Some((rank, sync)) = self.grid_sync else {
                    return Err(bad("grid_sync outside a cooperative grid run"));
                };
                // The counter as the GPU leaves it: its sign bit flips at every
                // grid_sync. It must start with its other bits 0 (the GPU's arrival
                // count would cross the sign bit early and release the grid too soon).
                if rank == 0 {
                    self.with_tensor(*counter, |h| {
                        let v = grid_sync_counter(h)?;
                        if v & 0x7fff_ffff != 0 {
                            return Err(InterpError::GridDiverged(format!(
                                "the counter holds {}: it must start at 0 (each grid_sync leaves 0 or -2147483648)",
                                v as i32
                            )));
                        }
                        Ok(())
                    })?;
                }
                sync.arrive(rank)?;
                if rank == 0 {
                    self.with_tensor_mut(*counter, |h| {
                        let v = grid_sync_counter(h)? ^ 0x8000_0000;
                        h.data
                            .get_mut(0..4)
                            .ok_or_else(|| bad("grid_sync counter is empty"))?
                            .copy_from_slice(&v.to_le_bytes());
                        Ok(())
                    })?;
                }
                // No block may pass until the counter is written: a second meeting.
                sync.arrive(rank)?;
                return Ok(None);
            }
            Op::ScratchWait { pending } => {
                while self.fetches.len() > *pending as usize {
                    if let Some(Some((b, k, v))) = self.fetches.pop_front() {
                        self.scratch[b as usize][k] = Some(v);
                    }
                }
                return Ok(None);
            }
            Op::ClusterGather { value, .. } => {
                let v = (*self.get(*value)?).clone();
                match self.cluster {
                    Some((rank, sync)) => sync.exchange(rank, v)?,
                    // A cluster of one block.
                    None => cluster::stack(&[v])?,
                }
            }
            Op::Dot {
                a,
                b,
                acc,
                precision,
            } => tile::dot(
                &*self.get(*a)?,
                &*self.get(*b)?,
                &*self.get(*acc)?,
                *precision,
            )?,
            Op::Load {
                tensor,
                index,
                padding,
                ..
            } => {
                let (d, s) = self.result_type(results)?;
                let base = self.tile_base(index, &s)?;
                let data = self.with_tensor(*tensor, |t| {
                    if t.dtype != d {
                        return Err(bad(format!("load of {d} from a {} tensor", t.dtype)));
                    }
                    let offs = memory::tile_offsets(t, &base, &s)?;
                    memory::read(t, &offs, &scalar_data(d, *padding, 1))
                })?;
                Val::new(d, s, data)?
            }
            Op::Store {
                tensor,
                index,
                value,
                ..
            } => {
                let v = self.get(*value)?;
                let base = self.tile_base(index, &v.shape)?;
                self.with_tensor_mut(*tensor, |t| {
                    let offs = memory::tile_offsets(t, &base, &v.shape)?;
                    memory::write(t, &offs, &v)
                })?;
                return Ok(None);
            }
            Op::Gather {
                tensor,
                offsets,
                mask,
                other,
                ..
            } => {
                let (d, s) = self.result_type(results)?;
                let (coords, mask) = self.coords(offsets, *mask)?;
                let refs: Vec<&Val> = coords.iter().map(|c| &**c).collect();
                let data = self.with_tensor(*tensor, |t| {
                    if t.dtype != d {
                        return Err(bad(format!("gather of {d} from a {} tensor", t.dtype)));
                    }
                    let offs = memory::coord_offsets(t, &refs, mask.as_deref(), &s)?;
                    memory::read(t, &offs, &scalar_data(d, *other, 1))
                })?;
                Val::new(d, s, data)?
            }
            Op::Scatter {
                tensor,
                offsets,
                value,
                mask,
                ..
            }
            | Op::AtomicAdd {
                tensor,
                offsets,
                value,
                mask,
            } => {
                let v = self.get(*value)?;
                let (coords, mask) = self.coords(offsets, *mask)?;
                let refs: Vec<&Val> = coords.iter().map(|c| &**c).collect();
                let atomic = matches!(op, Op::AtomicAdd { .. });
                let old = self.with_tensor_mut(*tensor, |t| {
                    let offs = memory::coord_offsets(t, &refs, mask.as_deref(), &v.shape)?;
                    if atomic {
                        memory::atomic_add(t, &offs, &v).map(Some)
                    } else {
                        memory::write(t, &offs, &v).map(|_| None)
                    }
                })?;
                match old {
                    Some(old) => Val::new(v.dtype, v.shape.clone(), old)?,
                    None => return Ok(None),
                }
            }
            Op::For { .. } | Op::If { .. } | Op::Yield(_) => {
                return Err(bad("control flow in eval"))
            }
        };
        Ok(Some(v))
    }

    /// The first element's coordinates of a tile-indexed access: `index[d] * shape[d]`.
    fn tile_base(&self, index: &[ValueId], shape: &[u32]) -> Result<Vec<i64>, InterpError> {
        if index.len() != shape.len() {
            return Err(bad(format!(
                "{} tile indices for a rank-{} tile",
                index.len(),
                shape.len()
            )));
        }
        index
            .iter()
            .zip(shape)
            .map(|(&v, &s)| {
                let i = self
                    .get(v)?
                    .as_i64()
                    .ok_or_else(|| bad("tile index is not an integer scalar"))?;
                Ok(i.saturating_mul(s as i64))
            })
            .collect()
    }

    #[allow(clippy::type_complexity)]
    fn coords(
        &self,
        offsets: &[ValueId],
        mask: Option<ValueId>,
    ) -> Result<(Vec<Rc<Val>>, Option<Rc<Val>>), InterpError> {
        let coords = offsets
            .iter()
            .map(|&v| self.get(v))
            .collect::<Result<Vec<_>, _>>()?;
        let mask = mask.map(|m| self.get(m)).transpose()?;
        Ok((coords, mask))
    }
}

fn split_type(ty: &ValueType) -> (DType, &[u32]) {
    match ty {
        ValueType::Scalar(d) => (*d, &[]),
        ValueType::Tile(d, s) => (*d, s.dims()),
    }
}
