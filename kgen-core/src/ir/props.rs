//! The one table of IR op properties, in the manner of Cranelift's `inst_predicates.rs`:
//! every question a pass asks about an op (may it be merged, dropped, moved; which values
//! does it read; which regions does it hold) is answered here.
//!
//! Guarantees: [`props`] has no wildcard arm, so an op added to `ir::Op` does not compile
//! until its row is written; [`Effects::ALL`] is the conservative row for an op whose
//! behaviour is not yet pinned down. [`for_each_operand`] and [`for_each_operand_mut`]
//! are expanded from one macro body, so the read-only and the mutable operand walks
//! cannot disagree.

use super::{Block, Op, ValueId};

/// What an op does besides computing its results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Effects {
    /// Reads global memory or a scratch buffer (results may change if a write comes
    /// between two executions).
    pub reads_memory: bool,
    /// Writes global memory or a scratch buffer.
    pub writes_memory: bool,
    /// Exchanges values with the other blocks of a cluster (every block must execute the
    /// same sequence; dropping it everywhere at once is fine, merging or moving is not).
    pub exchanges: bool,
    /// Orders or waits (barriers, async-copy waits, grid dependencies).
    pub syncs: bool,
    /// Holds regions or ends one (`for`, `if`, `yield`).
    pub control: bool,
}

impl Effects {
    pub const NONE: Effects = Effects {
        reads_memory: false,
        writes_memory: false,
        exchanges: false,
        syncs: false,
        control: false,
    };
    pub const ALL: Effects = Effects {
        reads_memory: true,
        writes_memory: true,
        exchanges: true,
        syncs: true,
        control: true,
    };
    const READS: Effects = Effects {
        reads_memory: true,
        ..Effects::NONE
    };
    const WRITES: Effects = Effects {
        writes_memory: true,
        ..Effects::NONE
    };
    const READS_WRITES: Effects = Effects {
        reads_memory: true,
        writes_memory: true,
        ..Effects::NONE
    };
    const SYNC: Effects = Effects {
        reads_memory: true,
        writes_memory: true,
        syncs: true,
        ..Effects::NONE
    };
    /// `grid_sync`: a barrier across the grid that orders every block's memory accesses.
    const GRID_SYNC: Effects = Effects {
        reads_memory: true,
        writes_memory: true,
        exchanges: true,
        syncs: true,
        control: false,
    };
    const CONTROL: Effects = Effects {
        control: true,
        ..Effects::NONE
    };
    const EXCHANGE: Effects = Effects {
        exchanges: true,
        ..Effects::NONE
    };
}

/// The kind of computation, for passes that treat families alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// Constants, `splat`, `arange`.
    Constant,
    /// Program ids, grid size, parameters, tensor extents and strides.
    Query,
    /// One result element from the same-position operand elements.
    Elementwise,
    /// Moves elements (`broadcast`, `reshape`, `expand_dims`, `permute`).
    Shape,
    /// Combines elements along an axis (reductions, scans).
    AxisCombine,
    /// `dot`.
    Contraction,
    Memory,
    Sync,
    Control,
}

/// Everything a pass may ask about one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpProps {
    pub class: OpClass,
    pub effects: Effects,
}

impl OpProps {
    /// No effect at all: two equal instructions may be merged (CSE).
    pub fn is_pure(&self) -> bool {
        self.effects == Effects::NONE
    }

    /// Removable when its results are unused: it writes nothing, waits for nothing and
    /// holds no region (reads and cluster exchanges may go).
    pub fn is_removable(&self) -> bool {
        !self.effects.writes_memory && !self.effects.syncs && !self.effects.control
    }

    /// A pure value op that is cheap to recompute or move earlier (past anything but its
    /// operands' definitions): constants, element-wise and shape ops.
    pub fn is_movable_value(&self) -> bool {
        self.is_pure()
            && matches!(
                self.class,
                OpClass::Constant | OpClass::Elementwise | OpClass::Shape
            )
    }
}

/// The properties of `op`.
pub fn props(op: &Op) -> OpProps {
    use OpClass as C;
    let (class, effects) = match op {
        Op::Const(_) | Op::Splat(_) | Op::Arange { .. } => (C::Constant, Effects::NONE),
        Op::ProgramId(_)
        | Op::NumPrograms(_)
        | Op::ClusterRank(_)
        | Op::ScalarParam(_)
        | Op::TensorDim { .. }
        | Op::TensorStride { .. } => (C::Query, Effects::NONE),
        Op::Unary(..)
        | Op::Binary(..)
        | Op::Compare(..)
        | Op::Select(..)
        | Op::Fma(..)
        | Op::Cast(_) => (C::Elementwise, Effects::NONE),
        Op::Broadcast(_) | Op::Reshape(_) | Op::ExpandDims(..) | Op::Permute(..) => {
            (C::Shape, Effects::NONE)
        }
        Op::Reduce { .. } | Op::Scan { .. } => (C::AxisCombine, Effects::NONE),
        Op::Dot { .. } => (C::Contraction, Effects::NONE),
        Op::Load { .. } | Op::Gather { .. } | Op::ScratchLoad { .. } => (C::Memory, Effects::READS),
        Op::Store { .. } | Op::Scatter { .. } | Op::ScratchStore { .. } => {
            (C::Memory, Effects::WRITES)
        }
        Op::AtomicAdd { .. } | Op::ScratchFetch { .. } | Op::ScratchGather { .. } => {
            (C::Memory, Effects::READS_WRITES)
        }
        Op::ClusterGather { .. } => (C::Memory, Effects::EXCHANGE),
        Op::ScratchWait { .. } | Op::GridDependency(_) | Op::Barrier => (C::Sync, Effects::SYNC),
        Op::GridSync { .. } => (C::Sync, Effects::GRID_SYNC),
        Op::For { .. } | Op::If { .. } | Op::Yield(_) => (C::Control, Effects::CONTROL),
    };
    OpProps { class, effects }
}

/// One match over every op's operand slots (not values used inside its regions), in
/// order; expanded for `&Op` and `&mut Op` alike (match ergonomics bind `&` or `&mut`).
macro_rules! walk_operands {
    ($op:expr, $f:ident) => {
        match $op {
            Op::Const(_)
            | Op::ProgramId(_)
            | Op::NumPrograms(_)
            | Op::ClusterRank(_)
            | Op::ScalarParam(_)
            | Op::TensorDim { .. }
            | Op::TensorStride { .. }
            | Op::Arange { .. }
            | Op::ScratchWait { .. }
            | Op::GridDependency(_)
            | Op::GridSync { .. }
            | Op::Barrier => {}
            Op::Splat(v)
            | Op::Broadcast(v)
            | Op::Reshape(v)
            | Op::ExpandDims(v, _)
            | Op::Permute(v, _)
            | Op::Unary(_, v)
            | Op::Cast(v)
            | Op::Reduce { value: v, .. }
            | Op::Scan { value: v, .. }
            | Op::ClusterGather { value: v, .. }
            | Op::ScratchLoad { slot: v, .. } => $f(v),
            Op::ScratchStore { slot, value, .. } => {
                $f(slot);
                $f(value);
            }
            Op::ScratchFetch { slot, index, .. } => {
                $f(slot);
                for v in index {
                    $f(v);
                }
            }
            Op::ScratchGather {
                slot,
                offsets,
                mask,
                ..
            } => {
                $f(slot);
                for v in offsets {
                    $f(v);
                }
                if let Some(m) = mask {
                    $f(m);
                }
            }
            Op::Binary(_, a, b) | Op::Compare(_, a, b) => {
                $f(a);
                $f(b);
            }
            Op::Select(a, b, c) | Op::Fma(a, b, c) => {
                $f(a);
                $f(b);
                $f(c);
            }
            Op::Dot { a, b, acc, .. } => {
                $f(a);
                $f(b);
                $f(acc);
            }
            Op::Load { index, .. } => {
                for v in index {
                    $f(v);
                }
            }
            Op::Store { index, value, .. } => {
                for v in index {
                    $f(v);
                }
                $f(value);
            }
            Op::Gather { offsets, mask, .. } => {
                for v in offsets {
                    $f(v);
                }
                if let Some(m) = mask {
                    $f(m);
                }
            }
            Op::Scatter {
                offsets,
                value,
                mask,
                ..
            }
            | Op::AtomicAdd {
                offsets,
                value,
                mask,
                ..
            } => {
                for v in offsets {
                    $f(v);
                }
                $f(value);
                if let Some(m) = mask {
                    $f(m);
                }
            }
            Op::For {
                lower,
                upper,
                step,
                inits,
                ..
            } => {
                $f(lower);
                $f(upper);
                $f(step);
                for v in inits {
                    $f(v);
                }
            }
            Op::If { cond, .. } => $f(cond),
            Op::Yield(vs) => {
                for v in vs {
                    $f(v);
                }
            }
        }
    };
}

/// Calls `f` on every operand of `op`, in order.
pub fn for_each_operand(op: &Op, mut f: impl FnMut(&ValueId)) {
    walk_operands!(op, f)
}

/// Calls `f` on every operand slot of `op`, in order, mutably.
pub fn for_each_operand_mut(op: &mut Op, mut f: impl FnMut(&mut ValueId)) {
    walk_operands!(op, f)
}

/// The operands of `op`, in order.
pub fn operands(op: &Op) -> Vec<ValueId> {
    let mut v = Vec::new();
    for_each_operand(op, |&o| v.push(o));
    v
}

/// The regions `op` holds (a `for` body; an `if`'s then and else blocks).
pub fn regions(op: &Op) -> Vec<&Block> {
    match op {
        Op::For { body, .. } => vec![body],
        Op::If {
            then_body,
            else_body,
            ..
        } => vec![then_body, else_body],
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, ReduceOp};
    use crate::types::Scalar;

    fn h(n: u32) -> ValueId {
        ValueId::from_index(n as usize)
    }

    #[test]
    fn the_mutable_walk_visits_the_same_slots_as_the_read_only_walk() {
        let ops = vec![
            Op::Binary(BinaryOp::Add, h(1), h(2)),
            Op::Dot {
                a: h(1),
                b: h(2),
                acc: h(3),
                precision: crate::ir::InputPrecision::Tf32,
            },
            Op::Store {
                tensor: 0,
                index: vec![h(4), h(5)],
                value: h(6),
                eviction: Default::default(),
            },
            Op::Gather {
                tensor: 0,
                offsets: vec![h(1), h(2)],
                mask: Some(h(3)),
                other: Scalar::Float(0.0, crate::types::DType::F32),
                eviction: Default::default(),
            },
            Op::Reduce {
                op: ReduceOp::Sum,
                value: h(7),
                axis: 0,
            },
            Op::Yield(vec![h(8), h(9)]),
        ];
        for mut op in ops {
            let read = operands(&op);
            let mut slots = Vec::new();
            for_each_operand_mut(&mut op, |s| slots.push(*s));
            assert_eq!(read, slots, "{op:?}");
            // Rewriting every slot is seen by the read-only walk.
            for_each_operand_mut(&mut op, |s| *s = h(42));
            assert!(operands(&op).iter().all(|&o| o == h(42)));
        }
    }

    #[test]
    fn the_table_answers_each_pass_question() {
        let add = props(&Op::Binary(BinaryOp::Add, h(1), h(2)));
        assert!(add.is_pure() && add.is_removable() && add.is_movable_value());
        let load = props(&Op::Load {
            tensor: 0,
            index: vec![],
            padding: Scalar::Float(0.0, crate::types::DType::F32),
            eviction: Default::default(),
        });
        assert!(!load.is_pure() && load.is_removable() && !load.is_movable_value());
        let dot = props(&Op::Dot {
            a: h(1),
            b: h(2),
            acc: h(3),
            precision: Default::default(),
        });
        assert!(
            dot.is_pure() && !dot.is_movable_value(),
            "merge yes, hoist no"
        );
        let wait = props(&Op::ScratchWait { pending: 0 });
        assert!(!wait.is_removable());
        assert!(!props(&Op::Barrier).is_removable());
        let gather = props(&Op::ClusterGather {
            value: h(1),
            size: 2,
        });
        assert!(gather.is_removable() && !gather.is_pure());
    }
}
