// Rust has no power operator: `a ** b` is `a * (*b)` to Rust, refused with a pointer to
// `pow` (the `.kg` `**` has no Rust spelling).
#[kgen::kernel]
fn k(x: Tensor<f32, 1>) {
    let v = load(x, [bid(0)], [64]);
    store(x, [bid(0)], v ** 2.0);
}

fn main() {}
