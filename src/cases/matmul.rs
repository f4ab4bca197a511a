//! `matmul.kg`: c = a @ b on strided operands (plain and transposed views).

use super::*;

const PARAMS: &[&str] = &["a", "b", "c"];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    use DType::*;
    // (M, K, N, dtype, a transposed, b transposed)
    let mut table: Vec<(usize, usize, usize, DType, bool, bool)> = vec![
        (1, 1, 1, F32, false, false),
        (7, 7, 7, F32, false, false),
        (40, 50, 70, F32, false, false),
        (33, 17, 65, F32, true, false),
        (33, 17, 65, F32, false, true),
        (64, 100, 48, BF16, false, false),
        (31, 64, 9, BF16, true, true),
        (16, 40, 33, F16, false, true),
    ];
    if sizes == SizeSet::Full {
        table.extend([
            (257, 300, 129, F32, false, false),
            (128, 1000, 64, BF16, true, false),
            (100, 257, 1000, F32, false, true),
        ]);
    }
    let mut out: Vec<Case> = table
        .into_iter()
        .map(|(m, k, n, dt, ta, tb)| case(seed, dt, m, k, n, ta, tb))
        .collect();
    // f32 on the TF32 tensor cores (`TF32=true`), plain and transposed operands.
    let mut tf32 = vec![
        (1, 1, 1, false, false),
        (40, 50, 70, false, false),
        (33, 17, 65, true, true),
    ];
    if sizes == SizeSet::Full {
        tf32.push((257, 300, 129, false, true));
    }
    out.extend(
        tf32.into_iter()
            .map(|(m, k, n, ta, tb)| case_tf32(seed, m, k, n, ta, tb)),
    );
    out
}

/// A random `[rows, cols]` operand; when `transposed`, it is stored as `[cols, rows]`
/// and viewed through strides `[1, rows]` (what `x.T` is).
fn operand(rng: &mut Rng, dtype: DType, rows: usize, cols: usize, transposed: bool) -> HostTensor {
    if !transposed {
        return random_tensor(rng, dtype, &[rows, cols], |r| r.normalish());
    }
    let mut t = random_tensor(rng, dtype, &[cols, rows], |r| r.normalish());
    t.shape = vec![rows, cols];
    t.strides = vec![1, rows];
    t
}

/// One `matmul` case.
pub fn case(seed: u64, dtype: DType, m: usize, k: usize, n: usize, a_t: bool, b_t: bool) -> Case {
    let t = |x: bool| if x { ".T" } else { "" };
    let label = format!("matmul T={dtype} [{m}x{k}]{} @ [{k}x{n}]{}", t(a_t), t(b_t));
    let mut rng = Rng::for_case(seed, &label);
    let a = operand(&mut rng, dtype, m, k, a_t);
    let b = operand(&mut rng, dtype, k, n, b_t);
    let c = poisoned(dtype, &[m, n]);
    let args = vec![
        ArgValue::Tensor(a),
        ArgValue::Tensor(b),
        ArgValue::Tensor(c),
    ];
    let (bm, bn) = (32usize, 32usize);
    Case {
        options: Default::default(),
        kernel: "matmul",
        kernel_name: None,
        label,
        defines: defines(&[("T", dtype.to_string())]),
        tensor_align: aligns(PARAMS, &args),
        grid: [cdiv(m, bm) as u32, cdiv(n, bn) as u32, 1],
        args,
        outputs: vec![2],
        reference: Box::new(move |args| {
            let a = tensor_at(args, 0).to_f64_vec();
            let b = tensor_at(args, 1).to_f64_vec();
            vec![reference(&a, &b, m, k, n)]
        }),
        // f32 accumulation of k products of magnitude ~1 in an order that differs from
        // the reference: an absolute error of a few ulp of the running sum's size.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-5,
                abs: 4e-7 * (k as f64).max(1.0),
            },
        ),
    }
}

/// One f32 `matmul` case with `TF32=true`: the same kernel with its `dot` on the TF32
/// tensor cores.
///
/// Tolerance: each operand is rounded to 11 significant bits (relative error ≤ 2⁻¹¹), so
/// each product is off by at most about 2⁻¹⁰ of itself, with independent signs. For
/// normal-ish operands (|a·b| about 1) the sum of k such errors stays, with a wide
/// margin (six standard deviations), within 6 · 2⁻¹⁰ · √k; the f32 summation adds the
/// usual few ulp of the running sum.
pub fn case_tf32(seed: u64, m: usize, k: usize, n: usize, a_t: bool, b_t: bool) -> Case {
    let mut c = case(seed, DType::F32, m, k, n, a_t, b_t);
    c.label = format!("{} TF32", c.label);
    c.defines.push(("TF32".to_string(), "true".to_string()));
    c.tolerance = Tolerance {
        rel: 1e-5,
        abs: 6.0 * 2f64.powi(-10) * (k as f64).sqrt() + 4e-7 * (k as f64).max(1.0),
    };
    c
}

/// Row-major [m, n] = [m, k] @ [k, n] in f64.
pub fn reference(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += av * b[p * n + j];
            }
        }
    }
    c
}
