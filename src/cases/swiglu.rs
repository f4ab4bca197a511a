//! `swiglu.kg`: out = silu(gate) * up, and `swiglu_bwd` (dgate, dup).
//!
//! Each shape runs twice: with separate contiguous tensors, and "fused": gate and up
//! are the two halves of one [rows, 2H] buffer (row stride 2H), and so are dgate and
//! dup. [`HostTensor`] has no storage offset, so the second half is a view whose
//! storage starts H elements into a copy of the buffer (what a device pointer offset by
//! H elements gives the kernel); the two output halves are separate copies of one
//! poisoned buffer, each compared over its own view.

use super::*;

/// (rows, H, dtype, ROWS, BLOCK).
const QUICK: &[(usize, usize, DType, usize, usize)] = &[
    (1, 1, DType::BF16, 1, 1024),
    (7, 7, DType::F32, 1, 1024),
    (7, 7, DType::BF16, 2, 1024),
    (3, 1000, DType::F16, 1, 1024),
    (3, 1000, DType::BF16, 4, 256),
    (5, 4097, DType::F32, 1, 1024),
    (5, 4097, DType::BF16, 2, 1000),
    (4, 768, DType::BF16, 1, 768),
    (2, 4096, DType::F16, 1, 1024),
];

const FULL: &[(usize, usize, DType, usize, usize)] = &[
    (1000, 4097, DType::BF16, 1, 1024),
    (64, 11008, DType::BF16, 1, 1376),
    (33, 11008, DType::BF16, 4, 256),
    (1000, 1000, DType::F32, 4, 512),
    (128, 4096, DType::F16, 2, 2048),
    (1000, 7, DType::BF16, 8, 32),
];

pub(crate) fn cases(seed: u64, sizes: SizeSet) -> Vec<Case> {
    let mut v = Vec::new();
    let shapes = QUICK
        .iter()
        .chain(if sizes == SizeSet::Full { FULL } else { &[] });
    for &(r, h, dt, rows, b) in shapes {
        for fused in [false, true] {
            v.push(forward_case(seed, dt, r, h, rows, b, fused));
            v.push(backward_case(seed, dt, r, h, rows, b, fused));
        }
    }
    v
}

/// The two [rows, h] halves of a contiguous [rows, 2h] tensor, as strided views: the
/// first over the whole storage, the second over the storage from element h on.
pub fn half_views(t: &HostTensor, h: usize) -> (HostTensor, HostTensor) {
    assert_eq!(t.shape.len(), 2);
    assert_eq!(t.shape[1], 2 * h);
    let rows = t.shape[0];
    let elem = t.dtype.size_bytes() as usize;
    let view = |data: Vec<u8>| HostTensor {
        dtype: t.dtype,
        shape: vec![rows, h],
        strides: vec![2 * h, 1],
        data,
    };
    (view(t.data.clone()), view(t.data[h * elem..].to_vec()))
}

/// Input pairs: separate tensors, or the halves of one [rows, 2h] tensor.
fn pair(
    rng: &mut Rng,
    dtype: DType,
    rows: usize,
    h: usize,
    fused: bool,
    f: impl FnMut(&mut Rng) -> f64 + Copy,
) -> (HostTensor, HostTensor) {
    if fused {
        half_views(&random_tensor(rng, dtype, &[rows, 2 * h], f), h)
    } else {
        (
            random_tensor(rng, dtype, &[rows, h], f),
            random_tensor(rng, dtype, &[rows, h], f),
        )
    }
}

fn outputs_pair(dtype: DType, rows: usize, h: usize, fused: bool) -> (HostTensor, HostTensor) {
    if fused {
        half_views(&poisoned(dtype, &[rows, 2 * h]), h)
    } else {
        (poisoned(dtype, &[rows, h]), poisoned(dtype, &[rows, h]))
    }
}

fn grid(rows: usize, h: usize, rows_per_tile: usize, block: usize) -> [u32; 3] {
    [(cdiv(rows, rows_per_tile) * cdiv(h, block)) as u32, 1, 1]
}

fn tolerance(dtype: DType) -> Tolerance {
    // f32: sigmoid is ex2.approx-based on the GPU (a few ulp); dgate's factor
    // 1 + g * (1 - s) cancels near g = -1.28, covered by the absolute floor.
    Tolerance::for_dtype(
        dtype,
        Tolerance {
            rel: 1e-5,
            abs: 1e-6,
        },
    )
}

fn sigmoid(g: f64) -> f64 {
    1.0 / (1.0 + (-g).exp())
}

/// silu(gate) * up in f64.
pub fn forward_reference(gate: &[f64], up: &[f64]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| g * sigmoid(*g) * u)
        .collect()
}

/// (dgate, dup) in f64.
pub fn backward_reference(gate: &[f64], up: &[f64], dout: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut dgate = Vec::with_capacity(gate.len());
    let mut dup = Vec::with_capacity(gate.len());
    for ((g, u), d) in gate.iter().zip(up).zip(dout) {
        let s = sigmoid(*g);
        dgate.push(d * u * s * (1.0 + g * (1.0 - s)));
        dup.push(d * g * s);
    }
    (dgate, dup)
}

fn label(
    name: &str,
    dtype: DType,
    rows: usize,
    h: usize,
    rows_per_tile: usize,
    block: usize,
    fused: bool,
) -> String {
    let layout = if fused { " fused" } else { "" };
    format!("{name} T={dtype} ROWS={rows_per_tile} BLOCK={block} rows={rows} H={h}{layout}")
}

/// One `swiglu` case.
pub fn forward_case(
    seed: u64,
    dtype: DType,
    rows: usize,
    h: usize,
    rows_per_tile: usize,
    block: usize,
    fused: bool,
) -> Case {
    let label = label("swiglu", dtype, rows, h, rows_per_tile, block, fused);
    let mut rng = Rng::for_case(seed, &label);
    // Gates of a realistic spread (about ±7): both tails of the sigmoid.
    let (gate, up) = pair(&mut rng, dtype, rows, h, fused, |r| 2.0 * r.normalish());
    let args = vec![
        ArgValue::Tensor(gate),
        ArgValue::Tensor(up),
        ArgValue::Tensor(poisoned(dtype, &[rows, h])),
    ];
    Case {
        options: Default::default(),
        kernel: "swiglu",
        kernel_name: Some("swiglu"),
        label,
        defines: defines(&[
            ("T", dtype.to_string()),
            ("ROWS", rows_per_tile.to_string()),
            ("BLOCK", block.to_string()),
        ]),
        tensor_align: aligns(&["gate", "up", "out"], &args),
        grid: grid(rows, h, rows_per_tile, block),
        args,
        outputs: vec![2],
        reference: Box::new(|args| {
            let gate = tensor_at(args, 0).to_f64_vec();
            let up = tensor_at(args, 1).to_f64_vec();
            vec![forward_reference(&gate, &up)]
        }),
        tolerance: tolerance(dtype),
    }
}

/// One `swiglu_bwd` case.
pub fn backward_case(
    seed: u64,
    dtype: DType,
    rows: usize,
    h: usize,
    rows_per_tile: usize,
    block: usize,
    fused: bool,
) -> Case {
    let label = label("swiglu_bwd", dtype, rows, h, rows_per_tile, block, fused);
    let mut rng = Rng::for_case(seed, &label);
    let (gate, up) = pair(&mut rng, dtype, rows, h, fused, |r| 2.0 * r.normalish());
    let dout = random_tensor(&mut rng, dtype, &[rows, h], |r| r.normalish());
    let (dgate, dup) = outputs_pair(dtype, rows, h, fused);
    let args = vec![
        ArgValue::Tensor(gate),
        ArgValue::Tensor(up),
        ArgValue::Tensor(dout),
        ArgValue::Tensor(dgate),
        ArgValue::Tensor(dup),
    ];
    Case {
        options: Default::default(),
        kernel: "swiglu",
        kernel_name: Some("swiglu_bwd"),
        label,
        defines: defines(&[
            ("T", dtype.to_string()),
            ("ROWS", rows_per_tile.to_string()),
            ("BLOCK", block.to_string()),
        ]),
        tensor_align: aligns(&["gate", "up", "dout", "dgate", "dup"], &args),
        grid: grid(rows, h, rows_per_tile, block),
        args,
        outputs: vec![3, 4],
        reference: Box::new(|args| {
            let gate = tensor_at(args, 0).to_f64_vec();
            let up = tensor_at(args, 1).to_f64_vec();
            let dout = tensor_at(args, 2).to_f64_vec();
            let (dg, du) = backward_reference(&gate, &up, &dout);
            vec![dg, du]
        }),
        tolerance: tolerance(dtype),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kgen_core::{compile_to_ir, interp, Arch};

    /// The views see the right elements of the buffer they come from.
    #[test]
    fn half_views_select_the_halves() {
        let (rows, h) = (3usize, 5usize);
        let vals: Vec<f64> = (0..rows * 2 * h).map(|i| i as f64).collect();
        let t = HostTensor::from_f64(DType::F32, &[rows, 2 * h], &vals);
        let (a, b) = half_views(&t, h);
        for r in 0..rows {
            for c in 0..h {
                assert_eq!(a.get_linear(r * h + c), (r * 2 * h + c) as f64);
                assert_eq!(b.get_linear(r * h + c), (r * 2 * h + h + c) as f64);
            }
        }
    }

    /// A fused backward run writes only its views: every storage element outside the
    /// view of dgate / dup keeps the poison (NaN), every one inside is finite.
    #[test]
    fn fused_outputs_write_only_their_views() {
        let (rows, h) = (7usize, 7usize);
        let case = backward_case(3, DType::BF16, rows, h, 2, 1024, true);
        let src = case.source();
        let (func, _) = compile_to_ir(&src, &case.compile_options(Arch::Sm80))
            .unwrap_or_else(|d| panic!("{}", d.render(&src)));
        let mut args = case.args.clone();
        interp::run(&func, case.grid, &mut args).expect("interpreter run");
        for &i in &case.outputs {
            let t = tensor_at(&args, i);
            let mut inside = vec![false; t.storage_len()];
            for r in 0..rows {
                for c in 0..h {
                    inside[t.offset_of(&[r, c])] = true;
                }
            }
            for (off, &ins) in inside.iter().enumerate() {
                let v = t.read_f64(off);
                assert_eq!(v.is_finite(), ins, "arg{i} storage element {off}: {v}");
            }
        }
        assert!(compare(&args, &case).passed());
    }
}
