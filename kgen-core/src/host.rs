//! Host-side tensors and argument values: the interpreter's inputs and outputs, and what
//! the runtime copies to and from the device. Elements are stored little-endian in the
//! dtype's global-memory format (bool as one byte 0/1, f16/bf16 as IEEE/bfloat bits).

use crate::round;
use crate::types::{DType, Scalar};
use half::{bf16, f16};

/// A dense host buffer viewed with a shape and element strides.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Strides in elements (not bytes).
    pub strides: Vec<usize>,
    /// Raw storage; its length is a whole number of elements and covers the view.
    pub data: Vec<u8>,
}

impl HostTensor {
    /// A contiguous (row-major) tensor filled with zero bytes.
    pub fn zeros(dtype: DType, shape: &[usize]) -> HostTensor {
        let n: usize = shape.iter().product();
        HostTensor {
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            data: vec![0u8; n * dtype.size_bytes() as usize],
        }
    }

    /// A contiguous tensor whose elements are `values` rounded to `dtype`.
    pub fn from_f64(dtype: DType, shape: &[usize], values: &[f64]) -> HostTensor {
        let mut t = HostTensor::zeros(dtype, shape);
        // Contiguous: row-major element i is storage element i.
        for (i, v) in values.iter().enumerate().take(t.num_elements()) {
            t.write_f64(i, *v);
        }
        t
    }

    /// The storage offset of every element of the view, in row-major order (one pass
    /// with a carried multi-index; no per-element division or allocation).
    pub fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.num_elements();
        let mut idx = vec![0usize; self.shape.len()];
        let mut off = 0usize;
        (0..n).map(move |k| {
            if k > 0 {
                for d in (0..idx.len()).rev() {
                    idx[d] += 1;
                    off += self.strides[d];
                    if idx[d] < self.shape[d] {
                        break;
                    }
                    off -= self.strides[d] * idx[d];
                    idx[d] = 0;
                }
            }
            off
        })
    }

    /// A contiguous copy of the view (the same elements, row-major).
    pub fn to_contiguous(&self) -> HostTensor {
        let mut c = HostTensor::zeros(self.dtype, &self.shape);
        let sz = self.dtype.size_bytes() as usize;
        for (i, off) in self.offsets().enumerate() {
            c.data[i * sz..i * sz + sz].copy_from_slice(&self.data[off * sz..off * sz + sz]);
        }
        c
    }

    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of elements the storage holds.
    pub fn storage_len(&self) -> usize {
        self.data.len() / self.dtype.size_bytes() as usize
    }

    /// Storage offset (elements) of a multi-index.
    pub fn offset_of(&self, index: &[usize]) -> usize {
        index.iter().zip(&self.strides).map(|(i, s)| i * s).sum()
    }

    /// Element `i` of the view in row-major order, as f64.
    pub fn get_linear(&self, i: usize) -> f64 {
        let idx = unravel(i, &self.shape);
        self.read_f64(self.offset_of(&idx))
    }

    /// Sets element `i` of the view in row-major order (rounded to the dtype).
    pub fn set_linear(&mut self, i: usize, v: f64) {
        let idx = unravel(i, &self.shape);
        let off = self.offset_of(&idx);
        self.write_f64(off, v);
    }

    /// Every element of the view, row-major, as f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.offsets().map(|off| self.read_f64(off)).collect()
    }

    /// Reads the storage element at `off` as f64 (integers exactly up to 2^53).
    pub fn read_f64(&self, off: usize) -> f64 {
        self.read_scalar(off).to_f64()
    }

    pub fn write_f64(&mut self, off: usize, v: f64) {
        let s = scalar_from_f64(self.dtype, v);
        self.write_scalar(off, s);
    }

    /// Reads the storage element at `off` exactly.
    pub fn read_scalar(&self, off: usize) -> Scalar {
        let sz = self.dtype.size_bytes() as usize;
        let b = &self.data[off * sz..off * sz + sz];
        match self.dtype {
            DType::Bool => Scalar::Bool(b[0] != 0),
            DType::I32 => Scalar::Int(
                i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
                DType::I32,
            ),
            DType::U32 => Scalar::Int(
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
                DType::U32,
            ),
            DType::I64 => Scalar::Int(
                i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
                DType::I64,
            ),
            DType::F16 => Scalar::Float(
                f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
                DType::F16,
            ),
            DType::BF16 => Scalar::Float(
                bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
                DType::BF16,
            ),
            DType::F32 => Scalar::Float(
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                DType::F32,
            ),
        }
    }

    /// Writes a scalar (converted to this tensor's dtype with the language's cast rules).
    pub fn write_scalar(&mut self, off: usize, s: Scalar) {
        let sz = self.dtype.size_bytes() as usize;
        let bytes = scalar_to_bytes(self.dtype, s);
        self.data[off * sz..off * sz + sz].copy_from_slice(&bytes[..sz]);
    }

    /// Fills every storage byte with `byte` (poisoning outputs before a run).
    pub fn poison(&mut self, byte: u8) {
        self.data.iter_mut().for_each(|b| *b = byte);
    }
}

/// Row-major strides for a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    strides
}

/// The multi-index of row-major element `i`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0usize; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1);
        idx[d] = i % n;
        i /= n;
    }
    idx
}

impl Scalar {
    /// The value as f64 (u32/i32/i64 by value, bool as 0/1).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(v, DType::U32) => (v as u32) as f64,
            Scalar::Int(v, DType::I32) => (v as i32) as f64,
            Scalar::Int(v, _) => v as f64,
            Scalar::Float(v, _) => v,
        }
    }
}

/// The f16 or bf16 bits of a scalar, rounded once to nearest even (integers too, also
/// beyond 2^53; bool as 0/1). Any other `dtype` gives its f16 bits.
pub fn half_bits(dtype: DType, s: Scalar) -> u16 {
    let bf = dtype == DType::BF16;
    match s {
        Scalar::Int(v, d) => {
            let v = match d {
                DType::U32 => v as u32 as i64,
                DType::I32 => v as i32 as i64,
                _ => v,
            };
            if bf {
                round::i64_to_bf16(v).to_bits()
            } else {
                round::i64_to_f16(v).to_bits()
            }
        }
        s if bf => round::f64_to_bf16(s.to_f64()).to_bits(),
        s => round::f64_to_f16(s.to_f64()).to_bits(),
    }
}

/// `v` converted to `dtype` with the language's cast rules (round to nearest even for
/// narrowing floats, once: see [`crate::round`]; truncation with saturation, NaN → 0,
/// for float → int).
pub fn scalar_from_f64(dtype: DType, v: f64) -> Scalar {
    match dtype {
        DType::Bool => Scalar::Bool(v != 0.0),
        DType::I32 => Scalar::Int(v as i32 as i64, DType::I32),
        DType::U32 => Scalar::Int(v as u32 as i64, DType::U32),
        DType::I64 => Scalar::Int(v as i64, DType::I64),
        DType::F16 => Scalar::Float(round::f64_to_f16(v).to_f64(), DType::F16),
        DType::BF16 => Scalar::Float(round::f64_to_bf16(v).to_f64(), DType::BF16),
        DType::F32 => Scalar::Float(v as f32 as f64, DType::F32),
    }
}

fn scalar_to_bytes(dtype: DType, s: Scalar) -> [u8; 8] {
    let mut out = [0u8; 8];
    match (dtype, s) {
        (DType::Bool, s) => out[0] = (s.to_f64() != 0.0) as u8,
        (DType::I32 | DType::U32, Scalar::Int(v, _)) => {
            out[..4].copy_from_slice(&(v as u32).to_le_bytes())
        }
        (DType::I64, Scalar::Int(v, _)) => out.copy_from_slice(&v.to_le_bytes()),
        (DType::F16, s) => out[..2].copy_from_slice(&half_bits(DType::F16, s).to_le_bytes()),
        (DType::BF16, s) => out[..2].copy_from_slice(&half_bits(DType::BF16, s).to_le_bytes()),
        (DType::F32, s) => out[..4].copy_from_slice(&(s.to_f64() as f32).to_le_bytes()),
        (d, s) => return scalar_to_bytes(d, scalar_from_f64(d, s.to_f64())),
    }
    out
}

/// A kernel argument for the interpreter (and the runtime's host-side API).
#[derive(Clone, Debug, PartialEq)]
pub enum ArgValue {
    Tensor(HostTensor),
    Scalar(Scalar),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `offsets` walks any strided view in row-major order, as `unravel` + strides do
    /// element by element, and the copies built on it keep every element.
    #[test]
    fn offsets_match_unravel_on_strided_views() {
        let base: Vec<f64> = (0..2 * 3 * 5).map(|i| i as f64 * 1.5 - 7.0).collect();
        let t = HostTensor::from_f64(DType::F32, &[2, 3, 5], &base);
        let views = [
            (vec![2, 3, 5], vec![15, 5, 1]), // contiguous
            (vec![5, 3, 2], vec![1, 5, 15]), // all axes reversed (a transpose)
            (vec![2, 2, 3], vec![15, 5, 2]), // a sliced, strided window
            (vec![3, 1, 4], vec![5, 0, 1]),  // a broadcast size-1 axis
            (vec![], vec![]),                // a scalar
            (vec![4, 0, 2], vec![1, 1, 1]),  // empty
        ];
        for (shape, strides) in views {
            let v = HostTensor {
                shape: shape.clone(),
                strides: strides.clone(),
                ..t.clone()
            };
            let want: Vec<usize> = (0..v.num_elements())
                .map(|i| v.offset_of(&unravel(i, &shape)))
                .collect();
            assert_eq!(
                v.offsets().collect::<Vec<_>>(),
                want,
                "{shape:?} {strides:?}"
            );
            let values: Vec<f64> = want.iter().map(|&o| base[o]).collect();
            assert_eq!(v.to_f64_vec(), values);
            let c = v.to_contiguous();
            assert_eq!(c.strides, contiguous_strides(&shape));
            assert_eq!(c.to_f64_vec(), values);
        }
    }

    /// Host tensors and scalars round f64 once to f16/bf16 (issue 21: `half`'s
    /// `from_f64` gave 1.0 for both of these).
    #[test]
    fn host_values_round_to_nearest_even_once() {
        let p = |e: i32| 2f64.powi(e);
        let cases = [
            (DType::BF16, 1.0 + p(-8) + p(-40), 1.0 + p(-7)),
            (DType::F16, 1.0 + p(-11) + p(-30), 1.0 + p(-10)),
        ];
        for (d, v, want) in cases {
            let t = HostTensor::from_f64(d, &[3], &[v, -v, 0.5]);
            assert_eq!(t.to_f64_vec(), vec![want, -want, 0.5], "{d}");
            let mut u = HostTensor::zeros(d, &[2]);
            u.set_linear(1, v);
            assert_eq!(u.get_linear(1), want, "{d}");
            assert_eq!(scalar_from_f64(d, v), Scalar::Float(want, d));
            assert_eq!(
                half_bits(d, Scalar::Float(v, DType::F32)),
                half_bits(d, Scalar::Float(want, d))
            );
            // Writing a scalar of another dtype converts with one rounding as well.
            let mut w = HostTensor::zeros(d, &[1]);
            w.write_scalar(0, Scalar::Float(v, DType::F32));
            assert_eq!(w.read_f64(0), want, "{d}");
        }
        // Integers round once too (through f64, 2^60 + 2^52 + 1 would become a tie).
        let big = (1i64 << 60) + (1i64 << 52) + 1;
        let mut w = HostTensor::zeros(DType::BF16, &[1]);
        w.write_scalar(0, Scalar::Int(big, DType::I64));
        assert_eq!(w.read_f64(0), p(60) + p(53));
        assert_eq!(
            half_bits(DType::F16, Scalar::Int(u32::MAX as i64, DType::U32)),
            0x7C00
        );
        assert_eq!(
            half_bits(DType::F16, Scalar::Int(-3, DType::I32)),
            half::f16::from_f32(-3.0).to_bits()
        );
    }
}
