// Helper functions inside a kernel: generics are refused (pass compile-time values as
// arguments).
#[kgen::kernel]
fn k(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    fn twice<const N: i32>(t: _) -> _ {
        t * 2.0
    }
    let v = load(x, [bid(0)], [64]);
    store(y, [bid(0)], twice(v));
}

fn main() {}
