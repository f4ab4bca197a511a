//! TMA fetches: which kernels get them (`tma::plan`), the copy engine's swizzle against
//! the layout every other reader and writer uses (`SharedTile::offset`), and the PTX of a
//! pipelined GEMM on sm_90a (mbarriers, one box per swizzle atom, parity waits, the
//! drain), assembled by ptxas.

use super::swizzle::{SharedTile, Swizzle};
use super::tests::assemble;
use crate::{compile, Arch, CompileOptions, SourceFile};

/// Where the copy engine puts element `(r, c)` of a box of `rows` rows whose inner
/// extent is one swizzle span, written in the terms of the CUDA programming guide's
/// TMA swizzle tables (not through `Swizzle::apply`): a row is `span` bytes; its 16-byte
/// chunk `j` is stored at chunk `j ^ p(r)`, where the pattern `p` repeats every 1024 /
/// 512 / 256 bytes: `r mod 8` for 128 B, `(r / 2) mod 4` for 64 B, `(r / 4) mod 2` for
/// 32 B.
fn tma_box_offset(swizzle: Swizzle, elem: u32, r: u32, c: u32) -> u32 {
    let span = swizzle.bytes();
    let byte = c * elem;
    let (chunk, within) = (byte / 16, byte % 16);
    let p = match swizzle {
        Swizzle::B128 => r % 8,
        Swizzle::B64 => (r / 2) % 4,
        Swizzle::B32 => (r / 4) % 2,
        Swizzle::None => 0,
    };
    r * span + (chunk ^ p) * 16 + within
}

#[test]
fn the_copy_engine_writes_the_layout_ldmatrix_and_wgmma_read() {
    // A slot is copied as one box per atom, atom `a` at `a * atom_bytes`: element
    // (r, c) of the tile is element (r, c mod atom_cols) of box c / atom_cols.
    for elem in [2u32, 4] {
        for rows in [8u32, 64, 128, 256] {
            for cols in [16u32, 32, 64, 128, 256] {
                let tile = SharedTile::new(rows, cols, elem);
                if tile.swizzle == Swizzle::None {
                    continue;
                }
                let ac = tile.atom_cols();
                for r in 0..rows {
                    for c in 0..cols {
                        let tma = (c / ac) * tile.atom_bytes()
                            + tma_box_offset(tile.swizzle, elem, r, c % ac);
                        assert_eq!(tma, tile.offset(r, c), "{tile:?} ({r}, {c})");
                    }
                }
            }
        }
    }
}

const GEMM: &str = r#"
kernel mm<BM: int = 128, BN: int = 256, BK: int = 64>(
    a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>,
) {
    let mut acc = zeros([BM, BN], f32);
    for k in 0..cdiv(shape(a, 1), BK) {
        acc = dot(load(a, [bid(0), k], [BM, BK]), load(b, [k, bid(1)], [BK, BN]), acc);
    }
    store(c, [bid(0), bid(1)], acc as bf16);
}
"#;

fn gemm(arch: Arch, tweak: impl Fn(&mut CompileOptions)) -> crate::CompiledKernel {
    let file = SourceFile::new("mm.kg", GEMM);
    let mut o = CompileOptions::new(arch);
    o.num_warps = Some(8);
    o.num_stages = Some(4);
    tweak(&mut o);
    compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)))
}

#[test]
fn a_pipelined_gemm_on_sm90a_fetches_by_tma_with_one_map_per_operand() {
    let k = gemm(Arch::Sm90a, |_| {});
    let maps: Vec<_> = k
        .abi
        .params
        .iter()
        .filter_map(|p| match &p.slot {
            crate::abi::AbiSlot::TensorMap { param, map } => Some((*param, *map, p.ptx_type)),
            _ => None,
        })
        .collect();
    // a: a [128, 64] tile, 128-byte rows: one 64 x 128 box. b: a [64, 256] tile: four
    // boxes of the 64 columns of one atom by 64 rows. (c's store is `st.global`: TMA
    // stores are opt-in, `a_tile_store_in_a_tma_kernel_is_a_tma_store`.)
    assert_eq!(maps.len(), 2, "{maps:?}");
    assert_eq!(
        (maps[0].0, maps[0].1.box_dims, maps[0].1.swizzle),
        (0, [64, 128], 3)
    );
    assert_eq!(
        (maps[1].0, maps[1].1.box_dims, maps[1].1.swizzle),
        (1, [64, 64], 3)
    );
    assert!(maps.iter().all(|m| m.2 == "tmap"));
    let ptx = &k.ptx;
    assert!(ptx.contains(".param .align 64 .b8 p_a_tmap0[128]"), "{ptx}");
    assert!(ptx.contains("cvta.param.u64"), "{ptx}");
    // No cp.async at all; 4 slots per ring, each with an mbarrier.
    assert!(!ptx.contains("cp.async.cg") && !ptx.contains("cp.async.wait_group"));
    assert_eq!(
        ptx.matches("mbarrier.init.shared::cta.b64").count(),
        8,
        "{ptx}"
    );
    assert_eq!(
        ptx.matches("mbarrier.inval.shared::cta.b64").count(),
        8,
        "{ptx}"
    );
    // Each fetch: one expect_tx of the whole tile, one copy per atom (a 1, b 4), all by
    // thread 0. The prologue fetches 2 stages (wgmma's lag), the loop 1.
    let expects: Vec<&str> = ptx
        .lines()
        .filter(|l| l.contains("mbarrier.arrive.expect_tx"))
        .collect();
    assert_eq!(expects.len(), 6, "{ptx}");
    assert_eq!(
        expects.iter().filter(|l| l.ends_with(", 16384;")).count(),
        3
    );
    assert_eq!(
        expects.iter().filter(|l| l.ends_with(", 32768;")).count(),
        3
    );
    let copies: Vec<&str> = ptx
        .lines()
        .filter(|l| l.contains("cp.async.bulk.tensor.2d.shared::cluster.global"))
        .collect();
    assert_eq!(copies.len(), 3 * 5, "{ptx}");
    assert!(copies
        .iter()
        .chain(&expects)
        .all(|l| l.trim_start().starts_with('@')));
    // Reads wait on their slot's phase; no block barrier sits between a fetch and its
    // reads: one barrier per iteration, the write-after-read one before the copies.
    assert!(
        ptx.contains("mbarrier.try_wait.parity.shared::cta.b64"),
        "{ptx}"
    );
    let body = ptx
        .split("$L1:")
        .nth(1)
        .and_then(|s| s.split("$L2:").next());
    let body = body.expect("the K loop");
    assert_eq!(body.matches("bar.sync").count(), 1, "{body}");
    let bar = body.find("bar.sync").unwrap_or(0);
    let copy = body.find("cp.async.bulk.tensor").unwrap_or(0);
    let wait = body.find("mbarrier.try_wait").unwrap_or(0);
    assert!(bar < copy && copy < wait, "{body}");
    if let Some(log) = assemble(ptx, "sm_90a", "tma_gemm") {
        assert!(log.contains("0 bytes spill stores"), "{log}");
    }
}

#[test]
fn tma_is_used_only_where_every_fetch_can_use_it() {
    // sm_80 has no copy engine; `no_tma` keeps cp.async; so does an operand whose
    // alignment TMA cannot take (8 bytes).
    for k in [
        gemm(Arch::Sm80, |o| o.num_stages = Some(3)),
        gemm(Arch::Sm90a, |o| o.no_tma = true),
        gemm(Arch::Sm90a, |o| o.tensor_align = vec![("b".into(), 8)]),
    ] {
        assert!(!k.ptx.contains("cp.async.bulk"), "{}", k.entry);
        assert!(k.ptx.contains("cp.async.c"), "{}", k.entry);
        assert!(!k.abi.params.iter().any(|p| p.ptx_type == "tmap"));
    }
    assert!(gemm(Arch::Sm90a, |o| o.no_tma = true)
        .entry
        .ends_with("__notma"));
}

/// The persistent form: one block walks tiles `bid(0), bid(0) + num_bids(0), ...`.
const PERSISTENT: &str = r#"
kernel pmm<BM: int = 128, BN: int = 256, BK: int = 64>(
    a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>,
) {
    let tiles_n = cdiv(shape(c, 1), BN);
    let tiles = cdiv(shape(c, 0), BM) * tiles_n;
    for i in 0..cdiv(tiles - bid(0), num_bids(0)) {
        let t = bid(0) + i * num_bids(0);
        let mut acc = zeros([BM, BN], f32);
        for k in 0..cdiv(shape(a, 1), BK) {
            acc = dot(load(a, [t / tiles_n, k], [BM, BK]), load(b, [k, t % tiles_n], [BK, BN]), acc);
        }
        store(c, [t / tiles_n, t % tiles_n], acc as bf16);
    }
}
"#;

#[test]
fn warp_specialization_adds_a_producer_warpgroup_that_alone_copies() {
    for (src, stages) in [(GEMM, 4), (PERSISTENT, 3)] {
        let file = SourceFile::new("ws.kg", src);
        let mut o = CompileOptions::new(Arch::Sm90a);
        o.num_warps = Some(8);
        o.num_stages = Some(stages);
        o.ws = true;
        let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
        let ptx = &k.ptx;
        assert_eq!(k.launch.threads_per_block, 384, "{}", k.entry);
        assert!(ptx.contains(".maxntid 384, 1, 1"));
        assert!(k.entry.ends_with("__ws"));
        // Threads 256.. branch to the producer section after the consumers' `ret`; one
        // of them issues. Every copy sits there, after a wait on the slot's `empty`.
        let (consumers, producer) = ptx.split_once("\tret;\n").expect("two sections");
        assert!(consumers.contains("setp.ge.u32") && consumers.contains("bar.sync 0;"));
        assert!(!consumers.contains("cp.async.bulk"), "{}", k.entry);
        assert!(producer.contains("setp.ne.u32") && producer.contains(", 256;"));
        assert!(producer.contains("cp.async.bulk.tensor.2d"));
        let first_copy = producer.find("cp.async.bulk").unwrap_or(0);
        let first_wait = producer.find("mbarrier.try_wait").unwrap_or(usize::MAX);
        assert!(first_wait < first_copy, "{producer}");
        // The consumers release slots; their barriers are named barrier 1 of 256 threads.
        assert!(consumers.contains("mbarrier.arrive.shared::cta.b64"));
        assert!(consumers.contains("bar.sync 1, 256;"));
        assert_eq!(consumers.matches("bar.sync 0;").count(), 1, "{}", k.entry);
        // Registers move from the producer warpgroup to the consumers.
        assert!(consumers.contains("setmaxnreg.inc.sync.aligned.u32 232;"));
        assert!(producer.contains("setmaxnreg.dec.sync.aligned.u32 40;"));
        // `empty` barriers count the 8 consumer warps.
        assert!(ptx.contains("], 8;"), "{ptx}");
        if let Some(log) = assemble(ptx, "sm_90a", "ws_gemm") {
            assert!(log.contains("0 bytes spill stores"), "{log}");
        }
    }
}

/// Rings of 1 or 2 slots: the pipeline waits inside its loop with `scratch_wait(0)`.
/// Without warp specialization that wait does not consume the fill it waited for (the
/// read after it does: a consumed fill made the read wait for a phase that never came,
/// a hang on the H100); a fetch consumes an unread fill of its slot instead. With `--ws`
/// requested such a kernel keeps its own warps only (the consumers' drain would release
/// the slot about to be read).
#[test]
fn shallow_rings_wait_without_consuming_and_are_not_warp_specialized() {
    for stages in [1, 2] {
        let k = gemm(Arch::Sm90a, |o| o.num_stages = Some(stages));
        // Fetched by TMA (the behaviour itself is checked on the GPU: tools/gpu-check.sh
        // runs every depth against the interpreter under a time limit).
        assert!(k.ptx.contains("cp.async.bulk.tensor.2d"), "{}", k.entry);
        let ws = gemm(Arch::Sm90a, |o| {
            o.num_stages = Some(stages);
            o.ws = true;
        });
        assert_eq!(ws.launch.threads_per_block, 256, "{}", ws.entry);
        assert!(!ws.ptx.contains("setmaxnreg"), "{}", ws.entry);
        // The compiler says so, and why (the CLI prints the notes; the PTX header too).
        let why = "warp specialization (`--ws`) not applied: a pipelined ring has fewer \
                   than 3 slots (`--stages 3` or more)";
        assert_eq!(ws.notes, vec![why.to_string()], "{}", ws.entry);
        assert!(ws.ptx.contains(&format!("// {why}\n")), "{}", ws.ptx);
        if let Some(log) = assemble(&k.ptx, "sm_90a", "shallow_ring") {
            assert!(log.contains("0 bytes spill stores"), "{log}");
        }
    }
    let deep = gemm(Arch::Sm90a, |o| {
        o.num_stages = Some(3);
        o.ws = true;
    });
    assert_eq!(deep.launch.threads_per_block, 384);
    assert!(deep.notes.is_empty(), "{:?}", deep.notes);
    assert!(!deep.ptx.contains("not applied"));
}

/// A requested producer warpgroup that cannot apply is a note, with the reason, not a
/// silent fallback: no TMA ring to feed (`--no-tma`; sm_80), and, on a kernel over the
/// register limit without it, a note on that error.
#[test]
fn a_refused_warp_specialization_says_why() {
    let no_tma = gemm(Arch::Sm90a, |o| {
        o.ws = true;
        o.no_tma = true;
    });
    assert_eq!(no_tma.launch.threads_per_block, 256);
    assert_eq!(
        no_tma.notes,
        vec![
            "warp specialization (`--ws`) not applied: no pipelined `dot` loop is fed by TMA \
              copies (sm_90a's wgmma path, without `--no-tma`)"
                .to_string()
        ]
    );
    let sm80 = gemm(Arch::Sm80, |o| {
        o.ws = true;
        o.num_stages = Some(3);
    });
    assert_eq!(
        sm80.notes,
        vec![
            "warp specialization (`--ws`) not applied: sm_80 has no TMA copy engine or \
              wgmma: the kernel is the same without it"
                .to_string()
        ]
    );
    let plain = gemm(Arch::Sm80, |o| o.num_stages = Some(3));
    assert!(plain.notes.is_empty());
    // 128 x 128 f32 accumulator plus two more tiles of it, 8 warps, 2 stages: over the
    // limit without a producer, which a 2-slot ring cannot have.
    let src = r#"
kernel big(a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>) {
    let mut acc = zeros([128, 128], f32);
    let mut acc2 = zeros([128, 128], f32);
    let mut acc3 = zeros([128, 128], f32);
    for kt in 0..cdiv(shape(a, 1), 64) {
        let ta = load(a, [bid(0), kt], [128, 64]);
        let tb = load(b, [kt, bid(1)], [64, 128]);
        acc = dot(ta, tb, acc);
        acc2 = acc2 + acc;
        acc3 = acc3 + acc2 * acc;
    }
    store(c, [bid(0), bid(1)], (acc + acc2 + acc3) as bf16);
}
"#;
    let file = SourceFile::new("big.kg", src);
    let mut o = CompileOptions::new(Arch::Sm90a);
    o.num_warps = Some(8);
    o.num_stages = Some(2);
    o.ws = true;
    let d = compile(&file, &o).expect_err("over the register limit");
    let text = d.render(&file);
    assert!(text.contains("error[E0801]"), "{text}");
    assert!(
        text.contains(
            "= warp specialization (`--ws`) was not applied: a pipelined ring has fewer than \
             3 slots (`--stages 3` or more)"
        ),
        "{text}"
    );
    // With 4 stages the producer would take the kernel past the limit (its consumers
    // get 232 registers), but without TMA (`--no-tma`; sm_80) there is none: the limit
    // holds again, with the reason.
    for (arch, no_tma, why) in [
        (
            Arch::Sm90a,
            true,
            "no pipelined `dot` loop is fed by TMA copies (sm_90a's wgmma path, without \
             `--no-tma`)",
        ),
        (
            Arch::Sm80,
            false,
            "sm_80 has no TMA copy engine or wgmma: the kernel is the same without it",
        ),
    ] {
        let mut o = CompileOptions::new(arch);
        o.num_warps = Some(8);
        o.num_stages = Some(3);
        o.ws = true;
        o.no_tma = no_tma;
        let d = compile(&file, &o).expect_err("over the register limit");
        let text = d.render(&file);
        assert!(text.contains("error[E0801]"), "{text}");
        assert!(
            text.contains(&format!(
                "= warp specialization (`--ws`) was not applied: {why}"
            )),
            "{text}"
        );
    }
    let mut o = CompileOptions::new(Arch::Sm90a);
    o.num_warps = Some(8);
    o.num_stages = Some(3);
    o.ws = true;
    let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert_eq!(k.launch.threads_per_block, 384, "with the producer it fits");
}

/// A persistent kernel whose tile index is corrected in a runtime `if` (the shape of the
/// symmetric Gram product's triangle walk): the producer thread computes the `if` too,
/// so the kernel is warp-specialized instead of failing ("value used before it is
/// defined", before this was handled).
#[test]
fn a_producer_computes_scalar_ifs_that_feed_its_tile_indices() {
    let src = r#"
kernel pmm_if<BM: int = 128, BN: int = 128, BK: int = 64>(
    a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>,
) {
    let tiles_n = cdiv(shape(c, 1), BN);
    let tiles = cdiv(shape(c, 0), BM) * tiles_n;
    for i in 0..cdiv(tiles - bid(0), num_bids(0)) {
        let t = bid(0) + i * num_bids(0);
        let mut pm = t / tiles_n;
        if pm * tiles_n > t {
            pm = pm - 1;
        }
        let pn = t - pm * tiles_n;
        let mut acc = zeros([BM, BN], f32);
        for k in 0..cdiv(shape(a, 1), BK) {
            acc = dot(load(a, [pm, k], [BM, BK]), load(b, [k, pn], [BK, BN]), acc);
        }
        store(c, [pm, pn], acc as bf16);
    }
}
"#;
    let file = SourceFile::new("ws_if.kg", src);
    let mut o = CompileOptions::new(Arch::Sm90a);
    o.num_warps = Some(8);
    o.num_stages = Some(3);
    o.ws = true;
    let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert_eq!(k.launch.threads_per_block, 384, "{}", k.entry);
    let (_, producer) = k.ptx.split_once("\tret;\n").expect("two sections");
    assert!(producer.contains("cp.async.bulk.tensor.2d"));
    if let Some(log) = assemble(&k.ptx, "sm_90a", "ws_if") {
        assert!(log.contains("0 bytes spill stores"), "{log}");
    }
}

/// Tiles of rank-3 views (attention's `load(k, [bh, j, 0], [1, BN, D]).reshape([BN, D])`,
/// which the pipeline stages into 2-D slots) are TMA copies too: one rank-3 map per
/// tensor, a box of 1 along the leading dimension, and `.3d` copies whose coordinates are
/// the column, the row and the leading index, innermost first.
#[test]
fn rank_3_views_fetch_by_tma_with_rank_3_maps() {
    let src = r#"
kernel k3<D: int = 128, BN: int = 64>(
    q: tensor<bf16, 3, contiguous>, k: tensor<bf16, 3, contiguous>, o: tensor<f32, 3, contiguous>,
) {
    let h = bid(1);
    let qt = load(q, [h, bid(0), 0], [1, 64, D]).reshape([64, D]);
    let mut acc = zeros([64, BN], f32);
    for j in 0..cdiv(shape(k, 1), BN) {
        let kt = load(k, [h, j, 0], [1, BN, D]).reshape([BN, D]);
        acc = acc + dot(qt, transpose(kt), zeros([64, BN], f32));
    }
    store(o, [h, bid(0), 0], reshape(acc, [1, 64, BN]));
}
"#;
    let file = SourceFile::new("k3.kg", src);
    let mut o = CompileOptions::new(Arch::Sm90a);
    o.num_warps = Some(4);
    let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let maps: Vec<_> = k
        .abi
        .params
        .iter()
        .filter_map(|p| match &p.slot {
            crate::abi::AbiSlot::TensorMap { param, map } => Some((*param, *map)),
            _ => None,
        })
        .collect();
    assert_eq!(maps.len(), 2, "{maps:?}");
    for (_, m) in &maps {
        assert_eq!((m.rank, m.box_dims, m.swizzle), (3, [64, 64], 3), "{m:?}");
    }
    let ptx = &k.ptx;
    assert!(
        ptx.contains("cp.async.bulk.tensor.3d.shared::cluster.global"),
        "{ptx}"
    );
    assert!(!ptx.contains("cp.async.bulk.tensor.2d"), "{ptx}");
    assert!(!ptx.contains("cp.async.cg"), "{ptx}");
    assemble(ptx, "sm_90a", "tma_rank3");
    // With `no_tma`, the same kernel copies with cp.async.
    o.no_tma = true;
    let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert!(k.ptx.contains("cp.async.cg"), "{}", k.ptx);
}

/// FlashAttention-3's shape under warp specialization: a loop-invariant Q kept in one
/// shared slot (filled once, before the loop) and K and V rings, K read by two products
/// of each iteration. The kernel is specialized (a one-slot buffer filled outside every
/// loop is no shallow ring), Q is never released (nothing refills it; before, the
/// consumers' drain before its first read consumed its fill and the read then waited for
/// a phase that never came: a hang on the H100), and each refilled ring is released once
/// per iteration, by its last reader (releasing K after its first product let the
/// producer overwrite it under the second).
#[test]
fn a_resident_operand_and_a_ring_read_twice_are_released_by_their_last_reader() {
    let src = r#"
kernel fa<D: int = 128, BM: int = 128, BN: int = 128>(
    q: tensor<bf16, 3, contiguous>, k: tensor<bf16, 3, contiguous>,
    v: tensor<bf16, 3, contiguous>, o: tensor<f32, 3, contiguous>,
) {
    let h = bid(1);
    let qt = load(q, [h, bid(0), 0], [1, BM, D]).reshape([BM, D]);
    let mut acc = zeros([BM, D], f32);
    for j in 0..cdiv(shape(k, 1), BN) {
        let kt = load(k, [h, j, 0], [1, BN, D]).reshape([BN, D]);
        let vt = load(v, [h, j, 0], [1, BN, D]).reshape([BN, D]);
        let s = dot(qt, transpose(kt), zeros([BM, BN], f32));
        let p = exp2(s - expand_dims(max(s, axis = 1), 1));
        acc = dot(p as bf16, vt, acc);
        acc = dot(p as bf16, kt, acc);
    }
    store(o, [h, bid(0), 0], reshape(acc, [1, BM, D]));
}
"#;
    let file = SourceFile::new("fa.kg", src);
    let mut o = CompileOptions::new(Arch::Sm90a);
    o.num_warps = Some(8);
    o.ws = true;
    let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert_eq!(k.launch.threads_per_block, 384, "{}", k.entry);
    let (consumers, producer) = k.ptx.split_once("\tret;\n").expect("two sections");
    assert!(consumers.contains("setmaxnreg.inc.sync.aligned.u32 232;"));
    // The producer copies Q once and K and V in its loop.
    assert!(producer.matches("cp.async.bulk.tensor.3d").count() >= 3);
    // One release per refilled ring (K, V) per iteration; none for Q.
    let body = super::tests::loop_body(consumers);
    assert_eq!(
        body.matches("mbarrier.arrive.shared::cta.b64").count(),
        2,
        "{body}"
    );
    // K's release comes after the last product that reads it: after the third
    // commit of the iteration.
    let third = body
        .match_indices("wgmma.commit_group")
        .nth(2)
        .map(|(i, _)| i);
    let last_arrive = body.rfind("mbarrier.arrive.shared::cta.b64");
    assert!(third.is_some() && last_arrive > third, "{body}");
    if let Some(log) = assemble(&k.ptx, "sm_90a", "ws_fa") {
        assert!(log.contains("0 bytes spill stores"), "{log}");
    }
}

/// With `tma_store`, a tile store in a TMA kernel goes by the copy engine
/// (`lower/tma_store.rs`): the tile
/// into shared memory in the box layout, a proxy fence and a barrier, one bulk copy per
/// atom by thread 0, then the wait for the engine to have read it; no `st.global`. Not
/// when the kernel also reads the tensor or stores it twice, not on sm_80 nor with
/// `no_tma`; in a persistent kernel whose ring stays alive, in groups of atoms that fit.
#[test]
fn a_tile_store_in_a_tma_kernel_is_a_tma_store() {
    let k = gemm(Arch::Sm90a, |o| o.tma_store = true);
    assert!(k.entry.ends_with("__tmastore"), "{}", k.entry);
    let maps = k
        .abi
        .params
        .iter()
        .filter(|p| matches!(p.slot, crate::abi::AbiSlot::TensorMap { param: 2, .. }))
        .count();
    assert_eq!(maps, 1, "c's map");
    let ptx = &k.ptx;
    let stores = ptx
        .matches("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group")
        .count();
    assert_eq!(
        stores, 4,
        "one per 64-column atom of the 128 x 256 tile\n{ptx}"
    );
    assert!(!ptx.contains("st.global"), "{ptx}");
    for needed in [
        "fence.proxy.async.shared::cta;",
        "cp.async.bulk.commit_group;",
        "cp.async.bulk.wait_group.read 0;",
        "cp.async.bulk.wait_group 0;",
    ] {
        assert!(ptx.contains(needed), "{needed}\n{ptx}");
    }
    // The fence and a barrier come between the shared-memory writes and the copies.
    let fence = ptx.find("fence.proxy.async").unwrap_or(usize::MAX);
    let first = ptx.find(".global.shared::cta.bulk_group").unwrap_or(0);
    assert!(
        fence < first && ptx[fence..first].contains("bar.sync"),
        "{ptx}"
    );
    if let Some(log) = assemble(ptx, "sm_90a", "tma_store") {
        assert!(log.contains("0 bytes spill stores"), "{log}");
    }
    // Plain stores where the copy engine must not write (or cannot).
    let plain = |src: &str, arch: Arch, no_tma: bool| {
        let file = SourceFile::new("mm2.kg", src);
        let mut o = CompileOptions::new(arch);
        o.num_warps = Some(8);
        o.num_stages = Some(3);
        o.no_tma = no_tma;
        o.tma_store = true;
        let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
        !k.ptx.contains(".global.shared::cta.bulk_group") && k.ptx.contains("st.global")
    };
    let twice = GEMM.replace(
        "store(c, [bid(0), bid(1)], acc as bf16);",
        "store(c, [bid(0), bid(1)], acc as bf16); store(c, [bid(0) + 1, bid(1)], acc as bf16);",
    );
    let read = GEMM
        .replace(
            "c: tensor<bf16, 2, contiguous>,\n)",
            "c: tensor<bf16, 2, contiguous>, d: tensor<bf16, 2, contiguous>,\n)",
        )
        .replace(
            "store(c, [bid(0), bid(1)], acc as bf16);",
            "store(c, [bid(0), bid(1)], acc as bf16); store(d, [0, 0], load(c, [0, 0], [8, 8]));",
        );
    assert!(read.contains("d: tensor"), "{read}");
    assert!(plain(&twice, Arch::Sm90a, false), "stored twice");
    assert!(plain(&read, Arch::Sm90a, false), "also read");
    assert!(plain(GEMM, Arch::Sm80, false), "sm_80");
    assert!(plain(GEMM, Arch::Sm90a, true), "no_tma");
    assert!(
        !gemm(Arch::Sm90a, |_| {})
            .ptx
            .contains(".global.shared::cta"),
        "opt-in"
    );
    // Persistent 128 x 256 x 64, 4 stages: the ring (192 KiB) stays alive, so the tile
    // goes two atoms at a time, inside the target's shared memory.
    let file = SourceFile::new("p.kg", PERSISTENT);
    let mut o = CompileOptions::new(Arch::Sm90a);
    o.num_warps = Some(8);
    o.num_stages = Some(4);
    o.tma_store = true;
    let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert!(k
        .ptx
        .contains("TMA store: 128 x 256 through shared memory, 2 of 4 atoms"));
    assert_eq!(
        k.ptx.matches(".global.shared::cta.bulk_group").count(),
        4,
        "{}",
        k.ptx
    );
    assert!(k.launch.dynamic_shared_bytes <= Arch::Sm90a.target().max_shared_bytes_per_block);
    if let Some(log) = assemble(&k.ptx, "sm_90a", "tma_store_persistent") {
        assert!(log.contains("0 bytes spill stores"), "{log}");
    }
}

/// A GEMM whose blocks run in clusters of two taking vertically adjacent tiles:
/// `SKEW` makes b's column depend on `bid(0)` itself, `TB` stores b transposed (a
/// `[256, 64]` slot: one swizzle atom, which cannot be halved).
const CLUSTER_GEMM: &str = r#"
kernel mc<TB: bool = false, SKEW: bool = false>(
    a: tensor<bf16, 2, contiguous>,
    b: tensor<bf16, 2, contiguous>,
    c: tensor<bf16, 2, contiguous>,
) {
    let pair = bid(0) / 2;
    let pm = 2 * pair + cluster_rank(2);
    let mut pn = pair;
    if SKEW {
        pn = bid(0) % 3;
    }
    let mut acc = zeros([128, 256], f32);
    for kt in 0..cdiv(shape(a, 1), 64) {
        let mut tb = zeros([64, 256], bf16);
        if TB {
            tb = transpose(load(b, [pn, kt], [256, 64]));
        } else {
            tb = load(b, [kt, pn], [64, 256]);
        }
        acc = dot(load(a, [pm, kt], [128, 64]), tb, acc);
    }
    store(c, [pm, pn], acc as bf16);
}
"#;

#[test]
fn a_tile_alike_in_both_blocks_of_a_cluster_is_multicast() {
    let build = |tb: bool, skew: bool| {
        let file = SourceFile::new("mc.kg", CLUSTER_GEMM);
        let mut o = CompileOptions::new(Arch::Sm90a)
            .define("TB", tb)
            .define("SKEW", skew);
        o.num_warps = Some(8);
        o.num_stages = Some(4);
        o.multicast = true;
        compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)))
    };
    // Without the specialization's `multicast`, the blocks of a cluster copy their own.
    let file = SourceFile::new("mc.kg", CLUSTER_GEMM);
    let plain = compile(&file, &CompileOptions::new(Arch::Sm90a)).expect("compiles");
    assert_eq!(plain.launch.cluster_size, 2);
    assert!(!plain.ptx.contains(".multicast::cluster"), "{}", plain.ptx);
    let k = build(false, false);
    assert_eq!(k.launch.cluster_size, 2);
    let fills: Vec<&str> = k
        .ptx
        .lines()
        .filter(|l| l.contains("cp.async.bulk.tensor"))
        .collect();
    let multicast: Vec<&&str> = fills
        .iter()
        .filter(|l| l.contains(".multicast::cluster"))
        .collect();
    // b's [64, 256] slot is 4 atoms: each block copies 2 per fill (the prologue's 2
    // fills and the loop's), into both blocks, with the mask of both.
    assert_eq!(multicast.len(), 6, "{}", k.ptx);
    assert!(
        multicast.iter().all(|l| l.trim_end().ends_with("%rs1;")),
        "{multicast:?}"
    );
    assert!(k.ptx.contains("mov.b16 %rs1, 3;"), "{}", k.ptx);
    // The multicast fills all go through one map (b's: the one a's fills do not use);
    // a's fills stay local, one box each.
    let map = |l: &str| {
        l.split("[%rd")
            .nth(1)
            .map(|t| t.split(',').next().unwrap_or("").to_string())
    };
    let mc_maps: std::collections::BTreeSet<_> = multicast.iter().map(|l| map(l)).collect();
    let local: Vec<&&str> = fills
        .iter()
        .filter(|l| !l.contains(".multicast::cluster"))
        .collect();
    let local_maps: std::collections::BTreeSet<_> = local.iter().map(|l| map(l)).collect();
    assert_eq!((mc_maps.len(), local_maps.len()), (1, 1), "{fills:?}");
    assert!(mc_maps.is_disjoint(&local_maps), "{fills:?}");
    assert_eq!(local.len(), 3, "{fills:?}");
    // b's map: `mov.b64 %rdX, p_b_tmap..;` then `cvta.param.u64 %rdY, %rdX;`.
    let second = |l: &str| {
        l.split_whitespace()
            .nth(1)
            .map(|r| r.trim_end_matches(',').to_string())
    };
    let raw = k
        .ptx
        .lines()
        .find(|l| l.contains("mov.b64") && l.contains("p_b_tmap"))
        .and_then(second)
        .expect("b's tensor map");
    let generic = k
        .ptx
        .lines()
        .find(|l| l.contains("cvta.param.u64") && l.trim_end().ends_with(&format!("{raw};")))
        .and_then(second)
        .map(|r| r.trim_start_matches("%rd").to_string());
    assert_eq!(mc_maps, [generic].into_iter().collect(), "{}", k.ptx);
    // Each block arms its own mbarrier with the whole tile (both halves land on it).
    assert!(
        k.ptx.contains("_, [%r") && k.ptx.contains("], 32768;"),
        "{}",
        k.ptx
    );
    // Each slot has an `empty` mbarrier that both blocks' thread 0 arrive on; in the K
    // loop (from its back edge's target to the products), after the block barrier that
    // ends this block's reads, thread 0 arrives on its own and the other block's (mapa)
    // and waits at cluster scope before the refill; no cluster-wide barrier there.
    assert_eq!(k.ptx.matches("], 2;").count(), 4, "{}", k.ptx);
    let back = k
        .ptx
        .lines()
        .rev()
        .find(|l| l.trim().starts_with("bra.uni $L"))
        .expect("a back edge");
    let head = back
        .trim()
        .trim_start_matches("bra.uni ")
        .trim_end_matches(';');
    let body = &k.ptx[k.ptx.find(&format!("{head}:")).expect("the K loop")..];
    let body = &body[..body.find("wgmma.mma_async").expect("the products")];
    let at = |pat: &str| {
        body.find(pat)
            .unwrap_or_else(|| panic!("no {pat} in\n{body}"))
    };
    assert!(at("bar.sync") < at("mapa.shared::cluster"), "{body}");
    assert!(
        at("mbarrier.arrive.shared::cluster") < at("mbarrier.try_wait.parity"),
        "{body}"
    );
    assert!(
        at("mbarrier.try_wait.parity") < at(".multicast::cluster"),
        "{body}"
    );
    // CTA-scope release and acquire (cluster scope costs a GPU-wide fence per release).
    assert!(!body.contains(".release.cluster"), "{body}");
    assert!(!body.contains(".acquire.cluster"), "{body}");
    assert!(!body.contains("barrier.cluster"), "{body}");
    if let Some(out) = assemble(&k.ptx, "sm_90a", "cluster gemm") {
        assert!(out.contains("0 bytes spill stores"), "{out}");
    }
    // b's column from bid(0) itself, or a one-atom slot: clusters, no multicast.
    for (tb, skew) in [(false, true), (true, false)] {
        let k = build(tb, skew);
        assert_eq!(k.launch.cluster_size, 2);
        assert!(
            !k.ptx.contains(".multicast::cluster"),
            "TB={tb} SKEW={skew}\n{}",
            k.ptx
        );
    }
}
