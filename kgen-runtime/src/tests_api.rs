//! Tests of the Device / Tensor / launch API on the interpreter backend (no GPU needed):
//! views, copies, launches against float64 references, every argument error, aliasing.

use crate::*;
use kgen_core::types::DType;
use kgen_core::{CompileOptions, SourceFile};

const AXPY: &str = "
kernel axpy<T: float = f32, B: int = 256>(
    a: f32, x: tensor<T, 1, contiguous>, y: tensor<T, 1, contiguous>, out: tensor<T, 1, contiguous>,
) {
    let i = bid(0);
    store(out, [i], (a * (load(x, [i], [B]) as f32) + (load(y, [i], [B]) as f32)) as T);
}
kernel scale2d<B: int = 64>(x: tensor<f32, 2>, y: tensor<f32, 2>) {
    let r = bid(0);
    store(y, [r, 0], load(x, [r, 0], [1, B]) * 2.0);
}
";

fn file() -> SourceFile {
    SourceFile::new("axpy.kg", AXPY)
}

fn vals(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let h = (i as u64 + 1).wrapping_mul(0x9E3779B97F4A7C15) ^ seed;
            ((h >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0 + 0.001
        })
        .collect()
}

fn axpy(d: &Device, t: DType) -> std::sync::Arc<Kernel> {
    d.kernel(
        &file(),
        &CompileOptions::new(d.arch()).kernel("axpy").define("T", t),
    )
    .unwrap()
}

fn axpy_for(d: &Device, t: DType, x: &Tensor, y: &Tensor, out: &Tensor) -> std::sync::Arc<Kernel> {
    let mut o = CompileOptions::new(d.arch()).kernel("axpy").define("T", t);
    o.tensor_align = alignments(&[("x", x), ("y", y), ("out", out)]);
    d.kernel(&file(), &o).unwrap()
}

/// `Device::from_f64` and 16-bit scalar arguments round once to nearest even (issue
/// 21: `half`'s `from_f64` gave 1.0 for both values); the kernel widens exactly to f32.
#[test]
fn from_f64_and_half_scalar_arguments_round_once() {
    let d = Device::interpreter();
    let p = |e: i32| 2f64.powi(e);
    let src = SourceFile::new(
        "widen.kg",
        "kernel widen<T: float = bf16>(a: T, x: tensor<T, 1, contiguous>, y: tensor<f32, 1, contiguous>) {\n\
         let v = load(x, [0], [4]) as f32;\n\
         store(y, [0], where(arange(0, 4) == 3, a as f32, v));\n}\n",
    );
    for (t, v, want) in [
        (DType::BF16, 1.0 + p(-8) + p(-40), 1.0 + p(-7)),
        (DType::F16, 1.0 + p(-11) + p(-30), 1.0 + p(-10)),
    ] {
        let x = d.from_f64(t, &[4], &[v, -v, 0.25, 0.0]).unwrap();
        assert_eq!(x.to_f64_vec().unwrap()[..2], [want, -want]);
        let y = d.from_f64(DType::F32, &[4], &[f64::NAN; 4]).unwrap();
        let mut o = CompileOptions::new(d.arch()).define("T", t);
        o.tensor_align = alignments(&[("x", &x), ("y", &y)]);
        let k = d.kernel(&src, &o).unwrap();
        let s = d.stream();
        let a = Arg::Scalar(kgen_core::types::Scalar::Float(v, t));
        d.launch(&s, &k, [1, 1, 1], &[a, Arg::from(&x), Arg::from(&y)])
            .unwrap();
        assert_eq!(
            y.to_f64_vec().unwrap(),
            vec![want, -want, 0.25, want],
            "{t}"
        );
    }
}

#[test]
fn launch_matches_f64_reference_on_awkward_sizes() {
    let d = Device::interpreter();
    for &t in &[DType::F32, DType::BF16, DType::F16] {
        for &n in &[0usize, 1, 7, 1000, 4097] {
            let xv = vals(n, 1);
            let yv = vals(n, 2);
            let x = d.from_f64(t, &[n], &xv).unwrap();
            let y = d.from_f64(t, &[n], &yv).unwrap();
            let out = d.from_f64(t, &[n], &vec![f64::NAN; n]).unwrap();
            let k = axpy_for(&d, t, &x, &y, &out);
            let s = d.stream();
            d.launch(
                &s,
                &k,
                grid_1d(n, 256).unwrap(),
                &[Arg::from(1.5f32), (&x).into(), (&y).into(), (&out).into()],
            )
            .unwrap();
            let got = out.to_f64_vec().unwrap();
            let xr = x.to_f64_vec().unwrap();
            let yr = y.to_f64_vec().unwrap();
            let tol = match t {
                DType::F32 => 1e-6,
                DType::F16 => 1e-3,
                _ => 8e-3,
            };
            for i in 0..n {
                let want = 1.5 * xr[i] + yr[i];
                assert!(
                    (got[i] - want).abs() <= tol * want.abs() + 1e-6,
                    "{t} n={n} i={i}: {} vs {want}",
                    got[i]
                );
            }
        }
    }
    let st = d.cache_stats();
    // One compile per (dtype, alignment class); repeated shapes hit memory.
    assert!(st.compiles <= 9, "{st:?}");
    assert!(st.memory_hits >= 6, "{st:?}");
    // Each specialization is listed once; the interpreter reports no registers.
    let loaded = d.loaded_kernels();
    assert_eq!(loaded.len() as u64, st.compiles, "{st:?}");
    let mut entries: Vec<&str> = loaded.iter().map(|k| k.entry()).collect();
    entries.sort();
    entries.dedup();
    assert_eq!(entries.len(), loaded.len());
    assert!(loaded.iter().all(|k| k.resources().is_none()));
}

#[test]
fn views_and_copies() {
    let d = Device::interpreter();
    let v: Vec<f32> = (0..24).map(|i| i as f32 + 0.5).collect();
    let t = d.from_slice(&[4, 6], &v).unwrap();
    assert!(t.is_contiguous());
    let tt = t.transpose(0, 1).unwrap();
    assert_eq!(tt.shape(), &[6, 4]);
    assert!(!tt.is_contiguous());
    let h = tt.to_vec::<f32>().unwrap();
    assert_eq!(h[1], 6.5); // tt[0, 1] = t[1, 0]
    let col = t.narrow(1, 2, 3).unwrap();
    assert_eq!(
        col.to_vec::<f32>().unwrap(),
        vec![2.5, 3.5, 4.5, 8.5, 9.5, 10.5, 14.5, 15.5, 16.5, 20.5, 21.5, 22.5]
    );
    let row = t.select(0, 3).unwrap();
    assert_eq!(row.to_vec::<f32>().unwrap(), v[18..24].to_vec());
    let p = t.reshape(&[2, 3, 4]).unwrap().permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[4, 2, 3]);
    assert_eq!(p.to_vec::<f32>().unwrap()[1], v[4]);
    // Errors, never panics.
    assert!(matches!(
        t.narrow(1, 5, 2),
        Err(RuntimeError::InvalidView(_))
    ));
    assert!(matches!(
        t.narrow(2, 0, 1),
        Err(RuntimeError::InvalidView(_))
    ));
    assert!(matches!(t.select(0, 4), Err(RuntimeError::InvalidView(_))));
    assert!(matches!(
        tt.reshape(&[24]),
        Err(RuntimeError::InvalidView(_))
    ));
    assert!(matches!(
        t.reshape(&[5, 5]),
        Err(RuntimeError::InvalidView(_))
    ));
    assert!(matches!(
        t.permute(&[0, 0]),
        Err(RuntimeError::InvalidView(_))
    ));
    assert!(matches!(t.to_vec::<i32>(), Err(RuntimeError::Transfer(_))));
    assert!(matches!(
        d.from_slice(&[5], &v),
        Err(RuntimeError::Transfer(_))
    ));
    // copy_from + fill_zero.
    let u = d.empty(DType::F32, &[4, 6]).unwrap();
    u.copy_from(&t).unwrap();
    assert_eq!(u.to_vec::<f32>().unwrap(), v);
    u.narrow(0, 1, 1).unwrap().fill_zero().unwrap();
    assert_eq!(u.to_vec::<f32>().unwrap()[6..12], [0.0; 6]);
    assert_eq!(u.to_vec::<f32>().unwrap()[12], 12.5);
    // upload_async on the interpreter is a plain copy.
    let s = d.stream();
    s.upload_f32_async(&u.select(0, 0).unwrap(), &[9.0; 6])
        .unwrap();
    assert_eq!(u.to_vec::<f32>().unwrap()[..6], [9.0; 6]);
    assert!(matches!(
        s.upload_f32_async(&u, &[1.0]),
        Err(RuntimeError::Transfer(_))
    ));
}

/// `view` merges and splits dimensions without a copy where the strides allow it (the
/// same elements as `reshape` of a contiguous copy), and refuses the others with a typed
/// error.
#[test]
fn views_merge_and_split_dimensions_without_copies() {
    let d = Device::interpreter();
    let v: Vec<f32> = (0..120).map(|i| i as f32).collect();
    let t = d.from_slice(&[2, 3, 20], &v).unwrap();
    let elems = |x: &Tensor| x.to_vec::<f32>().unwrap();
    // Contiguous: any shape of the same count.
    for shape in [
        &[6usize, 20][..],
        &[120],
        &[2, 60],
        &[4, 5, 6],
        &[1, 6, 1, 20],
    ] {
        let w = t.view(shape).unwrap();
        assert_eq!(w.shape(), shape);
        assert_eq!(elems(&w), v, "{shape:?}");
    }
    // Columns 4..11 of every row: [B, S, K] with a row stride of 20 merges to
    // [B * S, K] (each row keeps its stride), but not to [B, S * K].
    let cols = t.narrow(2, 4, 7).unwrap();
    let rows = cols.view(&[6, 7]).unwrap();
    assert_eq!(rows.strides(), &[20, 1]);
    assert_eq!(elems(&rows), elems(&cols));
    assert!(matches!(
        cols.view(&[2, 21]),
        Err(RuntimeError::InvalidView(_))
    ));
    // A transpose does not merge; its own 2-D shape is fine.
    let tt = t.view(&[6, 20]).unwrap().transpose(0, 1).unwrap();
    assert!(matches!(tt.view(&[120]), Err(RuntimeError::InvalidView(_))));
    assert_eq!(tt.view(&[20, 6]).unwrap().strides(), &[1, 20]);
    assert_eq!(tt.view(&[20, 1, 6]).unwrap().shape(), &[20, 1, 6]);
    // Rows taken every other one: [3, 20] with row stride 40 splits its rows, not them
    // into the columns.
    let every_other = t.view(&[6, 20]).unwrap();
    let every_other = every_other
        .view(&[3, 40])
        .unwrap()
        .narrow(1, 0, 20)
        .unwrap();
    assert_eq!(every_other.view(&[3, 4, 5]).unwrap().strides(), &[40, 5, 1]);
    assert!(matches!(
        every_other.view(&[60]),
        Err(RuntimeError::InvalidView(_))
    ));
    // Wrong counts are errors; empty tensors view as anything of zero elements.
    assert!(matches!(t.view(&[7, 7]), Err(RuntimeError::InvalidView(_))));
    let empty = t.narrow(0, 0, 0).unwrap();
    assert_eq!(empty.view(&[0, 60]).unwrap().shape(), &[0, 60]);
}

#[test]
fn overlap_is_exact_for_column_halves() {
    let d = Device::interpreter();
    let buf = d.zeros(DType::F32, &[5, 8]).unwrap();
    let gate = buf.narrow(1, 0, 4).unwrap();
    let up = buf.narrow(1, 4, 4).unwrap();
    assert!(!gate.overlaps(&up));
    assert!(gate.overlaps(&buf.narrow(1, 3, 2).unwrap()));
    assert!(gate.overlaps(&gate));
    let other = d.zeros(DType::F32, &[5, 8]).unwrap();
    assert!(!gate.overlaps(&other));
    // Rows 0-1 vs rows 2-4.
    assert!(!buf
        .narrow(0, 0, 2)
        .unwrap()
        .overlaps(&buf.narrow(0, 2, 3).unwrap()));
}

#[test]
fn every_argument_error_is_typed() {
    let d = Device::interpreter();
    let k = axpy(&d, DType::F32);
    let s = d.stream();
    let x = d.from_f64(DType::F32, &[100], &vals(100, 3)).unwrap();
    let y = d.from_f64(DType::F32, &[100], &vals(100, 4)).unwrap();
    let out = d.zeros(DType::F32, &[100]).unwrap();
    let g = [1u32, 1, 1];
    let err = |args: &[Arg]| d.launch(&s, &k, g, args).unwrap_err();
    assert!(matches!(
        err(&[(&x).into()]),
        RuntimeError::Arg(ArgError::ArgCount { .. })
    ));
    assert!(matches!(
        err(&[(&x).into(), (&x).into(), (&y).into(), (&out).into()]),
        RuntimeError::Arg(ArgError::WrongKind { .. })
    ));
    assert!(matches!(
        err(&[1i32.into(), (&x).into(), (&y).into(), (&out).into()]),
        RuntimeError::Arg(ArgError::DtypeMismatch { .. })
    ));
    let xh = d.from_f64(DType::F16, &[100], &vals(100, 3)).unwrap();
    assert!(matches!(
        err(&[1f32.into(), (&xh).into(), (&y).into(), (&out).into()]),
        RuntimeError::Arg(ArgError::DtypeMismatch { .. })
    ));
    let x2 = d.zeros(DType::F32, &[10, 10]).unwrap();
    assert!(matches!(
        err(&[1f32.into(), (&x2).into(), (&y).into(), (&out).into()]),
        RuntimeError::Arg(ArgError::RankMismatch { .. })
    ));
    // A strided 1-D view is not `contiguous`.
    let strided = x2.narrow(1, 0, 1).unwrap().reshape(&[10]);
    assert!(strided.is_err());
    let col = x2.transpose(0, 1).unwrap().select(0, 0).unwrap();
    assert!(matches!(
        err(&[1f32.into(), (&col).into(), (&y).into(), (&out).into()]),
        RuntimeError::Arg(ArgError::NotContiguous { .. })
    ));
    // A view starting at an odd element is not 16-byte aligned.
    let off = x.narrow(0, 1, 50).unwrap();
    let y50 = y.narrow(0, 0, 50).unwrap();
    let o50 = out.narrow(0, 0, 52).unwrap().narrow(0, 0, 50).unwrap();
    assert!(matches!(
        err(&[1f32.into(), (&off).into(), (&y50).into(), (&o50).into()]),
        RuntimeError::Arg(ArgError::Misaligned { .. })
    ));
    // Output aliasing an input.
    assert!(matches!(
        err(&[1f32.into(), (&x).into(), (&y).into(), (&x).into()]),
        RuntimeError::Arg(ArgError::Aliasing { .. })
    ));
    // Another device's tensor / kernel / stream.
    let d2 = Device::interpreter();
    let x_other = d2.from_f64(DType::F32, &[100], &vals(100, 3)).unwrap();
    assert!(matches!(
        err(&[1f32.into(), (&x_other).into(), (&y).into(), (&out).into()]),
        RuntimeError::WrongDevice(_)
    ));
    let k2 = axpy(&d2, DType::F32);
    assert!(matches!(
        d.launch(
            &s,
            &k2,
            g,
            &[1f32.into(), (&x).into(), (&y).into(), (&out).into()]
        ),
        Err(RuntimeError::WrongDevice(_))
    ));
    assert!(matches!(
        d.launch(
            &d2.stream(),
            &k,
            g,
            &[1f32.into(), (&x).into(), (&y).into(), (&out).into()]
        ),
        Err(RuntimeError::WrongDevice(_))
    ));
    // Grid limits.
    assert!(matches!(
        d.launch(
            &s,
            &k,
            [1, 70000, 1],
            &[1f32.into(), (&x).into(), (&y).into(), (&out).into()]
        ),
        Err(RuntimeError::LaunchConfig(_))
    ));
    assert!(grid_2d(10, 1, 1 << 30, 1).is_err());
    assert!(grid_1d(10, 0).is_err());
    // A cluster kernel on a grid that is not a whole number of its clusters.
    let cl = SourceFile::new(
        "cluster.kg",
        "kernel k(x: tensor<f32, 1>, y: tensor<f32, 1>) {\n    let m = sum(load(x, [bid(0)], [64]), 0);\n    store(y, [bid(0)], full([1], sum(cluster_gather(m, 4), 0)));\n}\n",
    );
    let ck = d.kernel(&cl, &CompileOptions::new(d.arch())).unwrap();
    assert_eq!(ck.compiled().launch.cluster_size, 4);
    let cx = d.from_f64(DType::F32, &[6 * 64], &vals(6 * 64, 3)).unwrap();
    let cy = d.zeros(DType::F32, &[6]).unwrap();
    match d.launch(&s, &ck, [6, 1, 1], &[(&cx).into(), (&cy).into()]) {
        Err(RuntimeError::LaunchConfig(m)) => {
            assert!(m.contains("clusters of 4 blocks"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    d.launch(&s, &ck, [4, 1, 1], &[(&cx).into(), (&cy).into()])
        .unwrap();
    // A kernel that does not compile: rendered diagnostics.
    let bad = SourceFile::new(
        "bad.kg",
        "kernel k(x: tensor<f32, 1>) { store(x, [0], y); }",
    );
    match d.kernel(&bad, &CompileOptions::new(d.arch())) {
        Err(RuntimeError::Compile {
            diagnostics,
            rendered,
        }) => {
            assert!(rendered.contains("bad.kg:1:"), "{rendered}");
            // The diagnostics stay typed: the undefined name's code, labelled at `y`.
            let first = &diagnostics.0[0];
            assert_eq!(first.code, kgen_core::diag::ErrorCode::UndefinedName);
            let at = first
                .labels
                .iter()
                .find(|l| l.primary)
                .expect("a primary label");
            assert_eq!(
                &bad.text[at.span.start as usize..at.span.end as usize],
                "y",
                "{first:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn strided_written_views_write_back_only_their_elements() {
    let d = Device::interpreter();
    let k = d
        .kernel(&file(), &CompileOptions::new(d.arch()).kernel("scale2d"))
        .unwrap();
    let src: Vec<f32> = (0..5 * 8).map(|i| i as f32 + 1.0).collect();
    let x = d.from_slice(&[5, 8], &src).unwrap();
    let y = d.from_slice(&[5, 8], &[-7.0f32; 40]).unwrap();
    // Write the left half of y from the right half of x.
    let xl = x.narrow(1, 4, 4).unwrap();
    let yl = y.narrow(1, 0, 4).unwrap();
    let k2 = d
        .kernel(
            &file(),
            &CompileOptions::new(d.arch())
                .kernel("scale2d")
                .define("B", 4),
        )
        .unwrap();
    let _ = k;
    d.launch(&d.stream(), &k2, [5, 1, 1], &[(&xl).into(), (&yl).into()])
        .unwrap();
    let got = y.to_vec::<f32>().unwrap();
    for r in 0..5 {
        for c in 0..8 {
            let want = if c < 4 {
                2.0 * src[r * 8 + 4 + c]
            } else {
                -7.0
            };
            assert_eq!(got[r * 8 + c], want, "r={r} c={c}");
        }
    }
}

#[test]
fn zero_size_tensors_are_contiguous_and_round_trip() {
    let d = Device::interpreter();
    for shape in [&[0usize][..], &[4, 0], &[0, 7], &[3, 0, 5]] {
        let t = d.from_f64(DType::F32, shape, &[]).unwrap();
        assert_eq!(t.numel(), 0);
        assert!(t.is_contiguous(), "{shape:?}");
        t.fill_zero().unwrap();
        assert!(t.to_f64_vec().unwrap().is_empty());
        let z = d.zeros(DType::BF16, shape).unwrap();
        assert!(z.to_f64_vec().unwrap().is_empty());
    }
}

/// Graph capture on the interpreter is a typed error (it runs every launch when queued),
/// and nothing is left capturing.
#[test]
fn graph_capture_on_the_interpreter_is_a_typed_error() {
    let d = Device::interpreter();
    let s = d.new_stream().unwrap();
    let e = s.begin_capture().unwrap_err();
    assert!(matches!(e, RuntimeError::Graph(_)), "{e}");
    assert!(e.to_string().contains("need a GPU"), "{e}");
    assert!(!s.is_capturing());
    let e = s.end_capture().unwrap_err();
    assert!(e.to_string().contains("not capturing"), "{e}");
    // The stream still works.
    s.synchronize().unwrap();
}

/// A device compiling for another target than its own: kernels are built for it (the
/// specialization's arch), the description says so, and the plain handle is unchanged.
#[test]
fn a_device_can_compile_for_another_target() {
    use kgen_core::Arch;
    let plain = Device::interpreter();
    assert_eq!(plain.arch(), Arch::Sm90a);
    assert!(
        !plain.describe().contains("compiling for"),
        "{}",
        plain.describe()
    );
    let d = Device::interpreter_as(Arch::Sm80);
    assert_eq!(d.arch(), Arch::Sm80);
    assert!(
        d.describe().contains("compiling for sm_80"),
        "{}",
        d.describe()
    );
    let k = d
        .kernel(
            &file(),
            &CompileOptions::new(Arch::Sm90a)
                .kernel("axpy")
                .define("T", "f32"),
        )
        .unwrap();
    assert_eq!(
        k.compiled().arch,
        Arch::Sm80,
        "the device's target replaces the option's"
    );
    // Without a GPU, `cuda_as` is the same error as `cuda`.
    if Device::cuda(0).is_err() {
        assert!(Device::cuda_as(0, Arch::Sm80).is_err());
    }
}
