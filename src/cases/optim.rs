//! `optim.kg`: the multi-tensor AdamW step (`adamw_multi`) over a flat buffer of several
//! param groups, and the gradient statistics (`grad_stats`, `grad_stats_finalize`,
//! `scale_by`). Inputs are finite and nonzero (the table's rule), so non-finite gradients
//! are tested through the op path (`kgen::optim` tests and GPU checks), which runs these
//! same kernels.

use super::*;
use crate::optim::{FlatLayout, ParamGroup, CAP_COLS, HP_COLS};

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    use DType::*;
    let mut v = Vec::new();
    // (T, S, group shapes, BLOCK, grid): grid None = one chunk per block.
    type Row = (
        DType,
        DType,
        &'static [&'static [usize]],
        usize,
        Option<usize>,
    );
    let quick: &[Row] = &[
        (F32, F32, &[&[1, 7], &[1000], &[4097]], 1024, None),
        (F32, F32, &[&[4097, 1], &[7]], 512, Some(3)),
        (BF16, F32, &[&[7], &[1000, 1, 4097]], 1024, None),
        (BF16, BF16, &[&[1], &[7], &[1000], &[4097]], 256, Some(5)),
        (F16, F32, &[&[1000, 7], &[1]], 1024, Some(1)),
        (F16, F16, &[&[4097]], 2048, None),
    ];
    for &(t, s, groups, block, grid) in quick {
        v.push(adamw_multi_case(seed, t, s, groups, block, grid));
    }
    for &(t, s, sizes, block, grid) in &[
        (F32, F32, &[1usize, 7, 1000, 4097][..], 1024usize, None),
        (BF16, BF16, &[4097, 3][..], 256, Some(5)),
    ] {
        v.push(adamw_one_group_case(seed, t, s, sizes, block, grid));
    }
    // Capturable: t = 2 (the series branch for both betas; t = 1 from a zero counter is
    // in the optimizer's tests), 7 and 1000 (beta1's 1 - e^x branch), a grid-stride grid
    // and one with more blocks than chunks.
    for &(t, s, groups, block, grid, done) in &[
        (
            F32,
            F32,
            &[&[1usize, 7][..], &[1000]][..],
            1024usize,
            None,
            1u64,
        ),
        (BF16, F32, &[&[4097][..], &[7, 1]], 512, Some(3), 6),
        (F32, BF16, &[&[1000][..]], 256, Some(9), 999),
    ] {
        v.push(adamw_capturable_case(seed, t, s, groups, block, grid, done));
    }
    // AMSGrad: groups with and without it in one launch; f32 and half states.
    for &(t, s, groups, block, grid) in &[
        (
            F32,
            F32,
            &[&[1usize, 7][..], &[1000], &[4097]][..],
            1024usize,
            None,
        ),
        (BF16, BF16, &[&[4097][..], &[7, 1]], 256, Some(5)),
        (F16, F32, &[&[1000][..]], 512, Some(3)),
    ] {
        v.push(adamw_amsgrad_case(seed, t, s, groups, block, grid));
    }
    for &(dt, n, block, grid) in &[
        (F32, 1usize, 1024usize, None),
        (F32, 7, 1024, None),
        (F32, 1000, 1024, None),
        (F32, 4097, 1024, None),
        (F32, 4097, 256, Some(3)),
        (BF16, 4097, 1024, Some(2)),
        (F16, 1000, 128, Some(5)),
        (BF16, 7, 1024, Some(4)), // more blocks than chunks: rows without chunks are 0
    ] {
        v.push(grad_stats_case(seed, dt, n, block, grid));
    }
    for &(rows, max_norm) in &[(1usize, 1.0f64), (7, 1e9), (1000, 5.0), (4097, 1e9)] {
        v.push(finalize_case(seed, rows, max_norm));
    }
    for &(dt, n, block, grid, coef) in &[
        (F32, 1usize, 1024usize, None, 0.37),
        (F32, 4097, 1024, None, 0.37),
        (F32, 1000, 256, Some(2), 1.0), // coefficient 1: the blocks skip, g unchanged
        (BF16, 4097, 512, Some(3), 0.05),
        (F16, 7, 1024, None, 0.9),
    ] {
        v.push(scale_by_case(seed, dt, n, block, grid, coef));
    }
    if sizes == SizeSet::Full {
        v.push(adamw_multi_case(
            seed,
            F32,
            F32,
            &[&[1_000_003], &[65_537, 3]],
            1024,
            None,
        ));
        v.push(adamw_multi_case(
            seed,
            BF16,
            BF16,
            &[&[262_147], &[1]],
            2048,
            Some(264),
        ));
        v.push(grad_stats_case(seed, F32, 1_000_003, 1024, Some(528)));
        v.push(grad_stats_case(seed, BF16, 1_000_003, 4096, Some(132)));
        v.push(scale_by_case(seed, F32, 1_000_003, 1024, None, 0.25));
    }
    v
}

/// `adamw_multi`'s parameters, in order.
const ADAMW_PARAMS: [&str; 10] = [
    "p",
    "g",
    "m",
    "v",
    "block_group",
    "hp",
    "count",
    "cap",
    "vmax",
    "ams",
];

/// Per-group hyperparameters for case `gi` (varied lr, betas, eps, weight decay,
/// maximize, step), as the optimizer computes its table rows.
fn group_hyper(gi: usize) -> (ParamGroup, u64) {
    let g = ParamGroup {
        betas: [(0.9, 0.999), (0.8, 0.95), (0.95, 0.99)][gi % 3],
        eps: [1e-8, 1e-6, 1e-3][gi % 3],
        weight_decay: [0.1, 0.0, 0.01][gi % 3],
        maximize: gi % 2 == 1,
        ..ParamGroup::new([1e-3, 3e-3, 1e-2][gi % 3])
    };
    (g, [1u64, 10, 1000][gi % 3])
}

/// The hyperparameters of the table's decoy row 0, which no chunk names.
fn decoy_group() -> ParamGroup {
    ParamGroup {
        betas: (0.5, 0.5),
        eps: 0.5,
        weight_decay: 0.5,
        ..ParamGroup::new(0.5)
    }
}

/// `adamw_multi` over groups laid out as the optimizer does (tensors 16-byte aligned,
/// groups at multiples of BLOCK). Every element, padding included, holds random nonzero
/// data: the kernel treats padding like any element of its chunk's group. Row 0 of the
/// table is a decoy no chunk names (`block_group` holds 1..=groups), so an off-by-one
/// table read shows.
pub fn adamw_multi_case(
    seed: u64,
    t: DType,
    s: DType,
    groups: &[&[usize]],
    block: usize,
    grid: Option<usize>,
) -> Case {
    let shapes: Vec<Vec<Vec<usize>>> = groups
        .iter()
        .map(|g| g.iter().map(|&n| vec![n]).collect())
        .collect();
    let narrow = t.size_bytes().min(s.size_bytes()) as usize;
    let layout = FlatLayout::new(&shapes, 16 / narrow, block).expect("case layout");
    let n = layout.len;
    let nchunks = n / block;
    let g = grid.unwrap_or(nchunks);
    let label = format!("adamw_multi T={t} S={s} BLOCK={block} groups={groups:?} grid={g}");
    let mut rng = Rng::for_case(seed, &label);
    let p = random_tensor(&mut rng, t, &[n], |r| r.signed_magnitude(1e-2, 1.0));
    let gr = random_tensor(&mut rng, t, &[n], |r| r.signed_magnitude(1e-3, 1e-1));
    let m = random_tensor(&mut rng, s, &[n], |r| r.signed_magnitude(1e-4, 1e-2));
    let v = random_tensor(&mut rng, s, &[n], |r| r.uniform(1e-6, 1e-3));
    let bg: Vec<f64> = layout
        .block_groups(block)
        .iter()
        .map(|&x| x as f64 + 1.0)
        .collect();
    let block_group = HostTensor::from_f64(DType::I32, &[nchunks], &bg);
    let decoy = decoy_group();
    let mut table: Vec<f64> = decoy.hyper_row(1).iter().map(|&x| x as f64).collect();
    for gi in 0..groups.len() {
        let (h, step) = group_hyper(gi);
        table.extend(h.hyper_row(step).iter().map(|&x| x as f64));
    }
    let hp = HostTensor::from_f64(DType::F32, &[groups.len() + 1, HP_COLS], &table);
    // count and cap: read only when CAPTURABLE (adamw_capturable_case); nonzero like
    // every input of the table.
    let args = vec![
        ArgValue::Tensor(p),
        ArgValue::Tensor(gr),
        ArgValue::Tensor(m),
        ArgValue::Tensor(v),
        ArgValue::Tensor(block_group),
        ArgValue::Tensor(hp),
        ArgValue::Tensor(HostTensor::from_f64(DType::I32, &[1], &[1.0])),
        ArgValue::Tensor(HostTensor::from_f64(
            DType::F32,
            &[1, CAP_COLS],
            &[1.0; CAP_COLS],
        )),
        // vmax and ams: read only when AMSGRAD (adamw_amsgrad_case).
        ArgValue::Tensor(HostTensor::from_f64(s, &[1], &[1.0])),
        ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[1], &[1.0])),
    ];
    // As adamw.kg: a handful of f32 roundings of values <= 1, plus the update's error
    // where m cancels (and the approximate rsqrt's ~2^-22 on the update, << 5e-6).
    let f32_tol = Tolerance {
        rel: 5e-6,
        abs: 2e-7,
    };
    Case {
        options: Default::default(),
        kernel: "optim",
        kernel_name: Some("adamw_multi"),
        label,
        defines: defines(&[
            ("T", t.to_string()),
            ("S", s.to_string()),
            ("BLOCK", block.to_string()),
        ]),
        tensor_align: aligns(&ADAMW_PARAMS, &args),
        grid: [g as u32, 1, 1],
        args,
        outputs: vec![0, 2, 3],
        reference: Box::new(move |args| adamw_reference(args, block, false)),
        tolerance: Tolerance::for_dtype(t, f32_tol).max(Tolerance::for_dtype(s, f32_tol)),
    }
}

/// `adamw_multi`'s result in f64 from its arguments (chunks of `block` elements, each
/// with its group's table row): `[p, m, v]`, and with `amsgrad` also vmax (args 8 and 9:
/// an amsgrad group's denominator and new vmax use max(vmax, v_new), another group's
/// v_new).
fn adamw_reference(args: &[ArgValue], block: usize, amsgrad: bool) -> Vec<Vec<f64>> {
    let (mut p, g) = (
        tensor_at(args, 0).to_f64_vec(),
        tensor_at(args, 1).to_f64_vec(),
    );
    let (mut m, mut v) = (
        tensor_at(args, 2).to_f64_vec(),
        tensor_at(args, 3).to_f64_vec(),
    );
    let bg = tensor_at(args, 4).to_f64_vec();
    let hp = tensor_at(args, 5).to_f64_vec();
    let (mut vmax, ams) = if amsgrad {
        (
            tensor_at(args, 8).to_f64_vec(),
            tensor_at(args, 9).to_f64_vec(),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    for i in 0..p.len() {
        let row = bg[i / block] as usize;
        let [decay, beta1, c1, beta2, c2, eps, step_size, inv_bc2] =
            <[f64; HP_COLS]>::try_from(&hp[row * HP_COLS..][..HP_COLS]).expect("8 columns");
        m[i] = beta1 * m[i] + c1 * g[i];
        v[i] = beta2 * v[i] + c2 * g[i] * g[i];
        let vd = if !amsgrad {
            v[i]
        } else {
            vmax[i] = if ams[row] > 0.0 {
                vmax[i].max(v[i])
            } else {
                v[i]
            };
            vmax[i]
        };
        p[i] = p[i] * decay - step_size * m[i] / (vd.sqrt() * inv_bc2 + eps);
    }
    if amsgrad {
        vec![p, m, v, vmax]
    } else {
        vec![p, m, v]
    }
}

/// [`adamw_multi_case`] with one group and `ONE_GROUP = true` (what the optimizer passes
/// for a single group): the kernel takes row 0 of the table without reading the chunk
/// table. The case moves the group's row to 0 and the decoy to row 1, which every chunk
/// still names, so a kernel that read the chunk table would take the decoy's values;
/// the reference reads row 0.
pub fn adamw_one_group_case(
    seed: u64,
    t: DType,
    s: DType,
    sizes: &[usize],
    block: usize,
    grid: Option<usize>,
) -> Case {
    let mut case = adamw_multi_case(seed, t, s, &[sizes], block, grid);
    let hp = tensor_at(&case.args, 5).to_f64_vec();
    let (decoy, group) = hp.split_at(HP_COLS);
    let swapped: Vec<f64> = group.iter().chain(decoy).copied().collect();
    case.args[5] = ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[2, HP_COLS], &swapped));
    let nchunks = tensor_at(&case.args, 4).to_f64_vec().len();
    let row0 = HostTensor::from_f64(DType::I32, &[nchunks], &vec![0.0; nchunks]);
    let multi_reference = std::mem::replace(&mut case.reference, Box::new(|_| Vec::new()));
    case.reference = Box::new(move |args| {
        let mut args = args.to_vec();
        args[4] = ArgValue::Tensor(row0.clone());
        multi_reference(&args)
    });
    case.defines.push(("ONE_GROUP".into(), "true".into()));
    case.label = case
        .label
        .replacen("adamw_multi", "adamw_multi ONE_GROUP", 1);
    case
}

/// [`adamw_multi_case`] with `CAPTURABLE = true`: the step count comes from the device
/// counter (`done` steps × the grid before the launch, so t = done + 1 for every group)
/// and the bias corrections from `cap`'s `[lr, ln(beta1), ln(beta2)]` rows; the table's
/// bias-correction columns hold 1e30 (a kernel that read them would fail) and the
/// counter must come out as (done + 1) × grid.
pub fn adamw_capturable_case(
    seed: u64,
    t: DType,
    s: DType,
    groups: &[&[usize]],
    block: usize,
    grid: Option<usize>,
    done: u64,
) -> Case {
    let mut case = adamw_multi_case(seed, t, s, groups, block, grid);
    let g = case.grid[0] as f64;
    let step = done + 1;
    let ng = groups.len();
    // Row 0 the decoy (as the table), then the groups.
    let hypers: Vec<ParamGroup> = std::iter::once(decoy_group())
        .chain((0..ng).map(|gi| group_hyper(gi).0))
        .collect();
    let mut hp = tensor_at(&case.args, 5).to_f64_vec();
    for row in hp.chunks_mut(HP_COLS) {
        row[6] = 1e30;
        row[7] = 1e30;
    }
    let cap: Vec<f64> = hypers
        .iter()
        .flat_map(|h| [h.lr, h.betas.0.ln(), h.betas.1.ln(), 1.0])
        .collect();
    case.args[5] = ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[ng + 1, HP_COLS], &hp));
    case.args[6] = ArgValue::Tensor(HostTensor::from_f64(DType::I32, &[1], &[done as f64 * g]));
    case.args[7] = ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[ng + 1, CAP_COLS], &cap));
    case.tensor_align = aligns(&ADAMW_PARAMS, &case.args);
    // The reference: the table this step would have had, from the f64 hyperparameters.
    let rows: Vec<f64> = hypers
        .iter()
        .flat_map(|h| h.hyper_row(step).map(|x| x as f64))
        .collect();
    let table = HostTensor::from_f64(DType::F32, &[ng + 1, HP_COLS], &rows);
    let multi_reference = std::mem::replace(&mut case.reference, Box::new(|_| Vec::new()));
    case.reference = Box::new(move |args| {
        let mut args = args.to_vec();
        args[5] = ArgValue::Tensor(table.clone());
        let mut out = multi_reference(&args);
        out.push(vec![(done + 1) as f64 * g]);
        out
    });
    case.outputs.push(6);
    case.defines.push(("CAPTURABLE".into(), "true".into()));
    case.label = case.label.replacen(
        "adamw_multi",
        &format!("adamw_multi CAPTURABLE t={step}"),
        1,
    );
    case
}

/// [`adamw_multi_case`] with `AMSGRAD = true`: `vmax` random around `v`'s magnitudes (so
/// the maximum picks either side) and the flags `ams[row]` on for the decoy row 0 and
/// the odd rows (groups 0, 2, ... are on, 1, 3, ... off), so both kinds of group share
/// the launch. The reference: an amsgrad group's denominator and new vmax use
/// max(vmax, v_new); another group's use v_new (stored into vmax too).
pub fn adamw_amsgrad_case(
    seed: u64,
    t: DType,
    s: DType,
    groups: &[&[usize]],
    block: usize,
    grid: Option<usize>,
) -> Case {
    let mut case = adamw_multi_case(seed, t, s, groups, block, grid);
    let n = tensor_at(&case.args, 0).to_f64_vec().len();
    let mut rng = Rng::for_case(seed, &format!("{} vmax", case.label));
    let vmax = random_tensor(&mut rng, s, &[n], |r| r.uniform(1e-6, 2e-3));
    let flags: Vec<f64> = (0..=groups.len())
        .map(|row| if row == 0 || row % 2 == 1 { 1.0 } else { -1.0 })
        .collect();
    case.args[8] = ArgValue::Tensor(vmax);
    case.args[9] = ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[flags.len()], &flags));
    case.tensor_align = aligns(&ADAMW_PARAMS, &case.args);
    case.reference = Box::new(move |args| adamw_reference(args, block, true));
    case.outputs.push(8);
    case.defines.push(("AMSGRAD".into(), "true".into()));
    case.label = case.label.replacen("adamw_multi", "adamw_multi AMSGRAD", 1);
    case
}

/// `grad_stats` partials `[G, 2]`: (sum of squares, non-finite count = 0) per block over
/// chunks b, b + G, ...
pub fn grad_stats_case(seed: u64, dt: DType, n: usize, block: usize, grid: Option<usize>) -> Case {
    let g = grid.unwrap_or(cdiv(n, block));
    let label = format!("grad_stats T={dt} BLOCK={block} n={n} grid={g}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dt, &[n], |r| r.normalish());
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(poisoned(DType::F32, &[g, 2])),
    ];
    Case {
        options: Default::default(),
        kernel: "optim",
        kernel_name: Some("grad_stats"),
        label,
        defines: defines(&[("T", dt.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&["g", "partials"], &args),
        grid: [g as u32, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let mut parts = vec![0.0; 2 * g];
            for (c, chunk) in x.chunks(block).enumerate() {
                parts[2 * (c % g)] += chunk.iter().map(|v| v * v).sum::<f64>();
                parts[2 * (c % g) + 1] += chunk.iter().filter(|v| !v.is_finite()).count() as f64;
            }
            vec![parts]
        }),
        // Sums of positive terms in f32: ~(log2(BLOCK) + chunks) * 6e-8 relative; the
        // count (0 here) must be exact.
        tolerance: Tolerance {
            rel: 1e-5,
            abs: 1e-30,
        },
    }
}

/// `grad_stats_finalize` over `rows` random partials (counts 1..4): [sumsq, norm, count,
/// clip_coef] for `max_norm` (1e9: no clipping, coefficient exactly 1).
pub fn finalize_case(seed: u64, rows: usize, max_norm: f64) -> Case {
    let label = format!("grad_stats_finalize rows={rows} max_norm={max_norm:e}");
    let mut rng = Rng::for_case(seed, &label);
    let vals: Vec<f64> = (0..rows)
        .flat_map(|_| [rng.uniform(0.1, 1000.0), (1 + rng.next_u64() % 4) as f64])
        .collect();
    let args = vec![
        ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[rows, 2], &vals)),
        ArgValue::Tensor(poisoned(DType::F32, &[4])),
        f32_arg(max_norm),
    ];
    Case {
        options: Default::default(),
        kernel: "optim",
        kernel_name: Some("grad_stats_finalize"),
        label,
        defines: defines(&[("BLOCK", "1024".to_string())]),
        tensor_align: aligns(&["partials", "out", "max_norm"], &args),
        grid: [1, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| {
            let p = tensor_at(args, 0).to_f64_vec();
            let max_norm = scalar_at(args, 2);
            let sumsq: f64 = p.iter().step_by(2).sum();
            let count: f64 = p.iter().skip(1).step_by(2).sum();
            let norm = sumsq.sqrt();
            let coef = (max_norm / (norm + 1e-6)).min(1.0);
            vec![vec![sumsq, norm, count, coef]]
        }),
        tolerance: Tolerance {
            rel: 1e-5,
            abs: 1e-30,
        },
    }
}

/// `scale_by`: g *= stats[3] (stats holds random values elsewhere, which must be ignored).
pub fn scale_by_case(
    seed: u64,
    dt: DType,
    n: usize,
    block: usize,
    grid: Option<usize>,
    coef: f64,
) -> Case {
    let g = grid.unwrap_or(cdiv(n, block));
    let label = format!("scale_by T={dt} BLOCK={block} n={n} grid={g} coef={coef}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, dt, &[n], |r| r.normalish());
    let stats = [rng.uniform(1.0, 9.0), rng.uniform(1.0, 3.0), 2.0, coef];
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(HostTensor::from_f64(DType::F32, &[4], &stats)),
    ];
    Case {
        options: Default::default(),
        kernel: "optim",
        kernel_name: Some("scale_by"),
        label,
        defines: defines(&[("T", dt.to_string()), ("BLOCK", block.to_string())]),
        tensor_align: aligns(&["g", "stats"], &args),
        grid: [g as u32, 1, 1],
        args,
        outputs: vec![0],
        reference: Box::new(move |args| {
            let c = tensor_at(args, 1).to_f64_vec()[3];
            vec![tensor_at(args, 0)
                .to_f64_vec()
                .iter()
                .map(|v| v * c)
                .collect()]
        }),
        tolerance: Tolerance::for_dtype(
            dt,
            Tolerance {
                rel: 1e-6,
                abs: 1e-30,
            },
        ),
    }
}
