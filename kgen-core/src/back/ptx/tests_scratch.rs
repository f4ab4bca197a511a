//! Scratch buffers in PTX: placement at the start of `kg_smem` (the conversion scratch
//! after them), thread-private 16-byte chunks with no barrier, masked slots.

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
    // Slots are masked (out of range: dropped / read as 0).
    assert!(ptx.contains("setp.lt.u32"), "{ptx}");
    // No barrier orders the scratch accesses: only the reduction's pair.
    assert_eq!(ptx.matches("bar.sync").count(), 2, "{ptx}");
    let file = crate::SourceFile::new("cached.kg", SRC);
    let sm80 = crate::compile(&file, &crate::CompileOptions::new(Arch::Sm80))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    assemble(&sm80.ptx, "sm_80", "cached");
}

/// The interpreter agrees with a direct computation, and reading a slot the block has
/// not stored is an interpreter error (on a GPU it is unspecified data).
#[test]
fn scratch_round_trips_in_the_interpreter_and_unwritten_slots_are_errors() {
    use crate::host::{ArgValue, HostTensor};
    use crate::types::DType;
    let file = crate::SourceFile::new("cached.kg", SRC);
    let (func, _) = crate::compile_to_ir(&file, &crate::CompileOptions::new(Arch::Sm90a))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let (rows, cols) = (3usize, 2500usize);
    let xs: Vec<f64> = (0..rows * cols)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) / 8.0)
        .collect();
    let mut args = vec![
        ArgValue::Tensor(HostTensor::from_f64(DType::BF16, &[rows, cols], &xs)),
        ArgValue::Tensor(HostTensor::from_f64(
            DType::BF16,
            &[rows, cols],
            &vec![f64::NAN; rows * cols],
        )),
    ];
    crate::interp::run(&func, [rows as u32, 1, 1], &mut args).expect("runs");
    let ArgValue::Tensor(y) = &args[1] else {
        panic!("y")
    };
    let y = y.to_f64_vec();
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
    let file = crate::SourceFile::new("bad.kg", bad);
    let (func, _) = crate::compile_to_ir(&file, &crate::CompileOptions::new(Arch::Sm90a))
        .unwrap_or_else(|d| panic!("{}", d.render(&file)));
    let err = crate::interp::run(&func, [1, 1, 1], &mut args).expect_err("unwritten slot");
    assert!(err.to_string().contains("has not stored"), "{err}");
}
