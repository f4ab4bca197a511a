//! Backward layout propagation into cheap producers (a phase of layout assignment).
//!
//! The forward walk of `assign` gives each value a layout from its operands. A value
//! that is cheap to compute in any layout — an index tile (`arange`, constants,
//! comparisons and arithmetic on them, their broadcasts and reshapes: a mask such as
//! `reshape(arange(0, 2), [1, 2, 1]) == 0`), or a small tile loaded from a tensor the
//! kernel never writes (a `[1, 64]` table row) — then often meets its consumers in
//! another layout (a reduction's `Slice`, a reshaped tile's relabeled distribution),
//! and lowering converts it through shared memory: a barrier pair and a round trip per
//! use. Triton removes such conversions by rematerializing the producer chain in the
//! consumer's layout; here, where a value has one layout, the producer simply *takes*
//! the layout its consumers need.
//!
//! Assumes: the forward walk has run (every value has a layout); the layouts of values
//! that are not cheap are final.
//! Guarantees: only cheap values change, and one changes only when every use of it is an
//! element-wise instruction or a shape operation (broadcast, expand_dims, permute, a
//! reshape that is a bit relabeling) and all of them need the same layout, which is
//! then the value's (for a shape-op use, the layout that makes the shape op a register
//! renaming: checked with `layout::free_remap`, else nothing changes). Instructions are
//! visited last to first, so a producer sees its consumers' final layouts, and a chain
//! of cheap values follows its last consumer back to its start. A load of more than
//! `NARROW_LOAD_ELEMENTS` changes only to a layout that reads at least as many contiguous
//! elements per thread as its default (no narrower vectors). Nothing is computed twice: no instruction is added.

use super::assign::Assignment;
use super::layout::{self, Layout, Linear};
use crate::ir::{Function, InstId, Op, ValueId};
use crate::types::ValueType;
use std::collections::{HashMap, HashSet};

/// Loads of at most this many elements count as cheap (a table row or a small block of
/// one; a big tile keeps the layout its own accesses chose).
const CHEAP_LOAD_ELEMENTS: u64 = 1024;

/// Loads of at most this many elements take their consumers' layout even when it reads
/// fewer contiguous elements per thread than their default: a few narrow loads cost less
/// than a conversion's barrier pair (attention's per-row `lse` of 64 to 128 floats, read
/// in every iteration of its backward loop, broadcast over an `mma` accumulator's rows).
const NARROW_LOAD_ELEMENTS: u64 = 256;

/// Runs the phase over `func`, updating `asg` in place.
pub fn propagate(func: &Function, asg: &mut Assignment) {
    let order = crate::ir::program_order(func);
    let mut defs: HashMap<ValueId, InstId> = HashMap::new();
    let mut uses: HashMap<ValueId, Vec<InstId>> = HashMap::new();
    let mut written: HashSet<u32> = HashSet::new();
    for &i in &order {
        let inst = &func.insts[i];
        for &r in &inst.results {
            defs.insert(r, i);
        }
        for o in crate::ir::operands(&inst.op) {
            uses.entry(o).or_default().push(i);
        }
        if let Op::Store { tensor, .. }
        | Op::Scatter { tensor, .. }
        | Op::AtomicAdd { tensor, .. } = &inst.op
        {
            written.insert(*tensor);
        }
    }
    let mut cheap = Cheapness {
        func,
        defs: &defs,
        written: &written,
        memo: HashMap::new(),
    };
    for &i in order.iter().rev() {
        let inst = &func.insts[i];
        let [v] = inst.results[..] else {
            continue;
        };
        if is_scalar(func, v) || asg.is_uniform_tile(v) || !cheap.is_cheap(v) {
            continue;
        }
        let Some(users) = uses.get(&v) else {
            continue;
        };
        let mut wanted: Option<Linear> = None;
        let agreed = users.iter().all(|&u| match wanted_layout(func, asg, u, v) {
            Some(l) => match &wanted {
                None => {
                    wanted = Some(l);
                    true
                }
                Some(w) => *w == l,
            },
            None => false,
        });
        let Some(want) = wanted.filter(|_| agreed) else {
            continue;
        };
        if want == asg.linear(func, v) {
            continue;
        }
        if let Op::Load { .. } = inst.op {
            let shape = crate::ir::shape_of(func.value_type(v)).to_vec();
            let last = shape.len().saturating_sub(1);
            let default = asg.default_layout(&shape).linear(&shape, asg.num_warps);
            let extent = layout::pad_pow2(shape.get(last).copied().unwrap_or(1));
            let elements: u64 = shape.iter().map(|&d| d as u64).product();
            if elements > NARROW_LOAD_ELEMENTS
                && want.contiguity(last) < default.contiguity(last).min(extent)
            {
                continue;
            }
        }
        asg.set_layout(v, Layout::Linear(want));
    }
}

/// The layout instruction `user` needs its operand `v` in, when lowering would
/// otherwise convert it: the result's layout for an element-wise instruction, the
/// layout that makes a shape operation free for a shape op. `None` for any other use.
fn wanted_layout(func: &Function, asg: &Assignment, user: InstId, v: ValueId) -> Option<Linear> {
    let inst = &func.insts[user];
    let res = *inst.results.first()?;
    if is_scalar(func, res) {
        return None;
    }
    let src_shape = crate::ir::shape_of(func.value_type(v)).to_vec();
    let res_shape = crate::ir::shape_of(func.value_type(res)).to_vec();
    let weights = match &inst.op {
        Op::Unary(..)
        | Op::Binary(..)
        | Op::Compare(..)
        | Op::Select(..)
        | Op::Fma(..)
        | Op::Cast(_) => {
            return (src_shape == res_shape).then(|| asg.linear(func, res));
        }
        Op::Broadcast(_) => layout::broadcast_weights(&src_shape, &res_shape),
        Op::ExpandDims(_, axis) => layout::expand_dims_weights(&src_shape, *axis as usize),
        Op::Permute(_, perm) => layout::permute_weights(&src_shape, perm)?,
        Op::Reshape(_) => layout::reshape_weights(&src_shape, &res_shape)?,
        _ => return None,
    };
    let dst = asg.linear(func, res);
    let src = pull_back(&dst, &src_shape, &weights);
    layout::free_remap(&src, &dst, &weights).map(|_| src)
}

/// The source layout from which the shape operation with `weights` produces `dst` by
/// renaming registers: every destination bit moved to the source bit it reads, bits of
/// broadcast dims dropped (registers) or left as replicas (lanes, warps).
pub fn pull_back(dst: &Linear, src_shape: &[u32], weights: &[u64]) -> Linear {
    let padded_src = layout::padded(src_shape);
    dst.relabel(src_shape, |cb| layout::weight_bit(&padded_src, weights, cb))
}

fn is_scalar(func: &Function, v: ValueId) -> bool {
    matches!(func.value_type(v), ValueType::Scalar(_))
}

/// Which values are cheap to compute in any layout (see the module docs), memoized.
pub struct Cheapness<'a> {
    func: &'a Function,
    defs: &'a HashMap<ValueId, InstId>,
    written: &'a HashSet<u32>,
    memo: HashMap<ValueId, bool>,
}

impl Cheapness<'_> {
    pub fn is_cheap(&mut self, v: ValueId) -> bool {
        if is_scalar(self.func, v) {
            return true;
        }
        if let Some(&c) = self.memo.get(&v) {
            return c;
        }
        // Cycles cannot occur (SSA; loop-carried values have no defining instruction),
        // but a value under evaluation counts as not cheap.
        self.memo.insert(v, false);
        let c = match self.defs.get(&v) {
            None => false,
            Some(&i) => {
                let op = &self.func.insts[i].op;
                match op {
                    // A reshape that is not a bit relabeling divides indices instead.
                    Op::Reshape(src) => {
                        let s = crate::ir::shape_of(self.func.value_type(*src)).to_vec();
                        let d = crate::ir::shape_of(self.func.value_type(v)).to_vec();
                        layout::reshape_weights(&s, &d).is_some() && self.is_cheap(*src)
                    }
                    _ if crate::ir::props(op).is_movable_value() => {
                        crate::ir::operands(op).iter().all(|&o| self.is_cheap(o))
                    }
                    Op::Load { tensor, .. } => {
                        let n: u64 = crate::ir::shape_of(self.func.value_type(v))
                            .iter()
                            .map(|&d| d as u64)
                            .product();
                        !self.written.contains(tensor) && n <= CHEAP_LOAD_ELEMENTS
                    }
                    _ => false,
                }
            }
        };
        self.memo.insert(v, c);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::pull_back;
    use crate::back::ptx::layout::{self, Blocked};
    use crate::{Arch, CompileOptions, SourceFile};

    fn compile(src: &str, warps: u32) -> String {
        let file = SourceFile::new("k.kg", src);
        let mut opts = CompileOptions::new(Arch::Sm90a);
        opts.num_warps = Some(warps);
        crate::compile(&file, &opts)
            .unwrap_or_else(|d| panic!("{}", d.render(&file)))
            .ptx
    }

    /// Whole-row rotate-half (RoPE): the halves are picked by a mask built from
    /// `arange` and combined by a sum over the middle axis (a lane exchange), and two
    /// `[1, 64]` table rows scale the sums, whose layout is the sum's `Slice`. Without
    /// the phase the mask and both rows went through shared memory (three conversions,
    /// six barriers, the rows read 2 bytes at a time); now each takes its consumers'
    /// layout: no barrier, every access 16 bytes wide.
    #[test]
    fn masks_and_table_rows_take_their_consumers_layouts() {
        let src = r#"
kernel rope_row(x: tensor<bf16, [_, 128], contiguous>, cos: tensor<bf16, [_, 64], contiguous>,
                sin: tensor<bf16, [_, 64], contiguous>, out: tensor<bf16, [_, 128], contiguous>) {
    let i = bid(0);
    let p = bid(1);
    let x3 = reshape(load(x, [i, 0], [16, 128]), [16, 2, 64]) as f32;
    let first = reshape(arange(0, 2), [1, 2, 1]) == 0;
    let x1 = sum(where(first, x3, 0.0), 1);
    let x2 = sum(where(first, 0.0, x3), 1);
    let c = load(cos, [p, 0], [1, 64]) as f32;
    let s = load(sin, [p, 0], [1, 64]) as f32;
    let o1 = expand_dims(x1 * c - x2 * s, 1);
    let o2 = expand_dims(x2 * c + x1 * s, 1);
    store(out, [i, 0], reshape(where(first, o1, o2), [16, 128]) as bf16);
}
"#;
        let ptx = compile(src, 8);
        assert!(!ptx.contains("bar.sync"), "{ptx}");
        assert!(!ptx.contains("st.shared"), "{ptx}");
        assert_eq!(ptx.matches("ld.global.v4.b32").count(), 3, "{ptx}");
        assert!(!ptx.contains("ld.global.b16"), "{ptx}");
        assert!(ptx.contains("shfl.sync.bfly"), "{ptx}");
        crate::back::ptx::tests::assemble(&ptx, "sm_90a", "cheap_layouts_rope_row");
    }

    /// A cheap value whose consumers need two different layouts keeps its own, and
    /// lowering converts it for the one that differs (one layout per value; nothing is
    /// computed twice).
    #[test]
    fn consumers_that_disagree_leave_the_layout_alone() {
        let src = r#"
kernel k(a: tensor<f32, [_, 64], contiguous>, b: tensor<f32, [_, 16], contiguous>,
         t: tensor<f32, [_], contiguous>, y: tensor<f32, [_], contiguous>) {
    let row = load(t, [0], [64]);
    let across = sum(load(a, [0, 0], [16, 64]), 0);
    let down = sum(load(b, [0, 0], [64, 16]), 1);
    store(y, [0], across * row);
    store(y, [1], down * row);
}
"#;
        let conversions = |ptx: &str| {
            ptx.matches("layout conversion through shared memory")
                .count()
        };
        let with_row = compile(src, 4);
        crate::back::ptx::tests::assemble(&with_row, "sm_90a", "cheap_layouts_disagree");
        // The same kernel without the row: what the two sums' stores convert anyway.
        let without = compile(&src.replace(" * row", ""), 4);
        assert_eq!(
            conversions(&with_row),
            conversions(&without) + 1,
            "{with_row}"
        );
    }

    /// For broadcast, expand_dims and permute weights over default layouts of several
    /// shapes and warp counts, the pulled-back source layout makes the shape op free.
    #[test]
    fn pulled_back_layouts_make_shape_ops_free() {
        let cases: &[(&[u32], &[u32])] = &[
            (&[1, 64], &[16, 64]),
            (&[16, 1], &[16, 64]),
            (&[1, 2, 1], &[16, 2, 64]),
            (&[1, 1, 64], &[8, 2, 64]),
            (&[1], &[4096]),
        ];
        for &(src, dst) in cases {
            for warps in [1, 4, 16] {
                for vec in [1, 4, 8] {
                    let d = Blocked::default_for(dst, vec, warps).linear(dst);
                    let w = layout::broadcast_weights(src, dst);
                    let s = pull_back(&d, src, &w);
                    assert!(
                        layout::free_remap(&s, &d, &w).is_some(),
                        "{src:?} -> {dst:?}, {warps} warps, vec {vec}"
                    );
                }
            }
        }
        let d = Blocked::default_for(&[16, 1, 64], 4, 4).linear(&[16, 1, 64]);
        let w = layout::expand_dims_weights(&[16, 64], 1);
        assert!(layout::free_remap(&pull_back(&d, &[16, 64], &w), &d, &w).is_some());
        let d = Blocked::default_for(&[64, 16], 4, 4).linear(&[64, 16]);
        let w = layout::permute_weights(&[16, 64], &[1, 0]).expect("a permutation");
        assert!(layout::free_remap(&pull_back(&d, &[16, 64], &w), &d, &w).is_some());
    }
}
