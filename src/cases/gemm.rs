//! `gemm.kg`: c = act(a @ b + bias) on tensor cores, over awkward shapes (each of M, N,
//! K in {1, 7, 127, 1000, 4097} with the others moderate), transposed operands, the
//! bias and each activation, bf16 and f16, and the pre-activation output (`PREACT`).

use super::*;

const PARAMS: &[&str] = &["a", "b", "bias", "c", "z"];

/// The epilogue activations of `gemm.kg` (`ACT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    None = 0,
    Relu = 1,
    GeluTanh = 2,
    Silu = 3,
}

impl Act {
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Act::None => x,
            Act::Relu => x.max(0.0),
            Act::GeluTanh => {
                let inner = 0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x);
                0.5 * x * (1.0 + inner.tanh())
            }
            Act::Silu => x / (1.0 + (-x).exp()),
        }
    }

    /// The derivative `act'(x)` (GELU: of the tanh approximation, exactly; ReLU: 0 at
    /// and below 0, torch's threshold_backward).
    pub fn derivative(self, x: f64) -> f64 {
        match self {
            Act::None => 1.0,
            Act::Relu => {
                if x <= 0.0 {
                    0.0
                } else {
                    1.0
                }
            }
            Act::GeluTanh => {
                const C: f64 = 0.797_884_560_802_865_4;
                let t = (C * (x + 0.044715 * x * x * x)).tanh();
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * x * x)
            }
            Act::Silu => {
                let s = 1.0 / (1.0 + (-x).exp());
                s * (1.0 + x * (1.0 - s))
            }
        }
    }
}

/// One gemm configuration.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub bias: bool,
    pub act: Act,
    /// Also write the pre-activation `z = a @ b + bias` (`PREACT`).
    pub preact: bool,
    pub dtype: DType,
    /// (BM, BN, BK).
    pub tile: (usize, usize, usize),
    /// `PERSISTENT` on a grid of this many blocks (fewer than the tiles: each block
    /// walks tiles `grid` apart); `None`: one block per tile.
    pub persistent: Option<usize>,
    /// `CLUSTER = 2`: blocks in clusters of two sharing b's tile (sm_90a).
    pub cluster: bool,
    /// `--multicast` (b's tile copied once for the pair) and `--ws` (a producer
    /// warpgroup issues the copies).
    pub options: CaseOptions,
}

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    use DType::*;
    let base = Shape {
        m: 48,
        n: 40,
        k: 56,
        trans_a: false,
        trans_b: false,
        bias: false,
        act: Act::None,
        preact: false,
        dtype: BF16,
        tile: (64, 64, 32),
        persistent: None,
        cluster: false,
        options: CaseOptions::default(),
    };
    let mut v: Vec<Shape> = Vec::new();
    let extents: &[usize] = match sizes {
        SizeSet::Quick => &[1, 7, 127, 1000],
        SizeSet::Full => &[1, 7, 127, 1000, 4097],
    };
    for &e in extents {
        v.push(Shape { m: e, ..base });
        v.push(Shape { n: e, ..base });
        v.push(Shape { k: e, ..base });
    }
    for (ta, tb) in [(true, false), (false, true), (true, true)] {
        v.push(Shape {
            m: 130,
            n: 72,
            k: 100,
            trans_a: ta,
            trans_b: tb,
            ..base
        });
    }
    for act in [Act::None, Act::Relu, Act::GeluTanh, Act::Silu] {
        v.push(Shape {
            m: 70,
            n: 136,
            k: 48,
            bias: true,
            act,
            ..base
        });
    }
    v.push(Shape {
        m: 129,
        n: 130,
        k: 72,
        dtype: F16,
        trans_b: true,
        bias: true,
        act: Act::GeluTanh,
        tile: (128, 128, 32),
        ..base
    });
    v.push(Shape {
        m: 200,
        n: 264,
        k: 200,
        tile: (128, 128, 64),
        ..base
    });
    // Tiles that take wgmma on sm_90a (8 warps over 128 rows, 4 over 64: every warp
    // owns 16 rows), each orientation of the operands, edges in every dimension.
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        v.push(Shape {
            m: 130,
            n: 200,
            k: 136,
            trans_a: ta,
            trans_b: tb,
            tile: (128, 128, 64),
            ..base
        });
    }
    v.push(Shape {
        m: 70,
        n: 130,
        k: 7,
        bias: true,
        act: Act::Silu,
        dtype: F16,
        tile: (64, 128, 64),
        ..base
    });
    v.push(Shape {
        m: 127,
        n: 257,
        k: 100,
        tile: (128, 256, 64),
        ..base
    });
    // 64-byte rows (BK 32): the 64-byte swizzle, K-major and M-major A.
    for ta in [false, true] {
        v.push(Shape {
            m: 129,
            n: 100,
            k: 97,
            trans_a: ta,
            tile: (128, 128, 32),
            ..base
        });
    }
    // The pre-activation beside the activated result (a linear layer's forward that
    // saves z for its backward): y = x @ w.T, each activation, both dtypes, edges.
    for (act, dtype, bias) in [
        (Act::Relu, BF16, true),
        (Act::GeluTanh, F16, true),
        (Act::Silu, BF16, false),
    ] {
        v.push(Shape {
            m: 70,
            n: 136,
            k: 40,
            trans_b: true,
            bias,
            act,
            preact: true,
            dtype,
            ..base
        });
    }
    v.push(Shape {
        m: 130,
        n: 72,
        k: 100,
        trans_b: true,
        bias: true,
        act: Act::GeluTanh,
        preact: true,
        tile: (128, 128, 64),
        ..base
    });
    // Persistent: blocks walking several tiles (an uneven share each), the tuner's
    // persistent tiles, short and ragged K, a bias with an activation, edges.
    for (m, n, k, tile, bias, tb, blocks) in [
        (300, 520, 260, (128, 128, 64), true, false, 4),
        (257, 600, 200, (128, 256, 64), false, true, 3),
        (129, 130, 40, (128, 128, 64), false, false, 2),
        (1000, 72, 100, (64, 64, 32), true, true, 5),
    ] {
        v.push(Shape {
            m,
            n,
            k,
            trans_b: tb,
            bias,
            act: if bias { Act::GeluTanh } else { Act::None },
            tile,
            persistent: Some(blocks),
            ..base
        });
    }
    // Clusters of two blocks sharing b's tile (the tuner's 128 x 256 and 128 x 128
    // tiles): an odd number of tile rows (the last cluster's second tile past M), one
    // tile row, K of one partial step, ragged N, a bias with an activation; the pairs
    // alone (rows not 16-byte aligned: `cp.async`), with multicast, and with multicast and
    // a producer warpgroup (rows 16-byte aligned, so that the fetches are TMA copies,
    // which multicast needs; a test below checks that they multicast).
    let mc = CaseOptions {
        multicast: true,
        ..CaseOptions::default()
    };
    let mc_ws = CaseOptions { ws: true, ..mc };
    for (m, n, k, tile, bias, options) in [
        (300, 520, 260, (128, 256, 64), false, CaseOptions::default()),
        (129, 136, 72, (128, 128, 64), true, mc),
        (100, 304, 8, (128, 128, 64), false, mc),
        (520, 264, 1000, (128, 256, 64), true, mc_ws),
    ] {
        v.push(Shape {
            m,
            n,
            k,
            bias,
            act: if bias { Act::Silu } else { Act::None },
            tile,
            cluster: true,
            options,
            ..base
        });
    }
    // Persistent pairs: each pair walks pairs of tiles `blocks / 2` apart, its b fetches
    // multicast across rounds (the ring kept from tile to tile), uneven shares, odd tile
    // rows.
    for (m, n, k, tile, bias, blocks, options) in [
        (1300, 1032, 72, (128, 256, 64), false, 8, mc),
        (1000, 600, 304, (128, 256, 64), false, 6, mc_ws),
        (129, 392, 200, (128, 128, 64), true, 2, mc),
    ] {
        v.push(Shape {
            m,
            n,
            k,
            bias,
            act: if bias { Act::GeluTanh } else { Act::None },
            tile,
            persistent: Some(blocks),
            cluster: true,
            options,
            ..base
        });
    }
    if sizes == SizeSet::Full {
        v.push(Shape {
            m: 300,
            n: 520,
            k: 260,
            trans_a: true,
            tile: (128, 256, 32),
            ..base
        });
    }
    v.into_iter().map(|s| case(seed, s)).collect()
}

/// A contiguous `[rows, cols]` operand, or (transposed) one stored `[cols, rows]`: the
/// kernel reads the storage, so the host tensor is the storage.
fn storage(rng: &mut Rng, dtype: DType, rows: usize, cols: usize, transposed: bool) -> HostTensor {
    let shape = if transposed {
        [cols, rows]
    } else {
        [rows, cols]
    };
    random_tensor(rng, dtype, &shape, |r| r.normalish())
}

/// Element (i, j) of the logical operand from its storage.
fn at(t: &[f64], rows: usize, cols: usize, transposed: bool, i: usize, j: usize) -> f64 {
    if transposed {
        t[j * rows + i]
    } else {
        t[i * cols + j]
    }
}

/// The f64 reference of a gemm shape, row-major `[m, n]`.
pub fn reference(s: &Shape, a: &[f64], b: &[f64], bias: &[f64]) -> Vec<f64> {
    preact_reference(s, a, b, bias)
        .into_iter()
        .map(|x| s.act.apply(x))
        .collect()
}

/// The f64 pre-activation `a @ b + bias` of a gemm shape, row-major `[m, n]`.
pub fn preact_reference(s: &Shape, a: &[f64], b: &[f64], bias: &[f64]) -> Vec<f64> {
    let mut c = vec![0.0; s.m * s.n];
    for i in 0..s.m {
        for p in 0..s.k {
            let av = at(a, s.m, s.k, s.trans_a, i, p);
            for j in 0..s.n {
                c[i * s.n + j] += av * at(b, s.k, s.n, s.trans_b, p, j);
            }
        }
    }
    if s.bias {
        for row in c.chunks_mut(s.n.max(1)) {
            for (x, b) in row.iter_mut().zip(bias) {
                *x += b;
            }
        }
    }
    c
}

/// One `gemm` case.
pub fn case(seed: u64, s: Shape) -> Case {
    let label = format!(
        "gemm T={} [{}x{}]{} @ [{}x{}]{}{}{}{} tile {:?}",
        s.dtype,
        s.m,
        s.k,
        if s.trans_a { ".T" } else { "" },
        s.k,
        s.n,
        if s.trans_b { ".T" } else { "" },
        if s.bias { " +bias" } else { "" },
        match s.act {
            Act::None => "",
            Act::Relu => " relu",
            Act::GeluTanh => " gelu",
            Act::Silu => " silu",
        },
        if s.preact { " +preact" } else { "" },
        s.tile
    ) + &s
        .persistent
        .map(|g| format!(" persistent on {g} blocks"))
        .unwrap_or_default()
        + if s.cluster { " cluster2" } else { "" }
        + if s.options.multicast {
            " multicast"
        } else {
            ""
        }
        + if s.options.ws { " ws" } else { "" };
    let mut rng = Rng::for_case(seed, &label);
    let a = storage(&mut rng, s.dtype, s.m, s.k, s.trans_a);
    let b = storage(&mut rng, s.dtype, s.k, s.n, s.trans_b);
    let bias = random_tensor(&mut rng, s.dtype, &[s.n.max(1)], |r| r.normalish());
    let c = poisoned(s.dtype, &[s.m, s.n]);
    // Without PREACT z is not touched: a 1 x 1 input.
    let z = if s.preact {
        poisoned(s.dtype, &[s.m, s.n])
    } else {
        random_tensor(&mut rng, s.dtype, &[1, 1], |r| r.normalish())
    };
    let args = vec![
        ArgValue::Tensor(a),
        ArgValue::Tensor(b),
        ArgValue::Tensor(bias),
        ArgValue::Tensor(c),
        ArgValue::Tensor(z),
    ];
    let (bm, bn, bk) = s.tile;
    Case {
        options: s.options,
        kernel: "gemm",
        kernel_name: None,
        label,
        defines: defines(&[
            ("T", s.dtype.to_string()),
            ("BM", bm.to_string()),
            ("BN", bn.to_string()),
            ("BK", bk.to_string()),
            ("TRANS_A", s.trans_a.to_string()),
            ("TRANS_B", s.trans_b.to_string()),
            ("BIAS", s.bias.to_string()),
            ("ACT", (s.act as i32).to_string()),
            ("PREACT", s.preact.to_string()),
            ("PERSISTENT", s.persistent.is_some().to_string()),
            ("CLUSTER", if s.cluster { "2" } else { "1" }.to_string()),
        ]),
        tensor_align: aligns(PARAMS, &args),
        grid: [
            match (s.persistent, s.cluster) {
                (Some(g), _) => g,
                (None, true) => (2 * cdiv(cdiv(s.m, bm), 2) * cdiv(s.n, bn)).max(2),
                (None, false) => (cdiv(s.m, bm) * cdiv(s.n, bn)).max(1),
            } as u32,
            1,
            1,
        ],
        args,
        outputs: if s.preact { vec![3, 4] } else { vec![3] },
        reference: Box::new(move |args| {
            let a = tensor_at(args, 0).to_f64_vec();
            let b = tensor_at(args, 1).to_f64_vec();
            let bias = tensor_at(args, 2).to_f64_vec();
            let mut out = vec![reference(&s, &a, &b, &bias)];
            if s.preact {
                out.push(preact_reference(&s, &a, &b, &bias));
            }
            out
        }),
        // Products of two 16-bit values are exact in f32; the f32 sums of k of them,
        // in another order than the reference's, differ by a few ulp of sum |a*b|
        // (about sqrt(k) here), then the result is rounded once to T; GELU's
        // `tanh.approx` adds ~2^-11 of |x|.
        tolerance: Tolerance::for_dtype(
            s.dtype,
            Tolerance {
                rel: if s.act == Act::GeluTanh { 1e-3 } else { 1e-5 },
                abs: 4e-7 * (s.k as f64).max(1.0),
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_core::{compile, Arch};

    /// The multicast cases reach the multicast copies (TMA fetches of 16-byte aligned
    /// rows, alike in both blocks of a pair), with a producer warpgroup where they ask
    /// for one: otherwise they would only test the plain pairs.
    #[test]
    fn multicast_cases_compile_to_multicast_copies() {
        let cases: Vec<Case> = cases(1, SizeSet::Quick)
            .into_iter()
            .filter(|c| c.options.multicast)
            .collect();
        assert!(cases.len() >= 5, "{} multicast cases", cases.len());
        for c in &cases {
            let src = c.source();
            let k = compile(&src, &c.compile_options(Arch::Sm90a))
                .unwrap_or_else(|d| panic!("{}: {}", c.label, d.render(&src)));
            assert!(
                k.ptx.contains(".multicast::cluster"),
                "{}: no multicast copy",
                c.label
            );
            assert_eq!(k.launch.cluster_size, 2, "{}", c.label);
            assert_eq!(
                k.ptx.contains("setmaxnreg"),
                c.options.ws,
                "{}: producer warpgroup",
                c.label
            );
        }
    }
}
