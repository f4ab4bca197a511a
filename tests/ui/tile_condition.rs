#[kgen::kernel]
fn k(x: Tensor<f32, 1>) {
    let t = load(x, [0], [64]);
    if t > 0.0 {
        store(x, [0], t);
    }
}

fn main() {}
