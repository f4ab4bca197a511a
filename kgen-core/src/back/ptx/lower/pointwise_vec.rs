//! Vectorized `gather`, `scatter` and f32 `atomic_add` reductions (old values unused,
//! sm_90): one vector instruction for each run of `vec` elements a thread holds, where
//! the axis facts prove the run contiguous in memory.
//!
//! Assumes: `AxisFacts::pointwise_vector` allowed `vec` (≥ 2) for this access, and the
//! access layout holds at least `vec` consecutive elements of the last axis per thread.
//! So for each such run: the last coordinate of its first element is a multiple of
//! `vec` and the following ones step by +1, the other coordinates are equal, and the run
//! lies in one aligned chunk that is wholly in or wholly out of bounds. A gather's mask
//! is constant over each run (else the caller keeps it element by element).
//! Guarantees:
//! - One address and one bounds check per run (its first element's), one `ld.global.v*`
//!   / `st.global.v*` of the run, the padding `mov`ed in first for a predicated load.
//! - Gathers are unpacked like tile loads (`DeferredLoad`): at the first use when every
//!   use is in the same block, so a gather issued ahead stays in flight.
//! - A scatter whose mask varies inside a run stores the run whole where every element
//!   is masked in, and element by element (`st.global` of one element, under its own
//!   mask) where some are not: the edges of a row that starts at an unaligned offset.
//!   Every replica but one is predicated off, as for tile stores.
//! - A reduction is a scatter whose runs are `red.global.add.v2.f32` / `.v4.f32` (and
//!   whose cut runs are `red.global.add.f32` per element): each element is added once,
//!   by the one replica that writes. Its (unread) result is bound to the values.

use super::memory::{CoordinateCache, DeferredLoad, VectorAccess};
use super::{unsupported, Lowerer, TensorRegs, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::layout::Linear;
use crate::ir::InstId;
use crate::types::{DType, Scalar};

/// A `gather` (`values: None`) or `scatter` that `lower_pointwise_mem` vectorizes.
pub(super) struct PointwiseAccess {
    pub id: InstId,
    pub tensor: TensorRegs,
    pub dtype: DType,
    pub lin: Linear,
    pub shape: Vec<u32>,
    /// Per dimension: the coordinate of every register of the access, and its dtype.
    pub offsets: Vec<(Vec<Reg>, DType)>,
    pub mask: Option<Vec<Reg>>,
    /// The mask is constant over every run (always true for gathers here).
    pub mask_uniform: bool,
    pub values: Option<Vec<Reg>>,
    pub other: Option<Scalar>,
    pub policy: Option<Reg>,
    pub vec: u32,
    /// An `atomic_add` whose old values are unused: the runs are added (`red`), not
    /// stored.
    pub reduce: bool,
}

/// One run of an offset access: `vec` consecutive elements of the last axis that one
/// thread holds, accessed as one vector.
pub(super) struct Run {
    /// The run's registers, first element first.
    pub members: Vec<usize>,
    /// The first element's address.
    pub addr: Reg,
    /// In bounds, not a padded slot, the one replica that writes (writes only), and with
    /// `with_mask` the first element's mask.
    pub pred: Option<Reg>,
}

impl Lowerer<'_> {
    /// The run width of an offset access of tensor `p` at `offsets` (mask `mask`) over
    /// the `shape` tile in layout `lin`, at most `cap` elements: what the axis facts and
    /// the layout's per-thread contiguity allow; and whether the mask is constant over
    /// runs of that width.
    pub(super) fn run_width(
        &self,
        p: &crate::ir::TensorParam,
        offsets: &[crate::ir::ValueId],
        mask: Option<crate::ir::ValueId>,
        shape: &[u32],
        lin: &Linear,
        cap: u64,
    ) -> (u32, bool) {
        let Some(last) = shape.len().checked_sub(1) else {
            return (1, true);
        };
        let facts = &self.asg.axis;
        let vec = facts
            .pointwise_vector(p, offsets, shape)
            .min(lin.contiguity(last) as u64)
            .min(cap) as u32;
        let uniform = mask.is_none_or(|m| facts.in_access(m, shape).constancy >= vec as u64);
        (vec.max(1), uniform)
    }

    /// The runs of `a.vec` elements of access `a` (`a.vec` may be 1: every element its
    /// own run). With `with_mask`, each run's predicate includes its first element's
    /// mask, which is right where the mask is constant over runs (or runs are single
    /// elements).
    pub(super) fn offset_runs(
        &mut self,
        a: &PointwiseAccess,
        with_mask: bool,
        span: crate::span::Span,
    ) -> R<Vec<Run>> {
        let rank = a.shape.len();
        let last = rank - 1;
        let vec = a.vec;
        let replica = if a.values.is_some() {
            self.replica0(&a.lin)
        } else {
            None
        };
        let ths: Vec<Option<Reg>> = (0..rank).map(|d| self.thread_coord(&a.lin, d)).collect();
        let mut coords = CoordinateCache::default();
        let mut runs = Vec::new();
        for r in 0..a.lin.num_regs() {
            let c = a.lin.reg_coord(r);
            if !c[last].is_multiple_of(vec)
                || (0..rank).any(|d| ths[d].is_none() && c[d] >= a.shape[d])
            {
                continue;
            }
            let members = run_members(&a.lin, &c, last, vec)
                .ok_or_else(|| unsupported(span, "vector run outside the thread's registers"))?;
            let (mut preds, elem) =
                self.element_offset(&a.tensor, &a.offsets, r, &mut coords, span)?;
            // Padded slots of non-power-of-two extents held by threads: the run's first
            // element decides (a run never straddles the extent: `vec` divides it).
            preds.extend(self.within_extent(&a.shape, &ths, &c));
            preds.extend(replica);
            if let (true, Some(m)) = (with_mask, &a.mask) {
                preds.push(m[r]);
            }
            let addr = self.element_address(a.tensor.base, a.dtype, elem);
            let pred = self.and_all(&preds);
            runs.push(Run {
                members,
                addr,
                pred,
            });
        }
        Ok(runs)
    }

    /// Issues the loads of a gather's runs (padding `mov`ed in first where predicated);
    /// the words are unpacked by `materialize`.
    pub(super) fn issue_run_loads(&mut self, a: &PointwiseAccess, runs: &[Run]) -> DeferredLoad {
        let pad_bits = a
            .other
            .map(|o| super::memory::scalar_bits(o, a.dtype))
            .unwrap_or(0);
        let mut groups = Vec::with_capacity(runs.len());
        for run in runs {
            let access = VectorAccess {
                addr: run.addr,
                imm: 0,
                pred: run.pred,
                policy: a.policy,
            };
            let words = self.load_vector(a.dtype, a.vec, &access, pad_bits);
            groups.push((run.members.clone(), words));
        }
        DeferredLoad {
            dt: a.dtype,
            vec: a.vec,
            groups,
            num_regs: a.lin.num_regs(),
            padding: a.other.unwrap_or(Scalar::Int(0, a.dtype)),
        }
    }

    pub(super) fn lower_pointwise_vectors(&mut self, a: PointwiseAccess) -> R<()> {
        let func = self.func;
        let inst = &func.insts[a.id];
        let span = inst.span;
        let res = inst.results.first().copied();
        let dt = a.dtype;
        let es = dt.size_bytes() as i64;
        let Some(values) = &a.values else {
            // A gather (its mask is constant over runs).
            let runs = self.offset_runs(&a, true, span)?;
            let load = self.issue_run_loads(&a, &runs);
            let Some(res) = res else {
                return Ok(());
            };
            // As for tile loads: 16-bit words are unpacked at the first use when every
            // use is in this block, so the gather stays in flight until then.
            if dt.size_bytes() < 4 && self.all_uses_in_current_block(res) {
                self.deferred.insert(res, load);
            } else {
                let regs = self.materialize(load, span)?;
                self.bind(res, regs);
            }
            return Ok(());
        };
        let runs = self.offset_runs(&a, a.mask_uniform, span)?;
        for run in runs {
            let elems: Vec<Reg> = run.members.iter().map(|&m| values[m]).collect();
            let (words, ty) = self.pack(dt, &elems);
            // A mask that varies inside runs: the run whole where all its elements are
            // masked in.
            let all = match (&a.mask, a.mask_uniform) {
                (Some(m), false) => {
                    let ms: Vec<Reg> = run.members.iter().map(|&j| m[j]).collect();
                    self.and_all(&ms)
                }
                _ => None,
            };
            let full = match (run.pred, all) {
                (Some(p), Some(q)) => self.and_all(&[p, q]),
                (p, q) => p.or(q),
            };
            if a.reduce {
                self.reduce_words(run.addr, 0, &words, full);
            } else {
                self.store_words(run.addr, 0, &words, ty, full, a.policy);
            }
            // Runs the mask cuts: the masked-in elements one by one.
            if let (Some(m), Some(all)) = (&a.mask, all) {
                let some_out = self.op1(RegClass::Pred, "not.pred", vec![all.into()]);
                let cut = match run.pred {
                    Some(p) => {
                        self.op1(RegClass::Pred, "and.pred", vec![p.into(), some_out.into()])
                    }
                    None => some_out,
                };
                let element_words = self.split_words(dt, &words);
                for (j, &member) in run.members.iter().enumerate() {
                    let pj = self.and_all(&[cut, m[member]]);
                    let ety = match es {
                        2 => "b16",
                        8 => "b64",
                        _ => ty,
                    };
                    if a.reduce {
                        self.reduce_words(run.addr, j as i64 * es, &element_words[j..j + 1], pj);
                    } else {
                        self.store_words(
                            run.addr,
                            j as i64 * es,
                            &element_words[j..j + 1],
                            ety,
                            pj,
                            a.policy,
                        );
                    }
                }
            }
        }
        if let (true, Some(r)) = (a.reduce, res) {
            self.bind(r, values.clone());
        }
        Ok(())
    }

    /// `red.global.add` of 1, 2 or 4 consecutive f32 `words` at `addr + imm`.
    fn reduce_words(&mut self, addr: Reg, imm: i64, words: &[Reg], pred: Option<Reg>) {
        let (v, src) = match words {
            [w] => ("", Operand::Reg(*w)),
            _ => (
                if words.len() == 2 { ".v2" } else { ".v4" },
                Operand::Vec(words.to_vec()),
            ),
        };
        self.emit_if(
            pred.map(|p| (p, false)),
            format!("red.global.add{v}.f32"),
            vec![Operand::Mem(Addr::Reg(addr), imm), src],
        );
    }

    /// The element registers in memory format of packed `words`: 16-bit elements are
    /// the halves of each 32-bit word (low half first); wider ones are the words.
    fn split_words(&mut self, dt: DType, words: &[Reg]) -> Vec<Reg> {
        if dt.size_bytes() != 2 {
            return words.to_vec();
        }
        let mut out = Vec::with_capacity(words.len() * 2);
        for &w in words {
            let (lo, hi) = (self.reg(RegClass::B16), self.reg(RegClass::B16));
            self.emit("mov.b32", vec![Operand::Vec(vec![lo, hi]), w.into()]);
            out.push(lo);
            out.push(hi);
        }
        out
    }
}

/// The registers of the `vec` consecutive elements along `last` starting at coordinate
/// `c` (`None` if the layout does not keep them in one thread).
fn run_members(lin: &Linear, c: &[u32], last: usize, vec: u32) -> Option<Vec<usize>> {
    (0..vec)
        .map(|j| {
            let mut cj = c.to_vec();
            cj[last] += j;
            lin.reg_index(&cj)
        })
        .collect()
}
