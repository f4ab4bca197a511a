//! The compiled-kernel value: PTX text, entry name, parameter ABI, launch hints and the
//! specialization it was compiled for. The runtime reads only this.

use crate::target::Arch;
use crate::types::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A compile-time argument value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConstArg {
    Int(i64),
    Bool(bool),
    DType(DType),
    /// A value of a float dtype (`EPS: f32 = 1e-5`): the dtype and the bits of the value
    /// as an f32 (exact for f16 and bf16 values, which it was rounded to; NaN is the
    /// canonical quiet NaN).
    Float(DType, u32),
}

impl ConstArg {
    /// A float generic's value, rounded to `dtype` (f16, bf16 or f32).
    pub fn float(dtype: DType, v: f64) -> ConstArg {
        let x = match crate::host::scalar_from_f64(dtype, v) {
            crate::types::Scalar::Float(x, _) => x as f32,
            _ => v as f32,
        };
        let x = if x.is_nan() { f32::NAN } else { x };
        ConstArg::Float(dtype, x.to_bits())
    }
}

impl fmt::Display for ConstArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConstArg::Int(v) => write!(f, "{v}"),
            ConstArg::Bool(b) => write!(f, "{b}"),
            ConstArg::DType(d) => write!(f, "{d}"),
            // The shortest text that reads back to the same f32: `1e-5`, `0.5`, `inf`.
            ConstArg::Float(_, bits) => write!(f, "{:?}", f32::from_bits(*bits)),
        }
    }
}

/// Which variant of a kernel: every compile-time parameter's value (defaults filled in),
/// the warp count and the alignment assumed for each tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Specialization {
    pub kernel: String,
    /// In declaration order.
    pub consts: Vec<(String, ConstArg)>,
    pub num_warps: u32,
    /// Blocks per SM the registers must allow (`.minnctapersm`); `None`: no bound.
    pub min_blocks_per_sm: Option<u32>,
    /// Software-pipeline depth of the loops that feed `dot` (`passes::pipeline`, Triton's
    /// `num_stages`); `None`: the compiler's choice.
    #[serde(default)]
    pub num_stages: Option<u32>,
    /// Per tensor parameter, in parameter order: (name, assumed alignment in bytes).
    pub tensor_align: Vec<(String, u32)>,
    /// Tile fetches stay on `cp.async` where the target could use TMA (`--no-tma`: for
    /// launchers that cannot build tensor maps, and for A/B measurements).
    #[serde(default)]
    pub no_tma: bool,
    /// Warp-specialize where the target and kernel allow it (`--ws`: one producer
    /// warpgroup issues the TMA copies; `back/ptx/lower/ws.rs`).
    #[serde(default)]
    pub ws: bool,
    /// Write the tiles of eligible `store`s with the TMA copy engine through shared
    /// memory (`--tma-store`; `back/ptx/lower/tma_store.rs`). Off by default: it measured
    /// no faster than `st.global` on the bundled GEMM (docs/PERFORMANCE.md).
    #[serde(default)]
    pub tma_store: bool,
    /// In a kernel of clusters of two (`cluster_rank(2)`), copy each tile fetch that is
    /// alike in both blocks once for the pair, by TMA multicast (`--multicast`;
    /// `back/ptx/tma.rs`). Off by default: it measured slower than each block copying
    /// its own tiles on the bundled GEMM (docs/PERFORMANCE.md).
    #[serde(default)]
    pub multicast: bool,
    /// Two consumer warpgroups of a warp-specialized block take turns issuing a loop's
    /// products (`--pingpong`; `back/ptx/pingpong.rs`).
    #[serde(default)]
    pub pingpong: bool,
}

impl Specialization {
    /// The PTX entry name: the kernel name followed by each compile-time value, then the
    /// warp count, the blocks-per-SM bound if any (`__b2`) and any alignment below 16
    /// bytes, e.g.
    /// `rmsnorm__T_bf16__BLOCK_1024__w4` or `vec_add__T_f32__w4__x_a4`. Negative
    /// integers are spelled `m5`; a float value its shortest decimal with `-` as `m` and
    /// `.` as `p` (`EPS = 1e-5` is `__EPS_1em5`), so every name is a PTX identifier.
    pub fn entry_name(&self) -> String {
        let mut s = self.kernel.clone();
        for (name, value) in &self.consts {
            let v = match value {
                ConstArg::Int(i) if *i < 0 => format!("m{}", i.unsigned_abs()),
                // `1e-5` → `1em5`, `-0.5` → `m0p5`, `NaN` → `NaN`: one-to-one, since `m` and
                // `p` appear in no float's text.
                ConstArg::Float(..) => value
                    .to_string()
                    .replace('-', "m")
                    .replace('.', "p")
                    .replace('+', ""),
                other => other.to_string(),
            };
            s.push_str(&format!("__{name}_{v}"));
        }
        s.push_str(&format!("__w{}", self.num_warps));
        if let Some(b) = self.min_blocks_per_sm {
            s.push_str(&format!("__b{b}"));
        }
        if let Some(n) = self.num_stages {
            s.push_str(&format!("__s{n}"));
        }
        if self.no_tma {
            s.push_str("__notma");
        }
        if self.ws {
            s.push_str("__ws");
        }
        if self.tma_store {
            s.push_str("__tmastore");
        }
        if self.multicast {
            s.push_str("__mcast");
        }
        if self.pingpong {
            s.push_str("__pp");
        }
        for (name, align) in &self.tensor_align {
            if *align < 16 {
                s.push_str(&format!("__{name}_a{align}"));
            }
        }
        s
    }

    /// A readable, complete key (used with the source hash, arch and compiler version by
    /// the runtime cache).
    pub fn key(&self) -> String {
        let consts: Vec<String> = self
            .consts
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        let aligns: Vec<String> = self
            .tensor_align
            .iter()
            .map(|(n, a)| format!("{n}:{a}"))
            .collect();
        let blocks = match self.min_blocks_per_sm {
            Some(b) => format!(";min_blocks_per_sm={b}"),
            None => String::new(),
        };
        let stages = match self.num_stages {
            Some(n) => format!(";stages={n}"),
            None => String::new(),
        };
        let tma = match (self.no_tma, self.ws) {
            (false, false) => "",
            (true, false) => ";no_tma",
            (false, true) => ";ws",
            (true, true) => ";no_tma;ws",
        };
        let store = if self.tma_store { ";tma_store" } else { "" };
        let mcast = if self.multicast { ";multicast" } else { "" };
        let pp = if self.pingpong { ";pingpong" } else { "" };
        format!(
            "{}<{}>;warps={}{blocks}{stages}{tma}{store}{mcast}{pp};align={}",
            self.kernel,
            consts.join(","),
            self.num_warps,
            aligns.join(",")
        )
    }
}

/// How one PTX kernel parameter is filled at launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AbiSlot {
    /// The device address of tensor parameter `param` (`.u64`).
    TensorPtr { param: u32 },
    /// Extent of dimension `dim` (`.s32`). Constant dimensions are not passed.
    TensorDim { param: u32, dim: u8 },
    /// Stride of dimension `dim` in elements (`.s32`). A contiguous last dimension is not
    /// passed.
    TensorStride { param: u32, dim: u8 },
    /// A scalar parameter, by value. `bool` travels as `.u32`, f16/bf16 as `.b16`.
    Scalar { param: u32, dtype: DType },
    /// A TMA tensor map (`CUtensorMap`, 128 bytes, declared `.param .align 64 .b8
    /// name[128]`) of the rank-2 tensor parameter `param`, built on the host by
    /// `cuTensorMapEncodeTiled` from the tensor's address, extents and row stride with
    /// this box and swizzle ([`TensorMapSpec`]).
    TensorMap { param: u32, map: TensorMapSpec },
}

/// What a kernel asks of one tensor map besides the tensor itself: the box it copies
/// and its shared-memory swizzle. The dtype and extents come from the argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorMapSpec {
    /// Box extents of the two innermost dimensions, the contiguous one first, in
    /// elements; the box is 1 along every outer dimension.
    pub box_dims: [u32; 2],
    /// `CUtensorMapSwizzle`: 0 none, 1 = 32 B, 2 = 64 B, 3 = 128 B.
    pub swizzle: u32,
    /// The tensor's rank, 2 to 5 (a rank-3 `[B·H, S, D]` view's tile `[1, BN, D]` is a
    /// box of 1 along B·H).
    #[serde(default = "rank_two")]
    pub rank: u32,
}

fn rank_two() -> u32 {
    2
}

/// The PTX types a kernel parameter is declared with. `tmap` is printed `.align 64 .b8
/// name[128]` (a [`AbiSlot::TensorMap`]).
pub const PTX_PARAM_TYPES: &[&str] = &["u64", "s64", "u32", "s32", "f32", "b16", "tmap"];

/// Bytes of a tensor-map parameter (`sizeof(CUtensorMap)`), and its alignment.
pub const TENSOR_MAP_BYTES: u32 = 128;
pub const TENSOR_MAP_ALIGN: u32 = 64;

/// One PTX parameter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AbiParam {
    pub ptx_name: String,
    /// The PTX type in the `.param` declaration (one of [`PTX_PARAM_TYPES`]).
    pub ptx_type: &'static str,
    /// Size in bytes of the value pushed at launch.
    pub size: u32,
    pub slot: AbiSlot,
}

/// [`AbiParam`] as read back (its PTX type as an owned string, checked against
/// [`PTX_PARAM_TYPES`]).
#[derive(Deserialize)]
struct AbiParamText {
    ptx_name: String,
    ptx_type: String,
    size: u32,
    slot: AbiSlot,
}

impl<'de> Deserialize<'de> for AbiParam {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AbiParam, D::Error> {
        let t = AbiParamText::deserialize(d)?;
        let ptx_type = PTX_PARAM_TYPES
            .iter()
            .copied()
            .find(|x| *x == t.ptx_type)
            .ok_or_else(|| {
                serde::de::Error::custom(format!("unknown PTX parameter type `{}`", t.ptx_type))
            })?;
        Ok(AbiParam {
            ptx_name: t.ptx_name,
            ptx_type,
            size: t.size,
            slot: t.slot,
        })
    }
}

/// A kernel-level description of one source parameter, for argument checking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceParam {
    Tensor {
        name: String,
        dtype: DType,
        dims: Vec<Option<u32>>,
        contiguous: bool,
        align_bytes: u32,
        /// The kernel writes it (store, scatter, atomic).
        written: bool,
        /// The kernel reads it (load, gather, atomic).
        read: bool,
    },
    Scalar {
        name: String,
        dtype: DType,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KernelAbi {
    /// The source-level parameters in order.
    pub source_params: Vec<SourceParam>,
    /// The PTX parameters in order.
    pub params: Vec<AbiParam>,
}

/// What the launcher needs besides the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchHints {
    pub threads_per_block: u32,
    /// Static shared memory declared in the PTX.
    pub static_shared_bytes: u32,
    /// Dynamic shared memory to request at launch.
    pub dynamic_shared_bytes: u32,
    /// Number of grid axes the kernel reads (`bid(axis)` with the largest axis + 1).
    pub grid_rank: u8,
    /// Blocks per thread-block cluster along grid axis 0 (`.reqnctapercluster`); 1 when
    /// the kernel uses no clusters. The grid's axis 0 must be a multiple of it.
    pub cluster_size: u32,
    /// The kernel calls `gdc_wait()` before it reads what the kernel before it wrote, so
    /// the runtime launches it as a programmatic dependent (sm_90): it may start while
    /// that kernel runs. Always false for sm_80.
    pub programmatic_dependency: bool,
    /// The kernel calls `grid_sync(...)`: every block of the grid must be resident at
    /// once, so the runtime launches it cooperatively (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`),
    /// which refuses a grid larger than the GPU holds instead of letting it hang.
    #[serde(default)]
    pub cooperative: bool,
}

/// The result of compiling one specialization of one kernel for one arch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompiledKernel {
    pub ptx: String,
    pub entry: String,
    pub arch: Arch,
    pub abi: KernelAbi,
    pub launch: LaunchHints,
    pub spec: Specialization,
    /// What the compiler did not do of what the specialization asked for, in words
    /// (a requested `ws` that does not apply, and why); also in the PTX header.
    #[serde(default)]
    pub notes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use crate::{compile, Arch, CompileOptions, SourceFile};

    #[test]
    fn the_compiler_fingerprint_is_the_version_and_a_source_hash() {
        let (version, hash) = crate::COMPILER_FINGERPRINT
            .split_once('+')
            .expect("version+hash");
        assert_eq!(version, crate::COMPILER_VERSION);
        assert_eq!(hash.len(), 16);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{hash}");
    }

    #[test]
    fn compiled_kernels_round_trip_through_json_and_unknown_ptx_types_are_refused() {
        let file = SourceFile::new(
            "t.kg",
            "kernel scale<T: float = f16, BLOCK: int = 256>(x: tensor<T, 2, contiguous>, \
             y: tensor<T, 2>, a: T, n: i64) {\n\
             let t = load(x, [bid(0), 0], [1, BLOCK]);\n\
             store(y, [bid(0), 0], t * a + (n as T));\n}\n",
        );
        for arch in Arch::ALL {
            let k = compile(&file, &CompileOptions::new(arch).define("BLOCK", 128))
                .unwrap_or_else(|d| panic!("{}", d.render(&file)));
            let text = serde_json::to_string(&k).expect("serializes");
            let back: super::CompiledKernel = serde_json::from_str(&text).expect("reads back");
            assert_eq!(back, k);
            // Every PTX type this kernel declares is one the reader accepts.
            assert!(k
                .abi
                .params
                .iter()
                .all(|p| super::PTX_PARAM_TYPES.contains(&p.ptx_type)));
            let bad = text.replacen("\"ptx_type\":\"u64\"", "\"ptx_type\":\"u128\"", 1);
            assert_ne!(bad, text);
            let err = serde_json::from_str::<super::CompiledKernel>(&bad).unwrap_err();
            assert!(
                err.to_string()
                    .contains("unknown PTX parameter type `u128`"),
                "{err}"
            );
        }
    }
}
