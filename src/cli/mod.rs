//! The `kgen` command line (clap derive). Every user mistake becomes a message on stderr
//! and a non-zero exit status; a panic inside the compiler is caught and reported as an
//! internal error, without a backtrace.

mod bench;
mod cache;
mod common;
mod compile;
mod npy;
mod run;
mod run_bench;
mod selftest;
mod selftest_ops;
mod train;

use clap::{Args, Parser, Subcommand, ValueEnum};
use common::CliError;
use kgen::core::Arch;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "kgen",
    version,
    about = "kgen: a tile-kernel compiler (tile language .kg -> PTX for sm_80 and sm_90a)",
    after_help = "Examples:\n  \
        kgen compile kernels-src/rmsnorm.kg --arch sm_90a -D T=f16 -D BLOCK=2048\n  \
        kgen compile kernels-src/rmsnorm.kg --emit ir\n  \
        kgen compile kernels-src/softmax.kg --emit abi     (the launch ABI, JSON)\n  \
        kgen check my_kernel.kg\n  \
        kgen run kernels-src/softmax.kg --grid 1000 --arg x=1000x4097 --arg y=1000x4097\n  \
        kgen run k.kg --grid 8 --input x=x.npy --arg y=1000 --save-outputs out/\n  \
        kgen selftest [--gpu] [--full] [--filter softmax]\n  \
        kgen train [--steps N] [--no-gpu] [--data PATH]     (also what `kgen` alone runs)\n  \
        kgen train --mlp [--muon]     (the earlier MLP demo)\n  \
        kgen bench [--filter rmsnorm] [--peers peers.json]\n  \
        kgen cache [info|prune|clear]"
)]
struct Cli {
    /// Without a command: `kgen train` (the main job: the GPT).
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compile one kernel to PTX (or to tile IR with --emit ir, or its launch ABI as JSON
    /// with --emit abi); writes stdout unless -o.
    Compile(CompileArgs),
    /// Report diagnostics for every kernel in a file (front end, checker, validation and
    /// the back end's target limits); prints "ok: N kernel(s)" when clean.
    Check(CheckArgs),
    /// Run a kernel on random inputs in the interpreter, and on the GPU when there is one
    /// (comparing the two).
    Run(RunArgs),
    /// Run every bundled kernel's test cases: interpreter vs float64 reference, and on a
    /// GPU also GPU vs interpreter and GPU vs reference.
    Selftest(SelftestArgs),
    /// Time every op workload of shared/ANCHORS.md on the GPU (beside a 1 GiB
    /// device-to-device copy and, with --peers, PyTorch), plus launch cost, first launch
    /// and compile times.
    Bench(bench::BenchArgs),
    /// Train a small GPT on real text (by default the Python standard library's sources)
    /// with kgen ops only, forward and backward, printing the loss, tokens/s, the
    /// validation loss and samples; on the GPU, or the interpreter without one. `--mlp`:
    /// the earlier MLP demo.
    Train(TrainArgs),
    /// Show the on-disk caches (compiled kernels, tuning choices) by compiler build;
    /// `prune` removes what this build cannot use, `clear` everything.
    Cache(cache::CacheArgs),
}

/// What to compile: the specialization options shared by every subcommand.
#[derive(Args, Debug, Clone)]
struct SpecArgs {
    /// A compile-time parameter value (an integer, a float such as 1e-5, true/false or a dtype); repeatable.
    /// Parameters not given take their defaults.
    #[arg(short = 'D', long = "define", value_name = "NAME=VALUE", value_parser = common::parse_define)]
    defines: Vec<(String, String)>,
    /// The kernel to use when the file holds several (default: the first).
    #[arg(long, value_name = "NAME")]
    kernel: Option<String>,
    /// Warps per block (default: chosen by the compiler from the tile sizes).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=32))]
    warps: Option<u32>,
    /// Blocks of this kernel that must fit on one SM at once (PTX `.minnctapersm`; caps
    /// the registers per thread). Default: no bound.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=32))]
    min_blocks_per_sm: Option<u32>,
    /// Software-pipeline depth of the loops that feed a tensor-core `dot` (Triton's
    /// `num_stages`: tiles in flight in shared memory). Default: 3 (4 for a `dot` on
    /// sm_90a's wgmma), fewer where shared memory is short.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    stages: Option<u32>,
    /// On sm_90a, copy the tiles that feed `dot` with `cp.async` instead of the TMA copy
    /// engine (for a launcher that cannot build tensor maps, or to compare the two).
    #[arg(long)]
    no_tma: bool,
    /// On sm_90a, warp-specialize a TMA-fed wgmma kernel: one more warpgroup whose
    /// first thread issues every copy, the kernel's warps only compute (with 8 warps,
    /// `setmaxnreg` gives them 232 registers). The attention op uses it at D = 128; on
    /// the bundled GEMM it measured no faster (docs/PERFORMANCE.md). Where it cannot
    /// apply (sm_80, `--no-tma`, rings of fewer than 3 stages, ...) the kernel is
    /// compiled without it and a note on stderr (and in the PTX header) says why
    #[arg(long)]
    ws: bool,
    /// On sm_90a, in a TMA-fed kernel, write each tile that a tensor's only store writes
    /// (a tensor the kernel never reads) with the TMA copy engine through shared memory
    /// instead of `st.global`. It measured no faster on the bundled GEMM
    /// (docs/PERFORMANCE.md).
    #[arg(long)]
    tma_store: bool,
    /// On sm_90a, in a kernel of clusters of two blocks (`cluster_rank(2)`), copy each
    /// tile fetch that is alike in both blocks (its index computed from `bid(0) / 2`) once
    /// for the pair with TMA multicast. It measured slower on the bundled GEMM
    /// (docs/PERFORMANCE.md)
    #[arg(long)]
    multicast: bool,
    /// On sm_90a, in a warp-specialized kernel (`--ws`) of two consumer warpgroups (8
    /// warps), make them take turns issuing each loop iteration's products
    /// (FlashAttention-3's ping-pong): one warpgroup's softmax then runs beside the other's
    /// products. Applies to loops whose products stand together in the body (the
    /// attention forward's `LAG` loop); elsewhere a note says it was not applied
    #[arg(long)]
    pingpong: bool,
    /// Alignment in bytes (1, 2, 4, 8 or 16) the kernel may assume for a tensor
    /// parameter; default 16. Repeatable.
    #[arg(long = "align", value_name = "TENSOR=BYTES", value_parser = common::parse_align)]
    aligns: Vec<(String, u32)>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// PTX text.
    Ptx,
    /// The optimized tile IR, as text.
    Ir,
    /// The launch ABI as JSON: entry name, the PTX parameters in order and what fills
    /// each, every tensor's dtype, rank, constant extents, contiguity and required
    /// alignment, threads per block, shared memory, cluster size (docs/ARCHITECTURE.md,
    /// "The launch ABI").
    Abi,
}

#[derive(Args, Debug)]
struct CompileArgs {
    /// The .kg source file.
    file: PathBuf,
    /// Target architecture.
    #[arg(long, default_value = "sm_90a", value_parser = common::parse_arch, value_name = "sm_80|sm_90a")]
    arch: Arch,
    #[command(flatten)]
    spec: SpecArgs,
    /// What to write.
    #[arg(long, value_enum, default_value_t = Emit::Ptx)]
    emit: Emit,
    /// Output file (default: stdout).
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// The .kg source file.
    file: PathBuf,
    /// Target architecture whose limits the back end checks.
    #[arg(long, default_value = "sm_90a", value_parser = common::parse_arch, value_name = "sm_80|sm_90a")]
    arch: Arch,
    #[command(flatten)]
    spec: SpecArgs,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The .kg source file.
    file: PathBuf,
    #[command(flatten)]
    spec: SpecArgs,
    /// The grid: blocks along axes 0, 1, 2 (`bid(axis)` ranges over it), e.g. `64` or `8,4`.
    #[arg(long, value_name = "X[,Y,Z]", value_parser = common::parse_grid)]
    grid: Option<[u32; 3]>,
    /// A kernel argument: a tensor shape (`1000x4097`, filled with random data) or a
    /// scalar value (`1e-5`, `42`, `true`; 16-bit floats are rounded to nearest even);
    /// one per parameter (or --input for a tensor).
    #[arg(long = "arg", value_name = "NAME=SPEC", value_parser = common::parse_arg_spec)]
    args: Vec<(String, String)>,
    /// A tensor argument read from a .npy file instead of random data (in place of its
    /// --arg): bool, int32, int64, uint32, float16, float32 or float64, C or Fortran
    /// order, with the parameter's rank and constant extents. Values are converted to
    /// the parameter's dtype: floats and integers to a float dtype rounded once to
    /// nearest even; integers to an integer dtype only when they fit; bool to bool.
    /// Repeatable.
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = common::parse_input)]
    inputs: Vec<(String, PathBuf)>,
    /// Write every tensor the kernel writes to DIR/NAME.npy (DIR is created if needed),
    /// in the tensor's dtype; bf16 is written as float32 (numpy has no bfloat16; the
    /// widening is exact), with a note on stderr. The files hold the GPU's results when
    /// the kernel ran on a GPU, else the interpreter's.
    #[arg(long, value_name = "DIR", conflicts_with = "bench")]
    save_outputs: Option<PathBuf>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Do not use a GPU even when there is one.
    #[arg(long)]
    no_gpu: bool,
    /// Time the kernel on the GPU instead of checking it: the median of N launches
    /// (default 50) after 10 warm-up launches, each after a 256 MB write that empties the
    /// L2, timed with CUDA events (as `kgen bench` and triton's do_bench), with GB/s over
    /// the bytes of the tensors it reads and writes. Skips the interpreter.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "50",
          value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "no_gpu")]
    bench: Option<u64>,
    /// Compile for this target instead of the GPU's own (an H100 runs sm_80 PTX too:
    /// `--arch sm_80` runs the Ampere code path on it).
    #[arg(long, value_parser = common::parse_arch, value_name = "sm_80|sm_90a")]
    arch: Option<kgen::core::Arch>,
}

#[derive(Args, Debug)]
struct SelftestArgs {
    /// Require a GPU: fail when there is none (default: use one when present).
    #[arg(long, conflicts_with = "no_gpu")]
    gpu: bool,
    /// Never use a GPU, even when there is one.
    #[arg(long)]
    no_gpu: bool,
    /// The full size set (awkward sizes 1, 7, 1000, 4097, ...) instead of the quick one.
    #[arg(long)]
    full: bool,
    /// Only cases whose label contains this text (`ops`: only the op library and
    /// `#[kernel]` launcher checks, which otherwise run after the cases when no filter is given;
    /// `ops:ns,optim`: only those groups of op checks: linear, gemm, norm, act, rope, attn,
    /// loss, ns, optim, capture).
    #[arg(long, value_name = "PAT")]
    filter: Option<String>,
    /// Seed of the cases' random inputs.
    #[arg(long, default_value_t = selftest::DEFAULT_SEED)]
    seed: u64,
    /// Compile for this target instead of the GPU's own (an H100 runs sm_80 PTX too:
    /// `--arch sm_80` checks the Ampere code path on it).
    #[arg(long, value_parser = common::parse_arch, value_name = "sm_80|sm_90a")]
    arch: Option<kgen::core::Arch>,
}

#[derive(Args, Debug, Default)]
struct TrainArgs {
    /// Training steps (default: the GPT 1000 on a GPU, 30 on the interpreter; the MLP
    /// 300 / 200).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    steps: Option<u64>,
    /// Use the interpreter even when there is a GPU.
    #[arg(long)]
    no_gpu: bool,
    /// Train the GPT on this text file or folder (default: the Python standard library's
    /// sources on this machine).
    #[arg(long, value_name = "PATH", conflicts_with = "mlp")]
    data: Option<PathBuf>,
    /// Write the initial weights, the first 20 batches, their losses and the measured
    /// tokens/s into DIR (.npy and kgen.json) for bench/gpt_torch.py, the PyTorch twin.
    #[arg(long, value_name = "DIR", conflicts_with = "mlp")]
    dump_batches: Option<PathBuf>,
    /// The GPT's interpreter-sized configuration, also on a GPU.
    #[arg(long, conflicts_with = "mlp")]
    tiny: bool,
    /// AdamW's learning rate (the GPT's embedding and norm weights; default 3e-3, 1e-2
    /// for the interpreter's tiny model).
    #[arg(long, value_name = "LR", conflicts_with = "mlp")]
    lr: Option<f64>,
    /// Muon's learning rate (the GPT's hidden matrices, default 0.02; with --mlp --muon
    /// the MLP's two matrices, default 0.05).
    #[arg(long, value_name = "LR")]
    muon_lr: Option<f64>,
    /// Seed of the initialization, the batches and the sampling.
    #[arg(long, value_name = "N", conflicts_with = "mlp")]
    seed: Option<u64>,
    /// The earlier demo instead of the GPT: a small MLP block (rmsnorm, SwiGLU,
    /// cross-entropy) on synthetic data, AdamW.
    #[arg(long)]
    mlp: bool,
    /// With --mlp: Muon on the two weight matrices and AdamW on the norm weight, in one
    /// step (`kgen::optim::MuonWithAdamW`), instead of AdamW on everything. (The GPT
    /// always trains its hidden matrices with Muon.)
    #[arg(long, requires = "mlp")]
    muon: bool,
}

/// Runs the command line and returns the exit status.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to stderr, 2.
            let _ = e.print();
            return e.exit_code();
        }
    };
    std::panic::set_hook(Box::new(|info| {
        eprintln!("kgen: internal error: {info}");
        eprintln!("kgen: this is a bug in kgen; please report it with the input that caused it");
    }));
    let command = cli.command.unwrap_or(Command::Train(TrainArgs::default()));
    let result = std::panic::catch_unwind(move || match command {
        Command::Compile(a) => compile::compile(a),
        Command::Check(a) => compile::check(a),
        Command::Run(a) => run::run(a),
        Command::Selftest(a) => selftest::selftest(a),
        Command::Bench(a) => bench::bench(a),
        Command::Train(a) => train::run(a),
        Command::Cache(a) => cache::cache(a),
    });
    match result {
        Ok(Ok(())) => 0,
        Ok(Err(CliError::Msg(m))) => {
            eprintln!("error: {m}");
            1
        }
        Ok(Err(CliError::Exit(code))) => code,
        Err(_) => 101,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_command_is_allowed_and_train_takes_its_options() {
        assert!(Cli::try_parse_from(["kgen"]).unwrap().command.is_none());
        let c = Cli::try_parse_from(["kgen", "train", "--steps", "5", "--no-gpu"]).unwrap();
        let Some(Command::Train(a)) = c.command else {
            panic!("not train")
        };
        assert_eq!((a.steps, a.no_gpu), (Some(5), true));
        assert!(Cli::try_parse_from(["kgen", "train", "--steps", "0"]).is_err());
        // The GPT's options, and the MLP demo's behind --mlp.
        let c = Cli::try_parse_from(["kgen", "train", "--data", "x.txt", "--dump-batches", "d"]);
        let Ok(Cli {
            command: Some(Command::Train(a)),
        }) = c
        else {
            panic!("not train")
        };
        assert_eq!(a.data, Some(PathBuf::from("x.txt")));
        assert!(!a.mlp);
        assert!(Cli::try_parse_from(["kgen", "train", "--mlp", "--muon"]).is_ok());
        assert!(Cli::try_parse_from(["kgen", "train", "--muon"]).is_err());
        assert!(Cli::try_parse_from(["kgen", "train", "--mlp", "--data", "x"]).is_err());
    }

    #[test]
    fn cache_defaults_to_info_and_takes_prune_and_clear() {
        let action = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Some(Command::Cache(a))) => Some(a.action),
            _ => None,
        };
        use cache::CacheAction::*;
        assert_eq!(action(&["kgen", "cache"]), Some(Info));
        assert_eq!(action(&["kgen", "cache", "prune"]), Some(Prune));
        assert_eq!(action(&["kgen", "cache", "clear"]), Some(Clear));
        assert_eq!(action(&["kgen", "cache", "purge"]), None);
    }

    #[test]
    fn run_bench_takes_an_optional_count_and_refuses_no_gpu() {
        let parse = |extra: &[&str]| {
            let mut v = vec!["kgen", "run", "k.kg", "--grid", "4"];
            v.extend_from_slice(extra);
            Cli::try_parse_from(v).map(|c| match c.command {
                Some(Command::Run(a)) => a.bench,
                _ => panic!("not run"),
            })
        };
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&["--bench"]).unwrap(), Some(50));
        assert_eq!(parse(&["--bench", "200"]).unwrap(), Some(200));
        assert!(parse(&["--bench", "0"]).is_err());
        assert!(parse(&["--bench", "--no-gpu"]).is_err());
    }

    /// Without a GPU, `--bench` is a message naming why, not a panic or an interpreter
    /// run (skipped on a GPU machine).
    #[test]
    fn run_bench_without_a_gpu_says_why() {
        if kgen::runtime::driver_present() {
            eprintln!("skipped: this machine has a CUDA driver");
            return;
        }
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels-src/vec_add.kg");
        let c = Cli::try_parse_from([
            "kgen", "run", file, "--grid", "1", "--arg", "x=100", "--arg", "y=100", "--arg",
            "out=100", "--bench",
        ])
        .unwrap();
        let Some(Command::Run(a)) = c.command else {
            panic!("not run")
        };
        match run::run(a) {
            Err(CliError::Msg(m)) => {
                assert!(m.starts_with("--bench times the kernel on a GPU"), "{m}")
            }
            other => panic!("expected the no-GPU message, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_documented_command_lines() {
        let c = Cli::try_parse_from([
            "kgen",
            "compile",
            "k.kg",
            "--arch",
            "sm_80",
            "-D",
            "T=f16",
            "-D",
            "BLOCK=2048",
            "--emit",
            "ir",
            "-o",
            "out.txt",
        ])
        .unwrap();
        let Some(Command::Compile(a)) = c.command else {
            panic!()
        };
        assert_eq!(a.arch, Arch::Sm80);
        assert_eq!(
            a.spec.defines,
            vec![("T".into(), "f16".into()), ("BLOCK".into(), "2048".into())]
        );
        assert_eq!(a.emit, Emit::Ir);
        let c = Cli::try_parse_from(["kgen", "compile", "k.kg"]).unwrap();
        let Some(Command::Compile(a)) = c.command else {
            panic!()
        };
        assert_eq!(a.arch, Arch::Sm90a);
        assert_eq!(a.emit, Emit::Ptx);
        let c = Cli::try_parse_from([
            "kgen",
            "run",
            "s.kg",
            "--grid",
            "1000",
            "--arg",
            "x=1000x4097",
            "--arg",
            "y=1000x4097",
        ])
        .unwrap();
        let Some(Command::Run(a)) = c.command else {
            panic!()
        };
        assert_eq!(a.grid, Some([1000, 1, 1]));
        assert_eq!(a.args.len(), 2);
        let c = Cli::try_parse_from([
            "kgen", "selftest", "--gpu", "--full", "--filter", "softmax", "--seed", "3",
        ])
        .unwrap();
        let Some(Command::Selftest(a)) = c.command else {
            panic!()
        };
        assert!(a.gpu && a.full && a.filter.as_deref() == Some("softmax") && a.seed == 3);
        assert!(Cli::try_parse_from(["kgen", "selftest", "--gpu", "--no-gpu"]).is_err());
        assert!(Cli::try_parse_from(["kgen", "compile", "k.kg", "--warps", "0"]).is_err());
        assert!(Cli::try_parse_from(["kgen", "compile", "k.kg", "--emit", "sass"]).is_err());
    }
}
