#[kgen::kernel]
fn k(x: Tensor<f32, 1>, n: i32) {
    let t = load(x, [0], [n]);
    store(x, [0], t);
}

fn main() {}
