// `#[kgen::kernels]`: a generic fn not marked `#[kernel]` (a forgotten marker), an item
// that is neither a kernel nor a helper, and a type error inside the shared helper,
// reached from both kernels but reported once, at the helper's token.
#[kgen::kernels]
mod k {
    fn bad_helper(t: _) -> _ {
        t + true
    }

    pub fn forgot<const N: i32 = 64>(x: Tensor<f32, 1>) {
        store(x, [0], load(x, [0], [N]));
    }

    struct NotAKernel;

    #[kernel]
    pub fn a(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
        store(y, [bid(0)], bad_helper(load(x, [bid(0)], [64])));
    }

    #[kgen::kernel]
    pub fn b(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
        store(y, [bid(0)], bad_helper(load(x, [bid(0)], [32])));
    }
}

fn main() {}
