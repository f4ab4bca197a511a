//! `scan.kg`: `scan_tile` (every combine op in every dtype, forward / reversed /
//! exclusive, on rows of 1 to 4097 elements and along each axis of 2-D and 3-D tiles),
//! `segment_offsets` and `top_p`, against float64 references (exact for integers).
//!
//! The table's inputs are finite and never zero and its references finite, so the NaN
//! rule of `max` / `min` is checked through the kernel's `NANS` mode (elements above 0.9
//! become NaN, NaN results are stored as -7), and exclusive `max` / `min` (whose first
//! element is -inf / +inf) only in the interpreter's and the compiler's own tests.

use super::*;

/// The combine ops in `scan_tile`'s numbering (its `OP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Add,
    Mul,
    Max,
    Min,
    And,
    Or,
    Xor,
}

impl Op {
    fn number(self) -> u32 {
        self as u32
    }

    fn name(self) -> &'static str {
        ["add", "mul", "max", "min", "and", "or", "xor"][self as usize]
    }
}

/// One `scan_tile` configuration.
#[derive(Clone, Copy, Debug)]
pub struct TileScan {
    pub dtype: DType,
    /// The tile `[A, B, C]`.
    pub tile: [usize; 3],
    /// The tensor's extents (any; tiles past its edges are masked).
    pub tensor: [usize; 3],
    pub axis: usize,
    pub op: Op,
    pub reverse: bool,
    pub exclusive: bool,
    /// Scans `x > 0` (the dtype is an integer one; results are stored as 0 / 1).
    pub boolean: bool,
    /// Elements above 0.9 become NaN; NaN results are stored as -7.
    pub nans: bool,
}

const NAN_SENTINEL: f64 = -7.0;

/// A row scan: `n` elements, `rows` rows.
const fn row(dtype: DType, n: usize, op: Op, reverse: bool, exclusive: bool) -> TileScan {
    TileScan {
        dtype,
        tile: [1, 1, n],
        tensor: [3, 1, n],
        axis: 2,
        op,
        reverse,
        exclusive,
        boolean: false,
        nans: false,
    }
}

const fn tile(dtype: DType, tile: [usize; 3], tensor: [usize; 3], axis: usize, op: Op) -> TileScan {
    TileScan {
        dtype,
        tile,
        tensor,
        axis,
        op,
        reverse: false,
        exclusive: false,
        boolean: false,
        nans: false,
    }
}

const fn rev(mut s: TileScan) -> TileScan {
    s.reverse = true;
    s
}

const fn excl(mut s: TileScan) -> TileScan {
    s.exclusive = true;
    s
}

const fn nans(mut s: TileScan) -> TileScan {
    s.nans = true;
    s
}

const fn boolean(mut s: TileScan) -> TileScan {
    s.boolean = true;
    s
}

use DType::{BF16, F16, F32, I32, I64, U32};

const QUICK: &[TileScan] = &[
    // Rows of awkward lengths, every op and dtype.
    row(F32, 1, Op::Add, false, false),
    row(F32, 7, Op::Add, true, false),
    row(F32, 127, Op::Add, false, true),
    row(F32, 1000, Op::Add, true, true),
    row(F32, 4097, Op::Add, false, false),
    row(F32, 4097, Op::Add, true, true),
    row(BF16, 4097, Op::Add, false, false),
    row(F16, 1000, Op::Add, true, false),
    row(F32, 4097, Op::Mul, false, false),
    row(BF16, 127, Op::Mul, false, true),
    nans(row(F32, 4097, Op::Max, false, false)),
    nans(row(F16, 1000, Op::Min, true, false)),
    row(BF16, 7, Op::Max, false, false),
    row(F32, 4097, Op::Min, true, false),
    row(I32, 4097, Op::Add, false, false),
    row(I32, 1000, Op::Add, true, true),
    row(U32, 127, Op::Add, false, false),
    row(I64, 4097, Op::Add, false, true),
    row(I32, 1000, Op::Mul, false, false),
    row(I64, 127, Op::Mul, true, false),
    row(I32, 4097, Op::Max, true, false),
    row(U32, 1000, Op::Min, false, true),
    row(I64, 7, Op::Max, false, true),
    row(I32, 4097, Op::And, false, false),
    row(U32, 1000, Op::Or, true, false),
    row(I64, 127, Op::Xor, false, true),
    row(I32, 4097, Op::Xor, true, true),
    boolean(row(I32, 4097, Op::Xor, false, false)),
    boolean(row(I32, 1000, Op::And, true, false)),
    boolean(row(I32, 127, Op::Or, false, true)),
    // 2-D and 3-D tiles along each axis (several tiles per tensor).
    tile(F32, [1, 64, 33], [1, 128, 66], 1, Op::Add),
    tile(F32, [1, 64, 33], [1, 128, 66], 2, Op::Add),
    tile(I32, [1, 7, 130], [2, 14, 130], 1, Op::Add),
    rev(tile(BF16, [1, 7, 130], [2, 14, 130], 2, Op::Add)),
    tile(F32, [3, 5, 70], [6, 5, 70], 0, Op::Add),
    rev(tile(I32, [3, 5, 70], [6, 5, 70], 1, Op::Max)),
    excl(tile(F16, [3, 5, 70], [6, 5, 70], 2, Op::Add)),
    rev(tile(F32, [33, 2, 9], [33, 4, 9], 0, Op::Add)),
    tile(U32, [33, 2, 9], [33, 4, 9], 1, Op::Xor),
    nans(tile(F32, [33, 2, 9], [33, 4, 9], 2, Op::Max)),
    // A tile longer than the tensor: the padding (0) is read, and scanned first when
    // reversed.
    rev(tile(F32, [1, 1, 1024], [3, 1, 1000], 2, Op::Max)),
];

const FULL: &[TileScan] = &[
    row(F32, 8192, Op::Add, true, false),
    row(BF16, 4097, Op::Add, true, true),
    row(I64, 4097, Op::Xor, true, false),
    nans(row(BF16, 4097, Op::Min, false, false)),
    tile(F32, [16, 16, 16], [32, 16, 16], 0, Op::Mul),
    rev(tile(I64, [16, 16, 16], [16, 32, 16], 1, Op::Add)),
    excl(tile(I32, [16, 16, 16], [16, 16, 32], 2, Op::Add)),
];

/// Every case of `scan.kg`: the table's rows for `sizes`.
pub fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    let tiles = QUICK
        .iter()
        .chain(if sizes == SizeSet::Full { FULL } else { &[] });
    for s in tiles {
        v.push(tile_case(seed, *s));
    }
    for n in [1usize, 7, 1000, 4097] {
        v.push(offsets_case(seed, n, 1024));
    }
    v.push(top_p_case(seed, F32, 5, 4097, 4097));
    v.push(top_p_case(seed, BF16, 3, 1000, 1024));
    v.push(top_p_case(seed, F16, 2, 127, 128));
    if sizes == SizeSet::Full {
        v.push(offsets_case(seed, 100_003, 2048));
        v.push(top_p_case(seed, BF16, 4, 8000, 8192));
    }
    v
}

/// An input value of `s`: never zero; floats positive for sums (no cancellation: a
/// relative tolerance holds) and near 1 for products; integers that wrap for add and
/// mul (odd factors: a product never becomes 0), random bit patterns for the bitwise
/// ops, and no negative u32.
fn input(rng: &mut Rng, s: &TileScan) -> f64 {
    let d = s.dtype;
    if d.is_float() {
        return match s.op {
            Op::Add => rng.uniform(0.05, 1.0),
            Op::Mul => rng.uniform(0.97, 1.03),
            _ => rng.signed_magnitude(0.01, 1.0),
        };
    }
    let magnitude = match (s.op, d) {
        _ if s.boolean => rng.uniform(1.0, 100.0),
        (Op::Add, I32) => rng.uniform(1.0, 2f64.powi(30)),
        (Op::Add, I64) => rng.uniform(1.0, 2f64.powi(40)),
        (Op::Mul, I64) => [1.0, 3.0][(rng.next_u64() & 1) as usize],
        (Op::Mul, _) => (rng.uniform(0.0, 8.0).trunc() * 2.0) + 1.0,
        (Op::Max | Op::Min, _) => rng.uniform(1.0, 1000.0),
        (_, I32) => rng.uniform(1.0, 2f64.powi(31)),
        (_, I64) => rng.uniform(1.0, 2f64.powi(52)),
        _ => rng.uniform(1.0, 2f64.powi(32)),
    }
    .trunc();
    if d == U32 || rng.next_u64() & 1 == 0 {
        magnitude
    } else {
        -magnitude
    }
}

/// Wraps an exact integer to the dtype's range.
fn wrap(v: i128, d: DType) -> i128 {
    match d {
        I32 => v as i32 as i128,
        U32 => v as u32 as i128,
        _ => v as i64 as i128,
    }
}

/// The reference scan of one line (in scan order) of `s`'s op, in f64 for floats (NaN
/// skipped by max / min, a prefix of only NaNs NaN) and in exact wrapping integers.
fn scan_line(s: &TileScan, line: &[f64]) -> Vec<f64> {
    let d = s.dtype;
    let mut out = Vec::with_capacity(line.len());
    if s.boolean {
        let mut acc: Option<bool> = s.exclusive.then_some(s.op == Op::And);
        for &x in line {
            let b = x > 0.0;
            let before = acc;
            let next = match (acc, s.op) {
                (None, _) => b,
                (Some(a), Op::And) => a && b,
                (Some(a), Op::Or) => a || b,
                (Some(a), _) => a ^ b,
            };
            acc = Some(next);
            let shown = if s.exclusive {
                before.unwrap_or(false)
            } else {
                next
            };
            out.push(shown as u8 as f64);
        }
        return out;
    }
    if d.is_float() {
        let mut acc: Option<f64> = s.exclusive.then_some(match s.op {
            Op::Mul => 1.0,
            _ => 0.0,
        });
        for &x in line {
            let before = acc;
            let next = match (acc, s.op) {
                (None, _) => x,
                (Some(a), Op::Add) => a + x,
                (Some(a), Op::Mul) => a * x,
                // f64::max / min return the other argument when one is NaN.
                (Some(a), Op::Max) => a.max(x),
                (Some(a), _) => a.min(x),
            };
            acc = Some(next);
            let shown = if s.exclusive {
                before.unwrap_or(0.0)
            } else {
                next
            };
            out.push(if shown.is_nan() { NAN_SENTINEL } else { shown });
        }
        return out;
    }
    let (lo, hi) = match d {
        I32 => (i32::MIN as i128, i32::MAX as i128),
        U32 => (0, u32::MAX as i128),
        _ => (i64::MIN as i128, i64::MAX as i128),
    };
    let start = match s.op {
        Op::Add | Op::Or | Op::Xor => 0,
        Op::Mul => 1,
        Op::And => wrap(-1, d),
        Op::Max => lo,
        Op::Min => hi,
    };
    let mut acc: Option<i128> = s.exclusive.then_some(start);
    for &x in line {
        let x = wrap(x as i128, d);
        let before = acc;
        let next = match (acc, s.op) {
            (None, _) => x,
            (Some(a), Op::Add) => wrap(a + x, d),
            (Some(a), Op::Mul) => wrap(a * x, d),
            (Some(a), Op::Max) => a.max(x),
            (Some(a), Op::Min) => a.min(x),
            (Some(a), Op::And) => wrap(a & x, d),
            (Some(a), Op::Or) => wrap(a | x, d),
            (Some(a), Op::Xor) => wrap(a ^ x, d),
        };
        acc = Some(next);
        let shown = if s.exclusive {
            before.unwrap_or(start)
        } else {
            next
        };
        out.push(shown as f64);
    }
    out
}

/// The reference of `scan_tile`: each tile (padding 0 past the tensor, NaN above 0.9
/// in `nans` mode) scanned along the axis, the elements inside the tensor kept.
pub fn tile_reference(s: &TileScan, x: &[f64]) -> Vec<f64> {
    let [d0, d1, d2] = s.tensor;
    let mut y = vec![f64::NAN; x.len()];
    // The kernel's `0.9 as T`.
    let nan_above = HostTensor::from_f64(s.dtype, &[1], &[0.9]).to_f64_vec()[0];
    let grid: Vec<usize> = (0..3).map(|i| s.tensor[i].div_ceil(s.tile[i])).collect();
    for g0 in 0..grid[0] {
        for g1 in 0..grid[1] {
            for g2 in 0..grid[2] {
                let origin = [g0 * s.tile[0], g1 * s.tile[1], g2 * s.tile[2]];
                // Every line of the tile along the axis.
                let (p, q) = match s.axis {
                    0 => (1, 2),
                    1 => (0, 2),
                    _ => (0, 1),
                };
                for a in 0..s.tile[p] {
                    for b in 0..s.tile[q] {
                        let mut coords: Vec<[usize; 3]> = (0..s.tile[s.axis])
                            .map(|k| {
                                let mut c = origin;
                                c[p] += a;
                                c[q] += b;
                                c[s.axis] += k;
                                c
                            })
                            .collect();
                        if s.reverse {
                            coords.reverse();
                        }
                        let inside = |c: &[usize; 3]| c[0] < d0 && c[1] < d1 && c[2] < d2;
                        let at = |c: &[usize; 3]| (c[0] * d1 + c[1]) * d2 + c[2];
                        let line: Vec<f64> = coords
                            .iter()
                            .map(|c| {
                                let v = if inside(c) { x[at(c)] } else { 0.0 };
                                if s.nans && v > nan_above {
                                    f64::NAN
                                } else {
                                    v
                                }
                            })
                            .collect();
                        for (c, v) in coords.iter().zip(scan_line(s, &line)) {
                            if inside(c) {
                                y[at(c)] = v;
                            }
                        }
                    }
                }
            }
        }
    }
    y
}

/// One `scan_tile` case.
pub fn tile_case(seed: u64, s: TileScan) -> Case {
    let mut flags = String::new();
    for (on, name) in [
        (s.reverse, " reverse"),
        (s.exclusive, " exclusive"),
        (s.boolean, " bool"),
        (s.nans, " nans"),
    ] {
        if on {
            flags.push_str(name);
        }
    }
    let label = format!(
        "scan_tile T={} {} tile={:?} tensor={:?} axis={}{flags}",
        s.dtype,
        s.op.name(),
        s.tile,
        s.tensor,
        s.axis
    );
    let mut rng = Rng::for_case(seed, &label);
    let n: usize = s.tensor.iter().product();
    let vals: Vec<f64> = (0..n).map(|_| input(&mut rng, &s)).collect();
    let args = vec![
        ArgValue::Tensor(HostTensor::from_f64(s.dtype, &s.tensor, &vals)),
        ArgValue::Tensor(poisoned(s.dtype, &s.tensor)),
    ];
    let grid: Vec<u32> = (0..3)
        .map(|i| s.tensor[i].div_ceil(s.tile[i]) as u32)
        .collect();
    let tolerance = match s.op {
        _ if !s.dtype.is_float() => Tolerance { rel: 0.0, abs: 0.0 },
        // Positive sums: an f32 tree's error, ~log2(n) roundings.
        Op::Add => Tolerance::for_dtype(
            s.dtype,
            Tolerance {
                rel: 1e-5,
                abs: 0.0,
            },
        ),
        // Products of 4097 factors: ~sqrt(n) roundings typically, n at worst.
        Op::Mul => Tolerance::for_dtype(
            s.dtype,
            Tolerance {
                rel: 1e-4,
                abs: 0.0,
            },
        ),
        _ => Tolerance { rel: 0.0, abs: 0.0 },
    };
    Case {
        options: Default::default(),
        kernel: "scan",
        kernel_name: Some("scan_tile"),
        label,
        defines: defines(&[
            ("T", s.dtype.to_string()),
            ("A", s.tile[0].to_string()),
            ("B", s.tile[1].to_string()),
            ("C", s.tile[2].to_string()),
            ("AXIS", s.axis.to_string()),
            ("OP", s.op.number().to_string()),
            ("REVERSE", s.reverse.to_string()),
            ("EXCLUSIVE", s.exclusive.to_string()),
            ("BOOL", s.boolean.to_string()),
            ("NANS", s.nans.to_string()),
        ]),
        tensor_align: aligns(&["x", "y"], &args),
        grid: [grid[0], grid[1], grid[2]],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| vec![tile_reference(&s, &tensor_at(args, 0).to_f64_vec())]),
        tolerance,
    }
}

/// One `segment_offsets` case: `n` lengths in 1..=100, `n + 1` offsets.
pub fn offsets_case(seed: u64, n: usize, block: usize) -> Case {
    let label = format!("segment_offsets BLOCK={block} n={n}");
    let mut rng = Rng::for_case(seed, &label);
    let lengths: Vec<f64> = (0..n).map(|_| rng.uniform(1.0, 101.0).trunc()).collect();
    let args = vec![
        ArgValue::Tensor(HostTensor::from_f64(I32, &[n], &lengths)),
        ArgValue::Tensor(poisoned(I32, &[n + 1])),
    ];
    Case {
        options: Default::default(),
        kernel: "scan",
        kernel_name: Some("segment_offsets"),
        label,
        defines: defines(&[("BLOCK", block.to_string())]),
        tensor_align: aligns(&["lengths", "offsets"], &args),
        grid: [1, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(|args| {
            let mut acc = 0.0;
            let mut out = vec![0.0];
            for l in tensor_at(args, 0).to_f64_vec() {
                acc += l;
                out.push(acc);
            }
            vec![out]
        }),
        tolerance: Tolerance { rel: 0.0, abs: 0.0 },
    }
}

/// The exclusive prefix sums of a row, in f64.
fn before(row: &[f64]) -> Vec<f64> {
    let mut acc = 0.0;
    row.iter()
        .map(|&v| {
            let b = acc;
            acc += v;
            b
        })
        .collect()
}

/// One `top_p` case: `rows` rows of `v` probabilities (decreasing, summing to about 1,
/// never zero), p between two consecutive prefix sums of row 0 past 60% of the row,
/// chosen so that no prefix sum of any row lies within 2e-6 of it: far beyond an f32
/// sum's error, so every token is kept or dropped alike on the GPU, the interpreter
/// and the reference.
pub fn top_p_case(seed: u64, dtype: DType, rows: usize, v: usize, block: usize) -> Case {
    let label = format!("top_p T={dtype} BLOCK={block} rows={rows} V={v}");
    let mut rng = Rng::for_case(seed, &label);
    // Decreasing weights with some noise, normalized, rounded to the dtype.
    let mut vals = Vec::with_capacity(rows * v);
    for _ in 0..rows {
        let mut w: Vec<f64> = (0..v)
            .map(|i| (-(i as f64) * 4.0 / v as f64).exp() * rng.uniform(0.5, 1.0))
            .collect();
        w.sort_by(|a, b| b.total_cmp(a));
        let z: f64 = w.iter().sum();
        let row: Vec<f64> = w.iter().map(|x| x / z).collect();
        vals.extend(HostTensor::from_f64(dtype, &[v], &row).to_f64_vec());
    }
    let prefixes: Vec<Vec<f64>> = vals.chunks(v).map(before).collect();
    let clear = |p: f64| prefixes.iter().flatten().all(|b| (b - p).abs() > 2e-6);
    let p = (v * 3 / 5..v)
        .map(|j| {
            let b = &prefixes[0];
            let next = b.get(j + 1).copied().unwrap_or(b[j] + vals[j]);
            ((b[j] + next) / 2.0) as f32 as f64
        })
        .find(|&p| clear(p))
        .expect("a threshold clear of every prefix sum");
    let args = vec![
        ArgValue::Tensor(HostTensor::from_f64(dtype, &[rows, v], &vals)),
        ArgValue::Tensor(poisoned(dtype, &[rows, v])),
        ArgValue::Tensor(poisoned(F32, &[rows, v])),
        f32_arg(p),
    ];
    Case {
        options: Default::default(),
        kernel: "scan",
        kernel_name: Some("top_p"),
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&["probs", "kept", "cum", "p"], &args),
        grid: [rows as u32, 1, 1],
        args,
        outputs: vec![1, 2],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let p = scalar_at(args, 3);
            let mut kept = Vec::with_capacity(x.len());
            let mut cum = Vec::with_capacity(x.len());
            for row in x.chunks(v) {
                let b = before(row);
                let k: Vec<f64> = row
                    .iter()
                    .zip(&b)
                    .map(|(&x, &b)| if b < p { x } else { 0.0 })
                    .collect();
                let s: f64 = k.iter().sum();
                kept.extend(k.iter().map(|x| x / s));
                cum.extend(row.iter().zip(&b).map(|(x, b)| x + b));
            }
            vec![kept, cum]
        }),
        // Sums of positive f32 terms, a division; kept values rounded to T once.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 0.0,
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The references on small hand-checked lines: the rules the kernel must follow.
    #[test]
    fn reference_rules() {
        let s = |op, reverse, exclusive| TileScan {
            dtype: I32,
            tile: [1, 1, 4],
            tensor: [1, 1, 4],
            axis: 2,
            op,
            reverse,
            exclusive,
            boolean: false,
            nans: false,
        };
        let x = [3.0, -1.0, 4.0, -1.0];
        assert_eq!(
            tile_reference(&s(Op::Add, false, false), &x),
            [3.0, 2.0, 6.0, 5.0]
        );
        assert_eq!(
            tile_reference(&s(Op::Add, true, true), &x),
            [2.0, 3.0, -1.0, 0.0]
        );
        assert_eq!(
            tile_reference(&s(Op::Max, true, false), &x),
            [4.0, 4.0, 4.0, -1.0]
        );
        assert_eq!(
            tile_reference(&s(Op::Min, false, true), &x),
            [i32::MAX as f64, 3.0, -1.0, -1.0]
        );
        let mut f = s(Op::Max, false, false);
        f.dtype = F32;
        f.nans = true;
        assert_eq!(
            tile_reference(&f, &[0.95, 0.5, 0.99, 0.7]),
            [-7.0, 0.5, 0.5, 0.7]
        );
        let mut w = s(Op::Mul, false, false);
        w.tile = [1, 1, 2];
        w.tensor = [1, 1, 2];
        assert_eq!(tile_reference(&w, &[65536.0, 65537.0]), [65536.0, 65536.0]);
    }
}
