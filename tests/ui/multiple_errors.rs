// Independent checker errors come out together.
#[kgen::kernel]
fn k(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    let a = load(x, [0], [64]) + nope;
    let b = sqrt(1, 2, 3);
    store(y, [0], load(y, [0], [64], pad = 0.0, bogus = 1.0));
}

fn main() {}
