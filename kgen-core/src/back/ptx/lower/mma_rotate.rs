//! Fragment rotation: a pipelined `mma.sync` loop loads the next stage's first fragments
//! before the current stage's last tensor-core instructions (CUTLASS's multistage
//! mainloop), so the `ldmatrix` latency after the block barrier is hidden.
//!
//! Unrotated, every iteration of a `passes::pipeline` loop opens with
//! `cp.async.wait_group` + `bar.sync`, then the first k-step's `ldmatrix`, whose
//! results the first `mma.sync` waits for with nothing else to issue. Rotated:
//! - before the loop: the wait, the barrier and k-step 0's fragments of the first slot;
//! - in the body: the head's `scratch_wait` emits nothing (it already happened); k-step 0
//!   uses the carried fragments; before the *last* k-step's `mma.sync` the iteration
//!   issues its remaining copies, waits (the same `pending` count: every copy of this
//!   iteration is committed by then, as at the next head), synchronizes the block, and
//!   loads k-step 0's fragments of the next slot, which the back edge carries.
//!
//! Assumes (checked by [`Lowerer::rotation_plan`], which refuses anything else): the loop
//! body is straight-line code whose only shared-memory operations are one `scratch_wait`
//! before everything else of that kind, `cp.async` fetches (all before the `dot`) into
//! the two rings of one f16/bf16 `dot` lowered on `mma.sync`, and the two staged
//! `scratch_load`s of that `dot` (through transposes), both of the slot held by one
//! loop-carried value whose next value is computed before the `dot`; rings of two or
//! more slots; no TMA, no warp specialization, no wgmma in the kernel. The pipeline pass's ring discipline: an
//! iteration reading slot `r` fetches into slot `r - 1` (mod the ring size), the slot
//! the previous iteration read.
//!
//! Guarantees: the same products in the same order (bit-identical results); one block
//! barrier per iteration, after every read of the slot the next iteration's copies
//! overwrite and after the wait that completes the slot read next; the barrier tracker
//! (`sync.rs`) is told the loop head follows such a barrier, which is what makes its
//! copies need no other (the reads since are of the slot read next, which no copy of
//! the iteration touches).

use super::mma::{Fragments, Source};
use super::staged::{buffer_tile, StagedView};
use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Operand, Reg};
use crate::ir::{InputPrecision, InstId, Op, ValueId};
use crate::span::Span;
use crate::types::DType;

/// What rotates, found in the IR before the loop is lowered.
#[derive(Clone, Debug)]
pub(super) struct RotationPlan {
    /// The loop's `scratch_wait` (emitted before the loop and inside the `dot` instead).
    pub wait: InstId,
    pub pending: u32,
    /// The `dot` whose first fragments are carried.
    pub dot: InstId,
    /// Per operand (a, b): its ring buffer and whether the operand is the slot's tile
    /// transposed.
    pub operands: [(u32, bool); 2],
    /// The loop-carried slot: its index among the body's arguments (0 is the induction
    /// variable) and the value the body yields for it.
    pub slot_arg: usize,
    pub next_slot: ValueId,
}

/// A rotation in progress: the plan, the carried fragments (k-step 0 of the slot this
/// iteration reads) and, once the `dot` is lowered, those it loaded for the next one.
pub(super) struct Rotation {
    pub plan: RotationPlan,
    pub carried: Fragments,
    pub next: Option<Fragments>,
}

impl Lowerer<'_> {
    /// Whether the kernel has at most one `dot` (a GEMM's loop, not a chain of products).
    pub(super) fn single_dot_kernel(&self) -> bool {
        let func = self.func;
        crate::ir::program_order(func)
            .into_iter()
            .filter(|&i| matches!(func.insts[i].op, Op::Dot { .. }))
            .count()
            <= 1
    }

    /// The rotation plan of `for` loop `id`, when its body has the one shape this handles
    /// (module docs); `None` leaves the loop as it is.
    pub(super) fn rotation_plan(&self, id: InstId) -> Option<RotationPlan> {
        let func = self.func;
        let Op::For { body, .. } = &func.insts[id].op else {
            return None;
        };
        if !self.target.caps.cp_async || self.ws != super::ws::WsMode::Off || self.has_wgmma_dot() {
            return None;
        }
        let mut wait = None;
        let mut dot = None;
        let mut yields = None;
        let mut pos = std::collections::HashMap::new();
        for (k, &i) in body.insts.iter().enumerate() {
            let inst = &func.insts[i];
            for &r in &inst.results {
                pos.insert(r, k);
            }
            match &inst.op {
                Op::ScratchWait { pending } => {
                    if wait.is_some() {
                        return None;
                    }
                    wait = Some((i, *pending));
                }
                Op::ScratchFetch { buf, tensor, .. } => {
                    // Nothing of the ring's before the wait.
                    wait?;
                    let t = func.tensor_param(*tensor)?;
                    let vec_bytes = if t.contiguous {
                        t.align_bytes.min(16)
                    } else {
                        t.dtype.size_bytes()
                    };
                    if !self.is_shared(*buf) || self.is_tma_buf(*buf) || vec_bytes < 4 {
                        return None;
                    }
                    // Every copy of the iteration must be committed at the dot's wait,
                    // which then counts as the next head's would.
                    if dot.is_some() {
                        return None;
                    }
                }
                Op::ScratchLoad { .. } | Op::Permute(..) => {
                    // Nothing of the ring's before the wait.
                    wait?;
                    if !inst.results.iter().all(|r| self.asg.staged.contains(r)) {
                        return None;
                    }
                }
                Op::Dot { .. } if dot.is_some() => return None,
                Op::Dot {
                    a, b, precision, ..
                } => {
                    if *precision != InputPrecision::Ieee
                        || !matches!(self.dtype(*a), DType::F16 | DType::BF16)
                    {
                        return None;
                    }
                    let r = *inst.results.first()?;
                    if !matches!(self.asg.layout(r), crate::back::ptx::layout::Layout::Mma(_)) {
                        return None;
                    }
                    // Two k-steps at most: with more, one barrier's latency is spread
                    // over more products, and the carried fragments beside the extra
                    // lane offsets spilled (128 x 128 x 64 on 4 warps, 128 x 256 x 64 on
                    // 8: 8 bytes each on sm_80, ptxas 13.0).
                    let kext = self.shape(*a).get(1).copied().unwrap_or(0);
                    if kext.max(1).next_power_of_two() > 32 {
                        return None;
                    }
                    dot = Some((i, k, *a, *b));
                }
                Op::Yield(vs) => yields = Some(vs.clone()),
                op if crate::ir::props(op).is_pure() => {}
                _ => return None,
            }
        }
        let ((wait, pending), (dot, dot_pos, a, b), yields) = (wait?, dot?, yields?);
        // Each operand: transposes over a staged scratch_load of a shared ring.
        let source = |mut v: ValueId| -> Option<(u32, bool, ValueId)> {
            let mut transposed = false;
            loop {
                let inst = &func.insts[*body.insts.get(*pos.get(&v)?)?];
                match &inst.op {
                    Op::Permute(x, p) if p.as_slice() == [1, 0] => {
                        transposed = !transposed;
                        v = *x;
                    }
                    Op::ScratchLoad { buf, slot } => return Some((*buf, transposed, *slot)),
                    _ => return None,
                }
            }
        };
        let (buf_a, tr_a, slot_a) = source(a)?;
        let (buf_b, tr_b, slot_b) = source(b)?;
        if slot_a != slot_b || buf_a == buf_b {
            return None;
        }
        for buf in [buf_a, buf_b] {
            let sb = func.scratch.get(buf as usize)?;
            if !sb.shared || sb.slots < 2 || self.is_tma_buf(buf) {
                return None;
            }
        }
        let slot_arg = body.args.iter().position(|&x| x == slot_a)?;
        let next_slot = *yields.get(slot_arg.checked_sub(1)?)?;
        // The next slot must be known when the dot runs.
        if pos.get(&next_slot).is_some_and(|&k| k > dot_pos) {
            return None;
        }
        Some(RotationPlan {
            wait,
            pending,
            dot,
            operands: [(buf_a, tr_a), (buf_b, tr_b)],
            slot_arg,
            next_slot,
        })
    }

    /// Before the loop: the wait, the barrier and k-step 0's fragments of slot `slot`
    /// (the loop's initial slot value). Returns the fragments the loop carries.
    pub(super) fn rotation_prologue(&mut self, plan: &RotationPlan, slot: ValueId) -> R<Fragments> {
        let span = self.func.insts[plan.dot].span;
        self.rotation_wait(plan.pending, span)?;
        self.rotation_fragments(plan, slot, span)
    }

    /// `cp.async.wait_group pending` + the block barrier, reported to the tracker.
    pub(super) fn rotation_wait(&mut self, pending: u32, span: Span) -> R<()> {
        if !self.deferred_copies.is_empty() {
            return Err(unsupported(
                span,
                "internal: ring copies still deferred at a rotated wait",
            ));
        }
        self.emit("cp.async.wait_group", vec![Operand::Imm(pending as i64)]);
        self.sync.async_done();
        self.emit_cta_barrier();
        Ok(())
    }

    /// k-step 0's fragments of the plan's `dot` read from slot `slot` of its rings.
    pub(super) fn rotation_fragments(
        &mut self,
        plan: &RotationPlan,
        slot: ValueId,
        span: Span,
    ) -> R<Fragments> {
        let mut src = Vec::with_capacity(2);
        for &(buf, transposed) in &plan.operands {
            let (base, tile, range) = self.shared_slot(buf, slot, span)?;
            if buffer_tile(self.func, buf) != Some(tile) {
                return Err(unsupported(span, "internal: a ring's slot layout"));
            }
            self.sync.note_read(range);
            src.push(Source::Staged(StagedView {
                buf,
                base,
                tile,
                transposed,
            }));
        }
        let g = self.mma_geometry(plan.dot)?;
        self.mma_fragments(&src[0], &src[1], 0, &g, span)
    }

    /// At the loop head of a rotated loop (instead of a join): the state on entry and
    /// on the back edge is "after a block barrier, then reads of the slot this iteration
    /// reads", and none of the iteration's copies writes that slot (module docs).
    pub(super) fn rotation_head(&mut self) {
        self.sync.barrier();
    }

    /// Moves the fragments loaded for the next iteration into the carried registers.
    pub(super) fn rotation_back_edge(&mut self, span: Span) -> R<()> {
        let Some(rot) = self.rotation.take() else {
            return Ok(());
        };
        let next = rot
            .next
            .ok_or_else(|| unsupported(span, "internal: a rotated dot did not run"))?;
        let pairs: Vec<(Reg, Reg)> = rot.carried.regs().into_iter().zip(next.regs()).collect();
        for (dst, src) in pairs {
            self.mov(dst, src.into());
        }
        Ok(())
    }
}
