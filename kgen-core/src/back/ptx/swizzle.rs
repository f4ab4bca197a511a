//! Shared-memory layouts of tiles: where element `(r, c)` of a 2-D tile lives, as a byte
//! offset from its buffer's base.
//!
//! Every writer of a staged tile (`cp.async`, `st.shared`, `stmatrix`, and in part 2 the
//! TMA engine) and every reader (`ld.shared`, `ldmatrix`, and in part 2 the wgmma
//! descriptors) computes its addresses through [`SharedTile::offset`], so they agree by
//! construction.
//!
//! A tile is described in *storage order*: `rows` along its outer dimension and `cols`
//! along the dimension that is contiguous in memory (for a `[K, N]` tile of a row-major
//! B, rows are K and columns N; for a transposed operand the other way round).
//!
//! The contiguous dimension is cut into *atoms* of `swizzle` bytes per row (32, 64 or
//! 128). Atom `a` holds columns `a * atom_cols .. (a + 1) * atom_cols` of every row,
//! `rows * swizzle` bytes, one atom after another. Inside an atom, the natural offset
//! `o = r * swizzle + (c mod atom_cols) * elem_bytes` is stored at
//! `o ^ (((o >> 7) & mask) << 4)` with `mask = swizzle / 16 - 1`: bits 4.. of the offset
//! (which 16-byte chunk) are XORed with bits 7.. (which 128-byte line). That is
//! CUTLASS's `Swizzle<B, 4, 3>`, the TMA swizzle modes `CU_TENSOR_MAP_SWIZZLE_{32B, 64B,
//! 128B}` and the wgmma descriptor's swizzle field.
//!
//! Assumes: `rows` and `cols` are powers of two (padded tile extents); a buffer holding
//! a swizzled tile starts at a multiple of [`Swizzle::atom_align`] (the allocator's job),
//! so the XOR on offsets is the same as the XOR on addresses that the hardware applies.
//! Guarantees: `offset` is a bijection from the tile's elements onto `0..bytes()`; a
//! 16-byte chunk (8 halves, 4 words) stays 16 contiguous bytes, so `cp.async` of 16 bytes
//! and `ldmatrix` rows address whole chunks; eight consecutive rows (from a multiple of
//! 8) at the same column chunk land in eight different 16-byte bank groups when the
//! swizzle is on (`ldmatrix` and its `.trans` form read without bank conflicts).

/// An XOR swizzle of 16-byte chunks inside 128-byte lines (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Swizzle {
    /// No swizzle: the natural row-major offset.
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    /// Bytes of one atom row (the swizzle span); 0 for `None`.
    pub fn bytes(self) -> u32 {
        match self {
            Swizzle::None => 0,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }

    /// The chunk-index bits that are XORed (`Swizzle<B, 4, 3>`'s `2^B - 1`).
    pub fn mask(self) -> u32 {
        (self.bytes() / 16).saturating_sub(1)
    }

    /// The alignment an atom's base needs for the offset XOR to equal the address XOR:
    /// eight lines of the swizzle span (1024 bytes for 128-byte swizzle).
    pub fn atom_align(self) -> u32 {
        match self {
            Swizzle::None => 16,
            s => 8 * s.bytes(),
        }
    }

    /// Applies the swizzle to a byte offset inside an atom.
    pub fn apply(self, o: u32) -> u32 {
        o ^ (((o >> 7) & self.mask()) << 4)
    }

    /// `CUtensorMapSwizzle` (NONE = 0, 32B = 1, 64B = 2, 128B = 3), for part 2's tensor
    /// maps.
    pub fn tensor_map_code(self) -> u32 {
        match self {
            Swizzle::None => 0,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        }
    }

    /// The wgmma shared-memory descriptor's layout field, bits 62–63 (none = 0, 128B =
    /// 1, 64B = 2, 32B = 3), for part 2.
    pub fn descriptor_code(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B128 => 1,
            Swizzle::B64 => 2,
            Swizzle::B32 => 3,
        }
    }

    /// The widest swizzle whose span fits a row of `row_bytes` with at least eight rows
    /// (fewer rows, or rows under 32 bytes, are stored unswizzled).
    pub fn widest_for(rows: u32, row_bytes: u32) -> Swizzle {
        if rows < 8 {
            return Swizzle::None;
        }
        match row_bytes {
            b if b >= 128 => Swizzle::B128,
            b if b >= 64 => Swizzle::B64,
            b if b >= 32 => Swizzle::B32,
            _ => Swizzle::None,
        }
    }
}

/// A 2-D tile's layout in shared memory (storage order; see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SharedTile {
    pub rows: u32,
    pub cols: u32,
    pub elem_bytes: u32,
    pub swizzle: Swizzle,
}

impl SharedTile {
    /// A tile with the widest swizzle its rows allow.
    pub fn new(rows: u32, cols: u32, elem_bytes: u32) -> SharedTile {
        let swizzle = Swizzle::widest_for(rows, cols * elem_bytes);
        SharedTile {
            rows,
            cols,
            elem_bytes,
            swizzle,
        }
    }

    pub fn row_bytes(&self) -> u32 {
        self.cols * self.elem_bytes
    }

    /// Bytes the tile occupies.
    pub fn bytes(&self) -> u32 {
        self.rows * self.row_bytes()
    }

    /// The alignment the buffer's base needs.
    pub fn align(&self) -> u32 {
        self.swizzle.atom_align().max(16)
    }

    /// Columns per atom (the whole row when unswizzled).
    pub fn atom_cols(&self) -> u32 {
        match self.swizzle {
            Swizzle::None => self.cols,
            s => s.bytes() / self.elem_bytes,
        }
    }

    /// Bytes of one atom (every row's span of it).
    pub fn atom_bytes(&self) -> u32 {
        self.rows * self.atom_cols() * self.elem_bytes
    }

    /// Byte offset of element `(r, c)`.
    pub fn offset(&self, r: u32, c: u32) -> u32 {
        let ac = self.atom_cols();
        let span = ac * self.elem_bytes;
        let atom = c / ac;
        let natural = r * span + (c % ac) * self.elem_bytes;
        atom * self.atom_bytes() + self.swizzle.apply(natural)
    }

    /// Byte offset of the 16-byte chunk that holds columns `chunk * (16 / elem_bytes)
    /// ..` of row `r` (its first element's offset; the chunk is contiguous).
    pub fn chunk_offset(&self, r: u32, chunk: u32) -> u32 {
        self.offset(r, chunk * (16 / self.elem_bytes))
    }

    /// Elements per 16-byte chunk.
    pub fn chunk_elems(&self) -> u32 {
        16 / self.elem_bytes
    }

    /// 16-byte chunks per row.
    pub fn chunks_per_row(&self) -> u32 {
        self.row_bytes() / 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn tiles() -> Vec<SharedTile> {
        let mut v = Vec::new();
        for eb in [2u32, 4] {
            for rows in [1u32, 2, 8, 16, 64, 128] {
                for cols in [8u32, 16, 32, 64, 128, 256] {
                    if cols * eb < 16 {
                        continue;
                    }
                    for sw in [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128] {
                        if sw.bytes() > cols * eb {
                            continue;
                        }
                        v.push(SharedTile {
                            rows,
                            cols,
                            elem_bytes: eb,
                            swizzle: sw,
                        });
                    }
                }
            }
        }
        v
    }

    #[test]
    fn every_layout_is_a_bijection_onto_its_bytes() {
        for t in tiles() {
            let mut seen = HashSet::new();
            for r in 0..t.rows {
                for c in 0..t.cols {
                    let o = t.offset(r, c);
                    assert!(o + t.elem_bytes <= t.bytes(), "{t:?} ({r},{c}) -> {o}");
                    assert_eq!(o % t.elem_bytes, 0, "{t:?}: misaligned element");
                    assert!(seen.insert(o), "{t:?}: ({r},{c}) collides at {o}");
                }
            }
            assert_eq!(seen.len() as u32 * t.elem_bytes, t.bytes());
        }
    }

    #[test]
    fn a_chunk_written_by_cp_async_is_the_chunk_ldmatrix_reads() {
        // Writer: copies 16 contiguous global bytes (columns chunk*n .. +n of row r) to
        // chunk_offset(r, chunk). Reader: element (r, c) at offset(r, c). They must agree
        // element by element.
        for t in tiles() {
            let n = t.chunk_elems();
            for r in 0..t.rows {
                for chunk in 0..t.chunks_per_row() {
                    let base = t.chunk_offset(r, chunk);
                    assert_eq!(base % 16, 0, "{t:?}: chunk not 16-byte aligned");
                    for e in 0..n {
                        assert_eq!(
                            t.offset(r, chunk * n + e),
                            base + e * t.elem_bytes,
                            "{t:?}: row {r} chunk {chunk} element {e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn eight_rows_of_one_chunk_hit_eight_bank_groups_when_swizzled() {
        // ldmatrix (and .trans) reads eight 16-byte rows per 8x8 matrix: rows r0..r0+8 at
        // one chunk. 32 banks of 4 bytes = eight 16-byte groups.
        for t in tiles() {
            if t.swizzle == Swizzle::None || t.rows < 8 {
                continue;
            }
            for r0 in (0..t.rows).step_by(8) {
                for chunk in 0..t.chunks_per_row() {
                    let groups: HashSet<u32> = (r0..r0 + 8)
                        .map(|r| (t.chunk_offset(r, chunk) / 16) % 8)
                        .collect();
                    assert_eq!(groups.len(), 8, "{t:?}: rows {r0}.. chunk {chunk}");
                }
            }
        }
    }

    #[test]
    fn the_swizzle_matches_cutlass_swizzle_b_4_3_on_addresses() {
        // Swizzle<B,4,3>: addr ^ ((addr & (mask << 7)) >> 3), on an atom-aligned base.
        for sw in [Swizzle::B32, Swizzle::B64, Swizzle::B128] {
            let b = sw.mask();
            for base in [0u32, sw.atom_align(), 5 * sw.atom_align()] {
                for o in (0..sw.atom_align()).step_by(2) {
                    let addr = base + o;
                    let cutlass = addr ^ ((addr & (b << 7)) >> 3);
                    assert_eq!(base + sw.apply(o), cutlass, "{sw:?} base {base} o {o}");
                }
            }
        }
    }

    #[test]
    fn the_widest_swizzle_fits_the_row() {
        assert_eq!(SharedTile::new(128, 64, 2).swizzle, Swizzle::B128);
        assert_eq!(SharedTile::new(128, 32, 2).swizzle, Swizzle::B64);
        assert_eq!(SharedTile::new(128, 16, 2).swizzle, Swizzle::B32);
        assert_eq!(SharedTile::new(128, 8, 2).swizzle, Swizzle::None);
        assert_eq!(SharedTile::new(4, 64, 2).swizzle, Swizzle::None);
        // Wider rows are cut into 128-byte atoms.
        let t = SharedTile::new(64, 128, 2);
        assert_eq!((t.atom_cols(), t.atom_bytes()), (64, 64 * 128));
        assert_eq!(t.offset(0, 64), 64 * 128);
        assert_eq!(Swizzle::B128.atom_align(), 1024);
    }
}
