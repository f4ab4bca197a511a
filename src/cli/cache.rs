//! `kgen cache`: what the on-disk caches hold, and removing what this build cannot use.
//!
//! Two kgen files live in the cache directory (`KGEN_CACHE_DIR`, else the user cache
//! directory): compiled kernels (`*.kgk`, `kgen::runtime::DiskCache`) and the tuner's
//! choices (`autotune.json`). Both are keyed by the compiler build, so every new build
//! starts its own entries and the old ones stay until removed: `prune` removes other
//! builds' entries and choices, `clear` everything kgen stored. The driver's own JIT
//! cache (`~/.nv/ComputeCache`, `CUDA_CACHE_PATH`) is the driver's, not touched here.

use super::common::{say, CliError, CliResult};
use clap::{Args, ValueEnum};
use kgen::runtime::autotune::{prune_choices, stored_choices, TUNING_FILE};
use kgen::runtime::{DiskCache, FileCount, Inventory, COMPILER_VERSION};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum CacheAction {
    /// Show the directory and what it holds, by compiler build (the default).
    Info,
    /// Remove other compiler builds' kernels and tuning choices, unusable entries and
    /// stale temporary files; keep this build's.
    Prune,
    /// Remove every kernel entry and tuning choice kgen stored, of any build.
    Clear,
}

#[derive(Args, Debug)]
pub struct CacheArgs {
    /// What to do.
    #[arg(value_enum, default_value_t = CacheAction::Info)]
    pub action: CacheAction,
}

pub fn cache(a: CacheArgs) -> CliResult {
    let Some(disk) = DiskCache::from_env() else {
        say(
            "the disk cache is off (KGEN_CACHE=0) or no cache directory is known \
             (set KGEN_CACHE_DIR): nothing stored",
        );
        return Ok(());
    };
    let dir = disk.dir();
    let source = if std::env::var_os("KGEN_CACHE_DIR").is_some_and(|d| !d.is_empty()) {
        "KGEN_CACHE_DIR"
    } else {
        "the user cache directory; KGEN_CACHE_DIR overrides it"
    };
    let tuning = dir.join(TUNING_FILE);
    let io =
        |what: &str, e: std::io::Error| CliError::Msg(format!("{what} {}: {e}", dir.display()));
    say(format_args!(
        "cache directory: {} ({source})",
        dir.display()
    ));
    say(format_args!("this compiler build: kgen {COMPILER_VERSION}"));
    match a.action {
        CacheAction::Info => {
            let inv = disk
                .inventory(COMPILER_VERSION)
                .map_err(|e| io("cannot read", e))?;
            print_inventory(&inv, "");
            let (mine, theirs) = stored_choices(&tuning, COMPILER_VERSION);
            say(format_args!(
                "  tuning choices:          {mine} of this build, {theirs} of other builds ({TUNING_FILE})",
            ));
            if inv.other_builds.files + inv.unusable.files + theirs > 0 {
                say("`kgen cache prune` removes what this build cannot use");
            }
        }
        CacheAction::Prune => {
            let removed = disk
                .prune(COMPILER_VERSION)
                .map_err(|e| io("cannot prune", e))?;
            let choices =
                prune_choices(&tuning, COMPILER_VERSION).map_err(|e| io("cannot prune", e))?;
            print_inventory(&removed, "removed ");
            say(format_args!(
                "  removed tuning choices of other builds: {choices}"
            ));
            let kept = disk
                .inventory(COMPILER_VERSION)
                .map_err(|e| io("cannot read", e))?;
            say(format_args!(
                "kept: {} kernel(s) of this build ({})",
                kept.current.files,
                human_bytes(kept.current.bytes)
            ));
        }
        CacheAction::Clear => {
            let removed = disk
                .clear(COMPILER_VERSION)
                .map_err(|e| io("cannot clear", e))?;
            let (mine, theirs) = stored_choices(&tuning, COMPILER_VERSION);
            match std::fs::remove_file(&tuning) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("cannot clear", e)),
            }
            print_inventory(&removed, "removed ");
            say(format_args!("  removed tuning choices: {}", mine + theirs));
        }
    }
    Ok(())
}

fn print_inventory(inv: &Inventory, verb: &str) {
    let row = |what: &str, c: FileCount| {
        say(format_args!(
            "  {:<w$}{:>6} {}  {}",
            format!("{verb}{what}:"),
            c.files,
            if c.files == 1 { "file " } else { "files" },
            human_bytes(c.bytes),
            w = 25 + verb.len()
        ))
    };
    if verb.is_empty() || inv.current.files > 0 {
        row("kernels of this build", inv.current);
    }
    row("kernels of other builds", inv.other_builds);
    row("unusable files", inv.unusable);
}

/// `1536` → `1.5 KiB`.
fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 20), "5.0 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
