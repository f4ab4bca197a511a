#[kgen::kernel]
fn k<T: Clone = f32, const N: char = 1.0>(x: Tensor<T, 1>) {
    store(x, [0], load(x, [0], [64]));
}

fn main() {}
