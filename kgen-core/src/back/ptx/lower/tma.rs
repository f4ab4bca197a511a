//! Tile fetches by the Hopper copy engine: `cp.async.bulk.tensor.2d` into the pipeline's
//! shared ring, completing on one mbarrier per slot.
//!
//! Assumes: `back::ptx::tma::plan` chose TMA for every fetch of the kernel (so no
//! `cp.async` group is ever counted by a wait) and listed the tensor maps in the ABI;
//! each slot of a ring is fetched into at most once before the slot is read (the
//! pipeline's contract, checked by the interpreter), and a slot is read by
//! `scratch_load`s in the order of its fetches.
//! Guarantees:
//! - When a ring is allocated, its mbarriers are allocated with it (8 bytes per slot) and
//!   initialized by thread 0 with an arrival count of 1 (`fence.mbarrier_init` makes them
//!   visible to the copy engine); the tracker orders every other thread's first use
//!   after that. When the ring is freed, thread 0 invalidates them after a barrier that
//!   follows every wait; a warp-specialized multicast ring's consumers first wait for
//!   each slot's last `empty` phase, which the other block's final releases complete
//!   (nothing else waits for them, and they must not land in freed bytes).
//! - A fetch: after the barrier the tracker asks for (no thread still reads the slot:
//!   write after read), thread 0 arms the slot's mbarrier with the tile's bytes
//!   (`mbarrier.arrive.expect_tx`) and issues one box copy per swizzle atom; the engine
//!   writes `SharedTile::offset`'s layout and zero-fills what lies outside the tensor
//!   (negative tile indices too: the pipeline's fetches past the loop's end read
//!   nothing). Every thread flips the slot's bit in the ring's `fetched` register.
//! - A multicast ring (`tma::plan`, clusters of two) has an `empty` mbarrier per slot
//!   after the `full` ones (two arrivals: thread 0 of each block). The initialization is
//!   followed by a cluster barrier (the other block's copies and arrivals land on these
//!   mbarriers). Before refilling a slot (a fill writes both blocks' slots, so neither
//!   may still read it), thread 0 arrives on its own and the other block's `empty`
//!   mbarrier and waits for the phase to complete (`multicast_release`), after the
//!   block barrier that ends this block's reads. Each block's thread 0 arms its own mbarrier
//!   with the whole tile's bytes but copies only the atoms of its rank's parity, with
//!   `.multicast::cluster` to both blocks: each slot's phase completes when both halves
//!   have landed.
//! - A read of a slot (`scratch_load`): every thread waits on the slot's mbarrier for the
//!   phase after the ones it already consumed (parity = the slot's bit in `waited`, then
//!   flipped). The completed phase makes the copy's bytes visible to the waiting thread,
//!   so no block barrier is needed between a fetch and its reads.
//! - `scratch_wait(0)` (the pipeline's drain) waits, in every thread, for each slot
//!   whose fetch was not consumed (`fetched ^ waited`), so no copy is still writing when
//!   the ring's bytes are reused. Other waits emit nothing: the reads wait per slot. The
//!   drain does not consume: a 2-stage pipeline waits with `scratch_wait(0)` inside its
//!   loop, before reading the fill it waited for (whose read then finds the phase
//!   complete). A fill nobody read is consumed by the next fetch into its slot instead
//!   (a persistent loop's refill), so that fetch's read waits for the phase after it.
//!   (With warp specialization the consumers' drain consumes and releases the slots.)

use super::{Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::swizzle::SharedTile;
use crate::ir::{InstId, Op};

/// What the boxes of one fill are copied from and complete on; `outer` are the
/// coordinates of the dimensions outside the row (box extent 1), innermost first.
#[derive(Clone, Copy)]
struct TmaBoxes<'a> {
    map: Reg,
    col: Reg,
    row: Reg,
    outer: &'a [Reg],
    mbar: Reg,
    leader: Reg,
}

/// An allocated ring's mbarriers and phase bookkeeping.
#[derive(Clone, Copy, Debug)]
pub struct TmaRing {
    pub mbar: crate::back::ptx::smem::BufId,
    pub slots: u32,
    /// Bit s: parity of the fetches into slot s so far.
    pub fetched: Reg,
    /// Bit s: parity of the phases of slot s consumed so far.
    pub waited: Reg,
    /// Warp specialization (`lower/ws.rs`): the slot the consumers read last iteration
    /// and have not released yet (-1: none).
    pub prev: Reg,
    /// A multicast ring: bit s of the first is set once slot s has been filled, bit s
    /// of the second is the parity of slot s's `empty` phases passed.
    pub multicast: Option<(Reg, Reg)>,
}

impl Lowerer<'_> {
    /// Whether shared buffer `buf` is filled by TMA.
    pub(super) fn is_tma_buf(&self, buf: u32) -> bool {
        self.tma.map_of(buf).is_some()
    }

    /// Thread 0's predicate (`%tid.x == 0`), made once in the prologue.
    pub(super) fn tma_leader(&mut self) -> Reg {
        if let Some(p) = self.tma_leader {
            return p;
        }
        let tid = self.tid();
        let p = self.in_prologue(|l| {
            l.op1(
                RegClass::Pred,
                "setp.eq.u32",
                vec![tid.into(), Operand::Imm(0)],
            )
        });
        self.tma_leader = Some(p);
        p
    }

    /// The generic address of tensor map `m` (a kernel parameter), made once.
    pub(super) fn tmap_addr(&mut self, m: usize) -> Reg {
        if let Some(&r) = self.tmap_addrs.get(&m) {
            return r;
        }
        let name = self.tma.maps[m].ptx_name.clone();
        let r = self.in_prologue(|l| {
            let p = l.op1(RegClass::B64, "mov.b64", vec![Operand::Sym(name)]);
            l.op1(RegClass::B64, "cvta.param.u64", vec![p.into()])
        });
        self.tmap_addrs.insert(m, r);
        r
    }

    /// After ring `buf` is allocated: its mbarriers (module docs).
    pub(super) fn tma_alloc(&mut self, buf: u32) {
        let slots = self.func.scratch[buf as usize].slots;
        let name = format!("{}_mbar", self.func.scratch[buf as usize].name);
        // `full` barriers at 8 * s; with warp specialization or multicast `empty` ones
        // after them.
        let ws = self.ws == super::ws::WsMode::Consumer;
        let multicast = self.tma.multicast.contains(&buf);
        let count = if ws || multicast { 2 * slots } else { slots };
        let mbar = self.smem.alloc(name, count * 8, 8);
        let range = self.smem.range(mbar);
        if self.sync.before_write(range) {
            self.emit_bar_sync();
        }
        let leader = self.tma_leader();
        let base = self.smem_at(self.smem.offset(mbar));
        let ring_name = &self.func.scratch[buf as usize].name;
        self.comment(format!("TMA ring `{ring_name}`: {slots} mbarriers"));
        for s in 0..slots {
            self.emit_if(
                Some((leader, false)),
                "mbarrier.init.shared::cta.b64",
                vec![
                    Operand::Mem(Addr::Reg(base), (s * 8) as i64),
                    Operand::Imm(1),
                ],
            );
        }
        if ws {
            // Released by lane 0 of each consumer warp (of both blocks when multicast).
            let blocks = if multicast { 2 } else { 1 };
            for s in slots..2 * slots {
                self.emit_if(
                    Some((leader, false)),
                    "mbarrier.init.shared::cta.b64",
                    vec![
                        Operand::Mem(Addr::Reg(base), (s * 8) as i64),
                        Operand::Imm((blocks * self.num_warps) as i64),
                    ],
                );
            }
        } else if multicast {
            // Released by thread 0 of each block of the pair.
            for s in slots..2 * slots {
                self.emit_if(
                    Some((leader, false)),
                    "mbarrier.init.shared::cta.b64",
                    vec![
                        Operand::Mem(Addr::Reg(base), (s * 8) as i64),
                        Operand::Imm(2),
                    ],
                );
            }
        }
        self.emit_if(
            Some((leader, false)),
            "fence.mbarrier_init.release.cluster",
            vec![],
        );
        let fetched = self.reg(RegClass::B32);
        let waited = self.reg(RegClass::B32);
        let prev = self.reg(RegClass::B32);
        self.mov(fetched, Operand::Imm(0));
        self.mov(waited, Operand::Imm(0));
        self.mov(prev, Operand::Imm(-1));
        let multicast = multicast.then(|| {
            let (used, released) = (self.reg(RegClass::B32), self.reg(RegClass::B32));
            self.mov(used, Operand::Imm(0));
            self.mov(released, Operand::Imm(0));
            (used, released)
        });
        if multicast.is_some() {
            // The other block's copies complete on these mbarriers too.
            self.cluster_sync();
            self.sync.barrier();
        } else if !ws {
            // Every later use of the mbarriers follows their initialization (with warp
            // specialization the split's barrier does this for all threads).
            self.emit_cta_barrier();
        }
        self.tma_rings.insert(
            buf,
            TmaRing {
                mbar,
                slots,
                fetched,
                waited,
                prev,
                multicast,
            },
        );
    }

    /// The address of slot `slot`'s `empty` mbarrier (warp specialization).
    pub(super) fn empty_mbar(&mut self, ring: &TmaRing, slot: Reg) -> Reg {
        let base = self.smem_at(self.smem.offset(ring.mbar));
        let empty = self.op1(
            RegClass::B32,
            "add.u32",
            vec![base.into(), Operand::Imm((ring.slots * 8) as i64)],
        );
        self.op1(
            RegClass::B32,
            "mad.lo.s32",
            vec![slot.into(), Operand::Imm(8), empty.into()],
        )
    }

    /// Before ring `buf` is freed: its mbarriers invalidated (module docs).
    pub(super) fn tma_free(&mut self, buf: u32) {
        let Some(ring) = self.tma_rings.remove(&buf) else {
            return;
        };
        let range = self.smem.range(ring.mbar);
        let base = self.smem_at(self.smem.offset(ring.mbar));
        if ring.multicast.is_some() && self.ws == super::ws::WsMode::Consumer {
            // The other block's consumers release every slot on this block's `empty`
            // mbarriers too, and nothing waited for their last releases (no refill
            // follows): wait for each slot's last phase (parity: its fill count's, less
            // one; a slot never filled passes at once), so that no arrival lands after
            // the invalidation, or in the bytes once the ring is freed.
            for s in 0..ring.slots {
                let n = self.op1(
                    RegClass::B32,
                    "bfe.u32",
                    vec![ring.fetched.into(), Operand::Imm(s as i64), Operand::Imm(1)],
                );
                let parity = self.op1(RegClass::B32, "xor.b32", vec![n.into(), Operand::Imm(1)]);
                let empty = self.op1(
                    RegClass::B32,
                    "add.u32",
                    vec![base.into(), Operand::Imm(((ring.slots + s) * 8) as i64)],
                );
                self.mbarrier_wait(empty, parity);
            }
        }
        if self.sync.before_write(range) {
            self.emit_bar_sync();
        }
        let leader = self.tma_leader();
        let count = self.smem.bytes(ring.mbar) / 8;
        for s in 0..count {
            self.emit_if(
                Some((leader, false)),
                "mbarrier.inval.shared::cta.b64",
                vec![Operand::Mem(Addr::Reg(base), (s * 8) as i64)],
            );
        }
        self.smem.free(ring.mbar);
    }

    /// `1 << slot` and the slot's mbarrier address.
    fn slot_bit_and_mbar(&mut self, ring: &TmaRing, slot: Reg) -> (Reg, Reg) {
        let base = self.smem_at(self.smem.offset(ring.mbar));
        let bit = self.op1(RegClass::B32, "shl.b32", vec![Operand::Imm(1), slot.into()]);
        let mbar = self.op1(
            RegClass::B32,
            "mad.lo.s32",
            vec![slot.into(), Operand::Imm(8), base.into()],
        );
        (bit, mbar)
    }

    /// Spins until the phase of parity `parity` (a `.b32` 0 or 1) of the mbarrier at
    /// `mbar` has completed.
    pub(super) fn mbarrier_wait(&mut self, mbar: Reg, parity: Reg) {
        let top = self.new_label();
        self.place_label(top);
        let done = self.op1(
            RegClass::Pred,
            "mbarrier.try_wait.parity.shared::cta.b64",
            vec![Operand::Mem(Addr::Reg(mbar), 0), parity.into()],
        );
        self.emit_if(Some((done, true)), "bra", vec![Operand::Label(top)]);
    }

    /// A TMA fetch (module docs).
    pub(super) fn lower_tma_fetch(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::ScratchFetch {
            buf,
            slot,
            ref index,
            ..
        } = inst.op
        else {
            return Ok(());
        };
        let m = *self
            .tma
            .by_buf
            .get(&buf)
            .ok_or_else(|| super::unsupported(span, "a TMA fetch without a tensor map"))?;
        let ring = *self
            .tma_rings
            .get(&buf)
            .ok_or_else(|| super::unsupported(span, "a TMA fetch outside its ring's lifetime"))?;
        let mode = self.ws;
        if mode == super::ws::WsMode::Consumer {
            // The producer copies; the consumers count the fetch (for the drain).
            let s = self.scalar(slot, span)?;
            let bit = self.op1(RegClass::B32, "shl.b32", vec![Operand::Imm(1), s.into()]);
            self.emit(
                "xor.b32",
                vec![ring.fetched.into(), ring.fetched.into(), bit.into()],
            );
            self.count_fetch();
            return Ok(());
        }
        let (slot_addr, tile, range) = self.shared_slot(buf, slot, span)?;
        let real = func.scratch[buf as usize].slot_shape.clone();
        let rank = self.tma.maps.get(m).map_or(0, |pm| pm.spec.rank as usize);
        if index.len() != rank || real.len() != 2 || !(2..=5).contains(&rank) {
            return Err(super::unsupported(span, "a TMA fetch of a 2-D tile"));
        }
        // Leading dimensions (box extent 1): the index is the coordinate.
        let nl = rank - 2;
        let mut lead = Vec::with_capacity(nl);
        for &ix in &index[..nl] {
            lead.push(self.scalar(ix, span)?);
        }
        // Write after read: no thread may still read the slot (or any other: the tracker
        // sees the whole ring). With warp specialization the slot's `empty` mbarrier
        // says so instead.
        let multicast = self.tma.multicast.contains(&buf);
        if mode == super::ws::WsMode::Off && self.sync.before_bulk_write(range) {
            self.emit_bar_sync();
        }
        let mut origin = Vec::with_capacity(2);
        for d in 0..2 {
            let idx = self.scalar(index[nl + d], span)?;
            origin.push(self.op1(
                RegClass::B32,
                "mul.lo.s32",
                vec![idx.into(), Operand::Imm(real[d] as i64)],
            ));
        }
        let s = self.scalar(slot, span)?;
        let (bit, mbar) = self.slot_bit_and_mbar(&ring, s);
        let leader = if mode == super::ws::WsMode::Producer {
            // The slot's previous fill released: parity of this fill's count, flipped
            // (the first fill's wait passes at once).
            let empty = self.empty_mbar(&ring, s);
            let masked = self.op1(
                RegClass::B32,
                "and.b32",
                vec![ring.fetched.into(), bit.into()],
            );
            let n = self.op1(RegClass::B32, "shr.u32", vec![masked.into(), s.into()]);
            let parity = self.op1(RegClass::B32, "xor.b32", vec![n.into(), Operand::Imm(1)]);
            self.mbarrier_wait(empty, parity);
            // Only the producer thread runs here: an always-true guard.
            self.in_prologue(|l| {
                l.op1(
                    RegClass::Pred,
                    "setp.eq.u32",
                    vec![Operand::Imm(0), Operand::Imm(0)],
                )
            })
        } else {
            // A fill of this slot that nobody read (a fetch past the loop's end, waited
            // for by the drain) is consumed now, so this fill's read waits for the
            // phase after it.
            let open = self.op1(
                RegClass::B32,
                "xor.b32",
                vec![ring.fetched.into(), ring.waited.into()],
            );
            let stale = self.op1(RegClass::B32, "and.b32", vec![open.into(), bit.into()]);
            self.emit(
                "xor.b32",
                vec![ring.waited.into(), ring.waited.into(), stale.into()],
            );
            self.tma_leader()
        };
        self.emit(
            "xor.b32",
            vec![ring.fetched.into(), ring.fetched.into(), bit.into()],
        );
        if let (Some(mc), super::ws::WsMode::Off) = (ring.multicast, mode) {
            self.multicast_release(&ring, mc, s, bit, leader);
        }
        let map = self.tmap_addr(m);
        self.emit_if(
            Some((leader, false)),
            "mbarrier.arrive.expect_tx.shared::cta.b64",
            vec![
                Operand::Sym("_".into()),
                Operand::Mem(Addr::Reg(mbar), 0),
                Operand::Imm(tile.bytes() as i64),
            ],
        );
        // Coordinates innermost first: the column, the row, then the leading indices.
        let outer: Vec<Reg> = lead.into_iter().rev().collect();
        let boxes = TmaBoxes {
            map,
            col: origin[1],
            row: origin[0],
            outer: &outer,
            mbar,
            leader,
        };
        self.tma_boxes(&tile, slot_addr, boxes, multicast);
        self.count_fetch();
        Ok(())
    }

    /// One `cp.async.bulk.tensor.{2+outer}d` per swizzle atom of the slot: atom `a` holds
    /// columns `a * atom_cols ..` of every row, at `a * atom_bytes`. A multicast fill
    /// copies atoms `2 j + rank` only, each into both blocks of the cluster.
    fn tma_boxes(&mut self, tile: &SharedTile, slot_addr: Reg, b: TmaBoxes, multicast: bool) {
        let TmaBoxes {
            map,
            col,
            row,
            outer,
            mbar,
            leader,
        } = b;
        let dims = 2 + outer.len();
        let (ac, ab) = (tile.atom_cols(), tile.atom_bytes());
        let atoms = tile.cols / ac;
        let (first_col, first_dst, step, mask, suffix) = if multicast {
            let (rank, mask) = self.multicast_regs();
            let c = self.op1(
                RegClass::B32,
                "mad.lo.s32",
                vec![rank.into(), Operand::Imm(ac as i64), col.into()],
            );
            let d = self.op1(
                RegClass::B32,
                "mad.lo.s32",
                vec![rank.into(), Operand::Imm(ab as i64), slot_addr.into()],
            );
            (c, d, 2, Some(mask), ".multicast::cluster")
        } else {
            (col, slot_addr, 1, None, "")
        };
        for a in (0..atoms).step_by(step) {
            let c = if a == 0 {
                first_col
            } else {
                self.op1(
                    RegClass::B32,
                    "add.s32",
                    vec![first_col.into(), Operand::Imm((a * ac) as i64)],
                )
            };
            let mut coords = vec![c, row];
            coords.extend_from_slice(outer);
            let mut ops = vec![
                Operand::Mem(Addr::Reg(first_dst), (a * ab) as i64),
                Operand::TensorCoords(map, coords),
                Operand::Mem(Addr::Reg(mbar), 0),
            ];
            ops.extend(mask.map(Operand::from));
            self.emit_if(
                Some((leader, false)),
                format!(
                    "cp.async.bulk.tensor.{dims}d.shared::cluster.global.mbarrier::complete_tx::bytes{suffix}"
                ),
                ops,
            );
        }
    }

    /// Before a refill of multicast slot `s` (filled before): thread 0 tells both blocks
    /// that this block no longer reads it (every thread's reads end before the block
    /// barrier the tracker placed before this iteration's fills) by arriving on its own
    /// and the other block's `empty` mbarrier of the slot, then waits for the phase in
    /// which the other block's thread 0 arrived too: neither block still reads the slot
    /// the fill writes in both. Only thread 0 waits; the other threads go on.
    fn multicast_release(&mut self, ring: &TmaRing, mc: (Reg, Reg), s: Reg, bit: Reg, leader: Reg) {
        let (used, released) = mc;
        let (rank, _) = self.multicast_regs();
        let filled = self.op1(RegClass::B32, "and.b32", vec![used.into(), bit.into()]);
        let refill = self.op1(
            RegClass::Pred,
            "setp.ne.u32",
            vec![filled.into(), Operand::Imm(0)],
        );
        let parity = self.op1(
            RegClass::B32,
            "bfe.u32",
            vec![released.into(), s.into(), Operand::Imm(1)],
        );
        let flip = self.op1(
            RegClass::B32,
            "selp.b32",
            vec![bit.into(), Operand::Imm(0), refill.into()],
        );
        self.emit(
            "xor.b32",
            vec![released.into(), released.into(), flip.into()],
        );
        self.emit("or.b32", vec![used.into(), used.into(), bit.into()]);
        let go = self.op1(
            RegClass::Pred,
            "and.pred",
            vec![refill.into(), leader.into()],
        );
        let skip = self.new_label();
        self.emit_if(Some((go, true)), "bra", vec![Operand::Label(skip)]);
        let empty = self.empty_mbar(ring, s);
        self.emit(
            "mbarrier.arrive.shared::cta.b64",
            vec![Operand::Sym("_".into()), Operand::Mem(Addr::Reg(empty), 0)],
        );
        let peer = self.op1(RegClass::B32, "xor.b32", vec![rank.into(), Operand::Imm(1)]);
        let remote = self.op1(
            RegClass::B32,
            "mapa.shared::cluster.u32",
            vec![empty.into(), peer.into()],
        );
        // The default `.release.cta` / `.acquire.cta`: the peer's reads of the slot
        // are by its own threads before its block barrier, and the refill is by the
        // async proxy, ordered by the mbarrier itself. Cluster scope here would make
        // every release a `MEMBAR.ALL.GPU` and every wait an L1 invalidate (SASS).
        self.emit(
            "mbarrier.arrive.shared::cluster.b64",
            vec![Operand::Sym("_".into()), Operand::Mem(Addr::Reg(remote), 0)],
        );
        self.mbarrier_wait(empty, parity);
        self.place_label(skip);
    }

    /// This block's cluster rank and the `.b16` mask of both blocks of its pair, made
    /// once in the prologue.
    pub(super) fn multicast_regs(&mut self) -> (Reg, Reg) {
        if let Some(r) = self.tma_multicast {
            return r;
        }
        let r = self.in_prologue(|l| {
            let rank = l.op1(
                RegClass::B32,
                "mov.u32",
                vec![Operand::Sym("%cluster_ctarank".into())],
            );
            let mask = l.op1(RegClass::B16, "mov.b16", vec![Operand::Imm(3)]);
            (rank, mask)
        });
        self.tma_multicast = Some(r);
        r
    }

    /// A full barrier of the cluster's threads (release, then acquire), keeping the
    /// split cluster barrier's discipline (`lower/cluster.rs`: one `arrive` outstanding
    /// from the body's start to the `wait` before `ret`): the pending phase is completed,
    /// one full phase is passed, and a new `arrive` is left outstanding.
    pub(super) fn cluster_sync(&mut self) {
        self.emit("barrier.cluster.wait", vec![]);
        self.emit("barrier.cluster.arrive", vec![]);
        self.emit("barrier.cluster.wait", vec![]);
        self.emit("barrier.cluster.arrive", vec![]);
    }

    /// Before a read of slot `slot` of TMA ring `buf`: wait for its next phase (module
    /// docs).
    pub(super) fn tma_wait_slot(&mut self, buf: u32, slot: Reg) {
        let Some(ring) = self.tma_rings.get(&buf).copied() else {
            return;
        };
        // Initialized before a barrier every thread passed (`tma_alloc`, `ws_split`).
        let range = self.smem.range(ring.mbar);
        self.sync.note_read(range);
        self.tma_last_slot.insert(buf, slot);
        let (bit, mbar) = self.slot_bit_and_mbar(&ring, slot);
        let masked = self.op1(
            RegClass::B32,
            "and.b32",
            vec![ring.waited.into(), bit.into()],
        );
        let parity = self.op1(RegClass::B32, "shr.u32", vec![masked.into(), slot.into()]);
        self.mbarrier_wait(mbar, parity);
        self.emit(
            "xor.b32",
            vec![ring.waited.into(), ring.waited.into(), bit.into()],
        );
    }

    /// `scratch_wait(0)` on a kernel whose fetches are TMA: every slot with a fetch not
    /// yet consumed is waited for (module docs).
    pub(super) fn tma_drain(&mut self) {
        let mut rings: Vec<(u32, TmaRing)> = self.tma_rings.iter().map(|(&b, &r)| (b, r)).collect();
        rings.sort_by_key(|(b, _)| *b);
        let consumer = self.ws == super::ws::WsMode::Consumer;
        for (buf, ring) in rings {
            if consumer && self.ws_once.contains(&buf) {
                // Filled once and read after this wait, which the read itself does
                // (draining it here would consume the fill before its read).
                continue;
            }
            let range = self.smem.range(ring.mbar);
            self.sync.note_read(range);
            let base = self.smem_at(self.smem.offset(ring.mbar));
            if consumer {
                // The last slot read (its group completed at the loop's exit).
                self.ws_release_prev(&ring);
            }
            let open = self.op1(
                RegClass::B32,
                "xor.b32",
                vec![ring.fetched.into(), ring.waited.into()],
            );
            for s in 0..ring.slots {
                let pending = self.op1(
                    RegClass::B32,
                    "and.b32",
                    vec![open.into(), Operand::Imm(1 << s)],
                );
                let skip = self.op1(
                    RegClass::Pred,
                    "setp.eq.u32",
                    vec![pending.into(), Operand::Imm(0)],
                );
                let done = self.new_label();
                self.emit_if(Some((skip, false)), "bra.uni", vec![Operand::Label(done)]);
                let w = self.op1(
                    RegClass::B32,
                    "bfe.u32",
                    vec![ring.waited.into(), Operand::Imm(s as i64), Operand::Imm(1)],
                );
                let mbar = self.op1(
                    RegClass::B32,
                    "add.u32",
                    vec![base.into(), Operand::Imm((s * 8) as i64)],
                );
                self.mbarrier_wait(mbar, w);
                if consumer {
                    // Consumed: with warp specialization every fill is read (or drained)
                    // once, so the parities of the next fills stay right (a persistent
                    // loop refills the ring).
                    self.emit(
                        "xor.b32",
                        vec![ring.waited.into(), ring.waited.into(), Operand::Imm(1 << s)],
                    );
                    let empty = self.op1(
                        RegClass::B32,
                        "add.u32",
                        vec![base.into(), Operand::Imm(((ring.slots + s) * 8) as i64)],
                    );
                    self.ws_arrive(empty, None, ring.multicast.is_some());
                }
                self.place_label(done);
            }
        }
    }
}
