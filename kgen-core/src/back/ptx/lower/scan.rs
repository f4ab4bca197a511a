//! Scans along one axis (`cumsum`, `cumprod`, `cummax`, `cummin`, `scan`), in any layout.
//!
//! The axis' coordinate bits are owned by register, lane and warp bits in any mix and
//! order (`layout::Linear`; a `[4097]` row on 16 warps has bits 0-1 in registers, 2-6 in
//! lanes, 7-10 in warps and 11-12 in registers again). Reading them from the lowest up,
//! consecutive bits with the same kind of owner form a *digit*. The scan goes digit by
//! digit: after the digits below, every element holds the scan of its *sub-block* (the
//! elements that differ from it only in those bits) and every thread holds the total of
//! each of its sub-blocks. A digit combines 2^m sub-blocks into one:
//! - registers: in the thread, the exclusive prefix of the sub-block totals, in order;
//! - lanes: a butterfly over the digit's lane bits (`shfl.sync.bfly.b32`, two for 64-bit
//!   values) on the totals: each step takes the partner's total and, in the upper half,
//!   adds it to the exclusive prefix; it works for lane bits in any order, which
//!   `shfl.up` (Hillis–Steele along the lane id) does not;
//! - warps: one shared-memory exchange (one barrier pair). Each thread stores its
//!   totals at (digit value, group) as soon as they are final (during the digit below).
//!   Where m lanes hold no bit of a group (the usual case: a row's lanes hold the axis
//!   below the warps), lane `u` of each group reads digit value `u`'s total, a butterfly
//!   over those lanes scans them, and `shfl.sync.idx` brings each thread the prefix of
//!   its own digit value: one load and a few shuffles per total. Otherwise every thread
//!   reads all 2^m totals and picks its prefix with a tree of selects on its warp bits.
//!
//! Each element then combines that digit's exclusive prefix into its scan. `reverse`
//! reads every digit from the top; `exclusive` starts each element's scan empty instead
//! of with the element. The plan is written against [`Simt`], a tiny SIMT machine: the
//! lowering implements it with PTX, and the tests with a simulator that runs every
//! thread of random layouts and checks that each element combines exactly the elements
//! it should (nothing twice, nothing missing: replicas never double-count).
//!
//! Assumes: the result's layout is the operand's (`assign` keeps it; otherwise the
//! operand is converted first); the op accepts the dtype (validated).
//! Guarantees: the semantics of `ir::Op::Scan`: float `add` and `mul` of f16/bf16 in
//! f32 with each result rounded once; float `max`/`min` by `max.f32` (NaN skipped), whose
//! identity NaN fills the padded slots of a reversed scan (a forward scan never reads
//! them); the identity of float `add` is -0.0, so an inclusive scan is exactly a
//! combination of its elements; an exclusive float `add`/`max`/`min` ends with one
//! combination with its start value (+0.0, -inf, +inf), which makes it the fold from
//! that value. Bool scans run on 0/1 in 32-bit registers. Every thread holding a copy
//! of an element computes it in the same order, so copies agree bit for bit.

// Coordinates index several parallel per-dimension arrays at once.
#![allow(clippy::needless_range_loop)]

use super::{class_of, unsupported, Lowerer, R};
use crate::back::ptx::isa::{Addr, Operand, Reg, RegClass};
use crate::back::ptx::layout::Linear;
use crate::ir::{InstId, Op, ScanOp};
use crate::types::DType;
use std::collections::{BTreeMap, HashMap};

/// The operations a scan plan needs of a SIMT machine: every value has one copy per
/// thread (a register), every predicate too; a thread-id *field* is
/// `Σ ((tid >> h) & 1) << b` over `(h, b)` pairs.
pub(crate) trait Simt {
    type V: Copy + PartialEq;
    type P: Copy;
    /// `a ⊕ b`.
    fn combine(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// `p ? a : b`.
    fn select(&mut self, p: Self::P, a: Self::V, b: Self::V) -> Self::V;
    /// The identity of ⊕ (`x ⊕ id` is `x` for every `x`).
    fn identity(&mut self) -> Self::V;
    /// `v` of the thread whose id differs from this one's in `mask`'s lane bits.
    fn shfl_xor(&mut self, v: Self::V, mask: u32) -> Self::V;
    /// `v` of the lane `(lane & keep) | field(pairs)` of this thread's warp.
    fn shfl_idx(&mut self, v: Self::V, keep: u32, pairs: &[(u32, u32)]) -> Self::V;
    /// Whether bit `h` of the thread id is 1.
    fn tid_bit(&mut self, h: u32) -> Self::P;
    /// Whether the thread-id field `pairs` is below `value`.
    fn tid_field_below(&mut self, pairs: &[(u32, u32)], value: u32) -> Self::P;
    /// Starts a shared-memory exchange of `slots` values (after every thread is done
    /// with the previous use of shared memory).
    fn exchange_begin(&mut self, slots: u32);
    /// Stores `v` at slot `field(pairs) + offset`.
    fn exchange_store(&mut self, v: Self::V, pairs: &[(u32, u32)], offset: u32);
    /// Waits until every store of the exchange is visible.
    fn exchange_barrier(&mut self);
    /// The value at slot `field(pairs) + offset`.
    fn exchange_load(&mut self, pairs: &[(u32, u32)], offset: u32) -> Self::V;
}

/// Who owns one bit of the axis coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// Bit `j` of the register index.
    Reg(u32),
    /// Lane bit `h` (bit `h` of `%tid.x`).
    Lane(u32),
    /// Warp bit `w` (bit `5 + w` of `%tid.x`).
    Warp(u32),
}

impl Owner {
    fn same_kind(self, o: Owner) -> bool {
        matches!(
            (self, o),
            (Owner::Reg(_), Owner::Reg(_))
                | (Owner::Lane(_), Owner::Lane(_))
                | (Owner::Warp(_), Owner::Warp(_))
        )
    }
}

/// Consecutive axis bits `lo..lo + owners.len()` owned by one kind of owner.
struct Digit {
    lo: u32,
    owners: Vec<Owner>,
}

/// The owner of every axis bit (`None` when the layout does not cover one: not a
/// valid `Linear`).
fn digits(lin: &Linear, axis: usize) -> Option<Vec<Digit>> {
    let n = lin.shape.get(axis)?.trailing_zeros();
    let mut out: Vec<Digit> = Vec::new();
    for b in 0..n {
        let cb = Some((axis as u8, b as u8));
        let owner = if let Some(j) = lin.regs.iter().position(|&r| Some(r) == cb) {
            Owner::Reg(j as u32)
        } else if let Some(h) = lin.lanes.iter().position(|&l| l == cb) {
            Owner::Lane(h as u32)
        } else {
            Owner::Warp(lin.warps.iter().position(|&w| w == cb)? as u32)
        };
        match out.last_mut() {
            Some(d) if d.owners.last().is_some_and(|o| o.same_kind(owner)) => d.owners.push(owner),
            _ => out.push(Digit {
                lo: b,
                owners: vec![owner],
            }),
        }
    }
    Some(out)
}

/// The register index whose bits `js` spell `v`.
fn spread(v: usize, js: &[u32]) -> usize {
    js.iter()
        .enumerate()
        .filter(|(i, _)| v >> i & 1 == 1)
        .fold(0, |acc, (_, &j)| acc | 1 << j)
}

/// The digit value the bits `js` of register index `r` spell.
fn gather(r: usize, js: &[u32]) -> usize {
    js.iter()
        .enumerate()
        .filter(|(_, &j)| r >> j & 1 == 1)
        .fold(0, |acc, (i, _)| acc | 1 << i)
}

/// The scan across the lanes that differ in the bits `lanes` (the lowest digit bit
/// first) of a value `t` each holds: returns this lane's exclusive prefix (`None` only
/// for no lanes: the identity) and leaves the total of them all in `t`.
fn butterfly<S: Simt>(s: &mut S, t: &mut S::V, lanes: &[u32], reverse: bool) -> Option<S::V> {
    let mut e: Option<S::V> = None;
    for &h in lanes {
        let pt = s.shfl_xor(*t, 1 << h);
        // The partner's values come first where this lane's bit is 1 (0 when
        // reversed).
        let bit = s.tid_bit(h);
        let base = match e {
            Some(e) => e,
            None => s.identity(),
        };
        let with = match e {
            Some(e) => s.combine(pt, e),
            None => pt,
        };
        e = Some(if reverse {
            s.select(bit, base, with)
        } else {
            s.select(bit, with, base)
        });
        *t = s.combine(*t, pt);
    }
    e
}

/// Combines `e` (a digit's exclusive prefix) into the scan of every register `mine`
/// selects.
fn update<S: Simt>(
    s: &mut S,
    scan: &mut [Option<S::V>],
    mine: impl Fn(usize) -> bool,
    e: Option<S::V>,
) {
    for (r, v) in scan.iter_mut().enumerate() {
        if mine(r) {
            *v = combine_opt(s, e, *v);
        }
    }
}

fn combine_opt<S: Simt>(s: &mut S, a: Option<S::V>, b: Option<S::V>) -> Option<S::V> {
    match (a, b) {
        (Some(x), Some(y)) => Some(s.combine(x, y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The scan of the tile whose registers (in layout `lin`) are `x`, along `axis` of real
/// extent `extent`: per register, `None` where the scan is empty (an exclusive scan's
/// first element), else its value. `None` overall if `lin` does not cover the axis.
pub(crate) fn plan<S: Simt>(
    s: &mut S,
    lin: &Linear,
    axis: usize,
    extent: u32,
    reverse: bool,
    exclusive: bool,
    x: &[S::V],
) -> Option<Vec<Option<S::V>>> {
    let digits = digits(lin, axis)?;
    let nregs = lin.num_regs();
    if x.len() != nregs {
        return None;
    }
    let mut x = x.to_vec();
    // A reversed scan reads the padded slots (coordinates ≥ extent) before the real
    // ones: they become the identity. A forward scan reaches them only after every
    // real element, so they cannot change a real result.
    if reverse && extent < lin.shape[axis] {
        let t = lin.thread_bits(axis);
        for (r, xr) in x.iter_mut().enumerate() {
            let kc = lin.reg_coord(r)[axis];
            if kc >= extent {
                *xr = s.identity();
            } else if !t.is_empty() {
                let inside = s.tid_field_below(&t, extent - kc);
                let id = s.identity();
                *xr = s.select(inside, *xr, id);
            }
        }
    }
    let mut scan: Vec<Option<S::V>> = if exclusive {
        vec![None; nregs]
    } else {
        x.iter().map(|&v| Some(v)).collect()
    };
    // Sub-block totals by register index with the processed register bits cleared.
    let mut tot: BTreeMap<usize, S::V> = x.iter().copied().enumerate().collect();
    let mut done = 0usize;
    // The exchange of a warp digit begins before the digit below it, so that each
    // total is stored as soon as it is final (it need not stay live until then).
    let mut pending = match digits.first() {
        Some(d) if matches!(d.owners[0], Owner::Warp(_)) => {
            let ex = Exchange::new(s, lin, axis, d)?;
            for (&k, &t) in &tot {
                ex.store(s, k, t);
            }
            Some(ex)
        }
        _ => None,
    };
    for (i, d) in digits.iter().enumerate() {
        let m = d.owners.len();
        let order: Vec<usize> = if reverse {
            (0..1 << m).rev().collect()
        } else {
            (0..1 << m).collect()
        };
        let next = match digits.get(i + 1) {
            Some(n) if matches!(n.owners[0], Owner::Warp(_)) => {
                Some(Exchange::new(s, lin, axis, n)?)
            }
            _ => None,
        };
        match d.owners[0] {
            Owner::Reg(_) => {
                let js: Vec<u32> = d
                    .owners
                    .iter()
                    .filter_map(|o| match o {
                        Owner::Reg(j) => Some(*j),
                        _ => None,
                    })
                    .collect();
                let jmask = spread((1 << m) - 1, &js);
                let mut merged = BTreeMap::new();
                for (&k, _) in tot.iter().filter(|(k, _)| *k & jmask == 0) {
                    // Per digit value: the prefix before it, its total, the prefix after.
                    let mut excl = vec![None; 1 << m];
                    let mut total = vec![None; 1 << m];
                    let mut incl = vec![None; 1 << m];
                    let mut run = None;
                    for &v in &order {
                        excl[v] = run;
                        total[v] = tot.get(&(k | spread(v, &js))).copied();
                        run = combine_opt(s, run, total[v]);
                        incl[v] = run;
                    }
                    let run = run?;
                    if let Some(ex) = &next {
                        ex.store(s, k, run);
                    }
                    merged.insert(k, run);
                    for r in 0..nregs {
                        if r & !(done | jmask) == k {
                            let v = gather(r, &js);
                            // An element whose scan is its sub-block's total (the last
                            // of its sub-block) ends with the running prefix itself.
                            scan[r] = if scan[r].is_some() && scan[r] == total[v] {
                                incl[v]
                            } else {
                                combine_opt(s, excl[v], scan[r])
                            };
                        }
                    }
                }
                tot = merged;
                done |= jmask;
            }
            Owner::Lane(_) => {
                let mut lanes = Vec::with_capacity(m);
                for o in &d.owners {
                    let Owner::Lane(h) = *o else { return None };
                    lanes.push(h);
                }
                for (k, t) in tot.iter_mut() {
                    let e = butterfly(s, t, &lanes, reverse);
                    if let Some(ex) = &next {
                        ex.store(s, *k, *t);
                    }
                    update(s, &mut scan, |r| r & !done == *k, e);
                }
            }
            Owner::Warp(_) => {
                let ex = pending.take()?;
                s.exchange_barrier();
                for (k, t) in tot.iter_mut() {
                    let e = ex.prefix(s, *k, reverse, t)?;
                    if let Some(nx) = &next {
                        nx.store(s, *k, *t);
                    }
                    update(s, &mut scan, |r| r & !done == *k, e);
                }
            }
        }
        pending = next;
    }
    Some(scan)
}

/// The shared-memory exchange of a digit owned by warp bits. Every thread stores the
/// totals of its sub-blocks at slot `digit value * groups + group`, where a group is a
/// position of the tile with the axis bits up to the digit's removed (the other dims
/// and the axis bits above, in row-major order); after the barrier it reads the 2^m
/// totals of each of its groups.
struct Exchange {
    m: u32,
    groups: u32,
    /// Thread-id bits → group-index bits.
    group_pairs: Vec<(u32, u32)>,
    /// The same, and the digit's warp bits → the digit value's bits above the group.
    write_pairs: Vec<(u32, u32)>,
    /// The digit's warp bits as thread-id bits, lowest digit bit first.
    digit_bits: Vec<u32>,
    /// Per register bit, its bit in the group index (`None`: an axis bit up to the
    /// digit, cleared in every key).
    reg_pos: Vec<Option<u32>>,
    /// Lane bits that own no bit of a group (replicas, or the axis below the digit),
    /// one per digit bit, when there are enough: then lane `u` of a group reads the
    /// total of digit value `u`, a butterfly over these lanes scans them, and each
    /// thread takes its prefix from the lane of its digit value (one load and one
    /// indexed shuffle per key). Otherwise every thread reads all 2^m totals.
    u_lanes: Option<Vec<u32>>,
}

impl Exchange {
    /// Plans the exchange and begins it (`exchange_begin`).
    fn new<S: Simt>(s: &mut S, lin: &Linear, axis: usize, d: &Digit) -> Option<Exchange> {
        let m = d.owners.len() as u32;
        let hi = d.lo + m - 1;
        // The group shape: the axis keeps its bits above `hi`.
        let mut gshape: Vec<u32> = lin.shape.iter().map(|&e| e.trailing_zeros()).collect();
        gshape[axis] = gshape[axis].saturating_sub(hi + 1);
        let group_bits: u32 = gshape.iter().sum();
        // Bit position of coordinate bit (dim, bit) in the row-major group index.
        let pos = |(dim, bit): (u8, u8)| -> Option<u32> {
            let (dim, bit) = (dim as usize, bit as u32);
            let bit = if dim == axis {
                bit.checked_sub(hi + 1)?
            } else {
                bit
            };
            Some(gshape[dim + 1..].iter().sum::<u32>() + bit)
        };
        let owned = lin
            .lanes
            .iter()
            .enumerate()
            .map(|(h, l)| (h as u32, *l))
            .chain(
                lin.warps
                    .iter()
                    .enumerate()
                    .map(|(w, l)| (5 + w as u32, *l)),
            );
        let group_pairs: Vec<(u32, u32)> = owned.filter_map(|(h, l)| Some((h, pos(l?)?))).collect();
        let mut digit_bits = Vec::new();
        for o in &d.owners {
            let Owner::Warp(w) = *o else { return None };
            digit_bits.push(5 + w);
        }
        let mut write_pairs = group_pairs.clone();
        write_pairs.extend(
            digit_bits
                .iter()
                .enumerate()
                .map(|(i, &h)| (h, group_bits + i as u32)),
        );
        let free: Vec<u32> = (0..5u32)
            .filter(|&h| match lin.lanes[h as usize] {
                None => true,
                Some(cb) => pos(cb).is_none(),
            })
            .collect();
        let ex = Exchange {
            m,
            groups: 1 << group_bits,
            group_pairs,
            write_pairs,
            digit_bits,
            reg_pos: lin.regs.iter().map(|&cb| pos(cb)).collect(),
            u_lanes: (free.len() >= m as usize).then(|| free[..m as usize].to_vec()),
        };
        s.exchange_begin(ex.groups << m);
        Some(ex)
    }

    /// The group-index part of key `k` (a register index).
    fn reg_part(&self, k: usize) -> u32 {
        self.reg_pos
            .iter()
            .enumerate()
            .filter(|(j, _)| k >> j & 1 == 1)
            .filter_map(|(_, p)| *p)
            .fold(0, |acc, p| acc | 1 << p)
    }

    /// Stores key `k`'s total `t`.
    fn store<S: Simt>(&self, s: &mut S, k: usize, t: S::V) {
        s.exchange_store(t, &self.write_pairs, self.reg_part(k));
    }

    /// After the barrier: key `k`'s exclusive prefix over the digit (`None`: the
    /// identity, for the first digit value), and its total over the digit into `t`.
    fn prefix<S: Simt>(
        &self,
        s: &mut S,
        k: usize,
        reverse: bool,
        t: &mut S::V,
    ) -> Option<Option<S::V>> {
        if let Some(u_lanes) = &self.u_lanes {
            let mut read = self.group_pairs.clone();
            let groups_bits = self.groups.trailing_zeros();
            read.extend(
                u_lanes
                    .iter()
                    .enumerate()
                    .map(|(i, &h)| (h, groups_bits + i as u32)),
            );
            *t = s.exchange_load(&read, self.reg_part(k));
            let e = butterfly(s, t, u_lanes, reverse);
            let e = match e {
                Some(e) => e,
                None => s.identity(),
            };
            // From the lane of this thread's digit value (its other lane bits kept).
            let keep = u_lanes.iter().fold(31u32, |acc, &h| acc & !(1 << h));
            let src: Vec<(u32, u32)> = self
                .digit_bits
                .iter()
                .zip(u_lanes)
                .map(|(&w, &h)| (w, h))
                .collect();
            return Some(Some(s.shfl_idx(e, keep, &src)));
        }
        let order: Vec<u32> = if reverse {
            (0..1 << self.m).rev().collect()
        } else {
            (0..1 << self.m).collect()
        };
        // The prefix before each digit value (in scan order), and of those the one of
        // this thread's digit value, picked by a tree of selects on the digit's bits
        // (2^m - 1 selects on m predicates). The tree is built as its leaves come, like
        // a binary counter, so only m of its nodes are live at a time.
        let mut run: Option<S::V> = None;
        let mut stack: Vec<(usize, Option<S::V>)> = Vec::new();
        for u in order {
            stack.push((0, run));
            let part = s.exchange_load(&self.group_pairs, u * self.groups + self.reg_part(k));
            run = combine_opt(s, run, Some(part));
            while let [.., (la, _), (lb, _)] = stack[..] {
                if la != lb {
                    break;
                }
                let (Some((_, b)), Some((_, a))) = (stack.pop(), stack.pop()) else {
                    return None;
                };
                // `a` came first: the lower half, or the upper one when reversed.
                let (lo, hi) = if reverse { (b, a) } else { (a, b) };
                let node = match (lo, hi) {
                    (None, None) => None,
                    (lo, hi) => {
                        let bit = s.tid_bit(self.digit_bits[la]);
                        let lo = lo.unwrap_or_else(|| s.identity());
                        let hi = hi.unwrap_or_else(|| s.identity());
                        Some(s.select(bit, hi, lo))
                    }
                };
                stack.push((la + 1, node));
            }
        }
        *t = run?;
        Some(stack.pop()?.1)
    }
}

// ---- PTX ----------------------------------------------------------------------------

/// [`Simt`] in PTX for one scan: values in registers of `class`.
struct Ptx<'l, 'a> {
    l: &'l mut Lowerer<'a>,
    op: ScanOp,
    /// The dtype the arithmetic runs in (f32 for halves, u32 for bool).
    dt: DType,
    class: RegClass,
    identity: Option<Reg>,
    base: Option<Reg>,
    /// `tid_bit` predicates (a few: lane and warp bits of the axis).
    bits: HashMap<u32, Reg>,
    /// Source lanes of `shfl_idx`.
    lanes: HashMap<(u32, Vec<(u32, u32)>), Reg>,
    addrs: HashMap<Vec<(u32, u32)>, Reg>,
}

impl Ptx<'_, '_> {
    fn bytes(&self) -> u32 {
        if self.class == RegClass::B64 {
            8
        } else {
            4
        }
    }

    fn constant(&mut self, c: Operand) -> Reg {
        let class = self.class;
        self.l.in_prologue(|l| {
            let r = l.reg(class);
            l.mov(r, c);
            r
        })
    }

    /// The op's start value (an exclusive scan's first element).
    fn start(&self) -> Operand {
        let float = self.dt.is_float();
        match (self.op, self.dt) {
            (ScanOp::Add, _) if float => Operand::F32(0.0),
            (ScanOp::Mul, _) if float => Operand::F32(1.0),
            (ScanOp::Max, _) if float => Operand::F32(f32::NEG_INFINITY),
            (ScanOp::Min, _) if float => Operand::F32(f32::INFINITY),
            _ => self.exact_identity(),
        }
    }

    /// The identity as an operand: -0.0 for float `add`, NaN for float `max`/`min`.
    fn exact_identity(&self) -> Operand {
        use DType::*;
        match (self.op, self.dt) {
            (ScanOp::Add, F32) => Operand::F32(-0.0),
            (ScanOp::Mul, F32) => Operand::F32(1.0),
            (ScanOp::Max | ScanOp::Min, F32) => Operand::F32(f32::NAN),
            (ScanOp::Add | ScanOp::Or | ScanOp::Xor, _) => Operand::Imm(0),
            (ScanOp::Mul, _) => Operand::Imm(1),
            (ScanOp::And, _) => Operand::Imm(-1),
            (ScanOp::Max, I32) => Operand::Imm(i32::MIN as i64),
            (ScanOp::Max, I64) => Operand::Imm(i64::MIN),
            (ScanOp::Max, _) => Operand::Imm(0),
            (ScanOp::Min, I32) => Operand::Imm(i32::MAX as i64),
            (ScanOp::Min, I64) => Operand::Imm(i64::MAX),
            (ScanOp::Min, _) => Operand::Imm(-1),
        }
    }

    fn opcode(&self) -> String {
        let float = self.dt.is_float();
        let ty = super::arith::int_ty(self.dt);
        let bits = if self.class == RegClass::B64 { 64 } else { 32 };
        match self.op {
            ScanOp::Add if float => "add.rn.f32".into(),
            ScanOp::Mul if float => "mul.rn.f32".into(),
            ScanOp::Max if float => "max.f32".into(),
            ScanOp::Min if float => "min.f32".into(),
            ScanOp::Add => format!("add.{ty}"),
            ScanOp::Mul => format!("mul.lo.{ty}"),
            ScanOp::Max => format!("max.{ty}"),
            ScanOp::Min => format!("min.{ty}"),
            ScanOp::And => format!("and.b{bits}"),
            ScanOp::Or => format!("or.b{bits}"),
            ScanOp::Xor => format!("xor.b{bits}"),
        }
    }

    /// `base + field(pairs) * bytes`, in the prologue.
    fn addr(&mut self, pairs: &[(u32, u32)]) -> Reg {
        if let Some(&a) = self.addrs.get(pairs) {
            return a;
        }
        // `exchange_begin` (smem_begin) always runs first and sets `base`.
        let base = self.base.unwrap_or_else(|| self.l.smem_at(0));
        let shift = self.bytes().trailing_zeros() as i64;
        let field = self.l.tid_bits(pairs);
        let a = self.l.in_prologue(|l| match field {
            Some(f) => {
                let off = l.op1(
                    RegClass::B32,
                    "shl.b32",
                    vec![f.into(), Operand::Imm(shift)],
                );
                l.op1(RegClass::B32, "add.s32", vec![base.into(), off.into()])
            }
            None => base,
        });
        self.addrs.insert(pairs.to_vec(), a);
        a
    }
}

impl Simt for Ptx<'_, '_> {
    type V = Reg;
    type P = Reg;

    fn combine(&mut self, a: Reg, b: Reg) -> Reg {
        let opc = self.opcode();
        self.l.op1(self.class, &opc, vec![a.into(), b.into()])
    }

    fn select(&mut self, p: Reg, a: Reg, b: Reg) -> Reg {
        self.l.select(p, a, b)
    }

    fn identity(&mut self) -> Reg {
        if let Some(r) = self.identity {
            return r;
        }
        let c = self.exact_identity();
        let r = self.constant(c);
        self.identity = Some(r);
        r
    }

    fn shfl_xor(&mut self, v: Reg, mask: u32) -> Reg {
        self.l.shfl(v, mask)
    }

    fn shfl_idx(&mut self, v: Reg, keep: u32, pairs: &[(u32, u32)]) -> Reg {
        let key = (keep, pairs.to_vec());
        let src = match self.lanes.get(&key) {
            Some(&r) => r,
            None => {
                let tid = self.l.tid();
                let field = self.l.tid_bits(pairs);
                let r = self.l.in_prologue(|l| {
                    let kept = l.op1(
                        RegClass::B32,
                        "and.b32",
                        vec![tid.into(), Operand::Imm(keep as i64)],
                    );
                    match field {
                        Some(f) => l.op1(RegClass::B32, "or.b32", vec![kept.into(), f.into()]),
                        None => kept,
                    }
                });
                self.lanes.insert(key, r);
                r
            }
        };
        self.l.shuffle_idx(v, src.into())
    }

    fn tid_bit(&mut self, h: u32) -> Reg {
        if let Some(&p) = self.bits.get(&h) {
            return p;
        }
        let field = self.l.tid_bits(&[(h, 0)]);
        let p = self.l.in_prologue(|l| match field {
            Some(f) => l.op1(
                RegClass::Pred,
                "setp.ne.u32",
                vec![f.into(), Operand::Imm(0)],
            ),
            None => l.op1(RegClass::Pred, "mov.pred", vec![Operand::Imm(0)]),
        });
        self.bits.insert(h, p);
        p
    }

    fn tid_field_below(&mut self, pairs: &[(u32, u32)], value: u32) -> Reg {
        // In the body, where it is used: one per padded register would crowd the
        // prologue's live predicates.
        let f = match self.l.tid_bits(pairs) {
            Some(f) => Operand::Reg(f),
            None => Operand::Imm(0),
        };
        self.l.op1(
            RegClass::Pred,
            "setp.lt.u32",
            vec![f, Operand::Imm(value as i64)],
        )
    }

    fn exchange_begin(&mut self, slots: u32) {
        let bytes = slots.saturating_mul(self.bytes());
        self.base = Some(self.l.smem_begin(bytes));
    }

    fn exchange_store(&mut self, v: Reg, pairs: &[(u32, u32)], offset: u32) {
        let a = self.addr(pairs);
        let st = if self.bytes() == 8 {
            "st.shared.b64"
        } else {
            "st.shared.b32"
        };
        let off = offset as i64 * self.bytes() as i64;
        self.l
            .emit(st, vec![Operand::Mem(Addr::Reg(a), off), v.into()]);
    }

    fn exchange_barrier(&mut self) {
        self.l.smem_read_fence();
    }

    fn exchange_load(&mut self, pairs: &[(u32, u32)], offset: u32) -> Reg {
        let a = self.addr(pairs);
        let ld = if self.bytes() == 8 {
            "ld.shared.b64"
        } else {
            "ld.shared.b32"
        };
        let off = offset as i64 * self.bytes() as i64;
        let d = self.l.reg(self.class);
        self.l
            .emit(ld, vec![d.into(), Operand::Mem(Addr::Reg(a), off)]);
        d
    }
}

impl Lowerer<'_> {
    /// Lowers one `Op::Scan` in the result's layout (the operand's, converted if not).
    pub(super) fn lower_scan(&mut self, id: InstId) -> R<()> {
        let func = self.func;
        let inst = &func.insts[id];
        let span = inst.span;
        let Op::Scan {
            op,
            value,
            axis,
            reverse,
            exclusive,
        } = inst.op
        else {
            return Err(unsupported(span, "not a scan"));
        };
        let res = *inst
            .results
            .first()
            .ok_or_else(|| unsupported(span, "scan without a result"))?;
        let dt = self.dtype(value);
        if !op.accepts(dt) {
            return Err(unsupported(span, format!("scan.{} of {dt}", op.name())));
        }
        let axis = axis as usize;
        let extent = *self
            .shape(value)
            .get(axis)
            .ok_or_else(|| unsupported(span, "scan axis out of range"))?;
        let lin = self.lin(res);
        let mut x = self.operand_in(value, &lin, span)?;
        // The arithmetic's dtype: halves widened to f32, bool as 0/1.
        let cdt = match dt {
            DType::F16 | DType::BF16 => DType::F32,
            DType::Bool => DType::U32,
            d => d,
        };
        if dt == DType::Bool {
            x = x
                .iter()
                .map(|&p| {
                    self.op1(
                        RegClass::B32,
                        "selp.u32",
                        vec![Operand::Imm(1), Operand::Imm(0), p.into()],
                    )
                })
                .collect();
        }
        let mut ptx = Ptx {
            l: self,
            op,
            dt: cdt,
            class: class_of(cdt),
            identity: None,
            base: None,
            bits: HashMap::new(),
            lanes: HashMap::new(),
            addrs: HashMap::new(),
        };
        let scanned = plan(&mut ptx, &lin, axis, extent, reverse, exclusive, &x)
            .ok_or_else(|| unsupported(span, "scan layout does not cover the axis"))?;
        // An exclusive scan folds from the start value: where that is not an exact
        // identity (float add, max, min), every result is combined with it once.
        let fold_start = exclusive && cdt.is_float() && op != ScanOp::Mul;
        let start = exclusive.then(|| {
            let c = ptx.start();
            ptx.constant(c)
        });
        let mut out = Vec::with_capacity(scanned.len());
        for v in scanned {
            out.push(match (v, start) {
                (Some(v), Some(s)) if fold_start => ptx.combine(s, v),
                (Some(v), _) => v,
                (None, Some(s)) => s,
                // Only an exclusive scan has empty elements.
                (None, None) => return Err(unsupported(span, "an empty inclusive scan")),
            });
        }
        let rounds = matches!(op, ScanOp::Add | ScanOp::Mul) && dt.is_half();
        let out = out
            .into_iter()
            .map(|r| match dt {
                DType::Bool => self.op1(
                    RegClass::Pred,
                    "setp.ne.u32",
                    vec![r.into(), Operand::Imm(0)],
                ),
                _ if rounds => self.round_to(r, dt),
                _ => r,
            })
            .collect();
        self.bind(res, out);
        Ok(())
    }
}

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;
