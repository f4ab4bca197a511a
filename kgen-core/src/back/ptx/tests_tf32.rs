//! TF32 `dot` in the PTX back end: a GEMM with `input_precision = tf32` / `tf32x3`
//! compiled from source for sm_80 and sm_90a in every operand orientation (staged in
//! the pipeline's ring or computed in registers), checked for the instructions each path
//! must use, and assembled by the real `ptxas` with zero spills and zero stack.

use super::tests::assemble;
use crate::pipeline::{compile, CompileOptions};
use crate::span::SourceFile;
use crate::target::Arch;

/// A GEMM whose operands may be stored transposed (`TA`: a is `[K, M]`, `TB`: b is
/// `[N, K]`), and may be scaled in registers first (`SCALE`: the `dot` then reads
/// registers, not the staged tiles).
const GEMM: &str = r#"
kernel gemm_tf32<BM: int = 64, BN: int = 64, BK: int = 32, TA: bool = false,
                 TB: bool = false, X3: bool = false, SCALE: bool = false>(
    a: tensor<f32, 2, contiguous>, b: tensor<f32, 2, contiguous>, c: tensor<f32, 2, contiguous>,
) {
    let mut k = shape(a, 1);
    if TA {
        k = shape(a, 0);
    }
    let mut acc = zeros([BM, BN], f32);
    for kt in 0..cdiv(k, BK) {
        let mut ta = zeros([BM, BK], f32);
        if TA {
            ta = transpose(load(a, [kt, bid(0)], [BK, BM]));
        } else {
            ta = load(a, [bid(0), kt], [BM, BK]);
        }
        let mut tb = zeros([BK, BN], f32);
        if TB {
            tb = transpose(load(b, [bid(1), kt], [BN, BK]));
        } else {
            tb = load(b, [kt, bid(1)], [BK, BN]);
        }
        if SCALE {
            ta = ta * 0.5;
            tb = tb * 2.0;
        }
        if X3 {
            acc = dot(ta, tb, acc, input_precision = tf32x3);
        } else {
            acc = dot(ta, tb, acc, input_precision = tf32);
        }
    }
    store(c, [bid(0), bid(1)], acc);
}
"#;

fn gemm(arch: Arch, defines: &[(&str, &str)]) -> String {
    let file = SourceFile::new("gemm_tf32.kg", GEMM);
    let mut opts = CompileOptions {
        num_warps: Some(4),
        ..CompileOptions::new(arch)
    };
    for (k, v) in defines {
        opts = opts.define(k, v);
    }
    let k = compile(&file, &opts).unwrap_or_else(|d| panic!("{defines:?}: {}", d.render(&file)));
    assemble(&k.ptx, arch.name(), "gemm_tf32");
    if let Some(dir) = std::env::var_os("KGEN_DUMP_PTX") {
        let name = defines
            .iter()
            .map(|(k, v)| format!("_{k}{v}"))
            .collect::<String>();
        let path = std::path::PathBuf::from(dir).join(format!("gemm_tf32{name}_{arch}.ptx"));
        std::fs::write(path, &k.ptx).expect("dump ptx");
    }
    k.ptx
}

fn count(ptx: &str, what: &str) -> usize {
    ptx.matches(what).count()
}

/// The loop's code from the `dot` on (the epilogue's conversion through shared memory
/// reads with `ld.shared.b32` too).
fn dot_part(ptx: &str) -> &str {
    let start = ptx.find("// dot:").unwrap_or(0);
    // The loop's drain: `cp.async.wait_group 0`, or (TMA) the rings' invalidation.
    let end = ["cp.async.wait_group 0", "mbarrier.inval"]
        .iter()
        .filter_map(|m| ptx[start..].find(m))
        .min()
        .map_or(ptx.len(), |e| start + e);
    &ptx[start..end]
}

#[test]
fn a_tf32_gemm_runs_on_m16n8k8_in_every_orientation_on_both_targets() {
    for arch in Arch::ALL {
        for (ta, tb) in [
            ("false", "false"),
            ("true", "false"),
            ("false", "true"),
            ("true", "true"),
        ] {
            let ptx = gemm(arch, &[("TA", ta), ("TB", tb)]);
            let what = format!("{arch} TA={ta} TB={tb}");
            // 64 x 64 on 2 x 2 warps of 32 x 32: 2 x 4 instructions per k-step of 8.
            assert_eq!(
                count(&ptx, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
                4 * 8,
                "{what}"
            );
            assert!(
                !ptx.contains("m16n8k16") && !ptx.contains("wgmma"),
                "{what}"
            );
            // Pipelined: cp.async on sm_80, the TMA copy engine on sm_90a.
            let copy = match arch {
                Arch::Sm80 => "cp.async.cg.shared.global",
                Arch::Sm90a => "cp.async.bulk.tensor.2d",
            };
            assert!(ptx.contains(copy), "{what}: pipelined");
            // Every fragment register rounded: per k-step 2 A tiles x 4 + 4 B tiles x 2.
            assert_eq!(count(&ptx, "cvt.rna.tf32.f32"), 4 * 16, "{what}");
            // K-contiguous operands by ldmatrix (never .trans: it would split the
            // 32-bit elements), the others element by element.
            assert!(
                !ptx.contains("ldmatrix.sync.aligned.m8n8.x4.trans"),
                "{what}"
            );
            let a_ld = ta == "false";
            let b_ld = tb == "true";
            let ldmatrix = count(&ptx, "ldmatrix.sync.aligned.m8n8");
            let want = 4 * (if a_ld { 2 } else { 0 } + if b_ld { 2 } else { 0 });
            assert_eq!(ldmatrix, want, "{what}: ldmatrix per k-step");
            let elements = count(dot_part(&ptx), "ld.shared.b32");
            let want = 4 * (if a_ld { 0 } else { 8 } + if b_ld { 0 } else { 8 });
            assert_eq!(elements, want, "{what}: ld.shared.b32 per k-step");
        }
    }
}

#[test]
fn tf32x3_issues_three_products_and_splits_each_operand() {
    for arch in Arch::ALL {
        let ptx = gemm(arch, &[("X3", "true")]);
        assert_eq!(
            count(&ptx, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
            3 * 4 * 8,
            "{arch}"
        );
        // hi and lo of each of the 16 fragment registers per k-step.
        assert_eq!(count(&ptx, "cvt.rna.tf32.f32"), 2 * 4 * 16, "{arch}");
        assert_eq!(count(&ptx, "sub.rn.f32"), 4 * 16, "{arch}");
    }
}

#[test]
fn register_operands_of_a_tf32_dot_are_rounded_too() {
    for arch in Arch::ALL {
        let ptx = gemm(arch, &[("SCALE", "true"), ("BK", "16")]);
        assert_eq!(
            count(&ptx, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
            2 * 8,
            "{arch}"
        );
        assert!(
            !ptx.contains("ldmatrix"),
            "{arch}: the operands are registers"
        );
        assert_eq!(count(&ptx, "cvt.rna.tf32.f32"), 2 * 16, "{arch}");
    }
}

#[test]
fn a_tf32_dot_too_small_for_the_tensor_cores_rounds_its_fma_operands() {
    // [16, 8] on 4 warps does not hold an m16n8k8 per warp: the FMA path, with the same
    // rounding.
    for arch in Arch::ALL {
        for x3 in ["false", "true"] {
            let file = SourceFile::new("gemm_tf32.kg", GEMM);
            let opts = CompileOptions {
                num_warps: Some(4),
                ..CompileOptions::new(arch)
            }
            .define("BM", 16)
            .define("BN", 8)
            .define("BK", 8)
            .define("X3", x3);
            let k = compile(&file, &opts).unwrap_or_else(|d| panic!("{}", d.render(&file)));
            assemble(&k.ptx, arch.name(), "gemm_tf32_fma");
            if let Some(dir) = std::env::var_os("KGEN_DUMP_PTX") {
                let path = std::path::PathBuf::from(dir).join(format!("fma_x3{x3}_{arch}.ptx"));
                std::fs::write(path, &k.ptx).expect("dump ptx");
            }
            assert!(!k.ptx.contains("mma.sync"), "{arch}");
            assert!(k.ptx.contains("fma.rn.f32"), "{arch}");
            // Per k: each A and B element a thread reads is rounded (tf32x3: hi, and lo
            // from one subtraction), then one FMA (tf32x3: three) per accumulator.
            let loads = count(&k.ptx, "ld.shared.b32");
            let (c, s) = (
                count(&k.ptx, "cvt.rna.tf32.f32"),
                count(&k.ptx, "sub.rn.f32"),
            );
            let fmas = count(&k.ptx, "fma.rn.f32");
            if x3 == "true" {
                assert_eq!((c, s), (2 * loads, loads), "{arch} x3");
                assert_eq!(fmas % 3, 0, "{arch} x3");
            } else {
                assert_eq!((c, s), (loads, 0), "{arch}");
            }
        }
    }
}

#[test]
fn an_exact_f32_dot_stays_on_fma() {
    let src = GEMM.replace(
        "acc = dot(ta, tb, acc, input_precision = tf32);",
        "acc = dot(ta, tb, acc, input_precision = ieee);",
    );
    let file = SourceFile::new("gemm_f32.kg", src);
    let k = compile(
        &file,
        &CompileOptions::new(Arch::Sm80)
            .define("BM", 32)
            .define("BN", 32),
    )
    .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert!(!k.ptx.contains("mma.sync") && !k.ptx.contains("cvt.rna.tf32"));
    assert!(k.ptx.contains("fma.rn.f32"));
}

#[test]
fn large_tf32_tiles_assemble_without_spills() {
    for arch in Arch::ALL {
        for (bm, bn, bk, warps) in [(128, 128, 32, 8), (128, 64, 32, 4), (64, 128, 16, 4)] {
            for (ta, tb, x3) in [
                ("false", "false", "false"),
                ("true", "true", "false"),
                ("false", "false", "true"),
            ] {
                let file = SourceFile::new("gemm_tf32.kg", GEMM);
                let opts = CompileOptions {
                    num_warps: Some(warps),
                    ..CompileOptions::new(arch)
                }
                .define("BM", bm)
                .define("BN", bn)
                .define("BK", bk)
                .define("TA", ta)
                .define("TB", tb)
                .define("X3", x3);
                let k = compile(&file, &opts).unwrap_or_else(|d| panic!("{}", d.render(&file)));
                let report = assemble(&k.ptx, arch.name(), "gemm_tf32_large");
                if std::env::var_os("KGEN_VERBOSE").is_some() {
                    let regs = report
                        .as_deref()
                        .and_then(|r| r.lines().find(|l| l.contains("registers")))
                        .unwrap_or("")
                        .to_string();
                    eprintln!("{arch} {bm}x{bn}x{bk} w{warps} TA={ta} TB={tb} X3={x3}: {regs}");
                }
            }
        }
    }
}
