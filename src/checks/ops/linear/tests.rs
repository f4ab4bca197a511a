//! Unit tests of `linear`, `linear_backward` and `matmul` on the interpreter: the
//! awkward shapes against f64, f32 and rank-1 layers, transposed outputs, and the typed
//! errors.

use super::*;
use crate::ops::OpError;

/// Every awkward case (each of 1, 7, 127, 1000, 4097 in M, N and K; every activation
/// with and without a bias in f16 and bf16; every layout) against f64.
#[test]
fn linear_forward_and_backward_match_f64_on_awkward_shapes() {
    let cases = awkward_cases();
    for dim in 0..3 {
        for e in [1usize, 7, 127, 1000, 4097] {
            assert!(
                cases.iter().any(|c| [c.m, c.n, c.k][dim] == e),
                "{e} in dimension {dim}"
            );
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .min(4)
        {
            s.spawn(|| {
                let ops = Ops::new(&Device::interpreter());
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(c) = cases.get(i) else { break };
                    if let Err(e) = check(&ops, c, false) {
                        failures.lock().unwrap().push(format!("{}: {e}", c.label()));
                    }
                }
            });
        }
    });
    let f = failures.into_inner().unwrap();
    assert!(f.is_empty(), "{}", f.join("\n"));
}

fn tensor(d: &Device, t: DType, shape: &[usize], seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.normalish() * 0.5 + 0.01).collect();
    d.from_f64(t, shape, &v).unwrap()
}

/// f32 takes the plain layer (matmul.kg) and the backward with any activation; a rank-1
/// x is one row, its y and dx rank 1 too.
#[test]
fn f32_and_rank_one_layers() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let (n, k) = (5, 9);
    let x = tensor(&d, DType::F32, &[k], 1);
    let w = tensor(&d, DType::F32, &[n, k], 2);
    let y = ops.linear(&x, &w, None, Activation::None).unwrap();
    assert_eq!(y.shape(), &[n]);
    let (xv, wv, yv) = (
        x.to_f64_vec().unwrap(),
        w.to_f64_vec().unwrap(),
        y.to_f64_vec().unwrap(),
    );
    for j in 0..n {
        let want: f64 = (0..k).map(|p| xv[p] * wv[j * k + p]).sum();
        assert!((yv[j] - want).abs() < 1e-5, "y[{j}] {} vs {want}", yv[j]);
    }
    // The f32 backward through SiLU, from a given pre-activation.
    let z = tensor(&d, DType::F32, &[n], 3);
    let dy = tensor(&d, DType::F32, &[n], 4);
    let (dx, dw, db) = ops
        .linear_backward(&dy, &x, &w, Some(&z), Activation::Silu, true)
        .unwrap();
    assert_eq!((dx.shape(), dw.shape()), (&[k][..], &[n, k][..]));
    let (zv, dyv) = (z.to_f64_vec().unwrap(), dy.to_f64_vec().unwrap());
    let dz: Vec<f64> = (0..n)
        .map(|j| dyv[j] * Act::Silu.derivative(zv[j]))
        .collect();
    let (dxv, dwv, dbv) = (
        dx.to_f64_vec().unwrap(),
        dw.to_f64_vec().unwrap(),
        db.unwrap().to_f64_vec().unwrap(),
    );
    for p in 0..k {
        let want: f64 = (0..n).map(|j| dz[j] * wv[j * k + p]).sum();
        assert!((dxv[p] - want).abs() < 1e-5, "dx[{p}]");
        for j in 0..n {
            assert!(
                (dwv[j * k + p] - dz[j] * xv[p]).abs() < 1e-5,
                "dw[{j}, {p}]"
            );
        }
    }
    for j in 0..n {
        assert!((dbv[j] - dz[j]).abs() < 1e-5, "db[{j}]");
    }
    // f32 with a bias or an activation in the forward: a typed error.
    let b = tensor(&d, DType::F32, &[n], 5);
    assert!(matches!(
        ops.linear(&x, &w, Some(&b), Activation::None),
        Err(OpError::Dtype { .. })
    ));
    assert!(matches!(
        ops.linear(&x, &w, None, Activation::Relu),
        Err(OpError::Dtype { .. })
    ));
}

/// A GEMM into a transposed output (no bias): written through `c.T = b.T @ a.T`.
#[test]
fn gemm_writes_a_transposed_output_through_its_transpose() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let (m, k, n) = (37, 20, 45);
    let a = tensor(&d, DType::BF16, &[m, k], 6);
    let b = tensor(&d, DType::BF16, &[k, n], 7);
    let c_store = d
        .from_f64(DType::BF16, &[n, m], &vec![f64::NAN; m * n])
        .unwrap();
    let c = c_store.transpose(0, 1).unwrap();
    ops.gemm_into(&a, &b, None, Activation::Relu, &c).unwrap();
    let want = ops.gemm(&a, &b, None, Activation::Relu).unwrap();
    assert_eq!(c.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    // With a bias it would run along c.T's rows: refused with a typed error.
    let bias = tensor(&d, DType::BF16, &[n], 8);
    assert!(matches!(
        ops.gemm_into(&a, &b, Some(&bias), Activation::None, &c),
        Err(OpError::Shape { .. })
    ));
}

#[test]
fn typed_errors_before_any_launch() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let t = DType::BF16;
    let (m, n, k) = (6, 5, 4);
    let x = tensor(&d, t, &[m, k], 1);
    let w = tensor(&d, t, &[n, k], 2);
    let b = tensor(&d, t, &[n], 3);
    let dy = tensor(&d, t, &[m, n], 4);
    let shape = |r: Result<Tensor, OpError>| matches!(r, Err(OpError::Shape { .. }));
    let dtype = |r: Result<Tensor, OpError>| matches!(r, Err(OpError::Dtype { .. }));
    // Shapes: K mismatch, a 1-D weight, a bias of the wrong length, a scalar x.
    assert!(shape(ops.linear(
        &x,
        &tensor(&d, t, &[n, k + 1], 5),
        None,
        Activation::None
    )));
    assert!(shape(ops.linear(
        &x,
        &tensor(&d, t, &[k], 5),
        None,
        Activation::None
    )));
    assert!(shape(ops.linear(
        &x,
        &w,
        Some(&tensor(&d, t, &[n + 1], 6)),
        Activation::None
    )));
    let y_bad = tensor(&d, t, &[m, n + 1], 7);
    assert!(matches!(
        ops.linear_into(&x, &w, None, Activation::None, &y_bad),
        Err(OpError::Shape { .. })
    ));
    // Dtypes: mixed, integer, f16 bias with bf16 operands.
    assert!(dtype(ops.linear(
        &x,
        &tensor(&d, DType::F16, &[n, k], 8),
        None,
        Activation::None
    )));
    assert!(dtype(ops.linear(
        &x,
        &w,
        Some(&tensor(&d, DType::F16, &[n], 9)),
        Activation::None
    )));
    let xi = d.zeros(DType::I32, &[m, k]).unwrap();
    assert!(dtype(ops.linear(&xi, &w, None, Activation::None)));
    // Leading dimensions that do not flatten without a copy: [2, 3, K] permuted.
    let x3 = tensor(&d, t, &[3, 2, k], 10).permute(&[1, 0, 2]).unwrap();
    assert!(shape(ops.linear(&x3, &w, Some(&b), Activation::Relu)));
    // The backward: a missing pre-activation, wrong gradient shapes, aliasing, devices.
    let grads = |r: Result<(Tensor, Tensor, Option<Tensor>), OpError>| r.err();
    assert!(matches!(
        grads(ops.linear_backward(&dy, &x, &w, None, Activation::GeluTanh, true)),
        Some(OpError::Shape { .. })
    ));
    assert!(matches!(
        grads(ops.linear_backward(
            &tensor(&d, t, &[m, n + 1], 11),
            &x,
            &w,
            None,
            Activation::None,
            true
        )),
        Some(OpError::Shape { .. })
    ));
    let (dx, dw, db) = (
        tensor(&d, t, &[m, k], 12),
        tensor(&d, t, &[n, k], 13),
        tensor(&d, t, &[n], 14),
    );
    let backward_into = |dx: &Tensor, dw: &Tensor, db: Option<&Tensor>| {
        ops.linear_backward_into(&dy, &x, &w, None, Activation::None, dx, dw, db)
    };
    assert!(backward_into(&dx, &dw, Some(&db)).is_ok());
    // dx over x, dw over w, db inside dw: an output may alias nothing.
    assert!(matches!(
        backward_into(&x, &dw, None),
        Err(OpError::Shape { .. })
    ));
    assert!(matches!(
        backward_into(&dx, &w, None),
        Err(OpError::Shape { .. })
    ));
    let dw_flat = tensor(&d, t, &[n * k], 15);
    let (dw_view, db_view) = (
        dw_flat.reshape(&[n, k]).unwrap(),
        dw_flat.narrow(0, 0, n).unwrap(),
    );
    assert!(matches!(
        backward_into(&dx, &dw_view, Some(&db_view)),
        Err(OpError::Shape { .. })
    ));
    assert!(matches!(
        backward_into(&dx, &dw, Some(&tensor(&d, DType::F16, &[n], 16))),
        Err(OpError::Dtype { .. })
    ));
    // A tensor of another device.
    let other = Device::interpreter();
    let w_other = tensor(&other, t, &[n, k], 17);
    assert!(matches!(
        ops.linear(&x, &w_other, None, Activation::None),
        Err(OpError::Runtime(kgen_runtime::RuntimeError::WrongDevice(_)))
    ));
}

/// The pre-activation is what the backward needs: y = act(z) element by element, and
/// the forward without an activation saves none.
#[test]
fn the_saved_pre_activation_is_the_activation_input() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let t = DType::F16;
    let x = tensor(&d, t, &[2, 9, 24], 1);
    let w = tensor(&d, t, &[40, 24], 2);
    let b = tensor(&d, t, &[40], 3);
    let out = ops
        .linear_with_preact(&x, &w, Some(&b), Activation::Silu)
        .unwrap();
    assert_eq!(out.y.shape(), &[2, 9, 40]);
    let z = out.preact.expect("an activation saves its input");
    let (yv, zv) = (out.y.to_f64_vec().unwrap(), z.to_f64_vec().unwrap());
    for (y, z) in yv.iter().zip(&zv) {
        // y comes from the f32 z, z is rounded: within f16 rounding of silu(z).
        assert!(
            (y - Act::Silu.apply(*z)).abs() <= 2e-3 * (1.0 + y.abs()),
            "{y} {z}"
        );
    }
    let plain = ops
        .linear_with_preact(&x, &w, Some(&b), Activation::None)
        .unwrap();
    assert!(plain.preact.is_none());
}

#[test]
fn matmul_with_transposed_views_matches_f64() {
    let d = Device::interpreter();
    let ops = Ops::new(&d);
    let mut rng = Rng::new(7);
    for &(m, k, n) in &[(1usize, 1usize, 1usize), (7, 13, 5), (40, 33, 70)] {
        let av: Vec<f64> = (0..m * k).map(|_| rng.normalish()).collect();
        let bv: Vec<f64> = (0..k * n).map(|_| rng.normalish()).collect();
        let a = d.from_f64(DType::F32, &[m, k], &av).unwrap();
        // b stored transposed: [n, k], viewed as [k, n].
        let mut bt = vec![0.0; k * n];
        for i in 0..k {
            for j in 0..n {
                bt[j * k + i] = bv[i * n + j];
            }
        }
        let b = d
            .from_f64(DType::F32, &[n, k], &bt)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        let c = d
            .from_f64(DType::F32, &[m, n], &vec![f64::NAN; m * n])
            .unwrap();
        ops.matmul_into(&a, &b, &c).unwrap();
        let got = c.to_f64_vec().unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|p| av[i * k + p] * bv[p * n + j]).sum();
                assert!(
                    (got[i * n + j] - want).abs() < 1e-5 * (k as f64),
                    "{m}x{k}x{n} [{i},{j}]"
                );
            }
        }
    }
    let a = d.zeros(DType::F32, &[3, 4]).unwrap();
    let b = d.zeros(DType::F32, &[5, 2]).unwrap();
    assert!(matches!(ops.matmul(&a, &b), Err(OpError::Shape { .. })));
    let bh = d.zeros(DType::F16, &[4, 2]).unwrap();
    assert!(matches!(ops.matmul(&a, &bh), Err(OpError::Dtype { .. })));
}
