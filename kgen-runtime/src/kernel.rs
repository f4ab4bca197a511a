//! Compiled, loaded kernels and the kernel cache.
//!
//! `Device::kernel(file, opts)` compiles one specialization (kgen's compile is a few
//! milliseconds; a later process takes it from the disk cache, [`crate::disk_cache`])
//! and loads it: on a GPU by handing the PTX to the driver (`cuModuleLoadData`: its JIT
//! compiles whole-program code, and its own cache keeps the result across processes); on
//! the interpreter as IR. Loaded kernels are kept in memory per device, keyed by the
//! source hash, the specialization, the arch and the compiler's fingerprint, so asking
//! again costs a hash and a map lookup. Hot paths should keep the `Arc<Kernel>` they got.

use crate::device::{Backend, Device};
use crate::disk_cache::{sha256_hex, CacheKey, DiskCache, Lookup};
use crate::error::RuntimeError;
use crate::gpu::LoadedKernel;
use kgen_core::abi::CompiledKernel;
use kgen_core::{CompileOptions, SourceFile};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The kgen compiler's fingerprint (its version and a hash of its sources) baked into
/// cache keys: the disk cache's and the tuner's.
pub const COMPILER_VERSION: &str = kgen_core::COMPILER_FINGERPRINT;

pub(crate) enum Exec {
    Cuda(LoadedKernel),
    Interp(kgen_core::ir::Function),
}

/// One specialization of one kernel, ready to launch on one device.
pub struct Kernel {
    pub(crate) compiled: CompiledKernel,
    pub(crate) exec: Exec,
    pub(crate) device_id: u64,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({})", self.compiled.entry)
    }
}

impl Kernel {
    /// PTX, ABI, launch hints and specialization.
    pub fn compiled(&self) -> &CompiledKernel {
        &self.compiled
    }
    /// The PTX entry name (it spells the specialization).
    pub fn entry(&self) -> &str {
        &self.compiled.entry
    }
    /// Registers per thread and local (spill) bytes the driver reports (GPU only).
    pub fn resources(&self) -> Option<(u32, u32)> {
        match &self.exec {
            Exec::Cuda(l) => Some((l.num_regs, l.local_bytes)),
            Exec::Interp(_) => None,
        }
    }
}

/// Cache counters of one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Found loaded in memory.
    pub memory_hits: u64,
    /// Compiled by kgen (misses in memory the disk cache did not answer).
    pub compiles: u64,
    /// kgen's compile skipped thanks to a disk entry (whether the driver JIT-compiles the
    /// PTX again is up to its own cache).
    pub disk_hits: u64,
    /// Disk entries found corrupt or unusable, removed and rebuilt.
    pub disk_rejected: u64,
    /// Entries that could not be written (the launch still worked).
    pub disk_write_errors: u64,
}

pub(crate) struct KernelCache {
    map: Mutex<HashMap<String, Arc<Kernel>>>,
    disk: Option<DiskCache>,
    memory_hits: AtomicU64,
    compiles: AtomicU64,
    disk_hits: AtomicU64,
    disk_rejected: AtomicU64,
    disk_write_errors: AtomicU64,
}

impl KernelCache {
    pub(crate) fn from_env() -> KernelCache {
        KernelCache::with_disk(DiskCache::from_env())
    }

    pub(crate) fn with_disk(disk: Option<DiskCache>) -> KernelCache {
        KernelCache {
            map: Mutex::new(HashMap::new()),
            disk,
            memory_hits: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            disk_rejected: AtomicU64::new(0),
            disk_write_errors: AtomicU64::new(0),
        }
    }

    /// Every kernel loaded so far, in no particular order.
    pub(crate) fn loaded(&self) -> Vec<Arc<Kernel>> {
        self.map
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            compiles: self.compiles.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            disk_rejected: self.disk_rejected.load(Ordering::Relaxed),
            disk_write_errors: self.disk_write_errors.load(Ordering::Relaxed),
        }
    }
}

/// A readable key of everything in the options that selects the specialization.
pub fn spec_key(opts: &CompileOptions) -> String {
    let mut defines = opts.defines.clone();
    defines.sort();
    let mut align = opts.tensor_align.clone();
    align.sort();
    format!(
        "kernel={:?};defines={:?};warps={:?};min_blocks_per_sm={:?};stages={:?};align={:?};no_tma={};ws={};tma_store={};multicast={};pingpong={}",
        opts.kernel, defines, opts.num_warps, opts.min_blocks_per_sm, opts.num_stages, align, opts.no_tma, opts.ws, opts.tma_store, opts.multicast, opts.pingpong
    )
}

/// Counts and reports a disk entry that could not be used (already removed; the kernel
/// is rebuilt).
fn report_rejected(cache: &KernelCache, disk: &DiskCache, what: &str, why: String) {
    cache.disk_rejected.fetch_add(1, Ordering::Relaxed);
    eprintln!(
        "kgen: rebuilding the cache entry of `{what}` in {}: {why}",
        disk.dir().display()
    );
}

pub(crate) fn get_or_build(
    device: &Device,
    file: &SourceFile,
    opts: &CompileOptions,
) -> Result<Arc<Kernel>, RuntimeError> {
    let cache = &device.inner.kernels;
    let mut opts = opts.clone();
    opts.arch = device.arch();
    let spec = spec_key(&opts);
    let key = CacheKey::new(&file.text, &spec, &opts.arch.to_string(), COMPILER_VERSION);
    if let Some(k) = cache
        .map
        .lock()
        .ok()
        .and_then(|m| m.get(&key.hash).cloned())
    {
        cache.memory_hits.fetch_add(1, Ordering::Relaxed);
        return Ok(k);
    }
    let render = |d: kgen_core::Diagnostics| RuntimeError::compile(d, file);
    let build = || -> Result<CompiledKernel, RuntimeError> {
        cache.compiles.fetch_add(1, Ordering::Relaxed);
        kgen_core::compile(file, &opts).map_err(render)
    };
    let (compiled, exec) = match &device.inner.backend {
        Backend::Interpreter => {
            let (func, _) = kgen_core::compile_to_ir(file, &opts).map_err(render)?;
            (build()?, Exec::Interp(func))
        }
        Backend::Cuda(gpu) => {
            // kgen's compiled kernel from the disk cache when it holds one; the driver's
            // JIT (its own cache aside) runs on the PTX either way (`Gpu::load`).
            let stored = match cache.disk.as_ref().map(|d| (d, d.load(&key))) {
                Some((disk, Lookup::Hit(k))) => match gpu.load(&k) {
                    Ok(l) => {
                        cache.disk_hits.fetch_add(1, Ordering::Relaxed);
                        Some((*k, l))
                    }
                    Err(e) => {
                        disk.remove(&key);
                        report_rejected(cache, disk, &k.entry, e.to_string());
                        None
                    }
                },
                Some((disk, Lookup::Rejected(why))) => {
                    report_rejected(cache, disk, &spec, why);
                    None
                }
                Some((_, Lookup::Miss)) | None => None,
            };
            match stored {
                Some((k, l)) => (k, Exec::Cuda(l)),
                None => {
                    let compiled = build()?;
                    let loaded = gpu.load(&compiled)?;
                    if let Some(disk) = &cache.disk {
                        if disk.store(&key, &compiled).is_err() {
                            cache.disk_write_errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    (compiled, Exec::Cuda(loaded))
                }
            }
        }
    };
    let k = Arc::new(Kernel {
        compiled,
        exec,
        device_id: device.inner.id,
    });
    if let Ok(mut m) = cache.map.lock() {
        m.insert(key.hash, k.clone());
    }
    Ok(k)
}

/// Hex SHA-256 of a source text (for callers building their own keys).
pub fn source_hash(text: &str) -> String {
    sha256_hex(text.as_bytes())
}
