//! TMA stores: a tile `store` that `back::ptx::tma::plan` gave a tensor map goes through
//! shared memory in the map's swizzled layout and is written by the copy engine.
//!
//! Assumes: the plan chose this store (its tensor rank 2, `contiguous`, 16-byte aligned,
//! never read by the kernel and stored only here; the value a 2-D tile of power-of-two
//! extents of the tensor's dtype), and the map's box is one swizzle atom of
//! `SharedTile::new(rows, cols, elem)` by every row.
//!
//! Guarantees:
//! - Every register of the value is written to shared memory at `SharedTile::offset` of
//!   its element. That offset is linear over GF(2) in the coordinate bits (power-of-two
//!   extents give each bit its own address bit, and the swizzle XORs row bits into chunk
//!   bits), so a register's address is `base + (thread ^ xor) + imm`: `thread` is the
//!   offset of the thread's own coordinate (computed once), `xor` the bits of the
//!   register's part that a thread bit can also set, `imm` the rest ([`write_groups`]).
//!   Consecutive registers of consecutive columns inside a 16-byte chunk go in one
//!   vector store (half values packed two to a word).
//! - The tile goes in groups of whole atoms, as many as fit beside the shared memory
//!   alive here (a persistent loop's ring: `passes/cross_round.rs`), at least one; when
//!   a thread bit selects the atom, all atoms at once (or the plain `st.global` path when
//!   they do not fit: the map then goes unused).
//! - Per group: every thread `fence.proxy.async.shared::cta` (its writes visible to the
//!   copy engine), a block barrier, then the issuer (below) issues one
//!   `cp.async.bulk.tensor.2d.global.shared::cta.bulk_group` per atom (the engine clips
//!   what lies past the tensor's far edges, as `store` does; a tile at a negative index,
//!   wholly outside, is not copied: the engine faults on negative store coordinates), `cp.async.bulk.commit_group` and
//!   `cp.async.bulk.wait_group.read 0`; the tracker records the bytes as read, so the
//!   next write of them comes after a barrier that follows the issuer's wait.
//! - The copies of the plan's `k`-th TMA store are issued by lane 0 of warp `k mod
//!   warps` (thread 0 for the first), so each store's bulk groups are its issuer's own.
//!   Before its first copy the issuer waits for all its earlier groups to complete
//!   (`cp.async.bulk.wait_group 0`: in a persistent loop the previous tile's, long done),
//!   so successive executions of one store write in program order, and two stores (of
//!   different tensors, which the runtime keeps from overlapping) do not wait for each
//!   other.

use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::layout::Linear;
use crate::back::ptx::swizzle::SharedTile;
use crate::ir::{InstId, Op};
use std::collections::HashMap;

/// Consecutive registers written by one shared-memory store (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteGroup {
    /// The group's first register (`len` consecutive ones follow).
    pub first: usize,
    pub len: usize,
    /// Bits of the register part's offset that a thread bit can set too (XORed into the
    /// thread's offset).
    pub xor: u32,
    /// The rest of the register part's offset (added).
    pub imm: u32,
    /// The atom of the register part (the thread part's atom is in the thread offset).
    pub atom: u32,
}

/// The offset bits any thread bit of `lin` can set in `tile`'s layout.
pub fn thread_mask(lin: &Linear, tile: &SharedTile) -> u32 {
    let mut mask = 0u32;
    for l in lin.lanes.iter().chain(lin.warps.iter()) {
        if let Some((d, b)) = *l {
            let (r, c) = if d == 0 {
                (1u32 << b, 0)
            } else {
                (0, 1u32 << b)
            };
            mask |= tile.offset(r, c);
        }
    }
    mask
}

/// Whether a thread bit of `lin` selects the atom (a column bit at or above the atom's
/// width).
pub fn atom_in_threads(lin: &Linear, tile: &SharedTile) -> bool {
    let atom_bit = tile.atom_cols().trailing_zeros() as u8;
    lin.lanes
        .iter()
        .chain(lin.warps.iter())
        .any(|l| matches!(l, Some((1, b)) if *b >= atom_bit))
}

/// The stores that write a 2-D tile laid out as `lin` into `tile`, `vec` registers each
/// (module docs).
pub fn write_groups(lin: &Linear, tile: &SharedTile, vec: usize) -> Vec<WriteGroup> {
    let mask = thread_mask(lin, tile);
    (0..lin.num_regs())
        .step_by(vec.max(1))
        .map(|first| {
            let c = lin.reg_coord(first);
            let v = tile.offset(c[0], c[1]);
            WriteGroup {
                first,
                len: vec.max(1),
                xor: v & mask,
                imm: v & !mask,
                atom: c[1] / tile.atom_cols(),
            }
        })
        .collect()
}

impl Lowerer<'_> {
    /// Lowers `store` `id` through its tensor map (module docs). `Ok(false)`: it takes
    /// the plain path instead.
    pub(super) fn lower_tma_store(&mut self, id: InstId) -> R<bool> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::Store {
            tensor,
            ref index,
            value,
            ..
        } = inst.op
        else {
            return Ok(false);
        };
        let Some(&m) = self.tma.by_store.get(&id) else {
            return Ok(false);
        };
        let lin = self.lin(value);
        let shape = self.shape(value);
        let (_, p) = self.tensor(tensor, span)?;
        let ([rows, cols], 2) = (
            [
                shape.first().copied().unwrap_or(0),
                shape.get(1).copied().unwrap_or(0),
            ],
            shape.len(),
        ) else {
            return Ok(false);
        };
        if lin.shape != [rows, cols] || index.len() != 2 || self.dtype(value) != p.dtype {
            return Ok(false);
        }
        let dt = p.dtype;
        let es = dt.size_bytes();
        let tile = SharedTile::new(rows, cols, es);
        let atoms = cols / tile.atom_cols();
        // As many atoms per group as fit (a power of two dividing the atom count).
        let limit = self.target.max_shared_bytes_per_block;
        let fits = |l: &Self, k: u32| {
            l.smem.end_if_allocated(k * tile.atom_bytes(), tile.align()) <= limit
        };
        let mut k = atoms;
        while k > 1 && !fits(self, k) {
            k /= 2;
        }
        if !fits(self, k) || (k < atoms && atom_in_threads(&lin, &tile)) {
            return Ok(false);
        }
        let regs = self.regs(value, span)?;
        let vbits = crate::back::ptx::layout::row_major_vector_bits(&lin)
            .min((16 / es).trailing_zeros())
            .min(tile.chunk_elems().trailing_zeros());
        let vec = if super::class_of(dt) == RegClass::Pred {
            1
        } else {
            1usize << vbits
        };
        let groups = write_groups(&lin, &tile, vec);
        self.comment(format!(
            "TMA store: {rows} x {cols} through shared memory, {k} of {atoms} atoms at a time"
        ));
        // The tile's origin in elements, and the thread's own offset in the layout.
        let mut origin = Vec::with_capacity(2);
        for (d, &ext) in [rows, cols].iter().enumerate() {
            let ix = self.scalar(index[d], span)?;
            origin.push(self.op1(
                RegClass::B32,
                "mul.lo.s32",
                vec![ix.into(), Operand::Imm(ext as i64)],
            ));
        }
        let zero = |l: &mut Self| l.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(0)]);
        let tr = match self.thread_coord(&lin, 0) {
            Some(r) => r,
            None => zero(self),
        };
        let tc = match self.thread_coord(&lin, 1) {
            Some(r) => r,
            None => zero(self),
        };
        let toff = self.swizzled_offset(&tile, tr, tc);
        let map = self.tmap_addr(m);
        let leader = self.store_issuer(id);
        // A tile at a negative index lies wholly outside the tensor: nothing to write,
        // and the copy engine faults on such a store (an illegal instruction on the
        // H100), so its copies are not issued. Past the far edges it clips.
        let r_ok = self.op1(
            RegClass::Pred,
            "setp.ge.s32",
            vec![origin[0].into(), Operand::Imm(0)],
        );
        let c_ok = self.op1(
            RegClass::Pred,
            "setp.ge.s32",
            vec![origin[1].into(), Operand::Imm(0)],
        );
        let inside = self.op1(RegClass::Pred, "and.pred", vec![r_ok.into(), c_ok.into()]);
        let issue = self.op1(
            RegClass::Pred,
            "and.pred",
            vec![inside.into(), leader.into()],
        );
        // Earlier copies complete first: this store's executions stay in program order.
        self.emit_if(
            Some((leader, false)),
            "cp.async.bulk.wait_group",
            vec![Operand::Imm(0)],
        );
        for g0 in (0..atoms).step_by(k as usize) {
            let buf = self
                .smem
                .alloc("tma_store", k * tile.atom_bytes(), tile.align());
            let range = self.smem.range(buf);
            if self.sync.before_write(range.clone()) {
                self.emit_bar_sync();
            }
            let base = self.smem_at(self.smem.offset(buf));
            let mut bases: HashMap<u32, Reg> = HashMap::new();
            for g in groups.iter().filter(|g| (g0..g0 + k).contains(&g.atom)) {
                let a = match bases.get(&g.xor) {
                    Some(&a) => a,
                    None => {
                        let x = if g.xor == 0 {
                            toff
                        } else {
                            self.op1(
                                RegClass::B32,
                                "xor.b32",
                                vec![toff.into(), Operand::Imm(g.xor as i64)],
                            )
                        };
                        let a = self.op1(RegClass::B32, "add.s32", vec![base.into(), x.into()]);
                        bases.insert(g.xor, a);
                        a
                    }
                };
                let group: Vec<Reg> = (g.first..g.first + g.len)
                    .map(|r| regs.get(r).copied())
                    .collect::<Option<_>>()
                    .ok_or_else(|| unsupported(span, "TMA store register out of range"))?;
                let imm = g.imm as i64 - (g0 * tile.atom_bytes()) as i64;
                self.smem_store_group(&group, dt, a, imm, es);
            }
            self.emit("fence.proxy.async.shared::cta", vec![]);
            if self.sync.before_read(range.clone()) {
                self.emit_bar_sync();
            }
            for a in g0..g0 + k {
                let col = self.op1(
                    RegClass::B32,
                    "add.s32",
                    vec![
                        origin[1].into(),
                        Operand::Imm((a * tile.atom_cols()) as i64),
                    ],
                );
                self.emit_if(
                    Some((issue, false)),
                    "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
                    vec![
                        Operand::TensorCoords(map, vec![col, origin[0]]),
                        Operand::Mem(Addr::Reg(base), ((a - g0) * tile.atom_bytes()) as i64),
                    ],
                );
            }
            self.emit_if(Some((leader, false)), "cp.async.bulk.commit_group", vec![]);
            self.emit_if(
                Some((leader, false)),
                "cp.async.bulk.wait_group.read",
                vec![Operand::Imm(0)],
            );
            self.smem.free(buf);
        }
        Ok(true)
    }

    /// The predicate of the thread that issues TMA store `id`'s copies: lane 0 of warp
    /// `k mod warps` for the plan's `k`-th store, so each store's copies sit in their own
    /// thread's bulk groups and waiting for them waits for no other store's.
    fn store_issuer(&mut self, id: InstId) -> Reg {
        let mut ids: Vec<InstId> = self.tma.by_store.keys().copied().collect();
        ids.sort();
        let k = ids.iter().position(|&i| i == id).unwrap_or(0) as u32;
        let lane0 = 32 * (k % self.num_warps.max(1));
        if lane0 == 0 {
            return self.tma_leader();
        }
        let tid = self.tid();
        self.in_prologue(|l| {
            l.op1(
                RegClass::Pred,
                "setp.eq.u32",
                vec![tid.into(), Operand::Imm(lane0 as i64)],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::back::ptx::mma_layout;

    /// Every element's address from [`write_groups`] (thread offset XOR `xor`, plus
    /// `imm`) is `SharedTile::offset` of its coordinate, for the layouts a store meets:
    /// wgmma and `mma.sync` accumulators and blocked tiles, across swizzles.
    #[test]
    fn write_groups_agree_with_the_shared_tile_offset() {
        let mut layouts: Vec<Linear> = Vec::new();
        // Accumulators: wgmma's (warps along M, 16 rows each) and `mma.sync` warp grids.
        for (m, n, wm, wn) in [
            (128u32, 256u32, 8u32, 1u32),
            (128, 128, 8, 1),
            (64, 128, 4, 1),
            (128, 256, 2, 4),
            (128, 128, 2, 2),
            (64, 64, 1, 4),
        ] {
            let acc = mma_layout::MmaLayout {
                warps_m: wm,
                warps_n: wn,
                operand: mma_layout::MmaOperand::Acc,
            };
            layouts.push(acc.linear(&[m, n]));
        }
        for (shape, w) in [([128u32, 256u32], 8u32), ([64, 64], 4), ([32, 128], 4)] {
            layouts
                .push(crate::back::ptx::layout::Blocked::default_for(&shape, 8, w).linear(&shape));
        }
        assert_eq!(layouts.len(), 9);
        for lin in layouts {
            let (rows, cols) = (lin.shape[0], lin.shape[1]);
            for es in [2u32, 4] {
                let tile = SharedTile::new(rows, cols, es);
                let vbits = crate::back::ptx::layout::row_major_vector_bits(&lin)
                    .min((16 / es).trailing_zeros());
                let vec = 1usize << vbits;
                let groups = write_groups(&lin, &tile, vec);
                let threads = 32 * lin.num_warps();
                let mut seen = vec![false; (rows * cols) as usize];
                for tid in 0..threads {
                    // The thread's coordinate from its lane and warp bits.
                    let mut tcoord = [0u32; 2];
                    let bits = lin.lanes.iter().chain(lin.warps.iter()).enumerate();
                    for (h, l) in bits {
                        if let Some((d, b)) = *l {
                            if tid >> h & 1 == 1 {
                                tcoord[d as usize] |= 1 << b;
                            }
                        }
                    }
                    let toff = tile.offset(tcoord[0], tcoord[1]);
                    for g in &groups {
                        for i in 0..g.len {
                            let c = lin.reg_coord(g.first + i);
                            let (r, col) = (tcoord[0] | c[0], tcoord[1] | c[1]);
                            let got = ((toff ^ g.xor) + g.imm) as usize + i * es as usize;
                            assert_eq!(
                                got as u32,
                                tile.offset(r, col),
                                "{lin:?} es {es}: tid {tid} reg {}",
                                g.first + i
                            );
                            seen[(r * cols + col) as usize] = true;
                        }
                    }
                }
                assert!(seen.iter().all(|&s| s), "{lin:?}: every element written");
            }
        }
    }
}
