//! The launch contract of a compiled kernel as a self-contained, versioned document
//! (`kgen compile --emit abi`, JSON): everything a launcher other than kgen's runtime
//! (cupy, the CUDA driver API, another language) needs to call the PTX: the parameters
//! in order with their PTX types and what fills each one, every tensor's dtype, rank,
//! constant extents, contiguity and required alignment, and the launch geometry.
//!
//! Assumes: a [`CompiledKernel`] from the back end. Guarantees: the document is derived
//! from its [`crate::abi::KernelAbi`] and [`crate::abi::LaunchHints`] alone (one source
//! of truth: nothing here re-derives what the back end decided); `schema` is
//! [`ABI_SCHEMA`] and `version` [`ABI_VERSION`], raised on any change a reader could
//! notice. docs/ARCHITECTURE.md ("The launch ABI") explains every field.

use crate::abi::{AbiSlot, CompiledKernel, ConstArg, SourceParam};
use crate::target::MAX_GRID;
use crate::types::{DType, MAX_PORTABLE_CLUSTER_SIZE};
use serde::{Deserialize, Serialize};

/// The `schema` field of every document.
pub const ABI_SCHEMA: &str = "kgen-abi";
/// The `version` field: 1 is the first published form.
pub const ABI_VERSION: u32 = 1;

/// The whole document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbiDoc {
    pub schema: String,
    pub version: u32,
    /// The PTX `.entry` name (what `cuModuleGetFunction` / `get_function` takes).
    pub entry: String,
    /// The kernel's name in the source.
    pub kernel: String,
    /// `sm_80` or `sm_90a`: the PTX `.target`.
    pub arch: String,
    /// The compiler that wrote it (version and a hash of its sources).
    pub compiler: String,
    pub specialization: SpecDoc,
    pub launch: LaunchDoc,
    /// Every PTX parameter, in the order of the `.entry`'s parameter list.
    pub params: Vec<ParamDoc>,
    /// The tensor parameters of the source, in source order.
    pub tensors: Vec<TensorDoc>,
    /// The scalar parameters of the source, in source order.
    pub scalars: Vec<ScalarDoc>,
}

/// Which specialization this PTX is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpecDoc {
    /// Every compile-time parameter's value, in declaration order, as `-D` would spell it.
    pub consts: Vec<NamedValue>,
    pub num_warps: u32,
    /// `.minnctapersm`: blocks per SM the register use must allow; `None`: no bound.
    pub min_blocks_per_sm: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamedValue {
    pub name: String,
    pub value: String,
}

/// How to launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchDoc {
    /// The block shape: exactly `[threads_per_block, 1, 1]` (the PTX's `.maxntid`; any
    /// other block shape is a launch error or runs the kernel wrongly).
    pub block: [u32; 3],
    pub threads_per_block: u32,
    /// The grid axes the kernel reads (`bid(0)` .. `bid(grid_rank - 1)`); the grid's
    /// other axes should be 1.
    pub grid_rank: u8,
    /// The largest grid along axes 0, 1, 2.
    pub max_grid: [u32; 3],
    /// Shared memory the PTX declares statically (no launch argument needed).
    pub static_shared_bytes: u32,
    /// Dynamic shared memory to pass at launch (`sharedMemBytes`); 0 when none. When
    /// non-zero the PTX declares `.extern .shared` and the launcher must first set the
    /// function's `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` to at least this.
    pub dynamic_shared_bytes: u32,
    /// `dynamic_shared_bytes > 0`: set `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    pub needs_max_dynamic_shared_attribute: bool,
    /// Blocks per thread-block cluster along axis 0 (`.reqnctapercluster`, fixed at
    /// compile time: a plain launch uses it); 1 when the kernel uses no clusters. The
    /// grid's axis 0 must be a multiple of it.
    pub cluster_size: u32,
    /// Clusters above 8 blocks are non-portable: set
    /// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED` to 1 before launching.
    pub needs_non_portable_cluster_attribute: bool,
    /// The kernel calls `gdc_wait()`: launch it with the
    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` attribute to let it
    /// overlap the kernel before it. Optional: a plain launch is stream-ordered, so the
    /// wait returns at once and the results are the same.
    pub programmatic_dependent_launch: bool,
    /// The kernel calls `grid_sync`: launch it with `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`
    /// (or `cuLaunchCooperativeKernel`) and a grid no larger than the GPU holds at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor` times the multiprocessors). Not
    /// optional: a grid that does not fit would wait forever in its first `grid_sync`.
    pub cooperative_launch: bool,
    /// The same as `specialization.min_blocks_per_sm` (a hint already in the PTX).
    pub min_blocks_per_sm: Option<u32>,
}

/// One PTX parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamDoc {
    /// Position in the `.entry`'s parameter list (0-based).
    pub index: u32,
    /// The `.param` name in the PTX.
    pub name: String,
    /// The PTX type: `u64` (pointer), `s32` (extent, stride, i32), `u32` (u32, bool),
    /// `s64` (i64), `f32`, `b16` (f16/bf16 bits), `tmap` (a 128-byte tensor map).
    pub ptx_type: String,
    /// Bytes of the value passed.
    pub size: u32,
    #[serde(flatten)]
    pub role: ParamRole,
}

/// What fills a PTX parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ParamRole {
    /// The device address of element [0, ..., 0] of tensor `source`.
    TensorPtr { source: String, source_index: u32 },
    /// The extent of dimension `dim` of tensor `source` (runtime extents only: constant
    /// ones are not passed).
    TensorDim {
        source: String,
        source_index: u32,
        dim: u8,
    },
    /// The stride of dimension `dim` of tensor `source`, in elements (not bytes). A
    /// `contiguous` tensor's last stride is not passed (it is 1).
    TensorStride {
        source: String,
        source_index: u32,
        dim: u8,
    },
    /// Scalar parameter `source` by value: bool as u32 0/1, f16/bf16 as their 16 bits
    /// (rounded to nearest even), the others in their own type.
    Scalar {
        source: String,
        source_index: u32,
        dtype: String,
    },
    /// A `CUtensorMap` (128 bytes, by value, 64-byte aligned: PTX type `tmap`, declared
    /// `.param .align 64 .b8 name[128]`) of tensor `source` (of rank `rank`, 2 to 5), made
    /// with `cuTensorMapEncodeTiled`: data type from the tensor's dtype, `rank`, the
    /// address of element [0, ..], `globalDim` the extents innermost first,
    /// `globalStrides` the other dimensions' strides times elem_bytes innermost first (a
    /// dimension of extent 1 may take any multiple of 16), `boxDim = box_dims` then 1 for
    /// every outer dimension, element strides all 1, no interleave, `swizzle`
    /// (`CUtensorMapSwizzle`: 1 = 32 B, 2 = 64 B, 3 = 128 B), L2 promotion 256 B, no NaN
    /// fill (out-of-bounds elements read as zero). Compile with `--no-tma` for a launcher
    /// that cannot make one.
    TensorMap {
        source: String,
        source_index: u32,
        box_dims: [u32; 2],
        swizzle: u32,
        #[serde(default)]
        rank: u32,
    },
}

/// One tensor parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorDoc {
    pub name: String,
    /// Its position among all source parameters.
    pub source_index: u32,
    pub dtype: String,
    /// Bytes per element in memory (bool: 1).
    pub elem_bytes: u32,
    pub rank: u32,
    /// Per dimension: the constant extent, or `None` (JSON null) for a runtime one.
    pub dims: Vec<Option<u32>>,
    /// Declared `contiguous`: the last dimension's stride must be 1.
    pub contiguous: bool,
    /// The alignment the PTX assumes, in bytes: the base address, every stride of a
    /// dimension of extent > 1 but the last (times `elem_bytes`) and, for a contiguous
    /// tensor, the last extent (times `elem_bytes`) must be multiples of it. Extents
    /// and strides must also fit in 31 bits.
    pub align_bytes: u32,
    pub read: bool,
    pub written: bool,
}

/// One scalar parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalarDoc {
    pub name: String,
    pub source_index: u32,
    pub dtype: String,
}

fn source_name(k: &CompiledKernel, i: u32) -> String {
    match k.abi.source_params.get(i as usize) {
        Some(SourceParam::Tensor { name, .. } | SourceParam::Scalar { name, .. }) => name.clone(),
        None => format!("#{i}"),
    }
}

fn dtype_name(d: DType) -> String {
    d.name().to_string()
}

impl AbiDoc {
    /// The document of a compiled kernel.
    pub fn of(k: &CompiledKernel) -> AbiDoc {
        let params = k
            .abi
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let role = match &p.slot {
                    AbiSlot::TensorPtr { param } => ParamRole::TensorPtr {
                        source: source_name(k, *param),
                        source_index: *param,
                    },
                    AbiSlot::TensorDim { param, dim } => ParamRole::TensorDim {
                        source: source_name(k, *param),
                        source_index: *param,
                        dim: *dim,
                    },
                    AbiSlot::TensorStride { param, dim } => ParamRole::TensorStride {
                        source: source_name(k, *param),
                        source_index: *param,
                        dim: *dim,
                    },
                    AbiSlot::Scalar { param, dtype } => ParamRole::Scalar {
                        source: source_name(k, *param),
                        source_index: *param,
                        dtype: dtype_name(*dtype),
                    },
                    AbiSlot::TensorMap { param, map } => ParamRole::TensorMap {
                        source: source_name(k, *param),
                        source_index: *param,
                        box_dims: map.box_dims,
                        swizzle: map.swizzle,
                        rank: map.rank,
                    },
                };
                ParamDoc {
                    index: i as u32,
                    name: p.ptx_name.clone(),
                    ptx_type: p.ptx_type.to_string(),
                    size: p.size,
                    role,
                }
            })
            .collect();
        let mut tensors = Vec::new();
        let mut scalars = Vec::new();
        for (i, p) in k.abi.source_params.iter().enumerate() {
            match p {
                SourceParam::Tensor {
                    name,
                    dtype,
                    dims,
                    contiguous,
                    align_bytes,
                    written,
                    read,
                } => tensors.push(TensorDoc {
                    name: name.clone(),
                    source_index: i as u32,
                    dtype: dtype_name(*dtype),
                    elem_bytes: dtype.size_bytes(),
                    rank: dims.len() as u32,
                    dims: dims.clone(),
                    contiguous: *contiguous,
                    align_bytes: *align_bytes,
                    read: *read,
                    written: *written,
                }),
                SourceParam::Scalar { name, dtype } => scalars.push(ScalarDoc {
                    name: name.clone(),
                    source_index: i as u32,
                    dtype: dtype_name(*dtype),
                }),
            }
        }
        let l = &k.launch;
        AbiDoc {
            schema: ABI_SCHEMA.to_string(),
            version: ABI_VERSION,
            entry: k.entry.clone(),
            kernel: k.spec.kernel.clone(),
            arch: k.arch.name().to_string(),
            compiler: crate::COMPILER_FINGERPRINT.to_string(),
            specialization: SpecDoc {
                consts: k
                    .spec
                    .consts
                    .iter()
                    .map(|(n, v)| NamedValue {
                        name: n.clone(),
                        value: match v {
                            ConstArg::Int(i) => i.to_string(),
                            other => other.to_string(),
                        },
                    })
                    .collect(),
                num_warps: k.spec.num_warps,
                min_blocks_per_sm: k.spec.min_blocks_per_sm,
            },
            launch: LaunchDoc {
                block: [l.threads_per_block, 1, 1],
                threads_per_block: l.threads_per_block,
                grid_rank: l.grid_rank,
                max_grid: MAX_GRID,
                static_shared_bytes: l.static_shared_bytes,
                dynamic_shared_bytes: l.dynamic_shared_bytes,
                needs_max_dynamic_shared_attribute: l.dynamic_shared_bytes > 0,
                cluster_size: l.cluster_size,
                needs_non_portable_cluster_attribute: l.cluster_size > MAX_PORTABLE_CLUSTER_SIZE,
                programmatic_dependent_launch: l.programmatic_dependency,
                cooperative_launch: l.cooperative,
                min_blocks_per_sm: k.spec.min_blocks_per_sm,
            },
            params,
            tensors,
            scalars,
        }
    }

    /// The document as indented JSON with a final newline.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of strings and numbers cannot fail.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compile, Arch, CompileOptions, SourceFile};

    /// The document agrees with the PTX text it describes: the `.param` list (names,
    /// types, order), `.maxntid`, the shared-memory declarations and the cluster size,
    /// read from the PTX independently; and it reads back unchanged.
    #[test]
    fn the_document_matches_the_ptx() {
        let file = SourceFile::new(
            "t.kg",
            "kernel k<T: float = bf16, B: int = 256>(a: T, x: tensor<T, [_, 64], contiguous>, \
             flag: bool, y: tensor<f32, 3>, n: i64, u: u32) {\n\
             let t = load(x, [bid(0), 0], [1, 64]) as f32;\n\
             let s = where(flag, a as f32, (n as f32) + (u as f32));\n\
             store(y, [bid(0), bid(1), 0], reshape(t * s, [1, 1, 64]));\n}\n",
        );
        for arch in Arch::ALL {
            let k = compile(&file, &CompileOptions::new(arch).define("B", 128))
                .unwrap_or_else(|d| panic!("{}", d.render(&file)));
            let doc = AbiDoc::of(&k);
            let back: AbiDoc = serde_json::from_str(&doc.to_json()).expect("reads back");
            assert_eq!(back, doc);
            assert_eq!((doc.schema.as_str(), doc.version), ("kgen-abi", 1));
            assert_eq!(doc.entry, k.entry);
            assert!(k.ptx.contains(&format!(".entry {}(", doc.entry)));
            assert_eq!(doc.arch, arch.name());
            assert!(k.ptx.contains(&format!(".target {}", doc.arch)));
            // The .param list, in order.
            let decl: Vec<(String, String)> = k
                .ptx
                .lines()
                .filter_map(|l| l.trim().strip_prefix(".param ."))
                .map(|l| {
                    let mut w = l.trim_end_matches(',').split_whitespace();
                    (w.next().unwrap().to_string(), w.next().unwrap().to_string())
                })
                .collect();
            let ours: Vec<(String, String)> = doc
                .params
                .iter()
                .map(|p| (p.ptx_type.clone(), p.name.clone()))
                .collect();
            assert_eq!(ours, decl);
            assert!(doc
                .params
                .iter()
                .enumerate()
                .all(|(i, p)| p.index == i as u32));
            let maxntid = format!(".maxntid {}, 1, 1", doc.launch.threads_per_block);
            assert!(k.ptx.contains(&maxntid), "{maxntid}");
            assert_eq!(doc.launch.block, [doc.launch.threads_per_block, 1, 1]);
            assert_eq!(doc.launch.grid_rank, 2);
            // What each parameter is: x has one runtime dim and one stride (contiguous),
            // y three dims and three strides; scalars by their dtype.
            let kinds: Vec<String> = doc
                .params
                .iter()
                .map(|p| match &p.role {
                    ParamRole::TensorPtr { source, .. } => format!("{source}.ptr"),
                    ParamRole::TensorDim { source, dim, .. } => format!("{source}.dim{dim}"),
                    ParamRole::TensorStride { source, dim, .. } => {
                        format!("{source}.stride{dim}")
                    }
                    ParamRole::Scalar { source, dtype, .. } => format!("{source}:{dtype}"),
                    ParamRole::TensorMap { source, .. } => format!("{source}.tmap"),
                })
                .collect();
            assert_eq!(
                kinds,
                [
                    "a:bf16",
                    "x.ptr",
                    "x.dim0",
                    "x.stride0",
                    "flag:bool",
                    "y.ptr",
                    "y.dim0",
                    "y.dim1",
                    "y.dim2",
                    "y.stride0",
                    "y.stride1",
                    "y.stride2",
                    "n:i64",
                    "u:u32"
                ]
            );
            let types: Vec<&str> = doc.params.iter().map(|p| p.ptx_type.as_str()).collect();
            assert_eq!(
                types,
                [
                    "b16", "u64", "s32", "s32", "u32", "u64", "s32", "s32", "s32", "s32", "s32",
                    "s32", "s64", "u32"
                ]
            );
            let x = &doc.tensors[0];
            assert_eq!(
                (
                    x.name.as_str(),
                    x.dtype.as_str(),
                    x.rank,
                    x.contiguous,
                    x.elem_bytes
                ),
                ("x", "bf16", 2, true, 2)
            );
            assert_eq!(x.dims, vec![None, Some(64)]);
            assert_eq!((x.align_bytes, x.read, x.written), (16, true, false));
            let y = &doc.tensors[1];
            // A non-contiguous tensor assumes only its element size.
            assert_eq!(
                (y.align_bytes, y.read, y.written, y.contiguous),
                (4, false, true, false)
            );
            assert_eq!(
                doc.scalars
                    .iter()
                    .map(|s| s.dtype.as_str())
                    .collect::<Vec<_>>(),
                ["bf16", "bool", "i64", "u32"]
            );
            assert_eq!(
                doc.specialization.consts,
                vec![
                    NamedValue {
                        name: "T".into(),
                        value: "bf16".into()
                    },
                    NamedValue {
                        name: "B".into(),
                        value: "128".into()
                    }
                ]
            );
            assert!(!doc.launch.needs_max_dynamic_shared_attribute);
            assert_eq!(doc.launch.dynamic_shared_bytes, 0);
            assert!(!k.ptx.contains(".extern .shared"));
        }
    }

    /// Shared memory beyond the 48 KB static window is dynamic: the document says how
    /// much to pass and that the attribute must be set, and the PTX declares it extern.
    #[test]
    fn large_shared_memory_is_dynamic_in_the_document() {
        // A 2-D reduction over a large tile goes through shared memory; scratch buffers
        // make it big.
        let file = SourceFile::new(
            "s.kg",
            "kernel s(x: tensor<f32, 2, contiguous>, y: tensor<f32, 2, contiguous>) {\n\
             let buf = scratch(16, [1, 1024], f32);\n\
             let t = load(x, [bid(0), 0], [1, 1024]);\n\
             scratch_store(buf, 3, t);\n\
             store(y, [bid(0), 0], scratch_load(buf, 3) * 2.0);\n}\n",
        );
        let k = match compile(&file, &CompileOptions::new(Arch::Sm90a)) {
            Ok(k) => k,
            Err(d) => panic!("{}", d.render(&file)),
        };
        let doc = AbiDoc::of(&k);
        assert!(
            doc.launch.dynamic_shared_bytes > 48 * 1024,
            "{:?}",
            doc.launch
        );
        assert!(doc.launch.needs_max_dynamic_shared_attribute);
        assert!(k.ptx.contains(".extern .shared"), "{}", k.ptx);
    }
}
