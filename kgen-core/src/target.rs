//! Target descriptions: sm_80 (Ampere) and sm_90a (Hopper) as capability flags and
//! hardware limits. Architecture differences are decided here and checked during
//! validation and lowering; the PTX printer never branches on the architecture.

use std::fmt;
use std::str::FromStr;

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Arch {
    Sm80,
    Sm90a,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Sm80, Arch::Sm90a];

    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90a => "sm_90a",
        }
    }

    /// The arch for a device of compute capability `major.minor`, if kgen targets it.
    pub fn for_compute_capability(major: u32, minor: u32) -> Option<Arch> {
        match (major, minor) {
            (9, 0) => Some(Arch::Sm90a),
            (8, _) => Some(Arch::Sm80),
            _ => None,
        }
    }

    pub fn target(self) -> Target {
        Target::new(self)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Arch, String> {
        match s {
            "sm_80" | "sm80" | "ampere" => Ok(Arch::Sm80),
            "sm_90a" | "sm90a" | "hopper" => Ok(Arch::Sm90a),
            // Not an alias: sm_90 PTX is forward-compatible (the driver JIT-compiles it
            // for later GPUs), sm_90a PTX is not. Taking one for the other silently
            // would hand out PTX that does not load where the user expects it to.
            "sm_90" | "sm90" | "compute_90" => Err(format!(
                "`{s}`: kgen does not target plain sm_90; its Hopper target is `sm_90a` \
                 (arch-specific PTX, `.target sm_90a`), which runs on every compute \
                 capability 9.0 GPU (H100, H200, GH200) but, unlike sm_90 PTX, not on \
                 later architectures. Pass `--arch sm_90a`"
            )),
            _ => Err(format!("unknown arch `{s}`: expected `sm_80` or `sm_90a`")),
        }
    }
}

/// The largest grid a launch may have, along axes 0, 1, 2 (the same on every device kgen
/// targets: 2^31 - 1, 65535, 65535 blocks).
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];

/// Whether `grid` is within [`MAX_GRID`] on every axis.
pub fn grid_in_limits(grid: [u32; 3]) -> bool {
    grid.iter().zip(MAX_GRID).all(|(g, m)| *g <= m)
}

/// What the target's instruction set offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// `mma.sync.aligned.m16n8k16` with f16/bf16 inputs.
    pub mma_sync: bool,
    /// `ldmatrix` from shared memory.
    pub ldmatrix: bool,
    /// `cp.async` global→shared copies.
    pub cp_async: bool,
    /// `wgmma.mma_async` (needs the `a` target).
    pub wgmma: bool,
    /// `cp.async.bulk.tensor` (TMA) with mbarrier completion.
    pub tma: bool,
    /// `mbarrier` with transaction counts.
    pub mbarrier_tx: bool,
    /// Thread-block clusters and distributed shared memory.
    pub clusters: bool,
    /// `red`/`atom` `.v2.f16x2`/`.bf16x2` and `atom.add.noftz.bf16`.
    pub atomic_bf16: bool,
    /// `red.global.add.v2.f32` / `.v4.f32`: one reduction of 2 or 4 consecutive f32
    /// words (sm_90, PTX ISA 8.1).
    pub vector_red: bool,
    /// `griddepcontrol` (programmatic dependent launch, sm_90).
    pub grid_dependency: bool,
}

/// Everything the compiler needs to know about the machine it writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub arch: Arch,
    /// PTX ISA version written in `.version` (major, minor). The CUDA 13.0 driver (580)
    /// JIT accepts 8.0 through 9.0.
    pub ptx_version: (u32, u32),
    pub caps: Capabilities,
    pub max_threads_per_block: u32,
    /// Shared memory one block can use, static plus opt-in dynamic, in bytes.
    pub max_shared_bytes_per_block: u32,
    /// Shared memory a block may use without the opt-in attribute.
    pub default_shared_bytes_per_block: u32,
    pub max_registers_per_thread: u32,
    pub registers_per_sm: u32,
    /// Resident threads per SM (all blocks together).
    pub max_threads_per_sm: u32,
    pub warp_size: u32,
}

impl Target {
    pub fn new(arch: Arch) -> Target {
        match arch {
            Arch::Sm80 => Target {
                arch,
                ptx_version: (8, 0),
                caps: Capabilities {
                    mma_sync: true,
                    ldmatrix: true,
                    cp_async: true,
                    wgmma: false,
                    tma: false,
                    mbarrier_tx: false,
                    clusters: false,
                    atomic_bf16: false,
                    vector_red: false,
                    grid_dependency: false,
                },
                max_threads_per_block: 1024,
                max_shared_bytes_per_block: 163 * 1024,
                default_shared_bytes_per_block: 48 * 1024,
                max_registers_per_thread: 255,
                registers_per_sm: 65536,
                max_threads_per_sm: 2048,
                warp_size: 32,
            },
            Arch::Sm90a => Target {
                arch,
                ptx_version: (8, 0),
                caps: Capabilities {
                    mma_sync: true,
                    ldmatrix: true,
                    cp_async: true,
                    wgmma: true,
                    tma: true,
                    mbarrier_tx: true,
                    clusters: true,
                    atomic_bf16: true,
                    vector_red: true,
                    grid_dependency: true,
                },
                max_threads_per_block: 1024,
                max_shared_bytes_per_block: 227 * 1024,
                default_shared_bytes_per_block: 48 * 1024,
                max_registers_per_thread: 255,
                registers_per_sm: 65536,
                max_threads_per_sm: 2048,
                warp_size: 32,
            },
        }
    }

    /// The `.target` directive's operand.
    pub fn ptx_target(&self) -> &'static str {
        self.arch.name()
    }
}

/// The targets a `.kg` source is written for: every arch, or only those named on
/// `// target: <arch>` lines among its leading comment lines (for kernels that use
/// sm_90a-only features such as `cluster_gather`; the other targets reject them with an
/// `Unsupported` diagnostic). Tools that compile every bundled kernel for every target
/// skip the others.
pub fn source_targets(text: &str) -> Vec<Arch> {
    let named: Vec<Arch> = text
        .lines()
        .map(str::trim)
        .take_while(|l| l.starts_with("//") || l.is_empty())
        .filter_map(|l| l.strip_prefix("// target:"))
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    if named.is_empty() {
        Arch::ALL.to_vec()
    } else {
        named
    }
}

#[cfg(test)]
mod source_target_tests {
    use super::*;

    #[test]
    fn sm_90_is_not_taken_for_sm_90a() {
        assert_eq!("sm_90a".parse::<Arch>(), Ok(Arch::Sm90a));
        assert_eq!("sm_80".parse::<Arch>(), Ok(Arch::Sm80));
        for s in ["sm_90", "sm90", "compute_90"] {
            let e = s.parse::<Arch>().unwrap_err();
            assert!(e.contains("Pass `--arch sm_90a`") && e.contains(s), "{e}");
        }
    }

    #[test]
    fn target_lines_restrict_the_arches() {
        assert_eq!(source_targets("kernel k() {}"), Arch::ALL.to_vec());
        assert_eq!(
            source_targets("// target: sm_90a\n// a note\nkernel k() {}"),
            vec![Arch::Sm90a]
        );
        // Only leading comments count.
        assert_eq!(
            source_targets("kernel k() {}\n// target: sm_90a\n"),
            Arch::ALL.to_vec()
        );
    }
}
