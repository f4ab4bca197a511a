//! Tests of the bench harness: the GPT-2 list, floor bytes against the workload table of
//! `bench/README.md` (which `torch_peers.py --self-check` checks against the Python
//! side), quantiles, filters, peer parsing and merging, the table / CSV / JSON output,
//! and every workload's wiring run once on the interpreter at small shapes (outputs
//! poisoned with NaN beforehand, so an output the run does not write is caught).

use super::measure::{adamw_with_random_state, prepare, run_workload, Timer};
use super::*;
use crate::ops::Ops;
use kgen_runtime::Device;

#[test]
fn gpt2_list_has_148_tensors_and_124_4m_parameters() {
    let shapes = gpt2_param_shapes();
    assert_eq!(shapes.len(), 148);
    let (d, v, c) = (768usize, 50257usize, 1024usize);
    let per_layer =
        2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d);
    let expected = v * d + c * d + 12 * per_layer + 2 * d;
    let total = total_numel(&shapes.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>());
    assert_eq!(total, expected);
    assert!((total as f64 - 124.4e6).abs() < 0.05e6, "{total}");
    let names: std::collections::HashSet<_> = shapes.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names.len(), 148, "parameter names are unique");
}

/// `| `name` | shape | dtype | peers | bytes | formula |` rows of bench/README.md.
fn readme_rows() -> Vec<Vec<String>> {
    include_str!("../../bench/README.md")
        .lines()
        .filter_map(|l| {
            let cells: Vec<String> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect();
            (cells.len() >= 6 && cells[0].starts_with('`')).then_some(cells)
        })
        .collect()
}

#[test]
fn floor_bytes_names_and_formulas_match_torch_peers() {
    let rows = readme_rows();
    assert!(
        rows.len() >= 20,
        "README table not found ({} rows)",
        rows.len()
    );
    let ws = workloads();
    assert_eq!(ws.len(), 23);
    for w in &ws {
        let name = format!("`{}`", w.name);
        let row = rows
            .iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("{} is not in bench/README.md", w.name));
        assert_eq!(row[1], w.shape, "{}: shape", w.name);
        assert_eq!(row[2], w.dtype, "{}: dtype", w.name);
        assert_eq!(
            row[4],
            w.floor_bytes().to_string(),
            "{}: floor bytes",
            w.name
        );
        assert_eq!(row[5], w.formula, "{}: formula", w.name);
    }
    let names: std::collections::HashSet<_> = ws.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names.len(), ws.len(), "names are unique");
    assert!(ws.iter().all(|w| w
        .name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        || w.name == "copy_d2d_1GiB"));
    assert_eq!(ws[0].name, "copy_d2d_1GiB", "the copy runs first");
    // Every op of shared/ANCHORS.md has its target; the extra rows (the fused residual
    // add + RMSNorm, the padded GPT-2 vocabulary: ANCHORS.md lists neither) have none.
    let untargeted: Vec<&str> = ws[1..]
        .iter()
        .filter(|w| w.target_us.is_none())
        .map(|w| w.name.as_str())
        .collect();
    assert_eq!(
        untargeted,
        [
            "add_rmsnorm_fwd_bf16_16384x4096",
            "add_rmsnorm_fwdbwd_bf16_16384x4096",
            "cross_entropy_fwdbwd_bf16_8192x50304"
        ]
    );
}

#[test]
fn floor_bytes_of_small_kinds() {
    // Spelled out per operand so the formula is checked, not restated.
    let (r, h) = (3u64, 5u64);
    let norm = |bwd| Kind::Norm {
        layer: false,
        rows: 3,
        hidden: 5,
        bwd,
    };
    assert_eq!(norm(false).floor_bytes(), 2 * (r * h) + 2 * (r * h));
    assert_eq!(norm(true).floor_bytes(), 2 * (r * h) * (2 + 3));
    let adamw = Kind::AdamW {
        param: DType::BF16,
        state: DType::F32,
        shapes: vec![vec![7], vec![2, 3]],
    };
    assert_eq!(adamw.floor_bytes(), 13 * (2 + 2 + 2) + 13 * 4 * 4);
    let ce = Kind::CrossEntropy {
        rows: 4,
        vocab: 9,
        ignore_every: 7,
    };
    assert_eq!(ce.floor_bytes(), 36 * 2 * 2);
    let clip = Kind::ClipGradNorm {
        shapes: vec![vec![10]],
    };
    assert_eq!(clip.floor_bytes(), 10 * 4 * 3);
    assert_eq!(Kind::Copy { bytes: 100 }.floor_bytes(), 200);
    // add_rmsnorm: read x and residual, write h and y (bf16).
    let add = |bwd| Kind::AddRmsnorm {
        rows: 3,
        hidden: 5,
        bwd,
    };
    assert_eq!(add(false).floor_bytes(), 2 * (r * h) * 2 + 2 * (r * h) * 2);
    // + read h, dy, dh_residual, write dh.
    assert_eq!(add(true).floor_bytes(), 2 * (r * h) * 4 + 2 * (r * h) * 4);
}

#[test]
fn quantiles_interpolate_like_torch() {
    assert_eq!(quantile(&[], 0.5), None);
    assert_eq!(quantile(&[3.0], 0.2), Some(3.0));
    assert_eq!(quantile(&[4.0, 1.0, 3.0, 2.0], 0.5), Some(2.5));
    let v: Vec<f64> = (0..=10).rev().map(f64::from).collect();
    assert_eq!(quantile(&v, 0.2), Some(2.0));
    assert_eq!(quantile(&v, 0.8), Some(8.0));
    let q = quantile(&[0.0, 10.0], 0.25).unwrap();
    assert!((q - 2.5).abs() < 1e-12);
    let m = Measured::from_times(&[5.0, 1.0, 3.0], 0.7).unwrap();
    assert_eq!((m.median_us, m.runs, m.host_us), (3.0, 3, 0.7));
}

#[test]
fn filters_select_by_substring_and_always_keep_the_copy() {
    assert!(selected("copy_d2d_1GiB", Some("rmsnorm")));
    assert!(selected("rmsnorm_fwd_bf16_16384x768", Some("rmsnorm")));
    assert!(!selected("layernorm_fwd_bf16_16384x768", Some("rmsnorm")));
    assert!(selected("adamw_fp32_gpt2", Some("rmsnorm, adamw")));
    assert!(selected("adamw_fp32_gpt2", None));
    assert!(!selected("adamw_fp32_gpt2", Some(",")));
}

const PEERS: &str = r#"[
 {"workload": "copy_d2d_1GiB", "peer": "eager", "median_us": 716.0, "gbps": 3000.0},
 {"workload": "rmsnorm_fwd_bf16_16384x768", "peer": "eager", "median_us": 26.7, "host_us": 8.0,
  "error": null, "device": "H100"},
 {"workload": "rmsnorm_fwd_bf16_16384x768", "peer": "compile", "median_us": 23.0},
 {"workload": "layernorm_fwd_bf16_16384x768", "peer": "compile", "median_us": null,
  "error": "BackendCompilerFailed: boom"},
 {"workload": "gemm_bf16_2048x2048x2048", "peer": "cublas", "median_us": 28.5}
]"#;

#[test]
fn peers_parse_and_reject_what_is_not_a_peer_file() {
    let p = parse_peers(PEERS).unwrap();
    assert_eq!(p.len(), 5);
    assert_eq!(p[1].host_us, Some(8.0));
    assert_eq!(p[3].median_us, None);
    assert_eq!(p[3].error.as_deref(), Some("BackendCompilerFailed: boom"));
    assert!(parse_peers("{}").unwrap_err().contains("JSON list"));
    assert!(parse_peers("[{\"peer\": \"x\"}]")
        .unwrap_err()
        .contains("record 0"));
    assert!(parse_peers("not json").unwrap_err().contains("not JSON"));
    assert_eq!(parse_peers("[]").unwrap(), vec![]);
}

#[test]
fn launch_peers_are_picked_out_fastest_first_without_failed_ones() {
    let text = r#"[
 {"workload": "launch_host", "peer": "triton", "median_us": 12.8, "what": "Triton"},
 {"workload": "rmsnorm_fwd_bf16_16384x768", "peer": "compile", "median_us": 23.0},
 {"workload": "launch_host", "peer": "cuda_cpp_cuLaunchKernel", "median_us": 3.79},
 {"workload": "launch_host", "peer": "cupy_rawkernel", "median_us": null, "error": "x"}
]"#;
    let p = parse_peers(text).unwrap();
    assert_eq!(
        super::launch_peers(&p),
        vec![
            ("cuda_cpp_cuLaunchKernel".to_string(), 3.79),
            ("triton".to_string(), 12.8)
        ]
    );
    assert!(super::launch_peers(&parse_peers(PEERS).unwrap()).is_empty());
}

fn row(name: &str, bytes: u64, target: Option<f64>, result: Result<f64, &str>) -> Row {
    Row {
        workload: name.into(),
        shape: "s".into(),
        dtype: "bf16".into(),
        floor_bytes: bytes,
        target_us: target,
        result: result
            .map(|us| Measured {
                median_us: us,
                p20_us: us * 0.9,
                p80_us: us * 1.1,
                runs: 50,
                host_us: 2.0,
            })
            .map_err(str::to_string),
        note: None,
        peers: vec![],
    }
}

#[test]
fn rows_merge_peers_and_derive_speedup_pass_and_bandwidth() {
    let mut rows = vec![
        row("copy_d2d_1GiB", 2 << 30, None, Ok(800.0)),
        row(
            "rmsnorm_fwd_bf16_16384x768",
            50_331_648,
            Some(19.0),
            Ok(18.0),
        ),
        row(
            "layernorm_fwd_bf16_16384x768",
            50_331_648,
            Some(19.0),
            Ok(20.0),
        ),
        row(
            "softmax_fwd_bf16_16384x4096",
            1000,
            Some(95.0),
            Err("set-up failed: x"),
        ),
    ];
    merge_peers(&mut rows, &parse_peers(PEERS).unwrap());
    let copy = rows[0].gbps();
    let expect_copy = (2u64 << 30) as f64 / 800.0 / 1e3;
    assert!((copy.unwrap() - expect_copy).abs() < 1e-9);
    let r = &rows[1];
    assert_eq!(r.peers.len(), 2);
    assert_eq!(r.best_peer(), Some(("compile", 23.0)));
    assert!((r.speedup().unwrap() - 23.0 / 18.0).abs() < 1e-12);
    assert_eq!(r.pass(), Some(true));
    let gbps = 50_331_648.0 / 18.0 / 1e3;
    assert!((r.gbps().unwrap() - gbps).abs() < 1e-9);
    assert!((r.of_copy(copy).unwrap() - gbps / expect_copy).abs() < 1e-12);
    assert_eq!(rows[2].pass(), Some(false));
    assert_eq!(rows[2].best_peer(), None, "the only peer failed");
    assert_eq!(rows[2].peers_text(), "compile ERR");
    assert_eq!(rows[3].pass(), None);
    assert_eq!(rows[0].pass(), None, "no target for the copy");

    let table = format_table(&rows, copy);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 5);
    assert!(
        lines[0].contains("torch_best"),
        "peer columns shown: {}",
        lines[0]
    );
    assert!(
        lines[2].contains("PASS") && lines[2].contains("1.28x"),
        "{}",
        lines[2]
    );
    assert!(
        lines[2].contains("eager 26.7, compile 23.0"),
        "{}",
        lines[2]
    );
    assert!(lines[3].contains("MISS"), "{}", lines[3]);
    assert!(lines[4].contains("[set-up failed: x]"), "{}", lines[4]);
    let plain = format_table(&rows[..2], copy);
    assert!(plain.contains("torch_best"));
    let no_peers: Vec<Row> = rows
        .iter()
        .cloned()
        .map(|mut r| {
            r.peers.clear();
            r
        })
        .collect();
    assert!(!format_table(&no_peers, copy).contains("torch_best"));

    let csv = to_csv(&rows, copy);
    let header_cols = CSV_HEADER.split(',').count();
    for l in csv.lines() {
        assert_eq!(csv_columns(l), header_cols, "{l}");
    }
    assert!(csv
        .lines()
        .nth(2)
        .unwrap()
        .contains("\"eager 26.7, compile 23.0\""));

    let js = rows_json(&rows, copy);
    let a = js.as_array().unwrap();
    assert_eq!(a.len(), 4);
    assert_eq!(a[1]["torch_best"]["peer"], "compile");
    assert_eq!(a[1]["pass"], true);
    assert_eq!(a[3]["median_us"], serde_json::Value::Null);
    assert_eq!(a[3]["error"], "set-up failed: x");
}

/// Columns of one CSV line (quotes respected).
fn csv_columns(line: &str) -> usize {
    let (mut n, mut quoted) = (1, false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => n += 1,
            _ => {}
        }
    }
    n
}

/// Small versions of every kind, for the interpreter.
fn small_kinds() -> Vec<Kind> {
    let mut v = vec![Kind::Copy { bytes: 2 * 1000 }];
    for (param, state) in [
        (DType::F32, DType::F32),
        (DType::BF16, DType::BF16),
        (DType::F16, DType::F16),
    ] {
        v.push(Kind::AdamW {
            param,
            state,
            shapes: vec![vec![7], vec![3, 5], vec![1]],
        });
    }
    for layer in [false, true] {
        for bwd in [false, true] {
            v.push(Kind::Norm {
                layer,
                rows: 3,
                hidden: 70,
                bwd,
            });
        }
    }
    for bwd in [false, true] {
        v.push(Kind::Swiglu {
            rows: 5,
            cols: 7,
            bwd,
        });
        v.push(Kind::Rope {
            b: 1,
            s: 3,
            h: 2,
            d: 8,
            bwd,
        });
    }
    v.push(Kind::Softmax { rows: 3, cols: 7 });
    v.push(Kind::CrossEntropy {
        rows: 8,
        vocab: 13,
        ignore_every: 7,
    });
    v.push(Kind::ClipGradNorm {
        shapes: vec![vec![200, 300], vec![7]],
    });
    v.push(Kind::GradNorm {
        shapes: vec![vec![7], vec![1000]],
    });
    v
}

#[test]
fn every_workload_writes_all_its_outputs_on_the_interpreter() {
    let dev = Device::interpreter();
    let ops = Ops::new(&dev);
    for kind in small_kinds() {
        let mut p = prepare(&ops, &kind, 7).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        (p.run)().unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        for (name, t) in &p.outputs {
            let v = t.to_f64_vec().unwrap();
            assert!(!v.is_empty());
            let bad = v.iter().filter(|x| !x.is_finite()).count();
            assert_eq!(
                bad, 0,
                "{kind:?}: output {name} has {bad} non-finite values"
            );
        }
        if let Some(after) = p.after.as_mut() {
            // Norm ~ 0.01 * sqrt(60007) ~ 2.4 > max_norm 1: the clip scales.
            assert_eq!(after().unwrap(), None, "{kind:?}");
        }
    }
}

#[test]
fn the_copy_copies_and_cross_entropy_ignores_one_row_in_seven() {
    let dev = Device::interpreter();
    let ops = Ops::new(&dev);
    let mut p = prepare(&ops, &Kind::Copy { bytes: 2 * 777 }, 3).unwrap();
    (p.run)().unwrap();
    let dst = p.outputs[0].1.to_f64_vec().unwrap();
    assert_eq!(dst.len(), 777);
    assert!(
        dst.iter().all(|x| *x != 0.0 && x.is_finite()),
        "random, never zero"
    );
    let distinct: std::collections::HashSet<u64> = dst.iter().map(|x| x.to_bits()).collect();
    assert!(distinct.len() > 100, "random data, not a constant");

    let (rows, vocab) = (15, 11);
    let kind = Kind::CrossEntropy {
        rows,
        vocab,
        ignore_every: 7,
    };
    let mut p = prepare(&ops, &kind, 3).unwrap();
    (p.run)().unwrap();
    let get = |n: &str| {
        p.outputs
            .iter()
            .find(|(m, _)| *m == n)
            .unwrap()
            .1
            .to_f64_vec()
            .unwrap()
    };
    let (row_loss, stats, dl) = (get("row_loss"), get("stats"), get("dlogits"));
    let ignored: Vec<usize> = (0..rows).filter(|i| i % 7 == 0).collect();
    assert_eq!(
        stats[0],
        (rows - ignored.len()) as f64,
        "count of rows not ignored"
    );
    for i in 0..rows {
        let row_grad = &dl[i * vocab..(i + 1) * vocab];
        if ignored.contains(&i) {
            assert_eq!(row_loss[i], 0.0);
            assert!(row_grad.iter().all(|g| *g == 0.0));
        } else {
            assert!(row_loss[i] > 0.0);
            // d(mean loss)/dlogits sums to zero over a row (softmax - onehot).
            let s: f64 = row_grad.iter().sum();
            assert!(
                s.abs() < 0.02 / (rows - ignored.len()) as f64,
                "row {i}: {s}"
            );
        }
    }
}

#[test]
fn a_clip_that_does_not_scale_is_reported() {
    let dev = Device::interpreter();
    let ops = Ops::new(&dev);
    // Norm ~ 0.01 * sqrt(20) < 1: the coefficient is 1 and the scale pass is skipped.
    let mut p = prepare(
        &ops,
        &Kind::ClipGradNorm {
            shapes: vec![vec![7], vec![13]],
        },
        1,
    )
    .unwrap();
    (p.run)().unwrap();
    let note = (p.after.as_mut().unwrap())().unwrap().expect("a note");
    assert!(note.contains("scale pass was skipped"), "{note}");
}

#[test]
fn optimizer_state_is_random_and_padding_stays_zero() {
    let dev = Device::interpreter();
    let ops = Ops::new(&dev);
    let shapes = vec![vec![7], vec![3, 5]];
    let opt = adamw_with_random_state(&ops, DType::BF16, DType::F32, shapes, 9).unwrap();
    let slots = &opt.layout().segments[0].slots;
    for buf in [
        opt.params_flat(),
        opt.grads_flat(),
        opt.exp_avg_flat(),
        opt.exp_avg_sq_flat(),
    ] {
        let v = buf.to_f64_vec().unwrap();
        for (i, x) in v.iter().enumerate() {
            let inside = slots
                .iter()
                .any(|s| (s.offset..s.offset + s.numel).contains(&i));
            if inside {
                assert!(*x != 0.0 && x.is_finite(), "element {i}: {x}");
            } else {
                assert_eq!(*x, 0.0, "padding element {i}");
            }
        }
    }
    let v = opt.exp_avg_sq_flat().to_f64_vec().unwrap();
    assert!(
        v.iter().all(|x| *x >= 0.0),
        "second moments are not negative"
    );
}

#[test]
fn run_workload_times_on_the_interpreter_and_reports_errors() {
    let dev = Device::interpreter();
    let ops = Ops::new(&dev);
    let timer = Timer::new(&ops, 3, 1, 0).unwrap();
    let w = Workload {
        name: "softmax_small".into(),
        shape: "3x7".into(),
        dtype: "bf16",
        formula: "4*R*C",
        target_us: Some(1e12),
        kind: Kind::Softmax { rows: 3, cols: 7 },
    };
    let r = run_workload(&ops, &timer, &w, 1);
    let m = r.result.as_ref().unwrap();
    assert_eq!(m.runs, 3);
    assert!(m.median_us > 0.0 && m.p20_us <= m.median_us && m.median_us <= m.p80_us);
    assert_eq!(r.floor_bytes, 4 * 21);
    assert_eq!(r.pass(), Some(true));
    // An odd head dim is refused by the op: the row carries the error, nothing panics.
    let bad = Workload {
        kind: Kind::Rope {
            b: 1,
            s: 2,
            h: 1,
            d: 7,
            bwd: false,
        },
        ..w
    };
    let r = run_workload(&ops, &timer, &bad, 1);
    let e = r.result.unwrap_err();
    assert!(e.contains("head_dim 7"), "{e}");
}

#[test]
fn outputs_are_poisoned_before_the_first_run() {
    let dev = Device::interpreter();
    let ops = Ops::new(&dev);
    for kind in small_kinds() {
        if matches!(kind, Kind::AdamW { .. }) {
            continue; // in-place: its buffers hold the random start state
        }
        let p = prepare(&ops, &kind, 7).unwrap();
        for (name, t) in &p.outputs {
            if *name == "grads" {
                continue; // clip_grad_norm_ scales the gradients in place
            }
            let v = t.to_f64_vec().unwrap();
            assert!(
                v.iter().all(|x| x.is_nan()),
                "{kind:?}: {name} not poisoned"
            );
        }
    }
}

#[test]
fn launch_cost_runs_on_the_interpreter() {
    let dev = Device::interpreter();
    let ops = Ops::new(&dev);
    let c = super::measure::launch_cost(&ops, 5, 3).unwrap();
    assert_eq!((c.launches, c.rounds), (5, 3));
    assert!(c.launch_us > 0.0 && c.op_us > 0.0 && c.two_launch_op_us > 0.0);
    assert_eq!(c.bare_us, None);
}

#[test]
fn every_bundled_kernel_has_a_compile_time() {
    let ct = super::measure::compile_times(kgen_core::Arch::Sm90a, 1);
    let files: std::collections::HashSet<&str> = ct.iter().map(|c| c.file.as_str()).collect();
    assert_eq!(
        files.len(),
        crate::bundled::sources().len(),
        "one row per file at least"
    );
    for c in &ct {
        assert_eq!(c.error, None, "{}::{}", c.file, c.kernel);
        assert!(c.median_ms > 0.0 && c.min_ms <= c.median_ms, "{c:?}");
        assert!(c.ptx_lines > 10, "{c:?}");
    }
    assert!(ct.iter().any(|c| c.kernel == "cross_entropy"));
}
