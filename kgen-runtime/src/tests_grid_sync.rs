//! Tests of cooperative launches (kernels that call `grid_sync`): the launch hint the
//! compiler sets, the barrier ordering one block's writes before another block's reads
//! (on the interpreter and on a GPU, eagerly and replayed from a CUDA graph), and a grid
//! larger than the device holds at once refused with a typed error before launch (never
//! a hang). GPU tests print that they skipped and pass when there is no usable GPU.

use crate::*;
use kgen_core::types::DType;
use kgen_core::{Arch, CompileOptions, SourceFile};
use std::sync::Arc;

/// `gs`: each block adds 1 to its element of `x`, meets the others at `grid_sync`, then
/// copies its right neighbour's element (wrapping around) into `y`. Without the barrier
/// the neighbour's element may still be the old one.
const SRC: &str = "
kernel gs(x: tensor<f32, 1>, y: tensor<f32, 1>, counter: tensor<i32, 1>) {
    let i = bid(0);
    store(x, [i], load(x, [i], [1]) + 1.0);
    grid_sync(counter);
    let j = (i + 1) % num_bids(0);
    store(y, [i], load(x, [j], [1]));
}
kernel plain(x: tensor<f32, 1>, y: tensor<f32, 1>) {
    let i = bid(0);
    store(y, [i], load(x, [i], [1]));
}
";

fn file() -> SourceFile {
    SourceFile::new("grid_sync.kg", SRC)
}

fn gs_kernel(d: &Device) -> Arc<Kernel> {
    d.kernel(&file(), &CompileOptions::new(d.arch()).kernel("gs"))
        .unwrap()
}

/// The tensors of one `gs` launch over `blocks` blocks: x (distinct values), y (NaN),
/// and a zeroed counter.
fn gs_tensors(d: &Device, blocks: usize) -> (Tensor, Tensor, Tensor) {
    let x0: Vec<f64> = (0..blocks).map(|i| (i * 3) as f64 + 0.5).collect();
    let x = d.from_f64(DType::F32, &[blocks], &x0).unwrap();
    let y = d
        .from_f64(DType::F32, &[blocks], &vec![f64::NAN; blocks])
        .unwrap();
    let counter = d.zeros(DType::I32, &[1]).unwrap();
    (x, y, counter)
}

fn gs_args<'a>(x: &'a Tensor, y: &'a Tensor, counter: &'a Tensor) -> [Arg<'a>; 3] {
    [x.into(), y.into(), counter.into()]
}

/// Checks `y[i] == x_initial[(i + 1) % blocks] + 1` and `x[i] == x_initial[i] + 1`.
fn check_gs(x: &Tensor, y: &Tensor, blocks: usize, what: &str) {
    let x0 = |i: usize| (i * 3) as f64 + 0.5;
    let xs = x.to_f64_vec().unwrap();
    let ys = y.to_f64_vec().unwrap();
    for i in 0..blocks {
        assert_eq!(xs[i], x0(i) + 1.0, "{what}: x[{i}]");
        assert_eq!(ys[i], x0((i + 1) % blocks) + 1.0, "{what}: y[{i}]");
    }
}

#[test]
fn grid_sync_sets_the_cooperative_launch_hint() {
    for arch in [Arch::Sm80, Arch::Sm90a] {
        let c = |k: &str| kgen_core::compile(&file(), &CompileOptions::new(arch).kernel(k));
        let gs = c("gs").unwrap_or_else(|e| panic!("{}", e.render(&file())));
        assert!(gs.launch.cooperative, "{arch}: gs calls grid_sync");
        let plain = c("plain").unwrap_or_else(|e| panic!("{}", e.render(&file())));
        assert!(!plain.launch.cooperative, "{arch}: plain does not");
    }
}

#[test]
fn cooperative_grid_error_text() {
    use crate::launch::{check_cooperative_grid, CoResident};
    let gpu = CoResident::Gpu {
        per_sm: 8,
        sms: 132,
    };
    assert!(check_cooperative_grid("gs", [33, 32, 1], gpu).is_ok());
    assert!(check_cooperative_grid("gs", [0, 1, 1], gpu).is_ok());
    let e = check_cooperative_grid("gs", [33, 33, 1], gpu).unwrap_err();
    assert!(matches!(e, RuntimeError::LaunchConfig(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "bad launch configuration: kernel `gs` calls grid_sync: its 1089 blocks must all \
         be resident at once, and this GPU holds at most 1056 (8 per multiprocessor × 132 \
         multiprocessors); launch at most 1056 blocks (Device::max_cooperative_blocks)"
    );
}

#[test]
fn interpreter_grid_sync_orders_writes_across_blocks() {
    let d = Device::interpreter();
    let k = gs_kernel(&d);
    assert_eq!(
        d.max_cooperative_blocks(&k).unwrap(),
        kgen_core::interp::MAX_GRID_SYNC_BLOCKS
    );
    let blocks = 7;
    let (x, y, counter) = gs_tensors(&d, blocks);
    d.launch(
        &d.stream(),
        &k,
        [blocks as u32, 1, 1],
        &gs_args(&x, &y, &counter),
    )
    .unwrap();
    check_gs(&x, &y, blocks, "interpreter, 7 blocks");
}

#[test]
fn interpreter_refuses_a_cooperative_grid_larger_than_it_runs() {
    let d = Device::interpreter();
    let k = gs_kernel(&d);
    let blocks = kgen_core::interp::MAX_GRID_SYNC_BLOCKS as usize + 1;
    let (x, y, counter) = gs_tensors(&d, blocks);
    let e = d
        .launch(
            &d.stream(),
            &k,
            [blocks as u32, 1, 1],
            &gs_args(&x, &y, &counter),
        )
        .unwrap_err();
    assert!(matches!(e, RuntimeError::LaunchConfig(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "bad launch configuration: kernel `{}` calls grid_sync: its 1025 blocks must all \
             be resident at once, and the interpreter runs at most 1024 (one thread per \
             block); launch at most 1024 blocks (Device::max_cooperative_blocks)",
            k.entry()
        )
    );
    // Nothing ran: y still holds its NaNs.
    assert!(y.to_f64_vec().unwrap().iter().all(|v| v.is_nan()));
}

fn gpu_or_skip(test: &str) -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("{test}: skipped, no usable GPU ({e})");
            None
        }
    }
}

/// On a GPU: 7 blocks, then the largest grid the device holds at once (a persistent
/// grid), eagerly, through a packed launch, and replayed from a CUDA graph.
#[test]
fn gpu_grid_sync_orders_writes_across_blocks() {
    let Some(d) = gpu_or_skip("gpu_grid_sync_orders_writes_across_blocks") else {
        return;
    };
    let k = gs_kernel(&d);
    let s = d.stream();
    let max = d.max_cooperative_blocks(&k).unwrap() as usize;
    assert!(max >= d.gpu().unwrap().info().sm_count as usize, "{max}");
    for blocks in [7, max] {
        let (x, y, counter) = gs_tensors(&d, blocks);
        d.launch(&s, &k, [blocks as u32, 1, 1], &gs_args(&x, &y, &counter))
            .unwrap();
        check_gs(&x, &y, blocks, &format!("GPU, {blocks} blocks"));

        let (x, y, counter) = gs_tensors(&d, blocks);
        let args = gs_args(&x, &y, &counter);
        let mut p = PackedLaunch::new(&d, &s, &k, [blocks as u32, 1, 1], &args).unwrap();
        // SAFETY: the tensors and the stream outlive the launch (synchronized below).
        unsafe { p.launch() }.unwrap();
        s.synchronize().unwrap();
        check_gs(&x, &y, blocks, &format!("GPU packed, {blocks} blocks"));
    }

    // Captured into a graph: the cooperative attribute is kept by the replay.
    let blocks = 7;
    let (x, y, counter) = gs_tensors(&d, blocks);
    let cs = d.new_stream().unwrap();
    cs.wait_for(&s).unwrap();
    cs.begin_capture().unwrap();
    d.launch(&cs, &k, [blocks as u32, 1, 1], &gs_args(&x, &y, &counter))
        .unwrap();
    let g = cs.end_capture().unwrap();
    assert_eq!(g.launches(), 1);
    g.launch().unwrap();
    cs.synchronize().unwrap();
    check_gs(&x, &y, blocks, "GPU graph replay, 7 blocks");
}

/// A grid one block larger than `max_cooperative_blocks` is refused before launch by the
/// checked and the packed launch, and the device still works afterwards.
#[test]
fn gpu_cooperative_grid_larger_than_the_gpu_holds_is_refused() {
    let Some(d) = gpu_or_skip("gpu_cooperative_grid_larger_than_the_gpu_holds_is_refused") else {
        return;
    };
    let k = gs_kernel(&d);
    let s = d.stream();
    let max = d.max_cooperative_blocks(&k).unwrap() as usize;
    let blocks = max + 1;
    let (x, y, counter) = gs_tensors(&d, blocks);
    let args = gs_args(&x, &y, &counter);
    let grid = [blocks as u32, 1, 1];
    let e = d.launch(&s, &k, grid, &args).unwrap_err();
    assert!(matches!(e, RuntimeError::LaunchConfig(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("its {blocks} blocks must all be resident at once"))
            && text.contains(&format!("this GPU holds at most {max} ("))
            && text.contains("Device::max_cooperative_blocks"),
        "{text}"
    );
    let r = PackedLaunch::new(&d, &s, &k, grid, &args);
    assert!(
        matches!(r, Err(RuntimeError::LaunchConfig(_))),
        "{:?}",
        r.err()
    );
    s.synchronize().unwrap();
    assert!(y.to_f64_vec().unwrap().iter().all(|v| v.is_nan()));
    let (x, y, counter) = gs_tensors(&d, 7);
    d.launch(&s, &k, [7, 1, 1], &gs_args(&x, &y, &counter))
        .unwrap();
    check_gs(&x, &y, 7, "GPU after a refused launch");
}
