#[kgen::kernel]
fn k(a: Tensor<f32>, b: Vec<f32>, c: Tensor<f32, 2, Strided>, d: &f32) {}

fn main() {}
