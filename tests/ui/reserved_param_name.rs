#[kgen::kernel]
fn k(x: Tensor<f32, 1>, NAME: f32) {
    store(x, [0], load(x, [0], [64]) * NAME);
}

fn main() {}
