//! TMA tensor maps: the `CUtensorMap` kernel parameters of `AbiSlot::TensorMap`, built
//! on the host with `cuTensorMapEncodeTiled` and passed by value.
//!
//! Assumes: the argument was validated against the kernel's ABI (dtype, rank 2,
//! contiguous, and the specialization's 16-byte alignment of the base address, the row
//! stride and the row length, which are exactly what the encoder requires).
//! Guarantees: [`TensorMapParams::of`] computes every argument of the encode call from the
//! tensor and the kernel's [`TensorMapSpec`] (unit-tested against the driver API's rules,
//! no GPU needed) or says why it cannot; an empty tensor (an extent of 0, which the
//! encoder refuses) is mapped as a 1×1 tensor at a zeroed device buffer, so every box
//! reads zeros, as out-of-bounds boxes do; a row stride of a one-row tensor, which no
//! copy uses, is replaced by the row length rounded up to 16 bytes. Encoded maps are
//! cached per GPU by everything that determines them (a launch with the same tensors
//! encodes nothing).

use crate::error::RuntimeError;
use cudarc::driver::sys;
use kgen_core::abi::TensorMapSpec;
use kgen_core::types::DType;
use std::collections::HashMap;
use std::sync::Mutex;

/// One `CUtensorMap`, by value: 128 bytes aligned to 64, as the kernel declares it
/// (`.param .align 64 .b8 name[128]`).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapArg(pub [u64; 16]);

// SAFETY: plain bytes, `#[repr(C)]`, the layout the kernel parameter declares.
unsafe impl cudarc::driver::DeviceRepr for TensorMapArg {}

/// The arguments of `cuTensorMapEncodeTiled` for one tensor of rank 2 to 5 (innermost
/// first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorMapParams {
    /// `CUtensorMapDataType` value.
    pub data_type: u32,
    /// The address of element [0, ..], or `None`: the zero buffer (an empty tensor).
    pub address: Option<u64>,
    pub rank: u32,
    /// Extents, innermost first (1 past `rank`).
    pub global_dim: [u64; 5],
    /// Bytes from one index to the next of dimensions 1 .. rank (innermost first:
    /// `globalStrides`; entry 0 is the row stride).
    pub strides_bytes: [u64; 4],
    /// The box: the spec's two extents, then 1 for every outer dimension.
    pub box_dim: [u32; 5],
    pub swizzle: u32,
}

/// `CU_TENSOR_MAP_DATA_TYPE_*` for a dtype TMA copies.
pub fn data_type_code(dt: DType) -> Option<u32> {
    // cuda.h: UINT8 0, UINT16 1, UINT32 2, INT32 3, UINT64 4, INT64 5, FLOAT16 6,
    // FLOAT32 7, FLOAT64 8, BFLOAT16 9.
    match dt {
        DType::F16 => Some(6),
        DType::F32 => Some(7),
        DType::BF16 => Some(9),
        DType::I32 => Some(3),
        DType::U32 => Some(2),
        _ => None,
    }
}

impl TensorMapParams {
    /// The encode arguments for a tensor of `dtype` at `address` with `shape` and
    /// `strides` (in elements), for `spec` (module docs).
    pub fn of(
        dtype: DType,
        address: u64,
        shape: &[usize],
        strides: &[usize],
        spec: &TensorMapSpec,
    ) -> Result<TensorMapParams, String> {
        let data_type =
            data_type_code(dtype).ok_or_else(|| format!("TMA cannot copy {dtype} elements"))?;
        let rank = spec.rank as usize;
        if !(2..=5).contains(&rank) || shape.len() != rank || strides.len() != rank {
            return Err(format!(
                "a tensor map of rank {rank} for a tensor of rank {}",
                shape.len()
            ));
        }
        let es = dtype.size_bytes() as u64;
        let [inner_box, outer_box] = spec.box_dims;
        if inner_box == 0 || outer_box == 0 || inner_box > 256 || outer_box > 256 {
            return Err(format!("box {inner_box}x{outer_box}: extents are 1 to 256"));
        }
        if !(inner_box as u64 * es).is_multiple_of(16) {
            return Err(format!(
                "the box's inner extent is {} bytes, not a multiple of 16",
                inner_box as u64 * es
            ));
        }
        let span = match spec.swizzle {
            0 => None,
            1 => Some(32),
            2 => Some(64),
            3 => Some(128),
            s => return Err(format!("swizzle code {s} is not 0 to 3")),
        };
        if let Some(span) = span {
            if inner_box as u64 * es > span {
                return Err(format!(
                    "the box's inner extent ({} bytes) exceeds the {span}-byte swizzle span",
                    inner_box as u64 * es
                ));
            }
        }
        let mut box_dim = [1u32; 5];
        box_dim[0] = inner_box;
        box_dim[1] = outer_box;
        if shape.contains(&0) {
            return Ok(TensorMapParams {
                data_type,
                address: None,
                rank: spec.rank,
                global_dim: [1; 5],
                strides_bytes: [16; 4],
                box_dim,
                swizzle: spec.swizzle,
            });
        }
        if shape[rank - 1] > 1 && strides[rank - 1] != 1 {
            return Err("the rows are not contiguous".into());
        }
        if !address.is_multiple_of(16) {
            return Err(format!("address {address:#x} is not 16-byte aligned"));
        }
        let mut global_dim = [1u64; 5];
        for (i, g) in global_dim.iter_mut().enumerate().take(rank) {
            *g = shape[rank - 1 - i] as u64;
            if *g > 1 << 32 {
                return Err("an extent above 2^32".into());
            }
        }
        let mut strides_bytes = [16u64; 4];
        for i in 1..rank {
            let d = rank - 1 - i;
            // A dimension of extent 1 is never stepped: its stride (which the caller may
            // have set to anything) becomes the dense one, rounded up to 16 bytes.
            let b = if shape[d] <= 1 {
                let below = if i == 1 { es } else { strides_bytes[i - 2] };
                (global_dim[i - 1] * below).div_ceil(16) * 16
            } else {
                strides[d] as u64 * es
            };
            if !b.is_multiple_of(16) || b >= 1 << 40 {
                return Err(format!(
                    "stride of dimension {d}: {b} bytes; TMA needs a multiple of 16 below 2^40"
                ));
            }
            strides_bytes[i - 1] = b;
        }
        Ok(TensorMapParams {
            data_type,
            address: Some(address),
            rank: spec.rank,
            global_dim,
            strides_bytes,
            box_dim,
            swizzle: spec.swizzle,
        })
    }

    /// Calls `cuTensorMapEncodeTiled`; `zero` is the device address of at least 16
    /// zeroed, 16-byte aligned bytes (used for an empty tensor).
    pub fn encode(&self, zero: u64) -> Result<TensorMapArg, RuntimeError> {
        let mut out = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        let dims = self.global_dim;
        let strides = self.strides_bytes;
        let boxes = self.box_dim;
        let elem = [1u32; 5];
        let address = self.address.unwrap_or(zero);
        // SAFETY: the enum values are the driver's (`data_type_code`, swizzle 0..=3
        // checked in `of`); the arrays (5 and 4 entries, rank ≤ 5 checked in `of`) outlive
        // the call; `out` is 128 writable bytes.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                out.as_mut_ptr(),
                std::mem::transmute::<u32, sys::CUtensorMapDataType>(self.data_type),
                self.rank,
                address as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                elem.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                std::mem::transmute::<u32, sys::CUtensorMapSwizzle>(self.swizzle),
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(RuntimeError::LaunchConfig(format!(
                "cuTensorMapEncodeTiled failed ({r:?}) for {self:?}"
            )));
        }
        // SAFETY: the driver wrote the map.
        let map = unsafe { out.assume_init() };
        Ok(TensorMapArg(map.opaque))
    }
}

/// Encoded maps of one GPU, by their encode arguments.
#[derive(Default, Debug)]
pub struct MapCache {
    maps: Mutex<HashMap<TensorMapParams, TensorMapArg>>,
}

impl MapCache {
    /// The map for `p`, encoded once.
    pub fn get(&self, p: &TensorMapParams, zero: u64) -> Result<TensorMapArg, RuntimeError> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = maps.get(p) {
            return Ok(*m);
        }
        let m = p.encode(zero)?;
        if maps.len() >= 1024 {
            maps.clear();
        }
        maps.insert(*p, m);
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(inner: u32, outer: u32, swizzle: u32) -> TensorMapSpec {
        TensorMapSpec {
            box_dims: [inner, outer],
            swizzle,
            rank: 2,
        }
    }

    #[test]
    fn a_row_major_matrix_maps_innermost_first_with_byte_strides() {
        // a [M=1000, K=4096] bf16, rows 4096 elements apart; a 64x128 box, 128 B swizzle.
        let p = TensorMapParams::of(
            DType::BF16,
            0x7f00_0000_0100,
            &[1000, 4096],
            &[4096, 1],
            &spec(64, 128, 3),
        )
        .unwrap();
        assert_eq!(p.data_type, 9, "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16");
        assert_eq!((p.rank, p.global_dim[..2].to_vec()), (2, vec![4096, 1000]));
        assert_eq!(p.strides_bytes[0], 8192);
        assert_eq!(p.box_dim, [64, 128, 1, 1, 1]);
        assert_eq!(p.swizzle, 3);
        // A view with a longer row pitch keeps its pitch.
        let v =
            TensorMapParams::of(DType::F16, 0x1000, &[7, 40], &[64, 1], &spec(32, 64, 2)).unwrap();
        assert_eq!(
            (v.data_type, v.global_dim[..2].to_vec(), v.strides_bytes[0]),
            (6, vec![40, 7], 128)
        );
    }

    #[test]
    fn what_the_encoder_refuses_is_refused_before_it() {
        let s = spec(64, 64, 3);
        // Misaligned base, row stride not a multiple of 16 bytes, non-unit inner stride.
        assert!(TensorMapParams::of(DType::BF16, 0x1008, &[8, 64], &[64, 1], &s).is_err());
        assert!(TensorMapParams::of(DType::BF16, 0x1000, &[8, 64], &[68 + 1, 1], &s).is_err());
        assert!(TensorMapParams::of(DType::BF16, 0x1000, &[8, 64], &[64, 2], &s).is_err());
        // A box wider than the swizzle span, a box over 256, an inner box under 16 bytes.
        assert!(TensorMapParams::of(DType::BF16, 0, &[8, 64], &[64, 1], &spec(128, 8, 3)).is_err());
        assert!(TensorMapParams::of(DType::BF16, 0, &[8, 64], &[64, 1], &spec(8, 512, 0)).is_err());
        assert!(TensorMapParams::of(DType::BF16, 0, &[8, 64], &[64, 1], &spec(4, 8, 0)).is_err());
        assert!(TensorMapParams::of(DType::Bool, 0, &[8, 64], &[64, 1], &s).is_err());
    }

    #[test]
    fn empty_and_single_row_tensors_still_encode() {
        let s = spec(64, 64, 3);
        let e = TensorMapParams::of(DType::BF16, 0, &[0, 4096], &[4096, 1], &s).unwrap();
        assert_eq!((e.address, e.global_dim), (None, [1; 5]));
        // One row: its stride is never used; any value the caller has is replaced.
        let r = TensorMapParams::of(DType::BF16, 0x2000, &[1, 100], &[3, 1], &s).unwrap();
        assert_eq!(
            (r.global_dim[..2].to_vec(), r.strides_bytes[0]),
            (vec![100, 1], 208)
        );
    }

    /// A rank-3 view (attention's `[B·H, S, D]` and `[B, S, H·D]`): the extents and byte
    /// strides innermost first, the box 1 along the leading dimension; a leading extent
    /// of 1 gets the dense stride whatever the view says; a rank the spec does not name
    /// is refused.
    #[test]
    fn rank_3_views_map_with_a_unit_leading_box() {
        let s3 = TensorMapSpec {
            box_dims: [64, 64],
            swizzle: 3,
            rank: 3,
        };
        // [B·H = 8, S = 300, D = 128] bf16, contiguous.
        let p = TensorMapParams::of(DType::BF16, 0x1000, &[8, 300, 128], &[38400, 128, 1], &s3)
            .unwrap();
        assert_eq!(p.rank, 3);
        assert_eq!(p.global_dim, [128, 300, 8, 1, 1]);
        assert_eq!(p.strides_bytes[..2], [256, 76800]);
        assert_eq!(p.box_dim, [64, 64, 1, 1, 1]);
        // [B = 2, S = 300, H·D = 4·128] of a fused [B, S, (H + 2·Hkv)·D] buffer (row pitch
        // 8·128).
        let q = TensorMapParams::of(
            DType::BF16,
            0x1000,
            &[2, 300, 512],
            &[300 * 1024, 1024, 1],
            &s3,
        )
        .unwrap();
        assert_eq!(q.global_dim[..3], [512, 300, 2]);
        assert_eq!(q.strides_bytes[..2], [2048, 614400]);
        // B·H = 1: the leading stride is never used; the dense one replaces it.
        let one =
            TensorMapParams::of(DType::BF16, 0x1000, &[1, 300, 128], &[7, 128, 1], &s3).unwrap();
        assert_eq!(one.strides_bytes[..2], [256, 76800]);
        // Rank 2 against a rank-3 spec, a leading stride not a multiple of 16 bytes.
        assert!(TensorMapParams::of(DType::BF16, 0x1000, &[300, 128], &[128, 1], &s3).is_err());
        assert!(
            TensorMapParams::of(DType::BF16, 0x1000, &[8, 300, 128], &[38401, 128, 1], &s3)
                .is_err()
        );
    }
}
