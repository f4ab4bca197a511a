//! `lang.kg` (beside this file, not an op of the library): the builtins issue 21 added
//! to the language, each against a float64 reference on awkward sizes: `erf`, `**` and
//! `pow` (float and integer), `maximum` / `minimum` on f32, f16, bf16 and i32, `lowest` /
//! `highest`, `item`, `arange(n)`, reductions without an axis (argmax's flat index
//! included), a compile-time float value (default and `-D`), `x.dtype`. The selftest
//! runs them on the GPU against the interpreter and the references.

use super::*;

/// The source of `lang.kg`.
pub const SOURCE: &str = include_str!("lang.kg");

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    // (dtype, n, BLOCK, EPS define)
    let math: &[(DType, usize, usize, Option<&str>)] = &[
        (DType::F32, 1, 256, None),
        (DType::F32, 7, 256, Some("0.5")),
        (DType::BF16, 127, 256, None),
        (DType::F16, 1000, 256, None),
        (DType::F32, 4097, 1024, Some("2.5e-2")),
        (DType::BF16, 4097, 1024, None),
    ];
    for &(dt, n, b, eps) in math {
        v.push(math_case(seed, dt, n, b, eps));
    }
    for (n, b) in [(1usize, 256usize), (7, 256), (1000, 256), (4097, 1024)] {
        v.push(int_case(seed, n, b));
    }
    for (dt, rows, cols, b) in [
        (DType::F32, 1usize, 1usize, 128usize),
        (DType::BF16, 7, 127, 128),
        (DType::F32, 5, 1000, 1024),
        (DType::F16, 3, 1000, 1024),
    ] {
        v.push(rows_case(seed, dt, rows, cols, b));
    }
    for (rows, cols, splits, bm, bn) in [
        (1usize, 1usize, 1usize, 16usize, 64usize),
        (7, 127, 3, 16, 64),
        (127, 1000, 4, 32, 64),
        (300, 4096, 2, 16, 128),
    ] {
        v.push(accumulate_case(seed, rows, cols, splits, bm, bn));
    }
    if sizes == SizeSet::Full {
        v.push(accumulate_case(seed, 1000, 4097, 5, 64, 64));
        v.push(math_case(seed, DType::F32, 1_000_003, 1024, None));
        v.push(math_case(seed, DType::BF16, 65_537, 256, Some("1e-4")));
        v.push(int_case(seed, 1_000_003, 1024));
        v.push(rows_case(seed, DType::F32, 300, 4096, 4096));
    }
    v
}

/// `lang_math` over `n` elements.
pub fn math_case(seed: u64, dtype: DType, n: usize, block: usize, eps: Option<&str>) -> Case {
    let eps_text = eps.unwrap_or("1e-3");
    let label = format!("lang_math T={dtype} BLOCK={block} EPS={eps_text} n={n}");
    let mut rng = Rng::for_case(seed, &label);
    let args = vec![
        ArgValue::Tensor(random_tensor(&mut rng, dtype, &[n], |r| r.normalish())),
        ArgValue::Tensor(poisoned(dtype, &[n])),
        ArgValue::Tensor(poisoned(dtype, &[n])),
        ArgValue::Tensor(poisoned(dtype, &[n])),
    ];
    let mut d = vec![("T", dtype.to_string()), ("BLOCK", block.to_string())];
    if let Some(e) = eps {
        d.push(("EPS", e.to_string()));
    }
    // The kernel's EPS is the f32 nearest the decimal.
    let eps_val = eps_text.parse::<f32>().expect("a float") as f64;
    Case {
        options: Default::default(),
        kernel: "lang",
        kernel_name: Some("lang_math"),
        label,
        defines: defines(&d),
        tensor_align: aligns(&["x", "e", "p", "c"], &args),
        grid: [cdiv(n, block) as u32, 1, 1],
        args,
        outputs: vec![1, 2, 3],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let e = x.iter().map(|&v| libm::erf(v)).collect();
            let p = x
                .iter()
                .map(|&v| {
                    let a = v.abs() + eps_val;
                    a.powf(1.5) + v * v + a.powf(-0.5)
                })
                .collect();
            let c = x.iter().map(|&v| v.max(0.0) + v.min(0.25)).collect();
            vec![e, p, c]
        }),
        // erf within 2 ulp; pow through the hardware's lg2/ex2 (a few ulp); sums of
        // positive terms. f16/bf16: one rounding of the result.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 1e-6,
            },
        ),
    }
}

/// `lang_int` over `n` elements (values in ±[1, 1000), so `v ** 3` fits in i32).
pub fn int_case(seed: u64, n: usize, block: usize) -> Case {
    let label = format!("lang_int BLOCK={block} n={n}");
    let mut rng = Rng::for_case(seed, &label);
    let args = vec![
        ArgValue::Tensor(random_tensor(&mut rng, DType::I32, &[n], |r| {
            r.signed_magnitude(1.0, 1000.0).trunc()
        })),
        ArgValue::Tensor(poisoned(DType::I32, &[n])),
        ArgValue::Tensor(poisoned(DType::I32, &[n])),
    ];
    Case {
        options: Default::default(),
        kernel: "lang",
        kernel_name: Some("lang_int"),
        label,
        defines: defines(&[("BLOCK", block.to_string())]),
        tensor_align: aligns(&["x", "y", "z"], &args),
        grid: [cdiv(n, block) as u32, 1, 1],
        args,
        outputs: vec![1, 2],
        reference: Box::new(|args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let y = x
                .iter()
                .enumerate()
                .map(|(i, &v)| v.max(0.0) + v.min(100.0) * 3.0 + v * v * v + i as f64)
                .collect();
            let z = x
                .iter()
                .map(|&v| {
                    if v > 0.0 {
                        i32::MAX as f64 - v
                    } else {
                        i32::MIN as f64 + v * v
                    }
                })
                .collect();
            vec![y, z]
        }),
        tolerance: Tolerance { rel: 0.0, abs: 0.0 },
    }
}

/// `lang_accumulate`: `splits` partial tiles of a `rows x cols` f32 output added into
/// it (random values there first, not zeros) by `atomic_add`.
pub fn accumulate_case(
    seed: u64,
    rows: usize,
    cols: usize,
    splits: usize,
    bm: usize,
    bn: usize,
) -> Case {
    let label = format!("lang_accumulate BM={bm} BN={bn} rows={rows} cols={cols} splits={splits}");
    let mut rng = Rng::for_case(seed, &label);
    let args = vec![
        ArgValue::Tensor(random_tensor(
            &mut rng,
            DType::F32,
            &[splits, rows, cols],
            |r| r.normalish(),
        )),
        ArgValue::Tensor(random_tensor(&mut rng, DType::F32, &[rows, cols], |r| {
            r.normalish()
        })),
    ];
    Case {
        options: Default::default(),
        kernel: "lang",
        kernel_name: Some("lang_accumulate"),
        label,
        defines: defines(&[("BM", bm.to_string()), ("BN", bn.to_string())]),
        tensor_align: aligns(&["x", "out"], &args),
        grid: [cdiv(rows, bm) as u32, cdiv(cols, bn) as u32, splits as u32],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let mut out = tensor_at(args, 1).to_f64_vec();
            for part in x.chunks(rows * cols) {
                for (o, &v) in out.iter_mut().zip(part) {
                    *o += 2.0 * v;
                }
            }
            vec![out]
        }),
        // Up to 6 f32 additions of magnitude < 8 each, in any order.
        tolerance: Tolerance {
            rel: 1e-5,
            abs: 1e-5,
        },
    }
}

/// `lang_rows` over a `rows x cols` tensor (cols <= BLOCK, BLOCK a multiple of 4).
pub fn rows_case(seed: u64, dtype: DType, rows: usize, cols: usize, block: usize) -> Case {
    let label = format!("lang_rows T={dtype} BLOCK={block} rows={rows} cols={cols}");
    let mut rng = Rng::for_case(seed, &label);
    let args = vec![
        ArgValue::Tensor(random_tensor(&mut rng, dtype, &[rows, cols], |r| {
            r.normalish()
        })),
        ArgValue::Tensor(poisoned(DType::F32, &[rows, 4])),
        ArgValue::Tensor(poisoned(DType::I32, &[rows, 2])),
    ];
    Case {
        options: Default::default(),
        kernel: "lang",
        kernel_name: Some("lang_rows"),
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&["x", "stats", "am"], &args),
        grid: [rows as u32, 1, 1],
        args,
        outputs: vec![1, 2],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let mut stats = Vec::new();
            let mut am = Vec::new();
            for row in x.chunks(cols) {
                let s: f64 = row.iter().sum();
                let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lo = row.iter().copied().fold(f64::INFINITY, f64::min);
                stats.extend([s, m, lo, row[0]]);
                // The first index of the maximum.
                let k = row.iter().position(|&v| v == m).unwrap_or(0) as f64;
                am.extend([k, k]);
            }
            vec![stats, am]
        }),
        // The sum of up to 4096 values of magnitude < 3.5 in f32; the rest is exact.
        tolerance: Tolerance {
            rel: 1e-5,
            abs: 1e-3,
        },
    }
}
