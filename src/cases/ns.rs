//! `ns.kg` (the Newton–Schulz products) and `muon.kg` (Muon's memory-bound kernels), each
//! kernel against a float64 reference on batches of awkward shapes (and, on a GPU, the
//! GPU against the interpreter). The op-level checks (the whole iteration, Muon's steps)
//! are `checks/ops/ns.rs` and `checks/optim/muon.rs`.

use super::*;

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    // Gram products: (matrices, mp, n, BM, EPI, NORM). mp a multiple of BM; BM 64 with
    // mp 128 gives 2 x 2 tiles: one mirrored pair.
    for &(k, mp, n, bm, epi, norm) in &[
        (1usize, 64usize, 7usize, 64u32, false, false),
        (2, 128, 33, 64, false, true),
        (2, 128, 127, 64, true, false),
        (1, 128, 300, 128, true, false),
        (2, 256, 70, 128, true, true),
    ] {
        v.push(gram_case(seed, k, mp, n, bm, epi, norm));
    }
    // The first Gram of the op's zero-copy path: the trace partials of diagonal tiles.
    v.push(gram_trace_case(seed, 2, 256, 300, 128));
    v.push(gram_trace_case(seed, 1, 192, 40, 64));
    // The split Gram (a tail split along K after a grid_sync): (matrices, mp, n, BM, EPI,
    // NORM, grid). 20 tiles on 6 blocks: 3 full rounds and 2 tiles in 2 chunks of 3 and 2
    // k-steps; 3 tiles on 8 blocks: no full round, each tile in 2 chunks; 10 tiles on 5
    // blocks: no tail. Rows 8- and 16-byte aligned, as the op's (the unaligned copy path
    // of these 64-row tiles spills; the op pads rows to 16 bytes).
    for &(k, mp, n, bm, epi, norm, g) in &[
        (2usize, 256usize, 300usize, 64u32, true, true, 6usize),
        (1, 128, 136, 64, false, true, 8),
        (1, 256, 40, 64, true, false, 5),
    ] {
        v.push(gram_split_case(seed, k, mp, n, bm, epi, norm, g));
    }
    for &(k, mp, n, norm) in &[(1usize, 128usize, 7usize, false), (2, 128, 300, true)] {
        v.push(update_case(seed, k, mp, n, norm, None));
    }
    // The normalizing products add up many partial sums in chunks of P (the op uses up
    // to 2048 for large matrices): 3000 partials are one full chunk and a masked one.
    v.push(with_parts(
        gram_case(seed, 2, 128, 33, 64, false, true),
        seed,
        2,
        3000,
        2048,
    ));
    v.push(with_parts(
        update_case(seed, 2, 128, 40, true, None),
        seed,
        2,
        3000,
        2048,
    ));
    // Persistent: blocks walking tiles across matrices (12 tiles on 5 blocks, 4 on 3),
    // the ring alive across them (passes/cross_round.rs).
    v.push(update_case(seed, 3, 256, 300, true, Some(5)));
    v.push(update_case(seed, 2, 128, 257, false, Some(3)));
    // Memory-bound kernels: (matrices, rows, cols, source dtype, momentum, Nesterov).
    for &(k, r, c, s, mom, nest) in &[
        (1usize, 7usize, 5usize, DType::F32, false, false),
        (2, 33, 70, DType::F32, true, true),
        (2, 70, 33, DType::F32, true, false),
        (3, 5, 7, DType::BF16, false, false),
    ] {
        v.push(prep_case(seed, k, r, c, s, mom, nest));
    }
    for &(k, r, c, accum) in &[
        (1usize, 7usize, 5usize, false),
        (2, 70, 33, true),
        (2, 33, 70, true),
    ] {
        v.push(emit_case(seed, k, r, c, accum));
    }
    if sizes == SizeSet::Full {
        v.push(gram_case(seed, 3, 256, 1000, 128, true, true));
        v.push(update_case(seed, 3, 256, 1000, true, None));
        v.push(prep_case(seed, 2, 1000, 300, DType::F32, true, true));
        v.push(emit_case(seed, 2, 1000, 300, true));
    }
    v
}

/// `case` (a normalizing `ns_gram` or `ns_update`, whose argument 3 is `part`) with
/// `parts` partial sums per matrix, added in chunks of `p`.
fn with_parts(mut case: Case, seed: u64, k: usize, parts: usize, p: usize) -> Case {
    case.label = format!("{} parts={parts} P={p}", case.label);
    let mut rng = Rng::for_case(seed, &case.label);
    case.args[3] = ArgValue::Tensor(random_tensor(&mut rng, DType::F32, &[k, parts], |r| {
        r.uniform(0.0, 0.01)
    }));
    case.defines.push(("P".into(), p.to_string()));
    case
}

/// The wide working shape of a `[rows, cols]` matrix, padded as `ops/newton_schulz.rs`
/// pads it.
fn padded(rows: usize, cols: usize) -> (usize, usize) {
    let (m, n) = (rows.min(cols), rows.max(cols));
    (m.max(1).next_multiple_of(128), n.max(1).next_multiple_of(8))
}

/// `1 / max(sqrt(sum(part[b, :])), eps)` per matrix.
fn scales(part: &[f64], k: usize, eps: f64) -> Vec<f64> {
    let per = part.len() / k.max(1);
    (0..k)
        .map(|b| {
            1.0 / part[b * per..(b + 1) * per]
                .iter()
                .sum::<f64>()
                .sqrt()
                .max(eps)
        })
        .collect()
}

fn bf16_tol(terms: usize) -> Tolerance {
    // One bf16 rounding of an f32 sum of `terms` products of order 1.
    Tolerance {
        rel: 8e-3,
        abs: 2e-3 * (terms as f64).sqrt(),
    }
}

/// `ns_gram` on k matrices `[mp, n]`: out = alpha u^2 x x^T (+ beta u d + diag I), u = s
/// (x is X0) or, with EPI, s^2 (x is the unnormalized A0); u = 1 without NORM.
pub fn gram_case(seed: u64, k: usize, mp: usize, n: usize, bm: u32, epi: bool, norm: bool) -> Case {
    let label = format!("ns_gram k={k} mp={mp} n={n} BM={bm} EPI={epi} NORM={norm}");
    let mut rng = Rng::for_case(seed, &label);
    let x = random_tensor(&mut rng, DType::BF16, &[k * mp, n], |r| r.normalish());
    // d is symmetric, as the kernel requires (it is A): the mirrored tile reads d's
    // tile above the diagonal, transposed.
    let dr = random_tensor(&mut rng, DType::BF16, &[k * mp, mp], |r| r.normalish()).to_f64_vec();
    let mut dv = dr.clone();
    for b in 0..k {
        for i in 0..mp {
            for j in 0..i {
                dv[(b * mp + i) * mp + j] = dr[(b * mp + j) * mp + i];
            }
        }
    }
    let d = HostTensor::from_f64(DType::BF16, &[k * mp, mp], &dv);
    let part = random_tensor(&mut rng, DType::F32, &[k, 5], |r| r.uniform(0.5, 2.0));
    let (alpha, beta, diag, eps) = (0.75, -0.5, 3.25, 1e-7);
    let args = vec![
        ArgValue::Tensor(x),
        ArgValue::Tensor(d),
        ArgValue::Tensor(poisoned(DType::BF16, &[k * mp, mp])),
        ArgValue::Tensor(part),
        f32_arg(alpha),
        f32_arg(beta),
        f32_arg(diag),
        f32_arg(eps),
    ];
    Case {
        // As the op's candidates: 4 warps for 64-row tiles, 8 for 128 (the compiler's
        // default for a 64 x 64 tile, 2 warps, spills with unaligned rows).
        options: CaseOptions {
            warps: Some(if bm == 64 { 4 } else { 8 }),
            ..Default::default()
        },
        kernel: "ns",
        kernel_name: Some("ns_gram"),
        label,
        defines: defines(&[
            ("BM", bm.to_string()),
            ("EPI", epi.to_string()),
            ("NORM", norm.to_string()),
        ]),
        tensor_align: aligns(
            &["x", "d", "out", "part", "alpha", "beta", "diag", "eps"],
            &args,
        ),
        grid: [
            (k * (mp / bm as usize) * (mp / bm as usize + 1) / 2) as u32,
            1,
            1,
        ],
        args,
        outputs: vec![2],
        reference: Box::new(move |args| {
            let x = tensor_at(args, 0).to_f64_vec();
            let d = tensor_at(args, 1).to_f64_vec();
            let s = match norm {
                true => scales(&tensor_at(args, 3).to_f64_vec(), k, eps),
                false => vec![1.0; k],
            };
            let mut out = vec![0.0; k * mp * mp];
            for b in 0..k {
                for i in 0..mp {
                    for j in 0..mp {
                        let row = |r: usize| &x[(b * mp + r) * n..(b * mp + r + 1) * n];
                        let dot: f64 = row(i).iter().zip(row(j)).map(|(p, q)| p * q).sum();
                        let at = (b * mp + i) * mp + j;
                        let u = if epi { s[b] * s[b] } else { s[b] };
                        let mut v = alpha * u * u * dot;
                        if epi {
                            v += beta * u * d[at] + if i == j { diag } else { 0.0 };
                        }
                        out[at] = v;
                    }
                }
            }
            vec![out]
        }),
        tolerance: bf16_tol(n),
    }
}

/// `ns_gram` with TRACE (no NORM, no EPI): besides x x^T, `part` ([k, mp / 64], poisoned)
/// gets each diagonal tile's trace at its first 64-row entry and zeros at the others.
pub fn gram_trace_case(seed: u64, k: usize, mp: usize, n: usize, bm: u32) -> Case {
    let mut c = gram_case(seed, k, mp, n, bm, false, false);
    c.label = format!("ns_gram k={k} mp={mp} n={n} BM={bm} TRACE");
    c.defines.push(("TRACE".into(), "true".into()));
    c.args[3] = ArgValue::Tensor(poisoned(DType::F32, &[k, mp / 64]));
    c.outputs = vec![2, 3];
    let product = std::mem::replace(&mut c.reference, Box::new(|_| Vec::new()));
    let (b, per) = (bm as usize, mp / 64);
    c.reference = Box::new(move |args| {
        let x = tensor_at(args, 0).to_f64_vec();
        let mut want = product(args);
        let mut part = vec![0.0; k * per];
        for m in 0..k {
            for t in 0..mp / b {
                part[m * per + t * b / 64] = (t * b..(t + 1) * b)
                    .map(|r| {
                        x[(m * mp + r) * n..(m * mp + r + 1) * n]
                            .iter()
                            .map(|v| v * v)
                            .sum::<f64>()
                    })
                    .sum();
            }
        }
        want.push(part);
        want
    });
    c
}

/// `ns_gram_split` on `g` blocks, the same product as [`gram_case`]: its tail's chunks
/// as the op picks them ([`crate::ops::newton_schulz::split_tail`]), the workspace
/// poisoned (every partial read is written first), the barrier's counter zero.
#[allow(clippy::too_many_arguments)]
pub fn gram_split_case(
    seed: u64,
    k: usize,
    mp: usize,
    n: usize,
    bm: u32,
    epi: bool,
    norm: bool,
    g: usize,
) -> Case {
    let mut c = gram_case(seed, k, mp, n, bm, epi, norm);
    let t = mp / bm as usize;
    let (r, ch) = crate::ops::newton_schulz::split_tail(k * t * (t + 1) / 2, g, n.div_ceil(64));
    c.label = format!(
        "{} split on {g} blocks (tail {r} x {ch})",
        c.label.replacen("ns_gram", "ns_gram_split", 1)
    );
    c.kernel_name = Some("ns_gram_split");
    c.defines.push(("CH".into(), ch.to_string()));
    let b = bm as usize;
    c.args.insert(
        4,
        ArgValue::Tensor(poisoned(DType::F32, &[(r * ch).max(1), b, b])),
    );
    c.args
        .insert(5, ArgValue::Tensor(HostTensor::zeros(DType::I32, &[1])));
    c.tensor_align = aligns(
        &[
            "x", "d", "out", "part", "ws", "counter", "alpha", "beta", "diag", "eps",
        ],
        &c.args,
    );
    c.grid = [g as u32, 1, 1];
    c
}

/// `ns_update` on k matrices: out = s bm x, bm `[mp, mp]`, x `[mp, n]`; `persistent`:
/// `PERSISTENT` on that many blocks.
pub fn update_case(
    seed: u64,
    k: usize,
    mp: usize,
    n: usize,
    norm: bool,
    persistent: Option<usize>,
) -> Case {
    let label = format!(
        "ns_update k={k} mp={mp} n={n} NORM={norm}{}",
        persistent
            .map(|b| format!(" persistent on {b} blocks"))
            .unwrap_or_default()
    );
    let mut rng = Rng::for_case(seed, &label);
    let bm = random_tensor(&mut rng, DType::BF16, &[k * mp, mp], |r| {
        r.normalish() * 0.1
    });
    let x = random_tensor(&mut rng, DType::BF16, &[k * mp, n], |r| r.normalish());
    let part = random_tensor(&mut rng, DType::F32, &[k, 3], |r| r.uniform(0.5, 2.0));
    let eps = 1e-7;
    let args = vec![
        ArgValue::Tensor(bm),
        ArgValue::Tensor(x),
        ArgValue::Tensor(poisoned(DType::BF16, &[k * mp, n])),
        ArgValue::Tensor(part),
        f32_arg(eps),
    ];
    // The default tile (128 x 256) and BK 64 divide mp = 128 or 256.
    let grid = persistent.unwrap_or(k * (mp / 128) * n.div_ceil(256));
    Case {
        options: Default::default(),
        kernel: "ns",
        kernel_name: Some("ns_update"),
        label,
        defines: defines(&[
            ("NORM", norm.to_string()),
            ("PERSISTENT", persistent.is_some().to_string()),
        ]),
        tensor_align: aligns(&["bm", "x", "out", "part", "eps"], &args),
        grid: [grid as u32, 1, 1],
        args,
        outputs: vec![2],
        reference: Box::new(move |args| {
            let b_ = tensor_at(args, 0).to_f64_vec();
            let x = tensor_at(args, 1).to_f64_vec();
            let s = match norm {
                true => scales(&tensor_at(args, 3).to_f64_vec(), k, eps),
                false => vec![1.0; k],
            };
            let mut out = vec![0.0; k * mp * n];
            for b in 0..k {
                for i in 0..mp {
                    for j in 0..n {
                        let v: f64 = (0..mp)
                            .map(|t| b_[(b * mp + i) * mp + t] * x[(b * mp + t) * n + j])
                            .sum();
                        out[(b * mp + i) * n + j] = s[b] * v;
                    }
                }
            }
            vec![out]
        }),
        tolerance: bf16_tol(mp),
    }
}

/// `ns_prep` on k matrices `[rows, cols]` of dtype `s`: the bf16 working buffer (wide,
/// padded with zeros), Muon's momentum when `mom`, and the partial sums of squares.
pub fn prep_case(
    seed: u64,
    k: usize,
    rows: usize,
    cols: usize,
    s: DType,
    mom: bool,
    nesterov: bool,
) -> Case {
    let trans = rows > cols;
    let label = format!(
        "ns_prep S={s} k={k} {rows}x{cols} MOMENTUM={mom} NESTEROV={nesterov} TRANS={trans}"
    );
    let mut rng = Rng::for_case(seed, &label);
    let (mp, np) = padded(rows, cols);
    let tn = np.div_ceil(64);
    let tiles = (mp / 64) * tn;
    let g = random_tensor(&mut rng, s, &[k, rows, cols], |r| r.normalish());
    let buf = if mom {
        random_tensor(&mut rng, DType::F32, &[k, rows, cols], |r| r.normalish())
    } else {
        HostTensor::from_f64(DType::F32, &[1, 1, 1], &[1.0])
    };
    let mu = 0.9;
    let args = vec![
        ArgValue::Tensor(g),
        ArgValue::Tensor(buf),
        ArgValue::Tensor(poisoned(DType::BF16, &[k, mp, np])),
        ArgValue::Tensor(poisoned(DType::F32, &[k, tiles])),
        f32_arg(mu),
    ];
    let mut outputs = vec![2, 3];
    if mom {
        outputs.insert(0, 1);
    }
    Case {
        options: Default::default(),
        kernel: "muon",
        kernel_name: Some("ns_prep"),
        label,
        defines: defines(&[
            ("S", s.to_string()),
            ("TRANS", trans.to_string()),
            ("MOMENTUM", mom.to_string()),
            ("NESTEROV", nesterov.to_string()),
        ]),
        tensor_align: aligns(&["g", "buf", "x", "part", "mu"], &args),
        grid: [tiles as u32, k as u32, 1],
        args,
        outputs,
        reference: Box::new(move |args| {
            let g = tensor_at(args, 0).to_f64_vec();
            let mu = scalar_at(args, 4);
            let mut buf = if mom {
                tensor_at(args, 1).to_f64_vec()
            } else {
                Vec::new()
            };
            let mut u = g.clone();
            if mom {
                for (i, (b, gv)) in buf.iter_mut().zip(&g).enumerate() {
                    *b += (1.0 - mu) * (gv - *b);
                    u[i] = if nesterov { gv + mu * (*b - gv) } else { *b };
                }
            }
            // Round to bf16 as the kernel stores it (f32 math first: the f64 values of
            // the lerps are within f32 rounding of the kernel's).
            let u = HostTensor::from_f64(DType::BF16, &[u.len()], &u).to_f64_vec();
            let mut x = vec![0.0; k * mp * np];
            for b in 0..k {
                for i in 0..rows {
                    for j in 0..cols {
                        let (wi, wj) = if trans { (j, i) } else { (i, j) };
                        x[(b * mp + wi) * np + wj] = u[(b * rows + i) * cols + j];
                    }
                }
            }
            let mut part = vec![0.0; k * tiles];
            for b in 0..k {
                for i in 0..mp {
                    for j in 0..np {
                        let v = x[(b * mp + i) * np + j];
                        part[b * tiles + (i / 64) * tn + j / 64] += v * v;
                    }
                }
            }
            let mut out = vec![x, part];
            if mom {
                out.insert(0, buf);
            }
            out
        }),
        tolerance: Tolerance::for_dtype(
            DType::BF16,
            Tolerance {
                rel: 1e-5,
                abs: 1e-6,
            },
        ),
    }
}

/// `ns_emit` into k matrices `[rows, cols]` (f32) from the wide working buffer:
/// `p = x`, or with `accum` `p = hp[b, 0] p + hp[b, 1] x`.
pub fn emit_case(seed: u64, k: usize, rows: usize, cols: usize, accum: bool) -> Case {
    let trans = rows > cols;
    let label = format!("ns_emit k={k} {rows}x{cols} ACCUM={accum} TRANS={trans}");
    let mut rng = Rng::for_case(seed, &label);
    let (mp, np) = padded(rows, cols);
    let p = if accum {
        random_tensor(&mut rng, DType::F32, &[k, rows, cols], |r| r.normalish())
    } else {
        poisoned(DType::F32, &[k, rows, cols])
    };
    let x = random_tensor(&mut rng, DType::BF16, &[k, mp, np], |r| r.normalish());
    let hp = random_tensor(&mut rng, DType::F32, &[k, 2], |r| r.uniform(-1.0, 1.0));
    let args = vec![
        ArgValue::Tensor(p),
        ArgValue::Tensor(x),
        ArgValue::Tensor(hp),
    ];
    Case {
        options: Default::default(),
        kernel: "muon",
        kernel_name: Some("ns_emit"),
        label,
        defines: defines(&[("TRANS", trans.to_string()), ("ACCUM", accum.to_string())]),
        tensor_align: aligns(&["p", "x", "hp"], &args),
        grid: [(rows.div_ceil(64) * cols.div_ceil(64)) as u32, k as u32, 1],
        args,
        outputs: vec![0],
        reference: Box::new(move |args| {
            let p = tensor_at(args, 0).to_f64_vec();
            let x = tensor_at(args, 1).to_f64_vec();
            let hp = tensor_at(args, 2).to_f64_vec();
            let mut out = vec![0.0; k * rows * cols];
            for b in 0..k {
                for i in 0..rows {
                    for j in 0..cols {
                        let (wi, wj) = if trans { (j, i) } else { (i, j) };
                        let o = x[(b * mp + wi) * np + wj];
                        let at = (b * rows + i) * cols + j;
                        out[at] = if accum {
                            hp[2 * b] * p[at] + hp[2 * b + 1] * o
                        } else {
                            o
                        };
                    }
                }
            }
            vec![out]
        }),
        tolerance: Tolerance {
            rel: 1e-6,
            abs: 1e-6,
        },
    }
}
