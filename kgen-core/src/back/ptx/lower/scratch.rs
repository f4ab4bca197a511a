//! Lowering of block-local scratch buffers (`scratch`, `scratch_store`, `scratch_load`).
//!
//! Assumes: the function's scratch buffers are fixed before lowering (`Function::scratch`)
//! and every access names a slot with an `i32` scalar (validated).
//!
//! Guarantees: the buffers are shared-memory allocator buffers (`smem.rs`) alive for the
//! whole kernel, allocated first, so they sit at the start of `kg_smem`, one after
//! another (16-byte aligned); the layout conversions' temporaries are allocated while
//! they are alive, so neither overwrites the other. A
//! slot holds the tile in its *anchor layout*, thread-private: thread `t` keeps its
//! registers, packed into 16-byte chunks, at `slot * slot_bytes + (c * threads + t) *
//! chunk_bytes` for chunk `c`. A store converts the value to the anchor layout first; a
//! load returns the anchor layout. So every thread reads back exactly the bytes it
//! wrote: no barrier is needed, and consecutive threads touch consecutive 16-byte
//! chunks (no bank conflicts). A slot outside `0..slots` (`setp.lt.u32`, which also
//! rejects negative slots) traps (`@!p trap`: the launch fails with an error instead of a
//! silently wrong result) for a store or a load, and for a fetch that has any element to
//! copy; a fetch with nothing to copy (every vector out of bounds or masked off) into
//! such a slot copies nothing, as the interpreter does. In-range accesses are not
//! predicated on the slot (a store or load costs one `@!p trap` more than an unchecked
//! one, a fetch one `setp` and one `@p trap`, plus an `or.pred` per further vector).

use super::memory::{Group, Plan};
use super::pointwise_vec::PointwiseAccess;
use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::layout::Linear;
use crate::ir::{Block, Function, InstId, Op, ScratchBuf};
use crate::span::Span;
use crate::types::DType;

/// A `scratch_fetch` that could not use `cp.async` (a 2-byte aligned 16-bit tensor):
/// its loads are issued at the fetch, its stores into the slot are emitted only where
/// the fetch must be complete, so the loads stay in flight across the code in between
/// (as a register prefetch would): at a `scratch_wait` that completes it (one with
/// fewer than its count of later fetches of the same block), before a nested region
/// that waits, and at the end of its block. A valid program never touches the slot
/// before then (the interpreter rejects a load or store of a slot whose fetch is in
/// flight).
pub(super) struct PendingFetch {
    /// The block's fetch count with this one.
    seq: u64,
    load: super::memory::DeferredLoad,
    dt: DType,
    addr: Reg,
    in_range: Reg,
    placement: ScratchPlacement,
}

/// The fetches of one block being lowered.
#[derive(Default)]
pub(super) struct FetchScope {
    /// Fetches issued so far in this block (a nested region that fetches counts as
    /// many: its count is not known).
    pub count: u64,
    pub pending: Vec<PendingFetch>,
}

/// Whether the regions of instruction `i` (a `For` or `If`; none for other ops)
/// contain a `scratch_wait` and a `scratch_fetch`.
pub(super) fn region_scratch_ops(func: &Function, i: InstId) -> (bool, bool) {
    let roots: Vec<&Block> = match &func.insts[i].op {
        Op::For { body, .. } => vec![body],
        Op::If {
            then_body,
            else_body,
            ..
        } => vec![then_body, else_body],
        _ => return (false, false),
    };
    let (mut waits, mut fetches) = (false, false);
    crate::ir::visit_insts(func, roots, |op| match op {
        Op::ScratchWait { .. } => waits = true,
        Op::ScratchFetch { .. } | Op::ScratchGather { .. } => fetches = true,
        _ => {}
    });
    (waits, fetches)
}

/// Where one scratch buffer lives and how its slots are laid out.
#[derive(Clone, Debug)]
pub struct ScratchPlacement {
    /// Byte offset of the buffer in `kg_smem`.
    pub offset: u32,
    /// Bytes per slot (every thread's registers of one tile).
    pub slot_bytes: u32,
    /// The slot tile's anchor layout.
    pub layout: Linear,
    /// Elements per 16-byte (or smaller) chunk.
    pub chunk: usize,
}

/// A fetch's slot: the buffer's dtype and slot shape, the slot (register) and the
/// buffer's slot count, this thread's address of chunk 0 of the slot, the predicate
/// "slot in range" and the buffer's placement.
struct FetchSlot {
    dt: DType,
    shape: Vec<u32>,
    slot: Reg,
    slots: u32,
    addr: Reg,
    in_range: Reg,
    placement: ScratchPlacement,
}

/// Places `bufs` in shared memory through the allocator, each alive for the whole kernel
/// (the language's rule), allocated first so they sit one after another from offset 0;
/// returns the placements and the total bytes (a multiple of 16).
pub fn place(
    bufs: &[ScratchBuf],
    anchor: impl Fn(&[u32]) -> Linear,
    threads: u32,
    smem: &mut crate::back::ptx::smem::Allocator,
) -> (Vec<ScratchPlacement>, u32) {
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        if b.shared {
            // Placed with a lifetime of its own by `staged.rs`.
            out.push(ScratchPlacement {
                offset: 0,
                slot_bytes: 0,
                layout: anchor(&[1]),
                chunk: 1,
            });
            continue;
        }
        let layout = anchor(&b.slot_shape);
        let es = b.dtype.size_bytes();
        let regs = layout.num_regs();
        let chunk = (16 / es.max(1) as usize).clamp(1, regs.max(1));
        let slot_bytes = (regs as u32) * threads * es;
        let bytes = slot_bytes.saturating_mul(b.slots).div_ceil(16) * 16;
        let id = smem.alloc(b.name.clone(), bytes, 16);
        out.push(ScratchPlacement {
            offset: smem.offset(id),
            slot_bytes,
            layout,
            chunk,
        });
    }
    (out, smem.peak())
}

impl Lowerer<'_> {
    /// This thread's address of chunk 0 of `slot`, less the buffer's offset in `kg_smem`
    /// (each access adds it, with the chunk's stride, as an immediate), and the
    /// predicate "slot in range".
    fn scratch_address(
        &mut self,
        buf: u32,
        slot: Reg,
        span: Span,
    ) -> R<(Reg, Reg, ScratchPlacement)> {
        let (placement, slots) = match (
            self.scratch.get(buf as usize).cloned(),
            self.func.scratch.get(buf as usize),
        ) {
            (Some(p), Some(b)) => (p, b.slots),
            _ => return Err(unsupported(span, "no such scratch buffer")),
        };
        let es = self.func.scratch[buf as usize].dtype.size_bytes();
        let chunk_bytes = placement.chunk as u32 * es;
        let base = self.scratch_base();
        let tid = self.tid();
        // Thread part: kg_smem + t * chunk_bytes (loop-invariant; one `mad` per access).
        let t_off = self.op1(
            RegClass::B32,
            "mad.lo.u32",
            vec![tid.into(), Operand::Imm(chunk_bytes as i64), base.into()],
        );
        let slot_addr = self.op1(
            RegClass::B32,
            "mad.lo.u32",
            vec![
                slot.into(),
                Operand::Imm(placement.slot_bytes as i64),
                t_off.into(),
            ],
        );
        let in_range = self.op1(
            RegClass::Pred,
            "setp.lt.u32",
            vec![slot.into(), Operand::Imm(slots as i64)],
        );
        Ok((slot_addr, in_range, placement))
    }

    /// `scratch_store(buf, slot, value)`.
    pub fn lower_scratch_store(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::ScratchStore { buf, slot, value } = inst.op else {
            return Ok(());
        };
        let dt = self.dtype(value);
        if dt == DType::Bool {
            return Err(unsupported(span, "scratch buffers of bool"));
        }
        let slot_reg = self.scalar(slot, span)?;
        let (addr, in_range, p) = self.scratch_address(buf, slot_reg, span)?;
        let regs = self.operand_in(value, &p.layout, span)?;
        self.emit_if(Some((in_range, true)), "trap", vec![]);
        self.store_slot(dt, &regs, addr, None, &p);
        Ok(())
    }

    /// Stores element registers `regs` (the slot's anchor layout) into the slot at
    /// `addr` (where `in_range`, when given).
    fn store_slot(
        &mut self,
        dt: DType,
        regs: &[Reg],
        addr: Reg,
        in_range: Option<Reg>,
        p: &ScratchPlacement,
    ) {
        let stride = self.threads() * (p.chunk as u32) * dt.size_bytes();
        for (c, elems) in regs.chunks(p.chunk).enumerate() {
            let (words, ty) = self.pack(dt, elems);
            let v = vector_suffix(words.len());
            let src = if words.len() == 1 {
                Operand::Reg(words[0])
            } else {
                Operand::Vec(words)
            };
            self.emit_if(
                in_range.map(|r| (r, false)),
                format!("st.shared{v}.{ty}"),
                vec![
                    Operand::Mem(Addr::Reg(addr), p.offset as i64 + c as i64 * stride as i64),
                    src,
                ],
            );
        }
    }

    /// What every fetch needs first: `cp.async` on the target, the buffer's dtype (not
    /// `bool`) and slot shape, and this thread's address of `slot` with its range check
    /// (`FetchSlot`).
    fn fetch_slot(
        &mut self,
        what: &str,
        buf: u32,
        slot: crate::ir::ValueId,
        span: Span,
    ) -> R<FetchSlot> {
        if !self.target.caps.cp_async {
            return Err(unsupported(
                span,
                format!("{what} needs cp.async (sm_80 or newer)"),
            ));
        }
        let b = self
            .func
            .scratch
            .get(buf as usize)
            .ok_or_else(|| unsupported(span, "no such scratch buffer"))?;
        let (dt, shape, slots) = (b.dtype, b.slot_shape.clone(), b.slots);
        if dt == DType::Bool || shape.is_empty() {
            return Err(unsupported(span, "scratch buffers of bool"));
        }
        let slot_reg = self.scalar(slot, span)?;
        let (addr, in_range, p) = self.scratch_address(buf, slot_reg, span)?;
        Ok(FetchSlot {
            dt,
            shape,
            slot: slot_reg,
            slots,
            addr,
            in_range,
            placement: p,
        })
    }

    /// Traps where a fetch would copy data into a slot out of range: the slot `f.slot`
    /// is outside `0..f.slots` and one of the fetch's vectors (`preds`: each vector's
    /// in-bounds-and-masked-in predicate, `None` for one that always copies) has data.
    /// A fetch into such a slot with nothing to copy passes (it copies nothing).
    fn trap_if_fetch_out_of_range(&mut self, f: &FetchSlot, preds: &[Option<Reg>]) {
        if preds.iter().any(Option::is_none) {
            self.emit_if(Some((f.in_range, true)), "trap", vec![]);
            return;
        }
        let mut any: Option<Reg> = None;
        for &p in preds.iter().flatten() {
            any = Some(match any {
                None => p,
                Some(a) => self.op1(RegClass::Pred, "or.pred", vec![a.into(), p.into()]),
            });
        }
        if let Some(any) = any {
            let t = self.op1(
                RegClass::Pred,
                "setp.ge.and.u32",
                vec![f.slot.into(), Operand::Imm(f.slots as i64), any.into()],
            );
            self.emit_if(Some((t, false)), "trap", vec![]);
        }
    }

    /// `scratch_fetch(buf, slot, tensor, index, pad)`: one `cp.async` per vector of the
    /// tile (`.cg` for 16 bytes, `.ca` for 4 or 8), straight into the thread's own
    /// chunks of the slot, so no register holds the data and nothing waits here; a
    /// masked-off vector (out of bounds) gets the padding by a `st.shared` under the
    /// complementary predicate, as do registers no vector covers (padded slots of a
    /// non-power-of-two tile). Vectors narrower than 4 bytes (2-byte aligned 16-bit
    /// rows) cannot be copied asynchronously: the tile is then loaded and stored now.
    /// Either way the fetch ends with `cp.async.commit_group` (one group per fetch,
    /// which `scratch_wait` counts).
    pub fn lower_scratch_fetch(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::ScratchFetch {
            buf,
            slot,
            tensor,
            ref index,
            padding,
            eviction,
        } = inst.op
        else {
            return Ok(());
        };
        let f = self.fetch_slot("scratch_fetch", buf, slot, span)?;
        let (t, tp) = self.tensor(tensor, span)?;
        let plan = self.tile_access(&t, &tp, &f.placement.layout, &f.shape, index, false, span)?;
        let preds: Vec<Option<Reg>> = plan.groups.iter().map(|g| g.pred).collect();
        self.trap_if_fetch_out_of_range(&f, &preds);
        let FetchSlot {
            dt,
            addr,
            in_range,
            placement: p,
            ..
        } = f;
        if !copies_by_cp_async(&plan, &p, dt) {
            // No cp.async: the loads are issued now, the stores into the slot wait until
            // the fetch must be complete (see `PendingFetch`).
            let load = self.issue_plan_load(&plan, dt, &p.layout, padding, eviction);
            self.defer_fetch_stores(load, dt, addr, in_range, p);
            self.emit("cp.async.commit_group", vec![]);
            return Ok(());
        }
        let policy = self.cache_policy(eviction);
        let pad_bits = super::memory::scalar_bits(padding, dt);
        self.emit_fetch_copies(&plan, addr, in_range, &p, dt, policy, pad_bits);
        self.count_fetch();
        self.emit("cp.async.commit_group", vec![]);
        Ok(())
    }

    /// The `cp.async` copies of a fetch whose `plan` passed `copies_by_cp_async`: one
    /// per vector (`.cg` for 16 bytes, `.ca` for 4 or 8) into the thread's own chunks of
    /// the slot at `addr` (where `in_range`); a masked-off vector gets the padding by a
    /// `st.shared` under the complementary predicate, as do registers no vector covers.
    #[allow(clippy::too_many_arguments)]
    fn emit_fetch_copies(
        &mut self,
        plan: &Plan,
        addr: Reg,
        in_range: Reg,
        p: &ScratchPlacement,
        dt: DType,
        policy: Option<Reg>,
        pad_bits: u64,
    ) {
        let es = dt.size_bytes();
        let bytes = plan.vec * es;
        let stride = (self.threads() * (p.chunk as u32) * es) as i64;
        let reg_offset = |r: usize| {
            p.offset as i64 + (r / p.chunk) as i64 * stride + (r % p.chunk) as i64 * es as i64
        };
        let level = if bytes == 16 { "cg" } else { "ca" };
        let mut pad_words: Option<(Vec<Reg>, &'static str)> = None;
        let mut covered = vec![false; p.layout.num_regs()];
        for g in &plan.groups {
            for &r in &g.regs {
                if let Some(c) = covered.get_mut(r) {
                    *c = true;
                }
            }
            let dst = Operand::Mem(Addr::Reg(addr), reg_offset(g.regs[0]));
            let mut operands = vec![
                dst.clone(),
                Operand::Mem(Addr::Reg(g.addr), g.imm),
                Operand::Imm(bytes as i64),
            ];
            let hint = super::memory::cache_hint(policy, &mut operands);
            let copy = match g.pred {
                Some(gp) => self.op1(RegClass::Pred, "and.pred", vec![in_range.into(), gp.into()]),
                None => in_range,
            };
            self.emit_if(
                Some((copy, false)),
                format!("cp.async.{level}.shared.global{hint}"),
                operands,
            );
            if let Some(gp) = g.pred {
                let off = self.op1(RegClass::Pred, "not.pred", vec![gp.into()]);
                let pad = self.op1(
                    RegClass::Pred,
                    "and.pred",
                    vec![in_range.into(), off.into()],
                );
                let (words, ty) = match &pad_words {
                    Some(w) => w.clone(),
                    None => {
                        let w = self.pad_words(dt, bytes, pad_bits);
                        pad_words = Some(w.clone());
                        w
                    }
                };
                let src = if words.len() == 1 {
                    Operand::Reg(words[0])
                } else {
                    Operand::Vec(words.clone())
                };
                self.emit_if(
                    Some((pad, false)),
                    format!("st.shared{}.{ty}", vector_suffix(words.len())),
                    vec![dst, src],
                );
            }
        }
        // Registers no vector covers: the padding, one element at a time.
        let uncovered: Vec<usize> = (0..covered.len()).filter(|&r| !covered[r]).collect();
        if !uncovered.is_empty() {
            let (class, ty) = match es {
                8 => (RegClass::B64, "b64"),
                4 => (RegClass::B32, "b32"),
                _ => (RegClass::B16, "b16"),
            };
            let w = self.reg(class);
            self.mov(w, Operand::Imm(pad_bits as i64));
            for r in uncovered {
                self.emit_if(
                    Some((in_range, false)),
                    format!("st.shared.{ty}"),
                    vec![
                        Operand::Mem(Addr::Reg(addr), reg_offset(r)),
                        Operand::Reg(w),
                    ],
                );
            }
        }
    }

    /// `scratch_gather(buf, slot, tensor, offsets, mask, other)`: a fetch whose elements
    /// come from coordinates. Where the axis facts prove the coordinates contiguous and
    /// aligned over the thread's chunks (and the mask constant over them), each chunk is
    /// one `cp.async` as for `scratch_fetch`; otherwise the gather's loads are issued
    /// now and stored into the slot where the fetch must be complete (`PendingFetch`).
    /// One commit group per gather either way.
    pub fn lower_scratch_gather(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::ScratchGather {
            buf,
            slot,
            tensor,
            ref offsets,
            mask,
            other,
            eviction,
        } = inst.op
        else {
            return Ok(());
        };
        let f = self.fetch_slot("scratch_gather", buf, slot, span)?;
        let (t, tp) = self.tensor(tensor, span)?;
        let (dt, shape) = (f.dt, f.shape.clone());
        let lin = f.placement.layout.clone();
        let mut offs = Vec::with_capacity(offsets.len());
        for &o in offsets {
            offs.push((self.operand_in(o, &lin, span)?, self.dtype(o)));
        }
        let mask_regs = match mask {
            Some(m) => Some(self.operand_in(m, &lin, span)?),
            None => None,
        };
        let (mut vec, mask_uniform) =
            self.run_width(&tp, offsets, mask, &shape, &lin, f.placement.chunk as u64);
        if !mask_uniform {
            vec = 1;
        }
        let policy = self.cache_policy(eviction);
        let access = PointwiseAccess {
            id,
            tensor: t,
            dtype: dt,
            lin,
            shape,
            offsets: offs,
            mask: mask_regs,
            mask_uniform: true,
            values: None,
            other: Some(other),
            policy,
            vec,
            reduce: false,
        };
        let runs = self.offset_runs(&access, true, span)?;
        let preds: Vec<Option<Reg>> = runs.iter().map(|r| r.pred).collect();
        self.trap_if_fetch_out_of_range(&f, &preds);
        let FetchSlot {
            addr,
            in_range,
            placement: p,
            ..
        } = f;
        let plan = Plan {
            vec,
            groups: runs
                .iter()
                .map(|r| Group {
                    regs: r.members.clone(),
                    addr: r.addr,
                    imm: 0,
                    pred: r.pred,
                })
                .collect(),
        };
        if copies_by_cp_async(&plan, &p, dt) {
            let pad_bits = super::memory::scalar_bits(other, dt);
            self.emit_fetch_copies(&plan, addr, in_range, &p, dt, policy, pad_bits);
            self.count_fetch();
        } else {
            let load = self.issue_run_loads(&access, &runs);
            self.defer_fetch_stores(load, dt, addr, in_range, p);
        }
        self.emit("cp.async.commit_group", vec![]);
        Ok(())
    }

    /// `scratch_wait(pending)`: `cp.async.wait_group pending`. A thread waits for its
    /// own copies, which are then visible to it; each thread reads only its own chunks,
    /// so no barrier follows.
    pub fn lower_scratch_wait(&mut self, id: InstId) -> R<()> {
        let inst = &self.func.insts[id];
        let Op::ScratchWait { pending } = inst.op else {
            return Ok(());
        };
        let span = inst.span;
        if self.rotation.as_ref().is_some_and(|r| r.plan.wait == id) {
            // A rotated loop's head: the wait came before the loop or in the previous
            // iteration's `dot` (`mma_rotate.rs`).
            return Ok(());
        }
        if !self.tma.is_empty() {
            // Every fetch is a TMA copy (`lower/tma.rs`): reads wait per slot; the drain
            // waits for the copies nobody read.
            if pending == 0 {
                self.tma_drain();
            }
            return Ok(());
        }
        if !self.target.caps.cp_async {
            return Err(unsupported(
                span,
                "scratch_wait needs cp.async (sm_80 or newer)",
            ));
        }
        // Pending fallback fetches with at least `pending` fetches after them.
        let count = self.fetch_scopes.last().map_or(0, |s| s.count);
        self.flush_fetches(span, |f| count.saturating_sub(f.seq) >= pending as u64)?;
        self.emit("cp.async.wait_group", vec![Operand::Imm(pending as i64)]);
        if self.has_wgmma_dot() {
            // The copies (and element-wise stores) wrote through the generic proxy;
            // wgmma reads through the async proxy (lower/wgmma.rs).
            self.emit("fence.proxy.async.shared::cta", vec![]);
        }
        // The staged buffers' copies are complete for this thread; others see them after
        // the next block barrier (the tracker places it before the first read).
        self.sync.async_done();
        Ok(())
    }

    /// A fetch whose loads are issued (`load`) but not copied by `cp.async`: counts it
    /// and queues its slot stores until the fetch must be complete (`PendingFetch`).
    fn defer_fetch_stores(
        &mut self,
        load: super::memory::DeferredLoad,
        dt: DType,
        addr: Reg,
        in_range: Reg,
        placement: ScratchPlacement,
    ) {
        let seq = self.count_fetch();
        if let Some(scope) = self.fetch_scopes.last_mut() {
            scope.pending.push(PendingFetch {
                seq,
                load,
                dt,
                addr,
                in_range,
                placement,
            });
        }
    }

    /// Counts one fetch in the current block; returns the count.
    pub(super) fn count_fetch(&mut self) -> u64 {
        match self.fetch_scopes.last_mut() {
            Some(s) => {
                s.count = s.count.saturating_add(1);
                s.count
            }
            None => 0,
        }
    }

    /// Completes the current block's pending fallback fetches that `must` selects: their
    /// loaded words (waiting for the loads here) go into their slots.
    pub(super) fn flush_fetches(
        &mut self,
        span: Span,
        must: impl Fn(&PendingFetch) -> bool,
    ) -> R<()> {
        let Some(scope) = self.fetch_scopes.last_mut() else {
            return Ok(());
        };
        let (now, keep): (Vec<PendingFetch>, Vec<PendingFetch>) =
            std::mem::take(&mut scope.pending)
                .into_iter()
                .partition(|f| must(f));
        scope.pending = keep;
        for f in now {
            let regs = self.materialize(f.load, span)?;
            self.store_slot(f.dt, &regs, f.addr, Some(f.in_range), &f.placement);
        }
        Ok(())
    }

    /// Registers holding `bytes` bytes of the padding pattern `pad_bits` (an element of
    /// `dt`, repeated), as the words of one `st.shared` and their type.
    fn pad_words(&mut self, dt: DType, bytes: u32, pad_bits: u64) -> (Vec<Reg>, &'static str) {
        let es = dt.size_bytes();
        if es == 8 {
            let w = self.reg(RegClass::B64);
            self.mov(w, Operand::Imm(pad_bits as i64));
            return (vec![w; (bytes / 8) as usize], "b64");
        }
        let mut word: u64 = 0;
        for j in 0..(4 / es) {
            word |= pad_bits << (j * es * 8);
        }
        let w = self.reg(RegClass::B32);
        self.mov(w, Operand::Imm(word as u32 as i32 as i64));
        (vec![w; (bytes / 4) as usize], "b32")
    }

    /// `scratch_load(buf, slot)`.
    pub fn lower_scratch_load(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::ScratchLoad { buf, slot } = inst.op else {
            return Ok(());
        };
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "scratch_load without a result"))?;
        let dt = self.dtype(res);
        if dt == DType::Bool {
            return Err(unsupported(span, "scratch buffers of bool"));
        }
        if self.scratch.get(buf as usize).map(|p| &p.layout) != Some(&self.lin(res)) {
            return Err(unsupported(
                span,
                "scratch_load result not in the slot's anchor layout",
            ));
        }
        let slot_reg = self.scalar(slot, span)?;
        let (addr, in_range, p) = self.scratch_address(buf, slot_reg, span)?;
        self.emit_if(Some((in_range, true)), "trap", vec![]);
        let es = dt.size_bytes();
        let regs = p.layout.num_regs();
        let stride = self.threads() * (p.chunk as u32) * es;
        let mut out = Vec::with_capacity(regs);
        for c in 0..regs.div_ceil(p.chunk) {
            let n = p.chunk.min(regs - c * p.chunk);
            let (class, nwords, ty) = match es {
                8 => (RegClass::B64, n, "b64"),
                4 => (super::class_of(dt), n, "b32"),
                _ if n == 1 => (RegClass::B16, 1, "b16"),
                _ => (RegClass::B32, n / 2, "b32"),
            };
            let words: Vec<Reg> = (0..nwords).map(|_| self.reg(class)).collect();
            let dst = if nwords == 1 {
                Operand::Reg(words[0])
            } else {
                Operand::Vec(words.clone())
            };
            self.emit(
                format!("ld.shared{}.{ty}", vector_suffix(nwords)),
                vec![
                    dst,
                    Operand::Mem(Addr::Reg(addr), p.offset as i64 + c as i64 * stride as i64),
                ],
            );
            out.extend(self.unpack(dt, n as u32, &words));
        }
        self.bind(res, out);
        Ok(())
    }

    /// The start of the scratch buffers: `kg_smem` itself (computed once, in the
    /// prologue).
    pub(super) fn scratch_base(&mut self) -> Reg {
        self.prologue_symbol(|l| &mut l.scratch_base, super::SMEM)
    }
}

/// Whether `cp.async` can copy the vectors of `plan` into a slot of placement `p`: 4, 8
/// or 16 bytes each, each the whole registers of one chunk, in order.
fn copies_by_cp_async(plan: &Plan, p: &ScratchPlacement, dt: DType) -> bool {
    let bytes = plan.vec * dt.size_bytes();
    let vec = plan.vec as usize;
    let in_chunks = plan.groups.iter().all(|g| {
        g.regs.first().is_some_and(|&r0| {
            r0 % vec == 0 && g.regs.iter().enumerate().all(|(j, &r)| r == r0 + j)
        })
    });
    matches!(bytes, 4 | 8 | 16) && in_chunks && vec <= p.chunk
}

/// `.v2` / `.v4` for a vector of that many words, else nothing.
fn vector_suffix(words: usize) -> &'static str {
    match words {
        2 => ".v2",
        4 => ".v4",
        _ => "",
    }
}
