//! Layout assignment: gives every value a [`Layout`].
//!
//! Assumes: validated IR (types exact, regions end in `Yield`), a power-of-two warp count.
//! Guarantees: every value has a layout (`Uniform` for scalars); tile layouts cover the
//! value's shape. It does not insert conversions: where an instruction meets operands in
//! another layout, lowering converts them (free register renaming when the two layouts
//! place data in the same threads, else a round trip through shared memory).
//!
//! The policy (Triton's coalesce + remove-layout-conversions, simplified):
//! - Anchors: every tile shape gets one default `Blocked` layout whose `size_per_thread`
//!   along the last dim is the widest vector any global access of that (squeezed) shape
//!   can use: `min(16 B, align_bytes) / elem_size` for tile loads and stores; for
//!   `gather`, `scatter` and `scratch_gather`, what the axis facts prove
//!   (`AxisFacts::pointwise_vector`). Lanes fill the contiguous dim first (coalescing),
//!   warps last. Unit dims do not count, so `[1, N]` and `[N]` agree.
//! - Element-wise results take the layout of their first operand that is not a splat or
//!   constant (those can be re-materialized in any layout for free).
//! - Reductions give `Slice`; scans keep their operand's layout; `expand_dims` of a
//!   `Slice` gives back its parent, and broadcast / permute / reshape keep the source's
//!   distribution when they can (preferring the default layout of the result shape when
//!   that is equally free).
//! - Loop-carried values take the layout of their initial value, unless that is a
//!   constant or splat: then they take the layout the body yields (one re-run).
//! - A load used only by a broadcast (through casts / negations) takes the broadcast
//!   result's anchor, resized to its own shape, so the broadcast is free.
//! - Last, `cheap_layouts` moves values that are cheap in any layout (index tiles, small
//!   read-only loads) into the one layout all their uses need.

use super::axis::{self, AxisFacts};
use super::layout::{self, Blocked, Layout, Linear};
use crate::ir::{Block, Function, Op, ValueId};
use crate::types::{DType, ValueType};
use std::collections::HashMap;

/// The layouts of one function.
pub struct Assignment {
    layouts: Vec<Option<Layout>>,
    /// Values that hold the same element everywhere (constant or splat tiles).
    uniform_tile: Vec<bool>,
    pub num_warps: u32,
    /// Preferred vector width per squeezed padded shape.
    pref_vec: HashMap<Vec<u32>, u32>,
    /// What is known about integer values along their last axis (vectorized gathers).
    pub axis: AxisFacts,
    /// Tiles of the compiler's shared buffers that only tensor-core `dot`s read (through
    /// at most a `transpose`): never held in registers; `lower/mma.rs` reads their
    /// fragments from shared memory.
    pub staged: std::collections::HashSet<ValueId>,
}

impl Assignment {
    pub fn layout(&self, v: ValueId) -> Layout {
        self.layouts
            .get(v.index())
            .cloned()
            .flatten()
            .unwrap_or(Layout::Uniform)
    }

    /// The anchor layout of a tile shape: blocked, vectorized for the global accesses of
    /// that shape.
    pub fn default_layout(&self, shape: &[u32]) -> Layout {
        if shape.is_empty() {
            return Layout::Uniform;
        }
        let vec = self.pref_vec.get(&squeeze(shape)).copied().unwrap_or(1);
        Layout::Blocked(Blocked::default_for(shape, vec, self.num_warps))
    }

    /// Replaces the layout of `v` (the backward phase, `cheap_layouts`).
    pub fn set_layout(&mut self, v: ValueId, l: Layout) {
        if let Some(slot) = self.layouts.get_mut(v.index()) {
            *slot = Some(l);
        }
    }

    pub fn is_uniform_tile(&self, v: ValueId) -> bool {
        self.uniform_tile.get(v.index()).copied().unwrap_or(false)
    }

    /// The canonical layout of `v` (rank 0 for scalars).
    pub fn linear(&self, func: &Function, v: ValueId) -> Linear {
        let shape = crate::ir::shape_of(func.value_type(v)).to_vec();
        self.layout(v).linear(&shape, self.num_warps)
    }
}

struct Assigner<'f> {
    func: &'f Function,
    num_warps: u32,
    /// The target has `wgmma` (sm_90a): a `dot` of two staged tiles whose shape fits
    /// gets `wgmma_grid`'s warps.
    wgmma: bool,
    /// The instruction that defines each value.
    defs: HashMap<ValueId, crate::ir::InstId>,
    out: Assignment,
    /// Layouts chosen for loads (and the casts after them) ahead of the forward walk:
    /// see `broadcast_sources`, and register operands loaded in their fragment layout
    /// (`dot_chains::operand_loads`).
    wanted: HashMap<ValueId, Layout>,
    /// Products that put every warp along M (`dot_chains::row_dots`).
    row_dots: std::collections::HashSet<crate::ir::InstId>,
    /// Loop-carried values that start as a constant tile, during the first walk of
    /// their loop's body: `follow` passes over them, so what the body computes from them
    /// decides their layout (a running row max takes the reduction's layout instead of
    /// forcing the constant's default on it).
    undecided: std::collections::HashSet<ValueId>,
}

fn squeeze(shape: &[u32]) -> Vec<u32> {
    layout::padded(shape)
        .into_iter()
        .filter(|&d| d != 1)
        .collect()
}

/// Assigns layouts to every value of `func` (`wgmma`: the target has it).
pub fn assign(func: &Function, num_warps: u32, wgmma: bool) -> Assignment {
    let n = func.values.len();
    let mut a = Assigner {
        func,
        num_warps,
        wgmma,
        defs: crate::ir::program_order(func)
            .into_iter()
            .flat_map(|i| func.insts[i].results.iter().map(move |&r| (r, i)))
            .collect(),
        out: Assignment {
            layouts: vec![None; n],
            uniform_tile: vec![false; n],
            num_warps,
            pref_vec: HashMap::new(),
            axis: axis::analyze(func),
            staged: std::collections::HashSet::new(),
        },
        wanted: HashMap::new(),
        row_dots: super::dot_chains::row_dots(func, num_warps),
        undecided: std::collections::HashSet::new(),
    };
    a.wanted = super::dot_chains::operand_loads(func, num_warps, &a.row_dots);
    a.collect_vectors(&func.body);
    a.broadcast_sources();
    a.block(&func.body);
    let mut out = a.out;
    super::cheap_layouts::propagate(func, &mut out);
    out.staged = staged_values(func, &out);
    out
}

/// Whether `v` is a `scratch_load` of a compiler-made shared buffer, or a transpose of
/// one (what `passes::pipeline` makes of the tiles a `dot` reads).
fn shared_tile_load(
    func: &Function,
    defs: &HashMap<ValueId, crate::ir::InstId>,
    v: ValueId,
) -> bool {
    let mut v = v;
    for _ in 0..2 {
        let Some(&id) = defs.get(&v) else {
            return false;
        };
        match &func.insts[id].op {
            Op::Permute(x, p) if p.as_slice() == [1, 0] => v = *x,
            Op::ScratchLoad { buf, .. } => {
                return func.scratch.get(*buf as usize).is_some_and(|b| b.shared)
            }
            _ => return false,
        }
    }
    false
}

/// The staged values (see `Assignment::staged`): `scratch_load`s of shared buffers, and
/// `transpose`s of them, whose every use is an operand of a tensor-core `dot` (a result in
/// an `Mma` layout) or such a transpose.
fn staged_values(func: &Function, asg: &Assignment) -> std::collections::HashSet<ValueId> {
    let mut uses: HashMap<ValueId, Vec<crate::ir::InstId>> = HashMap::new();
    let mut def: HashMap<ValueId, crate::ir::InstId> = HashMap::new();
    let order = crate::ir::program_order(func);
    for &i in &order {
        for v in crate::ir::operands(&func.insts[i].op) {
            uses.entry(v).or_default().push(i);
        }
        for &r in &func.insts[i].results {
            def.insert(r, i);
        }
    }
    let is_mma_operand = |i: crate::ir::InstId, v: ValueId| -> bool {
        let inst = &func.insts[i];
        match inst.op {
            Op::Dot { a, b, .. } => {
                (a == v || b == v)
                    && inst
                        .results
                        .first()
                        .is_some_and(|&r| matches!(asg.layout(r), Layout::Mma(_)))
            }
            _ => false,
        }
    };
    let transpose_of = |i: crate::ir::InstId| -> Option<ValueId> {
        match &func.insts[i].op {
            Op::Permute(_, p) if p.as_slice() == [1, 0] => func.insts[i].results.first().copied(),
            _ => None,
        }
    };
    let only_dots = |v: ValueId| -> bool {
        let us = uses.get(&v).map(Vec::as_slice).unwrap_or(&[]);
        !us.is_empty() && us.iter().all(|&i| is_mma_operand(i, v))
    };
    let mut out = std::collections::HashSet::new();
    for &i in &order {
        let Op::ScratchLoad { buf, .. } = func.insts[i].op else {
            continue;
        };
        if !func.scratch.get(buf as usize).is_some_and(|b| b.shared) {
            continue;
        }
        let Some(&v) = func.insts[i].results.first() else {
            continue;
        };
        let us = uses.get(&v).map(Vec::as_slice).unwrap_or(&[]);
        let ok = !us.is_empty()
            && us
                .iter()
                .all(|&u| is_mma_operand(u, v) || transpose_of(u).is_some_and(only_dots));
        if ok {
            out.insert(v);
            for &u in us {
                if let Some(t) = transpose_of(u) {
                    out.insert(t);
                }
            }
        }
    }
    out
}

impl Assigner<'_> {
    fn collect_vectors(&mut self, block: &Block) {
        for &i in &block.insts {
            let inst = &self.func.insts[i];
            let (tensor, v) = match &inst.op {
                Op::Load { tensor, .. } => (*tensor, inst.results.first().copied()),
                Op::Store { tensor, value, .. } => (*tensor, Some(*value)),
                // A gather or scatter whose coordinates are contiguous and aligned
                // (`AxisFacts::pointwise_vector`) wants the vectors a tile access would.
                Op::Gather {
                    tensor, offsets, ..
                }
                | Op::Scatter {
                    tensor, offsets, ..
                } => {
                    let v = match &inst.op {
                        Op::Scatter { value, .. } => *value,
                        _ => match inst.results.first() {
                            Some(&r) => r,
                            None => continue,
                        },
                    };
                    let Some(t) = self.func.tensor_param(*tensor) else {
                        continue;
                    };
                    let shape = crate::ir::shape_of(self.func.value_type(v));
                    let vec = self.out.axis.pointwise_vector(t, offsets, shape);
                    if vec > 1 {
                        let e = self.out.pref_vec.entry(squeeze(shape)).or_insert(1);
                        *e = (*e).max(vec as u32);
                    }
                    continue;
                }
                // Likewise the slots a `scratch_gather` fills.
                Op::ScratchGather {
                    buf,
                    tensor,
                    offsets,
                    ..
                } => {
                    let (Some(t), Some(b)) = (
                        self.func.tensor_param(*tensor),
                        self.func.scratch.get(*buf as usize),
                    ) else {
                        continue;
                    };
                    let vec = self.out.axis.pointwise_vector(t, offsets, &b.slot_shape);
                    if vec > 1 {
                        let e = self.out.pref_vec.entry(squeeze(&b.slot_shape)).or_insert(1);
                        *e = (*e).max(vec as u32);
                    }
                    continue;
                }
                Op::For { body, .. } => {
                    self.collect_vectors(body);
                    continue;
                }
                Op::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    self.collect_vectors(then_body);
                    self.collect_vectors(else_body);
                    continue;
                }
                _ => continue,
            };
            let (Some(t), Some(v)) = (self.func.tensor_param(tensor), v) else {
                continue;
            };
            let shape = crate::ir::shape_of(self.func.value_type(v));
            if shape.is_empty() {
                continue;
            }
            let es = t.dtype.size_bytes();
            let vec = if t.contiguous {
                (16.min(t.align_bytes.max(es)) / es).max(1)
            } else {
                1
            };
            let e = self.out.pref_vec.entry(squeeze(shape)).or_insert(1);
            *e = (*e).max(vec);
        }
    }

    fn default_layout(&self, shape: &[u32]) -> Layout {
        self.out.default_layout(shape)
    }

    /// Loads read only to be broadcast (a `[1, N]` table row scaling a `[ROWS, N]`
    /// tile), possibly through casts and negations: such a load takes the broadcast
    /// result's anchor layout resized to its own shape (the extra dims become replica
    /// bits), so the broadcast is a register renaming instead of a round trip through
    /// shared memory (Triton's backward propagation of layouts to loads, for this case).
    /// Only where every value of the chain has that one use.
    fn broadcast_sources(&mut self) {
        let func = self.func;
        let mut defs: HashMap<ValueId, &Op> = HashMap::new();
        let mut uses: HashMap<ValueId, usize> = HashMap::new();
        let mut broadcasts: Vec<(ValueId, ValueId)> = Vec::new();
        crate::ir::visit_insts(func, vec![&func.body], |op| {
            for o in crate::ir::operands(op) {
                *uses.entry(o).or_default() += 1;
            }
        });
        for (_, inst) in func.insts.iter() {
            if let [r] = inst.results[..] {
                defs.insert(r, &inst.op);
                if let Op::Broadcast(src) = inst.op {
                    broadcasts.push((src, r));
                }
            }
        }
        for (src, res) in broadcasts {
            let (sshape, rshape) = (self.shape(src), self.shape(res));
            let target = self
                .default_layout(&rshape)
                .linear(&rshape, self.num_warps)
                .resize(&sshape);
            let mut chain = vec![src];
            let mut v = src;
            let reaches_load = loop {
                if uses.get(&v).copied() != Some(1) {
                    break false;
                }
                match defs.get(&v) {
                    Some(Op::Load { .. }) => break true,
                    Some(Op::Cast(a)) | Some(Op::Unary(crate::ir::UnaryOp::Neg, a))
                        if self.shape(*a) == sshape =>
                    {
                        v = *a;
                        chain.push(v);
                    }
                    _ => break false,
                }
            };
            if reaches_load {
                for v in chain {
                    self.wanted.insert(v, Layout::Linear(target.clone()));
                }
            }
        }
    }

    fn shape(&self, v: ValueId) -> Vec<u32> {
        crate::ir::shape_of(self.func.value_type(v)).to_vec()
    }

    fn lin(&self, v: ValueId) -> Linear {
        self.out.linear(self.func, v)
    }

    fn set(&mut self, v: ValueId, l: Layout) {
        if let Some(slot) = self.out.layouts.get_mut(v.index()) {
            *slot = Some(l);
        }
    }

    fn uniform(&self, v: ValueId) -> bool {
        self.out.is_uniform_tile(v) || matches!(self.func.value_type(v), ValueType::Scalar(_))
    }

    /// The layout of the first operand that is a real (non-uniform) tile, else the
    /// default for `shape`.
    fn follow(&self, operands: &[ValueId], shape: &[u32]) -> Layout {
        // A tensor core's fragment layout (or a row of it) is fixed by the hardware;
        // the others are free, so they convert instead: `maximum(m, rowmax(s))` with
        // `m` carried beside scores takes the scores' rows.
        fn from_mma(l: &Layout) -> bool {
            match l {
                Layout::Mma(_) => true,
                Layout::Slice { parent, .. } => from_mma(parent),
                _ => false,
            }
        }
        let decided =
            |o: ValueId| !self.uniform(o) && !self.undecided.contains(&o) && self.shape(o) == shape;
        if let Some(&o) = operands
            .iter()
            .find(|&&o| decided(o) && from_mma(&self.out.layout(o)))
        {
            return self.out.layout(o);
        }
        for &o in operands {
            if !self.uniform(o) && !self.undecided.contains(&o) && self.shape(o) == shape {
                return self.out.layout(o);
            }
        }
        self.default_layout(shape)
    }

    /// A layout for the result of a shape operation with the given weight map: the
    /// result shape's default layout if it is free, else `named` if free and holding no
    /// more registers per thread than the default, else the source's distribution
    /// relabeled (new broadcast bits on free lanes, then warps, then registers).
    fn shape_result(
        &self,
        src: ValueId,
        dst_shape: &[u32],
        weights: &[u64],
        named: Option<Layout>,
    ) -> Layout {
        let sl = self.lin(src);
        let def = self.default_layout(dst_shape);
        let def_lin = def.linear(dst_shape, self.num_warps);
        if layout::free_remap(&sl, &def_lin, weights).is_some() {
            return def;
        }
        if let Some(n) = named {
            // Free, but not at the price of more registers than the default: a small
            // tile's layout named for a large broadcast result can put every new
            // element in registers (e.g. [2, 1] -> [2, 4096] on 16 warps: 4096 each).
            let nl = n.linear(dst_shape, self.num_warps);
            if nl.num_regs() <= def_lin.num_regs()
                && layout::free_remap(&sl, &nl, weights).is_some()
            {
                return n;
            }
        }
        Layout::Linear(layout::relabel_through(&sl, dst_shape, weights))
    }

    fn block(&mut self, block: &Block) {
        for &i in &block.insts {
            self.inst(i);
        }
    }

    fn inst(&mut self, id: crate::ir::InstId) {
        let func = self.func;
        let inst = &func.insts[id];
        let res = inst.results.first().copied();
        let rshape = res.map(|r| self.shape(r)).unwrap_or_default();
        let scalar = rshape.is_empty();
        let layout = match &inst.op {
            Op::For { inits, body, .. } => {
                self.for_loop(inits, body, &inst.results);
                return;
            }
            Op::If {
                then_body,
                else_body,
                ..
            } => {
                self.block(then_body);
                self.block(else_body);
                let ty = |b: &Block| -> Vec<ValueId> {
                    b.insts
                        .last()
                        .and_then(|&l| match &func.insts[l].op {
                            Op::Yield(v) => Some(v.clone()),
                            _ => None,
                        })
                        .unwrap_or_default()
                };
                let (ty_then, ty_else) = (ty(then_body), ty(else_body));
                for (k, &r) in inst.results.iter().enumerate() {
                    let cands: Vec<ValueId> = ty_then
                        .get(k)
                        .iter()
                        .chain(ty_else.get(k).iter())
                        .map(|&&v| v)
                        .collect();
                    let l = self.follow(&cands, &self.shape(r));
                    self.set(r, l);
                }
                return;
            }
            _ if scalar => Layout::Uniform,
            Op::Const(_) | Op::Splat(_) => {
                if let Some(r) = res {
                    if let Some(u) = self.out.uniform_tile.get_mut(r.index()) {
                        *u = true;
                    }
                }
                self.default_layout(&rshape)
            }
            Op::Load { .. } => match res.and_then(|r| self.wanted.get(&r)) {
                Some(l) => l.clone(),
                None => self.default_layout(&rshape),
            },
            Op::Arange { .. } | Op::ClusterGather { .. } | Op::ScratchLoad { .. } => {
                self.default_layout(&rshape)
            }
            Op::Unary(_, a) | Op::Cast(a) => self.follow(&[*a], &rshape),
            Op::Binary(_, a, b) | Op::Compare(_, a, b) => self.follow(&[*a, *b], &rshape),
            Op::Select(c, a, b) => self.follow(&[*a, *b, *c], &rshape),
            Op::Fma(a, b, c) => self.follow(&[*a, *b, *c], &rshape),
            Op::Reduce { value, axis, .. } => Layout::Slice {
                parent: Box::new(self.out.layout(*value)),
                dim: *axis,
            },
            // A scan moves nothing between positions: the result keeps the operand's
            // distribution (the lowering works in any layout).
            Op::Scan { value, .. } => self.follow(&[*value], &rshape),
            Op::Broadcast(v) => {
                let w = layout::broadcast_weights(&self.shape(*v), &rshape);
                let named = self.out.layout(*v);
                self.shape_result(*v, &rshape, &w, Some(named))
            }
            Op::ExpandDims(v, axis) => {
                let w = layout::expand_dims_weights(&self.shape(*v), *axis as usize);
                let named = match self.out.layout(*v) {
                    Layout::Slice { parent, dim } if dim == *axis => Some(*parent),
                    _ => None,
                };
                // Undoing a reduction gives back its operand's layout (Triton's slice
                // encoding), so a row statistic broadcast over its rows again (a
                // softmax's max, attention's rescale) is a register renaming in that
                // layout and the result meets the rows it came from without a
                // conversion.
                match named {
                    Some(n)
                        if layout::free_remap(
                            &self.lin(*v),
                            &n.linear(&rshape, self.num_warps),
                            &w,
                        )
                        .is_some() =>
                    {
                        n
                    }
                    _ => self.shape_result(*v, &rshape, &w, named),
                }
            }
            Op::Permute(v, perm) => match layout::permute_weights(&self.shape(*v), perm) {
                Some(w) => self.shape_result(*v, &rshape, &w, None),
                None => self.default_layout(&rshape),
            },
            Op::Reshape(_) if res.is_some_and(|r| self.wanted.contains_key(&r)) => res
                .and_then(|r| self.wanted.get(&r))
                .cloned()
                .unwrap_or_else(|| self.default_layout(&rshape)),
            Op::Reshape(v) => match layout::reshape_weights(&self.shape(*v), &rshape) {
                Some(w) => self.shape_result(*v, &rshape, &w, None),
                None => self.default_layout(&rshape),
            },
            Op::Gather { offsets, mask, .. } => {
                let mut ops = offsets.clone();
                ops.extend(mask.iter().copied());
                self.follow(&ops, &rshape)
            }
            Op::AtomicAdd {
                offsets,
                value,
                mask,
                ..
            } => {
                let mut ops = vec![*value];
                ops.extend(offsets.iter().copied());
                ops.extend(mask.iter().copied());
                self.follow(&ops, &rshape)
            }
            Op::Dot {
                a,
                b,
                acc,
                precision,
            } => {
                if crate::passes::pipeline::mma_dot(func, *a, *b, *acc, *precision, self.num_warps)
                {
                    let k = self.shape(*a).get(1).copied().unwrap_or(0);
                    // wgmma computes f16/bf16 products here; a TF32 dot uses mma.sync.
                    let f16 = crate::passes::pipeline::mma_kind(func, *a, *b, *acc, *precision)
                        == Some(super::mma_layout::MmaKind::F16);
                    let wg = super::mma_layout::wgmma_grid(rshape[0], rshape[1], k, self.num_warps)
                        .filter(|_| {
                            self.wgmma
                                && f16
                                && shared_tile_load(func, &self.defs, *a)
                                && shared_tile_load(func, &self.defs, *b)
                        });
                    let grid = wg.unwrap_or_else(|| {
                        if self.row_dots.contains(&id) {
                            [self.num_warps, 1]
                        } else {
                            super::mma_layout::warp_grid(rshape[0], rshape[1], self.num_warps)
                        }
                    });
                    Layout::Mma(super::mma_layout::MmaLayout {
                        warps_m: grid[0],
                        warps_n: grid[1],
                        operand: super::mma_layout::MmaOperand::Acc,
                    })
                } else {
                    self.follow(&[*acc], &rshape)
                }
            }
            _ => self.default_layout(&rshape),
        };
        for &r in &inst.results {
            self.set(r, layout.clone());
        }
    }

    fn for_loop(&mut self, inits: &[ValueId], body: &Block, results: &[ValueId]) {
        if let Some(&iv) = body.args.first() {
            self.set(iv, Layout::Uniform);
        }
        let mut undecided = Vec::new();
        for (k, &init) in inits.iter().enumerate() {
            if let Some(&arg) = body.args.get(k + 1) {
                let l = self.out.layout(init);
                self.set(arg, l);
                // An inner loop's accumulator starts as the outer loop's undecided one.
                let open = self.uniform(init) || self.undecided.contains(&init);
                if open && self.shape(init) == self.shape(arg) {
                    undecided.push(arg);
                }
            }
        }
        self.undecided.extend(undecided.iter().copied());
        self.block(body);
        for a in &undecided {
            self.undecided.remove(a);
        }
        // Carried values that start as constants/splats follow what the body yields.
        let yields: Vec<ValueId> = body
            .insts
            .last()
            .and_then(|&l| match &self.func.insts[l].op {
                Op::Yield(v) => Some(v.clone()),
                _ => None,
            })
            .unwrap_or_default();
        // Rounds: an argument that took only a default layout from its yield (its yield
        // was computed from other undecided arguments: a row max carried beside scores
        // that are themselves carried, one block ahead) stays undecided for the next
        // walk, so it takes what the now-decided values give it.
        for _ in 0..4 {
            let mut changed = false;
            for (k, &init) in inits.iter().enumerate() {
                let (Some(&arg), Some(&y)) = (body.args.get(k + 1), yields.get(k)) else {
                    continue;
                };
                if (self.uniform(init) || undecided.contains(&arg))
                    && !self.uniform(y)
                    && self.shape(y) == self.shape(arg)
                {
                    let yl = self.out.layout(y);
                    if yl != self.out.layout(arg) {
                        self.set(arg, yl);
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
            let weak: Vec<ValueId> = undecided
                .iter()
                .copied()
                .filter(|&a| {
                    let shape = self.shape(a).to_vec();
                    self.out.layout(a) == self.default_layout(&shape)
                })
                .collect();
            self.undecided.extend(weak.iter().copied());
            self.block(body);
            for a in &weak {
                self.undecided.remove(a);
            }
        }
        for (k, &r) in results.iter().enumerate() {
            if let Some(&arg) = body.args.get(k + 1) {
                let l = self.out.layout(arg);
                self.set(r, l);
            }
        }
    }
}

/// 32-bit registers one thread needs to hold `v` (an estimate for the limit check).
pub fn value_regs(func: &Function, asg: &Assignment, v: ValueId) -> u32 {
    let ty = func.value_type(v);
    let words = if ty.dtype() == DType::I64 { 2 } else { 1 };
    if matches!(ty, ValueType::Scalar(_)) || asg.is_uniform_tile(v) {
        return words;
    }
    if asg.staged.contains(&v) {
        // Read fragment by fragment from shared memory: a k-step's operands at a time.
        return 0;
    }
    asg.linear(func, v).num_regs() as u32 * words
}

/// Element-wise and shape-op tile values that only feed element-wise instructions close
/// after them in the same block (`where(acc > 0.0, acc, 0.0)`'s comparison, GELU's
/// intermediate products, a bias row broadcast over the accumulator): ptxas computes
/// such a chain element by element, so they cost a few registers, not a whole tile each.
/// The estimate counts them as nothing; `ptxas -v` (the no-spill tests) is the judge of
/// the rest.
fn transient_values(func: &Function) -> std::collections::HashSet<ValueId> {
    /// How many instructions after its definition a transient value may still be read.
    const WINDOW: usize = 8;
    let mut out = std::collections::HashSet::new();
    let mut blocks = vec![&func.body];
    while let Some(b) = blocks.pop() {
        let pos: HashMap<crate::ir::InstId, usize> =
            b.insts.iter().enumerate().map(|(k, &i)| (i, k)).collect();
        let mut uses: HashMap<ValueId, Vec<usize>> = HashMap::new();
        let mut outside: std::collections::HashSet<ValueId> = std::collections::HashSet::new();
        for (k, &i) in b.insts.iter().enumerate() {
            let op = &func.insts[i].op;
            let elementwise = crate::ir::props(op).class == crate::ir::OpClass::Elementwise;
            for v in crate::ir::operands(op) {
                if elementwise {
                    uses.entry(v).or_default().push(k);
                } else {
                    outside.insert(v);
                }
            }
            for r in crate::ir::regions(op) {
                blocks.push(r);
                let mut nested = Vec::new();
                crate::ir::visit_insts(func, vec![r], |o| nested.extend(crate::ir::operands(o)));
                outside.extend(nested);
            }
        }
        for &i in &b.insts {
            let inst = &func.insts[i];
            // Element-wise results, and shape ops (a broadcast row is its source's
            // registers repeated) feeding element-wise work.
            if !matches!(
                crate::ir::props(&inst.op).class,
                crate::ir::OpClass::Elementwise | crate::ir::OpClass::Shape
            ) {
                continue;
            }
            let Some(&r) = inst.results.first() else {
                continue;
            };
            if matches!(func.value_type(r), ValueType::Scalar(_)) || outside.contains(&r) {
                continue;
            }
            let at = pos[&i];
            if let Some(us) = uses.get(&r) {
                if us.iter().all(|&u| u > at && u <= at + WINDOW) {
                    out.insert(r);
                }
            }
        }
    }
    out
}

/// Two kinds of tile that hold fewer registers than their layout's element count:
/// - *index tiles*: computed from `arange`, constants and scalars only (the column
///   indices of a mask, the mask itself), and not read inside a loop nested deeper than
///   their definition. The lowering recomputes an `arange` in each consumer's layout
///   and ptxas rematerializes such chains next to their use, so they count as nothing.
/// - *packed operands*: 16-bit tiles read only as a product's left operand (`p as bf16`
///   feeding `dot(p, v, acc)`): they live as `.b32` pairs in MMA fragments, so half.
fn cheap_values(
    func: &Function,
) -> (
    std::collections::HashSet<ValueId>,
    std::collections::HashSet<ValueId>,
) {
    use std::collections::{HashMap, HashSet};
    struct W {
        index: HashSet<ValueId>,
        def_depth: HashMap<ValueId, usize>,
        deepest_use: HashMap<ValueId, usize>,
        a_only: HashMap<ValueId, bool>,
    }
    fn walk(func: &Function, b: &Block, depth: usize, w: &mut W) {
        for &i in &b.insts {
            let inst = &func.insts[i];
            let ops = crate::ir::operands(&inst.op);
            for &v in &ops {
                let e = w.deepest_use.entry(v).or_insert(depth);
                *e = (*e).max(depth);
                let as_a = matches!(&inst.op, Op::Dot { a, b, acc, .. } if *a == v && *b != v && *acc != v);
                let e = w.a_only.entry(v).or_insert(true);
                *e &= as_a;
            }
            let class = crate::ir::props(&inst.op).class;
            let index = match class {
                crate::ir::OpClass::Constant => true,
                crate::ir::OpClass::Elementwise | crate::ir::OpClass::Shape => {
                    ops.iter().all(|&v| {
                        matches!(func.value_type(v), ValueType::Scalar(_)) || w.index.contains(&v)
                    })
                }
                _ => false,
            };
            for &r in &inst.results {
                w.def_depth.insert(r, depth);
                if index && matches!(func.value_type(r), ValueType::Tile(..)) {
                    w.index.insert(r);
                }
            }
            match &inst.op {
                Op::For { body, .. } => walk(func, body, depth + 1, w),
                Op::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    walk(func, then_body, depth, w);
                    walk(func, else_body, depth, w);
                }
                _ => {}
            }
        }
    }
    let mut w = W {
        index: HashSet::new(),
        def_depth: HashMap::new(),
        deepest_use: HashMap::new(),
        a_only: HashMap::new(),
    };
    walk(func, &func.body, 0, &mut w);
    let index = w
        .index
        .iter()
        .copied()
        .filter(|v| w.deepest_use.get(v).copied().unwrap_or(0) <= w.def_depth[v])
        .collect();
    let packed = w
        .a_only
        .iter()
        .filter(|&(&v, &only)| {
            only && matches!(func.value_type(v), ValueType::Tile(d, _) if d.size_bytes() == 2)
        })
        .map(|(&v, _)| v)
        .collect();
    (index, packed)
}

/// The register estimate of a kernel: the peak number of 32-bit registers held by
/// simultaneously live values, an instruction at the peak, and the values live there
/// with their registers (largest first).
pub struct RegisterEstimate {
    pub regs: u32,
    pub at: Option<crate::ir::InstId>,
    pub live: Vec<(ValueId, u32)>,
}

/// The register estimate ([`RegisterEstimate`]). Values used inside a loop stay live
/// for the whole loop.
pub fn estimate_registers(func: &Function, asg: &Assignment) -> RegisterEstimate {
    struct Walk {
        pos: usize,
        def: HashMap<ValueId, usize>,
        last: HashMap<ValueId, usize>,
        at: Vec<crate::ir::InstId>,
    }
    fn walk(func: &Function, b: &Block, w: &mut Walk, loops: &mut Vec<(usize, usize)>) {
        for &i in &b.insts {
            let inst = &func.insts[i];
            let here = w.pos;
            w.pos += 1;
            w.at.push(i);
            for v in crate::ir::operands(&inst.op) {
                use_at(w, v, here, loops);
            }
            match &inst.op {
                Op::For { body, .. } => {
                    // Arguments are defined inside the loop (at its first position), so
                    // their uses are not extended to the whole loop like the uses of
                    // values defined before it.
                    for &a in &body.args {
                        w.def.insert(a, here + 1);
                    }
                    let start = here;
                    // Find the loop's extent first (count), then walk with it known.
                    let end = here + count(func, body) + 1;
                    loops.push((start, end));
                    walk(func, body, w, loops);
                    loops.pop();
                    // A loop-carried argument dies at its last use in the body: the back
                    // edge carries the yielded value (live to the yield, which uses it),
                    // not the argument. An argument yielded unchanged is used by the
                    // yield and so stays live for the whole body.
                }
                Op::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    // The else body first: `if c { x = f(x) }` yields the unchanged `x`
                    // from an empty else, and `x` dies at `f` (the branches are
                    // alternatives; in a straight line one of them must go first).
                    walk(func, else_body, w, loops);
                    walk(func, then_body, w, loops);
                }
                _ => {}
            }
            for &r in &inst.results {
                w.def.insert(r, w.pos);
            }
        }
    }
    fn count(func: &Function, b: &Block) -> usize {
        b.insts
            .iter()
            .map(|&i| {
                1 + match &func.insts[i].op {
                    Op::For { body, .. } => count(func, body),
                    Op::If {
                        then_body,
                        else_body,
                        ..
                    } => count(func, then_body) + count(func, else_body),
                    _ => 0,
                }
            })
            .sum()
    }
    fn use_at(w: &mut Walk, v: ValueId, at: usize, loops: &[(usize, usize)]) {
        let d = w.def.get(&v).copied().unwrap_or(0);
        let mut last = at;
        for &(s, e) in loops {
            if s >= d {
                last = last.max(e);
            }
        }
        let e = w.last.entry(v).or_insert(last);
        *e = (*e).max(last);
    }
    let mut w = Walk {
        pos: 0,
        def: HashMap::new(),
        last: HashMap::new(),
        at: Vec::new(),
    };
    walk(func, &func.body, &mut w, &mut Vec::new());
    let transient = transient_values(func);
    let (index_tiles, packed) = cheap_values(func);
    let n = w.pos + 2;
    let mut diff = vec![0i64; n + 1];
    let mut spans = Vec::with_capacity(w.def.len());
    for (&v, &d) in &w.def {
        let l = w.last.get(&v).copied().unwrap_or(d).max(d).min(n - 1);
        let r = if transient.contains(&v) || index_tiles.contains(&v) {
            0
        } else if packed.contains(&v) {
            value_regs(func, asg, v).div_ceil(2)
        } else {
            value_regs(func, asg, v)
        };
        let d = d.min(n - 1);
        diff[d] += r as i64;
        diff[l + 1] -= r as i64;
        spans.push((v, d, l, r));
    }
    let (mut cur, mut best, mut best_at) = (0i64, 0i64, 0usize);
    for (p, d) in diff.iter().enumerate() {
        cur += d;
        if cur > best {
            best = cur;
            best_at = p;
        }
    }
    let mut live: Vec<(ValueId, u32)> = spans
        .into_iter()
        .filter(|&(_, d, l, r)| d <= best_at && best_at <= l && r > 0)
        .map(|(v, _, _, r)| (v, r))
        .collect();
    live.sort_by_key(|&(v, r)| (std::cmp::Reverse(r), v.index()));
    RegisterEstimate {
        regs: best.max(0) as u32,
        at: w.at.get(best_at.saturating_sub(1)).copied(),
        live,
    }
}

#[cfg(test)]
mod tests {
    use crate::{Arch, CompileOptions, SourceFile};

    /// A `[1, 64]` f32 table row scaling a loop-carried `[16, 64]` bf16 tile (whose
    /// anchor holds 8 elements per thread; the f32 row alone would get 4): the load takes
    /// the broadcast's layout, so no shared-memory conversion (no barrier) remains.
    #[test]
    fn loads_feeding_a_broadcast_take_its_layout() {
        let src = r#"
kernel k(x: tensor<bf16, [_, 64], contiguous>, t: tensor<f32, [_, 64], contiguous>, y: tensor<bf16, [_, 64], contiguous>) {
    let b = bid(0);
    let mut xn = load(x, [b, 0], [16, 64]);
    for j in 0..4 {
        let xt = xn as f32;
        xn = load(x, [b + j + 1, 0], [16, 64]);
        let c = -(load(t, [j, 0], [1, 64]) as f32);
        store(y, [b + j, 0], (xt * c) as bf16);
    }
}
"#;
        let file = SourceFile::new("k.kg", src);
        let mut opts = CompileOptions::new(Arch::Sm90a);
        opts.num_warps = Some(4);
        let ptx = crate::compile(&file, &opts)
            .unwrap_or_else(|d| panic!("{}", d.render(&file)))
            .ptx;
        assert!(!ptx.contains("bar.sync"), "{ptx}");
        assert!(!ptx.contains("st.shared"), "{ptx}");
        // The table row is still read with 16-byte vectors (two per thread).
        assert!(ptx.contains("ld.global.v4.b32"), "{ptx}");
        crate::back::ptx::tests::assemble(&ptx, "sm_90a", "broadcast_source");
    }
}
