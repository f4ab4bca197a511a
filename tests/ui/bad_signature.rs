#[kgen::kernel]
async fn k<'a>(x: Tensor<f32, 1>) -> i32 {
    store(x, [0], load(x, [0], [64]));
}

fn main() {}
