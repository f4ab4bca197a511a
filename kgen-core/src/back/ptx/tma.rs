//! Which tile fetches the Hopper copy engine (TMA) makes, decided before lowering so the
//! kernel's ABI can list the tensor maps they need.
//!
//! Assumes: `func` is pipelined IR (`passes::pipeline`): the shared ring buffers that
//! stage `dot` operands are filled only by `scratch_fetch` and read by `scratch_load`.
//! Guarantees: [`plan`] returns an empty plan unless *every* fetch of the kernel can be a
//! `cp.async.bulk.tensor` copy: the target has TMA, the specialization does not say
//! `no_tma`, the kernel makes no thread-private (`scratch`) fetch or gather (whose
//! `cp.async` groups the waits count), and each fetch reads a `contiguous` tensor of rank 2
//! to 5 (a 2-D slot: the pipeline squeezed the leading extents of 1, which the map's box
//! keeps as 1) whose specialization promises 16-byte alignment (the base address, the
//! strides and the row length: what `cuTensorMapEncodeTiled` requires), into a swizzled slot whose
//! tile is exactly the fetched tile (power-of-two extents, so the box fills the slot)
//! with zero padding (TMA fills out-of-bounds elements with zeros). A slot is copied as
//! one box per swizzle atom (the atom's columns by every row: the box's inner extent is
//! the swizzle span, as TMA requires), so the copy engine writes exactly
//! `SharedTile::offset`'s layout. Every fetch of one tensor with one box shares a map.
//!
//! With the specialization's `multicast`, in a kernel that runs in clusters of two blocks
//! (`cluster_rank(2)`), a buffer whose
//! every fetch is the same in both blocks (slot and tile index cluster-uniform, under
//! cluster-uniform control: `ir/uniform.rs`) and whose slot holds an even number of
//! swizzle atoms is *multicast*: each block copies half the atoms into both blocks'
//! shared memory (`.multicast::cluster`), so the pair reads the tile from L2 once.
//!
//! In such a kernel, with the specialization's `tma_store`, a tile `store` may be a TMA
//! store too (`lower/tma_store.rs`): the
//! tile goes through shared memory in the same swizzled layout, then one
//! `cp.async.bulk.tensor` per atom writes it, clipped at the tensor's bounds as `store`
//! is. A store qualifies when its tensor is a `contiguous` rank-2 tensor of f16, bf16 or
//! f32 with 16-byte alignment, the kernel never reads that tensor and stores to it only
//! there (so no later access of the kernel can observe the copy's asynchrony, and one
//! store's successive executions are ordered by waiting for the previous copy before
//! issuing the next), and the value is a 2-D tile of power-of-two extents whose swizzle
//! atom a box can hold.

use super::lower::staged::buffer_tile;
use super::swizzle::Swizzle;
use crate::abi::{Specialization, TensorMapSpec};
use crate::ir::{Function, InstId, Op, ParamKind};
use crate::target::Target;
use crate::types::DType;
use std::collections::HashMap;

/// Largest box extent along either dimension (`boxDim[i] <= 256`).
pub const MAX_BOX: u32 = 256;

/// One tensor map the kernel takes as a parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedMap {
    /// The tensor parameter it maps.
    pub param: u32,
    pub spec: TensorMapSpec,
    /// Its `.param` name.
    pub ptx_name: String,
}

/// The kernel's TMA fetches and stores: the maps, which map fills each shared buffer,
/// and which map each TMA store writes through.
#[derive(Clone, Debug, Default)]
pub struct TmaPlan {
    pub maps: Vec<PlannedMap>,
    /// Shared buffer → the map its fetches use.
    pub by_buf: HashMap<u32, usize>,
    /// `store` instruction → the map it writes through.
    pub by_store: HashMap<InstId, usize>,
    /// Shared buffers whose fetches are multicast across a cluster of two (module docs).
    pub multicast: std::collections::BTreeSet<u32>,
}

impl TmaPlan {
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// The map that fills shared buffer `buf`, if its fetches use TMA.
    pub fn map_of(&self, buf: u32) -> Option<&PlannedMap> {
        self.by_buf.get(&buf).and_then(|&m| self.maps.get(m))
    }

    /// The index of the map of tensor `param` with `spec`, added if new (one map per
    /// tensor and box, shared by its fetches and stores).
    fn intern(&mut self, func: &Function, param: u32, spec: TensorMapSpec) -> usize {
        if let Some(m) = self
            .maps
            .iter()
            .position(|m| m.param == param && m.spec == spec)
        {
            return m;
        }
        let m = self.maps.len();
        let name = func
            .params
            .get(param as usize)
            .map(|p| p.name.as_str())
            .unwrap_or("t");
        self.maps.push(PlannedMap {
            param,
            spec,
            ptx_name: format!("p_{name}_tmap{m}"),
        });
        m
    }
}

/// The map a fetch of tensor `param` into buffer `buf` needs, or `None` when TMA cannot
/// make it (module docs).
fn fetch_map(func: &Function, buf: u32, param: u32, padding_zero: bool) -> Option<TensorMapSpec> {
    let b = func.scratch.get(buf as usize)?;
    let tile = buffer_tile(func, buf)?;
    let t = match &func.params.get(param as usize)?.kind {
        ParamKind::Tensor(t) => t,
        ParamKind::Scalar(_) => return None,
    };
    let dtype_ok = matches!(t.dtype, DType::F16 | DType::BF16 | DType::F32);
    let exact = b.slot_shape == [tile.rows, tile.cols];
    if !b.shared
        || !dtype_ok
        || !(2..=5).contains(&t.rank())
        || !t.contiguous
        || t.align_bytes < 16
        || !exact
        || !padding_zero
        || tile.swizzle == Swizzle::None
        || tile.rows > MAX_BOX
        || tile.atom_cols() > MAX_BOX
    {
        return None;
    }
    Some(TensorMapSpec {
        box_dims: [tile.atom_cols(), tile.rows],
        swizzle: tile.swizzle.tensor_map_code(),
        rank: t.rank() as u32,
    })
}

/// Decides which fetches use TMA (module docs); empty when any fetch cannot.
pub fn plan(func: &Function, target: &Target, spec: &Specialization) -> TmaPlan {
    let mut out = TmaPlan::default();
    if !target.caps.tma || !target.caps.mbarrier_tx || spec.no_tma {
        return out;
    }
    let mut fetches: Vec<(u32, u32, bool)> = Vec::new();
    let mut refuse = false;
    crate::ir::visit_insts(func, vec![&func.body], |op| match op {
        Op::ScratchFetch {
            buf,
            tensor,
            padding,
            ..
        } => fetches.push((*buf, *tensor, padding.to_f64() == 0.0)),
        Op::ScratchGather { .. } => refuse = true,
        _ => {}
    });
    if refuse || fetches.is_empty() {
        return out;
    }
    for (buf, param, zero) in fetches {
        let Some(spec) = fetch_map(func, buf, param, zero) else {
            return TmaPlan::default();
        };
        let m = out.intern(func, param, spec);
        if let Some(&prev) = out.by_buf.get(&buf) {
            if prev != m {
                // One buffer filled from two maps: keep it simple, no TMA.
                return TmaPlan::default();
            }
        }
        out.by_buf.insert(buf, m);
    }
    if spec.multicast && crate::ir::cluster_size(func) == Some(2) {
        out.multicast = multicast_bufs(func, &out);
    }
    if spec.tma_store {
        for (id, param, map) in store_maps(func) {
            let m = out.intern(func, param, map);
            out.by_store.insert(id, m);
        }
    }
    out
}

/// The TMA-filled buffers whose fetches are all alike in both blocks of a cluster of two
/// and whose slots hold an even number of swizzle atoms (module docs).
fn multicast_bufs(func: &Function, plan: &TmaPlan) -> std::collections::BTreeSet<u32> {
    let uni = crate::ir::uniform::analyze(func, &func.body, crate::ir::uniform::Scope::Cluster(2));
    let mut ok: HashMap<u32, bool> = HashMap::new();
    for id in crate::ir::program_order(func) {
        let Op::ScratchFetch {
            buf, slot, index, ..
        } = &func.insts[id].op
        else {
            continue;
        };
        let alike = uni.control(id) && uni.value(*slot) && index.iter().all(|&v| uni.value(v));
        let even = buffer_tile(func, *buf).is_some_and(|t| (t.cols / t.atom_cols()) % 2 == 0);
        let e = ok.entry(*buf).or_insert(true);
        *e = *e && alike && even && plan.by_buf.contains_key(buf);
    }
    ok.into_iter().filter(|&(_, m)| m).map(|(b, _)| b).collect()
}

/// The stores that can be TMA stores (module docs), with their tensors and maps.
fn store_maps(func: &Function) -> Vec<(InstId, u32, TensorMapSpec)> {
    let mut stores: HashMap<u32, Vec<InstId>> = HashMap::new();
    let mut other: std::collections::HashSet<u32> = Default::default();
    for i in crate::ir::program_order(func) {
        match &func.insts[i].op {
            Op::Store { tensor, .. } => stores.entry(*tensor).or_default().push(i),
            Op::Load { tensor, .. }
            | Op::Gather { tensor, .. }
            | Op::Scatter { tensor, .. }
            | Op::AtomicAdd { tensor, .. }
            | Op::ScratchFetch { tensor, .. }
            | Op::ScratchGather { tensor, .. } => {
                other.insert(*tensor);
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (param, ids) in stores {
        let [id] = ids.as_slice() else { continue };
        if other.contains(&param) {
            continue;
        }
        if let Some(spec) = store_map(func, *id, param) {
            out.push((*id, param, spec));
        }
    }
    out.sort_by_key(|x| x.0);
    out
}

/// The map TMA store `id` of tensor `param` needs, or `None` (module docs).
fn store_map(func: &Function, id: InstId, param: u32) -> Option<TensorMapSpec> {
    let Op::Store { value, .. } = &func.insts[id].op else {
        return None;
    };
    let t = match &func.params.get(param as usize)?.kind {
        ParamKind::Tensor(t) => t,
        ParamKind::Scalar(_) => return None,
    };
    let ty = func.value_type(*value);
    let dims = ty.shape()?.dims().to_vec();
    let [rows, cols] = dims.as_slice() else {
        return None;
    };
    let es = t.dtype.size_bytes();
    let tile = crate::back::ptx::swizzle::SharedTile::new(*rows, *cols, es);
    let ok = matches!(t.dtype, DType::F16 | DType::BF16 | DType::F32)
        && ty.dtype() == t.dtype
        && t.rank() == 2
        && t.contiguous
        && t.align_bytes >= 16
        && rows.is_power_of_two()
        && cols.is_power_of_two()
        && tile.swizzle != Swizzle::None
        && *rows <= MAX_BOX
        && tile.atom_cols() <= MAX_BOX;
    ok.then(|| TensorMapSpec {
        box_dims: [tile.atom_cols(), tile.rows],
        swizzle: tile.swizzle.tensor_map_code(),
        rank: 2,
    })
}
