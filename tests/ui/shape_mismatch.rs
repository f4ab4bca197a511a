#[kgen::kernel]
fn k(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    let i = bid(0);
    let a = load(x, [i], [64]);
    let b = load(y, [i], [32]);
    store(y, [i], a * b);
}

fn main() {}
