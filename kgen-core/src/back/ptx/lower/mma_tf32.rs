//! The operand fragments of a TF32 `dot` (`mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`;
//! the instruction loop is `mma.rs`'s).
//!
//! Assumes: `mma.rs` lowers the product (k-steps of 8, a warp grid whose parts hold whole
//! instructions); an operand is a [`StagedView`] of a swizzled shared tile of f32 (the
//! pipeline's ring slots: 16-byte chunks of four elements) or registers of f32 in the
//! operand's `MmaOperand::{ATf32, BTf32}` layout.
//! Guarantees: per k-step `s`, each m-tile's four A registers hold `a[i]` = element
//! `(mi·16 + g + 8·(i & 1), s·8 + t + 4·(i >> 1))` of the warp's part and each n-tile's two
//! B registers `b[i]` = element `(s·8 + t + 4·i, ni·8 + g)` (PTX ISA, "Matrix Fragments
//! for mma.m16n8k8", `.tf32`; `g = lane >> 2`, `t = lane % 4`), as loaded by
//! `tf32_fragments`, then each rounded by `tf32_round_fragments` with
//! `cvt.rna.tf32.f32` (to nearest, ties away from zero: `interp::round_tf32`, so the
//! interpreter rounds as the GPU does; raw f32 bits would leave the rounding to the
//! tensor cores, which the ISA does not pin down). For `tf32x3` the fragments are the
//! `hi` parts and the `lo` parts `cvt.rna.tf32.f32(x - hi)` come beside them
//! (`interp::split_tf32`).
//!
//! Where the fragments come from:
//! - a staged tile whose contiguous dimension is K (A stored `[M, K]`, B stored `[N, K]`:
//!   a transposed operand) is read by `ldmatrix` without `.trans`: an 8 × 8 b16 matrix of
//!   32-bit data is 8 rows of four f32, and lane `L` receives the 32-bit word `L % 4` of
//!   row `L / 4`, which is exactly the tf32 fragment's `(g, t)` element. The lane
//!   addresses are `mma.rs`'s f16 ones (a k-step of 8 f32 is two 16-byte chunks, as one of
//!   16 halves is). `.trans` would transpose 16-bit halves, so
//! - a staged tile whose contiguous dimension is M or N (B stored `[K, N]`, A stored
//!   `[K, M]`) is read element by element with `ld.shared.b32`. An element's swizzled
//!   offset is XOR-linear in its coordinate bits (`SharedTile::offset`: the natural offset
//!   of disjoint bit fields, the swizzle XOR, atoms at power-of-two strides), so it is the
//!   lane's offset (prologue) XORed with the constant coordinates' offset; the bits of
//!   that constant the lane's offset never has are an immediate added to the address, the
//!   others one `xor.b32` (cached per dot).
//! - registers are picked by coordinate from the operand layout (a conversion to it
//!   happened in `mma_source`).

use super::mma::{Fragments, MmaPlan, Source};
use super::staged::StagedView;
use super::{unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::swizzle::SharedTile;
use crate::ir::InputPrecision;
use crate::span::Span;

/// Fills fragment arrays before every slot is set.
const PLACEHOLDER: Reg = Reg {
    class: RegClass::B32,
    n: 0,
};

impl Lowerer<'_> {
    /// The tf32 fragments of k-step `s` as loaded (module docs), not yet rounded
    /// (`tf32_round_fragments`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tf32_fragments(
        &mut self,
        src_a: &Source,
        src_b: &Source,
        s: u32,
        mt: u32,
        nt: u32,
        m_warp: &[(u32, u32)],
        n_warp: &[(u32, u32)],
        plan: MmaPlan,
        span: Span,
    ) -> R<Fragments> {
        let mut raw_a: Vec<[Reg; 4]> = Vec::with_capacity(mt as usize);
        for mi in 0..mt {
            let r = match src_a {
                Source::Staged(v) if !v.transposed => {
                    self.a_fragment(src_a, mi, s, m_warp, plan.ty, span)?
                }
                Source::Staged(v) => {
                    // Storage [K, M]: a[i] at storage (s·8 + t + 4·(i >> 1), mi·16 + g +
                    // 8·(i & 1)), plus the warp's M origin.
                    let mut cols = vec![(2, 0), (3, 1), (4, 2)];
                    cols.extend_from_slice(m_warp);
                    let mut out = [PLACEHOLDER; 4];
                    for (i, o) in out.iter_mut().enumerate() {
                        let i = i as u32;
                        let (row, col) = (s * 8 + 4 * (i >> 1), mi * 16 + 8 * (i & 1));
                        *o = self.tf32_element(v, &[(0, 0), (1, 1)], &cols, row, col);
                    }
                    out
                }
                Source::Regs(regs, lin) => {
                    let mut out = [PLACEHOLDER; 4];
                    for (i, o) in out.iter_mut().enumerate() {
                        let i = i as u32;
                        let c = [mi * 16 + 8 * (i & 1), s * 8 + 4 * (i >> 1)];
                        *o = lin
                            .reg_index(&c)
                            .and_then(|k| regs.get(k).copied())
                            .ok_or_else(|| unsupported(span, "tf32 A operand layout"))?;
                    }
                    out
                }
            };
            raw_a.push(r);
        }
        let mut raw_b: Vec<[Reg; 2]> = Vec::with_capacity(nt as usize);
        let mut ni = 0;
        while ni < nt {
            match src_b {
                Source::Staged(v) if v.transposed => {
                    // Storage [N, K]: ldmatrix of two n-tiles at once where there are two.
                    let pair = nt - ni >= 2;
                    let got = self.b_fragments(src_b, ni, s, pair, n_warp, plan.ty, span)?;
                    raw_b.extend(got);
                    ni += if pair { 2 } else { 1 };
                    continue;
                }
                Source::Staged(v) => {
                    // Storage [K, N]: b[i] at storage (s·8 + t + 4·i, ni·8 + g), plus the
                    // warp's N origin.
                    let mut cols = vec![(2, 0), (3, 1), (4, 2)];
                    cols.extend_from_slice(n_warp);
                    let lo = self.tf32_element(v, &[(0, 0), (1, 1)], &cols, s * 8, ni * 8);
                    let hi = self.tf32_element(v, &[(0, 0), (1, 1)], &cols, s * 8 + 4, ni * 8);
                    raw_b.push([lo, hi]);
                }
                Source::Regs(regs, lin) => {
                    let mut out = [PLACEHOLDER; 2];
                    for (i, o) in out.iter_mut().enumerate() {
                        let c = [s * 8 + 4 * i as u32, ni * 8];
                        *o = lin
                            .reg_index(&c)
                            .and_then(|k| regs.get(k).copied())
                            .ok_or_else(|| unsupported(span, "tf32 B operand layout"))?;
                    }
                    raw_b.push(out);
                }
            }
            ni += 1;
        }
        Ok(Fragments {
            a: raw_a,
            b: raw_b,
            a_lo: Vec::new(),
            b_lo: Vec::new(),
        })
    }

    /// The fragments `tf32_fragments` loaded, rounded to TF32 (for `tf32x3` with their low
    /// parts): done for k-step `s` just before its products, after the next k-step's
    /// loads are issued, so the unrounded next fragments and the rounded current ones are
    /// what is live across the products.
    pub(super) fn tf32_round_fragments(&mut self, raw: Fragments, plan: MmaPlan) -> Fragments {
        let x3 = plan.precision == InputPrecision::Tf32x3;
        let mut f = Fragments {
            a: Vec::with_capacity(raw.a.len()),
            b: Vec::with_capacity(raw.b.len()),
            a_lo: Vec::new(),
            b_lo: Vec::new(),
        };
        for r in raw.a {
            let (hi, lo) = self.tf32_parts(&r, x3);
            f.a.push([hi[0], hi[1], hi[2], hi[3]]);
            if let Some(lo) = lo {
                f.a_lo.push([lo[0], lo[1], lo[2], lo[3]]);
            }
        }
        for r in raw.b {
            let (hi, lo) = self.tf32_parts(&r, x3);
            f.b.push([hi[0], hi[1]]);
            if let Some(lo) = lo {
                f.b_lo.push([lo[0], lo[1]]);
            }
        }
        f
    }

    /// `cvt.rna.tf32.f32` of each register, and for `x3` the low parts
    /// `cvt.rna.tf32.f32(x - hi)` too.
    fn tf32_parts(&mut self, regs: &[Reg], x3: bool) -> (Vec<Reg>, Option<Vec<Reg>>) {
        let hi: Vec<Reg> = regs.iter().map(|&r| self.round_tf32(r)).collect();
        if !x3 {
            return (hi, None);
        }
        let lo = regs
            .iter()
            .zip(&hi)
            .map(|(&x, &h)| {
                let d = self.op1(RegClass::F32, "sub.rn.f32", vec![x.into(), h.into()]);
                self.round_tf32(d)
            })
            .collect();
        (hi, Some(lo))
    }

    /// `cvt.rna.tf32.f32`: `x` rounded to TF32 (to nearest, ties away from zero; the low
    /// 13 bits of the result are zero), in a `.b32` register.
    pub(super) fn round_tf32(&mut self, x: Reg) -> Reg {
        self.op1(RegClass::B32, "cvt.rna.tf32.f32", vec![x.into()])
    }

    /// `ld.shared.b32` of the element of staged tile `v` at storage coordinates
    /// `(row_c + lane row, col_c + lane col)`, where the lane parts are the `%tid.x` bit
    /// fields `rows` and `cols` and their bits are disjoint from those of `row_c` and
    /// `col_c` (module docs).
    fn tf32_element(
        &mut self,
        v: &StagedView,
        rows: &[(u32, u32)],
        cols: &[(u32, u32)],
        row_c: u32,
        col_c: u32,
    ) -> Reg {
        let tile = v.tile;
        let (lane, mask) = self.element_lane_offset(&tile, rows, cols);
        let (kx, ka) = split_constant(&tile, mask, row_c, col_c);
        let key = (v.base, lane, kx);
        let addr = match self.tf32_addrs.get(&key) {
            Some(&a) => a,
            None => {
                let off = if kx != 0 {
                    self.op1(
                        RegClass::B32,
                        "xor.b32",
                        vec![lane.into(), Operand::Imm(kx as i64)],
                    )
                } else {
                    lane
                };
                let a = self.op1(RegClass::B32, "add.s32", vec![v.base.into(), off.into()]);
                self.tf32_addrs.insert(key, a);
                a
            }
        };
        self.op1(
            RegClass::B32,
            "ld.shared.b32",
            vec![Operand::Mem(Addr::Reg(addr), ka as i64)],
        )
    }

    /// The prologue register holding `tile.offset` of a lane's (row, col) bit fields, and
    /// the offset bits it can have (the OR of every lane bit's own offset).
    fn element_lane_offset(
        &mut self,
        tile: &SharedTile,
        rows: &[(u32, u32)],
        cols: &[(u32, u32)],
    ) -> (Reg, u32) {
        let mask = lane_mask(tile, rows, cols);
        let key = (*tile, rows.to_vec(), cols.to_vec());
        if let Some(&r) = self.element_offsets.get(&key) {
            return (r, mask);
        }
        let row = self.tid_bits(rows);
        let col = self.tid_bits(cols);
        let tile = *tile;
        let r = self.in_prologue(|l| {
            let zero = |l: &mut Self| l.op1(RegClass::B32, "mov.b32", vec![Operand::Imm(0)]);
            let row = row.unwrap_or_else(|| zero(l));
            let col = col.unwrap_or_else(|| zero(l));
            l.swizzled_offset(&tile, row, col)
        });
        self.element_offsets.insert(key, r);
        (r, mask)
    }
}

/// The offset bits a lane's part of an element offset can have: the OR of the offsets of
/// each of its coordinate bits alone (`SharedTile::offset` is XOR-linear in them).
fn lane_mask(tile: &SharedTile, rows: &[(u32, u32)], cols: &[(u32, u32)]) -> u32 {
    rows.iter()
        .map(|&(_, b)| tile.offset(1 << b, 0))
        .chain(cols.iter().map(|&(_, b)| tile.offset(0, 1 << b)))
        .fold(0, |m, o| m | o)
}

/// The offset of constant coordinates `(row_c, col_c)` split into the part to XOR into a
/// lane's offset (the bits `mask` says it may have) and the part to add.
fn split_constant(tile: &SharedTile, mask: u32, row_c: u32, col_c: u32) -> (u32, u32) {
    let k = tile.offset(row_c, col_c);
    (k & mask, k & !mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::back::ptx::swizzle::Swizzle;

    /// For the element reads this file makes (lane rows on row bits 0-1, lane columns on
    /// column bits 0-2 and a warp's top bit, constants on the other bits), the lane's
    /// offset XORed with the constant's XOR part plus its added part is the element's
    /// offset, for every lane and constant of every f32 tile the pipeline can stage.
    #[test]
    fn an_element_offset_is_the_lane_offset_xor_and_plus_the_constant() {
        for rows in [8u32, 16, 32, 64] {
            for cols in [8u32, 16, 32, 64, 128, 256] {
                for swizzle in [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128] {
                    if swizzle.bytes() > cols * 4 {
                        continue;
                    }
                    let tile = SharedTile {
                        rows,
                        cols,
                        elem_bytes: 4,
                        swizzle,
                    };
                    let top = cols.trailing_zeros() - 1;
                    let lane_rows = [(0, 0), (1, 1)];
                    let mut lane_cols = vec![(2, 0), (3, 1), (4, 2)];
                    if top > 2 {
                        lane_cols.push((5, top));
                    }
                    let mask = lane_mask(&tile, &lane_rows, &lane_cols);
                    let col_step = 8;
                    let col_top = if top > 2 { cols / 2 } else { cols };
                    for lane in 0..64u32 {
                        let lr = lane & 3;
                        let mut lc = (lane >> 2) & 7;
                        if top > 2 && lane & 32 != 0 {
                            lc |= 1 << top;
                        }
                        let p = tile.offset(lr, lc);
                        assert_eq!(p & !mask, 0, "{tile:?}: lane {lane} outside its mask");
                        for rc in (0..rows).step_by(4) {
                            for cc in (0..col_top).step_by(col_step) {
                                let (kx, ka) = split_constant(&tile, mask, rc, cc);
                                assert_eq!(
                                    (p ^ kx) + ka,
                                    tile.offset(rc + lr, cc + lc),
                                    "{tile:?}: lane {lane} at ({rc}, {cc})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
