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

use super::lower::staged::buffer_tile;
use super::swizzle::Swizzle;
use crate::abi::{Specialization, TensorMapSpec};
use crate::ir::{Function, Op, ParamKind};
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

/// The kernel's TMA fetches: the maps, and which map fills each shared buffer.
#[derive(Clone, Debug, Default)]
pub struct TmaPlan {
    pub maps: Vec<PlannedMap>,
    /// Shared buffer → the map its fetches use.
    pub by_buf: HashMap<u32, usize>,
}

impl TmaPlan {
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// The map that fills shared buffer `buf`, if its fetches use TMA.
    pub fn map_of(&self, buf: u32) -> Option<&PlannedMap> {
        self.by_buf.get(&buf).and_then(|&m| self.maps.get(m))
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
    let mut keyed: HashMap<(u32, TensorMapSpec), usize> = HashMap::new();
    for (buf, param, zero) in fetches {
        let Some(spec) = fetch_map(func, buf, param, zero) else {
            return TmaPlan::default();
        };
        let next = keyed.len();
        let m = *keyed.entry((param, spec)).or_insert(next);
        if m == out.maps.len() {
            let name = func
                .params
                .get(param as usize)
                .map(|p| p.name.as_str())
                .unwrap_or("t");
            out.maps.push(PlannedMap {
                param,
                spec,
                ptx_name: format!("p_{name}_tmap{m}"),
            });
        }
        if let Some(&prev) = out.by_buf.get(&buf) {
            if prev != m {
                // One buffer filled from two maps: keep it simple, no TMA.
                return TmaPlan::default();
            }
        }
        out.by_buf.insert(buf, m);
    }
    out
}
