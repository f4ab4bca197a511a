//! `int_div.kg` (a self-test kernel, `src/cases/kernels/`): integer `/` and `%` by
//! divisors that include 0, -1 and MIN, for i32, u32 and i64, over tiles, a runtime
//! scalar, constants and scalars. The results are defined (x / 0 = all ones, x % 0 = x,
//! MIN / -1 = MIN, MIN % -1 = 0); the reference below computes them from the
//! definition in i128, and `kgen selftest --gpu` checks that the GPU gives exactly what
//! the interpreter does (an H200 differed on 7,189 of 50,001 elements before the
//! back end guarded the division).
//!
//! The inputs hold zeros on purpose (the divisor's zeros are the point; the dividend's
//! zeros cover 0 / 0): the case table's "inputs are never zero" rule, which catches
//! dropped elements in float kernels, does not apply to this kernel's integers.

use super::*;
use kgen_core::types::Scalar;

const PARAMS: &[&str] = &["a", "b", "out", "d"];
/// Rows of `out` (see the kernel's header).
const ROWS: usize = 10;

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    for dt in [DType::I32, DType::U32, DType::I64] {
        // -1 and MIN (for u32 the same bits, which are not special there).
        let (all_ones, min) = (wrap(dt, -1), min_of(dt));
        let three = if dt == DType::U32 { 3 } else { -3 };
        // (n, BLOCK, the scalar divisor d)
        let mut shapes = vec![
            (1usize, 256usize, 0i64),
            (7, 256, all_ones),
            (1000, 256, min),
            (4097, 1024, 0),
            (4097, 128, three),
        ];
        if sizes == SizeSet::Full {
            shapes.push((50_001, 1024, all_ones));
        }
        for (n, block, d) in shapes {
            v.push(case(seed, dt, n, block, d));
        }
    }
    v
}

/// The dtype's most negative value (u32: 2^31, the same bits as i32's).
fn min_of(dt: DType) -> i64 {
    match dt {
        DType::I32 => i32::MIN as i64,
        DType::I64 => i64::MIN,
        _ => 1 << 31,
    }
}

/// `x` wrapped into `dt` (two's complement), as the tensors store it.
fn wrap(dt: DType, x: i128) -> i64 {
    match dt {
        DType::I32 => x as i32 as i64,
        DType::U32 => x as u32 as i64,
        _ => x as i64,
    }
}

/// The language's `x / y` and `x % y` on `dt` (values as the dtype reads them), from
/// the definition: by zero, all ones and `x`; otherwise the quotient truncated toward
/// zero and the remainder with the dividend's sign, computed exactly and wrapped (so
/// MIN / -1 = MIN and MIN % -1 = 0).
pub fn div_rem(dt: DType, x: i64, y: i64) -> (i64, i64) {
    if y == 0 {
        return (wrap(dt, -1), x);
    }
    let (x, y) = (x as i128, y as i128);
    (wrap(dt, x / y), wrap(dt, x % y))
}

/// A value of `dt` from the mix the case wants: the extremes, 0, ±1 and small values
/// often, anything else otherwise (i64 within ±2^52, so the f64 comparison is exact).
fn draw(rng: &mut Rng, dt: DType, zeros: u64) -> i64 {
    let (lo, hi) = match dt {
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        _ => (-(1i64 << 52), 1i64 << 52),
    };
    let pick = rng.next_u64() % 100;
    let small = (rng.next_u64() % 33) as i64 - 16;
    let any = lo + (rng.next_u64() % ((hi - lo) as u64 + 1)) as i64;
    match pick {
        p if p < zeros => 0,
        p if p < zeros + 10 => wrap(dt, -1),
        p if p < zeros + 15 => min_of(dt),
        p if p < zeros + 18 => hi,
        p if p < zeros + 23 => 1,
        p if p < zeros + 45 => wrap(dt, small as i128),
        _ => any,
    }
}

/// One `int_div` case: `n` elements of `dt`, tiles of `block`, scalar divisor `d`.
pub fn case(seed: u64, dt: DType, n: usize, block: usize, d: i64) -> Case {
    let label = format!("int_div T={dt} BLOCK={block} n={n} d={d}");
    let mut rng = Rng::for_case(seed, &label);
    let mut a = HostTensor::zeros(dt, &[n]);
    let mut b = HostTensor::zeros(dt, &[n]);
    for i in 0..n {
        a.write_scalar(i, Scalar::Int(draw(&mut rng, dt, 5), dt));
        b.write_scalar(i, Scalar::Int(draw(&mut rng, dt, 15), dt));
    }
    // Not all ones (x / 0's result), not a value any row can hold everywhere.
    let mut out = HostTensor::zeros(dt, &[ROWS, n]);
    out.poison(0x5A);
    let args = vec![
        ArgValue::Tensor(a),
        ArgValue::Tensor(b),
        ArgValue::Tensor(out),
        ArgValue::Scalar(Scalar::Int(d, dt)),
    ];
    let signed = dt != DType::U32;
    Case {
        options: Default::default(),
        kernel: "int_div",
        kernel_name: None,
        label,
        defines: defines(&[
            ("T", dt.to_string()),
            ("BLOCK", block.to_string()),
            ("SIGNED", signed.to_string()),
        ]),
        tensor_align: aligns(PARAMS, &args),
        grid: [cdiv(n, block) as u32, 1, 1],
        args,
        outputs: vec![2],
        reference: Box::new(move |args| {
            let read = |t: &HostTensor, i: usize| match t.read_scalar(i) {
                Scalar::Int(v, _) => v,
                _ => 0,
            };
            let (a, b) = (tensor_at(args, 0), tensor_at(args, 1));
            let d = match args[3] {
                ArgValue::Scalar(Scalar::Int(v, _)) => v,
                _ => 0,
            };
            let dt = a.dtype;
            let n = a.num_elements();
            let c = if dt == DType::U32 {
                u32::MAX as i64
            } else {
                -1
            };
            // out[k, i], row-major.
            let mut out = vec![0f64; ROWS * n];
            for i in 0..n {
                let (x, y) = (read(a, i), read(b, i));
                let first = i - i % block;
                let pairs = [
                    div_rem(dt, x, y),
                    div_rem(dt, x, d),
                    div_rem(dt, x, 0),
                    div_rem(dt, x, c),
                    div_rem(dt, read(a, first), read(b, first)),
                ];
                for (k, (q, r)) in pairs.into_iter().enumerate() {
                    out[2 * k * n + i] = Scalar::Int(q, dt).to_f64();
                    out[(2 * k + 1) * n + i] = Scalar::Int(r, dt).to_f64();
                }
            }
            vec![out]
        }),
        tolerance: Tolerance { rel: 0.0, abs: 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_at_its_edges() {
        assert_eq!(div_rem(DType::I32, 7, 0), (-1, 7));
        assert_eq!(div_rem(DType::U32, 7, 0), (u32::MAX as i64, 7));
        assert_eq!(div_rem(DType::I64, -5, 0), (-1, -5));
        assert_eq!(
            div_rem(DType::I32, i32::MIN as i64, -1),
            (i32::MIN as i64, 0)
        );
        assert_eq!(div_rem(DType::I64, i64::MIN, -1), (i64::MIN, 0));
        assert_eq!(div_rem(DType::I32, -7, 2), (-3, -1));
        assert_eq!(
            div_rem(DType::U32, u32::MAX as i64, 2),
            (i32::MAX as i64, 1)
        );
    }
}
