//! Pure argument checking and parameter packing: everything the launcher decides before
//! it touches the GPU. No driver needed, so all of it is unit-tested on any machine.

use crate::error::ArgError;
use kgen_core::abi::{AbiSlot, KernelAbi, SourceParam};
use kgen_core::host::{ArgValue, HostTensor};
use kgen_core::types::{DType, Scalar};

/// The largest extent or stride (in elements) a kernel receives: they travel as `.s32`.
pub const MAX_INDEX: usize = (1usize << 31) - 1;

/// The alignment device allocations have (cuMemAlloc gives at least 256 bytes).
pub const DEVICE_ALLOC_ALIGN: u64 = 256;

/// The largest power of two ≤ 16 that divides `bytes` (16 for 0).
pub fn pow2_align(bytes: u64) -> u32 {
    if bytes == 0 {
        return 16;
    }
    let tz = bytes.trailing_zeros().min(4);
    1u32 << tz
}

fn kind_name(a: &ArgValue) -> &'static str {
    match a {
        ArgValue::Tensor(_) => "tensor",
        ArgValue::Scalar(_) => "scalar",
    }
}

/// The name of a source parameter.
pub fn source_param_name(p: &SourceParam) -> &str {
    match p {
        SourceParam::Tensor { name, .. } | SourceParam::Scalar { name, .. } => name,
    }
}

/// Checks every argument against the kernel's source parameters: count, kind, dtype,
/// rank, constant dimensions, contiguity, sizes and the specialization's alignment.
/// Host tensors are copied into fresh device allocations, so their base address is
/// taken as [`DEVICE_ALLOC_ALIGN`]-aligned.
pub fn validate_args(kernel: &str, abi: &KernelAbi, args: &[ArgValue]) -> Result<(), ArgError> {
    if args.len() != abi.source_params.len() {
        return Err(ArgError::ArgCount {
            kernel: kernel.to_string(),
            expected: abi.source_params.len(),
            got: args.len(),
        });
    }
    for (p, a) in abi.source_params.iter().zip(args) {
        match (p, a) {
            (SourceParam::Scalar { name, dtype }, ArgValue::Scalar(s)) => {
                if s.dtype() != *dtype {
                    return Err(ArgError::DtypeMismatch {
                        param: name.clone(),
                        expected: *dtype,
                        got: s.dtype(),
                    });
                }
            }
            (
                SourceParam::Tensor {
                    name,
                    dtype,
                    dims,
                    contiguous,
                    align_bytes,
                    ..
                },
                ArgValue::Tensor(t),
            ) => {
                if t.dtype != *dtype {
                    return Err(ArgError::DtypeMismatch {
                        param: name.clone(),
                        expected: *dtype,
                        got: t.dtype,
                    });
                }
                let elem = t.dtype.size_bytes() as usize;
                if t.data.len() % elem != 0 {
                    return Err(ArgError::SizeOutOfRange {
                        param: name.clone(),
                        what: format!(
                            "the storage holds {} bytes, not a whole number of {}-byte elements",
                            t.data.len(),
                            elem
                        ),
                    });
                }
                check_tensor_view(
                    name,
                    dims,
                    *contiguous,
                    *align_bytes,
                    t.dtype,
                    &t.shape,
                    &t.strides,
                    t.data.len() / elem,
                    0,
                )?;
            }
            (p, a) => {
                return Err(ArgError::WrongKind {
                    param: source_param_name(p).to_string(),
                    expected: match p {
                        SourceParam::Tensor { .. } => "tensor",
                        SourceParam::Scalar { .. } => "scalar",
                    },
                    got: kind_name(a),
                })
            }
        }
    }
    Ok(())
}

/// Checks one tensor view (shape and strides in elements over `storage_len` elements at
/// byte address `base_addr`) against a tensor parameter's declaration.
#[allow(
    clippy::too_many_arguments,
    unknown_lints,
    clippy::manual_is_multiple_of
)]
pub fn check_tensor_view(
    name: &str,
    dims: &[Option<u32>],
    contiguous: bool,
    align_bytes: u32,
    dtype: DType,
    shape: &[usize],
    strides: &[usize],
    storage_len: usize,
    base_addr: u64,
) -> Result<(), ArgError> {
    let param = || name.to_string();
    if shape.len() != dims.len() {
        return Err(ArgError::RankMismatch {
            param: param(),
            expected: dims.len(),
            got: shape.len(),
        });
    }
    if strides.len() != shape.len() {
        return Err(ArgError::SizeOutOfRange {
            param: param(),
            what: format!(
                "the view has {} extents but {} strides",
                shape.len(),
                strides.len()
            ),
        });
    }
    for (d, (want, &got)) in dims.iter().zip(shape).enumerate() {
        if let Some(w) = want {
            if *w as usize != got {
                return Err(ArgError::ConstDimMismatch {
                    param: param(),
                    dim: d,
                    expected: *w,
                    got,
                });
            }
        }
    }
    let rank = shape.len();
    if contiguous && rank > 0 && shape[rank - 1] > 1 && strides[rank - 1] != 1 {
        return Err(ArgError::NotContiguous {
            param: param(),
            stride: strides[rank - 1],
        });
    }
    for d in 0..rank {
        if shape[d] > MAX_INDEX {
            return Err(ArgError::SizeOutOfRange {
                param: param(),
                what: format!(
                    "extent {} of dimension {d} does not fit in 32 bits (max {MAX_INDEX})",
                    shape[d]
                ),
            });
        }
        if strides[d] > MAX_INDEX {
            return Err(ArgError::SizeOutOfRange {
                param: param(),
                what: format!(
                    "stride {} of dimension {d} does not fit in 32 bits (max {MAX_INDEX})",
                    strides[d]
                ),
            });
        }
    }
    let num: usize = shape.iter().product();
    if num > 0 {
        // The last element the view reaches must lie inside the storage.
        let mut last: u128 = 0;
        for d in 0..rank {
            last += (shape[d] as u128 - 1) * strides[d] as u128;
        }
        if last >= storage_len as u128 {
            return Err(ArgError::SizeOutOfRange {
                param: param(),
                what: format!(
                    "the view {:?} with strides {:?} reaches element {last}, but the storage holds only {storage_len} element(s)",
                    shape, strides
                ),
            });
        }
    }
    // Alignment, as `ir::TensorParam::align_bytes` defines it: the base address, every
    // stride but the contiguous one (in bytes) and the extent of the contiguous dimension
    // (in bytes) are multiples of it. A stride of a dimension of extent ≤ 1 is never used.
    // For a tensor not declared `contiguous`, the last dimension is not checked either.
    let required = align_bytes.max(1);
    let elem = dtype.size_bytes() as u64;
    // `what` is formatted only on failure: this runs on every launch.
    let check = |what: &dyn Fn() -> String, bytes: u64| -> Result<(), ArgError> {
        if bytes % required as u64 != 0 {
            return Err(ArgError::Misaligned {
                param: param(),
                required,
                actual: pow2_align(bytes),
                what: what(),
            });
        }
        Ok(())
    };
    check(&|| "the base address".to_string(), base_addr)?;
    for d in 0..rank {
        // The last dimension's stride is either 1 by declaration (`contiguous`) or a
        // runtime value no access can vectorize over; it is never part of the alignment.
        if d + 1 == rank {
            continue;
        }
        if shape[d] <= 1 {
            continue;
        }
        check(
            &|| format!("the stride of dimension {d} ({} elements)", strides[d]),
            strides[d] as u64 * elem,
        )?;
    }
    if contiguous && rank > 0 {
        check(
            &|| {
                format!(
                    "the extent of the contiguous dimension {} ({} elements)",
                    rank - 1,
                    shape[rank - 1]
                )
            },
            shape[rank - 1] as u64 * elem,
        )?;
    }
    Ok(())
}

/// The largest alignment (16, 8, 4, 2 or 1 bytes) under `ir::TensorParam::align_bytes`'s
/// rules that a host tensor satisfies once copied to a fresh device allocation. Compile
/// with it (`CompileOptions::tensor_align`) to get a specialization that accepts the
/// tensor.
pub fn natural_alignment(t: &HostTensor, contiguous: bool) -> u32 {
    let elem = t.dtype.size_bytes() as u64;
    let rank = t.shape.len();
    let mut a = 16u32;
    for d in 0..rank.min(t.strides.len()) {
        if d + 1 == rank {
            continue;
        }
        if t.shape[d] <= 1 {
            continue;
        }
        a = a.min(pow2_align(t.strides[d] as u64 * elem));
    }
    if contiguous && rank > 0 {
        a = a.min(pow2_align(t.shape[rank - 1] as u64 * elem));
    }
    a
}

/// The bytes of a scalar argument as the PTX parameter holds them (little-endian, in
/// the low bytes of a u64): `bool` as `.u32` 0/1, f16/bf16 as `.b16` bits.
pub fn scalar_param_bits(s: Scalar, dtype: DType) -> (u64, u32) {
    let v = kgen_core::host::scalar_from_f64(dtype, s.to_f64());
    let v = match (s, dtype) {
        // Integers keep their exact bit pattern (to_f64 would round i64 beyond 2^53).
        (Scalar::Int(i, _), d) if d.is_int() => Scalar::Int(i, d),
        _ => v,
    };
    match (dtype, v) {
        (DType::Bool, s) => ((s.to_f64() != 0.0) as u64, 4),
        (DType::I32, Scalar::Int(i, _)) => ((i as i32) as u32 as u64, 4),
        (DType::U32, Scalar::Int(i, _)) => (i as u32 as u64, 4),
        (DType::I64, Scalar::Int(i, _)) => (i as u64, 8),
        (DType::F32, s) => ((s.to_f64() as f32).to_bits() as u64, 4),
        // One rounding from the argument's own value (f64 or integer) to 16 bits.
        (DType::F16 | DType::BF16, _) => (kgen_core::host::half_bits(dtype, s) as u64, 2),
        // scalar_from_f64 gives Int for every integer dtype; keep a total match anyway.
        (_, s) => (s.to_f64() as i64 as u64, dtype.size_bytes()),
    }
}

/// The value of every PTX parameter, in `abi.params` order, each in the low bytes of a
/// u64 (the driver reads `size` bytes from its address). `tensor_ptrs[i]` is the device
/// address of source parameter `i` (ignored for scalars). Fails when the ABI is
/// inconsistent with the arguments (an internal error: the arguments were validated).
pub fn pack_params(
    abi: &KernelAbi,
    args: &[ArgValue],
    tensor_ptrs: &[u64],
) -> Result<Vec<u64>, String> {
    let mut out = Vec::with_capacity(abi.params.len());
    for p in &abi.params {
        let tensor = |param: u32| -> Result<&HostTensor, String> {
            match args.get(param as usize) {
                Some(ArgValue::Tensor(t)) => Ok(t),
                _ => Err(format!(
                    "PTX parameter `{}` refers to source parameter {param}, which is not a tensor argument",
                    p.ptx_name
                )),
            }
        };
        let (value, size) = match &p.slot {
            AbiSlot::TensorPtr { param } => {
                tensor(*param)?;
                let ptr = tensor_ptrs.get(*param as usize).copied().ok_or_else(|| {
                    format!("no device address for source parameter {param}")
                })?;
                (ptr, 8)
            }
            AbiSlot::TensorDim { param, dim } => {
                let t = tensor(*param)?;
                let v = t.shape.get(*dim as usize).copied().ok_or_else(|| {
                    format!("`{}`: dimension {dim} out of range", p.ptx_name)
                })?;
                (v as u32 as u64, 4)
            }
            AbiSlot::TensorStride { param, dim } => {
                let t = tensor(*param)?;
                let v = t.strides.get(*dim as usize).copied().ok_or_else(|| {
                    format!("`{}`: dimension {dim} out of range", p.ptx_name)
                })?;
                (v as u32 as u64, 4)
            }
            // The 128-byte map is made by the launcher (`tensor_map.rs`); 0 here.
            AbiSlot::TensorMap { param, .. } => {
                tensor(*param)?;
                (0, kgen_core::abi::TENSOR_MAP_BYTES)
            }
            AbiSlot::Scalar { param, dtype } => match args.get(*param as usize) {
                Some(ArgValue::Scalar(s)) => scalar_param_bits(*s, *dtype),
                _ => {
                    return Err(format!(
                        "PTX parameter `{}` refers to source parameter {param}, which is not a scalar argument",
                        p.ptx_name
                    ))
                }
            },
        };
        if size != p.size {
            return Err(format!(
                "PTX parameter `{}` ({}) is declared with {} bytes, but its value has {size}",
                p.ptx_name, p.ptx_type, p.size
            ));
        }
        out.push(value);
    }
    Ok(out)
}
