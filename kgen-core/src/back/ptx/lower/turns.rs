//! Emitting the ping-pong turns of two consumer warpgroups (`back/ptx/pingpong.rs` says
//! what they are and where they go).
//!
//! Assumes: the loops in [`Turns::plan`] were planned by `pingpong::plan` for this
//! function, and [`Lowerer::with_pingpong`] was called only for a block that splits into
//! two consumer warpgroups (256 consumer threads) and a producer.
//! Guarantees: inside the consumers' code (after the split) each planned loop gets
//! warpgroup 1's arrival before it (when it runs), the sync before its window and the
//! arrivals after it (warpgroup 1's but in the last iteration); every generation of both
//! turn barriers completes, and none is pending at exit. The turn
//! instructions are [`Family::WarpTurn`], which `wgmma_waits.rs` lets products run
//! across. A block barrier emitted inside a window is an `Unsupported` error. Elsewhere
//! (sm_80, no split, the producer's code) nothing is emitted.

use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Family, Inst, Operand, Reg, RegClass, Stmt};
use crate::back::ptx::pingpong::Window;
use crate::back::ptx::sync::Barrier;
use crate::ir::InstId;
use crate::span::Span;
use std::collections::HashMap;

/// Threads that take part in a turn: both consumer warpgroups (one syncs, the other
/// arrives).
const TURN_THREADS: u32 = 256;

/// The turn state of one lowering.
#[derive(Clone, Debug, Default)]
pub struct Turns {
    /// The loops that take turns and their windows.
    pub plan: HashMap<InstId, Window>,
    /// Whether this thread is in warpgroup 1: made once in the prologue.
    second: Option<Reg>,
    /// The two turn barriers, warpgroup 0's and 1's (named barriers over both
    /// warpgroups, from the kernel's `NamedBarriers`), allocated at the first use.
    barriers: Option<[Barrier; 2]>,
    /// Where the open window's sync stands in the body.
    open: Option<usize>,
    /// The planned loops being lowered (innermost last): the `for`, its induction
    /// variable, upper bound and step registers.
    loops_open: Vec<(InstId, Reg, Reg, Reg)>,
    /// Loops that took turns.
    pub loops: u32,
}

impl Lowerer<'_> {
    /// Ping-pong for the planned loops of a block of two consumer warpgroups.
    pub fn with_pingpong(mut self, on: bool) -> Self {
        if on {
            self.turns.plan = crate::back::ptx::pingpong::plan(self.func);
        }
        self
    }

    fn taking_turns(&self) -> bool {
        self.ws == super::ws::WsMode::Consumer && self.threads() == TURN_THREADS
    }

    /// The window of the innermost planned loop being lowered with turns.
    fn open_window(&self) -> Option<Window> {
        let &(id, ..) = self.turns.loops_open.last()?;
        self.turns.plan.get(&id).copied()
    }

    /// Whether this is warpgroup 1 (`%tid.x >= 128`), made once in the prologue.
    fn second_warpgroup(&mut self) -> Reg {
        if let Some(r) = self.turns.second {
            return r;
        }
        let tid = self.tid();
        let r = self.in_prologue(|l| {
            l.op1(
                RegClass::Pred,
                "setp.ge.u32",
                vec![tid.into(), Operand::Imm(128)],
            )
        });
        self.turns.second = Some(r);
        r
    }

    /// The turn barriers (allocated once), or an error when the kernel has used up the
    /// 15 named barriers.
    fn turn_barriers(&mut self, span: Span) -> R<[Barrier; 2]> {
        if let Some(b) = self.turns.barriers {
            return Ok(b);
        }
        let warps = TURN_THREADS / 32;
        let (Some(a), Some(b)) = (self.named.alloc(warps), self.named.alloc(warps)) else {
            return Err(unsupported(
                span,
                "ping-pong needs two named barriers; none is left",
            ));
        };
        self.turns.barriers = Some([a, b]);
        Ok([a, b])
    }

    /// Warpgroup w waits on its turn barrier, as two predicated instructions with
    /// immediate ids (a register id would make ptxas reserve all 16 barriers).
    fn wait_turn(&mut self, span: Span) -> R<()> {
        let second = self.second_warpgroup();
        let bars = self.turn_barriers(span)?;
        for (w, b) in bars.into_iter().enumerate() {
            self.turn(Some((second, w == 0)), "bar.sync", b.sync_operands());
        }
        Ok(())
    }

    fn turn(&mut self, guard: Option<(Reg, bool)>, opcode: &str, operands: Vec<i64>) {
        let ops = operands.into_iter().map(Operand::Imm).collect();
        self.push(Stmt::Inst(Inst::turn(guard, opcode, ops)));
    }

    /// Before planned loop `id` (induction variable `iv` from `lo`, below `up` by
    /// `st`): warpgroup 1 arrives on warpgroup 0's turn if the loop runs at all.
    pub(super) fn turns_before_loop(
        &mut self,
        id: InstId,
        (lo, iv, up, st): (Reg, Reg, Reg, Reg),
        span: Span,
    ) -> R<()> {
        if !self.turns.plan.contains_key(&id) || !self.taking_turns() {
            return Ok(());
        }
        let [first, _] = self.turn_barriers(span)?;
        let second = self.second_warpgroup();
        let runs = self.op1(RegClass::Pred, "setp.lt.s32", vec![lo.into(), up.into()]);
        let go = self.op1(RegClass::Pred, "and.pred", vec![second.into(), runs.into()]);
        self.comment("ping-pong: warpgroup 0 issues first");
        self.turn(Some((go, false)), "bar.arrive", first.sync_operands());
        self.turns.loops_open.push((id, iv, up, st));
        self.turns.loops += 1;
        Ok(())
    }

    /// After planned loop `id`.
    pub(super) fn turns_after_loop(&mut self, id: InstId) {
        if self.turns.loops_open.last().is_some_and(|l| l.0 == id) {
            self.turns.loops_open.pop();
        }
    }

    /// Before `dot` `id`: the sync that opens a window, if `id` opens one.
    pub(super) fn turns_before_dot(&mut self, id: InstId, span: Span) -> R<()> {
        if self.open_window().is_none_or(|w| w.first != id) {
            return Ok(());
        }
        self.comment("ping-pong: wait for this warpgroup's turn");
        self.wait_turn(span)?;
        self.turns.open = Some(self.body.len());
        Ok(())
    }

    /// After `dot` `id`: the arrival that closes its window, if `id` closes one.
    pub(super) fn turns_after_dot(&mut self, id: InstId, span: Span) -> R<()> {
        if self.open_window().is_none_or(|w| w.last != id) {
            return Ok(());
        }
        let Some(start) = self.turns.open.take() else {
            return Err(unsupported(
                span,
                "a ping-pong window closed before it opened",
            ));
        };
        let blocked = self.body[start..].iter().any(|s| {
            matches!(s, Stmt::Inst(i) if matches!(
                i.opcode.family,
                Family::Bar | Family::BarRed | Family::BarrierCluster
            ))
        });
        if blocked {
            return Err(unsupported(
                span,
                "ping-pong: a block barrier between the products of one turn (the other warpgroup waits for its turn and never reaches it); compile without --pingpong",
            ));
        }
        let Some(&(_, iv, up, st)) = self.turns.loops_open.last() else {
            return Err(unsupported(span, "a ping-pong window outside its loop"));
        };
        // Warpgroup 0 hands the turn over every iteration; warpgroup 1 on all but the
        // last, which warpgroup 0 would never take (no arrival is left pending at exit).
        let second = self.second_warpgroup();
        let next = self.op1(RegClass::B32, "add.s32", vec![iv.into(), st.into()]);
        let more = self.op1(RegClass::Pred, "setp.lt.s32", vec![next.into(), up.into()]);
        let go = self.op1(RegClass::Pred, "and.pred", vec![second.into(), more.into()]);
        let [first, other] = self.turn_barriers(span)?;
        self.turn(Some((second, true)), "bar.arrive", other.sync_operands());
        self.turn(Some((go, false)), "bar.arrive", first.sync_operands());
        Ok(())
    }
}
