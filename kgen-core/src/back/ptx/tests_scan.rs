//! Scans in PTX: every combine op and dtype, forward / reversed / exclusive, along each
//! axis of 1-D to 3-D tiles of awkward extents and on 1 to 32 warps, assembled by ptxas
//! for sm_80 and sm_90a with zero spills and zero stack; and the shape of the code for a
//! whole 4097-wide row (one shared-memory exchange, butterflies, two shuffles per
//! 64-bit value). What each element computes is tested on a simulated block
//! (`lower/scan_tests.rs`) and on the GPU by `kgen selftest --gpu` (`kernels-src/scan.kg`).

use super::tests::assemble;
use crate::span::SourceFile;
use crate::target::Arch;
use crate::CompileOptions;

/// The PTX of `src` for `arch` on `warps` warps (the heuristic's when `None`), assembled.
fn ptx(src: &str, arch: Arch, warps: Option<u32>) -> String {
    let file = SourceFile::new("scan.kg", src);
    let mut opts = CompileOptions::new(arch);
    opts.num_warps = warps;
    let k = crate::compile(&file, &opts).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assemble(&k.ptx, arch.name(), "scan");
    k.ptx
}

/// How many instructions are `op` (exactly that opcode).
fn count(ptx: &str, op: &str) -> usize {
    ptx.lines()
        .map(str::trim)
        .filter(|l| l.split_whitespace().next() == Some(op))
        .count()
}

/// A kernel that loads an `[a, b, c]` tile (rank 1 to 3: trailing extents 0 are
/// dropped) of `dt`, scans it with `call` (`cumsum(t, 1)`, ...) and stores it.
fn kernel(dt: &str, shape: &[u32], call: &str) -> String {
    let rank = shape.len();
    let zeros = vec!["0"; rank].join(", ");
    let dims: Vec<String> = shape.iter().map(|e| e.to_string()).collect();
    let load = if dt == "bool" {
        format!("load(x, [{zeros}], [{}]) > 0", dims.join(", "))
    } else {
        format!("load(x, [{zeros}], [{}])", dims.join(", "))
    };
    let xdt = if dt == "bool" { "i32" } else { dt };
    let store = if dt == "bool" { "s as i32" } else { "s" };
    format!(
        "kernel k(x: tensor<{xdt}, {rank}, contiguous>, y: tensor<{xdt}, {rank}, contiguous>) {{\n\
         let t = {load};\n\
         let s = {call};\n\
         store(y, [{zeros}], {store});\n}}\n"
    )
}

#[test]
fn every_op_and_dtype_assembles() {
    let ops: [(&str, &[&str]); 7] = [
        ("cumsum", &["f32", "f16", "bf16", "i32", "u32", "i64"]),
        ("cumprod", &["f32", "bf16", "i32", "i64"]),
        ("cummax", &["f32", "f16", "i32", "u32", "i64"]),
        ("cummin", &["f32", "bf16", "i32", "u32", "i64"]),
        ("and", &["i32", "u32", "i64", "bool"]),
        ("or", &["i32", "i64", "bool"]),
        ("xor", &["u32", "i64", "bool"]),
    ];
    for (op, dtypes) in ops {
        for dt in dtypes {
            for (flags, shape) in [
                ("", &[1000u32][..]),
                (", reverse = true", &[4097][..]),
                (", exclusive = true", &[7][..]),
                (", reverse = true, exclusive = true", &[3, 130][..]),
            ] {
                let axis = shape.len() - 1;
                let call = if op.starts_with("cum") {
                    format!("{op}(t, {axis}{flags})")
                } else {
                    format!("scan(t, {axis}, combine = {op}{flags})")
                };
                for arch in Arch::ALL {
                    ptx(&kernel(dt, shape, &call), arch, None);
                }
            }
        }
    }
}

#[test]
fn every_axis_of_2d_and_3d_tiles_on_any_warp_count() {
    let shapes: [&[u32]; 5] = [
        &[64, 33],
        &[7, 130],
        &[3, 5, 70],
        &[33, 2, 9],
        &[1, 1, 4097],
    ];
    for shape in shapes {
        for axis in 0..shape.len() {
            for warps in [1, 4, 8, 32] {
                // At most 64 elements a thread: the load and store alone of a larger
                // tile already spill at 1 warp.
                let padded: u32 = shape.iter().map(|e| e.next_power_of_two()).product();
                if padded > 64 * 32 * warps {
                    continue;
                }
                for call in [
                    format!("cumsum(t, {axis})"),
                    format!("cummax(t, {axis}, reverse = true, exclusive = true)"),
                ] {
                    for arch in Arch::ALL {
                        ptx(&kernel("f32", shape, &call), arch, Some(warps));
                    }
                }
            }
        }
    }
}

#[test]
fn a_long_row_is_one_exchange_and_butterflies() {
    // [4097] on 16 warps (the heuristic's choice): 2 register bits, 5 lane bits, 4 warp
    // bits, 2 register bits; 4 sub-block totals per thread go through the butterflies.
    let src = kernel("f32", &[1, 4097], "cumsum(t, 1)");
    for arch in Arch::ALL {
        let p = ptx(&src, arch, None);
        assert!(p.contains(".maxntid 512"), "{p}");
        // One barrier between the totals' stores and loads (none before: this is the
        // kernel's first use of shared memory, sync.rs).
        assert_eq!(count(&p, "bar.sync"), 1, "one barrier\n{p}");
        // Per total: a store and a load; a butterfly over the 5 lanes of the row, one
        // over 4 lanes that scans the 16 warps' totals, and one indexed shuffle.
        assert_eq!(count(&p, "st.shared.b32"), 4, "{p}");
        assert_eq!(count(&p, "ld.shared.b32"), 4, "{p}");
        assert_eq!(count(&p, "shfl.sync.bfly.b32"), 4 * (5 + 4), "{p}");
        assert_eq!(count(&p, "shfl.sync.idx.b32"), 4, "{p}");
    }
    // A 64-bit value crosses lanes in two halves: [64] on one warp is 2 elements a
    // thread (one 16-byte vector), one total through 5 lane bits.
    let src = kernel("i64", &[64], "cumsum(t, 0)");
    let p = ptx(&src, Arch::Sm90a, Some(1));
    assert_eq!(count(&p, "shfl.sync.bfly.b32"), 2 * 5, "{p}");
    assert_eq!(count(&p, "bar.sync"), 0, "one warp: no exchange\n{p}");
}

#[test]
fn half_sums_round_once_per_element() {
    // 1024 bf16 on 4 warps: 8 elements a thread, each rounded once (cvt.rn.bf16.f32)
    // from an f32 running sum (then used by the multiplication, whose own results are
    // packed for the store straight from f32); max keeps the elements as they are.
    let p = ptx(
        &kernel("bf16", &[1024], "cumsum(t, 0) * 3.0"),
        Arch::Sm90a,
        Some(4),
    );
    assert_eq!(count(&p, "cvt.rn.bf16.f32"), 8, "{p}");
    let p = ptx(
        &kernel("bf16", &[1024], "cummax(t, 0) * 3.0"),
        Arch::Sm90a,
        Some(4),
    );
    assert_eq!(count(&p, "cvt.rn.bf16.f32"), 0, "{p}");
}
