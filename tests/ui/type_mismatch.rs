#[kgen::kernel]
fn k(x: Tensor<f32, 1>, z: Tensor<i32, 1>, y: Tensor<f32, 1>) {
    let i = bid(0);
    store(y, [i], load(x, [i], [64]) + load(z, [i], [64]));
}

fn main() {}
