#[kgen::kernel]
fn k(x: Tensor<f32, 1>) {
    let mut i = 0;
    while i < 4 {
        i += 1;
    }
    store(x, [i], load(x, [i], [64]));
}

fn main() {}
