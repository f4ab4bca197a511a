//! The per-kernel shared-memory allocator: named buffers with sizes, alignments (up to
//! 1024 bytes) and lifetimes.
//!
//! Lowering runs in program order and asks for a buffer where it first needs one
//! ([`Allocator::alloc`]) and gives it back where its use ends ([`Allocator::free`]). A
//! buffer used across a loop is allocated before the loop and freed after it; a layout
//! conversion's or a reduction's temporary is allocated and freed around its use. So
//! "alive at the same time" is exactly "lifetimes overlap", and first fit among the
//! buffers alive at the moment gives buffers whose lifetimes don't overlap the same
//! bytes.
//!
//! Assumes: the shared array itself starts at a multiple of [`MAX_ALIGN`] (`kg_smem` is
//! declared `.align 1024`); alignments are powers of two ≤ `MAX_ALIGN`.
//! Guarantees: two buffers alive at the same time never share a byte; every buffer's
//! offset is a multiple of its alignment; [`Allocator::peak`] is the end of the highest
//! byte ever handed out (the kernel's shared-memory size), and
//! [`Allocator::at_peak`] names the buffers alive when it was reached (what a
//! "too much shared memory" diagnostic lists). It does not synchronize: whether threads
//! must wait before reusing bytes is `sync::Tracker`'s question.

/// The largest alignment a buffer may ask for (128-byte swizzled atoms need 1024).
pub const MAX_ALIGN: u32 = 1024;

/// A buffer handed out by the allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(u32);

#[derive(Clone, Debug)]
struct Buffer {
    name: String,
    offset: u32,
    bytes: u32,
    live: bool,
}

/// A buffer as reported: its name, offset and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub name: String,
    pub offset: u32,
    pub bytes: u32,
}

#[derive(Clone, Debug, Default)]
pub struct Allocator {
    bufs: Vec<Buffer>,
    peak: u32,
    at_peak: Vec<BufId>,
    max_align: u32,
}

impl Allocator {
    pub fn new() -> Allocator {
        Allocator::default()
    }

    /// A buffer of `bytes` bytes (at least 1) aligned to `align` (a power of two, raised
    /// to at least 4 and capped at [`MAX_ALIGN`]), at the lowest offset that no live
    /// buffer uses.
    pub fn alloc(&mut self, name: impl Into<String>, bytes: u32, align: u32) -> BufId {
        let align = align.clamp(4, MAX_ALIGN).next_power_of_two();
        self.max_align = self.max_align.max(align);
        let bytes = bytes.max(1);
        let offset = self.first_fit(bytes, align);
        let id = BufId(self.bufs.len() as u32);
        self.bufs.push(Buffer {
            name: name.into(),
            offset,
            bytes,
            live: true,
        });
        let end = offset.saturating_add(bytes);
        if end > self.peak {
            self.peak = end;
            self.at_peak = self.live_ids();
        }
        id
    }

    /// Where a buffer of `bytes` allocated now would end (the live buffers stay put):
    /// what a caller that can do with less checks against the target's limit first.
    pub fn end_if_allocated(&self, bytes: u32, align: u32) -> u32 {
        let align = align.clamp(4, MAX_ALIGN).next_power_of_two();
        let bytes = bytes.max(1);
        self.first_fit(bytes, align).saturating_add(bytes)
    }

    /// The lowest offset, a multiple of `align`, where `bytes` bytes overlap no live
    /// buffer.
    fn first_fit(&self, bytes: u32, align: u32) -> u32 {
        let mut live: Vec<(u32, u32)> = self
            .bufs
            .iter()
            .filter(|b| b.live)
            .map(|b| (b.offset, b.offset.saturating_add(b.bytes)))
            .collect();
        live.sort_unstable();
        let mut offset = 0u32;
        for (lo, hi) in live {
            if offset.saturating_add(bytes) <= lo {
                break;
            }
            if hi > offset {
                offset = hi.div_ceil(align).saturating_mul(align);
            }
        }
        offset
    }

    /// Ends the lifetime of `id`: later buffers may take its bytes.
    pub fn free(&mut self, id: BufId) {
        if let Some(b) = self.bufs.get_mut(id.0 as usize) {
            b.live = false;
        }
    }

    pub fn offset(&self, id: BufId) -> u32 {
        self.bufs.get(id.0 as usize).map_or(0, |b| b.offset)
    }

    pub fn bytes(&self, id: BufId) -> u32 {
        self.bufs.get(id.0 as usize).map_or(0, |b| b.bytes)
    }

    /// The byte range `offset..offset + bytes` of `id`.
    pub fn range(&self, id: BufId) -> std::ops::Range<u32> {
        let o = self.offset(id);
        o..o.saturating_add(self.bytes(id))
    }

    /// The largest alignment any buffer asked for (what the shared array's declaration
    /// must promise; at least 16).
    pub fn max_align(&self) -> u32 {
        self.max_align.max(16)
    }

    /// The kernel's shared-memory size so far.
    pub fn peak(&self) -> u32 {
        self.peak
    }

    /// The buffers alive when the peak was reached, by offset.
    pub fn at_peak(&self) -> Vec<Placed> {
        let mut v: Vec<Placed> = self
            .at_peak
            .iter()
            .filter_map(|id| self.bufs.get(id.0 as usize))
            .map(|b| Placed {
                name: b.name.clone(),
                offset: b.offset,
                bytes: b.bytes,
            })
            .collect();
        v.sort_by_key(|p| p.offset);
        v
    }

    fn live_ids(&self) -> Vec<BufId> {
        (0..self.bufs.len() as u32)
            .map(BufId)
            .filter(|id| self.bufs[id.0 as usize].live)
            .collect()
    }
}

/// "`a` (4096 bytes at 0), `b` (...)": the buffers of a shared-memory diagnostic.
pub fn describe(bufs: &[Placed]) -> String {
    bufs.iter()
        .map(|b| format!("`{}` ({} bytes at {})", b.name, b.bytes, b.offset))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlaps(a: &std::ops::Range<u32>, b: &std::ops::Range<u32>) -> bool {
        a.start < b.end && b.start < a.end
    }

    #[test]
    fn buffers_alive_together_never_share_bytes() {
        let mut a = Allocator::new();
        let x = a.alloc("x", 1000, 16);
        let y = a.alloc("y", 4096, 1024);
        let z = a.alloc("z", 24, 8);
        for (p, q) in [(x, y), (x, z), (y, z)] {
            assert!(!overlaps(&a.range(p), &a.range(q)), "{p:?} {q:?}");
        }
        assert_eq!(a.offset(x), 0);
        assert_eq!(a.offset(y), 1024, "aligned past x");
        assert_eq!(a.offset(z), 1000, "the gap below y is first fit");
        assert_eq!(a.peak(), 1024 + 4096);
        let names: Vec<String> = a.at_peak().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["x", "y"]);
    }

    #[test]
    fn buffers_whose_lifetimes_do_not_overlap_share_bytes() {
        let mut a = Allocator::new();
        let ring = a.alloc("ring", 3 * 8192, 1024);
        let t1 = a.alloc("convert", 2048, 16);
        a.free(t1);
        let t2 = a.alloc("reduce", 512, 16);
        assert_eq!(
            a.offset(t2),
            a.offset(t1),
            "a freed temporary's bytes are reused"
        );
        assert!(!overlaps(&a.range(ring), &a.range(t2)));
        a.free(t2);
        a.free(ring);
        let epilogue = a.alloc("epilogue", 16384, 16);
        assert_eq!(
            a.offset(epilogue),
            0,
            "after the loop, the ring's bytes are free"
        );
        assert_eq!(a.peak(), 3 * 8192 + 2048);
    }

    #[test]
    fn end_if_allocated_is_where_alloc_puts_it() {
        let mut a = Allocator::new();
        let ring = a.alloc("ring", 3 * 8192, 1024);
        let hole = a.alloc("hole", 100, 16);
        let _top = a.alloc("top", 64, 16);
        a.free(hole);
        // Fits in the freed hole; does not; past everything.
        for (bytes, align) in [(96, 16), (200, 16), (5000, 1024)] {
            let end = a.end_if_allocated(bytes, align);
            let peak = a.peak();
            let id = a.alloc("probe", bytes, align);
            assert_eq!(a.range(id).end, end, "{bytes} bytes");
            assert!(!overlaps(&a.range(ring), &a.range(id)));
            a.free(id);
            assert!(a.peak() >= peak);
        }
    }

    #[test]
    fn random_lifetimes_respect_alignment_and_disjointness() {
        // A deterministic pseudo-random sequence of allocs and frees.
        let mut s = 0x9e37_79b9_u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut a = Allocator::new();
        let mut live: Vec<BufId> = Vec::new();
        for _ in 0..2000 {
            if !live.is_empty() && next() % 3 == 0 {
                let k = (next() as usize) % live.len();
                a.free(live.swap_remove(k));
                continue;
            }
            let align = 1 << (2 + next() % 9);
            let bytes = 1 + (next() % 5000) as u32;
            let id = a.alloc("b", bytes, align);
            assert_eq!(a.offset(id) % align, 0);
            for &o in &live {
                assert!(!overlaps(&a.range(id), &a.range(o)));
            }
            assert!(a.range(id).end <= a.peak());
            live.push(id);
        }
    }
}
