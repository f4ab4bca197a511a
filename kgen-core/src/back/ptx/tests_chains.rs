//! Chained tensor-core products (attention's `S = Q·Kᵀ`, `P = exp2(S - m)`, `O += P·V`):
//! the layouts `dot_chains` picks, the operands `passes::resident` keeps in shared
//! memory, the pipelined rank-3 tiles, and wgmma's register-sourced A on sm_90a. Every
//! kernel is assembled by ptxas where it is installed.

use super::tests::{assemble, loop_body};
use crate::ir::Op;
use crate::{compile, compile_to_ir, Arch, CompileOptions, SourceFile};

/// A one-head attention forward written as a user would: Q loaded once, K and V tiles
/// of a rank-3 tensor per iteration, an online softmax, P·V.
const ATTN: &str = r#"
kernel attn<D: int = 64, BM: int = 64, BN: int = 64>(
    q: tensor<bf16, 3, contiguous>, k: tensor<bf16, 3, contiguous>,
    v: tensor<bf16, 3, contiguous>, o: tensor<bf16, 3, contiguous>,
) {
    let qb = bid(0);
    let h = bid(1);
    let s_k = shape(k, 1);
    let qt = load(q, [h, qb, 0], [1, BM, D]).reshape([BM, D]);
    let mut m = full([BM], -inf, f32);
    let mut l = zeros([BM], f32);
    let mut acc = zeros([BM, D], f32);
    for j in 0..cdiv(s_k, BN) {
        let kt = load(k, [h, j, 0], [1, BN, D]).reshape([BN, D]);
        let vt = load(v, [h, j, 0], [1, BN, D]).reshape([BN, D]);
        let cols = arange(0, BN) + j * BN;
        let s = where(expand_dims(cols < s_k, 0), dot(qt, transpose(kt), zeros([BM, BN], f32)), -inf);
        let m_new = maximum(m, max(s, axis = 1));
        let alpha = exp2(m - m_new);
        let p = exp2(s - expand_dims(m_new, 1));
        l = l * alpha + sum(p, 1);
        acc = dot(p as bf16, vt, acc * expand_dims(alpha, 1));
        m = m_new;
    }
    store(o, [h, qb, 0], reshape((acc * expand_dims(fdiv(1.0, l), 1)) as bf16, [1, BM, D]));
}
"#;

fn opts(arch: Arch, warps: Option<u32>) -> CompileOptions {
    let mut o = CompileOptions::new(arch);
    o.num_warps = warps;
    o
}

fn ptx(arch: Arch, warps: Option<u32>) -> String {
    let file = SourceFile::new("attn.kg", ATTN);
    compile(&file, &opts(arch, warps))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)))
        .ptx
}

/// Both products put every warp along M, so nothing in the loop goes through shared
/// memory but the staged K/V tiles: no layout conversion, the row max and sum are lane
/// shuffles, and P is the second product's A operand as it is (on sm_80, `mma.sync`
/// with no `ldmatrix` for A).
#[test]
fn the_loop_of_a_chain_converts_nothing() {
    let p = ptx(Arch::Sm80, None);
    let body = loop_body(&p);
    assert!(
        !body.contains("layout conversion"),
        "a conversion in the loop:\n{body}"
    );
    assert!(!body.contains("st.shared"), "{body}");
    assert!(body.contains("shfl.sync.bfly"), "{body}");
    assert!(body.contains("mma.sync.aligned.m16n8k16"), "{body}");
    // Q (resident), K (ldmatrix) and V (ldmatrix.trans): B of each product and A of the
    // first; P needs none.
    assert!(
        body.contains("ldmatrix.sync.aligned.m8n8.x4.trans"),
        "{body}"
    );
    // The default warps of a chain: the two accumulators' 8192 elements, 4 warps of 16
    // rows each.
    assert!(p.contains(".maxntid 128, 1, 1"), "{p}");
    assemble(&p, "sm_80", "chains_attn_sm80");
}

/// Q, loaded once before the loop, lives in a one-slot shared buffer that both targets
/// read with `ldmatrix` / a wgmma descriptor, and the rank-3 K/V tiles are pipelined into
/// rings of 2-D slots.
#[test]
fn loop_invariant_operands_are_resident_and_rank_3_tiles_are_staged() {
    let file = SourceFile::new("attn.kg", ATTN);
    let (f, _) = compile_to_ir(&file, &opts(Arch::Sm80, None))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let by_name = |n: &str| f.scratch.iter().find(|b| b.name == n);
    let q = by_name("resident_q").expect("Q in shared memory");
    assert_eq!(
        (q.slots, q.slot_shape.as_slice(), q.shared),
        (1, &[64, 64][..], true)
    );
    for n in ["stage_k", "stage_v"] {
        let b = by_name(n).unwrap_or_else(|| panic!("{n} staged: {:?}", f.scratch));
        assert_eq!(b.slot_shape, vec![64, 64], "{n}");
        assert!(b.slots >= 2, "{n}");
    }
    // No tile load is left: every operand comes from a fetch.
    let mut loads = 0;
    crate::ir::visit_insts(&f, vec![&f.body], |op| {
        if let Op::Load { .. } = op {
            loads += 1;
        }
    });
    assert_eq!(loads, 0, "{f}");
}

/// On sm_90a both products run on wgmma: `Q·Kᵀ` from two descriptors, `P·V` with P from
/// registers (the register-sourced form has no transpose flag for A).
#[test]
fn hopper_takes_p_from_registers() {
    let p = ptx(Arch::Sm90a, None);
    let body = loop_body(&p);
    let wg: Vec<&str> = body
        .lines()
        .filter(|l| l.trim_start().starts_with("wgmma.mma_async"))
        .collect();
    assert!(!wg.is_empty(), "{body}");
    let from_regs = wg.iter().filter(|l| l.contains("}, {%r")).count();
    let from_smem = wg.len() - from_regs;
    // D = 64: 4 k-steps of Q·Kᵀ; BN = 64: 4 k-steps of P·V.
    assert_eq!((from_smem, from_regs), (4, 4), "{body}");
    assert!(!body.contains("mma.sync"), "{body}");
    assert!(!body.contains("layout conversion"), "{body}");
    assemble(&p, "sm_90a", "chains_attn_sm90a");
}

/// A product whose result is only stored (no chain) keeps the square warp grid.
#[test]
fn a_lone_product_keeps_the_square_grid() {
    let src = r#"
kernel mm(a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<f32, 2, contiguous>) {
    let mut acc = zeros([128, 128], f32);
    for kk in 0..cdiv(shape(a, 1), 32) {
        acc = dot(load(a, [bid(0), kk], [128, 32]), load(b, [kk, bid(1)], [32, 128]), acc);
    }
    store(c, [bid(0), bid(1)], acc);
}
"#;
    let file = SourceFile::new("mm.kg", src);
    let (f, spec) = compile_to_ir(&file, &opts(Arch::Sm80, Some(8))).expect("compiles");
    assert!(super::dot_chains::row_dots(&f, spec.num_warps).is_empty());
}

/// Scores computed one block ahead (`tests/user_kernels/attention_ahead.kg`): the
/// carried scores still feed P·V's left operand (chains follow loop-carried values) and
/// the row statistics carried beside them take the scores' rows, so the loop converts
/// nothing; on sm_90a the next block's `Q·Kᵀ` group stays in flight through the softmax
/// and P·V's issue, and is waited for (`wait_group 1`, P·V still running) only where
/// the loop carries its result.
#[test]
fn scores_one_block_ahead_stay_in_flight_through_the_softmax() {
    let src = include_str!("../../../../tests/user_kernels/attention_ahead.kg");
    let file = SourceFile::new("attention_ahead.kg", src);
    for arch in [Arch::Sm90a, Arch::Sm80] {
        let p = compile(&file, &opts(arch, None))
            .unwrap_or_else(|d| panic!("{}", d.render(&file)))
            .ptx;
        let body = loop_body(&p);
        assert!(!body.contains("layout conversion"), "{body}");
        if arch == Arch::Sm90a {
            let commits: Vec<usize> = body
                .match_indices("wgmma.commit_group")
                .map(|(i, _)| i)
                .collect();
            assert_eq!(commits.len(), 2, "{body}");
            // Between the scores' commit and P·V's: the softmax, and no wait.
            let between = &body[commits[0]..commits[1]];
            assert!(!between.contains("wgmma.wait_group"), "{between}");
            assert!(between.contains("ex2.approx"), "{between}");
            let after = &body[commits[1]..];
            assert!(
                after.contains("wgmma.wait_group.sync.aligned 1;"),
                "{after}"
            );
            assemble(&p, "sm_90a", "chains_attn_ahead_sm90a");
        } else {
            assemble(&p, "sm_80", "chains_attn_ahead_sm80");
        }
    }
}
