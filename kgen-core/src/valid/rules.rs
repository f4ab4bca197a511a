//! Per-operation type rules of the tile IR (the "exact types" invariant of `ir/mod.rs`).
//!
//! Assumes: operands exist in the value arena (checked by the caller first).
//! Guarantees: `check_types` returns `Ok` only when the operand and result types fit the
//! operation exactly as documented on `ir::Op`.

use crate::ir::{BinaryOp, Function, Op, ParamKind, ReduceOp, UnaryOp, ValueId};
use crate::types::{DType, Shape, ValueType, MAX_TENSOR_RANK, MAX_TILE_ELEMENTS, MAX_TILE_RANK};

pub(super) fn check_tile_shape(shape: &Shape) -> Result<(), String> {
    if shape.rank() == 0 || shape.rank() > MAX_TILE_RANK {
        return Err(format!(
            "tile rank {} outside 1..={MAX_TILE_RANK}",
            shape.rank()
        ));
    }
    if shape.dims().contains(&0) {
        return Err(format!("tile shape {shape} has a zero extent"));
    }
    if shape.num_elements() > MAX_TILE_ELEMENTS {
        return Err(format!(
            "tile shape {shape} exceeds {MAX_TILE_ELEMENTS} elements"
        ));
    }
    Ok(())
}

type R = Result<(), String>;

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> R {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// The tile type of a slot of scratch buffer `buf`, after checking that the buffer
/// exists and that the slot index (of type `slot`) is an `i32` scalar.
fn scratch_slot_type(func: &Function, buf: u32, slot: &ValueType) -> Result<ValueType, String> {
    let b = func
        .scratch
        .get(buf as usize)
        .ok_or("no such scratch buffer")?;
    ensure(*slot == ValueType::Scalar(DType::I32), || {
        "scratch slot is not an i32 scalar".into()
    })?;
    Ok(ValueType::Tile(b.dtype, Shape(b.slot_shape.clone())))
}

pub(super) fn check_types(func: &Function, op: &Op, results: &[ValueId]) -> R {
    let ty = |v: &ValueId| func.values[*v].ty.clone();
    let n_results = match op {
        Op::Store { .. }
        | Op::Scatter { .. }
        | Op::ScratchStore { .. }
        | Op::ScratchFetch { .. }
        | Op::ScratchGather { .. }
        | Op::ScratchWait { .. }
        | Op::GridDependency(_)
        | Op::GridSync { .. }
        | Op::Barrier
        | Op::Yield(_) => 0,
        Op::For { inits, .. } => inits.len(),
        Op::If { .. } => results.len(),
        _ => 1,
    };
    ensure(results.len() == n_results, || {
        format!("{} results, expected {n_results}", results.len())
    })?;
    let res = results.first().map(ty);
    let res_ty = || res.clone().ok_or_else(|| "missing result".to_string());
    let scalar_i32 = ValueType::Scalar(DType::I32);
    match op {
        Op::Const(c) => ensure(res_ty()?.dtype() == c.dtype(), || {
            "const dtype differs from result".into()
        }),
        Op::ProgramId(a) | Op::NumPrograms(a) => {
            ensure(*a < 3, || format!("grid axis {a} ≥ 3"))?;
            ensure(res_ty()? == scalar_i32, || {
                "grid id must be an i32 scalar".into()
            })
        }
        Op::ClusterRank(size) => {
            ensure(size.is_power_of_two() && *size <= 16, || {
                format!("cluster size {size} is not 1, 2, 4, 8 or 16")
            })?;
            ensure(res_ty()? == scalar_i32, || {
                "cluster rank must be an i32 scalar".into()
            })
        }
        Op::ScalarParam(i) => match func.params.get(*i as usize).map(|p| &p.kind) {
            Some(ParamKind::Scalar(d)) => ensure(res_ty()? == ValueType::Scalar(*d), || {
                "scalar param type differs".into()
            }),
            _ => Err(format!("param {i} is not a scalar")),
        },
        Op::TensorDim { tensor, dim } | Op::TensorStride { tensor, dim } => {
            let t = func.tensor_param(*tensor).ok_or("not a tensor param")?;
            ensure((*dim as usize) < t.rank(), || {
                format!("dim {dim} ≥ rank {}", t.rank())
            })?;
            ensure(res_ty()? == scalar_i32, || {
                "shape/stride must be an i32 scalar".into()
            })
        }
        Op::Arange { start, end } => {
            let n = end
                .checked_sub(*start)
                .filter(|n| *n > 0)
                .ok_or("empty arange")?;
            let want = ValueType::Tile(
                DType::I32,
                Shape(vec![u32::try_from(n).map_err(|_| "arange too long")?]),
            );
            ensure(res_ty()? == want, || {
                "arange result must be tile<i32, [end-start]>".into()
            })
        }
        Op::Splat(v) => {
            let (a, r) = (ty(v), res_ty()?);
            ensure(
                matches!(a, ValueType::Scalar(_)) && r.shape().is_some() && a.dtype() == r.dtype(),
                || format!("splat {a} to {r}"),
            )
        }
        Op::Broadcast(v) => {
            let (a, r) = (ty(v), res_ty()?);
            let ok = match (a.shape(), r.shape()) {
                (Some(s), Some(t)) => {
                    s.rank() == t.rank()
                        && s.dims()
                            .iter()
                            .zip(t.dims())
                            .all(|(x, y)| x == y || *x == 1)
                        && a.dtype() == r.dtype()
                }
                _ => false,
            };
            ensure(ok, || format!("broadcast {a} to {r}"))
        }
        Op::Reshape(v) => {
            let (a, r) = (ty(v), res_ty()?);
            let ok = match (a.shape(), r.shape()) {
                (Some(s), Some(t)) => {
                    s.num_elements() == t.num_elements() && a.dtype() == r.dtype()
                }
                _ => false,
            };
            ensure(ok, || format!("reshape {a} to {r}"))
        }
        Op::ExpandDims(v, axis) => {
            let (a, r) = (ty(v), res_ty()?);
            let ok = match (a.shape(), r.shape()) {
                (Some(s), Some(t)) if (*axis as usize) <= s.rank() => {
                    let mut d = s.dims().to_vec();
                    d.insert(*axis as usize, 1);
                    d == t.dims() && a.dtype() == r.dtype()
                }
                _ => false,
            };
            ensure(ok, || format!("expand_dims {a} at {axis} to {r}"))
        }
        Op::Permute(v, perm) => {
            let (a, r) = (ty(v), res_ty()?);
            let ok = match (a.shape(), r.shape()) {
                (Some(s), Some(t)) => {
                    let mut seen = perm.clone();
                    seen.sort_unstable();
                    seen == (0..s.rank() as u8).collect::<Vec<_>>()
                        && perm
                            .iter()
                            .map(|p| s.dims()[*p as usize])
                            .collect::<Vec<_>>()
                            == t.dims()
                        && a.dtype() == r.dtype()
                }
                _ => false,
            };
            ensure(ok, || format!("permute {a} by {perm:?} to {r}"))
        }
        Op::Unary(u, v) => {
            let (a, r) = (ty(v), res_ty()?);
            ensure(a == r, || {
                format!("unary operand {a} differs from result {r}")
            })?;
            let d = a.dtype();
            let ok = match u {
                UnaryOp::Not => d == DType::Bool || d.is_int(),
                UnaryOp::Neg | UnaryOp::Abs => d.is_int() || d.is_float(),
                _ => d.is_float(),
            };
            ensure(ok, || format!("{u:?} on {d}"))
        }
        Op::Binary(b, x, y) => {
            let (a, c, r) = (ty(x), ty(y), res_ty()?);
            ensure(a == c && c == r, || {
                format!("binary operands {a}, {c} and result {r} differ")
            })?;
            let d = a.dtype();
            let ok = match b {
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => d == DType::Bool || d.is_int(),
                BinaryOp::Shl | BinaryOp::Shr => d.is_int(),
                BinaryOp::Pow | BinaryOp::FDiv => d.is_float(),
                _ => d.is_int() || d.is_float(),
            };
            ensure(ok, || format!("{b:?} on {d}"))
        }
        Op::Compare(_, x, y) => {
            let (a, c, r) = (ty(x), ty(y), res_ty()?);
            ensure(a == c && r == a.with_dtype(DType::Bool), || {
                format!("compare {a} with {c} giving {r}")
            })
        }
        Op::Select(c, x, y) => {
            let (ct, a, b, r) = (ty(c), ty(x), ty(y), res_ty()?);
            ensure(a == b && b == r, || {
                format!("select arms {a}, {b}, result {r}")
            })?;
            ensure(
                ct.dtype() == DType::Bool && (ct.shape().is_none() || ct.shape() == a.shape()),
                || format!("select condition {ct} for {a}"),
            )
        }
        Op::Fma(x, y, z) => {
            let (a, b, c, r) = (ty(x), ty(y), ty(z), res_ty()?);
            ensure(a == b && b == c && c == r && a.dtype().is_float(), || {
                "fma operands must be equal float types".into()
            })
        }
        Op::Cast(v) => {
            let (a, r) = (ty(v), res_ty()?);
            ensure(a.shape() == r.shape(), || {
                format!("cast {a} to {r} changes shape")
            })
        }
        Op::Reduce { op, value, axis } => {
            let (a, r) = (ty(value), res_ty()?);
            let s = a.shape().ok_or("reduce of a scalar")?;
            ensure((*axis as usize) < s.rank(), || {
                format!("axis {axis} ≥ rank {}", s.rank())
            })?;
            let mut dims = s.dims().to_vec();
            dims.remove(*axis as usize);
            let d = match op {
                ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I32,
                _ => a.dtype(),
            };
            let want = if dims.is_empty() {
                ValueType::Scalar(d)
            } else {
                ValueType::Tile(d, Shape(dims))
            };
            ensure(r == want, || format!("reduce result {r}, expected {want}"))?;
            ensure(a.dtype() != DType::Bool, || "reduce of bool".into())
        }
        Op::Scan {
            op, value, axis, ..
        } => {
            let (a, r) = (ty(value), res_ty()?);
            let s = a.shape().ok_or("scan of a scalar")?;
            ensure((*axis as usize) < s.rank(), || {
                format!("axis {axis} ≥ rank {}", s.rank())
            })?;
            ensure(r == a, || format!("scan result {r}, expected {a}"))?;
            ensure(op.accepts(a.dtype()), || {
                format!("scan.{} of {}", op.name(), a.dtype())
            })
        }
        Op::ScratchLoad { buf, slot } => {
            let want = scratch_slot_type(func, *buf, &ty(slot))?;
            let r = res_ty()?;
            ensure(r == want, || {
                format!("scratch_load result {r}, expected {want}")
            })
        }
        Op::ScratchStore { buf, slot, value } => {
            let want = scratch_slot_type(func, *buf, &ty(slot))?;
            let v = ty(value);
            ensure(v == want, || {
                format!("scratch_store of {v}, expected {want}")
            })
        }
        Op::ScratchFetch {
            buf,
            slot,
            tensor,
            index,
            padding,
            ..
        } => {
            // The pipeline's shared buffers hold rank-2 slots, also of a rank-3+
            // tensor's tiles whose leading extents are 1.
            let buf_shared =
                |f: &Function, b: u32| f.scratch.get(b as usize).is_some_and(|b| b.shared);
            let want = scratch_slot_type(func, *buf, &ty(slot))?;
            let t = func
                .tensor_param(*tensor)
                .ok_or("scratch_fetch from a non-tensor")?;
            check_index(func, index, t.rank())?;
            ensure(
                want.dtype() == t.dtype
                    && want.shape().is_some_and(|s| {
                        s.rank() == t.rank()
                            || (s.rank() == 2 && t.rank() > 2 && buf_shared(func, *buf))
                    }),
                || {
                    format!(
                        "scratch_fetch of {want} slots from a rank-{} {} tensor",
                        t.rank(),
                        t.dtype
                    )
                },
            )?;
            ensure(padding.dtype() == t.dtype, || {
                "padding dtype differs from tensor".into()
            })
        }
        Op::ScratchWait { .. } | Op::GridDependency(_) | Op::Barrier => Ok(()),
        Op::GridSync { counter } => {
            let t = func
                .tensor_param(*counter)
                .ok_or("grid_sync counter is not a tensor param")?;
            ensure(t.dtype == DType::I32 && t.rank() == 1, || {
                "grid_sync counter must be a 1-D i32 tensor".into()
            })
        }
        Op::ClusterGather { value, size } => {
            let (a, r) = (ty(value), res_ty()?);
            ensure(a.shape().is_none(), || {
                format!("cluster_gather of a tile {a}")
            })?;
            ensure(a.dtype() != DType::Bool, || "cluster_gather of bool".into())?;
            ensure(
                size.is_power_of_two() && *size <= crate::types::MAX_CLUSTER_SIZE,
                || format!("cluster size {size}"),
            )?;
            let want = ValueType::Tile(a.dtype(), Shape(vec![*size]));
            ensure(r == want, || {
                format!("cluster_gather result {r}, expected {want}")
            })
        }
        Op::Load {
            tensor,
            index,
            padding,
            ..
        } => {
            let t = func.tensor_param(*tensor).ok_or("load from a non-tensor")?;
            check_index(func, index, t.rank())?;
            let r = res_ty()?;
            ensure(
                r.dtype() == t.dtype && r.shape().map(|s| s.rank()) == Some(t.rank()),
                || format!("load result {r} for a rank-{} {} tensor", t.rank(), t.dtype),
            )?;
            ensure(padding.dtype() == t.dtype, || {
                "padding dtype differs from tensor".into()
            })
        }
        Op::Store {
            tensor,
            index,
            value,
            ..
        } => {
            let t = func.tensor_param(*tensor).ok_or("store to a non-tensor")?;
            check_index(func, index, t.rank())?;
            let v = ty(value);
            ensure(
                v.dtype() == t.dtype && v.shape().map(|s| s.rank()) == Some(t.rank()),
                || format!("store of {v} to a rank-{} {} tensor", t.rank(), t.dtype),
            )
        }
        Op::ScratchGather {
            buf,
            slot,
            tensor,
            offsets,
            mask,
            other,
            ..
        } => {
            let want = scratch_slot_type(func, *buf, &ty(slot))?;
            let t = func
                .tensor_param(*tensor)
                .ok_or("scratch_gather from a non-tensor")?;
            ensure(want.dtype() == t.dtype && other.dtype() == t.dtype, || {
                format!("scratch_gather of {want} slots from a {} tensor", t.dtype)
            })?;
            check_offsets(func, offsets, *mask, t.rank(), want.shape())
        }
        Op::Gather {
            tensor,
            offsets,
            mask,
            other,
            ..
        } => {
            let t = func
                .tensor_param(*tensor)
                .ok_or("gather from a non-tensor")?;
            let r = res_ty()?;
            ensure(r.dtype() == t.dtype && other.dtype() == t.dtype, || {
                "gather dtype differs from tensor".into()
            })?;
            check_offsets(func, offsets, *mask, t.rank(), r.shape())
        }
        Op::Scatter {
            tensor,
            offsets,
            value,
            mask,
            ..
        }
        | Op::AtomicAdd {
            tensor,
            offsets,
            value,
            mask,
        } => {
            let t = func
                .tensor_param(*tensor)
                .ok_or("scatter to a non-tensor")?;
            let v = ty(value);
            ensure(v.dtype() == t.dtype, || {
                "scatter value dtype differs from tensor".into()
            })?;
            if let Op::AtomicAdd { .. } = op {
                ensure(matches!(t.dtype, DType::F32 | DType::I32), || {
                    "atomic_add needs f32 or i32".into()
                })?;
                ensure(res_ty()? == v, || {
                    "atomic_add result differs from value".into()
                })?;
            }
            check_offsets(func, offsets, *mask, t.rank(), v.shape())
        }
        Op::Dot {
            a,
            b,
            acc,
            precision,
        } => {
            let (x, y, z, r) = (ty(a), ty(b), ty(acc), res_ty()?);
            let ok = match (x.shape(), y.shape(), z.shape()) {
                (Some(s), Some(t), Some(u)) if s.rank() == 2 && t.rank() == 2 && u.rank() == 2 => {
                    s.dims()[1] == t.dims()[0]
                        && u.dims() == [s.dims()[0], t.dims()[1]]
                        && x.dtype() == y.dtype()
                }
                _ => false,
            };
            ensure(ok && z == r, || format!("dot of {x} and {y} into {z}"))?;
            ensure(!precision.is_tf32() || x.dtype() == DType::F32, || {
                format!(
                    "dot with input_precision {} of {x} (f32 operands only)",
                    precision.name()
                )
            })
        }
        Op::For {
            lower, upper, step, ..
        } => {
            for v in [lower, upper, step] {
                ensure(ty(v) == scalar_i32, || {
                    "loop bounds must be i32 scalars".into()
                })?;
            }
            Ok(())
        }
        Op::If { cond, .. } => ensure(ty(cond) == ValueType::Scalar(DType::Bool), || {
            "if condition must be a bool scalar".into()
        }),
        Op::Yield(_) => Ok(()),
    }
}

fn check_index(func: &Function, index: &[ValueId], rank: usize) -> R {
    ensure(index.len() == rank && rank <= MAX_TENSOR_RANK, || {
        format!("{} indices for a rank-{rank} tensor", index.len())
    })?;
    for v in index {
        ensure(func.values[*v].ty == ValueType::Scalar(DType::I32), || {
            "tile index must be an i32 scalar".into()
        })?;
    }
    Ok(())
}

fn check_offsets(
    func: &Function,
    offsets: &[ValueId],
    mask: Option<ValueId>,
    rank: usize,
    shape: Option<&Shape>,
) -> R {
    let shape = shape.ok_or("gather/scatter on a scalar")?;
    ensure(offsets.len() == rank, || {
        format!("{} offsets for a rank-{rank} tensor", offsets.len())
    })?;
    for v in offsets {
        let t = &func.values[*v].ty;
        ensure(t.dtype().is_int() && t.shape() == Some(shape), || {
            format!("offset {t} must be an integer tile of shape {shape}")
        })?;
    }
    if let Some(m) = mask {
        let t = &func.values[m].ty;
        ensure(t.dtype() == DType::Bool && t.shape() == Some(shape), || {
            format!("mask {t} must be bool of shape {shape}")
        })?;
    }
    Ok(())
}
