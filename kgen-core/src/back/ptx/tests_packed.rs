//! Loop-carried 16-bit tiles carried packed (`lower/control.rs`): a tile read in the loop
//! only as a product's left operand crosses the back edge as `.b32` pairs, which are the
//! product's fragments; any other use keeps it widened. And the deferred `wgmma` wait
//! (`wgmma_waits.rs`): the product that runs beside the softmax is waited for after it,
//! pinned by a `pmevent`. Every kernel is assembled by ptxas where it is installed.

use super::tests::{assemble, loop_body};
use crate::{compile, Arch, CompileOptions, SourceFile};

/// P·V one block behind, as attention's lagged forward: `p` is carried to the next
/// pass's product. With `WIDE`, `p` is also read element-wise, so it stays widened.
const LAGGED: &str = r#"
kernel lagged<T: float = bf16, WIDE: bool = false>(
    a: tensor<T, 2, contiguous>, v: tensor<T, 2, contiguous>,
    o: tensor<f32, 2, contiguous>,
) {
    let mut acc = zeros([64, 64], f32);
    let mut p = zeros([64, 64], T);
    for j in 0..cdiv(shape(v, 0), 64) {
        let vt = load(v, [j, 0], [64, 64]);
        let at = load(a, [0, j], [64, 64]);
        let s = dot(at, transpose(vt), zeros([64, 64], f32));
        acc = dot(p, vt, acc);
        let e = exp2(s - expand_dims(max(s, axis = 1), 1));
        if WIDE {
            acc = acc + p as f32;
        }
        p = e as T;
        acc = acc * 0.5;
    }
    store(o, [0, 0], acc);
}
"#;

fn lagged_ptx(arch: Arch, t: &str, wide: bool) -> String {
    let file = SourceFile::new("lagged.kg", LAGGED);
    let mut o = CompileOptions::new(arch)
        .define("T", t)
        .define("WIDE", if wide { "true" } else { "false" });
    o.num_warps = Some(4);
    let ptx = compile(&file, &o)
        .unwrap_or_else(|d| panic!("{}", d.render(&file)))
        .ptx;
    let name = format!("lagged_{t}_{wide}");
    if let Some(log) = assemble(&ptx, arch.name(), &name) {
        assert!(
            log.contains("0 bytes spill stores") && log.contains("0 bytes stack frame"),
            "{name} ({arch:?}) spills:\n{log}"
        );
    }
    ptx
}

#[test]
fn a_tile_read_only_by_products_is_carried_packed() {
    for arch in [Arch::Sm90a, Arch::Sm80] {
        for (t, cvt) in [("bf16", "cvt.rn.bf16x2.f32"), ("f16", "cvt.rn.f16x2.f32")] {
            let ptx = lagged_ptx(arch, t, false);
            let body = loop_body(&ptx);
            // 64 x 64 over 128 threads: 32 elements, 16 words a thread, packed from the
            // cast's 16-bit halves at the back edge; the product's fragments are the
            // carried words (no conversion of p in the loop).
            assert_eq!(body.matches(cvt).count(), 0, "{arch:?} {t}:\n{body}");
            let packs = body
                .lines()
                .filter(|l| l.contains("mov.b32 %r") && l.contains(", {%rs"))
                .count();
            assert_eq!(packs, 16, "{arch:?} {t}:\n{body}");
            // Nothing widens p in the loop.
            assert!(!body.contains("mov.b32 %f"), "{arch:?} {t}:\n{body}");
        }
    }
}

#[test]
fn a_tile_read_element_wise_stays_widened() {
    for arch in [Arch::Sm90a, Arch::Sm80] {
        let ptx = lagged_ptx(arch, "bf16", true);
        let body = loop_body(&ptx);
        // The product packs p's widened registers itself, every pass.
        assert_eq!(
            body.matches("cvt.rn.bf16x2.f32").count(),
            16,
            "{arch:?}:\n{body}"
        );
    }
}

/// On sm_90a the product of `p` (P·V) runs beside the exponentials of `s`, the work on
/// the scores' product: its wait comes after them, after a `pmevent` that keeps ptxas
/// from hoisting it; the scores' own wait (read at once) gets none.
#[test]
fn the_product_beside_the_softmax_is_waited_for_after_it() {
    let ptx = lagged_ptx(Arch::Sm90a, "bf16", false);
    let body = loop_body(&ptx);
    assert_eq!(body.matches("pmevent").count(), 1, "{body}");
    let fence = body.find("pmevent").unwrap();
    let wait0 = body.find("wgmma.wait_group.sync.aligned 0").unwrap();
    let last_ex2 = body.rfind("ex2.approx").unwrap();
    assert!(last_ex2 < fence && fence < wait0, "{body}");
    assert_eq!(
        body[fence..].lines().nth(1).map(str::trim),
        Some("wgmma.wait_group.sync.aligned 0;"),
        "{body}"
    );
}
