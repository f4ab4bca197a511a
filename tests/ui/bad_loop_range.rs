#[kgen::kernel]
fn k(x: Tensor<f32, 1>) {
    for i in 0..=4 {
        store(x, [i], load(x, [i], [64]));
    }
    for j in [1, 2] {
        store(x, [j], load(x, [j], [64]));
    }
}

fn main() {}
