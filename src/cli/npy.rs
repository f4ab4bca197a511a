//! `.npy` files for `kgen run --input NAME=FILE.npy` and `--save-outputs DIR`, through
//! the `npyz` crate (header parsing, byte order, the element codecs).
//!
//! Reading: a plain (not structured, not pickled) array of bool, i32, i64, u32, f16, f32
//! or f64, in either byte order, C or Fortran order, whose shape matches the parameter
//! (rank and constant extents). Conversion to the parameter's dtype: a float parameter
//! takes float or integer arrays, rounded once to nearest even (`kgen::core::round`);
//! an integer parameter takes integer arrays whose every value fits; a bool parameter
//! takes bool arrays. Anything else is an error that says what was found.
//!
//! Writing: C order, in the tensor's dtype where numpy has one (bf16 has none: it is
//! written as f32, which holds every bf16 value exactly, and the caller says so).

use kgen::core::host::HostTensor;
use kgen::core::types::{DType, Scalar};
use npyz::{TypeChar, WriterBuilder};
use std::io::{BufReader, BufWriter};
use std::path::Path;

/// The element types `--input` reads, as numpy spells them.
pub const READABLE: &str = "bool, int32, int64, uint32, float16, float32, float64";

/// An array's elements as read, before conversion.
enum Elems {
    Bool(Vec<bool>),
    Int(Vec<i64>),
    Float(Vec<f64>),
}

impl Elems {
    fn len(&self) -> usize {
        match self {
            Elems::Bool(v) => v.len(),
            Elems::Int(v) => v.len(),
            Elems::Float(v) => v.len(),
        }
    }
}

fn read_all<T: npyz::Deserialize, R: std::io::Read>(
    f: npyz::NpyFile<R>,
    what: &str,
) -> Result<Vec<T>, String> {
    f.into_vec::<T>()
        .map_err(|e| format!("{what}: reading the data: {e}"))
}

/// Reads `path` as the tensor argument `name` of dtype `dtype` with declared extents
/// `dims` (`None`: any). `max_elements` bounds the size.
pub fn read_input(
    name: &str,
    path: &Path,
    dtype: DType,
    dims: &[Option<u32>],
    max_elements: usize,
) -> Result<HostTensor, String> {
    let what = format!("--input {name}={}", path.display());
    let file = std::fs::File::open(path).map_err(|e| format!("{what}: cannot open: {e}"))?;
    let npy = npyz::NpyFile::new(BufReader::new(file))
        .map_err(|e| format!("{what}: not a .npy file: {e}"))?;
    let shape: Vec<u64> = npy.shape().to_vec();
    let fortran = npy.order() == npyz::Order::Fortran;
    let ts = match npy.dtype() {
        npyz::DType::Plain(ts) => ts,
        other => {
            return Err(format!(
                "{what}: a structured array ({}); --input takes a plain array of {READABLE}",
                other.descr()
            ))
        }
    };
    // Shape first: it needs no data.
    if shape.len() != dims.len() {
        return Err(format!(
            "{what}: the array has shape {shape:?} (rank {}), `{name}` has rank {}",
            shape.len(),
            dims.len()
        ));
    }
    for (i, (d, &s)) in dims.iter().zip(&shape).enumerate() {
        if let Some(c) = d {
            if *c as u64 != s {
                return Err(format!(
                    "{what}: dimension {i} of `{name}` is declared as {c}, the array has {s} (shape {shape:?})"
                ));
            }
        }
    }
    let n = shape
        .iter()
        .try_fold(1u64, |acc, &s| acc.checked_mul(s))
        .filter(|&n| n <= max_elements as u64)
        .ok_or_else(|| format!("{what}: more than {max_elements} elements (shape {shape:?})"))?
        as usize;
    let elems = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Bool, 1) => Elems::Bool(read_all::<bool, _>(npy, &what)?),
        (TypeChar::Int, 4) => Elems::Int(
            read_all::<i32, _>(npy, &what)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (TypeChar::Int, 8) => Elems::Int(read_all::<i64, _>(npy, &what)?),
        (TypeChar::Uint, 4) => Elems::Int(
            read_all::<u32, _>(npy, &what)?
                .into_iter()
                .map(i64::from)
                .collect(),
        ),
        (TypeChar::Float, 2) => Elems::Float(
            read_all::<half::f16, _>(npy, &what)?
                .into_iter()
                .map(f64::from)
                .collect(),
        ),
        (TypeChar::Float, 4) => Elems::Float(
            read_all::<f32, _>(npy, &what)?
                .into_iter()
                .map(f64::from)
                .collect(),
        ),
        (TypeChar::Float, 8) => Elems::Float(read_all::<f64, _>(npy, &what)?),
        _ => {
            return Err(format!(
                "{what}: arrays of `{ts}` are not read; --input takes {READABLE} \
                 (convert with numpy's .astype)"
            ))
        }
    };
    if elems.len() != n {
        return Err(format!(
            "{what}: the file holds {} elements, its shape {shape:?} says {n}",
            elems.len()
        ));
    }
    let ushape: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
    let mut t = HostTensor::zeros(dtype, &ushape);
    let put = |t: &mut HostTensor, i: usize, s: Scalar| t.write_scalar(i, s);
    match (&elems, dtype) {
        (Elems::Bool(v), DType::Bool) => v
            .iter()
            .enumerate()
            .for_each(|(i, b)| put(&mut t, i, Scalar::Bool(*b))),
        (Elems::Float(v), d) if d.is_float() => v
            .iter()
            // write_scalar rounds the f64 to `d` once, to nearest even.
            .enumerate()
            .for_each(|(i, x)| put(&mut t, i, Scalar::Float(*x, d))),
        (Elems::Int(v), DType::F32) => v
            .iter()
            .enumerate()
            // i64 → f32 with `as` is one rounding to nearest even.
            .for_each(|(i, x)| put(&mut t, i, Scalar::Float(*x as f32 as f64, DType::F32))),
        (Elems::Int(v), d) if d.is_half() => v
            .iter()
            .enumerate()
            // write_scalar rounds integers to f16/bf16 once (not through f64).
            .for_each(|(i, x)| put(&mut t, i, Scalar::Int(*x, DType::I64))),
        (Elems::Int(v), d) if d.is_int() => {
            let (lo, hi) = match d {
                DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                DType::U32 => (0, u32::MAX as i64),
                _ => (i64::MIN, i64::MAX),
            };
            if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !(lo..=hi).contains(*x)) {
                return Err(format!(
                    "{what}: element {i} ({x}) does not fit in `{name}`'s dtype {d}"
                ));
            }
            v.iter()
                .enumerate()
                .for_each(|(i, x)| put(&mut t, i, Scalar::Int(*x, d)));
        }
        (e, d) => {
            let found = match e {
                Elems::Bool(_) => "bool",
                Elems::Int(_) => "integer",
                Elems::Float(_) => "float",
            };
            let takes = match d {
                DType::Bool => "a bool array",
                d if d.is_int() => "an integer array (a float array would be truncated: convert it with .astype if that is meant)",
                _ => "a float or integer array",
            };
            return Err(format!(
                "{what}: a {found} array (`{ts}`) for `{name}`, a tensor of {d}; it takes {takes}"
            ));
        }
    }
    if fortran && ushape.len() > 1 {
        // Fortran order: the first index varies fastest. View the storage with those
        // strides and copy it into row-major order.
        let mut strides = vec![1usize; ushape.len()];
        for d in 1..ushape.len() {
            strides[d] = strides[d - 1] * ushape[d - 1].max(1);
        }
        t = HostTensor { strides, ..t }.to_contiguous();
    }
    Ok(t)
}

/// Writes a tensor's view as a C-order `.npy` file. Returns a note when the file's dtype
/// is not the tensor's (bf16, written as f32).
pub fn write_output(path: &Path, t: &HostTensor) -> Result<Option<String>, String> {
    let what = || format!("writing `{}`", path.display());
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", what()))?;
    let shape: Vec<u64> = t.shape.iter().map(|&s| s as u64).collect();
    let w = BufWriter::new(file);
    let c = t.to_contiguous();
    let n = c.num_elements();
    fn go<T: npyz::Serialize + npyz::AutoSerialize>(
        w: BufWriter<std::fs::File>,
        shape: &[u64],
        items: impl Iterator<Item = T>,
    ) -> std::io::Result<()> {
        let mut out = npyz::WriteOptions::new()
            .default_dtype()
            .shape(shape)
            .writer(w)
            .begin_nd()?;
        out.extend(items)?;
        out.finish()
    }
    let sz = c.dtype.size_bytes() as usize;
    let raw = |i: usize| &c.data[i * sz..i * sz + sz];
    let mut note = None;
    let r = match c.dtype {
        DType::Bool => go(w, &shape, (0..n).map(|i| raw(i)[0] != 0)),
        DType::I32 => go(w, &shape, (0..n).map(|i| i32::from_le_bytes(arr(raw(i))))),
        DType::U32 => go(w, &shape, (0..n).map(|i| u32::from_le_bytes(arr(raw(i))))),
        DType::I64 => go(w, &shape, (0..n).map(|i| i64::from_le_bytes(arr(raw(i))))),
        DType::F32 => go(w, &shape, (0..n).map(|i| f32::from_le_bytes(arr(raw(i))))),
        DType::F16 => go(
            w,
            &shape,
            (0..n).map(|i| half::f16::from_bits(u16::from_le_bytes(arr(raw(i))))),
        ),
        DType::BF16 => {
            note = Some(format!(
                "`{}` holds bf16 values written as float32 (numpy has no bfloat16; the \
                 widening is exact)",
                path.display()
            ));
            go(
                w,
                &shape,
                (0..n).map(|i| half::bf16::from_bits(u16::from_le_bytes(arr(raw(i)))).to_f32()),
            )
        }
    };
    r.map_err(|e| format!("{}: {e}", what()))?;
    Ok(note)
}

/// The first N bytes of a slice as an array (the callers slice exactly N).
fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("kgen-npy-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    fn write_raw<T: npyz::Serialize + npyz::AutoSerialize>(
        path: &Path,
        shape: &[u64],
        order: npyz::Order,
        v: Vec<T>,
    ) {
        let f = std::fs::File::create(path).unwrap();
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(shape)
            .order(order)
            .writer(BufWriter::new(f))
            .begin_nd()
            .unwrap();
        w.extend(v).unwrap();
        w.finish().unwrap();
    }

    /// Every dtype round-trips through write_output and read_input (bf16 through f32),
    /// strided views are written in row-major order.
    #[test]
    fn outputs_read_back_as_inputs() {
        for d in DType::ALL {
            let vals: Vec<f64> = (0..12)
                .map(|i| match d {
                    DType::Bool => (i % 2) as f64,
                    DType::U32 => i as f64 * 3.0,
                    d if d.is_int() => i as f64 * 3.0 - 17.0,
                    _ => i as f64 * 0.37 - 2.1,
                })
                .collect();
            let t = HostTensor::from_f64(d, &[3, 4], &vals);
            // A transposed view: element [i, j] is t[j, i].
            let tv = HostTensor {
                shape: vec![4, 3],
                strides: vec![1, 4],
                ..t.clone()
            };
            let p = tmp(&format!("rt_{d}.npy"));
            let note = write_output(&p, &tv).unwrap();
            assert_eq!(note.is_some(), d == DType::BF16, "{d}");
            let back = read_input("x", &p, d, &[None, Some(3)], 1 << 20).unwrap();
            assert_eq!(back.shape, vec![4, 3]);
            assert_eq!(back.to_f64_vec(), tv.to_f64_vec(), "{d}");
        }
    }

    #[test]
    fn fortran_order_is_transposed_into_row_major() {
        let p = tmp("fortran.npy");
        // Column-major storage of [[0, 1, 2], [3, 4, 5]].
        write_raw(
            &p,
            &[2, 3],
            npyz::Order::Fortran,
            vec![0f32, 3.0, 1.0, 4.0, 2.0, 5.0],
        );
        let t = read_input("x", &p, DType::F32, &[None, None], 100).unwrap();
        assert_eq!(t.to_f64_vec(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(t.strides, vec![3, 1]);
    }

    /// Conversions round once to nearest even (issue 21's cases), and integers into
    /// 16-bit floats too.
    #[test]
    fn conversions_round_once() {
        let p2 = |e: i32| 2f64.powi(e);
        let p = tmp("round.npy");
        write_raw(
            &p,
            &[2],
            npyz::Order::C,
            vec![1.0 + p2(-8) + p2(-40), 1.0 + p2(-11) + p2(-30)],
        );
        let b = read_input("x", &p, DType::BF16, &[None], 10).unwrap();
        assert_eq!(b.to_f64_vec()[0], 1.0 + p2(-7));
        let h = read_input("x", &p, DType::F16, &[None], 10).unwrap();
        assert_eq!(h.to_f64_vec()[1], 1.0 + p2(-10));
        let big = (1i64 << 60) + (1i64 << 52) + 1;
        write_raw(&p, &[2], npyz::Order::C, vec![big, 2049]);
        let b = read_input("x", &p, DType::BF16, &[None], 10).unwrap();
        assert_eq!(b.to_f64_vec()[0], p2(60) + p2(53));
        let f = read_input("x", &p, DType::F32, &[None], 10).unwrap();
        assert_eq!(f.to_f64_vec(), vec![big as f32 as f64, 2049.0]);
        let i = read_input("x", &p, DType::I64, &[None], 10).unwrap();
        assert_eq!(i.read_scalar(0), Scalar::Int(big, DType::I64));
    }

    #[test]
    fn mismatches_are_errors_that_say_what_was_found() {
        let p = tmp("bad.npy");
        write_raw(&p, &[2, 3], npyz::Order::C, vec![1.5f64; 6]);
        let e = |d, dims: &[Option<u32>]| read_input("x", &p, d, dims, 100).unwrap_err();
        assert!(e(DType::F32, &[None]).contains("shape [2, 3] (rank 2), `x` has rank 1"));
        assert!(e(DType::F32, &[None, Some(4)]).contains("declared as 4, the array has 3"));
        assert!(
            e(DType::I32, &[None, None]).contains("a float array (`<f8`) for `x`, a tensor of i32")
        );
        assert!(e(DType::Bool, &[None, None]).contains("it takes a bool array"));
        assert!(read_input("x", &p, DType::F32, &[None, None], 5)
            .unwrap_err()
            .contains("more than 5 elements"));
        write_raw(&p, &[2], npyz::Order::C, vec![3_000_000_000i64, 1]);
        assert!(read_input("x", &p, DType::I32, &[None], 10)
            .unwrap_err()
            .contains("element 0 (3000000000) does not fit"));
        write_raw(&p, &[2], npyz::Order::C, vec![1u8, 2]);
        assert!(read_input("x", &p, DType::I32, &[None], 10)
            .unwrap_err()
            .contains("arrays of `|u1` are not read"));
        std::fs::write(&p, b"not an npy file at all").unwrap();
        assert!(read_input("x", &p, DType::F32, &[None], 10)
            .unwrap_err()
            .contains("not a .npy file"));
        // Truncated data.
        write_raw(&p, &[4], npyz::Order::C, vec![1f32; 4]);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        assert!(read_input("x", &p, DType::F32, &[None], 10)
            .unwrap_err()
            .contains("reading the data"));
        assert!(
            read_input("x", &tmp("missing.npy"), DType::F32, &[None], 10)
                .unwrap_err()
                .contains("cannot open")
        );
    }
}
