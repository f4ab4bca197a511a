//! Vectorized `gather` / `scatter`: the axis facts that allow them, the PTX they give
//! (16-byte vectors where the coordinates are proven contiguous and aligned, element
//! accesses everywhere else), and the scatter's split of runs its mask cuts.

use super::axis::{analyze, AxisInfo, UNBOUNDED};
use super::tests::assemble;
use crate::{Arch, CompileOptions, SourceFile};

/// Compiles `src` for sm_90a (4 warps; `align` overrides per tensor) and assembles it.
pub(super) fn ptx_of(src: &str, align: &[(&str, u32)]) -> String {
    let file = SourceFile::new("gather.kg", src);
    let mut opts = CompileOptions::new(Arch::Sm90a);
    opts.num_warps = Some(4);
    opts.tensor_align = align.iter().map(|(n, a)| (n.to_string(), *a)).collect();
    let k = crate::compile(&file, &opts).unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assemble(&k.ptx, "sm_90a", "gather");
    k.ptx
}

/// How many instructions of the PTX are `op` (followed by operands or `;`:
/// `ld.global.b16` does not count `ld.global.v4.b32`).
fn count(ptx: &str, op: &str) -> usize {
    ptx.lines()
        .map(|l| l.trim())
        .map(|l| match l.strip_prefix('@') {
            Some(rest) => rest.split_once(' ').map_or("", |(_, i)| i),
            None => l,
        })
        .filter(|l| l.starts_with(&format!("{op} ")) || *l == format!("{op};"))
        .count()
}

/// The facts of the last value named `name` in the first kernel of `src`.
fn facts_of(src: &str, name: &str) -> AxisInfo {
    let file = SourceFile::new("facts.kg", src);
    let (func, _) = crate::compile_to_ir(&file, &CompileOptions::new(Arch::Sm90a))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let facts = analyze(&func);
    let v = func
        .values
        .iter()
        .filter(|(_, v)| v.name.as_deref() == Some(name))
        .map(|(id, _)| id)
        .last()
        .unwrap_or_else(|| panic!("no value named {name}"));
    facts.get(v)
}

/// Rows of odd length `n` walked in 8-aligned windows of flat tensors; `OFFS` and
/// `MASK` are substituted per test.
const WINDOW: &str = r#"
kernel w(x: tensor<bf16, 1, contiguous>, y: tensor<bf16, 1, contiguous>, n: i32) {
    let row = bid(0);
    let start = (row as i64) * (n as i64);
    let wbase = (start / 8) * 8;
    let lead = (start - wbase) as i32;
    let wlen = ((((start + (n as i64) + 7) / 8) * 8) - wbase) as i32;
    for k in 0..cdiv(wlen, 1024) {
        let rel = arange(0, 1024) + k * 1024;
        let offs = OFFS;
        let inrow = rel >= lead && rel < lead + n;
        let fits = rel < wlen;
        let v = gather(x, [offs], mask = GMASK, other = 0.0) as f32;
        scatter(y, [offs], (v * 2.0) as bf16, mask = SMASK);
    }
}
"#;

fn window(offs: &str, gmask: &str, smask: &str) -> String {
    WINDOW
        .replace("OFFS", offs)
        .replace("GMASK", gmask)
        .replace("SMASK", smask)
}

#[test]
fn facts_follow_the_window_arithmetic() {
    let src = window("wbase + (rel as i64)", "fits", "inrow");
    // (start / 8) * 8: a multiple of 8 whatever start is.
    assert_eq!(facts_of(&src, "wbase").divisibility, 8);
    assert_eq!(facts_of(&src, "wbase").constancy, UNBOUNDED);
    // arange + k * 1024: runs of 1024 starting at multiples of 1024.
    let rel = facts_of(&src, "rel");
    assert_eq!(
        (rel.contiguity, rel.divisibility, rel.constancy),
        (1024, 1024, 1)
    );
    // Plus the window base: still contiguous, only 8-aligned.
    let offs = facts_of(&src, "offs");
    assert_eq!((offs.contiguity, offs.divisibility), (1024, 8));
    // rel < wlen (a multiple of 8): constant over aligned groups of 8; the row bounds
    // (lead is any number) are not.
    assert_eq!(facts_of(&src, "fits").constancy, 8);
    assert_eq!(facts_of(&src, "inrow").constancy, 1);
    // Unaligned starts and strided coordinates prove nothing.
    let unaligned = window("start + (rel as i64)", "fits", "inrow");
    assert_eq!(facts_of(&unaligned, "offs").divisibility, 1);
    assert_eq!(facts_of(&unaligned, "offs").contiguity, 1024);
    let strided = window("wbase + ((rel * 2) as i64)", "fits", "inrow");
    assert_eq!(facts_of(&strided, "offs").contiguity, 1);
}

#[test]
fn aligned_windows_use_16_byte_vectors() {
    let ptx = ptx_of(&window("wbase + (rel as i64)", "fits", "inrow"), &[]);
    // 1024 elements over 128 threads: one 8-element run per thread and tile.
    assert_eq!(count(&ptx, "ld.global.v4.b32"), 1, "{ptx}");
    assert_eq!(count(&ptx, "ld.global.b16"), 0, "{ptx}");
    // The scatter's mask cuts the window's edge runs: the run whole where every element
    // is in the row, else element by element under each element's own mask.
    assert_eq!(count(&ptx, "st.global.v4.b32"), 1, "{ptx}");
    assert_eq!(count(&ptx, "st.global.b16"), 8, "{ptx}");
    assert_eq!(count(&ptx, "not.pred"), 1, "{ptx}");
    // A mask constant over every run keeps the scatter's runs whole.
    let whole = ptx_of(&window("wbase + (rel as i64)", "fits", "fits"), &[]);
    assert_eq!(count(&whole, "st.global.v4.b32"), 1, "{whole}");
    assert_eq!(count(&whole, "st.global.b16"), 0, "{whole}");
    // sm_80 takes the same path.
    let file = SourceFile::new("w.kg", window("wbase + (rel as i64)", "fits", "inrow"));
    let sm80 = crate::compile(&file, &CompileOptions::new(Arch::Sm80))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assert!(count(&sm80.ptx, "ld.global.v4.b32") >= 1);
    assemble(&sm80.ptx, "sm_80", "gather_sm80");
}

/// A labelled kernel source and the tensor alignments it is compiled with.
type LabelledSource<'a> = (&'a str, String, Vec<(&'a str, u32)>);

#[test]
fn unproven_accesses_stay_element_by_element() {
    let cases: Vec<LabelledSource> = vec![
        // The row start itself: 2-byte aligned.
        (
            "unaligned start",
            window("start + (rel as i64)", "fits", "inrow"),
            vec![],
        ),
        // Every other element.
        (
            "strided",
            window("wbase + ((rel * 2) as i64)", "fits", "inrow"),
            vec![],
        ),
        // A gather mask that varies inside a run (a whole-vector load would need a
        // select per element; the gather keeps its element loads).
        (
            "per-element gather mask",
            window("wbase + (rel as i64)", "inrow", "inrow"),
            vec![],
        ),
        // Tensors the specialization only knows to be 2-byte aligned.
        (
            "2-byte tensors",
            window("wbase + (rel as i64)", "fits", "inrow"),
            vec![("x", 2), ("y", 2)],
        ),
        // Not declared contiguous: the last stride is a runtime value.
        (
            "strided tensors",
            window("wbase + (rel as i64)", "fits", "inrow")
                .replace("tensor<bf16, 1, contiguous>", "tensor<bf16, 1>"),
            vec![],
        ),
    ];
    for (what, src, align) in cases {
        let ptx = ptx_of(&src, &align);
        let gather_vectorized = count(&ptx, "ld.global.v4.b32") > 0;
        let scatter_vectorized = count(&ptx, "st.global.v4.b32") > 0;
        if what == "per-element gather mask" {
            // The scatter still vectorizes (its mask is handled per run).
            assert!(!gather_vectorized && scatter_vectorized, "{what}:\n{ptx}");
            assert_eq!(count(&ptx, "ld.global.b16"), 8, "{what}:\n{ptx}");
        } else {
            assert!(!gather_vectorized && !scatter_vectorized, "{what}:\n{ptx}");
            assert_eq!(count(&ptx, "ld.global.b16"), 8, "{what}:\n{ptx}");
            assert_eq!(count(&ptx, "st.global.b16"), 8, "{what}:\n{ptx}");
        }
    }
}

/// Triton's softmax written with offsets: rows of a 2-D contiguous tensor, the row
/// coordinate constant along the vector, the column coordinate an arange.
#[test]
fn two_dimensional_offsets_and_wider_elements() {
    let src = r#"
kernel sm(x: tensor<f32, 2, contiguous>, y: tensor<f32, 2, contiguous>) {
    let row = bid(0);
    let cols = arange(0, 512);
    let mask = cols < shape(x, 1);
    let rows = full([512], row, i32);
    let v = gather(x, [rows, cols], mask = MASK, other = -inf);
    let e = exp(v - max(v, axis = 0));
    scatter(y, [rows, cols], e / sum(e, 0), mask = mask);
}
"#;
    // An unmasked gather: 4-element f32 vectors, the row offset computed once per run.
    let ptx = ptx_of(&src.replace("MASK", "rows >= 0"), &[]);
    assert_eq!(count(&ptx, "ld.global.v4.b32"), 1, "{ptx}");
    // `cols < shape(x, 1)` is not known to be constant over 4 elements: the gather loads
    // element by element, the scatter splits its runs.
    let masked = ptx_of(&src.replace("MASK", "mask"), &[]);
    assert_eq!(count(&masked, "ld.global.v4.b32"), 0, "{masked}");
    assert_eq!(count(&masked, "ld.global.b32"), 4, "{masked}");
    assert_eq!(count(&masked, "st.global.v4.b32"), 1, "{masked}");
    assert_eq!(count(&masked, "st.global.b32"), 4, "{masked}");
    // A declared extent that is a multiple of the vector makes the same mask constant
    // over each run: whole vectors both ways.
    let declared = ptx_of(
        &src.replace("MASK", "mask").replace(
            "tensor<f32, 2, contiguous>",
            "tensor<f32, [_, 500], contiguous>",
        ),
        &[],
    );
    assert_eq!(count(&declared, "ld.global.v4.b32"), 1, "{declared}");
    assert_eq!(count(&declared, "st.global.b32"), 0, "{declared}");
}

/// Rows of odd length `n` of a flat bf16 tensor, each block fetching its row's aligned
/// window in tiles of 256 with `scratch_gather` (`D` in flight), then writing the
/// row's own elements times 2 with a vector scatter. `START` picks the coordinates.
const GATHER_FETCH: &str = r#"
kernel gf<D: int = 2>(x: tensor<bf16, 1, contiguous>, y: tensor<bf16, 1, contiguous>, n: i32) {
    let row = bid(0);
    let start = (row as i64) * (n as i64);
    let wbase = START;
    let lead = (start - wbase) as i32;
    let wlen = ((((start + (n as i64) + 7) / 8) * 8) - wbase) as i32;
    let nt = cdiv(wlen, 256);
    let buf = scratch(4, [256], bf16);
    for k in 0..D {
        let rel = arange(0, 256) + k * 256;
        scratch_gather(buf, k % 4, x, [wbase + (rel as i64)], mask = rel < wlen, other = 0.0);
    }
    for k in 0..nt {
        let nrel = arange(0, 256) + (k + D) * 256;
        scratch_gather(buf, (k + D) % 4, x, [wbase + (nrel as i64)], mask = nrel < wlen, other = 0.0);
        scratch_wait(D);
        let rel = arange(0, 256) + k * 256;
        let v = READ;
        scatter(y, [wbase + (rel as i64)], (v as f32 * 2.0) as bf16, mask = rel >= lead && rel < lead + n);
    }
    scratch_wait(0);
}
"#;

fn gather_fetch(start: &str, read: &str) -> String {
    GATHER_FETCH.replace("START", start).replace("READ", read)
}

/// Runs `src` in the interpreter over `rows` rows of `n` (x[i] = value(i), y poisoned);
/// returns (x, y).
fn run_flat_rows(
    src: &str,
    rows: usize,
    n: usize,
) -> Result<(Vec<f64>, Vec<f64>), crate::interp::InterpError> {
    use crate::host::{ArgValue, HostTensor};
    use crate::types::{DType, Scalar};
    let file = SourceFile::new("gf.kg", src);
    let (func, _) = crate::compile_to_ir(&file, &CompileOptions::new(Arch::Sm90a))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let xs: Vec<f64> = (0..rows * n)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) / 8.0)
        .collect();
    let mut args = vec![
        ArgValue::Tensor(HostTensor::from_f64(DType::BF16, &[rows * n], &xs)),
        ArgValue::Tensor(HostTensor::from_f64(
            DType::BF16,
            &[rows * n],
            &vec![f64::NAN; rows * n],
        )),
        ArgValue::Scalar(Scalar::Int(n as i64, DType::I32)),
    ];
    crate::interp::run(&func, [rows as u32, 1, 1], &mut args)?;
    let ArgValue::Tensor(y) = &args[1] else {
        panic!("y")
    };
    Ok((xs, y.to_f64_vec()))
}

#[test]
fn scratch_gather_streams_aligned_windows_with_cp_async() {
    let src = gather_fetch("(start / 8) * 8", "scratch_load(buf, k % 4)");
    let ptx = ptx_of(&src, &[]);
    // Each thread's 8-element (16-byte) chunk of a slot is one `cp.async.cg`; the
    // padding for masked-off chunks by `st.shared`; one group per fetch.
    assert_eq!(count(&ptx, "cp.async.cg.shared.global"), 2, "{ptx}");
    assert_eq!(count(&ptx, "st.shared.v4.b32"), 2, "{ptx}");
    assert_eq!(count(&ptx, "cp.async.commit_group"), 2, "{ptx}");
    assert_eq!(count(&ptx, "ld.global.b16"), 0, "{ptx}");
    // sm_80 alike.
    let file = SourceFile::new("gf.kg", src.as_str());
    let sm80 = crate::compile(&file, &CompileOptions::new(Arch::Sm80))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)))
        .ptx;
    assemble(&sm80, "sm_80", "gather_fetch_sm80");
    assert_eq!(count(&sm80, "cp.async.cg.shared.global"), 2, "{sm80}");
    // Unaligned coordinates: no `cp.async` can copy them; the gather's element loads are
    // issued at the fetch and stored into the slot where the fetch must be complete
    // (still one commit group per fetch, so the wait counts stay right).
    let unaligned = ptx_of(&gather_fetch("start", "scratch_load(buf, k % 4)"), &[]);
    assert_eq!(
        count(&unaligned, "cp.async.ca.shared.global"),
        0,
        "{unaligned}"
    );
    assert_eq!(
        count(&unaligned, "cp.async.cg.shared.global"),
        0,
        "{unaligned}"
    );
    // (No vector proven: the slots keep the default 2 elements per thread.)
    assert_eq!(count(&unaligned, "ld.global.b16"), 4, "{unaligned}");
    assert_eq!(count(&unaligned, "cp.async.commit_group"), 2, "{unaligned}");
}

#[test]
fn scratch_gather_in_the_interpreter() {
    // Windows and rows that end mid-vector, rows shorter than a tile, several tiles.
    for (rows, n) in [(8usize, 1001usize), (5, 7), (3, 700)] {
        for start in ["(start / 8) * 8", "start"] {
            let src = gather_fetch(start, "scratch_load(buf, k % 4)");
            let (x, y) = run_flat_rows(&src, rows, n).unwrap_or_else(|e| panic!("{e}"));
            for (i, (a, b)) in x.iter().zip(&y).enumerate() {
                let want = half::bf16::from_f64(*a).to_f64() * 2.0;
                assert_eq!(*b, want, "rows {rows} n {n} {start}: element {i}");
            }
        }
    }
    // Reading the slot of the newest fetch before the wait that completes it.
    let early = gather_fetch("(start / 8) * 8", "scratch_load(buf, (k + D) % 4)");
    let err = run_flat_rows(&early, 2, 1001).expect_err("read in flight");
    assert!(
        err.to_string().contains("scratch_gather") || err.to_string().contains("in flight"),
        "{err}"
    );
    assert!(
        matches!(err, crate::interp::InterpError::FetchInFlight { .. }),
        "{err}"
    );
}

/// A 2-D slot filled by `scratch_gather` from a 2-D tensor: the row coordinate is
/// constant along each run, the column coordinate an `arange`, so each thread's chunk is
/// one `cp.async`; the interpreter agrees with a direct computation, and a strided
/// (not `contiguous`) tensor takes the element-load fallback with the same results.
#[test]
fn scratch_gather_fills_two_dimensional_slots() {
    use crate::host::{ArgValue, HostTensor};
    use crate::types::DType;
    let src = r#"
kernel g2(x: tensor<f32, 2, contiguous>, y: tensor<f32, 2, contiguous>) {
    let r0 = bid(0) * 4;
    let rows = expand_dims(arange(0, 4), 1) + r0;
    let cols = expand_dims(arange(0, 64), 0);
    let buf = scratch(1, [4, 64], f32);
    scratch_gather(buf, 0, x, [rows, cols], mask = rows < shape(x, 0), other = -1.0);
    scratch_wait(0);
    store(y, [bid(0), 0], scratch_load(buf, 0) * 3.0);
}
"#;
    for (src, vectors) in [
        (src.to_string(), true),
        (
            src.replacen("tensor<f32, 2, contiguous>", "tensor<f32, 2>", 1),
            false,
        ),
    ] {
        let ptx = ptx_of(&src, &[]);
        let copies = count(&ptx, "cp.async.cg.shared.global");
        assert_eq!(copies > 0, vectors, "{ptx}");
        let file = SourceFile::new("g2.kg", src.as_str());
        let (func, _) = crate::compile_to_ir(&file, &CompileOptions::new(Arch::Sm90a))
            .unwrap_or_else(|d| panic!("{}", d.render(&file)));
        let (rows, cols) = (7usize, 64usize);
        let xs: Vec<f64> = (0..rows * cols).map(|i| (i % 97) as f64 - 40.0).collect();
        let mut args = vec![
            ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[rows, cols], &xs)),
            ArgValue::Tensor(HostTensor::from_f64(
                DType::F32,
                &[8, cols],
                &vec![f64::NAN; 8 * cols],
            )),
        ];
        crate::interp::run(&func, [2, 1, 1], &mut args).unwrap_or_else(|e| panic!("{e}"));
        let ArgValue::Tensor(y) = &args[1] else {
            panic!("y")
        };
        let y = y.to_f64_vec();
        for r in 0..8 {
            for c in 0..cols {
                let want = if r < rows {
                    xs[r * cols + c] * 3.0
                } else {
                    -3.0
                };
                assert_eq!(y[r * cols + c], want, "row {r} col {c}");
            }
        }
    }
}

/// `gdc_wait()` / `gdc_launch_dependents()`: `griddepcontrol` on sm_90a, nothing on
/// sm_80; a kernel that waits is flagged for a programmatic dependent launch on sm_90a
/// only, and one that only lets its dependents start is not.
#[test]
fn grid_dependency_control() {
    let src = |body: &str| {
        format!(
            "kernel k(x: tensor<f32, 1>, y: tensor<f32, 1>) {{\n{body}\n\
             store(y, [bid(0)], load(x, [bid(0)], [256]) * 2.0);\n}}\n"
        )
    };
    let compile = |text: String, arch: Arch| {
        let file = SourceFile::new("gdc.kg", text);
        crate::compile(&file, &CompileOptions::new(arch))
            .unwrap_or_else(|d| panic!("{}", d.render(&file)))
    };
    let both = src("gdc_launch_dependents();\ngdc_wait();");
    let k90 = compile(both.clone(), Arch::Sm90a);
    assemble(&k90.ptx, "sm_90a", "gdc");
    assert_eq!(count(&k90.ptx, "griddepcontrol.wait"), 1, "{}", k90.ptx);
    assert_eq!(count(&k90.ptx, "griddepcontrol.launch_dependents"), 1);
    assert!(k90.launch.programmatic_dependency);
    let k80 = compile(both, Arch::Sm80);
    assert!(!k80.ptx.contains("griddepcontrol"), "{}", k80.ptx);
    assert!(!k80.launch.programmatic_dependency);
    let trigger_only = compile(src("gdc_launch_dependents();"), Arch::Sm90a);
    assert!(!trigger_only.launch.programmatic_dependency);
    let plain = compile(src(""), Arch::Sm90a);
    assert!(!plain.launch.programmatic_dependency);
}

/// `barrier()`: where the kernel puts it, on both targets. After loads (since the last
/// branch target or barrier) it is a `bar.red.or.pred` over a predicate read from each
/// load's destination, so a thread reaches it only with its data (a `bar.sync` would
/// not wait: ptxas moves the loads' uses past it); with no such load a `bar.sync 0`.
/// Two cross-warp reductions on either side of it are not batched across it.
#[test]
fn block_barrier_stays_where_the_kernel_puts_it() {
    let compile = |body: &str, arch: Arch| {
        let text = format!(
            "kernel k(x: tensor<f32, 1>, z: tensor<f32, 1>, y: tensor<f32, 1>, s: tensor<f32, 1>) {{\n{body}\n}}\n"
        );
        let file = SourceFile::new("barrier.kg", text);
        let opts = CompileOptions {
            num_warps: Some(4),
            ..CompileOptions::new(arch)
        };
        crate::compile(&file, &opts).unwrap_or_else(|d| panic!("{}", d.render(&file)))
    };
    let streaming = "let t = load(x, [bid(0)], [512]) * load(z, [bid(0)], [512]);\n\
                     barrier();\nstore(y, [bid(0)], t);";
    for (arch, name) in [(Arch::Sm80, "sm_80"), (Arch::Sm90a, "sm_90a")] {
        let k = compile(streaming, arch);
        assemble(&k.ptx, name, "barrier");
        assert_eq!(count(&k.ptx, "bar.red.or.pred"), 1, "{}", k.ptx);
        assert!(!k.ptx.contains("bar.sync"), "{}", k.ptx);
        // One predicate per load (4-byte aligned tensors: scalar loads).
        let loads = count(&k.ptx, "ld.global.b32");
        assert!(loads >= 2, "{}", k.ptx);
        assert_eq!(count(&k.ptx, "setp.ne.b32"), loads, "{}", k.ptx);
        let at = |needle: &str| k.ptx.find(needle).unwrap_or_else(|| panic!("no {needle}"));
        let last_load = k.ptx.rfind("ld.global").unwrap_or(usize::MAX);
        assert!(
            last_load < at("bar.red") && at("bar.red") < at("st.global"),
            "{}",
            k.ptx
        );
    }
    let batched = "let t = load(x, [bid(0)], [512]);\n\
                   let a = sum(t, 0);\nlet b = sum(t * t, 0);\n\
                   store(s, [0], full([1], a + b));";
    let split = "let t = load(x, [bid(0)], [512]);\n\
                 let a = sum(t, 0);\nbarrier();\nlet b = sum(t * t, 0);\n\
                 store(s, [0], full([1], a + b));";
    let (one, two) = (compile(batched, Arch::Sm90a), compile(split, Arch::Sm90a));
    // A batch of cross-warp reductions is one exchange (a barrier pair); split by the
    // kernel's barrier (a plain `bar.sync`: the reduction before it already waited for
    // the load), two exchanges and the barrier itself.
    assert_eq!(
        count(&two.ptx, "bar.sync"),
        2 * count(&one.ptx, "bar.sync") + 1
    );
    assert!(!two.ptx.contains("bar.red"), "{}", two.ptx);
}
