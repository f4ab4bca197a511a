#[kgen::kernel]
fn k(x: Tensor<f32, 1>) {
    let i = bid(0);
    store(x, [i], frobnicate(load(x, [i], [64])));
}

fn main() {}
