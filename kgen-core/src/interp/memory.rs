//! Global-memory access: argument checks for tensor views, and element reads/writes for
//! `load`/`store` (tile-indexed) and `gather`/`scatter`/`atomic_add` (coordinate tiles).
//!
//! Assumes: tensors passed in have been accepted by [`check_tensor`] (so in-bounds
//! coordinates map to offsets inside the storage); values are well-formed [`Val`]s.
//! Guarantees:
//! - element offsets are computed in i64/usize from coordinates and the tensor's strides,
//!   so no index arithmetic wraps; a coordinate < 0 or ≥ the extent is out of bounds;
//! - reads of out-of-bounds or masked-off elements give the fill value (`padding` /
//!   `other`, converted to the tensor dtype); writes skip them;
//! - writes and atomic adds apply in row-major order of the tile (a later element wins
//!   for duplicate coordinates in one `scatter`; atomic adds accumulate);
//! - every storage offset is checked against the storage before any access, so a bad
//!   offset is an error, never a panic.

use super::value::{Data, Val};
use super::InterpError;
use crate::host::HostTensor;
use crate::ir::TensorParam;
use half::{bf16, f16};

/// Marks an element that is not accessed.
pub(crate) const SKIP: usize = usize::MAX;
/// The largest extent or stride a kernel receives (they travel as `.s32`).
const MAX_INDEX: usize = i32::MAX as usize;

fn bad(msg: String) -> InterpError {
    InterpError::Malformed(msg)
}

/// Checks a tensor argument against its parameter declaration.
pub(crate) fn check_tensor(
    index: usize,
    p: &TensorParam,
    t: &HostTensor,
) -> Result<(), InterpError> {
    if t.dtype != p.dtype {
        return Err(InterpError::ArgDType {
            index,
            expected: p.dtype,
            got: t.dtype,
        });
    }
    if t.shape.len() != p.rank() || t.strides.len() != t.shape.len() {
        return Err(InterpError::ArgRank {
            index,
            expected: p.rank(),
            got: t.shape.len(),
            strides: t.strides.len(),
        });
    }
    for (dim, (want, &got)) in p.dims.iter().zip(&t.shape).enumerate() {
        if let Some(w) = want {
            if *w as usize != got {
                return Err(InterpError::ConstDimMismatch {
                    index,
                    dim,
                    expected: *w,
                    got,
                });
            }
        }
    }
    let rank = t.shape.len();
    if p.contiguous && rank > 0 && t.shape[rank - 1] > 1 && t.strides[rank - 1] != 1 {
        return Err(InterpError::NotContiguous {
            index,
            stride: t.strides[rank - 1],
        });
    }
    for d in 0..rank {
        if t.shape[d] > MAX_INDEX || t.strides[d] > MAX_INDEX {
            return Err(InterpError::TensorTooLarge {
                index,
                dim: d,
                extent: t.shape[d],
                stride: t.strides[d],
            });
        }
    }
    if t.shape.iter().all(|&e| e > 0) {
        // The last element reached, plus one.
        let needed = 1 + t
            .shape
            .iter()
            .zip(&t.strides)
            .map(|(&e, &s)| (e as u128 - 1) * s as u128)
            .sum::<u128>();
        let have = t.storage_len() as u128;
        if needed > have {
            return Err(InterpError::StorageTooSmall {
                index,
                needed: needed as u64,
                available: have as u64,
            });
        }
    }
    Ok(())
}

/// Storage offsets of the tile `[tile]` whose first element is at coordinates `base`.
pub(crate) fn tile_offsets(
    t: &HostTensor,
    base: &[i64],
    tile: &[u32],
) -> Result<Vec<usize>, InterpError> {
    let rank = t.shape.len();
    if base.len() != rank || tile.len() != rank || rank == 0 {
        return Err(bad(format!(
            "tile of rank {} for a rank-{rank} tensor",
            tile.len()
        )));
    }
    // Per dimension: the offset contribution of each tile coordinate, or SKIP.
    let parts: Vec<Vec<usize>> = (0..rank)
        .map(|d| {
            (0..tile[d] as i64)
                .map(|i| {
                    let c = base[d].saturating_add(i);
                    if c >= 0 && (c as u64) < t.shape[d] as u64 {
                        c as usize * t.strides[d]
                    } else {
                        SKIP
                    }
                })
                .collect()
        })
        .collect();
    let n: usize = tile.iter().map(|&d| d as usize).product();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; rank];
    let last = &parts[rank - 1];
    loop {
        let mut outer = 0usize;
        let mut skip = false;
        for d in 0..rank - 1 {
            let p = parts[d][idx[d]];
            skip |= p == SKIP;
            outer = outer.wrapping_add(p);
        }
        if skip {
            out.resize(out.len() + last.len(), SKIP);
        } else {
            out.extend(
                last.iter()
                    .map(|&p| if p == SKIP { SKIP } else { outer + p }),
            );
        }
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return Ok(out);
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < tile[d] as usize {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Storage offsets for coordinate tiles (one per tensor dimension) under an optional mask.
pub(crate) fn coord_offsets(
    t: &HostTensor,
    coords: &[&Val],
    mask: Option<&Val>,
    shape: &[u32],
) -> Result<Vec<usize>, InterpError> {
    let rank = t.shape.len();
    if coords.len() != rank {
        return Err(bad(format!(
            "{} coordinate tiles for a rank-{rank} tensor",
            coords.len()
        )));
    }
    let n = shape.iter().map(|&d| d as usize).product::<usize>();
    let mut out = vec![0usize; n];
    for (d, c) in coords.iter().enumerate() {
        if c.shape != shape {
            return Err(bad(format!(
                "coordinate tile {:?} for a {shape:?} access",
                c.shape
            )));
        }
        let v = c
            .data
            .to_i64_vec()
            .ok_or_else(|| bad("non-integer coordinates".into()))?;
        let (extent, stride) = (t.shape[d] as i64, t.strides[d]);
        for (o, &c) in out.iter_mut().zip(&v) {
            if *o != SKIP {
                *o = if c >= 0 && c < extent {
                    *o + c as usize * stride
                } else {
                    SKIP
                };
            }
        }
    }
    if let Some(m) = mask {
        let Data::Bool(mv) = &m.data else {
            return Err(bad("mask is not bool".into()));
        };
        if m.shape != shape {
            return Err(bad(format!("mask {:?} for a {shape:?} access", m.shape)));
        }
        for (o, &keep) in out.iter_mut().zip(mv) {
            if !keep {
                *o = SKIP;
            }
        }
    }
    Ok(out)
}

/// Fails unless every accessed offset is inside the storage.
fn check_in_storage(t: &HostTensor, offs: &[usize]) -> Result<(), InterpError> {
    let max = offs.iter().copied().filter(|&o| o != SKIP).max();
    match max {
        Some(m) if m >= t.storage_len() => Err(bad(format!(
            "element offset {m} outside the storage of {} elements",
            t.storage_len()
        ))),
        _ => Ok(()),
    }
}

macro_rules! rd {
    ($d:expr, $o:expr, $t:ty, $n:literal) => {{
        let mut b = [0u8; $n];
        b.copy_from_slice(&$d[$o * $n..$o * $n + $n]);
        <$t>::from_le_bytes(b)
    }};
}

/// Reads the elements at `offs`; skipped ones take `fill[0]` (same kind as the tensor).
pub(crate) fn read(t: &HostTensor, offs: &[usize], fill: &Data) -> Result<Data, InterpError> {
    use crate::types::DType as D;
    check_in_storage(t, offs)?;
    let d = &t.data;
    macro_rules! go {
        ($variant:ident, $f:expr) => {{
            let Data::$variant(fv) = fill else {
                return Err(bad("fill kind differs from the tensor".into()));
            };
            let fv = *fv.first().ok_or_else(|| bad("empty fill".into()))?;
            Data::$variant(
                offs.iter()
                    .map(|&o| if o == SKIP { fv } else { $f(o) })
                    .collect(),
            )
        }};
    }
    Ok(match t.dtype {
        D::Bool => go!(Bool, |o: usize| d[o] != 0),
        D::I32 => go!(I32, |o: usize| rd!(d, o, i32, 4)),
        D::U32 => go!(U32, |o: usize| rd!(d, o, u32, 4)),
        D::I64 => go!(I64, |o: usize| rd!(d, o, i64, 8)),
        D::F32 => go!(F, |o: usize| rd!(d, o, f32, 4)),
        D::F16 => go!(F, |o: usize| f16::from_bits(rd!(d, o, u16, 2)).to_f32()),
        D::BF16 => go!(F, |o: usize| bf16::from_bits(rd!(d, o, u16, 2)).to_f32()),
    })
}

/// Writes `v`'s elements at `offs` (skipping SKIP), in row-major order.
pub(crate) fn write(t: &mut HostTensor, offs: &[usize], v: &Val) -> Result<(), InterpError> {
    use crate::types::DType as D;
    if v.dtype != t.dtype || v.numel() != offs.len() {
        return Err(bad(format!(
            "store of {} {:?} to a {} tensor",
            v.dtype, v.shape, t.dtype
        )));
    }
    check_in_storage(t, offs)?;
    let dtype = t.dtype;
    let d = &mut t.data;
    macro_rules! go {
        ($variant:ident, $n:literal, $f:expr) => {{
            let Data::$variant(xs) = &v.data else {
                return Err(bad("value kind differs from the tensor".into()));
            };
            for (&o, &x) in offs.iter().zip(xs) {
                if o != SKIP {
                    d[o * $n..o * $n + $n].copy_from_slice(&$f(x));
                }
            }
        }};
    }
    match dtype {
        D::Bool => go!(Bool, 1, |x: bool| [x as u8]),
        D::I32 => go!(I32, 4, |x: i32| x.to_le_bytes()),
        D::U32 => go!(U32, 4, |x: u32| x.to_le_bytes()),
        D::I64 => go!(I64, 8, |x: i64| x.to_le_bytes()),
        D::F32 => go!(F, 4, |x: f32| x.to_le_bytes()),
        D::F16 => go!(F, 2, |x: f32| f16::from_f32(x).to_bits().to_le_bytes()),
        D::BF16 => go!(F, 2, |x: f32| bf16::from_f32(x).to_bits().to_le_bytes()),
    }
    Ok(())
}

/// Adds `v` at `offs` element by element in row-major order and returns the previous
/// values (0 where skipped). i32/u32/i64 wrap; f32 rounds in f32; f16/bf16 compute in
/// f32 and round to the dtype.
pub(crate) fn atomic_add(t: &mut HostTensor, offs: &[usize], v: &Val) -> Result<Data, InterpError> {
    use crate::types::DType as D;
    if v.dtype != t.dtype || v.numel() != offs.len() {
        return Err(bad(format!(
            "atomic_add of {} {:?} to a {} tensor",
            v.dtype, v.shape, t.dtype
        )));
    }
    check_in_storage(t, offs)?;
    let dtype = t.dtype;
    let d = &mut t.data;
    macro_rules! go {
        ($variant:ident, $zero:expr, $n:literal, $rd:expr, $add:expr, $wr:expr) => {{
            let Data::$variant(xs) = &v.data else {
                return Err(bad("value kind differs from the tensor".into()));
            };
            let mut old = Vec::with_capacity(xs.len());
            for (&o, &x) in offs.iter().zip(xs) {
                if o == SKIP {
                    old.push($zero);
                    continue;
                }
                let prev = $rd(&d[o * $n..o * $n + $n]);
                old.push(prev);
                d[o * $n..o * $n + $n].copy_from_slice(&$wr($add(prev, x)));
            }
            Data::$variant(old)
        }};
    }
    fn b4(s: &[u8]) -> [u8; 4] {
        [s[0], s[1], s[2], s[3]]
    }
    fn b2(s: &[u8]) -> [u8; 2] {
        [s[0], s[1]]
    }
    Ok(match dtype {
        D::I32 => go!(
            I32,
            0,
            4,
            |s: &[u8]| i32::from_le_bytes(b4(s)),
            i32::wrapping_add,
            |x: i32| x.to_le_bytes()
        ),
        D::U32 => go!(
            U32,
            0,
            4,
            |s: &[u8]| u32::from_le_bytes(b4(s)),
            u32::wrapping_add,
            |x: u32| x.to_le_bytes()
        ),
        D::I64 => go!(
            I64,
            0,
            8,
            |s: &[u8]| i64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]),
            i64::wrapping_add,
            |x: i64| x.to_le_bytes()
        ),
        D::F32 => go!(
            F,
            0.0,
            4,
            |s: &[u8]| f32::from_le_bytes(b4(s)),
            |a: f32, b: f32| a + b,
            |x: f32| x.to_le_bytes()
        ),
        D::F16 => go!(
            F,
            0.0,
            2,
            |s: &[u8]| f16::from_bits(u16::from_le_bytes(b2(s))).to_f32(),
            |a: f32, b: f32| a + b,
            |x: f32| f16::from_f32(x).to_bits().to_le_bytes()
        ),
        D::BF16 => go!(
            F,
            0.0,
            2,
            |s: &[u8]| bf16::from_bits(u16::from_le_bytes(b2(s))).to_f32(),
            |a: f32, b: f32| a + b,
            |x: f32| bf16::from_f32(x).to_bits().to_le_bytes()
        ),
        D::Bool => return Err(bad("atomic_add on bool".into())),
    })
}
