// A helper function called with the wrong number of arguments: the checker's error
// reaches the user's tokens.
#[kgen::kernel]
fn k(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    fn scaled(t: _, s: _) -> _ {
        t * s
    }
    let v = load(x, [bid(0)], [64]);
    store(y, [bid(0)], scaled(v));
}

fn main() {}
