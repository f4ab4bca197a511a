//! The PTX of `grid_sync(counter)`: the block barrier, one thread's release add on the
//! counter and its acquire spin, the second block barrier, with the async-proxy fences
//! and the TMA store drain on sm_90a only; the cooperative launch flag; several syncs in
//! one kernel; and the error (not a panic) for a warp-specialized kernel. Every kernel
//! that compiles is assembled by ptxas (`tests::assemble`) for its target.

use super::tests::assemble;
use crate::diag::ErrorCode;
use crate::{compile, Arch, CompileOptions, CompiledKernel, SourceFile};

const NEIGHBOUR: &str = r#"
kernel gs<BLOCK: int = 128>(x: tensor<f32, 1>, y: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    store(x, [i], load(x, [i], [BLOCK]) + 1.0);
    grid_sync(counter);
    let j = (i + 1) % num_bids(0);
    store(y, [i], load(x, [j], [BLOCK]));
}
"#;

/// The same kernel without the `grid_sync` (and so without the barrier's guarantee).
const NO_SYNC: &str = r#"
kernel gs<BLOCK: int = 128>(x: tensor<f32, 1>, y: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    store(x, [i], load(x, [i], [BLOCK]) + 1.0);
    let j = (i + 1) % num_bids(0);
    store(y, [i], load(x, [j], [BLOCK]));
}
"#;

/// Compiles the first kernel of `src` for `arch` and assembles it.
fn build(src: &str, arch: Arch, name: &str) -> CompiledKernel {
    let file = SourceFile::new(format!("{name}.kg"), src);
    let k = compile(&file, &CompileOptions::new(arch))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assemble(&k.ptx, arch.name(), name);
    k
}

/// The instructions of `ptx`, without predicates, labels, comments or directives.
fn insts(ptx: &str) -> Vec<String> {
    ptx.lines()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with('.'))
        .filter(|l| !l.ends_with(':') && !l.starts_with('{') && !l.starts_with('}'))
        .map(|l| match l.strip_prefix('@') {
            Some(rest) => rest.split_once(' ').map_or("", |(_, i)| i).trim(),
            None => l,
        })
        .map(|l| l.trim_end_matches(';').to_string())
        .collect()
}

/// Whether the instructions `want` (prefixes) occur in `ptx` in this order within one
/// window of at most 40 instructions (others, such as the spin's `setp` and `bra`, may
/// sit between them).
fn in_order(ptx: &str, want: &[&str]) -> bool {
    let is = insts(ptx);
    (0..is.len()).any(|start| {
        let mut k = 0;
        for i in is[start..].iter().take(40) {
            if k < want.len() && i.starts_with(want[k]) {
                k += 1;
            } else if k == 0 {
                return false;
            }
        }
        k == want.len()
    })
}

fn count(ptx: &str, prefix: &str) -> usize {
    insts(ptx).iter().filter(|i| i.starts_with(prefix)).count()
}

#[test]
fn grid_sync_is_a_release_add_and_an_acquire_spin_between_block_barriers() {
    for arch in [Arch::Sm90a, Arch::Sm80] {
        let k = build(NEIGHBOUR, arch, "grid_sync");
        let ptx = &k.ptx;
        assert_eq!(count(ptx, "atom.global.release.gpu.add.u32"), 1, "{ptx}");
        assert_eq!(count(ptx, "ld.global.acquire.gpu.u32"), 1, "{ptx}");
        assert_eq!(count(ptx, "fence.acq_rel.gpu"), 1, "{ptx}");
        let tma = arch == Arch::Sm90a;
        let seq: Vec<&str> = if tma {
            vec![
                "cp.async.bulk.wait_group 0",
                "fence.proxy.async.global",
                "bar.sync 0",
                "atom.global.release.gpu.add.u32",
                "ld.global.acquire.gpu.u32",
                "fence.acq_rel.gpu",
                "bar.sync 0",
                "fence.proxy.async.global",
            ]
        } else {
            vec![
                "bar.sync 0",
                "atom.global.release.gpu.add.u32",
                "ld.global.acquire.gpu.u32",
                "fence.acq_rel.gpu",
                "bar.sync 0",
            ]
        };
        assert!(
            in_order(ptx, &seq),
            "{}: expected {seq:?} in\n{ptx}",
            arch.name()
        );
        // The async proxy exists on sm_90a only.
        assert_eq!(
            count(ptx, "fence.proxy.async.global"),
            if tma { 2 } else { 0 },
            "{ptx}"
        );
        assert_eq!(
            count(ptx, "cp.async.bulk.wait_group"),
            usize::from(tma),
            "{ptx}"
        );
        // The spin branches back to a label placed just before its acquire load.
        let lines: Vec<&str> = ptx.lines().map(str::trim).collect();
        let ld = lines
            .iter()
            .position(|l| l.starts_with("ld.global.acquire.gpu.u32"))
            .unwrap_or_else(|| panic!("{ptx}"));
        let label = lines[ld - 1]
            .strip_suffix(':')
            .unwrap_or_else(|| panic!("no label before the spin's load:\n{ptx}"));
        assert!(
            lines[ld..]
                .iter()
                .any(|l| l.starts_with('@') && l.ends_with(&format!("bra {label};"))),
            "no branch back to {label}:\n{ptx}"
        );
        // x is written: its read after the barrier must not go through the read-only
        // (non-coherent) cache.
        assert!(!ptx.contains("ld.global.nc"), "{ptx}");
        assert!(k.launch.cooperative, "{}", arch.name());
    }
}

#[test]
fn only_kernels_that_call_grid_sync_launch_cooperatively() {
    for arch in [Arch::Sm90a, Arch::Sm80] {
        let k = build(NO_SYNC, arch, "no_grid_sync");
        assert!(!k.launch.cooperative, "{}", arch.name());
        assert_eq!(count(&k.ptx, "atom.global.release.gpu.add.u32"), 0);
        assert_eq!(count(&k.ptx, "ld.global.acquire.gpu.u32"), 0);
    }
}

/// Two syncs in a row and three in a loop: one spin per call site, each with its own
/// labels (ptxas refuses a label defined twice).
#[test]
fn several_grid_syncs_in_one_kernel_assemble() {
    let two = r#"
kernel two(x: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    let n = num_bids(0);
    store(x, [i], load(x, [(i + 1) % n], [128]) + 1.0);
    grid_sync(counter);
    store(x, [i], load(x, [(i + 2) % n], [128]) * 2.0);
    grid_sync(counter);
    store(x, [i], load(x, [(i + 3) % n], [128]) - 1.0);
}
"#;
    let looped = r#"
kernel pp<BLOCK: int = 128>(a: tensor<f32, 1>, b: tensor<f32, 1>, counter: tensor<i32, 1>, steps: i32) {
    let i = bid(0);
    let n = num_bids(0);
    for s in 0..steps {
        let j = (i + s + 1) % n;
        if s % 2 == 0 {
            store(b, [i], load(a, [j], [BLOCK]) + 1.0);
        } else {
            store(a, [i], load(b, [j], [BLOCK]) + 1.0);
        }
        grid_sync(counter);
    }
}
"#;
    for arch in [Arch::Sm90a, Arch::Sm80] {
        let k = build(two, arch, "grid_sync_two");
        assert_eq!(count(&k.ptx, "atom.global.release.gpu.add.u32"), 2);
        assert_eq!(count(&k.ptx, "ld.global.acquire.gpu.u32"), 2);
        assert!(k.launch.cooperative);
        let k = build(looped, arch, "grid_sync_loop");
        assert_eq!(count(&k.ptx, "atom.global.release.gpu.add.u32"), 1);
        assert!(k.launch.cooperative);
    }
}

/// A pipelined wgmma GEMM that calls `grid_sync`, before or after its `dot` loop.
fn gemm_with_sync(before: bool) -> String {
    let (pre, post) = if before {
        ("grid_sync(counter);", "")
    } else {
        ("", "grid_sync(counter);")
    };
    format!(
        r#"
kernel mm<BM: int = 128, BN: int = 256, BK: int = 64>(
    a: tensor<bf16, 2, contiguous>, b: tensor<bf16, 2, contiguous>, c: tensor<bf16, 2, contiguous>,
    counter: tensor<i32, 1>,
) {{
    let mut acc = zeros([BM, BN], f32);
    {pre}
    for k in 0..cdiv(shape(a, 1), BK) {{
        acc = dot(load(a, [bid(0), k], [BM, BK]), load(b, [k, bid(1)], [BK, BN]), acc);
    }}
    {post}
    store(c, [bid(0), bid(1)], acc as bf16);
}}
"#
    )
}

fn ws_opts(ws: bool) -> CompileOptions {
    let mut o = CompileOptions::new(Arch::Sm90a);
    o.num_warps = Some(8);
    o.num_stages = Some(4);
    o.ws = ws;
    o
}

/// After the split into producer and consumers, the producer warpgroup would never
/// arrive: an Unsupported error at the `grid_sync`, not a panic or a hang.
#[test]
fn a_grid_sync_in_the_warp_specialized_part_is_an_error() {
    let src = gemm_with_sync(false);
    let file = SourceFile::new("mm.kg", src.as_str());
    // Without --ws the kernel compiles (and is cooperative).
    let k = compile(&file, &ws_opts(false)).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert!(k.launch.cooperative);
    assemble(&k.ptx, "sm_90a", "grid_sync_gemm");
    // With it, an error at the grid_sync that names it.
    let d = match compile(&file, &ws_opts(true)) {
        Ok(k) => panic!("compiled with --ws:\n{}", k.ptx),
        Err(d) => d,
    };
    let text = d.render(&file);
    assert!(
        d.0.iter().any(|e| e.code == ErrorCode::Unsupported),
        "{text}"
    );
    assert!(text.contains("grid_sync"), "{text}");
    assert!(text.contains("mm.kg:11:5"), "{text}");
}

/// Before the split every thread of the block, the producer warpgroup's too, runs the
/// kernel alike: a `grid_sync` there is lowered as in any kernel, before the split's
/// branch, and the kernel stays warp-specialized.
#[test]
fn a_grid_sync_before_the_warp_specialization_split_compiles() {
    let src = gemm_with_sync(true);
    let file = SourceFile::new("mm.kg", src.as_str());
    let k = compile(&file, &ws_opts(true)).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert!(k.entry.contains("__ws"), "{}", k.entry);
    assert_eq!(k.launch.threads_per_block, 384);
    assert!(k.launch.cooperative);
    let ptx = &k.ptx;
    let sync = ptx
        .find("atom.global.release.gpu.add.u32")
        .unwrap_or_else(|| panic!("{ptx}"));
    let split = ptx
        .find("setmaxnreg.inc")
        .unwrap_or_else(|| panic!("{ptx}"));
    assert!(sync < split, "the grid_sync is after the split:\n{ptx}");
    assert_eq!(count(ptx, "atom.global.release.gpu.add.u32"), 1);
    assemble(ptx, "sm_90a", "grid_sync_gemm_ws");
}
