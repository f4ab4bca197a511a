//! Scratch buffers in PTX: placement at the start of `kg_smem` (the conversion scratch
//! after them), thread-private 16-byte chunks with no barrier, slots out of range that
//! trap (interpreter: an error) unless a fetch has nothing to copy; asynchronous
//! fetches (`cp.async` groups counted by `scratch_wait`, or issued loads whose stores
//! wait until the fetch must be complete) and their interpreter semantics.

use super::tests::{assemble, compile_source_sm90a};
use crate::Arch;

/// A bf16 row cached in a scratch buffer and read back in reverse, next to a
/// cross-warp reduction (which needs the conversion scratch too).
const SRC: &str = r#"
kernel cached(x: tensor<bf16, 2, contiguous>, y: tensor<bf16, 2, contiguous>) {
    let row = bid(0);
    let n = cdiv(shape(x, 1), 1024);
    let cache = scratch(6, [1, 1024], bf16);
    let mut s = zeros([1024], f32);
    for k in 0..n {
        let t = load(x, [row, k], [1, 1024]);
        scratch_store(cache, k, t);
        s += t.reshape([1024]) as f32;
    }
    let total = sum(s, 0);
    for kk in 0..n {
        let t = scratch_load(cache, n - 1 - kk) as f32;
        store(y, [row, n - 1 - kk], (t - total) as bf16);
    }
}
"#;

#[test]
fn scratch_slots_are_thread_private_chunks_before_the_conversion_scratch() {
    let ptx = compile_source_sm90a(SRC, 4, "cached");
    // 6 slots x 1024 bf16 = 12288 bytes of scratch; the reduction's scratch follows it.
    let decl = ptx
        .lines()
        .find(|l| l.contains(".b8 kg_smem["))
        .expect("a shared-memory declaration");
    let bytes: u32 = decl
        .split('[')
        .nth(1)
        .and_then(|s| s.split(']').next())
        .and_then(|s| s.parse().ok())
        .expect("its size");
    assert!(bytes > 6 * 1024 * 2, "{decl}");
    assert!(
        ptx.contains(", 12288;"),
        "the conversion scratch starts past the buffer:\n{ptx}"
    );
    // One 16-byte chunk per thread and slot: 8 bf16 elements, 128 threads.
    assert_eq!(ptx.matches("st.shared.v4.b32").count(), 1, "{ptx}");
    assert_eq!(ptx.matches("ld.shared.v4.b32").count(), 1, "{ptx}");
    // A slot out of range traps: one `@!p trap` before the store and the load, which
    // are not predicated on the slot.
    assert_eq!(ptx.matches("trap;").count(), 2, "{ptx}");
    for line in ptx.lines().filter(|l| l.contains(".shared.v4.b32")) {
        assert!(!line.trim_start().starts_with('@'), "{line}");
    }
    // No barrier orders the scratch accesses: only the reduction's pair.
    assert_eq!(ptx.matches("bar.sync").count(), 2, "{ptx}");
    let file = crate::SourceFile::new("cached.kg", SRC);
    let sm80 = crate::compile(&file, &crate::CompileOptions::new(Arch::Sm80))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assemble(&sm80.ptx, "sm_80", "cached");
}

/// The interpreter agrees with a direct computation, and reading a slot the block has
/// not stored is an interpreter error (on a GPU it is unspecified data).
/// Runs the first kernel of `src` (`x`, `y`: [rows, cols] bf16, a block per row) in
/// the interpreter on `x[i] = value(i)` and a NaN-poisoned `y`; returns (x, y).
fn run_bf16_rows(
    src: &str,
    rows: usize,
    cols: usize,
    value: impl Fn(usize) -> f64,
) -> Result<(Vec<f64>, Vec<f64>), crate::interp::InterpError> {
    use crate::host::{ArgValue, HostTensor};
    use crate::types::DType;
    let file = crate::SourceFile::new("rows.kg", src);
    let (func, _) = crate::compile_to_ir(&file, &crate::CompileOptions::new(Arch::Sm90a))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let xs: Vec<f64> = (0..rows * cols).map(value).collect();
    let mut args = vec![
        ArgValue::Tensor(HostTensor::from_f64(DType::BF16, &[rows, cols], &xs)),
        ArgValue::Tensor(HostTensor::from_f64(
            DType::BF16,
            &[rows, cols],
            &vec![f64::NAN; rows * cols],
        )),
    ];
    crate::interp::run(&func, [rows as u32, 1, 1], &mut args)?;
    let ArgValue::Tensor(y) = &args[1] else {
        panic!("y")
    };
    Ok((xs, y.to_f64_vec()))
}

#[test]
fn scratch_round_trips_in_the_interpreter_and_unwritten_slots_are_errors() {
    let (rows, cols) = (3usize, 2500usize);
    let value = |i: usize| ((i * 37 % 101) as f64 - 50.0) / 8.0;
    let (xs, y) = run_bf16_rows(SRC, rows, cols, value).expect("runs");
    for r in 0..rows {
        let row = &xs[r * cols..(r + 1) * cols];
        let total: f64 = row.iter().sum();
        for c in [0, 1, 1023, 1024, 2047, 2048, cols - 1] {
            let want = half::bf16::from_f64(row[c] - total).to_f64();
            let got = y[r * cols + c];
            assert!(
                (got - want).abs() <= want.abs() * 1e-2 + 1e-2,
                "({r}, {c}): {got} vs {want}"
            );
        }
    }
    // Reading slot 5 (never stored for 3 tiles) fails in the interpreter.
    let bad = SRC.replace("scratch_load(cache, n - 1 - kk)", "scratch_load(cache, 5)");
    let err = run_bf16_rows(&bad, 1, cols, value).expect_err("unwritten slot");
    assert!(err.to_string().contains("has not stored"), "{err}");
}

/// A row streamed through a 4-slot buffer by fetches, `D` in flight, each tile read
/// back (and doubled) after the wait that completes its fetch.
const FETCH_SRC: &str = r#"
kernel streamed<T: float = bf16, D: int = 2>(x: tensor<T, 2, contiguous>, y: tensor<T, 2, contiguous>) {
    let row = bid(0);
    let n = cdiv(shape(x, 1), 256);
    let buf = scratch(8, [1, 256], T);
    for k in 0..D {
        scratch_fetch(buf, k, x, [row, k], pad = 1.0);
    }
    for k in 0..n {
        scratch_fetch(buf, (k + D) % 8, x, [row, k + D], pad = 1.0, eviction_policy = evict_first);
        scratch_wait(D);
        let t = scratch_load(buf, k % 8) as f32;
        store(y, [row, k], (t + t) as T);
    }
}
"#;

fn compile_fetch(defines: &[(&str, &str)], align: u32, arch: Arch) -> String {
    let file = crate::SourceFile::new("streamed.kg", FETCH_SRC);
    let mut opts = crate::CompileOptions::new(arch);
    opts.num_warps = Some(1);
    opts.defines = defines
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    opts.tensor_align = vec![("x".into(), align), ("y".into(), align)];
    let ptx = crate::compile(&file, &opts)
        .unwrap_or_else(|d| panic!("{}", d.render(&file)))
        .ptx;
    let sm = if arch == Arch::Sm80 {
        "sm_80"
    } else {
        "sm_90a"
    };
    assemble(&ptx, sm, &format!("streamed_a{align}"));
    ptx
}

#[test]
fn aligned_fetches_are_cp_async_groups_counted_by_the_wait() {
    for arch in Arch::ALL {
        // 16-byte aligned bf16 rows: one 16-byte copy per thread chunk (32 threads, 256
        // elements: 8 per thread), one group per fetch site, the wait's count as given.
        let ptx = compile_fetch(&[("D", "3")], 16, arch);
        assert_eq!(ptx.matches("cp.async.cg.shared.global").count(), 2, "{ptx}");
        assert_eq!(ptx.matches("cp.async.commit_group").count(), 2, "{ptx}");
        assert!(ptx.contains("cp.async.wait_group 3;"), "{ptx}");
        assert!(
            ptx.contains("L2::cache_hint"),
            "the eviction hint is kept:\n{ptx}"
        );
        // Out-of-bounds vectors get the padding (bf16 1.0 = 0x3f80, twice per word).
        assert!(ptx.contains("1065369472"), "{ptx}");
        // Thread-private chunks: no barrier at all.
        assert!(!ptx.contains("bar.sync"), "{ptx}");
        // 4-byte aligned f32 rows: 4-byte copies (`.ca`, `.cg` is 16 bytes only).
        let ptx = compile_fetch(&[("T", "f32")], 4, arch);
        assert!(ptx.contains("cp.async.ca.shared.global"), "{ptx}");
        assert!(ptx.contains(", 4;"), "{ptx}");
    }
}

#[test]
fn unaligned_fetches_store_where_the_fetch_must_complete() {
    // 2-byte aligned bf16 rows: no cp.async can copy them. The loads are issued at the
    // fetch; the stores into the slot come at the end of the loop body (after the tile
    // read and the store of y), not at the wait, which leaves this fetch in flight.
    let ptx = compile_fetch(&[], 2, Arch::Sm90a);
    assert!(!ptx.contains("cp.async.cg"), "{ptx}");
    assert!(!ptx.contains("cp.async.ca"), "{ptx}");
    let body = ptx
        .split("cp.async.wait_group 2;")
        .nth(1)
        .expect("the loop's wait");
    let read = body.find("ld.shared").expect("the tile read");
    let y_store = body.find("st.global").expect("the store of y");
    let slot_store = body.find("st.shared").expect("the fetch's slot store");
    assert!(read < y_store && y_store < slot_store, "{body}");
    // With D = 0 the wait completes the fetch just issued: its stores precede the wait.
    let ptx = compile_fetch(&[("D", "0")], 2, Arch::Sm90a);
    let before = ptx.split("cp.async.wait_group 0;").next().expect("wait");
    let loop_part = before.rsplit("bra.uni").next().expect("loop head");
    assert!(loop_part.contains("st.shared"), "{ptx}");
    compile_fetch(&[], 2, Arch::Sm80);
}

/// Runs `src` (kernel `streamed`) on a [2, 1000] bf16 row pair in the interpreter.
fn run_streamed(src: &str) -> Result<(Vec<f64>, Vec<f64>), crate::interp::InterpError> {
    run_bf16_rows(src, 2, 1000, |i| ((i * 29 % 97) as f64 - 48.0) / 4.0)
}

#[test]
fn fetches_complete_at_the_wait_in_the_interpreter() {
    for d in ["0", "1", "3"] {
        let src = FETCH_SRC.replace("D: int = 2", &format!("D: int = {d}"));
        let (xs, y) = run_streamed(&src).unwrap_or_else(|e| panic!("D={d}: {e}"));
        for (i, (&x, &got)) in xs.iter().zip(&y).enumerate() {
            let want = 2.0 * half::bf16::from_f64(x).to_f64();
            assert_eq!(got, want, "D={d} element {i}");
        }
    }
    // Waiting for one fewer fetch than the program needs: the tile's slot is read while
    // its fetch is in flight, which the interpreter reports.
    let early = FETCH_SRC.replace("scratch_wait(D);", "scratch_wait(D + 1);");
    let err = run_streamed(&early).expect_err("read in flight");
    assert!(
        err.to_string()
            .contains("scratch_load of slot 0 of scratch buffer `buf` while a scratch_fetch"),
        "{err}"
    );
    // A fetch into a slot whose previous fetch is still in flight.
    let clash = FETCH_SRC.replace("(k + D) % 8", "k % 2");
    let err = run_streamed(&clash).expect_err("fetch over a fetch");
    assert!(err.to_string().contains("scratch_fetch of slot"), "{err}");
}

/// A slot outside `0..N` is an error, never a silently dropped store or a read of
/// zeros: a row longer than the buffer (7 tiles into 6 slots) fails at its seventh
/// store, a load past the buffer or below it fails, each naming the slot and N. (The GPU
/// traps at the same accesses: `scratch_slots_are_thread_private_chunks...`.)
#[test]
fn scratch_slots_out_of_range_are_interpreter_errors() {
    let value = |i: usize| ((i * 13 % 31) as f64 - 15.0) / 4.0;
    let err = run_bf16_rows(SRC, 2, 6 * 1024 + 1, value).expect_err("7 tiles, 6 slots");
    assert!(
        err.to_string()
            .contains("scratch_store of slot 6 of scratch buffer `cache`, which has slots 0..6"),
        "{err}"
    );
    for (load, slot) in [("n + 3 - kk", "6"), ("kk - 1", "-1")] {
        let bad = SRC.replace("n - 1 - kk)", &format!("{load})"));
        let err = run_bf16_rows(&bad, 1, 2500, value).expect_err(load);
        assert!(
            err.to_string().contains(&format!(
                "scratch_load of slot {slot} of scratch buffer `cache`, which has slots 0..6"
            )),
            "{err}"
        );
    }
}

/// A pipelined row through a buffer of exactly as many slots as the row has tiles:
/// the fetches past the row name slots past the buffer, which is allowed since they
/// copy nothing (and they keep the count of fetches in flight); a row with more tiles
/// than slots fetches real data into a slot past the buffer, which is an error (the GPU
/// traps: `setp.ge.and` of the slot and the vector's in-bounds predicate).
#[test]
fn fetches_past_the_buffer_must_have_nothing_to_copy() {
    let src = FETCH_SRC
        .replace("scratch(8, [1, 256], T)", "scratch(4, [1, 256], T)")
        .replace("(k + D) % 8", "k + D")
        .replace("k % 8", "k");
    // 1000 columns: 4 tiles of 256, the fetches of tiles 4 and 5 past the row.
    let (xs, y) = run_streamed(&src).expect("fetches of nothing past the buffer");
    for (i, (&x, &got)) in xs.iter().zip(&y).enumerate() {
        assert_eq!(got, 2.0 * half::bf16::from_f64(x).to_f64(), "element {i}");
    }
    // 1500 columns: 6 tiles, tile 4 fetched into slot 4 of 4.
    let err = run_bf16_rows(&src, 2, 1500, |i| (i % 17) as f64).expect_err("data past the buffer");
    assert!(
        err.to_string()
            .contains("scratch_fetch of slot 4 of scratch buffer `buf`, which has slots 0..4"),
        "{err}"
    );
    for arch in Arch::ALL {
        let file = crate::SourceFile::new("streamed.kg", src.as_str());
        let mut opts = crate::CompileOptions::new(arch);
        opts.num_warps = Some(1);
        let ptx = crate::compile(&file, &opts)
            .unwrap_or_else(|d| panic!("{}", d.render(&file)))
            .ptx;
        assemble(&ptx, arch.name(), "streamed_past");
        // Both fetch sites check the slot against the vector's in-bounds predicate.
        assert_eq!(ptx.matches("setp.ge.and.u32").count(), 2, "{ptx}");
    }
}

/// The same rule for `scratch_gather`: a gather into a slot past the buffer whose
/// elements are all masked off copies nothing; one with an element to copy is an
/// error.
#[test]
fn gathers_past_the_buffer_must_have_nothing_to_copy() {
    let src = r#"
kernel gathered(x: tensor<bf16, 2, contiguous>, y: tensor<bf16, 2, contiguous>) {
    let row = bid(0);
    let buf = scratch(2, [256], bf16);
    let c = arange(0, 256);
    scratch_gather(buf, 0, x, [row, c], mask = c < shape(x, 1));
    scratch_gather(buf, SLOT, x, [row, c], mask = c < LIMIT);
    scratch_wait(0);
    store(y, [row, 0], reshape(scratch_load(buf, 0), [1, 256]));
}
"#;
    let with = |slot: &str, limit: &str| src.replace("SLOT", slot).replace("LIMIT", limit);
    // A runtime slot 2 (shape(x, 0) = 2 rows) with every element masked off: fine.
    let (xs, y) = run_bf16_rows(&with("shape(x, 0)", "0"), 2, 256, |i| (i % 7) as f64)
        .expect("masked-off gather past the buffer");
    assert_eq!(xs, y);
    let err = run_bf16_rows(&with("shape(x, 0)", "1"), 2, 256, |i| (i % 7) as f64)
        .expect_err("one element past the buffer");
    assert!(
        err.to_string()
            .contains("scratch_gather of slot 2 of scratch buffer `buf`, which has slots 0..2"),
        "{err}"
    );
    let file = crate::SourceFile::new("gathered.kg", with("shape(x, 0)", "1"));
    let ptx = crate::compile(&file, &crate::CompileOptions::new(Arch::Sm90a))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)))
        .ptx;
    assemble(&ptx, "sm_90a", "gathered");
    assert!(ptx.contains("trap;"), "{ptx}");
}
