//! PTX and IR snapshots of every bundled kernel (`kernels-src/<name>.kg`), one PTX
//! snapshot per target, and every PTX assembled by the real ptxas with zero spills and
//! zero stack. Review changes with `cargo insta review`.

mod common;

use kgen_core::{
    compile, compile_to_ir, source_targets, Arch, CompileOptions, ErrorCode, SourceFile,
};

#[test]
fn bundled_kernels_ptx_snapshots_and_ptxas() {
    let ptxas = common::ptxas();
    let kernels = common::bundled_kernels();
    assert!(
        kernels.len() >= 6,
        "expected the bundled kernels, found {}",
        kernels.len()
    );
    let mut failures = Vec::new();
    for (stem, text) in &kernels {
        let file = SourceFile::new(format!("kernels-src/{stem}.kg"), text.clone());
        let targets = source_targets(text);
        for arch in Arch::ALL {
            if !targets.contains(&arch) {
                // A file for other targets only: this one refuses it, with a diagnostic.
                match compile(&file, &CompileOptions::new(arch)) {
                    Err(d) if d.0.iter().any(|x| x.code == ErrorCode::Unsupported) => {}
                    other => failures.push(format!(
                        "{stem} {arch}: expected an Unsupported error, got {:?}",
                        other.map(|k| k.entry)
                    )),
                }
                continue;
            }
            let compiled = match compile(&file, &CompileOptions::new(arch)) {
                Ok(k) => k,
                Err(d) => {
                    failures.push(format!(
                        "{stem} {arch}: compile failed:\n{}",
                        d.render(&file)
                    ));
                    continue;
                }
            };
            insta::assert_snapshot!(format!("ptx_{stem}_{arch}"), compiled.ptx);
            if let Some(ptxas) = &ptxas {
                match common::assemble(ptxas, &compiled.ptx, arch.name(), stem) {
                    Ok(r) => {
                        if r.spill_stores + r.spill_loads + r.stack_frame_bytes > 0 {
                            failures.push(format!("{stem} {arch}: local memory used:\n{}", r.raw));
                        }
                    }
                    Err(e) => failures.push(format!("{stem} {arch}: ptxas rejected the PTX:\n{e}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn bundled_kernels_ir_snapshots() {
    for (stem, text) in common::bundled_kernels() {
        let file = SourceFile::new(format!("kernels-src/{stem}.kg"), text);
        // The file's first kernel with its defaults; the IR does not depend on the arch.
        let (func, _) = compile_to_ir(&file, &CompileOptions::new(Arch::Sm90a))
            .unwrap_or_else(|d| panic!("{}", d.render(&file)));
        insta::assert_snapshot!(format!("ir_{stem}"), func.to_string());
    }
}

/// The TF32 `dot` user kernels (`tests/user_kernels/`, which `tools/run-doc-examples.py`
/// also runs on a GPU against the interpreter): a GEMM on `mma.sync.m16n8k8.tf32` with
/// both operands staged (A by ldmatrix, B element by element), its `tf32x3` form with
/// both stored transposed (A element by element, B by ldmatrix), and a product of
/// register operands. PTX snapshots per target for the two GEMMs; all three assembled by
/// the real ptxas with zero spills and zero stack.
#[test]
fn tf32_user_kernels_ptx_snapshots_and_ptxas() {
    let ptxas = common::ptxas();
    let mut failures = Vec::new();
    for (stem, snapshot) in [
        ("gemm_tf32", true),
        ("gemm_tf32x3_transposed", true),
        ("dot_tf32_registers", false),
    ] {
        let path = common::repo_root().join(format!("tests/user_kernels/{stem}.kg"));
        let text = std::fs::read_to_string(&path).unwrap();
        let file = SourceFile::new(format!("tests/user_kernels/{stem}.kg"), text);
        for arch in Arch::ALL {
            let compiled = compile(&file, &CompileOptions::new(arch))
                .unwrap_or_else(|d| panic!("{}", d.render(&file)));
            assert!(
                compiled
                    .ptx
                    .contains("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
                "{stem} {arch}: not on the tf32 tensor cores"
            );
            if snapshot {
                insta::assert_snapshot!(format!("ptx_user_{stem}_{arch}"), compiled.ptx);
            }
            if let Some(ptxas) = &ptxas {
                match common::assemble(ptxas, &compiled.ptx, arch.name(), stem) {
                    Ok(r) => {
                        if r.spill_stores + r.spill_loads + r.stack_frame_bytes > 0 {
                            failures.push(format!("{stem} {arch}: local memory used:\n{}", r.raw));
                        }
                    }
                    Err(e) => failures.push(format!("{stem} {arch}: ptxas rejected the PTX:\n{e}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The language cases' kernels (`src/cases/lang.kg`: erf, powers, maximum, typed
/// constants, ...), with every case's specialization, assemble for both targets with
/// zero spills and zero stack.
#[test]
fn language_case_kernels_assemble() {
    let ptxas = common::ptxas();
    let mut seen = std::collections::HashSet::new();
    let mut failures = Vec::new();
    for case in kgen::cases::all_cases(1, kgen::cases::SizeSet::Full) {
        if case.kernel != "lang" {
            continue;
        }
        let file = case.source();
        for arch in Arch::ALL {
            let opts = case.compile_options(arch);
            let k = match compile(&file, &opts) {
                Ok(k) => k,
                Err(d) => {
                    failures.push(format!("{}: {}", case.label, d.render(&file)));
                    continue;
                }
            };
            if !seen.insert((k.entry.clone(), arch)) {
                continue;
            }
            if let Some(ptxas) = &ptxas {
                match common::assemble(ptxas, &k.ptx, arch.name(), &k.entry) {
                    Ok(r) if r.spill_stores + r.spill_loads + r.stack_frame_bytes > 0 => {
                        failures.push(format!("{} {arch}: local memory used:\n{}", k.entry, r.raw))
                    }
                    Ok(_) => {}
                    Err(e) => failures.push(format!("{} {arch}: ptxas rejected it:\n{e}", k.entry)),
                }
            }
        }
    }
    assert!(seen.len() >= 20, "only {} specializations", seen.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The warp-specialized attention kernels the op launches on sm_90a at D = 128
/// (`ops::attention`'s `specialized` candidates): the forward (BM = BN = 128) and dQ
/// (BM = 128, BN = 64), each on two consumer warpgroups and a TMA producer warpgroup.
/// The snapshots pin where each slot's release (`mbarrier.arrive`) and each product's
/// wait land (`back/ptx/wgmma_waits.rs`): in dQ, `dP = dO·Vᵀ` stays in flight through
/// the exponentials, and V's release waits for it; in the lagged forward (`LAG`), P·V
/// runs beside the softmax, its wait pinned after it by a `pmevent`, and P crosses the
/// back edge packed (`back/ptx/lower/control.rs`). Assembled by ptxas without spills.
#[test]
fn warp_specialized_attention_ptx_snapshots() {
    let ptxas = common::ptxas();
    let path = common::repo_root().join("kernels-src/attention.kg");
    let file = SourceFile::new(
        "kernels-src/attention.kg",
        std::fs::read_to_string(path).unwrap(),
    );
    let mut failures = Vec::new();
    for (kernel, bn, lag) in [
        ("attention_fwd", 128, false),
        ("attention_fwd", 128, true),
        ("attention_bwd_dq", 64, false),
    ] {
        let mut opts = CompileOptions::new(Arch::Sm90a);
        opts.kernel = Some(kernel.into());
        opts.num_warps = Some(8);
        opts.ws = true;
        opts.defines = vec![
            ("D".into(), "128".into()),
            ("BM".into(), "128".into()),
            ("BN".into(), bn.to_string()),
        ];
        if lag {
            opts.defines.push(("LAG".into(), "true".into()));
        }
        let k = compile(&file, &opts).unwrap_or_else(|d| panic!("{}", d.render(&file)));
        assert!(
            k.ptx.contains("setmaxnreg.inc") && k.ptx.contains("mbarrier.arrive.shared"),
            "{kernel}: not warp-specialized"
        );
        let name = if lag {
            format!("ptx_ws_{kernel}_lag_sm_90a")
        } else {
            format!("ptx_ws_{kernel}_sm_90a")
        };
        insta::assert_snapshot!(name, k.ptx);
        if let Some(ptxas) = &ptxas {
            match common::assemble(ptxas, &k.ptx, "sm_90a", kernel) {
                Ok(r) if r.spill_stores + r.spill_loads + r.stack_frame_bytes > 0 => {
                    failures.push(format!("{kernel}: local memory used:\n{}", r.raw))
                }
                Ok(_) => {}
                Err(e) => failures.push(format!("{kernel}: ptxas rejected it:\n{e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
