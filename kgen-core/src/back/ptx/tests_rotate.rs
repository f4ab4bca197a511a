//! Fragment rotation (`lower/mma_rotate.rs`): a pipelined `mma.sync` loop of one or two
//! k-steps loads the next stage's first fragments before its last products, with one
//! block barrier per iteration; loops of other shapes are left as they were. Every
//! kernel is assembled by ptxas where it is installed.

use super::tests::{assemble, loop_body};
use crate::{compile, Arch, CompileOptions, SourceFile};

/// A user's GEMM loop (docs/LANGUAGE.md): `load`, `dot`, `store`.
const GEMM: &str = r#"
kernel mm<BM: int = 128, BN: int = 128, BK: int = 32, TB: bool = false>(
    a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>,
    c: tensor<bf16, 2, contiguous>,
) {
    let pm = bid(0);
    let pn = bid(1);
    let mut acc = zeros([BM, BN], f32);
    for kt in 0..cdiv(shape(a, 1), BK) {
        let ta = load(a, [pm, kt], [BM, BK]);
        let mut tb = zeros([BK, BN], bf16);
        if TB {
            tb = transpose(load(b, [pn, kt], [BN, BK]));
        } else {
            tb = load(b, [kt, pn], [BK, BN]);
        }
        acc = dot(ta, tb, acc);
    }
    store(c, [pm, pn], acc as bf16);
}
"#;

fn gemm_ptx(arch: Arch, defines: &[(&str, &str)], warps: u32, stages: u32) -> String {
    let file = SourceFile::new("mm.kg", GEMM);
    let mut o = CompileOptions::new(arch);
    for (k, v) in defines {
        o = o.define(k, v);
    }
    o.num_warps = Some(warps);
    o.num_stages = Some(stages);
    o.no_tma = true;
    compile(&file, &o)
        .unwrap_or_else(|d| panic!("{}", d.render(&file)))
        .ptx
}

fn position(body: &str, pat: &str) -> usize {
    body.find(pat)
        .unwrap_or_else(|| panic!("no `{pat}` in the loop:\n{body}"))
}

#[test]
fn a_two_step_loop_carries_its_first_fragments_across_one_barrier() {
    for (tb, stages) in [("false", 3), ("true", 3), ("false", 4)] {
        let ptx = gemm_ptx(Arch::Sm80, &[("TB", tb)], 4, stages);
        assert!(ptx.contains("fragments carried"), "{ptx}");
        let body = loop_body(&ptx);
        // One wait and one barrier per iteration, in the dot: after every copy of the
        // iteration is committed, before the last k-step's products.
        assert_eq!(body.matches("bar.sync").count(), 1, "{body}");
        assert_eq!(body.matches("cp.async.wait_group").count(), 1, "{body}");
        let wait = position(body, "cp.async.wait_group");
        let bar = position(body, "bar.sync");
        let last_commit = body.rfind("cp.async.commit_group").expect("commits");
        assert!(last_commit < wait && wait < bar, "{body}");
        // The head's wait is unchanged (S - 2 stages of two groups pending).
        let pending = 2 * (stages - 2);
        assert!(
            body.contains(&format!("cp.async.wait_group {pending};")),
            "{body}"
        );
        // 64 x 64 per warp, 2 k-steps: 4 A + 4 B ldmatrix.x4 per k-step. The loop loads
        // k-step 1 of this stage and k-step 0 of the next (after the barrier); k-step 0
        // of the first stage is loaded before the loop.
        assert_eq!(body.matches("ldmatrix").count(), 16, "{body}");
        let after_bar = &body[bar..];
        assert_eq!(after_bar.matches("ldmatrix").count(), 8, "{body}");
        // The last k-step's 32 products follow the barrier; k-step 0's 32 precede it.
        assert_eq!(after_bar.matches("mma.sync.aligned").count(), 32, "{body}");
        assert_eq!(
            body[..bar].matches("mma.sync.aligned").count(),
            32,
            "{body}"
        );
        let head = &ptx[..ptx.find(body).expect("the loop")];
        let pre = &head[head.rfind("cp.async.commit_group").expect("the prologue")..];
        assert_eq!(pre.matches("bar.sync").count(), 1, "{pre}");
        assert_eq!(pre.matches("ldmatrix").count(), 8, "{pre}");
        assemble(&ptx, "sm_80", &format!("rotated_gemm_tb{tb}_s{stages}"));
    }
}

#[test]
fn loops_of_more_k_steps_and_wgmma_loops_are_not_rotated() {
    // BK = 64: four k-steps (one barrier's latency is spread over more products).
    let ptx = gemm_ptx(Arch::Sm80, &[("BK", "64")], 4, 3);
    assert!(!ptx.contains("fragments carried"), "{ptx}");
    let body = loop_body(&ptx);
    assert_eq!(body.matches("bar.sync").count(), 1, "{body}");
    assert!(
        position(body, "bar.sync") < position(body, "ldmatrix"),
        "{body}"
    );
    // wgmma reads shared memory itself (sm_90a, every warp 16 rows).
    let ptx = gemm_ptx(Arch::Sm90a, &[("BN", "128"), ("BM", "128")], 8, 4);
    assert!(ptx.contains("wgmma.mma_async"), "{ptx}");
    assert!(!ptx.contains("fragments carried"), "{ptx}");
}

#[test]
fn small_warp_tiles_rotate_too() {
    // 32 x 32 on 4 warps: 16 x 16 per warp, one A and one B ldmatrix per k-step.
    let ptx = gemm_ptx(Arch::Sm80, &[("BM", "32"), ("BN", "32")], 4, 3);
    assert!(ptx.contains("fragments carried"), "{ptx}");
    let body = loop_body(&ptx);
    let bar = position(body, "bar.sync");
    assert_eq!(body.matches("bar.sync").count(), 1, "{body}");
    assert_eq!(body[bar..].matches("ldmatrix").count(), 2, "{body}");
    assemble(&ptx, "sm_80", "rotated_gemm_32x32");
}
