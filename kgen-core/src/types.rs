//! Element types and tile shapes shared by every layer (AST, checker, IR, back end, interpreter).

use std::fmt;

/// An element type. Every scalar and every tile element has one.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum DType {
    Bool,
    I32,
    U32,
    I64,
    F16,
    BF16,
    F32,
}

impl DType {
    /// Every dtype, in a fixed order (used by tests and by the CLI's help).
    pub const ALL: [DType; 7] = [
        DType::Bool,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
    ];

    /// The language's spelling (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.name() == name)
    }

    /// Size of one element in global memory, in bytes (`bool` is stored as one byte).
    pub fn size_bytes(self) -> u32 {
        match self {
            DType::Bool => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U32 | DType::I64)
    }

    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// f16 and bf16: stored narrow, computed in f32 and rounded after every operation.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tile shape, known at compile time. Rank 1 to [`MAX_TILE_RANK`]; every extent ≥ 1.
/// Extents need not be powers of two: the back end pads the layout and masks the rest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape(pub Vec<u32>);

/// The largest tile rank the compiler accepts.
pub const MAX_TILE_RANK: usize = 3;
/// The largest thread-block cluster `cluster_gather` accepts: sm_90's non-portable limit
/// (the portable one is 8; the runtime opts a kernel with clusters of 16 in).
pub const MAX_CLUSTER_SIZE: u32 = 16;
/// The largest cluster every sm_90 part supports without an opt-in.
pub const MAX_PORTABLE_CLUSTER_SIZE: u32 = 8;
/// The largest number of elements in one tile.
pub const MAX_TILE_ELEMENTS: u64 = 1 << 20;
/// The largest tensor rank the compiler accepts.
pub const MAX_TENSOR_RANK: usize = 4;

impl Shape {
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn num_elements(&self) -> u64 {
        self.0.iter().map(|&d| d as u64).product()
    }
    pub fn dims(&self) -> &[u32] {
        &self.0
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of an IR value: a uniform scalar, or a tile distributed over the CTA.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    Scalar(DType),
    Tile(DType, Shape),
}

impl ValueType {
    pub fn dtype(&self) -> DType {
        match self {
            ValueType::Scalar(d) | ValueType::Tile(d, _) => *d,
        }
    }
    pub fn shape(&self) -> Option<&Shape> {
        match self {
            ValueType::Scalar(_) => None,
            ValueType::Tile(_, s) => Some(s),
        }
    }
    pub fn with_dtype(&self, dtype: DType) -> ValueType {
        match self {
            ValueType::Scalar(_) => ValueType::Scalar(dtype),
            ValueType::Tile(_, s) => ValueType::Tile(dtype, s.clone()),
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueType::Scalar(d) => write!(f, "{d}"),
            ValueType::Tile(d, s) => write!(f, "tile<{d}, {s}>"),
        }
    }
}

/// A constant scalar. Integers are kept as i64 bit patterns of the dtype (wrapped),
/// floats as f64 (exactly representable values of the dtype after rounding).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Bool(bool),
    Int(i64, DType),
    Float(f64, DType),
}

impl Scalar {
    pub fn dtype(&self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_, d) | Scalar::Float(_, d) => *d,
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(v, d) => write!(f, "{v}:{d}"),
            Scalar::Float(v, d) => {
                if v.is_nan() {
                    write!(f, "nan:{d}")
                } else if v.is_infinite() {
                    write!(f, "{}inf:{d}", if *v < 0.0 { "-" } else { "" })
                } else {
                    write!(f, "{v:?}:{d}")
                }
            }
        }
    }
}
