//! Axis facts: what is known, at compile time, about the integer and `bool` values of a
//! kernel along the last axis of their tiles (Triton's `AxisInfo`, reduced to the three
//! facts that vectorized `gather` / `scatter` need).
//!
//! Assumes: validated IR (operands are defined before use, types are exact).
//! Guarantees: for every value, [`AxisInfo`] `{ contiguity: c, divisibility: d,
//! constancy: k }` (all powers of two) such that, splitting the last axis into aligned
//! groups of positions (`0..g`, `g..2g`, ...):
//! - in each aligned group of `c` positions, consecutive elements differ by exactly +1;
//! - the first element of each aligned group of `c` positions is a multiple of `d` (for
//!   `c = 1`: every element; for a scalar: the value);
//! - in each aligned group of `k` positions, all elements are equal (a scalar, or a
//!   tile broadcast along its last axis, has `k =` [`UNBOUNDED`]).
//!
//! A value nothing is known about gets `(1, 1, 1)` (tiles) or `(1, 1, UNBOUNDED)`
//! (scalars). Loop-carried values and the results of `for` / `if` are unknown. The
//! facts never change what a kernel computes: the back end only uses them to pick
//! wider memory instructions ([`AxisFacts::pointwise_vector`]).

use crate::ir::{BinaryOp, Block, CmpOp, Function, Op, TensorParam, UnaryOp, ValueId};
use crate::types::{DType, Scalar, ValueType};
use std::collections::HashMap;

/// "Any power of two": the divisibility of 0 and the constancy of a scalar.
pub const UNBOUNDED: u64 = 1 << 40;

/// The three facts of one value along the last axis (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisInfo {
    pub contiguity: u64,
    pub divisibility: u64,
    pub constancy: u64,
}

impl AxisInfo {
    /// Nothing known about a tile.
    pub const UNKNOWN_TILE: AxisInfo = AxisInfo {
        contiguity: 1,
        divisibility: 1,
        constancy: 1,
    };
    /// Nothing known about a scalar but that it is one value.
    pub const UNKNOWN_SCALAR: AxisInfo = AxisInfo {
        contiguity: 1,
        divisibility: 1,
        constancy: UNBOUNDED,
    };

    fn uniform(divisibility: u64) -> AxisInfo {
        AxisInfo {
            contiguity: 1,
            divisibility,
            constancy: UNBOUNDED,
        }
    }

    /// The divisibility of the first element of each aligned group of `group` positions
    /// (`group` at most the contiguity, or any size when `contiguity` is 1).
    pub fn divisibility_at(&self, group: u64) -> u64 {
        if self.contiguity <= 1 || group >= self.contiguity {
            self.divisibility
        } else {
            // Sub-groups start at first + m * group inside a contiguous run.
            self.divisibility.min(group)
        }
    }

    /// The facts of this value when broadcast along the last axis of the access (every
    /// position holds the same element).
    fn broadcast_along_last(&self) -> AxisInfo {
        AxisInfo::uniform(self.divisibility_at(1))
    }
}

/// The largest power of two dividing `x` ([`UNBOUNDED`] for 0).
pub fn pow2_factor(x: i64) -> u64 {
    if x == 0 {
        UNBOUNDED
    } else {
        (1u64 << x.unsigned_abs().trailing_zeros()).min(UNBOUNDED)
    }
}

/// The largest power of two not above `x` (at least 1).
fn pow2_floor(x: u64) -> u64 {
    if x <= 1 {
        1
    } else {
        1 << (63 - x.leading_zeros())
    }
}

/// The facts of every value of one function.
#[derive(Clone, Debug, Default)]
pub struct AxisFacts {
    facts: HashMap<ValueId, AxisInfo>,
    /// Tile shapes, to tell scalars from tiles and find the last extent.
    shapes: HashMap<ValueId, Vec<u32>>,
    /// Integer constants (scalar or splat), for shift amounts and divisors.
    consts: HashMap<ValueId, i64>,
}

impl AxisFacts {
    /// The facts of `v` (unknown for values the analysis did not see).
    pub fn get(&self, v: ValueId) -> AxisInfo {
        match self.facts.get(&v) {
            Some(f) => *f,
            None if self.shapes.get(&v).is_some_and(|s| !s.is_empty()) => AxisInfo::UNKNOWN_TILE,
            None => AxisInfo::UNKNOWN_SCALAR,
        }
    }

    /// The facts of operand `v` as seen along the last axis of an access of tile shape
    /// `shape` (operands are broadcast to it: a scalar, or a tile whose last extent is 1,
    /// is the same along the whole axis).
    pub fn in_access(&self, v: ValueId, shape: &[u32]) -> AxisInfo {
        let own = self.shapes.get(&v).cloned().unwrap_or_default();
        let f = self.get(v);
        match (own.last(), shape.last()) {
            (None, _) => f.broadcast_along_last(),
            (Some(&a), Some(&b)) if a == b => f,
            (Some(1), Some(_)) => f.broadcast_along_last(),
            _ => AxisInfo::UNKNOWN_TILE,
        }
    }

    /// The widest vector (elements, a power of two) that a `gather` / `scatter` of
    /// tensor `p` at coordinates `offsets` (broadcast to tile `shape`) may use, from
    /// the facts and the tensor's promises alone: the last dimension's coordinates are
    /// contiguous over the vector and start at a multiple of it, the other coordinates
    /// are constant over it, and the vector is at most 16 bytes, within `align_bytes`
    /// and the tile's last extent. Every vector then lies inside one aligned chunk that
    /// is either wholly in bounds or wholly out (`align_bytes` makes the contiguous
    /// extent a multiple of it). The layout's per-thread contiguity caps it further.
    /// 1 means element by element. `bool` tensors are never vectorized here.
    pub fn pointwise_vector(&self, p: &TensorParam, offsets: &[ValueId], shape: &[u32]) -> u64 {
        let rank = p.rank();
        let (Some(&last_extent), true) = (shape.last(), p.contiguous) else {
            return 1;
        };
        if rank == 0 || offsets.len() != rank || p.dtype == DType::Bool {
            return 1;
        }
        let es = p.dtype.size_bytes() as u64;
        let mut v = (16 / es)
            .min((p.align_bytes as u64 / es).max(1))
            .min(1 << last_extent.trailing_zeros().min(4));
        let f = self.in_access(offsets[rank - 1], shape);
        v = v.min(f.contiguity).min(f.divisibility_at(v));
        for &o in &offsets[..rank - 1] {
            v = v.min(self.in_access(o, shape).constancy);
        }
        pow2_floor(v)
    }
}

/// Computes the facts of every value of `func`.
pub fn analyze(func: &Function) -> AxisFacts {
    let mut a = Analyzer {
        func,
        out: AxisFacts::default(),
    };
    for (i, v) in func.values.iter() {
        a.out.shapes.insert(i, crate::ir::shape_of(&v.ty).to_vec());
    }
    a.block(&func.body);
    a.out
}

struct Analyzer<'f> {
    func: &'f Function,
    out: AxisFacts,
}

impl Analyzer<'_> {
    fn block(&mut self, block: &Block) {
        for &i in &block.insts {
            let Some(inst) = self.func.insts.get(i) else {
                continue;
            };
            match &inst.op {
                Op::For { body, .. } => self.block(body),
                Op::If {
                    then_body,
                    else_body,
                    ..
                } => {
                    self.block(then_body);
                    self.block(else_body);
                }
                op => {
                    if let ([r], Op::Const(Scalar::Int(x, _))) = (&inst.results[..], op) {
                        self.out.consts.insert(*r, *x);
                    }
                    if let [r] = inst.results[..] {
                        if let Some(f) = self.fact(op, r) {
                            self.out.facts.insert(r, f);
                        }
                    }
                }
            }
        }
    }

    fn shape(&self, v: ValueId) -> &[u32] {
        self.out.shapes.get(&v).map(Vec::as_slice).unwrap_or(&[])
    }

    fn last_extent(&self, v: ValueId) -> Option<u32> {
        self.shape(v).last().copied()
    }

    /// The facts of `op`'s result `r`; `None` where nothing is known.
    fn fact(&self, op: &Op, r: ValueId) -> Option<AxisInfo> {
        let get = |v: ValueId| self.out.get(v);
        Some(match op {
            Op::Const(Scalar::Int(x, _)) => AxisInfo::uniform(pow2_factor(*x)),
            Op::Const(_) => AxisInfo::uniform(1),
            Op::Arange { start, end } => AxisInfo {
                contiguity: ((end - start).max(1) as u64).next_power_of_two(),
                divisibility: pow2_factor(*start),
                constancy: 1,
            },
            Op::Splat(v) => get(*v).broadcast_along_last(),
            Op::Broadcast(v) => {
                if self.last_extent(*v) == Some(1) && self.last_extent(r) != Some(1) {
                    get(*v).broadcast_along_last()
                } else {
                    get(*v)
                }
            }
            Op::ExpandDims(v, axis) => {
                if *axis as usize == self.shape(*v).len() {
                    // A new last axis of extent 1: each position is one element.
                    get(*v).broadcast_along_last()
                } else {
                    get(*v)
                }
            }
            Op::Reshape(v) if self.last_extent(*v) == self.last_extent(r) => get(*v),
            Op::Permute(v, perm) if perm.last().map(|&l| l as usize + 1) == Some(perm.len()) => {
                get(*v)
            }
            Op::Cast(v) => self.cast(*v, r)?,
            Op::Unary(u, v) => {
                let f = get(*v);
                match u {
                    UnaryOp::Neg => AxisInfo {
                        contiguity: 1,
                        divisibility: f.divisibility_at(1),
                        constancy: f.constancy,
                    },
                    _ => AxisInfo {
                        constancy: f.constancy,
                        ..AxisInfo::UNKNOWN_TILE
                    },
                }
            }
            Op::Binary(b, x, y) => self.binary(*b, *x, *y),
            Op::Compare(c, x, y) => self.compare(*c, *x, *y),
            Op::Select(c, x, y) => {
                let (c, x, y) = (get(*c), get(*x), get(*y));
                AxisInfo {
                    contiguity: 1,
                    divisibility: x.divisibility_at(1).min(y.divisibility_at(1)),
                    constancy: c.constancy.min(x.constancy).min(y.constancy),
                }
            }
            _ => return None,
        })
    }

    fn is_int(&self, v: ValueId) -> bool {
        let dt = match self.func.value_type(v) {
            ValueType::Scalar(d) | ValueType::Tile(d, _) => *d,
        };
        matches!(dt, DType::I32 | DType::U32 | DType::I64)
    }

    fn cast(&self, v: ValueId, r: ValueId) -> Option<AxisInfo> {
        let f = self.out.get(v);
        if !(self.is_int(v) && self.is_int(r)) {
            // Float or bool conversions: only "equal stays equal" survives.
            return Some(AxisInfo {
                constancy: f.constancy,
                ..AxisInfo::UNKNOWN_TILE
            });
        }
        let from = self.func.value_type(v).dtype().size_bytes();
        let to = self.func.value_type(r).dtype().size_bytes();
        if to >= from {
            return Some(f);
        }
        // Narrowing wraps: a run may cross the wrap, and only 32 bits of divisibility remain.
        Some(AxisInfo {
            contiguity: 1,
            divisibility: f.divisibility_at(1).min(1 << 31),
            constancy: f.constancy,
        })
    }

    /// The value of a constant integer operand, if it is one.
    fn const_int(&self, v: ValueId) -> Option<i64> {
        self.out.consts.get(&v).copied()
    }

    fn binary(&self, b: BinaryOp, x: ValueId, y: ValueId) -> AxisInfo {
        let (fx, fy) = (self.out.get(x), self.out.get(y));
        let constancy = fx.constancy.min(fy.constancy);
        let unknown = AxisInfo {
            constancy,
            ..AxisInfo::UNKNOWN_TILE
        };
        if !(self.is_int(x) && self.is_int(y)) {
            return unknown;
        }
        match b {
            BinaryOp::Add => {
                let c = fx
                    .contiguity
                    .min(fy.constancy)
                    .max(fx.constancy.min(fy.contiguity));
                AxisInfo {
                    contiguity: c,
                    divisibility: fx.divisibility_at(c).min(fy.divisibility_at(c)),
                    constancy,
                }
            }
            BinaryOp::Sub => {
                let c = fx.contiguity.min(fy.constancy);
                AxisInfo {
                    contiguity: c,
                    divisibility: fx.divisibility_at(c).min(fy.divisibility_at(c)),
                    constancy,
                }
            }
            BinaryOp::Mul => AxisInfo {
                contiguity: 1,
                divisibility: fx
                    .divisibility_at(1)
                    .saturating_mul(fy.divisibility_at(1))
                    .min(UNBOUNDED),
                constancy,
            },
            BinaryOp::Shl => match self.const_int(y) {
                Some(s) if (0..40).contains(&s) => AxisInfo {
                    contiguity: 1,
                    divisibility: (fx.divisibility_at(1) << s).min(UNBOUNDED),
                    constancy,
                },
                _ => unknown,
            },
            BinaryOp::Div => match self.const_int(y) {
                // Exact division of a multiple of d by a power of two p <= d.
                Some(p) if p > 0 && (p as u64).is_power_of_two() => {
                    let d = fx.divisibility_at(1);
                    AxisInfo {
                        contiguity: 1,
                        divisibility: if d >= p as u64 { d / p as u64 } else { 1 },
                        constancy,
                    }
                }
                _ => unknown,
            },
            _ => unknown,
        }
    }

    fn compare(&self, c: CmpOp, x: ValueId, y: ValueId) -> AxisInfo {
        let (fx, fy) = (self.out.get(x), self.out.get(y));
        let mut constancy = fx.constancy.min(fy.constancy);
        // `run < bound` / `run >= bound` with a contiguous run starting at a multiple of
        // g and a bound constant over it and a multiple of g: each aligned group of g
        // positions lies wholly on one side of the bound.
        let (run, bound) = match c {
            CmpOp::Lt | CmpOp::Ge => (fx, fy),
            CmpOp::Gt | CmpOp::Le => (fy, fx),
            _ => {
                return AxisInfo {
                    constancy,
                    ..AxisInfo::UNKNOWN_TILE
                }
            }
        };
        if self.is_int(x) && self.is_int(y) {
            let g = run
                .contiguity
                .min(bound.constancy)
                .min(bound.divisibility_at(1));
            let g = g.min(run.divisibility_at(g));
            constancy = constancy.max(g);
        }
        AxisInfo {
            constancy,
            ..AxisInfo::UNKNOWN_TILE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_helpers() {
        assert_eq!(pow2_factor(0), UNBOUNDED);
        assert_eq!(pow2_factor(24), 8);
        assert_eq!(pow2_factor(-12), 4);
        assert_eq!(pow2_factor(7), 1);
        assert_eq!(pow2_floor(0), 1);
        assert_eq!(pow2_floor(12), 8);
        assert_eq!(pow2_floor(16), 16);
    }

    #[test]
    fn divisibility_of_sub_groups() {
        let run = AxisInfo {
            contiguity: 64,
            divisibility: 1024,
            constancy: 1,
        };
        assert_eq!(run.divisibility_at(64), 1024);
        assert_eq!(run.divisibility_at(8), 8);
        assert_eq!(run.divisibility_at(1), 1);
        let scalar = AxisInfo::uniform(16);
        assert_eq!(scalar.divisibility_at(1), 16);
        assert_eq!(scalar.divisibility_at(64), 16);
    }
}
