//! Tests that need no GPU: argument validation and parameter packing against a
//! hand-written ABI, and `Gpu::new` failing cleanly without a driver.

use crate::*;
use kgen_core::abi::{AbiParam, AbiSlot, KernelAbi, SourceParam};
use kgen_core::host::{ArgValue, HostTensor};
use kgen_core::types::{DType, Scalar};

/// `k(x: tensor<f32, [_, 64], contiguous>, y: tensor<f16, 2>, out: tensor<f32, 1, contiguous>,
///    eps: f32, n: i32, flag: bool, h: bf16)`, every tensor 16-byte aligned.
fn abi() -> KernelAbi {
    let t = |name: &str, dtype, dims: Vec<Option<u32>>, contiguous, written| SourceParam::Tensor {
        name: name.into(),
        dtype,
        dims,
        contiguous,
        align_bytes: 16,
        written,
        read: !written,
    };
    let p = |name: &str, ty: &'static str, size, slot| AbiParam {
        ptx_name: name.into(),
        ptx_type: ty,
        size,
        slot,
    };
    KernelAbi {
        source_params: vec![
            t("x", DType::F32, vec![None, Some(64)], true, false),
            t("y", DType::F16, vec![None, None], false, false),
            t("out", DType::F32, vec![None], true, true),
            SourceParam::Scalar {
                name: "eps".into(),
                dtype: DType::F32,
            },
            SourceParam::Scalar {
                name: "n".into(),
                dtype: DType::I32,
            },
            SourceParam::Scalar {
                name: "flag".into(),
                dtype: DType::Bool,
            },
            SourceParam::Scalar {
                name: "h".into(),
                dtype: DType::BF16,
            },
        ],
        params: vec![
            p("x_ptr", "u64", 8, AbiSlot::TensorPtr { param: 0 }),
            p("x_d0", "s32", 4, AbiSlot::TensorDim { param: 0, dim: 0 }),
            p("x_s0", "s32", 4, AbiSlot::TensorStride { param: 0, dim: 0 }),
            p("y_ptr", "u64", 8, AbiSlot::TensorPtr { param: 1 }),
            p("y_d0", "s32", 4, AbiSlot::TensorDim { param: 1, dim: 0 }),
            p("y_d1", "s32", 4, AbiSlot::TensorDim { param: 1, dim: 1 }),
            p("y_s0", "s32", 4, AbiSlot::TensorStride { param: 1, dim: 0 }),
            p("y_s1", "s32", 4, AbiSlot::TensorStride { param: 1, dim: 1 }),
            p("out_ptr", "u64", 8, AbiSlot::TensorPtr { param: 2 }),
            p("out_d0", "s32", 4, AbiSlot::TensorDim { param: 2, dim: 0 }),
            p(
                "eps",
                "f32",
                4,
                AbiSlot::Scalar {
                    param: 3,
                    dtype: DType::F32,
                },
            ),
            p(
                "n",
                "s32",
                4,
                AbiSlot::Scalar {
                    param: 4,
                    dtype: DType::I32,
                },
            ),
            p(
                "flag",
                "u32",
                4,
                AbiSlot::Scalar {
                    param: 5,
                    dtype: DType::Bool,
                },
            ),
            p(
                "h",
                "b16",
                2,
                AbiSlot::Scalar {
                    param: 6,
                    dtype: DType::BF16,
                },
            ),
        ],
    }
}

fn good_args() -> Vec<ArgValue> {
    vec![
        ArgValue::Tensor(HostTensor::zeros(DType::F32, &[10, 64])),
        ArgValue::Tensor(HostTensor::zeros(DType::F16, &[3, 24])),
        ArgValue::Tensor(HostTensor::zeros(DType::F32, &[1000])),
        ArgValue::Scalar(Scalar::Float(1e-6, DType::F32)),
        ArgValue::Scalar(Scalar::Int(-7, DType::I32)),
        ArgValue::Scalar(Scalar::Bool(true)),
        ArgValue::Scalar(Scalar::Float(1.5, DType::BF16)),
    ]
}

fn check(args: &[ArgValue]) -> Result<(), ArgError> {
    validate_args("k", &abi(), args)
}

fn tensor_mut(args: &mut [ArgValue], i: usize) -> &mut HostTensor {
    match &mut args[i] {
        ArgValue::Tensor(t) => t,
        _ => unreachable!(),
    }
}

#[test]
fn accepts_good_args() {
    assert_eq!(check(&good_args()), Ok(()));
}

#[test]
fn arg_count() {
    let mut a = good_args();
    a.pop();
    assert!(matches!(
        check(&a),
        Err(ArgError::ArgCount {
            expected: 7,
            got: 6,
            ..
        })
    ));
}

#[test]
fn wrong_kind() {
    let mut a = good_args();
    a[3] = ArgValue::Tensor(HostTensor::zeros(DType::F32, &[1]));
    let e = check(&a).unwrap_err();
    assert!(
        matches!(&e, ArgError::WrongKind { param, expected: "scalar", got: "tensor" } if param == "eps"),
        "{e}"
    );
    let mut a = good_args();
    a[0] = ArgValue::Scalar(Scalar::Float(1.0, DType::F32));
    assert!(matches!(
        check(&a),
        Err(ArgError::WrongKind {
            expected: "tensor",
            ..
        })
    ));
}

#[test]
fn dtype_mismatch() {
    let mut a = good_args();
    a[1] = ArgValue::Tensor(HostTensor::zeros(DType::BF16, &[3, 24]));
    assert_eq!(
        check(&a),
        Err(ArgError::DtypeMismatch {
            param: "y".into(),
            expected: DType::F16,
            got: DType::BF16
        })
    );
    let mut a = good_args();
    a[4] = ArgValue::Scalar(Scalar::Int(3, DType::U32));
    assert_eq!(
        check(&a),
        Err(ArgError::DtypeMismatch {
            param: "n".into(),
            expected: DType::I32,
            got: DType::U32
        })
    );
}

#[test]
fn rank_and_const_dims() {
    let mut a = good_args();
    a[0] = ArgValue::Tensor(HostTensor::zeros(DType::F32, &[640]));
    assert_eq!(
        check(&a),
        Err(ArgError::RankMismatch {
            param: "x".into(),
            expected: 2,
            got: 1
        })
    );
    let mut a = good_args();
    a[0] = ArgValue::Tensor(HostTensor::zeros(DType::F32, &[10, 65]));
    assert_eq!(
        check(&a),
        Err(ArgError::ConstDimMismatch {
            param: "x".into(),
            dim: 1,
            expected: 64,
            got: 65
        })
    );
}

#[test]
fn not_contiguous() {
    let mut a = good_args();
    // A transposed view of a 64x10 buffer: strides [1, 10].
    let t = tensor_mut(&mut a, 0);
    t.strides = vec![1, 10];
    assert_eq!(
        check(&a),
        Err(ArgError::NotContiguous {
            param: "x".into(),
            stride: 10
        })
    );
    // A strided last dimension of extent 1 is never stepped: accepted.
    assert_eq!(
        check_tensor_view("x", &[None], true, 4, DType::F32, &[1], &[5], 1, 0),
        Ok(())
    );
}

#[test]
fn misaligned() {
    // out: 1001 f32 elements = 4004 bytes: the contiguous extent is 4-byte aligned only.
    let mut a = good_args();
    a[2] = ArgValue::Tensor(HostTensor::zeros(DType::F32, &[1001]));
    let e = check(&a).unwrap_err();
    assert!(
        matches!(&e, ArgError::Misaligned { param, required: 16, actual: 4, .. } if param == "out"),
        "{e}"
    );
    // y: f16 [3, 23] row-major: row stride 46 bytes, 2-byte aligned.
    let mut a = good_args();
    a[1] = ArgValue::Tensor(HostTensor::zeros(DType::F16, &[3, 23]));
    let e = check(&a).unwrap_err();
    assert!(
        matches!(&e, ArgError::Misaligned { param, required: 16, actual: 2, .. } if param == "y"),
        "{e}"
    );
    // A single row never uses its stride.
    let mut a = good_args();
    a[1] = ArgValue::Tensor(HostTensor::zeros(DType::F16, &[1, 24]));
    let t = tensor_mut(&mut a, 1);
    t.strides = vec![23, 1];
    assert_eq!(check(&a), Ok(()));
    // With 4-byte alignment assumed the 1001-element output is fine.
    let mut abi = abi();
    if let SourceParam::Tensor { align_bytes, .. } = &mut abi.source_params[2] {
        *align_bytes = 4;
    }
    let mut a = good_args();
    a[2] = ArgValue::Tensor(HostTensor::zeros(DType::F32, &[1001]));
    assert_eq!(validate_args("k", &abi, &a), Ok(()));
}

#[test]
fn base_address_alignment() {
    let e =
        check_tensor_view("x", &[None], true, 16, DType::F32, &[8], &[1], 8, 0x1004).unwrap_err();
    assert!(
        matches!(
            e,
            ArgError::Misaligned {
                required: 16,
                actual: 4,
                ..
            }
        ),
        "{e}"
    );
    assert!(check_tensor_view("x", &[None], true, 16, DType::F32, &[8], &[1], 8, 0x1000).is_ok());
}

#[test]
fn size_out_of_range() {
    // The view reaches beyond the storage.
    let mut a = good_args();
    let t = tensor_mut(&mut a, 0);
    t.data.truncate(4 * 64 * 9);
    let e = check(&a).unwrap_err();
    assert!(
        matches!(&e, ArgError::SizeOutOfRange { param, .. } if param == "x"),
        "{e}"
    );
    // An extent of 2^31 does not fit the .s32 the kernel receives.
    let mut a = good_args();
    let t = tensor_mut(&mut a, 2);
    t.shape = vec![1usize << 31];
    t.strides = vec![1];
    let e = check(&a).unwrap_err();
    assert!(
        matches!(&e, ArgError::SizeOutOfRange { what, .. } if what.contains("32 bits")),
        "{e}"
    );
    // A stride of 2^31.
    let mut a = good_args();
    let t = tensor_mut(&mut a, 1);
    t.strides = vec![1usize << 31, 1];
    assert!(matches!(check(&a), Err(ArgError::SizeOutOfRange { .. })));
    // Storage that is not a whole number of elements.
    let mut a = good_args();
    tensor_mut(&mut a, 2).data.push(0);
    assert!(matches!(check(&a), Err(ArgError::SizeOutOfRange { .. })));
}

#[test]
fn empty_tensors_are_fine() {
    let mut a = good_args();
    a[0] = ArgValue::Tensor(HostTensor::zeros(DType::F32, &[0, 64]));
    a[2] = ArgValue::Tensor(HostTensor::zeros(DType::F32, &[0]));
    assert_eq!(check(&a), Ok(()));
}

#[test]
fn packs_params_in_abi_order() {
    let a = good_args();
    let ptrs = [0x1000, 0x2000, 0x3000, 0, 0, 0, 0];
    let v = pack_params(&abi(), &a, &ptrs).unwrap();
    let f32bits = (1e-6f32).to_bits() as u64;
    let bf = half::bf16::from_f64(1.5).to_bits() as u64;
    assert_eq!(
        v,
        vec![
            0x1000,
            10,
            64,
            0x2000,
            3,
            24,
            24,
            1,
            0x3000,
            1000,
            f32bits,
            (-7i32) as u32 as u64,
            1,
            bf
        ]
    );
}

#[test]
fn pack_rejects_size_mismatch() {
    let mut abi = abi();
    abi.params[13].size = 4;
    let e = pack_params(&abi, &good_args(), &[0; 7]).unwrap_err();
    assert!(e.contains("`h`"), "{e}");
}

#[test]
fn scalar_bits() {
    assert_eq!(
        scalar_param_bits(Scalar::Int(-1, DType::I64), DType::I64),
        (u64::MAX, 8)
    );
    assert_eq!(
        scalar_param_bits(Scalar::Int(i64::MAX, DType::I64), DType::I64),
        (i64::MAX as u64, 8)
    );
    assert_eq!(
        scalar_param_bits(Scalar::Int(u32::MAX as i64, DType::U32), DType::U32),
        (u32::MAX as u64, 4)
    );
    assert_eq!(scalar_param_bits(Scalar::Bool(false), DType::Bool), (0, 4));
    assert_eq!(
        scalar_param_bits(Scalar::Float(-2.0, DType::F16), DType::F16),
        (half::f16::from_f32(-2.0).to_bits() as u64, 2)
    );
    // 16-bit scalars round once from the value given (issue 21: `half`'s `from_f64`
    // gave 1.0 for both), whatever dtype the scalar was built with.
    let p = |e: i32| 2f64.powi(e);
    for (d, v, want) in [
        (DType::BF16, 1.0 + p(-8) + p(-40), 1.0 + p(-7)),
        (DType::F16, 1.0 + p(-11) + p(-30), 1.0 + p(-10)),
    ] {
        let bits = |x: f64| kgen_core::round::f64_to_bf16(x).to_bits() as u64;
        let want_bits = match d {
            DType::BF16 => bits(want),
            _ => kgen_core::round::f64_to_f16(want).to_bits() as u64,
        };
        assert_eq!(want_bits, {
            let w = if d == DType::BF16 {
                half::bf16::from_f64(want).to_bits()
            } else {
                half::f16::from_f64(want).to_bits()
            };
            w as u64
        });
        assert_eq!(scalar_param_bits(Scalar::Float(v, d), d), (want_bits, 2));
        assert_eq!(
            scalar_param_bits(Scalar::Float(-v, DType::F32), d),
            (want_bits | 0x8000, 2)
        );
    }
}

#[test]
fn natural_alignment_of_views() {
    assert_eq!(
        natural_alignment(&HostTensor::zeros(DType::F32, &[1000, 4096]), true),
        16
    );
    assert_eq!(
        natural_alignment(&HostTensor::zeros(DType::F32, &[1000, 4097]), true),
        4
    );
    assert_eq!(
        natural_alignment(&HostTensor::zeros(DType::BF16, &[7]), true),
        2
    );
    assert_eq!(
        natural_alignment(&HostTensor::zeros(DType::BF16, &[8]), true),
        16
    );
    assert_eq!(
        natural_alignment(&HostTensor::zeros(DType::F32, &[1, 7]), false),
        16
    );
    assert_eq!(pow2_align(0), 16);
    assert_eq!(pow2_align(24), 8);
}

#[test]
fn grid_limits() {
    assert!(check_grid([1 << 20, 65535, 1]).is_ok());
    assert!(check_grid([1, 65536, 1]).is_err());
}

#[test]
fn gpu_new_without_driver_is_an_error_not_a_panic() {
    let r = std::panic::catch_unwind(|| Gpu::new(0).map(|_| ()));
    let r = r.expect("Gpu::new panicked");
    if !driver_present() {
        match r {
            Err(RuntimeError::NoDriver(msg)) => assert!(msg.contains("libcuda")),
            other => panic!("expected NoDriver, got {other:?}"),
        }
    }
}

// ---- On a GPU: hand-written PTX through the whole launcher. Skipped without a driver. ----

const AXPY_PTX: &str = r#"
.version 8.0
.target TARGET
.address_size 64

.visible .entry axpy_test(
    .param .u64 x_ptr,
    .param .u64 y_ptr,
    .param .u64 out_ptr,
    .param .s32 out_d0,
    .param .f32 alpha,
    .param .u32 flag,
    .param .b16 h
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    .reg .f32 %f<8>;
    .reg .b16 %h<2>;

    ld.param.u64 %rd1, [x_ptr];
    ld.param.u64 %rd2, [y_ptr];
    ld.param.u64 %rd3, [out_ptr];
    ld.param.s32 %r1, [out_d0];
    ld.param.f32 %f1, [alpha];
    ld.param.u32 %r2, [flag];
    ld.param.b16 %h1, [h];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r6, %r3, %r4, %r5;
    setp.ge.s32 %p1, %r6, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    mul.wide.s32 %rd4, %r6, 4;
    add.s64 %rd5, %rd1, %rd4;
    add.s64 %rd6, %rd2, %rd4;
    add.s64 %rd7, %rd3, %rd4;
    ld.global.f32 %f2, [%rd5];
    ld.global.f32 %f3, [%rd6];
    fma.rn.f32 %f4, %f2, %f1, %f3;
    cvt.f32.f16 %f5, %h1;
    setp.ne.u32 %p2, %r2, 0;
    selp.f32 %f6, %f5, 0f00000000, %p2;
    add.f32 %f7, %f4, %f6;
    st.global.f32 [%rd7], %f7;
DONE:
    ret;
}
"#;

fn axpy_kernel(arch: kgen_core::Arch) -> kgen_core::CompiledKernel {
    use kgen_core::abi::{LaunchHints, Specialization};
    let t = |name: &str, written| SourceParam::Tensor {
        name: name.into(),
        dtype: DType::F32,
        dims: vec![None],
        contiguous: true,
        align_bytes: 4,
        written,
        read: !written,
    };
    let p = |name: &str, ty: &'static str, size, slot| AbiParam {
        ptx_name: name.into(),
        ptx_type: ty,
        size,
        slot,
    };
    kgen_core::CompiledKernel {
        ptx: AXPY_PTX.replace("TARGET", arch.name()),
        entry: "axpy_test".into(),
        arch,
        abi: KernelAbi {
            source_params: vec![
                t("x", false),
                t("y", false),
                t("out", true),
                SourceParam::Scalar {
                    name: "alpha".into(),
                    dtype: DType::F32,
                },
                SourceParam::Scalar {
                    name: "flag".into(),
                    dtype: DType::Bool,
                },
                SourceParam::Scalar {
                    name: "h".into(),
                    dtype: DType::F16,
                },
            ],
            params: vec![
                p("x_ptr", "u64", 8, AbiSlot::TensorPtr { param: 0 }),
                p("y_ptr", "u64", 8, AbiSlot::TensorPtr { param: 1 }),
                p("out_ptr", "u64", 8, AbiSlot::TensorPtr { param: 2 }),
                p("out_d0", "s32", 4, AbiSlot::TensorDim { param: 2, dim: 0 }),
                p(
                    "alpha",
                    "f32",
                    4,
                    AbiSlot::Scalar {
                        param: 3,
                        dtype: DType::F32,
                    },
                ),
                p(
                    "flag",
                    "u32",
                    4,
                    AbiSlot::Scalar {
                        param: 4,
                        dtype: DType::Bool,
                    },
                ),
                p(
                    "h",
                    "b16",
                    2,
                    AbiSlot::Scalar {
                        param: 5,
                        dtype: DType::F16,
                    },
                ),
            ],
        },
        launch: LaunchHints {
            threads_per_block: 128,
            static_shared_bytes: 0,
            dynamic_shared_bytes: 0,
            grid_rank: 1,
            cluster_size: 1,
            programmatic_dependency: false,
            cooperative: false,
        },
        spec: Specialization {
            kernel: "axpy_test".into(),
            consts: vec![],
            num_warps: 4,
            min_blocks_per_sm: None,
            num_stages: None,
            tensor_align: vec![],
            no_tma: false,
            ws: false,
            tma_store: false,
            multicast: false,
            pingpong: false,
        },
        notes: vec![],
    }
}

#[test]
fn gpu_launches_handwritten_ptx() {
    if !driver_present() {
        eprintln!("no CUDA driver: skipping the GPU launch test");
        return;
    }
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => panic!("a driver is present but Gpu::new failed: {e}"),
    };
    eprintln!("{}", gpu.info());
    let mut archs = vec![kgen_core::Arch::Sm80];
    if gpu.info().compute_capability == (9, 0) {
        archs.push(kgen_core::Arch::Sm90a);
    }
    for arch in archs {
        let k = axpy_kernel(arch);
        let loaded = gpu.load(&k).unwrap_or_else(|e| panic!("{arch}: {e}"));
        // The module is cached: a second load does not JIT again and still works.
        let _again = gpu.load(&k).expect("second load");
        let n = 1001usize;
        let xs: Vec<f64> = (0..n).map(|i| i as f64 * 0.5).collect();
        let ys: Vec<f64> = (0..n).map(|i| 1.0 - i as f64).collect();
        let mut out = HostTensor::zeros(DType::F32, &[n]);
        out.poison(0xFF);
        let mut args = vec![
            ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[n], &xs)),
            ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[n], &ys)),
            ArgValue::Tensor(out),
            ArgValue::Scalar(Scalar::Float(2.0, DType::F32)),
            ArgValue::Scalar(Scalar::Bool(true)),
            ArgValue::Scalar(Scalar::Float(0.25, DType::F16)),
        ];
        let grid = [n.div_ceil(128) as u32, 1, 1];
        let stats = gpu
            .run(&loaded, grid, &mut args)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(stats.launched && stats.kernel_ms >= 0.0);
        eprintln!(
            "{arch}: {} regs, {:.4} ms",
            loaded.num_regs, stats.kernel_ms
        );
        let ArgValue::Tensor(out) = &args[2] else {
            unreachable!()
        };
        for i in 0..n {
            let want = xs[i] * 2.0 + ys[i] + 0.25;
            assert_eq!(out.get_linear(i), want, "{arch}: element {i}");
        }
        // flag = false drops h.
        args[4] = ArgValue::Scalar(Scalar::Bool(false));
        gpu.run(&loaded, grid, &mut args).unwrap();
        let ArgValue::Tensor(out) = &args[2] else {
            unreachable!()
        };
        assert_eq!(out.get_linear(7), xs[7] * 2.0 + ys[7]);
        // An empty grid launches nothing and leaves the output alone.
        let before = args[2].clone();
        let s = gpu.run(&loaded, [0, 1, 1], &mut args).unwrap();
        assert!(!s.launched);
        assert_eq!(args[2], before);
        // Bad arguments are refused before the launch.
        let mut bad = args.clone();
        bad[3] = ArgValue::Scalar(Scalar::Float(2.0, DType::F16));
        assert!(matches!(
            gpu.run(&loaded, grid, &mut bad),
            Err(RuntimeError::Arg(ArgError::DtypeMismatch { .. }))
        ));
    }
    // An ABI that does not match the PTX's parameter list is caught at load.
    let mut k = axpy_kernel(kgen_core::Arch::Sm80);
    k.abi.params.pop();
    match gpu.load(&k) {
        Err(RuntimeError::Incompatible { why, .. }) => eprintln!("ABI mismatch caught: {why}"),
        other => panic!("expected Incompatible, got {other:?}"),
    }
    // Broken PTX comes back with the JIT's log.
    let mut k = axpy_kernel(kgen_core::Arch::Sm80);
    k.ptx = k.ptx.replace("fma.rn.f32", "fma.bogus.f32");
    match gpu.load(&k) {
        Err(e @ RuntimeError::PtxLoad { .. }) => {
            let msg = e.to_string();
            eprintln!("PTX error reported as: {msg}");
            assert!(msg.contains("axpy_test"));
        }
        other => panic!("expected PtxLoad, got {other:?}"),
    }
    // The context still works after the failed load.
    let k = axpy_kernel(kgen_core::Arch::Sm80);
    assert!(gpu.load(&k).is_ok());
}

#[test]
fn ptx_entry_params_are_counted_per_entry() {
    let ptx = ".version 8.0\n.visible .entry k_long(\n .param .u64 a\n)\n{ ret; }\n\
               .visible .entry k(\n    .param .u64 x_ptr,\n    .param .f32 alpha\n)\n{ ret; }\n\
               .visible .entry empty()\n{ ret; }\n";
    assert_eq!(crate::gpu::ptx_entry_param_count(ptx, "k"), Some(2));
    assert_eq!(crate::gpu::ptx_entry_param_count(ptx, "k_long"), Some(1));
    assert_eq!(crate::gpu::ptx_entry_param_count(ptx, "empty"), Some(0));
    assert_eq!(crate::gpu::ptx_entry_param_count(ptx, "missing"), None);
}
