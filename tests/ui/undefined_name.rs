// An unknown variable; the fallback module keeps `launch` so `main` has no extra errors.
#[kgen::kernel]
fn k(x: Tensor<f32, 1>, y: Tensor<f32, 1>) {
    let i = bid(0);
    store(y, [i], load(x, [i], [64]) + zz);
}

fn main() {
    let _ = k::NAME;
    let _ = k::launch;
}
