//! `relu.kg`: y = relu(x) and `relu_bwd` (dx = dy where x > 0, else 0), flat tensors.
//!
//! The table's inputs are finite and never zero (the table's contract), so the NaN
//! rules (relu(NaN) = NaN, relu_bwd passes dy where x is NaN, as torch's
//! threshold_backward does) are checked by the unit test below in the interpreter, and
//! by the PTX check that relu does not use `max.f32` (which would turn NaN into 0).

use super::*;

/// (n, dtype, BLOCK).
const QUICK: &[(usize, DType, usize)] = &[
    (1, DType::BF16, 2048),
    (7, DType::F32, 2048),
    (1000, DType::F16, 2048),
    (1000, DType::BF16, 256),
    (4097, DType::F32, 1024),
    (4097, DType::BF16, 1000),
    (4096, DType::F16, 4096),
];

const FULL: &[(usize, DType, usize)] = &[
    (1_000_003, DType::BF16, 2048),
    (1_000_003, DType::F32, 1024),
    (65_537, DType::F16, 4096),
];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    let shapes = QUICK
        .iter()
        .chain(if sizes == SizeSet::Full { FULL } else { &[] });
    for &(n, dt, b) in shapes {
        v.push(forward_case(seed, dt, n, b));
        v.push(backward_case(seed, dt, n, b));
    }
    v
}

/// relu in f64, NaN propagating.
pub fn forward_reference(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| if v < 0.0 { 0.0 } else { v }).collect()
}

/// torch's threshold_backward(dy, x, 0): 0 where x <= 0, else dy (NaN x passes dy).
pub fn backward_reference(x: &[f64], dy: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(dy)
        .map(|(&v, &g)| if v <= 0.0 { 0.0 } else { g })
        .collect()
}

/// Results are copies or zeros: exact in every dtype.
const EXACT: Tolerance = Tolerance { rel: 0.0, abs: 0.0 };

/// One `relu` case.
pub fn forward_case(seed: u64, dtype: DType, n: usize, block: usize) -> Case {
    let label = format!("relu T={dtype} BLOCK={block} n={n}");
    let mut rng = Rng::for_case(seed, &label);
    let args = vec![
        ArgValue::Tensor(random_tensor(&mut rng, dtype, &[n], |r| r.normalish())),
        ArgValue::Tensor(poisoned(dtype, &[n])),
    ];
    Case {
        options: Default::default(),
        kernel: "relu",
        kernel_name: Some("relu"),
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&["x", "y"], &args),
        grid: [cdiv(n, block) as u32, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(|args| vec![forward_reference(&tensor_at(args, 0).to_f64_vec())]),
        tolerance: EXACT,
    }
}

/// One `relu_bwd` case.
pub fn backward_case(seed: u64, dtype: DType, n: usize, block: usize) -> Case {
    let label = format!("relu_bwd T={dtype} BLOCK={block} n={n}");
    let mut rng = Rng::for_case(seed, &label);
    let args = vec![
        ArgValue::Tensor(random_tensor(&mut rng, dtype, &[n], |r| r.normalish())),
        ArgValue::Tensor(random_tensor(&mut rng, dtype, &[n], |r| r.normalish())),
        ArgValue::Tensor(poisoned(dtype, &[n])),
    ];
    Case {
        options: Default::default(),
        kernel: "relu",
        kernel_name: Some("relu_bwd"),
        label,
        defines: defines(&[("T", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&["x", "dy", "dx"], &args),
        grid: [cdiv(n, block) as u32, 1, 1],
        args,
        outputs: vec![2],
        reference: Box::new(|args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let dy = tensor_at(args, 1).to_f64_vec();
            vec![backward_reference(&x, &dy)]
        }),
        tolerance: EXACT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_core::{compile, compile_to_ir, interp, Arch};

    fn run(case: &Case, args: Vec<ArgValue>) -> Vec<f64> {
        let src = case.source();
        let (func, _) = compile_to_ir(&src, &case.compile_options(Arch::Sm80))
            .unwrap_or_else(|d| panic!("{}", d.render(&src)));
        let mut args = args;
        interp::run(&func, case.grid, &mut args).expect("interpreter run");
        tensor_at(&args, case.outputs[0]).to_f64_vec()
    }

    /// NaN, infinities and signed zeros in every dtype, against the references, bit for
    /// bit on NaN-ness (a NaN where the reference has NaN, nowhere else).
    #[test]
    fn nan_inf_and_zero_follow_torch() {
        let x = [
            f64::NAN,
            -1.5,
            2.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.0,
            f64::NAN,
            -3.0,
        ];
        let dy = [0.5, f64::NAN, -2.0, 1.0, 4.0, 3.0, 7.0, f64::NAN, f64::NAN];
        let n = x.len();
        for dt in FLOATS {
            let mut c = forward_case(1, dt, n, 2048);
            c.args[0] = ArgValue::Tensor(HostTensor::from_f64(dt, &[n], &x));
            let got = run(&c, c.args.clone());
            let want = forward_reference(&x);
            assert!(want[0].is_nan() && want[1] == 0.0);
            for i in 0..n {
                assert!(
                    compare::within(got[i], want[i], EXACT),
                    "relu {dt} [{i}]: {} vs {}",
                    got[i],
                    want[i]
                );
            }

            let mut c = backward_case(1, dt, n, 2048);
            c.args[0] = ArgValue::Tensor(HostTensor::from_f64(dt, &[n], &x));
            c.args[1] = ArgValue::Tensor(HostTensor::from_f64(dt, &[n], &dy));
            let got = run(&c, c.args.clone());
            let want = backward_reference(&x, &dy);
            // NaN x passes dy; NaN dy where x <= 0 is zeroed; NaN dy where x > 0 stays.
            assert_eq!(want[0], 0.5);
            assert_eq!(want[1], 0.0);
            assert!(want[7].is_nan());
            assert_eq!(want[8], 0.0);
            for i in 0..n {
                assert!(
                    compare::within(got[i], want[i], EXACT),
                    "relu_bwd {dt} [{i}]: {} vs {}",
                    got[i],
                    want[i]
                );
            }
        }
    }

    /// The GPU code selects rather than takes a maximum: PTX `max.f32` returns the
    /// non-NaN operand and would map relu(NaN) to 0.
    #[test]
    fn relu_ptx_does_not_use_max() {
        for arch in Arch::ALL {
            for dt in FLOATS {
                let c = forward_case(1, dt, 4097, 1024);
                let k = compile(&c.source(), &c.compile_options(arch)).expect("compiles");
                assert!(
                    !k.ptx.contains("max.f") && !k.ptx.contains("max.bf"),
                    "{arch} {dt}"
                );
            }
        }
    }
}
