//! Distributed tile layouts: which thread holds which tile element in which register.
//!
//! Two levels, Triton-style:
//! - [`Layout`] is the *named*, shape-independent description a pass decides on:
//!   `Uniform` (scalars), `Blocked` (the coalesced default), `Slice` (what a reduction
//!   leaves), or `Linear` (a layout derived by a shape operation). MMA fragment layouts
//!   (mma.sync m16n8k16 operands/accumulators, wgmma accumulators) become new variants
//!   whose [`Layout::linear`] spells their lane/register bits.
//! - [`Linear`] is the canonical form every consumer uses. Tile extents are padded to
//!   powers of two; every *bit* of a padded coordinate is owned by exactly one register
//!   bit, lane bit or warp bit. A lane or warp bit that owns no coordinate bit is a
//!   *replica* bit (several threads hold the same element). So for register `i` of a
//!   thread, the coordinate along dim `d` is `thread_part(d) + reg_part(i, d)`, where the
//!   thread part is a sum of bit fields of `%tid.x` (affine in lane/warp id) and the
//!   register part is a constant ([`Linear::reg_coord`]).
//!
//! Shared-memory layouts (swizzled) describe addresses, not distribution; they will be a
//! separate enum beside this one.
//!
//! Assumes: padded extents are powers of two; the warp count is a power of two ≤ 32.
//! Guarantees: `Layout::linear(shape)` always covers each padded coordinate bit exactly
//! once, so lowering can rely on the bijection (up to replica bits).

// Coordinates index several parallel per-dimension arrays at once.
#![allow(clippy::needless_range_loop)]

use std::fmt;

/// A coordinate bit: `(dim, bit)`.
pub type CBit = (u8, u8);

/// Canonical, shape-specific layout (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Linear {
    /// Padded extents (powers of two).
    pub shape: Vec<u32>,
    /// Register bit `j` of the register index owns this coordinate bit.
    pub regs: Vec<CBit>,
    /// Lane bit `h` (bit `h` of `%tid.x`) owns this coordinate bit, or is a replica bit.
    pub lanes: [Option<CBit>; 5],
    /// Warp bit `w` (bit `5 + w` of `%tid.x`) owns this coordinate bit, or is a replica bit.
    pub warps: Vec<Option<CBit>>,
}

/// The next power of two ≥ `n` (≥ 1).
pub fn pad_pow2(n: u32) -> u32 {
    n.max(1).next_power_of_two()
}

/// Padded shape of a tile shape.
pub fn padded(shape: &[u32]) -> Vec<u32> {
    shape.iter().map(|&d| pad_pow2(d)).collect()
}

fn log2(n: u32) -> u32 {
    n.max(1).trailing_zeros()
}

/// Row-major strides of a shape.
pub fn row_major_strides(shape: &[u32]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as u64;
    }
    s
}

impl Linear {
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn num_regs(&self) -> usize {
        1usize << self.regs.len()
    }

    pub fn num_warps(&self) -> u32 {
        1 << self.warps.len()
    }

    /// The constant (register) part of the coordinate of register `r`.
    pub fn reg_coord(&self, r: usize) -> Vec<u32> {
        let mut c = vec![0u32; self.rank()];
        for (j, &(d, b)) in self.regs.iter().enumerate() {
            if r >> j & 1 == 1 {
                c[d as usize] |= 1 << b;
            }
        }
        c
    }

    /// The register whose register part is `coord`, if every set bit of `coord` is a
    /// register bit.
    pub fn reg_index(&self, coord: &[u32]) -> Option<usize> {
        let mut r = 0usize;
        for (d, &c) in coord.iter().enumerate() {
            let mut bits = c;
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let j = self.regs.iter().position(|&x| x == (d as u8, b as u8))?;
                r |= 1 << j;
            }
        }
        Some(r)
    }

    /// `%tid.x` bits with no coordinate bit (replica bits).
    pub fn replica_mask(&self) -> u32 {
        let mut m = 0;
        for (h, l) in self.lanes.iter().enumerate() {
            if l.is_none() {
                m |= 1 << h;
            }
        }
        for (w, l) in self.warps.iter().enumerate() {
            if l.is_none() {
                m |= 1 << (5 + w);
            }
        }
        m
    }

    /// `(tid bit, coordinate bit)` pairs that make up the thread part along `dim`.
    pub fn thread_bits(&self, dim: usize) -> Vec<(u32, u32)> {
        let hw = self
            .lanes
            .iter()
            .enumerate()
            .map(|(h, l)| (h as u32, *l))
            .chain(
                self.warps
                    .iter()
                    .enumerate()
                    .map(|(w, l)| (5 + w as u32, *l)),
            );
        hw.filter_map(|(h, l)| match l {
            Some((d, b)) if d as usize == dim => Some((h, b as u32)),
            _ => None,
        })
        .collect()
    }

    /// Warp bits (`w`) that own bits of `dim`.
    pub fn warp_bits_of(&self, dim: usize) -> Vec<u32> {
        (0..self.warps.len() as u32)
            .filter(|&w| matches!(self.warps[w as usize], Some((d, _)) if d as usize == dim))
            .collect()
    }

    /// Lane bits (`h`) that own bits of `dim`.
    pub fn lane_bits_of(&self, dim: usize) -> Vec<u32> {
        (0..5u32)
            .filter(|&h| matches!(self.lanes[h as usize], Some((d, _)) if d as usize == dim))
            .collect()
    }

    /// How many consecutive elements along `dim` (from a multiple of that count) one
    /// thread holds in registers: `2^k` where coordinate bits `0..k` are register bits.
    pub fn contiguity(&self, dim: usize) -> u32 {
        let mut k = 0;
        while self.regs.contains(&(dim as u8, k as u8)) {
            k += 1;
        }
        1 << k
    }

    /// True when no lane or warp bit owns a bit of `dim` (the thread part is 0).
    pub fn dim_in_regs_only(&self, dim: usize) -> bool {
        self.thread_bits(dim).is_empty()
    }

    /// The same distribution over another shape of the same rank. Dims that shrink lose
    /// their high bits (lane/warp bits become replica bits, register bits are dropped);
    /// dims that grow take free lane bits, then free warp bits, then new register bits.
    pub fn resize(&self, shape: &[u32]) -> Linear {
        let shape = padded(shape);
        let keep = |cb: &CBit| (cb.1 as u32) < log2(shape[cb.0 as usize]);
        let mut out = Linear {
            shape: shape.clone(),
            regs: self.regs.iter().copied().filter(keep).collect(),
            lanes: self.lanes.map(|l| l.filter(keep)),
            warps: self.warps.iter().map(|l| l.filter(keep)).collect(),
        };
        for d in 0..shape.len() {
            let have = log2(self.shape.get(d).copied().unwrap_or(1));
            for b in have..log2(shape[d]) {
                let cb = (d as u8, b as u8);
                if let Some(slot) = out.lanes.iter_mut().find(|l| l.is_none()) {
                    *slot = Some(cb);
                } else if let Some(slot) = out.warps.iter_mut().find(|l| l.is_none()) {
                    *slot = Some(cb);
                } else {
                    out.regs.push(cb);
                }
            }
        }
        out
    }

    /// Removes `dim`, whose bits become replica bits (lane/warp) or are dropped
    /// (registers): the layout of a reduction's result.
    pub fn drop_dim(&self, dim: usize) -> Linear {
        let dim = dim as u8;
        let f = |cb: CBit| -> Option<CBit> {
            match cb.0.cmp(&dim) {
                std::cmp::Ordering::Less => Some(cb),
                std::cmp::Ordering::Equal => None,
                std::cmp::Ordering::Greater => Some((cb.0 - 1, cb.1)),
            }
        };
        let mut shape = self.shape.clone();
        shape.remove(dim as usize);
        Linear {
            shape,
            regs: self.regs.iter().filter_map(|&c| f(c)).collect(),
            lanes: self.lanes.map(|l| l.and_then(f)),
            warps: self.warps.iter().map(|l| l.and_then(f)).collect(),
        }
    }

    /// The half of the tile where coordinate bit `cb` (a register bit) is fixed, as a
    /// layout of its own: `cb`'s dim halved, its higher bits moved down one, and the
    /// register bit removed. Also returns that register bit's index: register `r` of
    /// `self` is in half `r >> j & 1`, at the index `r` has with bit `j` taken out.
    pub fn split_reg_bit(&self, cb: CBit) -> Option<(Linear, usize)> {
        let j = self.regs.iter().position(|&x| x == cb)?;
        let f = |x: CBit| -> Option<CBit> {
            if x.0 != cb.0 || x.1 < cb.1 {
                Some(x)
            } else {
                Some((x.0, x.1 - 1))
            }
        };
        let mut shape = self.shape.clone();
        shape[cb.0 as usize] /= 2;
        let mut regs = self.regs.clone();
        regs.remove(j);
        Some((
            Linear {
                shape,
                regs: regs.into_iter().filter_map(f).collect(),
                lanes: self.lanes.map(|l| l.and_then(f)),
                warps: self.warps.iter().map(|l| l.and_then(f)).collect(),
            },
            j,
        ))
    }

    /// Renames every coordinate bit through `f` (a bijection between the coordinate bits
    /// of `self.shape` and those of `shape`): permute, expand_dims, squeeze-like and
    /// power-of-two reshapes.
    pub fn relabel(&self, shape: &[u32], f: impl Fn(CBit) -> Option<CBit>) -> Linear {
        Linear {
            shape: padded(shape),
            regs: self.regs.iter().filter_map(|&c| f(c)).collect(),
            lanes: self.lanes.map(|l| l.and_then(&f)),
            warps: self.warps.iter().map(|l| l.and_then(&f)).collect(),
        }
    }

    /// Maps a coordinate bit of this shape to its bit position in the row-major linear
    /// index over the padded shape, and back.
    pub fn linear_bit(shape: &[u32], cb: CBit) -> u32 {
        let strides = row_major_strides(shape);
        log2(strides[cb.0 as usize] as u32) + cb.1 as u32
    }

    pub fn from_linear_bit(shape: &[u32], pos: u32) -> Option<CBit> {
        let strides = row_major_strides(shape);
        for d in 0..shape.len() {
            let lo = log2(strides[d] as u32);
            if pos >= lo && pos < lo + log2(shape[d]) {
                return Some((d as u8, (pos - lo) as u8));
            }
        }
        None
    }
}

/// A coordinate map between two tiles given by per-dim weights: the source element of
/// destination coordinate `c` is at padded row-major source index `sum(c[d] * w[d])`.
/// Every weight is 0 or a power of two, so the map sends each destination coordinate bit
/// to one source coordinate bit or to nothing (broadcast).
pub fn weight_bit(src_shape: &[u32], weights: &[u64], cb: CBit) -> Option<CBit> {
    let w = *weights.get(cb.0 as usize)?;
    if w == 0 || !w.is_power_of_two() {
        return None;
    }
    Linear::from_linear_bit(src_shape, w.trailing_zeros() + cb.1 as u32)
}

/// When moving a tile from `src` to `dst` under `weights` needs no data exchange
/// between threads, the source register of each destination register.
pub fn free_remap(src: &Linear, dst: &Linear, weights: &[u64]) -> Option<Vec<usize>> {
    let f = |cb: Option<CBit>| cb.and_then(|cb| weight_bit(&src.shape, weights, cb));
    if src.warps.len() != dst.warps.len() {
        return None;
    }
    for h in 0..5 {
        if f(dst.lanes[h]) != src.lanes[h] {
            return None;
        }
    }
    for w in 0..dst.warps.len() {
        if f(dst.warps[w]) != src.warps[w] {
            return None;
        }
    }
    let mut bit_src = Vec::with_capacity(dst.regs.len());
    for &cb in &dst.regs {
        match f(Some(cb)) {
            None => bit_src.push(None),
            Some(s) => bit_src.push(Some(src.regs.iter().position(|&x| x == s)?)),
        }
    }
    Some(
        (0..dst.num_regs())
            .map(|r| {
                bit_src
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| r >> j & 1 == 1)
                    .filter_map(|(_, s)| *s)
                    .fold(0usize, |acc, k| acc | 1 << k)
            })
            .collect(),
    )
}

/// How many of `lin`'s registers, from a multiple of that count, hold consecutive
/// elements of its padded row-major order (log2): `k` where register bit `j` owns
/// row-major index bit `j` for every `j < k`. A thread then writes such a group with one
/// vector store at an offset that is a multiple of the group (its lane and warp bits own
/// only higher index bits).
pub fn row_major_vector_bits(lin: &Linear) -> u32 {
    let mut k = 0;
    while let Some(&cb) = lin.regs.get(k as usize) {
        if Linear::linear_bit(&lin.shape, cb) != k {
            break;
        }
        k += 1;
    }
    k
}

/// The read side of [`row_major_vector_bits`] under a weight map (see [`weight_bit`]):
/// `k` where `dst`'s register bit `j` reads source index bit `j` for every `j < k`, and
/// no other register, lane or warp bit of `dst` reads an index bit below `k` (each
/// weight is 0 or a power of two; any other weight gives 0). Registers `r .. r + 2^k`
/// (`r` a multiple of `2^k`) then read consecutive source elements from a multiple of
/// `2^k`: one vector load.
pub fn weighted_vector_bits(dst: &Linear, weights: &[u64]) -> u32 {
    if weights.iter().any(|&w| w != 0 && !w.is_power_of_two()) {
        return 0;
    }
    // The source index bit a destination coordinate bit reads (None: weight 0).
    let index_bit = |cb: CBit| -> Option<u32> {
        let w = *weights.get(cb.0 as usize)?;
        (w != 0).then(|| w.trailing_zeros() + cb.1 as u32)
    };
    let mut k = 0u32;
    while let Some(&cb) = dst.regs.get(k as usize) {
        if index_bit(cb) != Some(k) {
            break;
        }
        k += 1;
    }
    let others = dst.regs[k as usize..]
        .iter()
        .copied()
        .chain(dst.lanes.iter().flatten().copied())
        .chain(dst.warps.iter().flatten().copied());
    for cb in others {
        if let Some(b) = index_bit(cb) {
            if b < k {
                k = b;
            }
        }
    }
    k
}

/// Weights (see [`weight_bit`]) of the identity map (a layout conversion).
pub fn identity_weights(shape: &[u32]) -> Vec<u64> {
    row_major_strides(&padded(shape))
}

/// Weights of `broadcast`: size-1 source dims read index 0.
pub fn broadcast_weights(src: &[u32], dst: &[u32]) -> Vec<u64> {
    let st = row_major_strides(&padded(src));
    (0..dst.len())
        .map(|d| if src.get(d) == Some(&1) { 0 } else { st[d] })
        .collect()
}

/// Weights of `expand_dims(axis)`.
pub fn expand_dims_weights(src: &[u32], axis: usize) -> Vec<u64> {
    let st = row_major_strides(&padded(src));
    (0..=src.len())
        .map(|d| match d.cmp(&axis) {
            std::cmp::Ordering::Less => st[d],
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Greater => st[d - 1],
        })
        .collect()
}

/// Weights of `permute(perm)`: result dim `i` is source dim `perm[i]`.
pub fn permute_weights(src: &[u32], perm: &[u8]) -> Option<Vec<u64>> {
    let st = row_major_strides(&padded(src));
    perm.iter().map(|&p| st.get(p as usize).copied()).collect()
}

/// Weights of a reshape when it is a bit relabeling: the non-unit extents agree (only
/// unit dims come and go), or every extent on both sides is a power of two. `None`
/// otherwise (the row-major index then needs division).
pub fn reshape_weights(src: &[u32], dst: &[u32]) -> Option<Vec<u64>> {
    let st = row_major_strides(&padded(src));
    let src_nu: Vec<usize> = (0..src.len()).filter(|&d| src[d] != 1).collect();
    let dst_nu: Vec<usize> = (0..dst.len()).filter(|&d| dst[d] != 1).collect();
    if src_nu.len() == dst_nu.len() && src_nu.iter().zip(&dst_nu).all(|(&a, &b)| src[a] == dst[b]) {
        let mut w = vec![0u64; dst.len()];
        for (&a, &b) in src_nu.iter().zip(&dst_nu) {
            w[b] = st[a];
        }
        return Some(w);
    }
    if src.iter().chain(dst).all(|d| d.is_power_of_two()) {
        return Some(row_major_strides(dst));
    }
    None
}

/// The relabeled layout that makes a weight map free (the destination distributes
/// exactly as the source does).
pub fn relabel_through(src: &Linear, dst_shape: &[u32], weights: &[u64]) -> Linear {
    // Invert: source bit -> destination bit.
    let dp = padded(dst_shape);
    let mut inv = std::collections::HashMap::new();
    for d in 0..dp.len() {
        for b in 0..log2(dp[d]) {
            let cb = (d as u8, b as u8);
            if let Some(s) = weight_bit(&src.shape, weights, cb) {
                inv.insert(s, cb);
            }
        }
    }
    let out = src.relabel(dst_shape, |cb| inv.get(&cb).copied());
    // Destination bits with no source bit (broadcast dims) are filled like `resize`.
    let mut full = out.clone();
    for d in 0..dp.len() {
        for b in 0..log2(dp[d]) {
            let cb = (d as u8, b as u8);
            let owned = out.regs.contains(&cb)
                || out.lanes.contains(&Some(cb))
                || out.warps.contains(&Some(cb));
            if owned {
                continue;
            }
            if let Some(slot) = full.lanes.iter_mut().find(|l| l.is_none()) {
                *slot = Some(cb);
            } else if let Some(slot) = full.warps.iter_mut().find(|l| l.is_none()) {
                *slot = Some(cb);
            } else {
                full.regs.push(cb);
            }
        }
    }
    full
}

/// Triton's blocked layout: each thread holds `size_per_thread` consecutive elements per
/// dim; lanes and warps tile the rest, `order[0]` the fastest-varying dim; the pattern
/// repeats (more registers) where the tile is larger and wraps (replicas) where smaller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Blocked {
    pub size_per_thread: Vec<u32>,
    pub threads_per_warp: Vec<u32>,
    pub warps_per_cta: Vec<u32>,
    pub order: Vec<usize>,
}

impl Blocked {
    /// The default coalesced layout for a padded shape: `vec` elements per thread along
    /// the last dim, lanes fill the last dim first, then earlier dims, warps likewise;
    /// lanes/warps left over replicate along dim 0. Unit dims take no lanes or warps, so
    /// `[1, N]` and `[N]` distribute identically.
    pub fn default_for(shape: &[u32], vec: u32, num_warps: u32) -> Blocked {
        let p = padded(shape);
        let r = p.len();
        let order: Vec<usize> = (0..r).rev().collect();
        let mut spt = vec![1u32; r];
        if let (Some(s), Some(&pl)) = (spt.last_mut(), p.last()) {
            *s = vec.clamp(1, pl);
        }
        let mut tpw = vec![1u32; r];
        let mut left = 32u32;
        for &d in &order {
            let t = left.min((p[d] / spt[d]).max(1));
            tpw[d] = t;
            left /= t;
        }
        if let Some(t) = tpw.first_mut() {
            *t *= left;
        }
        let mut wpc = vec![1u32; r];
        let mut left = num_warps.max(1);
        for &d in &order {
            let w = left.min((p[d] / (spt[d] * tpw[d])).max(1));
            wpc[d] = w;
            left /= w;
        }
        if let Some(w) = wpc.first_mut() {
            *w *= left;
        }
        Blocked {
            size_per_thread: spt,
            threads_per_warp: tpw,
            warps_per_cta: wpc,
            order,
        }
    }

    pub fn linear(&self, shape: &[u32]) -> Linear {
        let p = padded(shape);
        let r = p.len();
        let nb: Vec<u32> = p.iter().map(|&x| log2(x)).collect();
        let mut next = vec![0u32; r];
        let take = |d: usize, next: &mut Vec<u32>| -> Option<CBit> {
            if next[d] < nb[d] {
                next[d] += 1;
                Some((d as u8, (next[d] - 1) as u8))
            } else {
                None
            }
        };
        let mut regs = Vec::new();
        for &d in &self.order {
            for _ in 0..log2(self.size_per_thread[d]) {
                if let Some(cb) = take(d, &mut next) {
                    regs.push(cb);
                }
            }
        }
        let mut lanes = Vec::new();
        for &d in &self.order {
            for _ in 0..log2(self.threads_per_warp[d]) {
                lanes.push(take(d, &mut next));
            }
        }
        let mut warps = Vec::new();
        for &d in &self.order {
            for _ in 0..log2(self.warps_per_cta[d]) {
                warps.push(take(d, &mut next));
            }
        }
        for &d in &self.order {
            while let Some(cb) = take(d, &mut next) {
                regs.push(cb);
            }
        }
        let mut lane_arr = [None; 5];
        for (h, l) in lanes.into_iter().take(5).enumerate() {
            lane_arr[h] = l;
        }
        Linear {
            shape: p,
            regs,
            lanes: lane_arr,
            warps,
        }
    }
}

/// A named layout (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// A scalar: every thread holds the value in one register.
    Uniform,
    Blocked(Blocked),
    /// `parent` with dimension `dim` removed (the result of a reduction along `dim`).
    Slice {
        parent: Box<Layout>,
        dim: u8,
    },
    /// A layout derived by a shape operation, kept in canonical form; used over other
    /// shapes through [`Linear::resize`].
    Linear(Linear),
    /// A tensor-core fragment layout (`mma.sync` accumulator or operand), see
    /// `mma_layout.rs`.
    Mma(super::mma_layout::MmaLayout),
}

impl Layout {
    /// The canonical form over `shape` (the real, unpadded extents). A scalar gives a
    /// rank-0 layout with one register and every thread a replica.
    pub fn linear(&self, shape: &[u32], num_warps: u32) -> Linear {
        match self {
            Layout::Uniform => Linear {
                shape: Vec::new(),
                regs: Vec::new(),
                lanes: [None; 5],
                warps: vec![None; log2(num_warps) as usize],
            },
            Layout::Blocked(b) if b.order.len() == shape.len() => b.linear(shape),
            Layout::Blocked(_) => Blocked::default_for(shape, 1, num_warps).linear(shape),
            Layout::Slice { parent, dim } => {
                let mut pshape = shape.to_vec();
                let d = (*dim as usize).min(pshape.len());
                pshape.insert(d, 1);
                parent.linear(&pshape, num_warps).drop_dim(d)
            }
            Layout::Linear(l) if l.rank() == shape.len() => l.resize(shape),
            Layout::Linear(_) => Blocked::default_for(shape, 1, num_warps).linear(shape),
            Layout::Mma(m) if shape.len() == 2 => m.linear(shape),
            Layout::Mma(_) => Blocked::default_for(shape, 1, num_warps).linear(shape),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Uniform => f.write_str("uniform"),
            Layout::Blocked(b) => write!(
                f,
                "blocked(spt={:?}, tpw={:?}, wpc={:?}, order={:?})",
                b.size_per_thread, b.threads_per_warp, b.warps_per_cta, b.order
            ),
            Layout::Slice { parent, dim } => write!(f, "slice({parent}, dim={dim})"),
            Layout::Linear(l) => write!(
                f,
                "linear(regs={:?}, lanes={:?}, warps={:?})",
                l.regs, l.lanes, l.warps
            ),
            Layout::Mma(m) => write!(
                f,
                "mma({:?}, warps=[{}, {}])",
                m.operand, m.warps_m, m.warps_n
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_1d_vectorized() {
        let b = Blocked::default_for(&[1024], 4, 4);
        assert_eq!(b.size_per_thread, vec![4]);
        assert_eq!(b.threads_per_warp, vec![32]);
        assert_eq!(b.warps_per_cta, vec![4]);
        let l = b.linear(&[1024]);
        assert_eq!(l.num_regs(), 8);
        assert_eq!(l.contiguity(0), 4);
        assert_eq!(l.reg_coord(4), vec![512]);
        assert_eq!(l.replica_mask(), 0);
    }

    #[test]
    fn unit_dims_match_squeezed() {
        let a = Blocked::default_for(&[1, 1000], 4, 4).linear(&[1, 1000]);
        let b = Blocked::default_for(&[1000], 4, 4).linear(&[1000]);
        let sq = a.relabel(
            &[1000],
            |(d, bit)| if d == 1 { Some((0, bit)) } else { None },
        );
        assert_eq!(sq, b);
    }

    #[test]
    fn small_tile_replicates() {
        let l = Blocked::default_for(&[8], 4, 4).linear(&[8]);
        assert_eq!(l.num_regs(), 4);
        // 1 lane bit owns a coordinate bit; 4 lane bits and 2 warp bits are replicas.
        assert_eq!(l.replica_mask(), 0b1111110);
    }

    #[test]
    fn slice_matches_drop_dim() {
        let p = Layout::Blocked(Blocked::default_for(&[16, 64], 4, 4));
        let full = p.linear(&[16, 64], 4);
        let s = Layout::Slice {
            parent: Box::new(p),
            dim: 1,
        };
        let sl = s.linear(&[16], 4);
        assert_eq!(sl, full.drop_dim(1));
    }

    #[test]
    fn resize_grows_into_free_bits() {
        let l = Blocked::default_for(&[4, 1], 1, 1).linear(&[4, 1]);
        let g = l.resize(&[4, 64]);
        let covered: usize = g.regs.len()
            + g.lanes.iter().filter(|x| x.is_some()).count()
            + g.warps.iter().filter(|x| x.is_some()).count();
        assert_eq!(covered, 2 + 6);
    }
    #[test]
    fn a_split_half_holds_the_registers_of_its_half() {
        let l = Blocked::default_for(&[16, 64], 4, 4).linear(&[16, 64]);
        // The highest register bit of the row dim: rows `b` apart fall in different
        // halves; each half is a [8, 64] tile whose rows skip bit `b`.
        let cb = *l
            .regs
            .iter()
            .filter(|c| c.0 == 0)
            .max()
            .expect("a row register bit");
        let (h, j) = l.split_reg_bit(cb).expect("a register bit");
        assert_eq!(h.shape, vec![8, 64]);
        assert_eq!(h.num_regs() * 2, l.num_regs());
        let squeeze = |row: u32| (row & ((1 << cb.1) - 1)) | ((row >> (cb.1 + 1)) << cb.1);
        for r in 0..l.num_regs() {
            let c = l.reg_coord(r);
            assert_eq!((r >> j & 1) as u32, c[0] >> cb.1 & 1);
            let k = (r & ((1 << j) - 1)) | ((r >> (j + 1)) << j);
            assert_eq!(h.reg_coord(k), vec![squeeze(c[0]), c[1]]);
        }
        assert!(l.split_reg_bit((1, 7)).is_none(), "not a register bit");
    }

    #[test]
    fn vector_bits_of_a_row_major_layout() {
        // 4 consecutive elements per thread along the last dim: 2 vector bits; a layout
        // whose first register bit is a row (dim 0) has none.
        let l = Blocked::default_for(&[16, 64], 4, 4).linear(&[16, 64]);
        assert_eq!(l.contiguity(1), 4);
        assert_eq!(row_major_vector_bits(&l), 2);
        let w = identity_weights(&[16, 64]);
        assert_eq!(weighted_vector_bits(&l, &w), 2);
        let mut rows_first = l.clone();
        rows_first.regs.insert(0, (0, 3));
        assert_eq!(row_major_vector_bits(&rows_first), 0);
        // Transposed reads: the register bits step the source by its row length.
        let t = permute_weights(&[64, 16], &[1, 0]).unwrap();
        assert_eq!(weighted_vector_bits(&l, &t), 0);
        // A broadcast register bit (weight 0) stops the vector.
        let b = vec![64, 0];
        assert_eq!(weighted_vector_bits(&l, &b), 0);
        // A lane bit reading index bit 1 caps the vector at 2 elements.
        let mut clash = l.clone();
        clash.lanes[0] = Some((1, 1));
        assert_eq!(weighted_vector_bits(&clash, &w), 1);
        // A weight that is not a power of two disables vectors.
        assert_eq!(weighted_vector_bits(&l, &[64, 3]), 0);
    }
}
