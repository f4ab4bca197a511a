// Several unsupported constructs, all reported at once.
#[kgen::kernel]
fn k(x: Tensor<f32, 1>) {
    let f = |v: f32| v * 2.0;
    let m = match 1 { _ => 2 };
    let a = x[0];
    let b = 1.0f32;
    loop {}
}

fn main() {}
