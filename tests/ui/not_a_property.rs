// `.dtype` is the only property; another field is refused at its name.
#[kgen::kernel]
fn k(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    let v = load(x, [bid(0)], [64]);
    store(y, [bid(0)], cast(v, x.dtype) + (x.shape as f32));
}

fn main() {}
