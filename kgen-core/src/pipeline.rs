//! The compilation pipeline, in one visible sequence:
//! parse → check & lower → optimize → validate → PTX.
//!
//! Assumes: nothing about the input text. Guarantees: either a [`CompiledKernel`] whose
//! PTX passed every layer, or [`Diagnostics`] with located errors. Never panics.

use crate::abi::CompiledKernel;
use crate::diag::Diagnostics;
use crate::span::SourceFile;
use crate::target::Arch;
use crate::{back, check, front, ir, passes, valid};

/// What to compile and how.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    pub arch: Arch,
    /// The kernel to compile when the file has several; `None` takes the first.
    pub kernel: Option<String>,
    /// Compile-time parameter values, `-D NAME=VALUE` (integers, `true`/`false`, dtypes).
    /// Parameters not named here take their defaults.
    pub defines: Vec<(String, String)>,
    /// Warps per block; `None` lets the compiler choose from the tile sizes.
    pub num_warps: Option<u32>,
    /// Blocks that must fit on one SM at once (CUDA's `__launch_bounds__` second
    /// argument, PTX `.minnctapersm`): asks ptxas / the driver's JIT to keep registers
    /// per thread within registers_per_sm / (threads x this), spilling if it must (check
    /// `ptxas -v`). `None`: no bound (the JIT may use up to the single-block budget,
    /// which can halve the blocks per SM a grid-stride launch counts on). The compiler's
    /// own register estimate is still checked against the single-block budget.
    pub min_blocks_per_sm: Option<u32>,
    /// Assumed alignment (bytes) per tensor parameter name; unnamed tensors assume 16.
    pub tensor_align: Vec<(String, u32)>,
    /// Software-pipeline depth of the loops whose loads feed a tensor-core `dot`
    /// (Triton's `num_stages`: that many tiles of each operand in flight in shared
    /// memory); `None` lets the compiler choose (3, fewer where shared memory is short).
    pub num_stages: Option<u32>,
    /// Keep tile fetches on `cp.async` where the target could use TMA (the
    /// specialization's `no_tma`).
    pub no_tma: bool,
    /// Warp-specialize a TMA-fed wgmma kernel (`lower/ws.rs`; the specialization's `ws`).
    pub ws: bool,
    /// TMA stores for eligible tile stores (`lower/tma_store.rs`; the specialization's
    /// `tma_store`).
    pub tma_store: bool,
    /// Multicast the fetches that are alike in both blocks of a cluster of two
    /// (`back/ptx/tma.rs`; the specialization's `multicast`).
    pub multicast: bool,
    /// Two consumer warpgroups of a warp-specialized block take turns issuing a loop's
    /// products (`back/ptx/pingpong.rs`; the specialization's `pingpong`).
    pub pingpong: bool,
}

impl CompileOptions {
    pub fn new(arch: Arch) -> CompileOptions {
        CompileOptions {
            arch,
            kernel: None,
            defines: Vec::new(),
            num_warps: None,
            min_blocks_per_sm: None,
            tensor_align: Vec::new(),
            num_stages: None,
            no_tma: false,
            ws: false,
            tma_store: false,
            multicast: false,
            pingpong: false,
        }
    }

    pub fn define(mut self, name: &str, value: impl ToString) -> CompileOptions {
        self.defines.push((name.to_string(), value.to_string()));
        self
    }

    pub fn kernel(mut self, name: &str) -> CompileOptions {
        self.kernel = Some(name.to_string());
        self
    }
}

/// Source text to optimized, validated tile IR (the `--emit ir` form and the
/// interpreter's input).
pub fn compile_to_ir(
    file: &SourceFile,
    opts: &CompileOptions,
) -> Result<(ir::Function, crate::abi::Specialization), Diagnostics> {
    validated_ir(file, opts, true).map(|(func, spec, _)| (func, spec))
}

/// [`compile_to_ir`] with the validator's facts, which the back end reads instead of
/// deriving them again (validation runs once per compile).
/// `cross_round: false` keeps every pipelined loop's prologue in its round
/// (`passes/cross_round.rs`).
fn validated_ir(
    file: &SourceFile,
    opts: &CompileOptions,
    cross_round: bool,
) -> Result<(ir::Function, crate::abi::Specialization, valid::ModuleInfo), Diagnostics> {
    let module = front::parse(file)?;
    let (mut func, spec) = check::lower_kernel(&module, opts)?;
    let mut passes = passes::PassOptions::for_target(&spec, &opts.arch.target());
    if let Some(p) = &mut passes.pipeline {
        p.cross_round &= cross_round;
    }
    passes::optimize(&mut func, &passes)?;
    let info = valid::validate(&func)?;
    Ok((func, spec, info))
}

/// Source text to PTX for one specialization.
pub fn compile(file: &SourceFile, opts: &CompileOptions) -> Result<CompiledKernel, Diagnostics> {
    let (func, spec, info) = validated_ir(file, opts, true)?;
    let target = opts.arch.target();
    match back::ptx::write(&func, &info, &target, &spec) {
        // A persistent loop's ring kept alive across its rounds (`passes/cross_round.rs`)
        // no longer shares its bytes with the epilogue; where that leaves too little
        // shared memory or too few registers, the kernel is compiled again with each
        // round's prologue in its round (an error then is the plain form's own).
        Err(_) => {
            let (func, spec, info) = validated_ir(file, opts, false)?;
            back::ptx::write(&func, &info, &target, &spec)
        }
        ok => ok,
    }
}
