//! Warp specialization of a TMA-fed kernel: one extra warpgroup whose first thread only
//! issues the copies, while the kernel's own warps (the consumers) only compute.
//!
//! Assumes: `back::ptx::tma::plan` made every fetch a TMA copy, the dots that read the
//! rings are wgmma dots (`lower/wgmma.rs` calls [`Lowerer::ws_release`]), the kernel
//! uses no cluster exchange (`cluster_gather`; clusters of two with multicast rings are
//! fine: a release of a multicast slot arrives on both blocks' `empty` mbarriers, whose
//! producers each wait for both blocks' consumers, and both the split and the exit are
//! cluster barriers), and [`Lowerer::ws_split_here`] found the first ring's allocation in the
//! kernel's top-level block with no shared memory used before it (so the extra warps
//! have done nothing but uniform scalar work, which is what every thread computes).
//! Guarantees:
//! - The block gets 128 more threads (`Lowered::producer_threads`); the consumers keep
//!   `%tid.x` 0 .. `threads()`, so every layout is unchanged. At the split, after the
//!   rings and their mbarriers exist and a barrier of all threads has made the
//!   initialization visible, threads at or above `threads()` branch to the producer
//!   section, placed after the consumers' `ret`.
//! - The producer section re-lowers the rest of the top-level block in *producer mode*:
//!   only the fetches and the scalar arithmetic they need (loop counters, tile indices,
//!   ring slots, carried scalars, and runtime `if`s that only compute scalars, such as a
//!   tile index corrected in a branch), by one thread. Before a copy into a slot it waits
//!   on the slot's `empty` mbarrier for the consumers' release of the slot's previous
//!   fill (parity: that fill's count, whose first wait passes at once).
//! - The consumers lower everything else; a fetch only counts itself (for the drain);
//!   a read waits on the slot's `full` phase. The last wgmma dot of an iteration that
//!   reads a refilled slot ([`last_readers`]) releases it: lane 0 of each consumer warp
//!   arrives on the slot's `empty` mbarrier right after the dot's commit, and
//!   `wgmma_waits` holds that arrive until the group has completed (at the product's
//!   first use, not at once), so the product runs on through the work after it. With a
//!   lag the previous iteration's slot is released after `wait_group 1`. A buffer filled
//!   once outside every loop ([`fetched_once`]) is never released. Their block barriers
//!   are named barrier 1 over the consumer threads (the first the kernel's
//!   `NamedBarriers` hands out; the producer never joins one after the split).
//! - Registers: the producer warpgroup gives registers back (`setmaxnreg.dec` to
//!   [`PRODUCER_REGS`]) and the consumers take them (`setmaxnreg.inc` to
//!   [`CONSUMER_REGS`]), only for a block of 2 consumer warpgroups, whose total then
//!   fits the SM's register file.

use super::{Lowerer, R};
use crate::back::ptx::isa::{Operand, Reg, RegClass};
use crate::ir::{Block, InstId, Op, ValueId};
use crate::span::Span;

/// Which part of a warp-specialized kernel is being lowered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WsMode {
    /// No warp specialization (or not yet at the split).
    #[default]
    Off,
    /// The consumer warps' code (after the split).
    Consumer,
    /// The producer thread's code.
    Producer,
}

/// Extra threads of a warp-specialized block: one warpgroup.
pub const PRODUCER_THREADS: u32 = 128;

/// Registers per thread after `setmaxnreg`: the producer keeps a few (it holds loop
/// counters and addresses), the consumers take the rest. 2 consumer warpgroups × 128 ×
/// 232 + 128 × 40 = 64,512 of the SM's 65,536 (ThunderKittens' split; a multiple of 8
/// from 24 to 256, as `setmaxnreg` requires).
pub const PRODUCER_REGS: u32 = 40;
pub const CONSUMER_REGS: u32 = 232;

/// What the producer section needs from the split point.
#[derive(Clone, Debug)]
pub struct WsSplit {
    /// Index of the split in the top-level block.
    pub at: usize,
    pub label: u32,
    pub shared_bufs: std::collections::HashMap<u32, crate::back::ptx::smem::BufId>,
    pub rings: std::collections::HashMap<u32, super::tma::TmaRing>,
}

/// The shared buffers filled only outside every loop (a loop-invariant operand kept in
/// shared memory, `passes/resident.rs`): each is filled once and never refilled, so its
/// one slot needs no `empty` phase, however few slots it has; the consumers never release
/// it, and a `scratch_wait(0)` before its read leaves the wait to the read itself.
pub fn fetched_once(func: &crate::ir::Function) -> std::collections::HashSet<u32> {
    fn walk(
        func: &crate::ir::Function,
        block: &Block,
        in_loop: bool,
        outside: &mut std::collections::HashSet<u32>,
        inside: &mut std::collections::HashSet<u32>,
    ) {
        for &i in &block.insts {
            let op = &func.insts[i].op;
            if let Op::ScratchFetch { buf, .. } = op {
                if in_loop {
                    inside.insert(*buf);
                } else {
                    outside.insert(*buf);
                }
            }
            let looped = in_loop || matches!(op, Op::For { .. });
            for r in crate::ir::regions(op) {
                walk(func, r, looped, outside, inside);
            }
        }
    }
    let (mut outside, mut inside) = Default::default();
    walk(func, &func.body, false, &mut outside, &mut inside);
    outside.retain(|b| !inside.contains(b));
    outside
}

/// The `(dot, buffer)` pairs where the `dot` is the last in its loop body (its innermost
/// `for`, or the kernel's top level; `if` regions count as part of the body, in program
/// order) to read a staged tile of the buffer. Only that `dot` releases the slot: a slot
/// that two products of one iteration read (the attention backward's Q, dO and K) must
/// not be refilled after the first one.
pub fn last_readers(func: &crate::ir::Function) -> std::collections::HashSet<(InstId, u32)> {
    use std::collections::HashMap;
    let defs = crate::ir::chains::definitions(func);
    // The buffer a dot operand's staged tile comes from, through reshapes and transposes.
    let source = |mut v: ValueId| -> Option<u32> {
        loop {
            match &func.insts[*defs.get(&v)?].op {
                Op::ScratchLoad { buf, .. } => return Some(*buf),
                Op::Reshape(x) | Op::Permute(x, _) => v = *x,
                _ => return None,
            }
        }
    };
    fn walk(
        func: &crate::ir::Function,
        block: &Block,
        source: &dyn Fn(ValueId) -> Option<u32>,
        last: &mut HashMap<u32, InstId>,
        out: &mut std::collections::HashSet<(InstId, u32)>,
    ) {
        for &i in &block.insts {
            match &func.insts[i].op {
                Op::Dot { a, b, .. } => {
                    for buf in [source(*a), source(*b)].into_iter().flatten() {
                        last.insert(buf, i);
                    }
                }
                Op::For { body, .. } => {
                    let mut inner = HashMap::new();
                    walk(func, body, source, &mut inner, out);
                    out.extend(inner.into_iter().map(|(b, d)| (d, b)));
                }
                op => {
                    for r in crate::ir::regions(op) {
                        walk(func, r, source, last, out);
                    }
                }
            }
        }
    }
    let mut top = HashMap::new();
    let mut out = std::collections::HashSet::new();
    walk(func, &func.body, &source, &mut top, &mut out);
    out.extend(top.into_iter().map(|(b, d)| (d, b)));
    out
}

/// Whether every `scratch_load` of `buf` is a staged tile (read by products from shared
/// memory, never into registers).
pub fn read_only_staged(
    func: &crate::ir::Function,
    staged: &std::collections::HashSet<ValueId>,
    buf: u32,
) -> bool {
    crate::ir::program_order(func).into_iter().all(|i| {
        let inst = &func.insts[i];
        !matches!(inst.op, Op::ScratchLoad { buf: b, .. } if b == buf)
            || inst.results.iter().all(|r| staged.contains(r))
    })
}

/// Whether `block` (or a region inside it) fetches into a TMA ring of `bufs`.
fn fetches_in(func: &crate::ir::Function, block: &Block) -> bool {
    let mut any = false;
    crate::ir::visit_insts(func, vec![block], |op| {
        if matches!(op, Op::ScratchFetch { .. }) {
            any = true;
        }
    });
    any
}

/// Whether every instruction of `block` (nested blocks included) is a pure scalar
/// computation or a yield: what the producer may lower as the consumers do.
fn scalar_only(l: &Lowerer<'_>, block: &Block) -> bool {
    let func = l.func;
    block.insts.iter().all(|&i| {
        let inst = &func.insts[i];
        match &inst.op {
            Op::Yield(_) => true,
            Op::If {
                then_body,
                else_body,
                ..
            } => {
                inst.results.iter().all(|&r| l.shape(r).is_empty())
                    && scalar_only(l, then_body)
                    && scalar_only(l, else_body)
            }
            op => {
                crate::ir::props(op).is_pure()
                    && crate::ir::regions(op).is_empty()
                    && inst.results.iter().all(|&r| l.shape(r).is_empty())
            }
        }
    })
}

impl Lowerer<'_> {
    /// Whether to split here: instruction `k` of `b` allocates the first TMA ring, in
    /// the kernel's top-level block, with no shared memory used so far.
    pub(super) fn ws_split_here(&self, i: InstId) -> bool {
        if !self.ws_allowed || self.ws_split.is_some() || self.ws != WsMode::Off {
            return false;
        }
        if self.fetch_scopes.len() != 1 || self.smem.peak() != 0 {
            return false;
        }
        self.shared_life
            .alloc_before
            .get(&i)
            .is_some_and(|bufs| bufs.iter().any(|&b| self.is_tma_buf(b)))
    }

    /// Allocates every TMA ring whose life starts in `b` from index `k` on (so all exist
    /// before the split), then emits the split.
    pub(super) fn ws_split(&mut self, b: &Block, k: usize) {
        let later: Vec<InstId> = b.insts[k..].to_vec();
        let mut moved = Vec::new();
        for &j in &later {
            if let Some(bufs) = self.shared_life.alloc_before.get_mut(&j) {
                let (tma, rest): (Vec<u32>, Vec<u32>) =
                    bufs.iter().partition(|&&x| self.tma.map_of(x).is_some());
                *bufs = rest;
                moved.extend(tma);
            }
        }
        self.ws = WsMode::Consumer;
        self.ws_barrier = self.named.alloc(self.num_warps);
        for buf in moved {
            self.alloc_shared_buf(buf);
        }
        // Every thread (producer warps too) sees the mbarriers initialized; with
        // multicast rings, every thread of both blocks (the other block's copies and
        // releases land on them).
        self.emit_cta_barrier_all();
        if !self.tma.multicast.is_empty() {
            self.cluster_sync();
        }
        let tid = self.tid();
        let consumers = self.threads();
        let producer = self.op1(
            RegClass::Pred,
            "setp.ge.u32",
            vec![tid.into(), Operand::Imm(consumers as i64)],
        );
        let label = self.new_label();
        self.emit_if(Some((producer, false)), "bra", vec![Operand::Label(label)]);
        // The consumers take the registers the producer gives back.
        if self.threads() <= 256 {
            self.emit(
                "setmaxnreg.inc.sync.aligned.u32",
                vec![Operand::Imm(CONSUMER_REGS as i64)],
            );
        }
        self.ws_split = Some(WsSplit {
            at: k,
            label,
            shared_bufs: self.shared_bufs.clone(),
            rings: self.tma_rings.clone(),
        });
    }

    /// After the consumers' part of the top-level block: their `ret`, then the producer
    /// section (module docs).
    pub(super) fn ws_producer(&mut self, b: &Block) -> R<()> {
        let Some(split) = self.ws_split.clone() else {
            return Ok(());
        };
        if crate::ir::uses_clusters(self.func) {
            self.cluster_epilogue();
        }
        self.emit("ret", vec![]);
        self.place_label(split.label);
        if self.threads() <= 256 {
            self.emit(
                "setmaxnreg.dec.sync.aligned.u32",
                vec![Operand::Imm(PRODUCER_REGS as i64)],
            );
        }
        // One thread issues; the others of the warpgroup are done.
        let tid = self.tid();
        let leader = self.op1(
            RegClass::Pred,
            "setp.ne.u32",
            vec![tid.into(), Operand::Imm(self.threads() as i64)],
        );
        let exit = self.new_label();
        self.emit_if(Some((leader, false)), "bra", vec![Operand::Label(exit)]);
        self.ws = WsMode::Producer;
        self.shared_bufs = split.shared_bufs;
        self.tma_rings = split.rings;
        // Values the consumers bound after the split are recomputed on this path.
        let mut defined = Vec::new();
        collect_defs(self.func, &b.insts[split.at..], &mut defined);
        for v in defined {
            self.vals.remove(&v);
            self.deferred.remove(&v);
        }
        self.conv_cache = vec![Default::default()];
        let r = self.producer_insts(&b.insts[split.at..]);
        self.place_label(exit);
        self.ws = WsMode::Off;
        r.map(|_| ())
    }

    /// Lowers `insts` in producer mode; returns a `Yield`'s values.
    fn producer_insts(&mut self, insts: &[InstId]) -> R<Option<Vec<ValueId>>> {
        let func = self.func;
        for &i in insts {
            let inst = &func.insts[i];
            match &inst.op {
                Op::Yield(vs) => return Ok(Some(vs.clone())),
                Op::ScratchFetch { buf, .. } if self.is_tma_buf(*buf) => {
                    self.lower_tma_fetch(i)?;
                }
                Op::For { body, .. } if fetches_in(func, body) => self.producer_for(i)?,
                // A runtime `if` that only computes scalars (a tile index corrected in a
                // branch): lowered as the consumers lower it.
                Op::If {
                    cond,
                    then_body,
                    else_body,
                } if inst.results.iter().all(|&r| self.shape(r).is_empty())
                    && self.is_computed(*cond)
                    && scalar_only(self, then_body)
                    && scalar_only(self, else_body) =>
                {
                    self.inst(i)?;
                }
                op if crate::ir::props(op).is_pure()
                    && inst.results.iter().all(|&r| self.shape(r).is_empty())
                    && crate::ir::operands(op).iter().all(|&v| self.is_computed(v)) =>
                {
                    self.inst(i)?;
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// A `for` loop in producer mode: its scalar carried values only.
    fn producer_for(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::For {
            lower,
            upper,
            step,
            inits,
            body,
        } = &inst.op
        else {
            return Ok(());
        };
        let (lo, up, st) = (
            self.scalar(*lower, span)?,
            self.scalar(*upper, span)?,
            self.scalar(*step, span)?,
        );
        let iv = self.copy(lo);
        let Some(&iv_arg) = body.args.first() else {
            return Err(super::unsupported(
                span,
                "for loop without an induction variable",
            ));
        };
        self.bind(iv_arg, vec![iv]);
        // (index among the carried values, register)
        let mut carried: Vec<(usize, Reg)> = Vec::new();
        for (k, &init) in inits.iter().enumerate() {
            let Some(&arg) = body.args.get(k + 1) else {
                return Err(super::unsupported(span, "loop arity"));
            };
            if !self.shape(arg).is_empty() || !self.is_computed(init) {
                continue;
            }
            let r = self.scalar(init, span)?;
            let fresh = self.copy(r);
            self.bind(arg, vec![fresh]);
            carried.push((k, fresh));
        }
        let head = self.new_label();
        let end = self.new_label();
        self.place_label(head);
        let p = self.op1(RegClass::Pred, "setp.ge.s32", vec![iv.into(), up.into()]);
        self.emit_if(Some((p, false)), "bra.uni", vec![Operand::Label(end)]);
        let yields = self.producer_insts(&body.insts)?.unwrap_or_default();
        // Parallel move: read every yielded value before writing any carried register.
        let mut temps = Vec::new();
        for &(k, _) in &carried {
            let y = *yields
                .get(k)
                .ok_or_else(|| super::unsupported(span, "loop yield arity"))?;
            let r = self.scalar(y, span)?;
            temps.push(self.copy(r));
        }
        for (&(_, dst), t) in carried.iter().zip(temps) {
            self.mov(dst, t.into());
        }
        self.emit("add.s32", vec![iv.into(), iv.into(), st.into()]);
        self.emit("bra.uni", vec![Operand::Label(head)]);
        self.place_label(end);
        Ok(())
    }

    /// `bar.sync 0` for every thread of the block, producer warps included.
    fn emit_cta_barrier_all(&mut self) {
        self.emit("bar.sync", vec![Operand::Imm(0)]);
        self.sync.barrier();
    }

    /// Consumer side of wgmma dot `dot` that read TMA rings `bufs`: release the slots whose
    /// reads are complete, where `dot` is their last reader ([`last_readers`]; module
    /// docs). `lagged`: the dot left one group in flight.
    pub(super) fn ws_release(
        &mut self,
        dot: InstId,
        bufs: &[u32],
        lagged: bool,
        span: Span,
    ) -> R<()> {
        if self.ws != WsMode::Consumer {
            return Ok(());
        }
        for &buf in bufs {
            if self.ws_once.contains(&buf) {
                continue; // never refilled: nothing waits for its release
            }
            if !self.ws_last_readers.contains(&(dot, buf)) {
                continue; // a later product of the iteration reads the slot too
            }
            let Some(ring) = self.tma_rings.get(&buf).copied() else {
                continue;
            };
            let cur = *self
                .tma_last_slot
                .get(&buf)
                .ok_or_else(|| super::unsupported(span, "a release before a read"))?;
            if lagged {
                self.ws_release_prev(&ring);
                self.mov(ring.prev, cur.into());
            } else {
                let mbar = self.empty_mbar(&ring, cur);
                self.ws_arrive(mbar, None, ring.multicast.is_some());
            }
        }
        Ok(())
    }

    /// Releases the slot a lagged dot left unreleased (`prev`), if any, and forgets it.
    pub(super) fn ws_release_prev(&mut self, ring: &super::tma::TmaRing) {
        let valid = self.op1(
            RegClass::Pred,
            "setp.ge.s32",
            vec![ring.prev.into(), Operand::Imm(0)],
        );
        let mbar = self.empty_mbar(ring, ring.prev);
        self.ws_arrive(mbar, Some(valid), ring.multicast.is_some());
        self.mov(ring.prev, Operand::Imm(-1));
    }

    /// Lane 0 of each consumer warp (where `when` holds) arrives on the `empty` mbarrier
    /// at `mbar`, and with `both` (a multicast ring) on the other block's too: its
    /// producer's next fill writes this block's slot.
    pub(super) fn ws_arrive(&mut self, mbar: Reg, when: Option<Reg>, both: bool) {
        let lane0 = self.lane0();
        let guard = match when {
            Some(w) => self.op1(RegClass::Pred, "and.pred", vec![w.into(), lane0.into()]),
            None => lane0,
        };
        self.emit_if(
            Some((guard, false)),
            "mbarrier.arrive.shared::cta.b64",
            vec![
                Operand::Sym("_".into()),
                Operand::Mem(crate::back::ptx::isa::Addr::Reg(mbar), 0),
            ],
        );
        if both {
            let (rank, _) = self.multicast_regs();
            let peer = self.op1(RegClass::B32, "xor.b32", vec![rank.into(), Operand::Imm(1)]);
            let remote = self.op1(
                RegClass::B32,
                "mapa.shared::cluster.u32",
                vec![mbar.into(), peer.into()],
            );
            self.emit_if(
                Some((guard, false)),
                "mbarrier.arrive.shared::cluster.b64",
                vec![
                    Operand::Sym("_".into()),
                    Operand::Mem(crate::back::ptx::isa::Addr::Reg(remote), 0),
                ],
            );
        }
    }

    /// Lane 0 of each warp (`(%tid.x & 31) == 0`), made once in the prologue.
    fn lane0(&mut self) -> Reg {
        if let Some(p) = self.ws_lane0 {
            return p;
        }
        let tid = self.tid();
        let p = self.in_prologue(|l| {
            let lane = l.op1(RegClass::B32, "and.b32", vec![tid.into(), Operand::Imm(31)]);
            l.op1(
                RegClass::Pred,
                "setp.eq.u32",
                vec![lane.into(), Operand::Imm(0)],
            )
        });
        self.ws_lane0 = Some(p);
        p
    }
}

/// Every value defined by `insts` and the regions inside them (results and block
/// arguments).
fn collect_defs(func: &crate::ir::Function, insts: &[InstId], out: &mut Vec<ValueId>) {
    for &i in insts {
        let inst = &func.insts[i];
        out.extend(inst.results.iter().copied());
        for r in crate::ir::regions(&inst.op) {
            out.extend(r.args.iter().copied());
            collect_defs(func, &r.insts, out);
        }
    }
}
