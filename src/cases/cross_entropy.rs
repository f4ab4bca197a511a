//! Cases for `cross_entropy.kg` (`ce_count`, `cross_entropy`, `cross_entropy_inplace`,
//! `ce_loss_mean`) and `softmax_bwd.kg`, each against a float64 reference.
//!
//! Each case runs ONE kernel: `cross_entropy` takes the `stats = [count, 1 / count]` that
//! `ce_count` would write as an input computed here on the host (rounded to f32, as the
//! kernel reads it), so every kernel of the three-launch sequence is checked on its own;
//! chaining them is the op's job.
//!
//! [`cases`] (the shared table, run on the interpreter in CI and on the GPU by the
//! self-test) keeps to the table's invariants: every input is nonzero and every reference
//! finite. So targets there are drawn from `1..V` or are the ignore index. The defined
//! edge behaviour that breaks those invariants (target 0, V = 1, out-of-range targets →
//! NaN, all targets ignored → NaN mean, an i64 target that truncates to a valid i32) is
//! in [`edge_cases`], run on the interpreter by this module's tests.

use super::*;

/// torch's default `ignore_index`.
pub const IGNORE_INDEX: i64 = -100;

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    use DType::*;
    let mut v = Vec::new();

    // softmax_bwd: (rows, cols, T, BLOCK): one-tile and multi-tile paths, a last tile of
    // one element (4097), non-power-of-two BLOCKs.
    let sb_quick: &[(usize, usize, DType, usize)] = &[
        (1, 1, F32, 1024),
        (7, 7, F32, 1024),
        (7, 7, F16, 1024),
        (3, 1000, BF16, 1024),
        (5, 4097, F32, 1024),
        (5, 4097, BF16, 1024),
        (5, 4097, F16, 4096),
        (3, 1000, F32, 1000),
        (2, 300, F32, 128),
    ];
    for &(r, c, t, b) in sb_quick {
        v.push(softmax_bwd_case(seed, t, r, c, b));
    }

    // ce_count: (rows, I, BLOCK, ignore_index).
    for &(n, i, b, ign) in &[
        (1usize, I64, 1024usize, IGNORE_INDEX),
        (7, I32, 1024, IGNORE_INDEX),
        (1000, I64, 256, IGNORE_INDEX),
        (4097, I32, 1024, IGNORE_INDEX),
        (4097, I64, 1000, 3),
    ] {
        v.push(ce_count_case(seed, i, n, b, ign));
    }

    // ce_loss_mean: (rows, BLOCK).
    for &(n, b) in &[
        (1usize, 1024usize),
        (7, 1024),
        (1000, 256),
        (4097, 1024),
        (4097, 1000),
    ] {
        v.push(ce_loss_mean_case(seed, n, b));
    }

    // cross_entropy / cross_entropy_inplace.
    let ce_quick = [
        CeSpec::new(F32, I64, 1, 4097, 4096),
        CeSpec::new(F32, I32, 7, 7, 4096),
        CeSpec::new(BF16, I64, 7, 4097, 1024),
        CeSpec::new(F16, I32, 33, 1000, 256),
        CeSpec::new(F32, I64, 1000, 7, 4096),
        CeSpec::new(F32, I32, 5, 4097, 1000),
        CeSpec {
            grid: Some(4),
            ..CeSpec::new(BF16, I32, 33, 1000, 1024)
        },
        CeSpec {
            grid: Some(2),
            in_place: true,
            ..CeSpec::new(F16, I64, 7, 4097, 1024)
        },
        CeSpec {
            logit_scale: 15.0,
            ..CeSpec::new(F32, I64, 9, 1000, 128)
        },
        CeSpec {
            in_place: true,
            ..CeSpec::new(F32, I64, 7, 4097, 1024)
        },
        CeSpec {
            in_place: true,
            ..CeSpec::new(BF16, I32, 33, 1000, 4096)
        },
        CeSpec {
            ignore_index: 2,
            ..CeSpec::new(F32, I32, 40, 7, 4096)
        },
        // The cluster kernels: vocab 1000 over 4 blocks of 2 tiles of 128, a persistent
        // grid (3 clusters over 10 rows), a block whose tiles are all padding (7
        // classes over 2 blocks), in place, 8 blocks per row, a non-power-of-two tile.
        CeSpec {
            cluster: Some((4, 2)),
            ..CeSpec::new(F32, I64, 9, 1000, 128)
        },
        CeSpec {
            cluster: Some((4, 2)),
            grid: Some(12),
            ..CeSpec::new(BF16, I64, 10, 1000, 128)
        },
        // A cluster block caching one of its two tiles (the other re-read).
        CeSpec {
            cluster: Some((4, 2)),
            cached: Some(1),
            depth: Some(3),
            ..CeSpec::new(BF16, I32, 9, 1000, 128)
        },
        CeSpec {
            cluster: Some((2, 1)),
            ..CeSpec::new(BF16, I32, 13, 7, 256)
        },
        CeSpec {
            cluster: Some((8, 3)),
            in_place: true,
            ..CeSpec::new(F16, I64, 7, 4097, 256)
        },
        CeSpec {
            cluster: Some((8, 1)),
            logit_scale: 15.0,
            ..CeSpec::new(BF16, I64, 5, 4097, 520)
        },
        // Clusters of 16 (non-portable on sm_90): blocks whose tiles are all padding,
        // a persistent grid.
        CeSpec {
            cluster: Some((16, 1)),
            ..CeSpec::new(BF16, I64, 6, 3000, 256)
        },
        CeSpec {
            cluster: Some((16, 2)),
            grid: Some(16 * 3),
            in_place: true,
            ..CeSpec::new(F32, I32, 7, 4001, 128)
        },
        // Scratch-cached rows: the whole row cached, part of it (the rest re-read), odd
        // vocabularies, in place, a grid-stride grid.
        CeSpec {
            cached: Some(8),
            ..CeSpec::new(BF16, I64, 9, 1000, 128)
        },
        CeSpec {
            cached: Some(8),
            no_async: true,
            ..CeSpec::new(BF16, I64, 9, 1001, 128)
        },
        CeSpec {
            cached: Some(2),
            no_async: true,
            in_place: true,
            ..CeSpec::new(F16, I32, 5, 1001, 256)
        },
        CeSpec {
            cached: Some(3),
            depth: Some(1),
            ..CeSpec::new(F32, I32, 7, 1000, 128)
        },
        CeSpec {
            cached: Some(2),
            in_place: true,
            depth: Some(4),
            ..CeSpec::new(F16, I64, 7, 4097, 2048)
        },
        // 16-byte aligned rows (asynchronous copies on the GPU), a deep pipeline.
        CeSpec {
            cached: Some(8),
            depth: Some(7),
            ..CeSpec::new(BF16, I64, 9, 1024, 128)
        },
        CeSpec {
            cluster: Some((2, 4)),
            depth: Some(4),
            in_place: true,
            ..CeSpec::new(F32, I32, 9, 1024, 128)
        },
        // Persistent cluster grids: the next row's fetches issued during pass 2 (and
        // by ignored rows), more fetches in flight than tiles per block; a
        // non-power-of-two tile copied by cp.async (padded slots filled by stores).
        CeSpec {
            cluster: Some((2, 2)),
            depth: Some(3),
            grid: Some(4),
            in_place: true,
            ..CeSpec::new(F16, I64, 11, 512, 128)
        },
        CeSpec {
            cluster: Some((8, 1)),
            grid: Some(16),
            depth: Some(2),
            ..CeSpec::new(F32, I64, 9, 4100, 520)
        },
        CeSpec {
            cached: Some(1),
            grid: Some(3),
            ..CeSpec::new(BF16, I32, 13, 7, 256)
        },
        // Aligned windows over flat logits: 16-byte vectors (rows * V a multiple of 8),
        // tiles past SLOTS re-read, in place, rows shorter than a vector, and flat
        // tensors only 2-byte aligned (element accesses) on a grid-stride grid.
        CeSpec {
            cached: Some(9),
            depth: Some(3),
            window: true,
            ..CeSpec::new(BF16, I64, 8, 1001, 128)
        },
        CeSpec {
            cached: Some(2),
            window: true,
            in_place: true,
            ..CeSpec::new(F16, I32, 16, 999, 256)
        },
        CeSpec {
            cached: Some(1),
            window: true,
            ..CeSpec::new(F32, I64, 8, 7, 128)
        },
        CeSpec {
            cached: Some(3),
            window: true,
            grid: Some(3),
            ..CeSpec::new(BF16, I32, 13, 4100, 2048)
        },
        // The op's own partly cached candidate (`ops::loss`, f32 rows of 40000 without
        // clusters: 9 of 10 tiles of 4096 fit 150 KB): the tenth tile is re-read, and
        // the pipeline's fetches past the buffer copy nothing.
        CeSpec {
            cached: Some(9),
            depth: Some(2),
            ..CeSpec::new(F32, I64, 2, 40000, 4096)
        },
    ];
    for s in &ce_quick {
        v.push(s.case(seed));
    }

    if sizes == SizeSet::Full {
        for &(r, c, t, b) in &[
            (64usize, 50257usize, F32, 4096usize),
            (64, 50257, BF16, 4096),
            (256, 4096, BF16, 4096),
            (256, 4097, F16, 8192),
            (1000, 4097, F32, 1024),
        ] {
            v.push(softmax_bwd_case(seed, t, r, c, b));
        }
        v.push(ce_count_case(seed, I64, 122_000, 1024, IGNORE_INDEX));
        v.push(ce_loss_mean_case(seed, 122_000, 1024));
        let ce_full = [
            CeSpec {
                grid: Some(7),
                ..CeSpec::new(BF16, I64, 64, 50257, 4096)
            },
            CeSpec {
                grid: Some(33),
                in_place: true,
                ..CeSpec::new(F32, I32, 1000, 1000, 1024)
            },
            CeSpec::new(BF16, I64, 64, 50257, 4096),
            CeSpec::new(F32, I32, 64, 50257, 2048),
            CeSpec::new(BF16, I32, 8, 128_256, 2048),
            CeSpec::new(F16, I64, 4097, 7, 4096),
            CeSpec {
                logit_scale: 30.0,
                ..CeSpec::new(F32, I64, 16, 50257, 4096)
            },
            CeSpec {
                in_place: true,
                ..CeSpec::new(BF16, I64, 64, 50257, 4096)
            },
            CeSpec {
                in_place: true,
                ..CeSpec::new(F32, I32, 1000, 1000, 1024)
            },
            CeSpec {
                cluster: Some((8, 7)),
                ..CeSpec::new(BF16, I64, 64, 50257, 1024)
            },
            CeSpec {
                cached: Some(13),
                no_async: true,
                ..CeSpec::new(BF16, I64, 300, 50257, 4096)
            },
            CeSpec {
                cached: Some(13),
                ..CeSpec::new(BF16, I64, 300, 50257, 4096)
            },
            CeSpec {
                cached: Some(13),
                in_place: true,
                grid: Some(37),
                ..CeSpec::new(BF16, I64, 100, 50257, 4096)
            },
            CeSpec {
                cached: Some(26),
                ..CeSpec::new(BF16, I32, 8, 128_256, 4096)
            },
            CeSpec {
                cached: Some(13),
                ..CeSpec::new(F32, I64, 16, 50257, 4096)
            },
            CeSpec {
                cluster: Some((8, 7)),
                grid: Some(8 * 5),
                ..CeSpec::new(BF16, I64, 64, 50257, 1024)
            },
            CeSpec {
                cluster: Some((8, 4)),
                in_place: true,
                ..CeSpec::new(BF16, I32, 64, 50257, 2048)
            },
            CeSpec {
                cluster: Some((4, 13)),
                ..CeSpec::new(F32, I64, 16, 50257, 1024)
            },
            CeSpec {
                cluster: Some((8, 16)),
                cached: Some(12),
                ..CeSpec::new(BF16, I32, 8, 128_256, 1024)
            },
            // The op's candidates for 128256 and 50257 (whole shares cached).
            CeSpec {
                cluster: Some((4, 8)),
                ..CeSpec::new(BF16, I64, 16, 128_256, 4096)
            },
            CeSpec {
                cluster: Some((4, 16)),
                depth: Some(4),
                ..CeSpec::new(BF16, I64, 16, 128_256, 2048)
            },
            CeSpec {
                cluster: Some((16, 8)),
                depth: Some(4),
                ..CeSpec::new(BF16, I64, 16, 128_256, 1024)
            },
            CeSpec {
                cached: Some(13),
                depth: Some(4),
                ..CeSpec::new(BF16, I64, 64, 50304, 4096)
            },
            CeSpec {
                cluster: Some((2, 7)),
                in_place: true,
                ..CeSpec::new(BF16, I64, 16, 50257, 4096)
            },
            // The op's window candidates for odd vocabularies.
            CeSpec {
                cached: Some(13),
                window: true,
                depth: Some(6),
                ..CeSpec::new(BF16, I64, 64, 50257, 4096)
            },
            CeSpec {
                cached: Some(13),
                window: true,
                in_place: true,
                grid: Some(37),
                ..CeSpec::new(BF16, I64, 96, 50257, 4096)
            },
            CeSpec {
                cached: Some(25),
                window: true,
                ..CeSpec::new(BF16, I32, 64, 50257, 2048)
            },
        ];
        for s in &ce_full {
            v.push(s.case(seed));
        }
    }
    v
}

/// Cases whose inputs or expected values fall outside the shared table's invariants
/// (integer inputs equal to 0, NaN references). Each is fully specified by the kernels'
/// documented behaviour; the module tests run them on the interpreter.
pub fn edge_cases(seed: u64) -> Vec<Case> {
    use DType::*;
    let mut v = Vec::new();
    // V = 1: the only class is 0, so every non-ignored row has loss 0 and dx 0.
    for in_place in [false, true] {
        v.push(
            CeSpec {
                in_place,
                target_zero: true,
                ..CeSpec::new(F32, I64, 7, 1, 4096)
            }
            .case(seed),
        );
    }
    // Target 0 allowed (column 0 of tile 0 gets the one-hot term), with BLOCK < V.
    v.push(
        CeSpec {
            target_zero: true,
            ..CeSpec::new(BF16, I32, 100, 7, 4)
        }
        .case(seed),
    );
    // Out-of-range targets: V, -1, i32::MAX, and for i64 2^32 + 3 (which an early
    // truncation to i32 would take for class 3). Loss and dx row NaN; other rows exact.
    for (i, in_place) in [(I64, false), (I64, true), (I32, false)] {
        let mut bad = vec![7i64, -1, i32::MAX as i64, 0, 6, IGNORE_INDEX];
        if i == I64 {
            bad.push((1i64 << 32) + 3);
        }
        let spec = CeSpec {
            in_place,
            ..CeSpec::new(F32, i, bad.len(), 7, 4096)
        };
        v.push(spec.case_with_targets(seed, bad, "out-of-range"));
    }
    // Every target ignored: count 0, inv_count 0, loss 0 and dx 0 everywhere.
    for in_place in [false, true] {
        let spec = CeSpec {
            in_place,
            ..CeSpec::new(F32, I64, 5, 1000, 256)
        };
        v.push(spec.case_with_targets(seed, vec![IGNORE_INDEX; 5], "all-ignored"));
    }
    v.push(ce_count_edge_case(I64, vec![IGNORE_INDEX; 9], IGNORE_INDEX));
    v.push(ce_count_edge_case(I32, vec![0, 1, 0, 5, 0], 0));
    v.push(ce_loss_mean_edge_case(seed, 17, 0));
    v
}

// ---- softmax_bwd ----

/// `softmax_bwd` on y = softmax of random logits (rows of [rows, cols], dtype T, rounded
/// from f64) and random dy.
pub fn softmax_bwd_case(seed: u64, dtype: DType, rows: usize, cols: usize, block: usize) -> Case {
    let (case_defines, suffix) = tile_path_defines(dtype, rows, cols, block);
    let label = format!("softmax_bwd T={dtype} BLOCK={block} rows={rows} cols={cols}{suffix}");
    let mut rng = Rng::for_case(seed, &label);
    // Logits within ±3.5: y >= e^-7 / cols stays a normal number even in f16 for the
    // column counts used here, so no y is zero.
    let logits: Vec<f64> = (0..rows * cols).map(|_| rng.normalish()).collect();
    let y_vals = super::softmax::reference(&logits, cols);
    let y = HostTensor::from_f64(dtype, &[rows, cols], &y_vals);
    let dy = random_tensor(&mut rng, dtype, &[rows, cols], |r| r.normalish());
    let max_y = y.to_f64_vec().iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let max_dy = dy.to_f64_vec().iter().fold(1.0f64, |a, v| a.max(v.abs()));
    let args = vec![
        ArgValue::Tensor(y),
        ArgValue::Tensor(dy),
        ArgValue::Tensor(poisoned(dtype, &[rows, cols])),
    ];
    Case {
        options: Default::default(),
        kernel: "softmax_bwd",
        kernel_name: None,
        label,
        defines: case_defines,
        tensor_align: aligns(&["y", "dy", "dx"], &args),
        grid: [rows as u32, 1, 1],
        args,
        outputs: vec![2],
        reference: Box::new(move |args| {
            let y = tensor_at(args, 0).to_f64_vec();
            let dy = tensor_at(args, 1).to_f64_vec();
            vec![softmax_bwd_reference(&y, &dy, cols)]
        }),
        // dx_i = y_i * (dy_i - dot) cancels where dy_i ~ dot, so the bound is absolute:
        // the f32 dot carries at most (tiles + log2 BLOCK) * 2^-24 * sum|y dy| <=
        // 25 * 6e-8 * max|dy| (sum y = 1), plus a rounding of dy_i - dot, all times
        // y_i <= max y.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-6,
                abs: 2e-6 * max_y * max_dy,
            },
        ),
    }
}

// ---- ce_count and ce_loss_mean ----

fn index_scalar(dtype: DType, v: i64) -> ArgValue {
    ArgValue::Scalar(Scalar::Int(v, dtype))
}

/// `[count, 1 / count]` as `ce_count` defines it, f32-rounded (what the kernels read).
fn stats_of(targets: &[i64], ignore_index: i64) -> [f64; 2] {
    let count = targets.iter().filter(|&&t| t != ignore_index).count() as f64;
    let inv = if count > 0.0 { 1.0 / count } else { 0.0 };
    [count as f32 as f64, inv as f32 as f64]
}

fn ce_count_from(
    label: String,
    dtype: DType,
    targets: Vec<i64>,
    block: usize,
    ignore: i64,
) -> Case {
    let n = targets.len();
    let vals: Vec<f64> = targets.iter().map(|&t| t as f64).collect();
    let args = vec![
        ArgValue::Tensor(HostTensor::from_f64(dtype, &[n], &vals)),
        ArgValue::Tensor(poisoned(DType::F32, &[2])),
        index_scalar(dtype, ignore),
    ];
    Case {
        options: Default::default(),
        kernel: "cross_entropy",
        kernel_name: Some("ce_count"),
        label,
        defines: defines(&[("I", dtype.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&["targets", "stats", "ignore_index"], &args),
        grid: [1, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| {
            let t: Vec<i64> = tensor_at(args, 0)
                .to_f64_vec()
                .iter()
                .map(|&v| v as i64)
                .collect();
            let ign = scalar_at(args, 2) as i64;
            let count = t.iter().filter(|&&x| x != ign).count() as f64;
            vec![vec![count, if count > 0.0 { 1.0 / count } else { 0.0 }]]
        }),
        // The count is exact; 1 / count is one correctly rounded f32 division.
        tolerance: Tolerance {
            rel: 1e-7,
            abs: 0.0,
        },
    }
}

/// `ce_count` over `n` random targets (1 in 7 ignored, the rest in 1..50257).
pub fn ce_count_case(seed: u64, dtype: DType, n: usize, block: usize, ignore: i64) -> Case {
    let label = format!("ce_count I={dtype} BLOCK={block} n={n} ignore={ignore}");
    let mut rng = Rng::for_case(seed, &label);
    let targets = (0..n)
        .map(|_| {
            if rng.next_u64().is_multiple_of(7) {
                ignore
            } else {
                loop {
                    let t = 1 + (rng.next_u64() % 50256) as i64;
                    if t != ignore {
                        break t;
                    }
                }
            }
        })
        .collect();
    ce_count_from(label, dtype, targets, block, ignore)
}

fn ce_count_edge_case(dtype: DType, targets: Vec<i64>, ignore: i64) -> Case {
    let label = format!("ce_count edge I={dtype} targets={targets:?} ignore={ignore}");
    ce_count_from(label, dtype, targets, 1024, ignore)
}

fn ce_loss_mean_from(label: String, loss: Vec<f64>, count: usize, block: usize) -> Case {
    let n = loss.len();
    let [c, inv] = stats_of(&vec![0; count], IGNORE_INDEX);
    let args = vec![
        ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[n], &loss)),
        ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[2], &[c, inv])),
        ArgValue::Tensor(poisoned(DType::F32, &[1])),
    ];
    Case {
        options: Default::default(),
        kernel: "cross_entropy",
        kernel_name: Some("ce_loss_mean"),
        label,
        defines: defines(&[("BLOCK", block.to_string())]),
        tensor_align: aligns(&["loss", "stats", "out"], &args),
        grid: [1, 1, 1],
        args,
        outputs: vec![2],
        reference: Box::new(move |args| {
            let total: f64 = tensor_at(args, 0).to_f64_vec().iter().sum();
            let st = tensor_at(args, 1).to_f64_vec();
            vec![vec![if st[0] > 0.0 { total * st[1] } else { f64::NAN }]]
        }),
        // A sum of positive f32 terms: relative error below (n / BLOCK + log2 BLOCK) * 2^-24.
        tolerance: Tolerance {
            rel: 1e-5,
            abs: 0.0,
        },
    }
}

/// `ce_loss_mean` over `n` random per-row losses, with `count` about 6/7 of `n`.
pub fn ce_loss_mean_case(seed: u64, n: usize, block: usize) -> Case {
    let label = format!("ce_loss_mean BLOCK={block} n={n}");
    let mut rng = Rng::for_case(seed, &label);
    let loss: Vec<f64> = (0..n).map(|_| rng.uniform(0.5, 12.0)).collect();
    ce_loss_mean_from(label, loss, (n * 6 / 7).max(1), block)
}

fn ce_loss_mean_edge_case(seed: u64, n: usize, count: usize) -> Case {
    let label = format!("ce_loss_mean edge n={n} count={count}");
    let mut rng = Rng::for_case(seed, &label);
    let loss: Vec<f64> = (0..n).map(|_| rng.uniform(0.5, 12.0)).collect();
    ce_loss_mean_from(label, loss, count, 1024)
}

// ---- cross_entropy ----

/// One `cross_entropy` / `cross_entropy_inplace` configuration.
#[derive(Clone, Copy, Debug)]
pub struct CeSpec {
    /// Logits and gradient dtype (`T`).
    pub dtype: DType,
    /// Target dtype (`I`, i32 or i64).
    pub index: DType,
    pub rows: usize,
    pub vocab: usize,
    pub block: usize,
    pub ignore_index: i64,
    /// Logits are `logit_scale * normalish()` (about ±3.5 * scale).
    pub logit_scale: f64,
    /// Use `cross_entropy_inplace` (dx written over the logits).
    pub in_place: bool,
    /// Draw random targets from `0..V` rather than `1..V` (edge cases only: the shared
    /// table forbids zero inputs).
    pub target_zero: bool,
    /// Blocks of the grid-stride row loop (None: one block per row).
    pub grid: Option<usize>,
    /// `Some((C, PARTS))`: the `cross_entropy_cluster` kernels (C blocks per row, each
    /// with PARTS tiles; sm_90a).
    pub cluster: Option<(usize, usize)>,
    /// `Some(SLOTS)`: the `cross_entropy_cached` kernels (SLOTS tiles of the row kept in
    /// a scratch buffer between the passes); with `cluster`, the tiles each cluster
    /// block caches (default: all PARTS).
    pub cached: Option<usize>,
    /// DEPTH (fetches in flight) of the cached and cluster kernels (None: the default).
    pub depth: Option<usize>,
    /// `cross_entropy_cached` with ASYNC = false (register prefetch, no fetches).
    pub no_async: bool,
    /// With `cached`: the `cross_entropy_window` kernels (flat logits walked in aligned
    /// windows by vectorized gathers and scatters).
    pub window: bool,
}

impl CeSpec {
    pub fn new(dtype: DType, index: DType, rows: usize, vocab: usize, block: usize) -> CeSpec {
        CeSpec {
            dtype,
            index,
            rows,
            vocab,
            block,
            ignore_index: IGNORE_INDEX,
            logit_scale: 2.0,
            in_place: false,
            target_zero: false,
            grid: None,
            cluster: None,
            cached: None,
            depth: None,
            no_async: false,
            window: false,
        }
    }

    /// The kernel this spec runs.
    fn kernel_name(&self) -> &'static str {
        if self.window {
            return if self.in_place {
                "cross_entropy_window_inplace"
            } else {
                "cross_entropy_window"
            };
        }
        match (self.cluster.is_some(), self.cached.is_some(), self.in_place) {
            (true, _, true) => "cross_entropy_cluster_inplace",
            (true, _, false) => "cross_entropy_cluster",
            (false, true, true) => "cross_entropy_cached_inplace",
            (false, true, false) => "cross_entropy_cached",
            (false, false, true) => "cross_entropy_inplace",
            (false, false, false) => "cross_entropy",
        }
    }

    fn label(&self, what: &str) -> String {
        format!(
            "{} T={} I={} BLOCK={}{}{} rows={} V={} ignore={} scale={}{}{}",
            self.kernel_name(),
            self.dtype,
            self.index,
            self.block,
            self.cluster
                .map(|(c, p)| format!(" PARTS={p} CLUSTER={c}"))
                .unwrap_or_default(),
            self.cached
                .map(|s| format!(" SLOTS={s}"))
                .unwrap_or_default()
                + &self
                    .depth
                    .map(|d| format!(" DEPTH={d}"))
                    .unwrap_or_default()
                + if self.no_async { " ASYNC=false" } else { "" }
                + if self.window { " window" } else { "" },
            self.rows,
            self.vocab,
            self.ignore_index,
            self.logit_scale,
            self.grid.map(|g| format!(" grid={g}")).unwrap_or_default(),
            what
        )
    }

    /// A case with random targets: about 1 in 7 rows ignored, the others uniform in
    /// `1..V` (`0..V` with `target_zero`), never equal to the ignore index.
    pub fn case(&self, seed: u64) -> Case {
        let label = self.label(if self.target_zero { " target0" } else { "" });
        let mut rng = Rng::for_case(seed, &format!("{label} targets"));
        let lo = if self.target_zero { 0 } else { 1 };
        let span = (self.vocab as u64).saturating_sub(lo).max(1);
        let mut targets: Vec<i64> = (0..self.rows)
            .map(|_| loop {
                let t = if rng.next_u64().is_multiple_of(7) {
                    self.ignore_index
                } else {
                    (lo + rng.next_u64() % span) as i64
                };
                // V = 1 without target_zero has no valid class: every row is ignored.
                if t == self.ignore_index || (t as usize) < self.vocab {
                    break t;
                }
            })
            .collect();
        // At least one counted row (all-ignored is an edge case: stats would be 0).
        if targets.iter().all(|&t| t == self.ignore_index) && (lo as usize) < self.vocab {
            targets[0] = (lo + (self.ignore_index == lo as i64) as u64) as i64;
        }
        self.build(seed, label, targets)
    }

    /// A case with given targets (their number must be `rows`).
    pub fn case_with_targets(&self, seed: u64, targets: Vec<i64>, what: &str) -> Case {
        assert_eq!(targets.len(), self.rows);
        self.build(seed, self.label(&format!(" {what}")), targets)
    }

    fn build(&self, seed: u64, label: String, targets: Vec<i64>) -> Case {
        let (rows, vocab, dtype, index) = (self.rows, self.vocab, self.dtype, self.index);
        let mut rng = Rng::for_case(seed, &label);
        let scale = self.logit_scale;
        // The window kernels take the logits and the gradient flat, and V as a scalar.
        let xshape: Vec<usize> = if self.window {
            vec![rows * vocab]
        } else {
            vec![rows, vocab]
        };
        let logits = random_tensor(&mut rng, dtype, &xshape, |r| scale * r.normalish());
        let tvals: Vec<f64> = targets.iter().map(|&t| t as f64).collect();
        let stats = stats_of(&targets, self.ignore_index);
        let mut args = vec![
            ArgValue::Tensor(logits),
            ArgValue::Tensor(HostTensor::from_f64(index, &[rows], &tvals)),
            ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[2], &stats)),
            ArgValue::Tensor(poisoned(DType::F32, &[rows])),
        ];
        let (names, outputs, kernel_name): (&[&str], Vec<usize>, _) =
            match (self.in_place, self.window) {
                (true, false) => (
                    &["logits", "targets", "stats", "loss", "ignore_index"],
                    vec![3, 0],
                    self.kernel_name(),
                ),
                (true, true) => (
                    &[
                        "logits",
                        "targets",
                        "stats",
                        "loss",
                        "vocab",
                        "ignore_index",
                    ],
                    vec![3, 0],
                    self.kernel_name(),
                ),
                (false, window) => {
                    args.push(ArgValue::Tensor(poisoned(dtype, &xshape)));
                    (
                        if window {
                            &[
                                "logits",
                                "targets",
                                "stats",
                                "loss",
                                "dlogits",
                                "vocab",
                                "ignore_index",
                            ]
                        } else {
                            &[
                                "logits",
                                "targets",
                                "stats",
                                "loss",
                                "dlogits",
                                "ignore_index",
                            ]
                        },
                        vec![3, 4],
                        self.kernel_name(),
                    )
                }
            };
        if self.window {
            args.push(ArgValue::Scalar(Scalar::Int(vocab as i64, DType::I32)));
        }
        args.push(index_scalar(index, self.ignore_index));
        let ignore_arg = args.len() - 1;
        // Loss (f32 output): logsumexp in f32 with ex2/lg2 (about 2 ulp each) over a sum
        // with (tiles + log2 BLOCK) roundings, and (m - x[target]) exact when small. The
        // gradient: p * inv_count is relative-accurate (no cancellation); the target's
        // (p - 1) * inv_count loses about 2^-24 / (1 - p) relative. f16/bf16 gradients
        // add one rounding of the storage type.
        let f32_tol = Tolerance {
            rel: 3e-5,
            abs: 1e-12,
        };
        Case {
            options: Default::default(),
            kernel: if self.window {
                "cross_entropy_window"
            } else if self.cluster.is_some() {
                "cross_entropy_cluster"
            } else if self.cached.is_some() {
                "cross_entropy_cached"
            } else {
                "cross_entropy"
            },
            kernel_name: Some(kernel_name),
            label,
            defines: {
                let mut d = vec![
                    ("T", dtype.to_string()),
                    ("I", index.to_string()),
                    ("BLOCK", self.block.to_string()),
                    (
                        "VEC",
                        crate::ops::loss::ce_vec(dtype, self.block).to_string(),
                    ),
                ];
                if let Some((c, p)) = self.cluster {
                    d.push(("PARTS", p.to_string()));
                    d.push(("CLUSTER", c.to_string()));
                    // The cluster kernels cache all PARTS tiles unless told fewer.
                    d.push(("SLOTS", self.cached.unwrap_or(p).to_string()));
                } else if let Some(s) = self.cached {
                    d.push(("SLOTS", s.to_string()));
                }
                if let Some(depth) = self.depth {
                    d.push(("DEPTH", depth.to_string()));
                }
                if self.no_async && !self.window {
                    d.push(("ASYNC", "false".to_string()));
                }
                defines(&d)
            },
            tensor_align: aligns(names, &args),
            grid: match self.cluster {
                Some((c, _)) => [self.grid.unwrap_or(rows * c) as u32, 1, 1],
                None => [self.grid.unwrap_or(rows) as u32, 1, 1],
            },
            args,
            outputs,
            reference: Box::new(move |args| {
                let x = tensor_at(args, 0).to_f64_vec();
                let t: Vec<i64> = tensor_at(args, 1)
                    .to_f64_vec()
                    .iter()
                    .map(|&v| v as i64)
                    .collect();
                let inv = tensor_at(args, 2).to_f64_vec()[1];
                let ign = scalar_at(args, ignore_arg) as i64;
                let (loss, dx) = reference(&x, vocab, &t, ign, inv);
                vec![loss, dx]
            }),
            tolerance: Tolerance::for_dtype(dtype, f32_tol),
        }
    }
}

/// Cross-entropy per row in f64, as the kernels define it: returns (loss [rows],
/// dx [rows * vocab]). `inv_count` is the value the kernel reads from stats.
pub fn reference(
    x: &[f64],
    vocab: usize,
    targets: &[i64],
    ignore: i64,
    inv_count: f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut loss = Vec::with_capacity(targets.len());
    let mut dx = Vec::with_capacity(x.len());
    for (row, &t) in x.chunks(vocab).zip(targets) {
        if t == ignore {
            loss.push(0.0);
            dx.extend(std::iter::repeat_n(0.0, vocab));
        } else if t < 0 || t >= vocab as i64 {
            loss.push(f64::NAN);
            dx.extend(std::iter::repeat_n(f64::NAN, vocab));
        } else {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            let lse = m + s.ln();
            loss.push(lse - row[t as usize]);
            for (j, v) in row.iter().enumerate() {
                let p = (v - lse).exp();
                let onehot = if j as i64 == t { 1.0 } else { 0.0 };
                dx.push((p - onehot) * inv_count);
            }
        }
    }
    (loss, dx)
}

/// Row-wise softmax backward in f64: dx = y * (dy - sum(dy * y)) per row of `cols`.
pub fn softmax_bwd_reference(y: &[f64], dy: &[f64], cols: usize) -> Vec<f64> {
    let mut dx = Vec::with_capacity(y.len());
    for (yr, gr) in y.chunks(cols).zip(dy.chunks(cols)) {
        let dot: f64 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
        dx.extend(yr.iter().zip(gr).map(|(a, b)| a * (b - dot)));
    }
    dx
}

/// `[count, inv_count]` as `ce_count` defines it, in f64, for targets given as f64
/// values (the form the op tests upload).
pub fn count_reference(targets: &[f64], ignore_index: f64) -> [f64; 2] {
    let count = targets.iter().filter(|&&t| t != ignore_index).count() as f64;
    [count, if count > 0.0 { 1.0 / count } else { 0.0 }]
}

/// [`reference`] for targets and ignore index given as f64 values.
pub fn ce_reference(
    x: &[f64],
    targets: &[f64],
    vocab: usize,
    ignore_index: f64,
    inv_count: f64,
) -> (Vec<f64>, Vec<f64>) {
    let t: Vec<i64> = targets.iter().map(|&v| v as i64).collect();
    reference(x, vocab, &t, ignore_index as i64, inv_count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_core::{compile_to_ir, interp};

    fn run(case: &Case) -> CompareResult {
        let src = case.source();
        let (func, _) = compile_to_ir(&src, &case.compile_options(Arch::Sm80))
            .unwrap_or_else(|d| panic!("{}: {}", case.label, d.render(&src)));
        let mut args = case.args.clone();
        interp::run(&func, case.grid, &mut args).unwrap_or_else(|e| panic!("{}: {e}", case.label));
        compare(&args, case)
    }

    fn check_all(cases: &[Case]) {
        let failures: Vec<String> = cases
            .iter()
            .filter_map(|c| {
                let r = run(c);
                (!r.passed()).then(|| format!("  {}: {r}", c.label))
            })
            .collect();
        assert!(
            failures.is_empty(),
            "{} of {} failed:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn quick_cases_match_reference() {
        check_all(&cases(7, SizeSet::Quick));
    }

    #[test]
    fn edge_cases_match_defined_behaviour() {
        let edge = edge_cases(7);
        // The out-of-range and all-ignored expectations are really there.
        let nan_outputs = edge
            .iter()
            .filter(|c| c.expected().iter().any(|o| o.iter().any(|v| v.is_nan())))
            .count();
        assert!(nan_outputs >= 4, "{nan_outputs}");
        check_all(&edge);
    }

    #[test]
    fn reference_matches_a_direct_formula() {
        // loss = -log softmax(x)[t], and the gradient row sums to 0 (softmax sums to 1).
        let x = [0.5, -1.0, 2.0, 0.25];
        let (loss, dx) = reference(&x, 4, &[2], IGNORE_INDEX, 1.0);
        let z: f64 = x.iter().map(|v: &f64| v.exp()).sum();
        assert!((loss[0] - -(x[2].exp() / z).ln()).abs() < 1e-12);
        assert!(dx.iter().sum::<f64>().abs() < 1e-12);
        assert!((dx[2] - (x[2].exp() / z - 1.0)).abs() < 1e-12);
    }

    #[test]
    fn a_wrong_gradient_fails_the_comparison() {
        // The tolerance is tight enough to see a dx that misses the one-hot term on one
        // row (the smallest plausible bug) in an f32 case.
        let case = CeSpec::new(DType::F32, DType::I64, 3, 7, 4096).case(1);
        let src = case.source();
        let (func, _) = compile_to_ir(&src, &case.compile_options(Arch::Sm80)).unwrap();
        let mut args = case.args.clone();
        interp::run(&func, case.grid, &mut args).unwrap();
        assert!(compare(&args, &case).passed());
        let t = tensor_at(&args, 1).to_f64_vec();
        let row = (0..3)
            .find(|&r| t[r] as i64 != IGNORE_INDEX)
            .expect("a non-ignored row");
        let inv = tensor_at(&args, 2).to_f64_vec()[1];
        if let ArgValue::Tensor(dx) = &mut args[4] {
            let i = row * 7 + t[row] as usize;
            let v = dx.get_linear(i);
            dx.set_linear(i, v + inv);
        }
        assert!(!compare(&args, &case).passed());
    }
}
