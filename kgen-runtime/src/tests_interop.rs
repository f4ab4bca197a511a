//! GPU tests of [`Device::tensor_from_cudarc`] (and the borrowed form over `CudaView`s):
//! a kernel reads and writes cudarc buffers in place on cudarc's own stream (results
//! read back through cudarc and through kgen, against float64), bf16 buffers and views
//! of them, and the typed errors (a shape larger than the buffer, the interpreter
//! device, two imports of one buffer aliased).
//! Skipped (and passing) without a CUDA driver or GPU.

use crate::*;
use half::bf16;
use kgen_core::types::DType;
use std::sync::Arc;

use crate::tests_gpu_api::{axpy_kernel as axpy, vals};

#[test]
fn gpu_kernels_run_in_place_on_cudarc_buffers() {
    let Ok(d) = Device::cuda(0) else {
        eprintln!("gpu_kernels_run_in_place_on_cudarc_buffers: skipped, no usable GPU");
        return;
    };
    let user = d.gpu().unwrap().context().new_stream().unwrap();
    let s = Stream::from_cudarc(&d, user.clone()).unwrap();
    // f32, an awkward length; `out` is 3 elements longer than the tensor over it and
    // poisoned, so a write past the view or a missing write shows.
    let n = 4097;
    let xs: Vec<f32> = vals(n, 1).iter().map(|&v| v as f32).collect();
    let ys: Vec<f32> = vals(n, 2).iter().map(|&v| v as f32).collect();
    let xb = user.clone_htod(&xs).unwrap();
    let yb = Arc::new(user.clone_htod(&ys).unwrap());
    let ob = Arc::new(user.clone_htod(&vec![f32::NAN; n + 3]).unwrap());
    let x = d.tensor_from_cudarc(xb, &[n]).unwrap();
    let y = d.tensor_from_cudarc(yb.clone(), &[n]).unwrap();
    let out = d.tensor_from_cudarc(ob.clone(), &[n]).unwrap();
    assert_eq!(out.dtype(), DType::F32);
    let k = axpy(&d, DType::F32, &[("x", &x), ("y", &y), ("out", &out)]);
    let args = [Arg::from(-1.5f32), (&x).into(), (&y).into(), (&out).into()];
    d.launch(&s, &k, grid_1d(n, 256).unwrap(), &args).unwrap();
    let through_cudarc = user.clone_dtoh(&*ob).unwrap();
    let through_kgen = out.to_f64_vec().unwrap();
    for i in 0..n {
        let want = -1.5 * xs[i] as f64 + ys[i] as f64;
        assert!(
            (through_cudarc[i] as f64 - want).abs() <= 1e-6 * want.abs() + 1e-6,
            "i={i}"
        );
        assert_eq!(through_kgen[i], through_cudarc[i] as f64, "i={i}");
    }
    assert!(
        through_cudarc[n..].iter().all(|v| v.is_nan()),
        "wrote past the view"
    );
    // The inputs are untouched and still cudarc's.
    assert_eq!(user.clone_dtoh(&*yb).unwrap(), ys);

    // bf16, through a view (elements 5 .. 5 + m of a longer buffer).
    let m = 1000;
    let hb: Vec<bf16> = vals(m + 13, 3).iter().map(|&v| bf16::from_f64(v)).collect();
    let buf = d
        .tensor_from_cudarc(user.clone_htod(&hb).unwrap(), &[m + 13])
        .unwrap();
    assert_eq!(buf.dtype(), DType::BF16);
    let xv = buf.narrow(0, 5, m).unwrap();
    let yv = d.from_f64(DType::BF16, &[m], &vals(m, 4)).unwrap();
    let ov = d
        .tensor_from_cudarc(user.clone_htod(&vec![bf16::NAN; m]).unwrap(), &[m])
        .unwrap();
    d.synchronize().unwrap(); // `yv` was filled on the device's stream
    let k = axpy(&d, DType::BF16, &[("x", &xv), ("y", &yv), ("out", &ov)]);
    let args = [Arg::from(2.0f32), (&xv).into(), (&yv).into(), (&ov).into()];
    d.launch(&s, &k, grid_1d(m, 256).unwrap(), &args).unwrap();
    let (got, yh) = (ov.to_f64_vec().unwrap(), yv.to_f64_vec().unwrap());
    for i in 0..m {
        let want = 2.0 * hb[5 + i].to_f64() + yh[i];
        assert!(
            (got[i] - want).abs() <= 8e-3 * want.abs() + 1e-2,
            "i={i}: {} vs {want}",
            got[i]
        );
    }
}

/// The borrowed import over `CudaView`s (a window into each buffer): the kernel writes
/// only its window of the output buffer.
#[test]
fn gpu_kernels_run_on_borrowed_cudarc_views() {
    let Ok(d) = Device::cuda(0) else {
        eprintln!("gpu_kernels_run_on_borrowed_cudarc_views: skipped, no usable GPU");
        return;
    };
    let user = d.gpu().unwrap().context().new_stream().unwrap();
    let s = Stream::from_cudarc(&d, user.clone()).unwrap();
    let n = 1000;
    let xs: Vec<f32> = vals(n + 16, 5).iter().map(|&v| v as f32).collect();
    let ys: Vec<f32> = vals(n, 6).iter().map(|&v| v as f32).collect();
    let (xb, yb) = (user.clone_htod(&xs).unwrap(), user.clone_htod(&ys).unwrap());
    let ob = user.clone_htod(&vec![f32::NAN; n + 8]).unwrap();
    {
        // Element offsets 4 and 8: 16- and 32-byte aligned windows.
        let (xv, ov) = (xb.slice(4..4 + n), ob.slice(8..8 + n));
        // SAFETY: the buffers outlive the tensors and the synchronize below.
        let (x, y, out) = unsafe {
            (
                d.tensor_from_cudarc_borrowed(&xv, &[n]).unwrap(),
                d.tensor_from_cudarc_borrowed(&yb, &[n]).unwrap(),
                d.tensor_from_cudarc_borrowed(&ov, &[n]).unwrap(),
            )
        };
        let k = axpy(&d, DType::F32, &[("x", &x), ("y", &y), ("out", &out)]);
        let args = [Arg::from(0.5f32), (&x).into(), (&y).into(), (&out).into()];
        d.launch(&s, &k, grid_1d(n, 256).unwrap(), &args).unwrap();
        s.synchronize().unwrap();
    }
    let got = user.clone_dtoh(&ob).unwrap();
    assert!(
        got[..8].iter().all(|v| v.is_nan()),
        "wrote before the window"
    );
    for i in 0..n {
        let want = 0.5 * xs[4 + i] as f64 + ys[i] as f64;
        assert!(
            (got[8 + i] as f64 - want).abs() <= 1e-6 * want.abs() + 1e-6,
            "i={i}"
        );
    }
    // The buffers are still cudarc's and intact after the tensors are gone.
    assert_eq!(user.clone_dtoh(&xb).unwrap(), xs);
}

#[test]
fn gpu_cudarc_imports_refuse_bad_shapes_devices_and_aliasing() {
    let Ok(d) = Device::cuda(0) else {
        eprintln!(
            "gpu_cudarc_imports_refuse_bad_shapes_devices_and_aliasing: skipped, no usable GPU"
        );
        return;
    };
    let user = d.gpu().unwrap().context().new_stream().unwrap();
    let buf = Arc::new(user.clone_htod(&vec![1.0f32; 100]).unwrap());
    let e = d.tensor_from_cudarc(buf.clone(), &[101]).unwrap_err();
    assert!(matches!(e, RuntimeError::InvalidView(_)), "{e}");
    assert!(e.to_string().contains("holds 100"), "{e}");
    let e = d
        .tensor_from_cudarc(buf.clone(), &[usize::MAX, 3])
        .unwrap_err();
    assert!(matches!(e, RuntimeError::InvalidView(_)), "{e}");
    let e = Device::interpreter()
        .tensor_from_cudarc(buf.clone(), &[100])
        .unwrap_err();
    assert!(matches!(e, RuntimeError::WrongDevice(_)), "{e}");
    // Two imports of one buffer are two storages over the same bytes: an output over
    // one and an input over the other alias.
    let a = d.tensor_from_cudarc(buf.clone(), &[100]).unwrap();
    let b = d.tensor_from_cudarc(buf.clone(), &[100]).unwrap();
    let c = d.from_f64(DType::F32, &[100], &vals(100, 9)).unwrap();
    assert!(a.overlaps(&b) && !a.shares_storage(&b));
    assert!(!a
        .narrow(0, 0, 50)
        .unwrap()
        .overlaps(&b.narrow(0, 50, 50).unwrap()));
    assert!(!a.overlaps(&c));
    let k = axpy(&d, DType::F32, &[("x", &a), ("y", &c), ("out", &b)]);
    let e = d
        .launch(
            &d.stream(),
            &k,
            grid_1d(100, 256).unwrap(),
            &[Arg::from(1.0f32), (&a).into(), (&c).into(), (&b).into()],
        )
        .unwrap_err();
    assert!(
        matches!(e, RuntimeError::Arg(ArgError::Aliasing { .. })),
        "{e}"
    );
    // Dropping every view leaves the buffer to cudarc, intact.
    drop((a, b));
    assert_eq!(user.clone_dtoh(&*buf).unwrap(), vec![1.0f32; 100]);
}
