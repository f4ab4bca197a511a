//! Tensor-core fragment layouts as [`Linear`] layouts: which register, lane and warp bit
//! of a thread owns which coordinate bit of a `dot`'s accumulator and operands.
//!
//! `mma.sync.aligned.m16n8k16` (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
//! `g = lane >> 2` and `t = lane % 4`:
//! - C/D (16 × 8, four f32 per thread): `c[i]` is at row `g + 8 * (i >> 1)`, column
//!   `2t + (i & 1)`. Register bit 0 → column bit 0, lane bits 0–1 → column bits 1–2,
//!   lane bits 2–4 → row bits 0–2, register bit 1 → row bit 3.
//! - A (16 × 16, eight halves): `a[i]` is at row `g + 8 * ((i >> 1) & 1)`, column
//!   `2t + (i & 1) + 8 * (i >> 2)`. Register bit 0 → k bit 0, lanes 0–1 → k bits 1–2,
//!   lanes 2–4 → m bits 0–2, register bit 1 → m bit 3, register bit 2 → k bit 3.
//! - B (16 × 8, four halves): `b[i]` is at row (k) `2t + (i & 1) + 8 * (i >> 1)`,
//!   column (n) `g`. Register bit 0 → k bit 0, lanes 0–1 → k bits 1–2, register bit 1 →
//!   k bit 3, lanes 2–4 → n bits 0–2.
//!
//! `mma.sync.aligned.m16n8k8` with `.tf32` operands (f32 operands of a `dot` with a TF32
//! `input_precision`; "Matrix Fragments for mma.m16n8k8", one 32-bit element per
//! register, nothing packed):
//! - C/D: as for m16n8k16 above.
//! - A (16 × 8, four tf32): `a[i]` is at row `g + 8 * (i & 1)`, column `t + 4 * (i >> 1)`.
//!   Lanes 0–1 → k bits 0–1, lanes 2–4 → m bits 0–2, register bit 0 → m bit 3, register
//!   bit 1 → k bit 2.
//! - B (8 × 8, two tf32): `b[i]` is at row (k) `t + 4 * i`, column (n) `g`. Lanes 0–1 →
//!   k bits 0–1, register bit 0 → k bit 2, lanes 2–4 → n bits 0–2.
//!
//! A tile larger than one instruction repeats the pattern in more register bits (within
//! the warp's part) and splits the rest between warps: `warps_m` warps along M, `warps_n`
//! along N. Each warp needs the A rows of its M part and the B columns of its N part, so
//! the operands' layouts have the other direction's warp bits as *replica* bits. Register
//! bit 0 of every 16-bit operand layout is the packed pair (two halves in one `.b32`).
//!
//! The C layout of two neighbouring n8 tiles is the A layout of one k16 tile, bit for
//! bit, so a product's result used as the next product's A operand (attention's P · V)
//! converts for free through the ordinary `free_remap`.
//!
//! Assumes: padded (power-of-two) tile extents, `warps_m * warps_n` equal to the block's
//! warp count. Guarantees: every padded coordinate bit is owned by exactly one register,
//! lane or warp bit; where the tile is smaller than one instruction or than the warp grid
//! covers, the missing lane/warp bits are replica bits (the lowering of `mma` requires
//! M ≥ 16 · warps_m, N ≥ 8 · warps_n and K ≥ 16, or K ≥ 8 for TF32, which `mma_shape_ok`
//! checks).

use super::layout::{padded, CBit, Linear};

/// Which fragment of `mma.m16n8k16` (or, for the `Tf32` operands, `mma.m16n8k8.tf32`) a
/// layout describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaOperand {
    /// The accumulator / result, `[M, N]` (the same for both instructions).
    Acc,
    /// The left operand, `[M, K]`.
    A,
    /// The right operand, `[K, N]`.
    B,
    /// The left operand of `m16n8k8.tf32`, `[M, K]`.
    ATf32,
    /// The right operand of `m16n8k8.tf32`, `[K, N]`.
    BTf32,
}

/// Which `mma.sync` instruction a tensor-core `dot` is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaKind {
    /// `m16n8k16` with f16 or bf16 operands.
    F16,
    /// `m16n8k8` with tf32 operands (f32 operands rounded by `cvt.rna.tf32.f32`).
    Tf32,
}

impl MmaKind {
    /// The instruction's K.
    pub fn k(self) -> u32 {
        match self {
            MmaKind::F16 => 16,
            MmaKind::Tf32 => 8,
        }
    }

    /// The operand layouts `(A, B)` of this kind.
    pub fn operands(self) -> (MmaOperand, MmaOperand) {
        match self {
            MmaKind::F16 => (MmaOperand::A, MmaOperand::B),
            MmaKind::Tf32 => (MmaOperand::ATf32, MmaOperand::BTf32),
        }
    }
}

/// An `mma.sync` fragment layout over a whole tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaLayout {
    pub warps_m: u32,
    pub warps_n: u32,
    pub operand: MmaOperand,
}

fn log2(n: u32) -> u32 {
    n.max(1).trailing_zeros()
}

/// The instruction shape (m, n, k).
pub const INSTR: (u32, u32, u32) = (16, 8, 16);

/// The warp grid `[warps_m, warps_n]` for a `[m, n]` accumulator tile (padded extents):
/// warps are doubled along the direction with more instruction tiles left per warp,
/// rows first on ties, so each warp's part stays as square as the instruction allows
/// (a 128 × 128 tile on 4 warps: 2 × 2 parts of 64 × 64). Warps beyond what the tile
/// can give work to are put along M (their parts then overlap: replicas).
pub fn warp_grid(m: u32, n: u32, num_warps: u32) -> [u32; 2] {
    let (m, n) = (m.max(1).next_power_of_two(), n.max(1).next_power_of_two());
    let (mut wm, mut wn) = (1u32, 1u32);
    while wm * wn < num_warps.max(1) {
        let mt = m / (INSTR.0 * wm);
        let nt = n / (INSTR.1 * wn);
        if mt >= nt && mt > 1 {
            wm *= 2;
        } else if nt > 1 {
            wn *= 2;
        } else {
            wm *= 2;
        }
    }
    [wm, wn]
}

/// The warp grid of a `dot` that `wgmma.mma_async.m64nNk16` computes (sm_90a,
/// `lower/wgmma.rs`): every warp owns 16 whole rows and all `n` columns, so each
/// warpgroup of 4 warps owns 64 rows, one `m64nN` instruction per k-step. This is the
/// `Mma` accumulator layout with `[num_warps, 1]` warps: bit for bit wgmma's `D`
/// fragment (register bit 0 → column bit 0, bit 1 → row bit 3, the rest → column bits
/// 3..; lanes as for `mma.sync`; warp bits → row bits 4..). `None` when the tile is not
/// that shape (then `warp_grid` and `mma.sync` apply).
pub fn wgmma_grid(m: u32, n: u32, k: u32, num_warps: u32) -> Option<[u32; 2]> {
    let (m, n, k) = (
        m.max(1).next_power_of_two(),
        n.max(1).next_power_of_two(),
        k.max(1).next_power_of_two(),
    );
    let ok = num_warps.is_multiple_of(4)
        && num_warps > 0
        && m == 16 * num_warps
        && (8..=256).contains(&n)
        && k >= 16;
    ok.then_some([num_warps, 1])
}

/// Whether a `[m, k] x [k, n]` product (padded extents) can be tiled by the instructions of
/// `kind` (`m16n8k16`, `m16n8k8`) over a warp grid `[wm, wn]`: each warp's part holds
/// whole instructions.
pub fn mma_shape_ok(m: u32, n: u32, k: u32, grid: [u32; 2], kind: MmaKind) -> bool {
    let (m, n, k) = (
        m.max(1).next_power_of_two(),
        n.max(1).next_power_of_two(),
        k.max(1).next_power_of_two(),
    );
    m >= INSTR.0 * grid[0] && n >= INSTR.1 * grid[1] && k >= kind.k()
}

impl MmaLayout {
    /// The canonical layout over a 2-D tile `shape` (real extents; padded here).
    pub fn linear(&self, shape: &[u32]) -> Linear {
        let p = padded(shape);
        let (r0, r1) = (
            p.first().copied().unwrap_or(1),
            p.get(1).copied().unwrap_or(1),
        );
        let (bits0, bits1) = (log2(r0) as u8, log2(r1) as u8);
        // Which dim is M, N or K, and how many of its bits each warp's part has.
        let (wm, wn) = (log2(self.warps_m) as u8, log2(self.warps_n) as u8);
        let mut b = Builder {
            have: [bits0, bits1],
            next: [0, 0],
            regs: Vec::new(),
            lanes: [None; 5],
            warps: Vec::new(),
        };
        match self.operand {
            MmaOperand::Acc => {
                // dim 0 = M, dim 1 = N.
                let part = [bits0.saturating_sub(wm), bits1.saturating_sub(wn)];
                b.reg(1);
                b.lane(0, 1);
                b.lane(1, 1);
                b.lane(2, 0);
                b.lane(3, 0);
                b.lane(4, 0);
                b.reg(0);
                b.regs_up_to(1, part[1]);
                b.regs_up_to(0, part[0]);
                b.warp_bits(0, wm);
                b.warp_bits(1, wn);
            }
            MmaOperand::A => {
                // dim 0 = M, dim 1 = K; the N warps replicate.
                let part_m = bits0.saturating_sub(wm);
                b.reg(1);
                b.lane(0, 1);
                b.lane(1, 1);
                b.lane(2, 0);
                b.lane(3, 0);
                b.lane(4, 0);
                b.reg(0);
                b.reg(1);
                b.regs_up_to(1, bits1);
                b.regs_up_to(0, part_m);
                b.warp_bits(0, wm);
                b.replica_warps(wn);
            }
            MmaOperand::B => {
                // dim 0 = K, dim 1 = N; the M warps replicate.
                let part_n = bits1.saturating_sub(wn);
                b.reg(0);
                b.lane(0, 0);
                b.lane(1, 0);
                b.reg(0);
                b.lane(2, 1);
                b.lane(3, 1);
                b.lane(4, 1);
                b.regs_up_to(1, part_n);
                b.regs_up_to(0, bits0);
                b.replica_warps(wm);
                b.warp_bits(1, wn);
            }
            MmaOperand::ATf32 => {
                // dim 0 = M, dim 1 = K; the N warps replicate.
                let part_m = bits0.saturating_sub(wm);
                b.lane(0, 1);
                b.lane(1, 1);
                b.lane(2, 0);
                b.lane(3, 0);
                b.lane(4, 0);
                b.reg(0);
                b.reg(1);
                b.regs_up_to(1, bits1);
                b.regs_up_to(0, part_m);
                b.warp_bits(0, wm);
                b.replica_warps(wn);
            }
            MmaOperand::BTf32 => {
                // dim 0 = K, dim 1 = N; the M warps replicate.
                let part_n = bits1.saturating_sub(wn);
                b.lane(0, 0);
                b.lane(1, 0);
                b.reg(0);
                b.lane(2, 1);
                b.lane(3, 1);
                b.lane(4, 1);
                b.regs_up_to(1, part_n);
                b.regs_up_to(0, bits0);
                b.replica_warps(wm);
                b.warp_bits(1, wn);
            }
        }
        // Whatever the warps could not cover (a tile larger than the grid's parts only
        // if the warp dims ran out) goes to registers.
        b.regs_up_to(0, bits0);
        b.regs_up_to(1, bits1);
        Linear {
            shape: p,
            regs: b.regs,
            lanes: b.lanes,
            warps: b.warps,
        }
    }
}

/// Hands out coordinate bits in order; a dim that has no bit left gives a replica
/// (lanes, warps) or nothing (registers).
struct Builder {
    have: [u8; 2],
    next: [u8; 2],
    regs: Vec<CBit>,
    lanes: [Option<CBit>; 5],
    warps: Vec<Option<CBit>>,
}

impl Builder {
    fn take(&mut self, d: usize) -> Option<CBit> {
        (self.next[d] < self.have[d]).then(|| {
            self.next[d] += 1;
            (d as u8, self.next[d] - 1)
        })
    }

    fn reg(&mut self, d: usize) {
        if let Some(cb) = self.take(d) {
            self.regs.push(cb);
        }
    }

    fn lane(&mut self, h: usize, d: usize) {
        self.lanes[h] = self.take(d);
    }

    /// Register bits for dim `d` until it has `upto` bits handed out.
    fn regs_up_to(&mut self, d: usize, upto: u8) {
        while self.next[d] < upto.min(self.have[d]) {
            self.reg(d);
        }
    }

    fn warp_bits(&mut self, d: usize, n: u8) {
        for _ in 0..n {
            let cb = self.take(d);
            self.warps.push(cb);
        }
    }

    fn replica_warps(&mut self, n: u8) {
        for _ in 0..n {
            self.warps.push(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coordinate thread `tid` holds in register `r` (thread part + register part).
    fn coord(l: &Linear, tid: u32, r: usize) -> Vec<u32> {
        let mut c = l.reg_coord(r);
        for (h, cb) in l.lanes.iter().enumerate() {
            if let Some((d, b)) = cb {
                if tid >> h & 1 == 1 {
                    c[*d as usize] |= 1 << b;
                }
            }
        }
        for (w, cb) in l.warps.iter().enumerate() {
            if let Some((d, b)) = cb {
                if tid >> (5 + w) & 1 == 1 {
                    c[*d as usize] |= 1 << b;
                }
            }
        }
        c
    }

    fn one_warp(op: MmaOperand) -> MmaLayout {
        MmaLayout {
            warps_m: 1,
            warps_n: 1,
            operand: op,
        }
    }

    #[test]
    fn the_accumulator_fragment_is_the_isa_table() {
        let l = one_warp(MmaOperand::Acc).linear(&[16, 8]);
        assert_eq!(l.num_regs(), 4);
        for lane in 0..32u32 {
            let (g, t) = (lane >> 2, lane % 4);
            for i in 0..4u32 {
                let want = vec![g + 8 * (i >> 1), 2 * t + (i & 1)];
                assert_eq!(coord(&l, lane, i as usize), want, "lane {lane} c{i}");
            }
        }
    }

    #[test]
    fn the_a_fragment_is_the_isa_table() {
        let l = one_warp(MmaOperand::A).linear(&[16, 16]);
        assert_eq!(l.num_regs(), 8);
        for lane in 0..32u32 {
            let (g, t) = (lane >> 2, lane % 4);
            for i in 0..8u32 {
                let want = vec![g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)];
                assert_eq!(coord(&l, lane, i as usize), want, "lane {lane} a{i}");
            }
        }
    }

    #[test]
    fn the_b_fragment_is_the_isa_table() {
        let l = one_warp(MmaOperand::B).linear(&[16, 8]);
        assert_eq!(l.num_regs(), 4);
        for lane in 0..32u32 {
            let (g, t) = (lane >> 2, lane % 4);
            for i in 0..4u32 {
                let want = vec![2 * t + (i & 1) + 8 * (i >> 1), g];
                assert_eq!(coord(&l, lane, i as usize), want, "lane {lane} b{i}");
            }
        }
    }

    #[test]
    fn the_tf32_a_fragment_is_the_isa_table() {
        // PTX ISA, m16n8k8 `.tf32` A: row = groupID (+8 for a1, a3), col =
        // threadID_in_group (+4 for a2, a3).
        let l = one_warp(MmaOperand::ATf32).linear(&[16, 8]);
        assert_eq!(l.num_regs(), 4);
        for lane in 0..32u32 {
            let (g, t) = (lane >> 2, lane % 4);
            for i in 0..4u32 {
                let want = vec![g + 8 * (i & 1), t + 4 * (i >> 1)];
                assert_eq!(coord(&l, lane, i as usize), want, "lane {lane} a{i}");
            }
        }
    }

    #[test]
    fn the_tf32_b_fragment_is_the_isa_table() {
        // PTX ISA, m16n8k8 `.tf32` B: row (k) = threadID_in_group (+4 for b1), col (n) =
        // groupID.
        let l = one_warp(MmaOperand::BTf32).linear(&[8, 8]);
        assert_eq!(l.num_regs(), 2);
        for lane in 0..32u32 {
            let (g, t) = (lane >> 2, lane % 4);
            for i in 0..2u32 {
                let want = vec![t + 4 * i, g];
                assert_eq!(coord(&l, lane, i as usize), want, "lane {lane} b{i}");
            }
        }
    }

    #[test]
    fn an_ldmatrix_of_32_bit_rows_gives_the_tf32_a_fragment() {
        // `ldmatrix.x4` (b16) from an [M, K] f32 tile whose rows hold 4 f32 per 16 bytes:
        // matrix j covers rows 8 * (j & 1).. and 16-byte chunk (j >> 1); lane L gets the
        // 32-bit word L % 4 of row L / 4 of each matrix, i.e. element (row, 4 * chunk + L %
        // 4). Register j of that load must be a[j] of the ISA table.
        let l = one_warp(MmaOperand::ATf32).linear(&[16, 8]);
        for lane in 0..32u32 {
            for j in 0..4u32 {
                let (row, word) = (lane / 4 + 8 * (j & 1), lane % 4);
                let got = vec![row, 4 * (j >> 1) + word];
                assert_eq!(coord(&l, lane, j as usize), got, "lane {lane} matrix {j}");
            }
        }
        // B stored [N, K] (a transposed operand): matrix j covers n rows 0..8 and chunk j.
        let b = one_warp(MmaOperand::BTf32).linear(&[8, 8]);
        for lane in 0..32u32 {
            for j in 0..2u32 {
                let (n, word) = (lane / 4, lane % 4);
                assert_eq!(coord(&b, lane, j as usize), vec![4 * j + word, n]);
            }
        }
    }

    #[test]
    fn tiles_over_a_warp_grid_cover_every_element_once_per_warp_part() {
        for (m, n, k, warps) in [
            (128u32, 128u32, 32u32, 4u32),
            (128, 256, 64, 8),
            (64, 64, 16, 4),
            (16, 8, 16, 1),
            (256, 128, 32, 8),
        ] {
            let [wm, wn] = warp_grid(m, n, warps);
            assert_eq!(wm * wn, warps);
            assert!(
                mma_shape_ok(m, n, k, [wm, wn], MmaKind::F16),
                "{m}x{n}x{k} on {wm}x{wn}"
            );
            for (op, shape, copies) in [
                (MmaOperand::Acc, [m, n], 1u32),
                (MmaOperand::A, [m, k], wn),
                (MmaOperand::B, [k, n], wm),
                (MmaOperand::ATf32, [m, k], wn),
                (MmaOperand::BTf32, [k, n], wm),
            ] {
                let lay = MmaLayout {
                    warps_m: wm,
                    warps_n: wn,
                    operand: op,
                };
                let l = lay.linear(&shape);
                let mut count = std::collections::HashMap::new();
                for tid in 0..warps * 32 {
                    for r in 0..l.num_regs() {
                        *count.entry(coord(&l, tid, r)).or_insert(0u32) += 1;
                    }
                }
                assert_eq!(count.len() as u32, shape[0] * shape[1], "{op:?} {shape:?}");
                assert!(
                    count.values().all(|&c| c == copies),
                    "{op:?} {shape:?}: each element held by {copies} warps"
                );
            }
        }
    }

    #[test]
    fn an_accumulator_of_two_n8_tiles_is_an_a_operand_bit_for_bit() {
        // P (the result of S = Q·Kᵀ, [16, 16] in C layout) as the A operand of P·V.
        let c = one_warp(MmaOperand::Acc).linear(&[16, 16]);
        let a = one_warp(MmaOperand::A).linear(&[16, 16]);
        let w = crate::back::ptx::layout::identity_weights(&[16, 16]);
        let map = crate::back::ptx::layout::free_remap(&c, &a, &w);
        assert!(map.is_some(), "C -> A needs no exchange between threads");
    }

    #[test]
    fn the_warp_grid_keeps_parts_square() {
        assert_eq!(warp_grid(128, 128, 4), [2, 2]);
        assert_eq!(warp_grid(128, 128, 8), [2, 4]);
        assert_eq!(warp_grid(256, 128, 8), [4, 2]);
        assert_eq!(warp_grid(64, 256, 4), [1, 4]);
        assert_eq!(warp_grid(16, 8, 4), [4, 1], "replicas along M");
        assert!(!mma_shape_ok(16, 8, 16, [4, 1], MmaKind::F16));
        assert!(mma_shape_ok(16, 8, 8, [1, 1], MmaKind::Tf32));
        assert!(
            !mma_shape_ok(16, 8, 8, [1, 1], MmaKind::F16),
            "k8 is TF32's only"
        );
        assert!(!mma_shape_ok(16, 8, 4, [1, 1], MmaKind::Tf32));
    }
}
