//! Chained tensor-core products (a phase of layout assignment): attention's `S = Q·Kᵀ`,
//! `P = softmax-like(S)`, `O = P·V`.
//!
//! When a product's result reaches the left operand of another product through
//! element-wise work (a scale, a mask, `exp2`, a cast: Triton's "chain dot"), the second
//! product's operand should be the first's accumulator registers, renamed: the `mma.sync`
//! accumulator of two neighbouring n8 tiles *is* the A fragment of one k16 tile
//! (`mma_layout`). That holds when both accumulators put every warp along M (a warp
//! grid `[W, 1]`, each warp owning whole rows): the row statistics of such a loop (a
//! running max, a running sum, a rescale of the output by a row vector) then stay in a
//! warp too, reduced with shuffles among the 4 lanes of a row group and never through
//! shared memory. The default grid (`mma_layout::warp_grid`, square parts) would split a
//! row between warps and convert `P` through shared memory in every iteration.
//!
//! A register operand loaded from memory once (attention's `Q` tile, loaded before the
//! loop over K/V blocks) is loaded straight into the operand's fragment layout, so the
//! product in the loop reads it as it is instead of converting it in every iteration.
//!
//! Assumes: valid IR; `num_warps` is the block's warp count.
//! Guarantees: [`row_dots`] lists the `mma.sync` products that take the `[W, 1]` grid:
//! both ends of every chain whose shapes hold whole instructions on it
//! (`mma_layout::mma_shape_ok`). [`operand_loads`] lists loads (with the reshapes that
//! drop their leading unit extents) whose only use is a register operand of such a
//! product, with the fragment layout to load them in. Nothing else changes; the
//! products stay correct in any layout (this only removes conversions).

use super::layout::{Layout, Linear};
use super::mma_layout::{MmaLayout, MmaOperand};
use crate::ir::{Function, InstId, Op, ValueId};
use std::collections::{HashMap, HashSet};

/// Definitions and uses of every value.
struct Graph<'f> {
    func: &'f Function,
    defs: HashMap<ValueId, InstId>,
    uses: HashMap<ValueId, Vec<InstId>>,
}

impl<'f> Graph<'f> {
    fn new(func: &'f Function) -> Self {
        let defs = crate::ir::chains::definitions(func);
        let mut uses: HashMap<ValueId, Vec<InstId>> = HashMap::new();
        for i in crate::ir::program_order(func) {
            for o in crate::ir::operands(&func.insts[i].op) {
                uses.entry(o).or_default().push(i);
            }
        }
        Graph { func, defs, uses }
    }

    fn shape(&self, v: ValueId) -> &[u32] {
        crate::ir::shape_of(self.func.value_type(v))
    }
}

fn is_mma(func: &Function, d: InstId, num_warps: u32) -> Option<(ValueId, ValueId, ValueId)> {
    match func.insts[d].op {
        Op::Dot {
            a,
            b,
            acc,
            precision,
        } if crate::passes::pipeline::mma_dot(func, a, b, acc, precision, num_warps) => {
            Some((a, b, acc))
        }
        _ => None,
    }
}

/// Whether `d`'s tile holds whole instructions with every warp along M.
fn row_grid_ok(func: &Function, d: InstId, num_warps: u32) -> bool {
    let Op::Dot {
        a,
        b,
        acc,
        precision,
    } = func.insts[d].op
    else {
        return false;
    };
    let Some(kind) = crate::passes::pipeline::mma_kind(func, a, b, acc, precision) else {
        return false;
    };
    let (Some(sa), Some(sb)) = (func.value_type(a).shape(), func.value_type(b).shape()) else {
        return false;
    };
    let (sa, sb) = (sa.dims(), sb.dims());
    is_mma(func, d, num_warps).is_some()
        && super::mma_layout::mma_shape_ok(sa[0], sb[1], sa[1], [num_warps, 1], kind)
}

/// The products that take the `[W, 1]` warp grid (module docs).
pub fn row_dots(func: &Function, num_warps: u32) -> HashSet<InstId> {
    let g = Graph::new(func);
    let mut out = HashSet::new();
    let dots: Vec<InstId> = crate::ir::program_order(func)
        .into_iter()
        .filter(|&d| is_mma(func, d, num_warps).is_some())
        .collect();
    for &d2 in &dots {
        let Some((a, _, _)) = is_mma(func, d2, num_warps) else {
            continue;
        };
        let firsts: Vec<InstId> = crate::ir::chains::producing_dots(func, &g.defs, a)
            .into_iter()
            .filter(|&d1| row_grid_ok(func, d1, num_warps))
            .collect();
        if !firsts.is_empty() && row_grid_ok(func, d2, num_warps) {
            out.extend(firsts);
            out.insert(d2);
        }
    }
    out
}

/// The grid of a `[W, 1]` product's fragments.
pub fn row_layout(num_warps: u32, operand: MmaOperand) -> MmaLayout {
    MmaLayout {
        warps_m: num_warps,
        warps_n: 1,
        operand,
    }
}

/// Loads to read straight into a register operand's fragment layout (module docs):
/// value → layout, for the load's result and the squeezing reshape after it.
pub fn operand_loads(
    func: &Function,
    num_warps: u32,
    rows: &HashSet<InstId>,
) -> HashMap<ValueId, Layout> {
    let g = Graph::new(func);
    let mut out = HashMap::new();
    for &d in rows {
        let Some((a, _, _)) = is_mma(func, d, num_warps) else {
            continue;
        };
        // Only the A operand of a 16-bit product (`mma.rs` packs it from registers).
        if !matches!(
            func.value_type(a).dtype(),
            crate::types::DType::F16 | crate::types::DType::BF16
        ) {
            continue;
        }
        if g.uses.get(&a).map(Vec::len) != Some(1) {
            continue;
        }
        let Some(&def) = g.defs.get(&a) else {
            continue;
        };
        let frag = row_layout(num_warps, MmaOperand::A);
        let shape2 = g.shape(a).to_vec();
        let lin2 = frag.linear(&shape2);
        match &func.insts[def].op {
            Op::Load { .. } => {
                out.insert(a, Layout::Mma(frag));
            }
            Op::Reshape(src) => {
                let src_shape = g.shape(*src).to_vec();
                let squeezes = src_shape.len() > 2
                    && src_shape[src_shape.len() - 2..] == shape2[..]
                    && src_shape[..src_shape.len() - 2].iter().all(|&x| x == 1);
                let only_use = g.uses.get(src).map(Vec::len) == Some(1);
                let is_load = g
                    .defs
                    .get(src)
                    .is_some_and(|&l| matches!(func.insts[l].op, Op::Load { .. }));
                if squeezes && only_use && is_load {
                    let lead = (src_shape.len() - 2) as u8;
                    let lin = Linear {
                        shape: crate::back::ptx::layout::padded(&src_shape),
                        regs: lin2.regs.iter().map(|&(d, b)| (d + lead, b)).collect(),
                        lanes: lin2.lanes.map(|c| c.map(|(d, b)| (d + lead, b))),
                        warps: lin2
                            .warps
                            .iter()
                            .map(|c| c.map(|(d, b)| (d + lead, b)))
                            .collect(),
                    };
                    out.insert(*src, Layout::Linear(lin));
                    out.insert(a, Layout::Mma(frag));
                }
            }
            _ => {}
        }
    }
    out
}
