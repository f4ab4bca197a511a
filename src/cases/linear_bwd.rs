//! `linear_bwd.kg`: a linear layer's activation derivative and bias-gradient partials
//! (`linear_bwd`: dz = dy * act'(z), per-block column sums of dz) and the second stage
//! (`linear_bwd_db`: the column sum of the partial rows), over awkward shapes: M and N
//! each in {1, 7, 127, 1000, 4097} with the other moderate, rows whose stride is one
//! element longer than the row (2-byte aligned in 16-bit dtypes), every activation,
//! with and without the bias gradient, f32, f16 and bf16.

use super::gemm::Act;
use super::*;

const PARAMS: &[&str] = &["dy", "z", "dz", "db_partial"];
const DB_PARAMS: &[&str] = &["db_partial", "db"];

/// One `linear_bwd` launch.
#[derive(Clone, Copy, Debug)]
struct Shape {
    m: usize,
    n: usize,
    act: Act,
    db: bool,
    dtype: DType,
    /// Extra elements at the end of every row of dy and z (a row-stride view).
    pad: usize,
    /// Row groups G (the grid is G * cdiv(N, BLOCK)).
    groups: usize,
    rows: usize,
    block: usize,
}

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    use DType::*;
    let base = Shape {
        m: 40,
        n: 72,
        act: Act::Silu,
        db: true,
        dtype: BF16,
        pad: 0,
        groups: 3,
        rows: 8,
        block: 64,
    };
    let mut v = Vec::new();
    let extents: &[usize] = match sizes {
        SizeSet::Quick => &[1, 7, 127, 1000],
        SizeSet::Full => &[1, 7, 127, 1000, 4097],
    };
    for &e in extents {
        v.push(Shape { m: e, ..base });
        v.push(Shape { n: e, ..base });
    }
    for act in [Act::None, Act::Relu, Act::GeluTanh, Act::Silu] {
        for dtype in [F32, F16, BF16] {
            v.push(Shape {
                m: 33,
                n: 100,
                act,
                dtype,
                ..base
            });
        }
        if act != Act::None {
            v.push(Shape {
                db: false,
                pad: 1,
                ..Shape {
                    m: 33,
                    n: 100,
                    act,
                    ..base
                }
            });
        }
    }
    // More groups than row tiles (blocks with no rows write zero partials), one group,
    // misaligned rows, tiles wider than the rows.
    v.push(Shape {
        groups: 9,
        m: 20,
        ..base
    });
    v.push(Shape {
        groups: 1,
        m: 127,
        n: 7,
        act: Act::GeluTanh,
        dtype: F16,
        pad: 1,
        ..base
    });
    v.push(Shape {
        m: 100,
        n: 130,
        act: Act::Relu,
        pad: 3,
        rows: 4,
        block: 256,
        ..base
    });
    if sizes == SizeSet::Full {
        v.push(Shape {
            m: 1000,
            n: 4097,
            groups: 16,
            rows: 16,
            block: 256,
            ..base
        });
        v.push(Shape {
            m: 4097,
            n: 1000,
            act: Act::GeluTanh,
            dtype: F16,
            groups: 33,
            rows: 16,
            block: 256,
            ..base
        });
    }
    let mut out: Vec<Case> = v.into_iter().map(|s| case(seed, s)).collect();
    for &(g, n, dtype) in &[
        (1usize, 7usize, DType::BF16),
        (37, 1000, DType::F16),
        (5, 4097, DType::F32),
    ] {
        out.push(db_case(seed, g, n, dtype));
    }
    out
}

/// A `[rows, cols]` view over rows of `cols + pad` elements, random values.
fn padded(rng: &mut Rng, dtype: DType, rows: usize, cols: usize, pad: usize) -> HostTensor {
    let full = random_tensor(rng, dtype, &[rows, cols + pad], |r| r.normalish());
    HostTensor {
        dtype,
        shape: vec![rows, cols],
        strides: vec![cols + pad, 1],
        data: full.data,
    }
}

/// The values of a host tensor view, row-major.
fn values(t: &HostTensor) -> Vec<f64> {
    t.to_f64_vec()
}

/// dz and the [G, N] partials in f64, for `s`'s grouping of row tiles.
fn reference(s: &Shape, dy: &[f64], z: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (m, n) = (s.m, s.n);
    let dz: Vec<f64> = dy
        .iter()
        .zip(z)
        .map(|(d, x)| d * s.act.derivative(*x))
        .collect();
    let mut part = vec![0.0; s.groups * n];
    for i in 0..m {
        let g = (i / s.rows) % s.groups;
        for j in 0..n {
            part[g * n + j] += dz[i * n + j];
        }
    }
    (dz, part)
}

fn case(seed: u64, s: Shape) -> Case {
    let label = format!(
        "linear_bwd T={} [{}x{}]{} act={:?}{} G={} tile {}x{}",
        s.dtype,
        s.m,
        s.n,
        if s.pad > 0 {
            format!(" row stride {}", s.n + s.pad)
        } else {
            String::new()
        },
        s.act,
        if s.db { " +db" } else { "" },
        s.groups,
        s.rows,
        s.block
    );
    let mut rng = Rng::for_case(seed, &label);
    let dy = padded(&mut rng, s.dtype, s.m, s.n, s.pad);
    let with_z = s.act != Act::None;
    // Without an activation z and dz are not touched: 1 x 1 inputs.
    let z = if with_z {
        // Pre-activations of both signs and around the activations' bends.
        let full = random_tensor(&mut rng, s.dtype, &[s.m, s.n + s.pad], |r| {
            2.0 * r.normalish()
        });
        HostTensor {
            dtype: s.dtype,
            shape: vec![s.m, s.n],
            strides: vec![s.n + s.pad, 1],
            data: full.data,
        }
    } else {
        random_tensor(&mut rng, s.dtype, &[1, 1], |r| r.normalish())
    };
    let dz = if with_z {
        poisoned(s.dtype, &[s.m, s.n])
    } else {
        random_tensor(&mut rng, s.dtype, &[1, 1], |r| r.normalish())
    };
    let part = if s.db {
        poisoned(DType::F32, &[s.groups, s.n])
    } else {
        random_tensor(&mut rng, DType::F32, &[1, 1], |r| r.normalish())
    };
    let args = vec![
        ArgValue::Tensor(dy),
        ArgValue::Tensor(z),
        ArgValue::Tensor(dz),
        ArgValue::Tensor(part),
    ];
    let mut outputs = Vec::new();
    if with_z {
        outputs.push(2);
    }
    if s.db {
        outputs.push(3);
    }
    Case {
        options: Default::default(),
        kernel: "linear_bwd",
        kernel_name: Some("linear_bwd"),
        label,
        defines: defines(&[
            ("T", s.dtype.to_string()),
            ("ACT", (s.act as i32).to_string()),
            ("DB", s.db.to_string()),
            ("ROWS", s.rows.to_string()),
            ("BLOCK", s.block.to_string()),
        ]),
        tensor_align: aligns(PARAMS, &args),
        grid: [(s.groups * cdiv(s.n, s.block)) as u32, 1, 1],
        args,
        outputs,
        reference: Box::new(move |args| {
            let dy = values(tensor_at(args, 0));
            let z = if s.act == Act::None {
                vec![0.0; dy.len()]
            } else {
                values(tensor_at(args, 1))
            };
            let (dz, part) = reference(&s, &dy, &z);
            let mut out = Vec::new();
            if s.act != Act::None {
                out.push(dz);
            }
            if s.db {
                out.push(part);
            }
            out
        }),
        // dz: one rounding to T of an f32 product (sigmoid is ex2.approx-based on the
        // GPU: a few ulp of f32). The partials: f32 sums of up to M / G products of
        // magnitude ~1 (GELU's derivative reaches ~1.13), in another order than the
        // reference's: a few ulp of the sum of magnitudes, 4e-7 per term as a floor.
        tolerance: Tolerance::for_dtype(
            s.dtype,
            Tolerance {
                rel: 1e-5,
                abs: 4e-7 * (cdiv(s.m, s.groups)).max(1) as f64,
            },
        ),
    }
}

/// One `linear_bwd_db` launch over `g` random partial rows of `n` columns.
fn db_case(seed: u64, g: usize, n: usize, dtype: DType) -> Case {
    let (block, rows) = (128, 16);
    let label = format!("linear_bwd_db T={dtype} G={g} N={n}");
    let mut rng = Rng::for_case(seed, &label);
    let part = random_tensor(&mut rng, DType::F32, &[g, n], |r| r.normalish());
    let db = poisoned(dtype, &[n]);
    let args = vec![ArgValue::Tensor(part), ArgValue::Tensor(db)];
    Case {
        options: Default::default(),
        kernel: "linear_bwd",
        kernel_name: Some("linear_bwd_db"),
        label,
        defines: defines(&[
            ("T", dtype.to_string()),
            ("BLOCK", block.to_string()),
            ("ROWS", rows.to_string()),
        ]),
        tensor_align: aligns(DB_PARAMS, &args),
        grid: [cdiv(n, block) as u32, 1, 1],
        args,
        outputs: vec![1],
        reference: Box::new(move |args| {
            let p = values(tensor_at(args, 0));
            let mut db = vec![0.0; n];
            for row in p.chunks(n) {
                for (d, v) in db.iter_mut().zip(row) {
                    *d += v;
                }
            }
            vec![db]
        }),
        // f32 sums of g terms of magnitude ~1, rounded once to T.
        tolerance: Tolerance::for_dtype(
            dtype,
            Tolerance {
                rel: 1e-6,
                abs: 1e-6 * g as f64,
            },
        ),
    }
}
