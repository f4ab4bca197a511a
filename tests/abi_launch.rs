//! `kgen compile --emit abi` round-tripped into a launch, the way a launcher outside
//! kgen (cupy, the driver API) uses it: the JSON is read as plain JSON (not through
//! kgen's types), the arguments are built from what it says (dtypes, ranks, constant
//! extents, contiguity, alignment, parameter order) and packed into the PTX parameter
//! words as docs/ARCHITECTURE.md ("The launch ABI") describes; then
//! - the packed words equal what kgen's own launcher packs (`pack_params`),
//! - the JSON's alignment rule accepts exactly what the runtime's checks accept,
//! - the launch geometry matches the PTX text (`.maxntid`, `.extern .shared`,
//!   `.reqnctapercluster`),
//! - the arguments, launched through the runtime's checked launch on the interpreter
//!   device in the JSON's order, give the results of a direct interpreter run and of a
//!   float64 reference.
//!
//! `tools/launch-with-cupy.py` does the same with cupy on a GPU.

use kgen::core::abi::SourceParam;
use kgen::core::host::{ArgValue, HostTensor};
use kgen::core::types::{DType, Scalar};
use kgen::core::{Arch, CompileOptions, SourceFile};
use kgen::runtime::{Arg, Device};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn kgen_out(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_kgen"))
        .args(args)
        .env("KGEN_CACHE", "0")
        .output()
        .expect("runs kgen");
    assert!(
        o.status.success(),
        "kgen {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

fn src_file(name: &str, text: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kgen-abi-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn vals(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD1B5);
            ((h >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

/// One test kernel: source, options, the runtime extents to use per tensor (None for
/// constant dims, taken from the JSON), extra elements of padding per row for
/// non-contiguous tensors, the grid, scalar values by name, and a float64 reference
/// (inputs in source order as row-major values → expected values of each written
/// tensor, by name).
/// Inputs (name, row-major values) and scalars → expected values per written tensor.
type Reference = fn(&[(String, Vec<f64>)], &[(&str, f64)]) -> Vec<(String, Vec<f64>)>;

struct Case {
    name: &'static str,
    text: &'static str,
    defines: &'static [(&'static str, &'static str)],
    arch: Arch,
    extents: &'static [(&'static str, &'static [usize])],
    grid: [u32; 3],
    scalars: &'static [(&'static str, f64)],
    reference: Reference,
}

fn input<'a>(ins: &'a [(String, Vec<f64>)], name: &str) -> &'a [f64] {
    &ins.iter().find(|(n, _)| n == name).expect("input").1
}

fn scalar(s: &[(&str, f64)], name: &str) -> f64 {
    s.iter().find(|(n, _)| *n == name).expect("scalar").1
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "affine",
            text: "kernel affine<B: int = 256>(x: tensor<f32, 2>, a: f32, y: tensor<f32, 2, contiguous>) {\n\
                   store(y, [bid(0), bid(1)], load(x, [bid(0), bid(1)], [1, B]) * a + 1.0);\n}\n",
            defines: &[],
            arch: Arch::Sm80,
            extents: &[("x", &[7, 1000]), ("y", &[7, 1000])],
            grid: [7, 4, 1],
            scalars: &[("a", -0.75)],
            reference: |ins, s| {
                let a = scalar(s, "a");
                vec![(
                    "y".into(),
                    input(ins, "x").iter().map(|x| x * a + 1.0).collect(),
                )]
            },
        },
        Case {
            name: "mixed",
            text: "kernel mixed<T: float = bf16>(a: T, flag: bool, n: i64, u: u32, \
                   x: tensor<T, [_, 64], contiguous>, y: tensor<f32, [_, 64], contiguous>) {\n\
                   let t = load(x, [bid(0), 0], [1, 64]) as f32;\n\
                   let s = where(flag, a as f32, 0.0) + (n as f32) + (u as f32);\n\
                   store(y, [bid(0), 0], t * s);\n}\n",
            defines: &[("T", "bf16")],
            arch: Arch::Sm90a,
            extents: &[("x", &[5, 64]), ("y", &[5, 64])],
            grid: [5, 1, 1],
            // 1 + 2^-8 + 2^-40 as a bf16 scalar is 1 + 2^-7 (one rounding, to nearest even).
            scalars: &[("a", 1.0 + 1.0 / 256.0 + 1.0 / 1099511627776.0), ("flag", 1.0), ("n", -3.0), ("u", 5.0)],
            reference: |ins, s| {
                let a = kgen::core::round::round_f64(DType::BF16, scalar(s, "a"));
                let k = a + scalar(s, "n") + scalar(s, "u");
                vec![("y".into(), input(ins, "x").iter().map(|x| x * k).collect())]
            },
        },
        Case {
            name: "big_smem",
            text: "kernel big_smem(x: tensor<f32, 2, contiguous>, y: tensor<f32, 2, contiguous>) {\n\
                   let buf = scratch(16, [1, 1024], f32);\n\
                   scratch_store(buf, 3, load(x, [bid(0), 0], [1, 1024]));\n\
                   store(y, [bid(0), 0], scratch_load(buf, 3) * 2.0);\n}\n",
            defines: &[],
            arch: Arch::Sm90a,
            extents: &[("x", &[3, 1024]), ("y", &[3, 1024])],
            grid: [3, 1, 1],
            scalars: &[],
            reference: |ins, _| vec![("y".into(), input(ins, "x").iter().map(|x| x * 2.0).collect())],
        },
        Case {
            name: "row_sum_cluster",
            text: "// target: sm_90a\n\
                   kernel row_sum_cluster(x: tensor<f32, 2>, y: tensor<f32, 1>) {\n\
                   let row = bid(0) / 4;\n\
                   let part = bid(0) % 4;\n\
                   let t = load(x, [row, part], [1, 256]);\n\
                   let all = cluster_gather(sum(t.reshape([256]), 0), 4);\n\
                   if part == 0 {\n store(y, [row], full([1], sum(all, 0)));\n }\n}\n",
            defines: &[],
            arch: Arch::Sm90a,
            extents: &[("x", &[2, 1000]), ("y", &[2])],
            grid: [8, 1, 1],
            scalars: &[],
            reference: |ins, _| {
                let x = input(ins, "x");
                vec![("y".into(), x.chunks(1000).map(|r| r.iter().sum()).collect())]
            },
        },
    ]
}

fn dtype_of(v: &Value) -> DType {
    DType::from_name(v.as_str().expect("dtype string")).expect("known dtype")
}

/// The tensor and scalar arguments built from the JSON alone, in source order, and the
/// row-major inputs for the reference. Non-contiguous tensors get padded rows (a real
/// strided view); everything respects `align_bytes` as documented.
fn build_args(doc: &Value, case: &Case) -> (Vec<ArgValue>, Vec<(String, Vec<f64>)>) {
    let n = doc["tensors"].as_array().unwrap().len() + doc["scalars"].as_array().unwrap().len();
    let mut args: Vec<Option<ArgValue>> = vec![None; n];
    let mut inputs = Vec::new();
    for (k, t) in doc["tensors"].as_array().unwrap().iter().enumerate() {
        let name = t["name"].as_str().unwrap();
        let dtype = dtype_of(&t["dtype"]);
        let given = case
            .extents
            .iter()
            .find(|(m, _)| *m == name)
            .expect("extents")
            .1;
        let dims: Vec<Option<u64>> = t["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64())
            .collect();
        assert_eq!(dims.len() as u64, t["rank"].as_u64().unwrap());
        let shape: Vec<usize> = dims
            .iter()
            .zip(given)
            .map(|(d, g)| {
                if let Some(c) = d {
                    assert_eq!(*c as usize, *g, "{name}: constant extent");
                }
                *g
            })
            .collect();
        let contiguous = t["contiguous"].as_bool().unwrap();
        let align = t["align_bytes"].as_u64().unwrap() as usize;
        let elem = t["elem_bytes"].as_u64().unwrap() as usize;
        assert_eq!(elem as u32, dtype.size_bytes());
        // Rows padded so that every stride is a multiple of `align`; a tensor that is
        // not contiguous gets a last stride of 2 and one more step of padding per row,
        // a real strided view.
        let last = *shape.last().unwrap();
        let ls = if contiguous { 1 } else { 2 };
        let step = (align / elem).max(ls);
        let mut row = (last * ls).div_ceil(step) * step;
        if !contiguous {
            row += step;
        }
        let rank = shape.len();
        let mut strides = vec![ls; rank];
        let mut acc = row;
        for d in (0..rank.saturating_sub(1)).rev() {
            strides[d] = acc;
            acc *= shape[d];
        }
        let storage = acc.max(1);
        let values = vals(shape.iter().product(), 31 + k as u64);
        let mut h = HostTensor::zeros(dtype, &[storage]);
        h.poison(0xFF);
        let mut view = HostTensor {
            shape: shape.clone(),
            strides,
            ..h
        };
        let written = t["written"].as_bool().unwrap();
        let read = t["read"].as_bool().unwrap();
        if read {
            for (i, v) in values.iter().enumerate() {
                view.set_linear(i, *v);
            }
        }
        inputs.push((name.to_string(), view.to_f64_vec()));
        assert!(read || written, "{name}");
        args[t["source_index"].as_u64().unwrap() as usize] = Some(ArgValue::Tensor(view));
    }
    for s in doc["scalars"].as_array().unwrap() {
        let name = s["name"].as_str().unwrap();
        let v = scalar(case.scalars, name);
        let sc = match dtype_of(&s["dtype"]) {
            DType::Bool => Scalar::Bool(v != 0.0),
            d if d.is_int() => Scalar::Int(v as i64, d),
            d => Scalar::Float(v, d),
        };
        args[s["source_index"].as_u64().unwrap() as usize] = Some(ArgValue::Scalar(sc));
    }
    (
        args.into_iter()
            .map(|a| a.expect("every source parameter"))
            .collect(),
        inputs,
    )
}

/// The PTX parameter words, packed from the JSON as the docs say (the value in the low
/// bytes of a 64-bit word, `size` bytes of it passed).
fn pack_from_json(doc: &Value, args: &[ArgValue], ptrs: &[u64]) -> Vec<u64> {
    doc["params"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            assert_eq!(p["index"].as_u64(), Some(i as u64));
            let src = p["source_index"].as_u64().unwrap() as usize;
            let (ty, size) = (p["ptx_type"].as_str().unwrap(), p["size"].as_u64().unwrap());
            let tensor = || match &args[src] {
                ArgValue::Tensor(t) => t,
                _ => panic!("{p}: not a tensor"),
            };
            let dim = || p["dim"].as_u64().unwrap() as usize;
            match p["kind"].as_str().unwrap() {
                "tensor_ptr" => {
                    assert_eq!((ty, size), ("u64", 8));
                    ptrs[src]
                }
                "tensor_dim" => {
                    assert_eq!((ty, size), ("s32", 4));
                    tensor().shape[dim()] as u32 as u64
                }
                "tensor_stride" => {
                    assert_eq!((ty, size), ("s32", 4));
                    tensor().strides[dim()] as u32 as u64
                }
                "scalar" => {
                    let ArgValue::Scalar(s) = args[src] else {
                        panic!("{p}: not a scalar")
                    };
                    let v = s.to_f64();
                    match (p["dtype"].as_str().unwrap(), ty, size) {
                        ("f32", "f32", 4) => (v as f32).to_bits() as u64,
                        ("bf16", "b16", 2) => kgen::core::round::f64_to_bf16(v).to_bits() as u64,
                        ("f16", "b16", 2) => kgen::core::round::f64_to_f16(v).to_bits() as u64,
                        ("bool", "u32", 4) => (v != 0.0) as u64,
                        ("i32", "s32", 4) => (v as i32) as u32 as u64,
                        ("u32", "u32", 4) => v as u32 as u64,
                        ("i64", "s64", 8) => (v as i64) as u64,
                        other => panic!("undocumented scalar encoding {other:?}"),
                    }
                }
                other => panic!("unknown kind {other}"),
            }
        })
        .collect()
}

/// The JSON's alignment rule (docs/ARCHITECTURE.md), applied to a view at `base`.
fn json_alignment_ok(t: &Value, shape: &[usize], strides: &[usize], base: u64) -> bool {
    let align = t["align_bytes"].as_u64().unwrap();
    let elem = t["elem_bytes"].as_u64().unwrap();
    let rank = shape.len();
    let mut ok = base.is_multiple_of(align);
    for d in 0..rank.saturating_sub(1) {
        if shape[d] > 1 {
            ok &= (strides[d] as u64 * elem).is_multiple_of(align);
        }
    }
    if t["contiguous"].as_bool().unwrap() {
        ok &= (shape[rank - 1] as u64 * elem).is_multiple_of(align);
    }
    ok
}

#[test]
fn the_abi_json_round_trips_into_a_launch() {
    for case in cases() {
        let path = src_file(&format!("{}.kg", case.name), case.text);
        let p = path.display().to_string();
        let mut cli = vec![
            "compile".to_string(),
            p.clone(),
            "--arch".into(),
            case.arch.name().into(),
        ];
        for (n, v) in case.defines {
            cli.push("-D".into());
            cli.push(format!("{n}={v}"));
        }
        let cli_ref: Vec<&str> = cli.iter().map(String::as_str).collect();
        let ptx = kgen_out(&cli_ref);
        let mut with_abi = cli_ref.clone();
        with_abi.extend(["--emit", "abi"]);
        let doc: Value = serde_json::from_str(&kgen_out(&with_abi)).expect("JSON");
        assert_eq!(doc["schema"], "kgen-abi");
        assert_eq!(doc["version"], 1);
        assert_eq!(doc["arch"], case.arch.name());

        // The launch geometry, against the PTX text.
        let entry = doc["entry"].as_str().unwrap();
        assert!(ptx.contains(&format!(".entry {entry}(")), "{}", case.name);
        let tpb = doc["launch"]["threads_per_block"].as_u64().unwrap();
        assert!(ptx.contains(&format!(".maxntid {tpb}, 1, 1")));
        assert_eq!(doc["launch"]["block"], serde_json::json!([tpb, 1, 1]));
        let dynamic = doc["launch"]["dynamic_shared_bytes"].as_u64().unwrap();
        assert_eq!(
            ptx.contains(".extern .shared"),
            dynamic > 0,
            "{}",
            case.name
        );
        assert_eq!(
            doc["launch"]["needs_max_dynamic_shared_attribute"],
            dynamic > 0
        );
        if case.name == "big_smem" {
            assert!(dynamic > 48 * 1024, "{dynamic}");
        }
        let cluster = doc["launch"]["cluster_size"].as_u64().unwrap();
        assert_eq!(
            ptx.contains(&format!(".reqnctapercluster {cluster}")),
            cluster > 1
        );
        assert_eq!(cluster > 1, case.name == "row_sum_cluster");
        assert_eq!(case.grid[0] as u64 % cluster, 0);

        // The direct path: kgen's compiler and launcher with the same options.
        let file = SourceFile::new(path.display().to_string(), case.text);
        let mut opts = CompileOptions::new(case.arch);
        for (n, v) in case.defines {
            opts = opts.define(n, v);
        }
        let compiled = kgen::core::compile(&file, &opts).expect("compiles");
        assert_eq!(compiled.ptx, ptx);

        let (args, inputs) = build_args(&doc, &case);
        kgen::runtime::validate_args(entry, &compiled.abi, &args)
            .unwrap_or_else(|e| panic!("{}: JSON-built arguments refused: {e}", case.name));
        let ptrs: Vec<u64> = (0..args.len() as u64)
            .map(|i| 0x7f00_0000_0000 + (i << 20))
            .collect();
        let words = pack_from_json(&doc, &args, &ptrs);
        let direct = kgen::runtime::pack_params(&compiled.abi, &args, &ptrs).unwrap();
        assert_eq!(words, direct, "{}: packed parameters", case.name);

        // The alignment rule as written in the JSON is the one the runtime enforces:
        // perturb each tensor's last extent, its row stride and its base address.
        for t in doc["tensors"].as_array().unwrap() {
            let i = t["source_index"].as_u64().unwrap() as usize;
            let ArgValue::Tensor(h) = &args[i] else {
                unreachable!()
            };
            let rank = h.shape.len();
            let dims = t["dims"].as_array().unwrap();
            let mut variants = vec![(h.shape.clone(), h.strides.clone(), 0u64)];
            for base in [2u64, 4, 8] {
                variants.push((h.shape.clone(), h.strides.clone(), base));
            }
            if dims[rank - 1].is_null() {
                let mut s = h.shape.clone();
                s[rank - 1] -= 1;
                variants.push((s, h.strides.clone(), 0));
            }
            if rank > 1 && h.shape[0] > 1 {
                let mut st = h.strides.clone();
                st[0] += 1;
                variants.push((h.shape.clone(), st, 0));
            }
            for (shape, strides, base) in variants {
                let SourceParam::Tensor {
                    dims,
                    contiguous,
                    align_bytes,
                    dtype,
                    ..
                } = &compiled.abi.source_params[i]
                else {
                    unreachable!()
                };
                let storage = h.storage_len() + 64;
                let runtime_ok = kgen::runtime::check_tensor_view(
                    "t",
                    dims,
                    *contiguous,
                    *align_bytes,
                    *dtype,
                    &shape,
                    &strides,
                    storage,
                    base,
                )
                .is_ok();
                assert_eq!(
                    runtime_ok,
                    json_alignment_ok(t, &shape, &strides, base),
                    "{}: {} shape {shape:?} strides {strides:?} base {base}",
                    case.name,
                    t["name"]
                );
            }
        }

        // Launch through the runtime's checked path on the interpreter device, the
        // arguments in the JSON's order, against a direct interpreter run.
        let device = Device::interpreter();
        let kernel = device.kernel(&file, &opts).expect("kernel");
        let tensors: Vec<Option<kgen::runtime::Tensor>> = args
            .iter()
            .map(|a| match a {
                ArgValue::Tensor(h) => {
                    // The same strided view on the device: the storage, then a view.
                    let flat = HostTensor {
                        shape: vec![h.storage_len()],
                        strides: vec![1],
                        ..h.clone()
                    };
                    let t = device.from_host(&flat).unwrap();
                    Some(strided(&t, &h.shape, &h.strides))
                }
                ArgValue::Scalar(_) => None,
            })
            .collect();
        let launch_args: Vec<Arg> = args
            .iter()
            .zip(&tensors)
            .map(|(a, t)| match (a, t) {
                (_, Some(t)) => Arg::Tensor(t),
                (ArgValue::Scalar(s), None) => Arg::Scalar(*s),
                _ => unreachable!(),
            })
            .collect();
        let stream = device.stream();
        device
            .launch(&stream, &kernel, case.grid, &launch_args)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let (func, _) = kgen::core::compile_to_ir(&file, &opts).unwrap();
        let mut direct_args = args.clone();
        kgen::core::interp::run(&func, case.grid, &mut direct_args).unwrap();
        let want = (case.reference)(&inputs, case.scalars);
        for (name, expect) in want {
            let t = doc["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == name.as_str())
                .unwrap();
            let i = t["source_index"].as_u64().unwrap() as usize;
            let got = tensors[i].as_ref().unwrap().to_f64_vec().unwrap();
            let ArgValue::Tensor(d) = &direct_args[i] else {
                unreachable!()
            };
            assert_eq!(
                got,
                d.to_f64_vec(),
                "{}: {name}: JSON launch vs direct run",
                case.name
            );
            for (k, (g, e)) in got.iter().zip(&expect).enumerate() {
                let tol = 1e-5
                    * e.abs().max(1.0)
                    * if case.name == "row_sum_cluster" {
                        100.0
                    } else {
                        1.0
                    };
                assert!(
                    (g - e).abs() <= tol,
                    "{}: {name}[{k}] = {g}, reference {e}",
                    case.name
                );
            }
        }
    }
}

/// A device view with the given shape and element strides over a flat tensor (rows of
/// `strides[rank - 2]` elements, or the whole storage for rank 1; a last stride of 1
/// or 2).
fn strided(
    flat: &kgen::runtime::Tensor,
    shape: &[usize],
    strides: &[usize],
) -> kgen::runtime::Tensor {
    let rank = shape.len();
    let ls = strides[rank - 1];
    let row = if rank == 1 {
        flat.numel()
    } else {
        strides[rank - 2]
    };
    let mut full: Vec<usize> = shape[..rank - 1].to_vec();
    full.push(row / ls);
    full.push(ls);
    let n: usize = full.iter().product();
    let t = flat.narrow(0, 0, n).unwrap().reshape(&full).unwrap();
    let t = t.narrow(rank - 1, 0, shape[rank - 1]).unwrap();
    let t = t.select(rank, 0).unwrap();
    assert_eq!((t.shape(), t.strides()), (shape, strides));
    t
}

#[test]
fn programmatic_dependent_launch_is_announced_on_sm_90a_only() {
    let p = src_file(
        "gdc.kg",
        "kernel gdc(x: tensor<f32, 1, contiguous>, y: tensor<f32, 1, contiguous>) {\n\
         gdc_wait();\n store(y, [bid(0)], load(x, [bid(0)], [128]) + 1.0);\n}\n",
    )
    .display()
    .to_string();
    for (arch, want) in [("sm_90a", true), ("sm_80", false)] {
        let doc: Value =
            serde_json::from_str(&kgen_out(&["compile", &p, "--arch", arch, "--emit", "abi"]))
                .unwrap();
        assert_eq!(
            doc["launch"]["programmatic_dependent_launch"], want,
            "{arch}"
        );
    }
    let doc: Value = serde_json::from_str(&kgen_out(&[
        "compile",
        &p,
        "--emit",
        "abi",
        "--min-blocks-per-sm",
        "2",
        "--warps",
        "2",
    ]))
    .unwrap();
    assert_eq!(doc["launch"]["min_blocks_per_sm"], 2);
    assert_eq!(doc["specialization"]["min_blocks_per_sm"], 2);
    assert_eq!(doc["launch"]["threads_per_block"], 64);
}
