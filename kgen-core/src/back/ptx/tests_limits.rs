//! The register budget (`.maxnreg`) and the register limit's diagnostic: its
//! suggestions compile.

use super::tests::assemble;
use crate::{compile, Arch, CompileOptions, SourceFile};

const ROW: &str = r#"
kernel row<T: float = bf16, N: int = 11008>(x: tensor<T, 2, contiguous>, w: tensor<T, 1, contiguous>, y: tensor<T, 2, contiguous>, eps: f32) {
    let row = bid(0);
    let xt = load(x, [row, 0], [1, N]) as f32;
    let r = rsqrt(sum(xt * xt, 1) / (N as f32) + eps);
    let wt = load(w, [0], [N]) as f32;
    store(y, [row, 0], (xt * expand_dims(r, 1) * expand_dims(wt, 0)) as T);
}
"#;

fn opts(warps: Option<u32>, min_blocks: Option<u32>, defines: &[(&str, &str)]) -> CompileOptions {
    let mut o = CompileOptions::new(Arch::Sm90a);
    o.num_warps = warps;
    o.min_blocks_per_sm = min_blocks;
    for (k, v) in defines {
        o = o.define(k, v);
    }
    o
}

/// `.maxnreg` is the registers per thread of `min_blocks` blocks on one SM: 65536 /
/// threads, at most 255, else a multiple of 8 (85 would allocate 88).
#[test]
fn every_entry_declares_its_register_budget() {
    let file = SourceFile::new("row.kg", ROW);
    for (warps, min_blocks, want) in [
        (4, None, 255),
        (8, None, 255),
        (16, None, 128),
        (32, None, 64),
        (16, Some(2), 64),
        (8, Some(3), 80),
    ] {
        let k = compile(&file, &opts(Some(warps), min_blocks, &[("N", "2048")]))
            .unwrap_or_else(|d| panic!("{}", d.render(&file)));
        assert!(
            k.ptx
                .contains(&format!(".maxntid {}, 1, 1\n.maxnreg {want}\n", warps * 32)),
            "{warps} warps, {min_blocks:?}: {}",
            k.ptx
        );
        assemble(&k.ptx, "sm_90a", "budget");
    }
}

/// A whole-row tile with too few warps: the diagnostic names the tile and its padded
/// layout, and both of its suggestions (more warps; chunks of the row) compile.
#[test]
fn the_register_limit_says_how_to_fit_and_its_suggestions_compile() {
    let file = SourceFile::new("row.kg", ROW);
    let err = compile(&file, &opts(Some(4), None, &[])).unwrap_err();
    let text = err.render(&file);
    assert!(
        text.contains("`xt`, tile<f32, [1, 11008]>, laid out as [1, 16384]"),
        "{text}"
    );
    assert!(text.contains("with 8 warps it needs about"), "{text}");
    compile(&file, &opts(Some(8), None, &[])).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    // Too long for one tile at any warps: chunks of 16384, kept in a bf16 buffer.
    let err = compile(&file, &opts(None, None, &[("N", "20000")])).unwrap_err();
    let text = err.render(&file);
    assert!(text.contains("in chunks of 16384"), "{text}");
    assert!(text.contains("`scratch(2, [1, 16384], bf16)`"), "{text}");
    assert!(!text.contains("warps it needs"), "{text}");
    let chunked = r#"
kernel row<T: float = bf16, N: int = 20000, C: int = 16384>(x: tensor<T, 2, contiguous>, w: tensor<T, 1, contiguous>, y: tensor<T, 2, contiguous>, eps: f32) {
    let row = bid(0);
    let buf = scratch(cdiv(N, C), [1, C], T);
    let mut ss = zeros([1, C], f32);
    for k in 0..cdiv(N, C) {
        let t = load(x, [row, k], [1, C]);
        scratch_store(buf, k, t);
        ss += (t as f32) * (t as f32);
    }
    let r = rsqrt(sum(ss, 1) / (N as f32) + eps);
    for k in 0..cdiv(N, C) {
        let tf = scratch_load(buf, k) as f32;
        let wt = load(w, [k], [C]) as f32;
        store(y, [row, k], (tf * expand_dims(r, 1) * expand_dims(wt, 0)) as T);
    }
}
"#;
    let file = SourceFile::new("chunked.kg", chunked);
    let k =
        compile(&file, &opts(None, None, &[])).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assemble(&k.ptx, "sm_90a", "chunked");
}

/// A layout conversion whose buffer would not fit beside the shared memory alive around
/// it (here a scratch buffer alive for the whole kernel; in a warp-specialized
/// persistent kernel, the rings) goes through half the buffer twice instead of failing
/// with E0801; its result is checked by the callers' GPU runs (docs/PERFORMANCE.md).
#[test]
fn a_conversion_short_of_shared_memory_goes_in_halves() {
    let src = |slots: u32| {
        format!(
            r#"
kernel big(a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>, y: tensor<f32, 2, contiguous>) {{
    let keep = scratch({slots}, [8, 128], f32);
    scratch_store(keep, 0, load(y, [0, 0], [8, 128]));
    let mut acc = zeros([128, 256], f32);
    for k in 0..cdiv(shape(a, 1), 64) {{
        acc = dot(load(a, [0, k], [128, 64]), load(b, [k, 0], [64, 256]), acc);
    }}
    store(c, [0, 0], acc as bf16);
    store(y, [1, 0], scratch_load(keep, 0) * 2.0);
}}
"#
        )
    };
    let mut o = opts(Some(8), None, &[]);
    o.num_stages = Some(1);
    // 41 slots of 4 KiB and the epilogue's 66 KiB exchange exceed sm_90a's 227 KiB;
    // 16 slots leave room for the whole exchange.
    for (slots, halves) in [(41, true), (16, false)] {
        let file = SourceFile::new("big.kg", src(slots));
        let k = compile(&file, &o).unwrap_or_else(|d| panic!("{}", d.render(&file)));
        assert_eq!(
            k.ptx.contains("layout conversion in two halves"),
            halves,
            "{slots}"
        );
        assert!(k.launch.dynamic_shared_bytes <= Arch::Sm90a.target().max_shared_bytes_per_block);
        assemble(&k.ptx, "sm_90a", "halves");
    }
}
