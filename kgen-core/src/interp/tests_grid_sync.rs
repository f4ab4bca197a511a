//! Interpreter tests of `grid_sync`: kernels from `.kg` source whose blocks read, after
//! the barrier, what a neighbouring block wrote before it, on grids of several sizes,
//! checked exactly against direct Rust computations; the counter's sign bit after one
//! and several syncs; and the errors (never a panic or a hang) for a counter that does
//! not start at 0 or -2^31, an empty counter, and a grid too large to run at once.
//!
//! Assumes: `compile_to_ir` and the interpreter's cooperative run (`run_grid_sync`).
//! Guarantees: outputs are poisoned before each run and checked element by element.

use super::tests::{poisoned, rnd, tensor, written};
use super::*;
use crate::host::HostTensor;
use crate::pipeline::{compile_to_ir, CompileOptions};
use crate::span::SourceFile;
use crate::target::Arch;

fn ir(src: &str, defines: &[(&str, &str)]) -> Function {
    let mut opts = CompileOptions::new(Arch::Sm80);
    for (k, v) in defines {
        opts = opts.define(k, v);
    }
    let file = SourceFile::new("t.kg", src);
    match compile_to_ir(&file, &opts) {
        Ok((f, _)) => f,
        Err(d) => panic!("compile error:\n{}", d.render(&file)),
    }
}

/// A one-element `i32` counter holding `v`.
fn counter(v: i32) -> ArgValue {
    tensor(DType::I32, &[1], &[v as f64])
}

fn counter_value(a: &ArgValue) -> i32 {
    written(a)[0] as i32
}

/// The f32 values of a tensor argument, exactly.
fn f32s(a: &ArgValue) -> Vec<f32> {
    written(a).iter().map(|&v| v as f32).collect()
}

/// Every block adds 1 to its tile of `x`, then reads the next block's.
const NEIGHBOUR: &str = r#"
kernel gs<BLOCK: int = 128>(x: tensor<f32, 1>, y: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    store(x, [i], load(x, [i], [BLOCK]) + 1.0);
    grid_sync(counter);
    let j = (i + 1) % num_bids(0);
    store(y, [i], load(x, [j], [BLOCK]));
}
"#;

/// Runs NEIGHBOUR on `blocks` blocks of `block` and checks x and y exactly; returns the
/// counter's final value.
fn run_neighbour(func: &Function, blocks: usize, block: usize, start: i32, seed: u64) -> i32 {
    let n = blocks * block;
    // Non-zero values: a zero could hide an unwritten or stale element.
    let xs: Vec<f64> = rnd(n, seed, 100.0)
        .into_iter()
        .map(|v| if v == 0.0 { 1.5 } else { v })
        .collect();
    let mut args = vec![
        tensor(DType::F32, &[n], &xs),
        poisoned(DType::F32, &[n]),
        counter(start),
    ];
    let x0 = f32s(&args[0]);
    run(func, [blocks as u32, 1, 1], &mut args).unwrap_or_else(|e| panic!("{blocks} blocks: {e}"));
    let (x, y) = (f32s(&args[0]), f32s(&args[1]));
    for b in 0..blocks {
        let next = (b + 1) % blocks;
        for e in 0..block {
            let (i, j) = (b * block + e, next * block + e);
            assert_eq!(x[i], x0[i] + 1.0, "{blocks} blocks: x[{i}]");
            assert_eq!(
                y[i].to_bits(),
                (x0[j] + 1.0).to_bits(),
                "{blocks} blocks: y[{i}] must be the next block's x[{j}] after its update"
            );
        }
    }
    counter_value(&args[2])
}

#[test]
fn every_block_reads_its_neighbours_write_after_the_barrier() {
    let func = ir(NEIGHBOUR, &[]);
    for (k, blocks) in [1usize, 2, 7, 64].into_iter().enumerate() {
        let end = run_neighbour(&func, blocks, 128, 0, 11 + k as u64);
        assert_eq!(
            end,
            i32::MIN,
            "{blocks} blocks: one sync flips the sign bit"
        );
    }
}

#[test]
fn a_counter_left_by_an_earlier_launch_is_reused() {
    // The sign bit alone may be set: -2^31 → 0 → -2^31, with no reset between launches.
    let func = ir(NEIGHBOUR, &[]);
    assert_eq!(run_neighbour(&func, 5, 128, i32::MIN, 3), 0);
    assert_eq!(run_neighbour(&func, 5, 128, 0, 4), i32::MIN);
}

#[test]
fn the_largest_cooperative_grid_runs() {
    let func = ir(NEIGHBOUR, &[("BLOCK", "2")]);
    let blocks = MAX_GRID_SYNC_BLOCKS as usize;
    assert_eq!(run_neighbour(&func, blocks, 2, 0, 5), i32::MIN);
}

/// Three phases, a `grid_sync` after each: phase `s` writes `dst[i] = src[j] + (s + 1)`
/// from the tile of block `j = (i + s + 1) % n`, alternating `a → b`, `b → a`, `a → b`.
const PING_PONG: &str = r#"
kernel pp<BLOCK: int = 128>(a: tensor<f32, 1>, b: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    let n = num_bids(0);
    for s in 0..3 {
        let j = (i + s + 1) % n;
        let add = (s + 1) as f32;
        if s % 2 == 0 {
            store(b, [i], load(a, [j], [BLOCK]) + add);
        } else {
            store(a, [i], load(b, [j], [BLOCK]) + add);
        }
        grid_sync(counter);
    }
}
"#;

#[test]
fn three_syncs_in_a_loop_ping_pong_between_two_buffers() {
    let func = ir(PING_PONG, &[]);
    let block = 128;
    for (k, blocks) in [1usize, 3, 8, 33].into_iter().enumerate() {
        let n = blocks * block;
        let xs = rnd(n, 40 + k as u64, 10.0);
        // b starts poisoned (NaN): a phase that read it before the previous phase wrote
        // it would leave NaNs.
        let mut args = vec![
            tensor(DType::F32, &[n], &xs),
            poisoned(DType::F32, &[n]),
            counter(0),
        ];
        // The reference, phase by phase.
        let mut bufs = [f32s(&args[0]), vec![f32::NAN; n]];
        for s in 0..3usize {
            let (src, dst) = if s % 2 == 0 { (0, 1) } else { (1, 0) };
            let from = bufs[src].clone();
            for i in 0..blocks {
                let j = (i + s + 1) % blocks;
                for e in 0..block {
                    bufs[dst][i * block + e] = from[j * block + e] + (s + 1) as f32;
                }
            }
        }
        run(&func, [blocks as u32, 1, 1], &mut args)
            .unwrap_or_else(|e| panic!("{blocks} blocks: {e}"));
        let (a, b) = (f32s(&args[0]), f32s(&args[1]));
        for i in 0..n {
            assert_eq!(
                a[i].to_bits(),
                bufs[0][i].to_bits(),
                "{blocks} blocks: a[{i}]"
            );
            assert_eq!(
                b[i].to_bits(),
                bufs[1][i].to_bits(),
                "{blocks} blocks: b[{i}]"
            );
        }
        assert_eq!(
            counter_value(&args[2]),
            i32::MIN,
            "{blocks} blocks: three syncs flip the sign bit three times"
        );
    }
}

#[test]
fn a_counter_not_starting_at_zero_is_an_error_not_a_hang() {
    let func = ir(NEIGHBOUR, &[]);
    for (blocks, start) in [(1u32, 5), (4, 5), (16, 1), (4, -1)] {
        let n = blocks as usize * 128;
        let mut args = vec![
            tensor(DType::F32, &[n], &rnd(n, 9, 1.0)),
            poisoned(DType::F32, &[n]),
            counter(start),
        ];
        match run(&func, [blocks, 1, 1], &mut args) {
            Err(InterpError::GridDiverged(m)) => {
                assert!(m.contains(&format!("holds {start}")), "{blocks}: {m}");
            }
            other => panic!("{blocks} blocks, counter {start}: {other:?}"),
        }
    }
}

#[test]
fn an_empty_counter_is_an_error() {
    let func = ir(NEIGHBOUR, &[]);
    let mut args = vec![
        tensor(DType::F32, &[256], &rnd(256, 1, 1.0)),
        poisoned(DType::F32, &[256]),
        ArgValue::Tensor(HostTensor::zeros(DType::I32, &[0])),
    ];
    let e = run(&func, [2, 1, 1], &mut args);
    assert!(e.is_err(), "{e:?}");
}

#[test]
fn a_grid_larger_than_the_interpreter_runs_at_once_is_refused() {
    let func = ir(NEIGHBOUR, &[]);
    for (grid, blocks) in [([1025u32, 1, 1], 1025u64), ([32, 32, 2], 2048)] {
        let mut args = vec![
            tensor(DType::F32, &[128], &rnd(128, 2, 1.0)),
            poisoned(DType::F32, &[128]),
            counter(0),
        ];
        match run(&func, grid, &mut args) {
            Err(InterpError::GridSyncTooLarge { blocks: b }) => assert_eq!(b, blocks),
            other => panic!("{grid:?}: {other:?}"),
        }
        // Nothing ran: the counter is untouched.
        assert_eq!(counter_value(&args[2]), 0);
    }
}
