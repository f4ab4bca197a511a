#[kgen::kernel]
fn k(x: Tensor<f32, 1>) {
    let acc = load(x, [0], [64]);
    acc += 1.0;
    store(x, [0], acc);
}

fn main() {}
