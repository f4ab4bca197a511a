//! The scan plan on a simulated SIMT machine: every thread of a block runs it over
//! random layouts (the axis' bits in registers, lanes and warps in any order, replica
//! lanes and warps, non-power-of-two extents, 1 to 3 dims), and each element's result
//! must combine exactly the elements of its prefix: a value is the multiset of the
//! element ids combined into it, so an element counted twice (a replica that adds its
//! copy), one missing, one from another line or a padded slot in a real result all
//! show. Shared-memory slots written twice must receive the same multiset (copies
//! agree), and no slot is read before it is written.

use super::{plan, Simt};
use crate::back::ptx::layout::{Blocked, Linear};
use rand::{Rng, SeedableRng};

/// Marks the id of a padded slot (a coordinate beyond the axis' real extent).
const PAD: u32 = 1 << 31;

/// Every thread's copy of every value: element-id multisets.
struct Sim {
    threads: usize,
    vals: Vec<Vec<Vec<u32>>>,
    preds: Vec<Vec<bool>>,
    mem: Vec<Option<Vec<u32>>>,
    barrier: bool,
    exchanges: usize,
    /// Indexed shuffles (an exchange whose digit values sit in lanes).
    idx_shuffles: usize,
    error: Option<String>,
}

impl Sim {
    fn new(threads: usize) -> Sim {
        Sim {
            threads,
            vals: Vec::new(),
            preds: Vec::new(),
            mem: Vec::new(),
            barrier: false,
            exchanges: 0,
            idx_shuffles: 0,
            error: None,
        }
    }

    fn push(&mut self, v: Vec<Vec<u32>>) -> usize {
        self.vals.push(v);
        self.vals.len() - 1
    }

    fn field(pairs: &[(u32, u32)], t: usize) -> u32 {
        pairs.iter().map(|&(h, b)| ((t as u32 >> h) & 1) << b).sum()
    }

    fn fail(&mut self, msg: String) {
        self.error.get_or_insert(msg);
    }
}

impl Simt for Sim {
    type V = usize;
    type P = usize;

    fn combine(&mut self, a: usize, b: usize) -> usize {
        let v = (0..self.threads)
            .map(|t| {
                let mut x = self.vals[a][t].clone();
                x.extend_from_slice(&self.vals[b][t]);
                x
            })
            .collect();
        self.push(v)
    }

    fn select(&mut self, p: usize, a: usize, b: usize) -> usize {
        let v = (0..self.threads)
            .map(|t| {
                let src = if self.preds[p][t] { a } else { b };
                self.vals[src][t].clone()
            })
            .collect();
        self.push(v)
    }

    fn identity(&mut self) -> usize {
        self.push(vec![Vec::new(); self.threads])
    }

    fn shfl_xor(&mut self, v: usize, mask: u32) -> usize {
        if mask >= 32 {
            self.fail(format!("shuffle across warps (mask {mask:#x})"));
        }
        let out = (0..self.threads)
            .map(|t| self.vals[v][(t ^ mask as usize) % self.threads].clone())
            .collect();
        self.push(out)
    }

    fn shfl_idx(&mut self, v: usize, keep: u32, pairs: &[(u32, u32)]) -> usize {
        self.idx_shuffles += 1;
        let mut out = Vec::with_capacity(self.threads);
        for t in 0..self.threads {
            let lane = (t as u32 & keep) | Sim::field(pairs, t);
            if lane >= 32 {
                self.fail(format!("shuffle from lane {lane}"));
            }
            out.push(self.vals[v][(t & !31) | (lane as usize & 31)].clone());
        }
        self.push(out)
    }

    fn tid_bit(&mut self, h: u32) -> usize {
        self.preds
            .push((0..self.threads).map(|t| t >> h & 1 == 1).collect());
        self.preds.len() - 1
    }

    fn tid_field_below(&mut self, pairs: &[(u32, u32)], value: u32) -> usize {
        let p = (0..self.threads)
            .map(|t| Sim::field(pairs, t) < value)
            .collect();
        self.preds.push(p);
        self.preds.len() - 1
    }

    fn exchange_begin(&mut self, slots: u32) {
        self.mem = vec![None; slots as usize];
        self.barrier = false;
        self.exchanges += 1;
    }

    fn exchange_store(&mut self, v: usize, pairs: &[(u32, u32)], offset: u32) {
        if self.barrier {
            self.fail("a store after the exchange's barrier".into());
        }
        for t in 0..self.threads {
            let i = (Sim::field(pairs, t) + offset) as usize;
            let mut x = self.vals[v][t].clone();
            x.sort_unstable();
            match self.mem.get(i) {
                None => {
                    return self.fail(format!("thread {t} stores slot {i} of {}", self.mem.len()))
                }
                Some(Some(prev)) if *prev != x => {
                    return self.fail(format!("slot {i}: copies differ ({prev:?} vs {x:?})"))
                }
                _ => self.mem[i] = Some(x),
            }
        }
    }

    fn exchange_barrier(&mut self) {
        self.barrier = true;
    }

    fn exchange_load(&mut self, pairs: &[(u32, u32)], offset: u32) -> usize {
        if !self.barrier {
            self.fail("a load before the exchange's barrier".into());
        }
        let mut out = Vec::with_capacity(self.threads);
        for t in 0..self.threads {
            let i = (Sim::field(pairs, t) + offset) as usize;
            match self.mem.get(i).cloned().flatten() {
                Some(x) => out.push(x),
                None => {
                    self.fail(format!("thread {t} reads slot {i}, which nobody wrote"));
                    out.push(Vec::new());
                }
            }
        }
        self.push(out)
    }
}

/// The coordinate of register `r` of thread `t`.
fn coord(lin: &Linear, t: usize, r: usize) -> Vec<u32> {
    let mut c = lin.reg_coord(r);
    for (d, cd) in c.iter_mut().enumerate() {
        for (h, b) in lin.thread_bits(d) {
            *cd |= ((t as u32 >> h) & 1) << b;
        }
    }
    c
}

fn lin_id(shape: &[u32], c: &[u32]) -> u32 {
    c.iter().zip(shape).fold(0, |acc, (&x, &e)| acc * e + x)
}

/// Runs the plan on every thread and checks every register of every thread (copies
/// included) against the prefix it should hold. Returns the number of exchanges and of
/// indexed shuffles.
fn check(lin: &Linear, axis: usize, extent: u32, reverse: bool, exclusive: bool) -> (usize, usize) {
    let threads = 32usize << lin.warps.len();
    let mut sim = Sim::new(threads);
    let x: Vec<usize> = (0..lin.num_regs())
        .map(|r| {
            let v = (0..threads)
                .map(|t| {
                    let c = coord(lin, t, r);
                    let id = lin_id(&lin.shape, &c);
                    vec![if c[axis] >= extent { id | PAD } else { id }]
                })
                .collect();
            sim.push(v)
        })
        .collect();
    let out = plan(&mut sim, lin, axis, extent, reverse, exclusive, &x)
        .unwrap_or_else(|| panic!("no plan for {lin:?}"));
    if let Some(e) = &sim.error {
        panic!("{e}\nlayout {lin:?} axis {axis} extent {extent} reverse {reverse} exclusive {exclusive}");
    }
    for t in 0..threads {
        for (r, v) in out.iter().enumerate() {
            let c = coord(lin, t, r);
            if c[axis] >= extent {
                continue;
            }
            let range: Vec<u32> = if reverse {
                (c[axis]..extent).collect()
            } else {
                (0..=c[axis]).collect()
            };
            let mut want: Vec<u32> = range
                .into_iter()
                .filter(|&k| !exclusive || k != c[axis])
                .map(|k| {
                    let mut c2 = c.clone();
                    c2[axis] = k;
                    lin_id(&lin.shape, &c2)
                })
                .collect();
            want.sort_unstable();
            let mut got = v.map(|v| sim.vals[v][t].clone()).unwrap_or_default();
            got.sort_unstable();
            assert_eq!(
                got, want,
                "thread {t} register {r} at {c:?}\nlayout {lin:?} axis {axis} extent {extent} \
                 reverse {reverse} exclusive {exclusive}"
            );
        }
    }
    (sim.exchanges, sim.idx_shuffles)
}

/// A layout whose coordinate bits go to registers, lanes and warps at random, in
/// random order, with `warp_bits` warp bits and free lane/warp slots left as replicas.
fn random_layout(rng: &mut rand::rngs::StdRng, shape: &[u32], warp_bits: usize) -> Linear {
    let p: Vec<u32> = shape.iter().map(|&e| e.next_power_of_two()).collect();
    let mut bits: Vec<(u8, u8)> = Vec::new();
    for (d, &e) in p.iter().enumerate() {
        for b in 0..e.trailing_zeros() {
            bits.push((d as u8, b as u8));
        }
    }
    for i in (1..bits.len()).rev() {
        bits.swap(i, rng.random_range(0..=i));
    }
    let mut lin = Linear {
        shape: p,
        regs: Vec::new(),
        lanes: [None; 5],
        warps: vec![None; warp_bits],
    };
    for cb in bits {
        let free_lanes: Vec<usize> = (0..5).filter(|&h| lin.lanes[h].is_none()).collect();
        let free_warps: Vec<usize> = (0..warp_bits).filter(|&w| lin.warps[w].is_none()).collect();
        match rng.random_range(0..3) {
            0 if !free_lanes.is_empty() => {
                lin.lanes[free_lanes[rng.random_range(0..free_lanes.len())]] = Some(cb)
            }
            1 if !free_warps.is_empty() => {
                lin.warps[free_warps[rng.random_range(0..free_warps.len())]] = Some(cb)
            }
            _ => lin.regs.push(cb),
        }
    }
    lin
}

#[test]
fn random_layouts_scan_every_axis_exactly() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    // Layouts whose exchange reads one total per lane, and those that read them all.
    let (mut by_lanes, mut all) = (0, 0);
    for _ in 0..300 {
        let rank = rng.random_range(1..=3);
        // At most 2^10 padded elements, at most 8 warps: the simulation stays fast.
        let mut budget = 10u32;
        let shape: Vec<u32> = (0..rank)
            .map(|_| {
                let b = rng.random_range(0..=budget.min(7));
                budget -= b;
                if b == 0 {
                    1
                } else {
                    rng.random_range((1u32 << (b - 1)) + 1..=1 << b)
                }
            })
            .collect();
        let warp_bits = rng.random_range(0..=3);
        let lin = random_layout(&mut rng, &shape, warp_bits);
        let axis = rng.random_range(0..rank);
        for (reverse, exclusive) in [(false, false), (true, false), (false, true), (true, true)] {
            match check(&lin, axis, shape[axis], reverse, exclusive) {
                (0, _) => {}
                (_, 0) => all += 1,
                _ => by_lanes += 1,
            }
        }
    }
    // The random layouts put axis bits in warps often enough to test both exchanges.
    assert!(
        by_lanes > 40 && all > 10,
        "{by_lanes} and {all} scans with exchanges"
    );
}

/// The layouts `assign` gives a row: `[4097]` on 16 warps with 4-element vectors has
/// axis bits 0-1 in registers, 2-6 in lanes, 7-10 in warps and 11-12 in registers.
#[test]
fn default_row_layouts() {
    for (n, vec, warps) in [
        (4097u32, 4u32, 16u32),
        (1000, 4, 4),
        (127, 1, 4),
        (7, 4, 4),
        (1, 1, 1),
        (4097, 1, 1),
        (3000, 2, 8),
    ] {
        let lin = Blocked::default_for(&[n], vec, warps).linear(&[n]);
        for (reverse, exclusive) in [(false, false), (true, false), (false, true), (true, true)] {
            let (ex, idx) = check(&lin, 0, n, reverse, exclusive);
            // One barrier pair at most: the warp bits of a blocked row form one digit,
            // whose totals the lanes below scan (one indexed shuffle per key).
            assert!(ex <= 1, "{n}: {ex} exchanges");
            assert_eq!(idx > 0, ex > 0, "{n}");
        }
    }
    // 2-D and 3-D tiles, along each axis.
    for shape in [
        vec![7u32, 130],
        vec![64, 33],
        vec![3, 5, 70],
        vec![33, 2, 9],
    ] {
        for warps in [1, 4, 8] {
            let lin = Blocked::default_for(&shape, 4, warps).linear(&shape);
            for axis in 0..shape.len() {
                check(&lin, axis, shape[axis], false, false);
                check(&lin, axis, shape[axis], true, true);
            }
        }
    }
    // [64, 33] along axis 0 on 4 warps: 4 lane bits hold columns, 1 the rows below the
    // 2 warp bits: too few lanes for the digit values, so every thread reads them all.
    let lin = Blocked::default_for(&[64, 33], 4, 4).linear(&[64, 33]);
    assert_eq!(check(&lin, 0, 64, false, false), (1, 0));
}
