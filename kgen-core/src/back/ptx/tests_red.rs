//! Vector reductions (`lower/pointwise_vec.rs`): an f32 `atomic_add` whose old values
//! nobody reads adds each run of 2 or 4 consecutive words a thread holds with one
//! `red.global.add.v2.f32` / `.v4.f32` on sm_90a (PTX ISA 8.1, so the module's
//! `.version` rises); sm_80, i32, and an `atomic_add` whose result is read stay one
//! element per instruction. Every kernel is assembled by ptxas where it is installed.

use super::tests::assemble;
use crate::{compile, Arch, CompileOptions, SourceFile};

/// A split-K style accumulation of a [16, 64] tile (8 elements a thread at 4 warps).
/// `MASK`: masked at the output's edges (a runtime extent, so the mask varies inside a
/// run). `OLD`: the old values are read (stored to `prev`). `I32`: integer tiles.
const ACCUMULATE: &str = r#"
kernel accumulate<MASK: bool = true, OLD: bool = false, I32: bool = false>(
    x: tensor<f32, 3, contiguous>,
    out: tensor<f32, 2, contiguous>,
    prev: tensor<f32, 2, contiguous>,
    hist: tensor<i32, 2, contiguous>,
) {
    let rows = expand_dims(arange(0, 16) + bid(0) * 16, 1) + zeros([16, 64], i32);
    let cols = expand_dims(arange(0, 64) + bid(1) * 64, 0) + zeros([16, 64], i32);
    let t = load(x, [bid(2), bid(0), bid(1)], [1, 16, 64]).reshape([16, 64]) * 2.0;
    if I32 {
        atomic_add(hist, [rows, cols], t as i32);
    } else if OLD {
        let old = atomic_add(out, [rows, cols], t);
        store(prev, [bid(0), bid(1)], old);
    } else if MASK {
        atomic_add(out, [rows, cols], t, mask = rows < shape(out, 0) && cols < shape(out, 1));
    } else {
        atomic_add(out, [rows, cols], t);
    }
}
"#;

fn accumulate_ptx(arch: Arch, mask: bool, old: bool, i32: bool) -> String {
    let file = SourceFile::new("accumulate.kg", ACCUMULATE);
    let b = |v: bool| if v { "true" } else { "false" };
    let mut o = CompileOptions::new(arch)
        .define("MASK", b(mask))
        .define("OLD", b(old))
        .define("I32", b(i32));
    o.num_warps = Some(4);
    let ptx = compile(&file, &o)
        .unwrap_or_else(|d| panic!("{}", d.render(&file)))
        .ptx;
    let name = format!("accumulate_{mask}_{old}_{i32}");
    if let Some(log) = assemble(&ptx, arch.name(), &name) {
        assert!(
            log.contains("0 bytes spill stores") && log.contains("0 bytes stack frame"),
            "{name} ({arch:?}) spills:\n{log}"
        );
    }
    ptx
}

fn count(ptx: &str, needle: &str) -> usize {
    ptx.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn an_unread_f32_atomic_add_reduces_whole_runs_on_sm_90a() {
    let ptx = accumulate_ptx(Arch::Sm90a, false, false, false);
    // 16 x 64 over 128 threads: 8 elements a thread, two runs of 4 consecutive words.
    assert_eq!(count(&ptx, "red.global.add.v4.f32"), 2, "{ptx}");
    assert_eq!(count(&ptx, "red.global.add.f32"), 0, "{ptx}");
    assert_eq!(count(&ptx, "atom.global"), 0, "{ptx}");
    assert!(ptx.contains(".version 8.1"), "{ptx}");
}

#[test]
fn a_mask_that_cuts_a_run_adds_its_elements_one_by_one() {
    let ptx = accumulate_ptx(Arch::Sm90a, true, false, false);
    // Each run: one vector where all four are masked in, else each element alone.
    assert_eq!(count(&ptx, "red.global.add.v4.f32"), 2, "{ptx}");
    assert_eq!(count(&ptx, "red.global.add.f32"), 8, "{ptx}");
}

#[test]
fn sm_80_reads_old_values_and_integers_stay_one_element_per_instruction() {
    let sm80 = accumulate_ptx(Arch::Sm80, false, false, false);
    assert_eq!(count(&sm80, "red.global.add.f32"), 8, "{sm80}");
    assert_eq!(count(&sm80, ".v4.f32"), 0, "{sm80}");
    assert!(sm80.contains(".version 8.0"), "{sm80}");
    let old = accumulate_ptx(Arch::Sm90a, false, true, false);
    assert_eq!(count(&old, "atom.global.add.f32"), 8, "{old}");
    assert_eq!(count(&old, "red.global"), 0, "{old}");
    assert!(old.contains(".version 8.0"), "{old}");
    let int = accumulate_ptx(Arch::Sm90a, false, false, true);
    assert_eq!(count(&int, "red.global.add.s32"), 8, "{int}");
    assert_eq!(count(&int, "red.global.add.v"), 0, "{int}");
}
