#[kgen::kernel]
fn k(x: Tensor<f32, 1>) {
    let i = bid(0, 1);
    store(x, [i], load(x, [i], [64]));
}

fn main() {}
