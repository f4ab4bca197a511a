#[kgen::kernel]
fn k<const BLOCK: i32 = 100>(x: Tensor<f32, 1>) {
    static_assert!(BLOCK % 32 == 0, "BLOCK must be a multiple of 32");
    store(x, [0], load(x, [0], [BLOCK]));
}

fn main() {}
