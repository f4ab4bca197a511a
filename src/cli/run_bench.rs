//! `kgen run --bench N`: times one kernel on the GPU the way `kgen bench` times the op
//! library (and triton's do_bench times a Triton kernel): warm-up launches, then N
//! launches each after a 256 MB write that empties the L2, CUDA events around each, the
//! median and the 20th / 80th percentiles, and GB/s over the bytes of the tensors the
//! kernel reads and writes (each counted once per launch); then a device-to-device copy
//! of the same bytes, timed the same way in the same run, as the bandwidth peer.
//!
//! Assumes: the caller compiled the kernel (`opts`) and built its random inputs (`args`,
//! outputs poisoned). Guarantees: nothing is compared (the interpreter is not run: the
//! point is large shapes); every failure is a message, never a panic.

use super::common::{say, CliError, CliResult};
use kgen::bench::measure::Timer;
use kgen::core::abi::SourceParam;
use kgen::core::host::ArgValue;
use kgen::core::types::DType;
use kgen::core::{CompileOptions, SourceFile};
use kgen::ops::Ops;
use kgen::runtime::{Arg, Device};

/// Warm-up launches before the timed ones.
const WARMUP: usize = 10;
/// Bytes written before each timed launch to empty the L2 (triton's do_bench: 256 MB).
const FLUSH_BYTES: usize = 256 << 20;

pub(super) fn time_kernel(
    file: &SourceFile,
    opts: &CompileOptions,
    args: &[ArgValue],
    grid: [u32; 3],
    runs: u64,
) -> CliResult {
    let msg = |e: &dyn std::fmt::Display| CliError::Msg(format!("--bench: {e}"));
    let device = Device::cuda_as(0, opts.arch).map_err(|e| msg(&e))?;
    let ops = Ops::new(&device);
    let kernel = device.kernel(file, opts).map_err(|e| msg(&e))?;
    let tensors = args
        .iter()
        .map(|a| match a {
            ArgValue::Tensor(h) => device.from_host(h).map(Some),
            ArgValue::Scalar(_) => Ok(None),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| msg(&e))?;
    let launch_args = args
        .iter()
        .zip(&tensors)
        .map(|(a, t)| match (a, t) {
            (_, Some(t)) => Ok(Arg::from(t)),
            (ArgValue::Scalar(s), None) => Ok(Arg::Scalar(*s)),
            (ArgValue::Tensor(_), None) => Err(msg(&"a tensor was not uploaded")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Bytes per launch: each tensor read and/or written once.
    let bytes: usize = kernel
        .compiled()
        .abi
        .source_params
        .iter()
        .zip(&tensors)
        .map(|(p, t)| match (p, t) {
            (&SourceParam::Tensor { read, written, .. }, Some(t)) => {
                (read as usize + written as usize) * t.numel() * t.dtype().size_bytes() as usize
            }
            _ => 0,
        })
        .sum();
    let timer = Timer::new(&ops, runs as usize, WARMUP, FLUSH_BYTES).map_err(|e| msg(&e))?;
    let m = timer
        .time(&mut || Ok(device.launch(ops.stream(), &kernel, grid, &launch_args)?))
        .map_err(|e| msg(&e))?;
    let regs = match kernel.resources() {
        Some((r, 0)) => format!(" ({r} registers/thread)"),
        Some((r, l)) => {
            format!(" ({r} registers/thread, {l} bytes/thread of local memory: spills)")
        }
        None => String::new(),
    };
    say(format_args!(
        "GPU {}{regs}: median {:.2} us [p20 {:.2} .. p80 {:.2}] over {} launches, {:.0} GB/s over {} \
         bytes (tensors read + written); host {:.2} us per launch",
        device.describe(),
        m.median_us,
        m.p20_us,
        m.p80_us,
        m.runs,
        bytes as f64 / (m.median_us * 1e3),
        bytes,
        m.host_us
    ));
    // The peer in the same run: a device-to-device copy moving the same bytes (half
    // read, half written), timed the same way.
    let half = (bytes / 2).max(2);
    let (src, dst) = (
        ops.empty(DType::U32, &[half.div_ceil(4)])
            .map_err(|e| msg(&e))?,
        ops.empty(DType::U32, &[half.div_ceil(4)])
            .map_err(|e| msg(&e))?,
    );
    src.fill_zero().map_err(|e| msg(&e))?;
    let c = timer
        .time(&mut || Ok(dst.copy_from(&src)?))
        .map_err(|e| msg(&e))?;
    say(format_args!(
        "a device-to-device copy of the same bytes, same run: median {:.2} us ({:.0} GB/s): \
         the kernel takes {:.1}% of its time",
        c.median_us,
        bytes as f64 / (c.median_us * 1e3),
        100.0 * m.median_us / c.median_us
    ));
    say("not checked against the interpreter (run without --bench for that)");
    Ok(())
}
