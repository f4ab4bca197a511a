//! Autotuning: pick the fastest of a kernel's candidate configurations, once per shape.
//!
//! A caller (an op) lists candidates (tile sizes, warps, ...) and a shape key (e.g.
//! `"rows=16384,cols=4096,T=bf16"`). The first time a (kernel, GPU, arch, compiler
//! version, shape key) is seen, [`Autotuner::pick`] times every candidate (warm-up one
//! candidate after another, then timed rounds that run every candidate once each, in
//! turn; the median of its rounds, each through the caller's closure, which launches
//! with that candidate and returns milliseconds from CUDA events), keeps the fastest in
//! memory and in `<KGEN_CACHE_DIR>/autotune.json`, and returns its index. Later calls,
//! in this process or the next, return the stored choice without timing anything.
//!
//! Processes sharing the file keep each other's choices: a new choice is added to the
//! file as it is on disk at that moment (read, insert, write a temporary file, rename);
//! only two writes at the same instant can lose one, which is then tuned again.
//! `kgen cache prune` drops other compiler builds' choices ([`prune_choices`]).
//!
//! `KGEN_AUTOTUNE=0` turns tuning off: the first candidate (the default) is used. The
//! interpreter never tunes. Sweeps of more than a few candidates print progress on
//! stderr. A candidate that fails (does not compile, needs too many registers) is
//! skipped; if all fail, the first is used and the caller's own launch reports why.

use crate::device::Device;
use crate::error::RuntimeError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file, in the cache directory, that holds the choices.
pub const TUNING_FILE: &str = "autotune.json";

/// Timed runs per candidate (after `WARMUP` untimed ones).
pub const RUNS: usize = 9;
pub const WARMUP: usize = 2;

/// The tuner: choices in memory, backed by a JSON file.
pub struct Autotuner {
    file: Option<PathBuf>,
    enabled: bool,
    choices: Mutex<BTreeMap<String, String>>,
}

impl Autotuner {
    /// Backed by `KGEN_CACHE_DIR/autotune.json` (or the user cache directory), enabled
    /// unless `KGEN_AUTOTUNE=0`.
    pub fn from_env() -> Autotuner {
        let enabled = !std::env::var("KGEN_AUTOTUNE").is_ok_and(|v| v == "0" || v == "off");
        let file = crate::disk_cache::DiskCache::from_env().map(|c| c.dir().join(TUNING_FILE));
        Autotuner::new(file, enabled)
    }

    /// A tuner storing its choices in `file` (none: memory only).
    pub fn new(file: Option<PathBuf>, enabled: bool) -> Autotuner {
        let choices = file.as_deref().map(read_choices).unwrap_or_default();
        Autotuner {
            file,
            enabled,
            choices: Mutex::new(choices),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The full key of one tuning decision.
    pub fn key(kernel: &str, device: &Device, shape_key: &str) -> String {
        let gpu = device
            .gpu()
            .map(|g| g.info().name.clone())
            .unwrap_or_else(|| "interpreter".into());
        format!(
            "{kernel}|{gpu}|{}|kgen {}|{shape_key}",
            device.arch(),
            crate::kernel::COMPILER_VERSION
        )
    }

    /// The index of the fastest candidate. `labels[i]` names candidate `i` (stable across
    /// runs: it is what the file stores); `time(i)` launches candidate `i` once and
    /// returns its time in ms.
    pub fn pick(
        &self,
        kernel: &str,
        device: &Device,
        shape_key: &str,
        labels: &[String],
        time: impl FnMut(usize) -> Result<f32, RuntimeError>,
    ) -> usize {
        if !device.is_gpu() {
            return 0;
        }
        let key = Autotuner::key(kernel, device, shape_key);
        self.pick_for_key(&key, labels, time)
    }

    /// [`Autotuner::pick`] for an explicit key, on any backend (`time` decides what is
    /// measured).
    pub fn pick_for_key(
        &self,
        key: &str,
        labels: &[String],
        mut time: impl FnMut(usize) -> Result<f32, RuntimeError>,
    ) -> usize {
        if labels.len() <= 1 || !self.enabled {
            return 0;
        }
        let kernel = key.split('|').next().unwrap_or(key);
        let shape_key = key.rsplit('|').next().unwrap_or("");
        let key = key.to_string();
        if let Some(l) = self.choices.lock().ok().and_then(|c| c.get(&key).cloned()) {
            if let Some(i) = labels.iter().position(|x| *x == l) {
                return i;
            }
        }
        let verbose = labels.len() > 3;
        let n = labels.len();
        let say = |i: usize, what: &dyn std::fmt::Display| {
            if verbose {
                eprintln!(
                    "autotune {kernel} [{shape_key}] {}/{n}: {}: {what}",
                    i + 1,
                    labels[i]
                );
            }
        };
        // Warm-up, one candidate after another: its first call builds and JIT-compiles
        // it (the slow part of a sweep, so progress is printed here).
        let mut live: Vec<usize> = Vec::with_capacity(n);
        for i in 0..n {
            match (0..WARMUP).try_for_each(|_| time(i).map(drop)) {
                Ok(()) => {
                    live.push(i);
                    say(i, &"built, warmed up");
                }
                Err(e) => say(i, &format_args!("skipped ({e})")),
            }
        }
        // Timed rounds, every live candidate once per round in turn: a drift of the GPU's
        // speed during the sweep (clocks, temperature, a neighbour) then weighs on all of
        // them alike instead of on whichever came last.
        let mut times: Vec<Vec<f32>> = vec![Vec::with_capacity(RUNS); n];
        for _ in 0..RUNS {
            let mut failed = Vec::new();
            for &i in &live {
                match time(i) {
                    Ok(ms) => times[i].push(ms),
                    Err(e) => {
                        say(i, &format_args!("skipped ({e})"));
                        failed.push(i);
                    }
                }
            }
            live.retain(|i| !failed.contains(i));
        }
        let mut best: Option<(f32, usize)> = None;
        for &i in &live {
            let t = &mut times[i];
            if t.is_empty() {
                continue;
            }
            t.sort_by(f32::total_cmp);
            let median = t[t.len() / 2];
            say(i, &format_args!("{:.1} us", median * 1e3));
            if best.is_none_or(|(b, _)| median < b) {
                best = Some((median, i));
            }
        }
        let Some((_, i)) = best else {
            return 0;
        };
        if let Ok(mut c) = self.choices.lock() {
            c.insert(key.clone(), labels[i].clone());
            if let Some(f) = &self.file {
                // The file as it is now plus this choice: what other processes stored
                // (or pruned) since this one read it is kept. Best effort: the choice
                // is kept in memory either way.
                let mut on_disk = read_choices(f);
                on_disk.insert(key, labels[i].clone());
                let _ = write_choices(f, &on_disk);
            }
        }
        i
    }

    /// The stored choice for a key, if any (for reports).
    pub fn stored(&self, key: &str) -> Option<String> {
        self.choices.lock().ok().and_then(|c| c.get(key).cloned())
    }
}

/// The choices stored in a tuning file, by compiler build: (those of the build with
/// fingerprint `compiler`, those of others). A missing or unreadable file holds none.
pub fn stored_choices(file: &Path, compiler: &str) -> (usize, usize) {
    let choices = read_choices(file);
    let mine = choices.keys().filter(|k| made_by(k, compiler)).count();
    (mine, choices.len() - mine)
}

/// Removes other compiler builds' choices from a tuning file (a new build tunes again
/// anyway: its keys differ); returns how many it removed.
pub fn prune_choices(file: &Path, compiler: &str) -> std::io::Result<usize> {
    let mut choices = read_choices(file);
    let before = choices.len();
    choices.retain(|k, _| made_by(k, compiler));
    let removed = before - choices.len();
    if removed > 0 {
        write_choices(file, &choices)?;
    }
    Ok(removed)
}

/// Whether a tuning key (`kernel|gpu|arch|kgen <fingerprint>|shape`) is `compiler`'s.
fn made_by(key: &str, compiler: &str) -> bool {
    let field = format!("kgen {compiler}");
    key.split('|').any(|f| f == field)
}

fn read_choices(file: &Path) -> BTreeMap<String, String> {
    std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes the choices through a temporary file renamed into place, so a reader never
/// sees half a file.
fn write_choices(file: &Path, choices: &BTreeMap<String, String>) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = file.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(choices).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("BLOCK={}", 256 << i)).collect()
    }

    #[test]
    fn picks_the_fastest_and_remembers_it_on_disk() {
        let dir = std::env::temp_dir().join(format!("kgen-autotune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = dir.join("autotune.json");
        let t = Autotuner::new(Some(file.clone()), true);
        let cost = [3.0f32, 1.0, 2.0, 5.0];
        let mut calls = 0;
        let i = t.pick_for_key("k|gpu|sm_90a|kgen 0|n=7", &labels(4), |i| {
            calls += 1;
            Ok(cost[i])
        });
        assert_eq!(i, 1);
        assert_eq!(calls, 4 * (WARMUP + RUNS));
        // A new tuner (a new process) reads the choice and times nothing.
        let t2 = Autotuner::new(Some(file), true);
        let i2 = t2.pick_for_key("k|gpu|sm_90a|kgen 0|n=7", &labels(4), |_| {
            panic!("must not time a stored choice")
        });
        assert_eq!(i2, 1);
        // Another shape key tunes again.
        let i3 = t2.pick_for_key("k|gpu|sm_90a|kgen 0|n=8", &labels(4), |i| {
            Ok(10.0 - i as f32)
        });
        assert_eq!(i3, 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn timed_rounds_interleave_the_candidates() {
        let t = Autotuner::new(None, true);
        let mut order = Vec::new();
        t.pick_for_key("k||||s", &labels(3), |i| {
            order.push(i);
            Ok(1.0)
        });
        // Warm-up one candidate after another, then rounds of 0, 1, 2.
        let warm: Vec<usize> = (0..3).flat_map(|i| [i; WARMUP]).collect();
        assert_eq!(order[..3 * WARMUP], warm[..]);
        let rounds: Vec<usize> = (0..RUNS).flat_map(|_| 0..3).collect();
        assert_eq!(order[3 * WARMUP..], rounds[..]);
    }

    #[test]
    fn a_drift_during_the_sweep_does_not_pick_the_slower_candidate() {
        // Candidate 1 is 5% faster, but every call is 1% slower than the one before (the
        // GPU warming up): timed one after the other, candidate 0's runs would all come
        // first and look faster.
        let t = Autotuner::new(None, true);
        let mut calls = 0;
        let i = t.pick_for_key("k||||s", &labels(2), |i| {
            calls += 1;
            Ok([1.05f32, 1.0][i] + 0.01 * calls as f32)
        });
        assert_eq!(i, 1);
    }

    #[test]
    fn a_candidate_failing_in_a_timed_round_is_dropped() {
        let t = Autotuner::new(None, true);
        let mut calls = [0usize; 3];
        let i = t.pick_for_key("k||||s", &labels(3), |i| {
            calls[i] += 1;
            // Candidate 1 is the fastest but fails on its 4th call (a timed round).
            if i == 1 && calls[1] > WARMUP + 1 {
                Err(RuntimeError::LaunchConfig("lost".into()))
            } else {
                Ok([3.0f32, 1.0, 2.0][i])
            }
        });
        assert_eq!(i, 2);
        assert_eq!(calls[1], WARMUP + 2, "not called again after failing");
    }

    #[test]
    fn tuners_sharing_a_file_keep_each_others_choices() {
        let dir = std::env::temp_dir().join(format!("kgen-tune-share-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = dir.join(TUNING_FILE);
        // Two processes' tuners, both started before either stored anything.
        let a = Autotuner::new(Some(file.clone()), true);
        let b = Autotuner::new(Some(file.clone()), true);
        let key = |n: u32| format!("rmsnorm|NVIDIA H100|sm_90a|kgen 0.1.0+aaaa|n={n}");
        assert_eq!(
            a.pick_for_key(&key(1), &labels(2), |i| Ok([2.0, 1.0][i])),
            1
        );
        assert_eq!(
            b.pick_for_key(&key(2), &labels(2), |i| Ok([1.0, 2.0][i])),
            0
        );
        let stored = read_choices(&file);
        assert_eq!(
            stored.get(&key(1)).map(String::as_str),
            Some("BLOCK=512"),
            "a's choice survives b's write"
        );
        assert_eq!(stored.get(&key(2)).map(String::as_str), Some("BLOCK=256"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn other_builds_choices_are_counted_and_pruned() {
        let dir = std::env::temp_dir().join(format!("kgen-tune-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = dir.join(TUNING_FILE);
        assert_eq!(
            stored_choices(&file, "0.1.0+aaaa"),
            (0, 0),
            "no file: no choices"
        );
        assert_eq!(prune_choices(&file, "0.1.0+aaaa").unwrap(), 0);
        let tuner = Autotuner::new(Some(file.clone()), true);
        for (compiler, shape) in [
            ("0.1.0+aaaa", "n=1"),
            ("0.1.0+aaaa", "n=2"),
            ("0.1.0+bbbb", "n=1"),
        ] {
            let key = format!("rmsnorm|NVIDIA H100|sm_90a|kgen {compiler}|{shape}");
            assert_eq!(
                tuner.pick_for_key(&key, &labels(2), |i| Ok([2.0, 1.0][i])),
                1
            );
        }
        assert_eq!(stored_choices(&file, "0.1.0+aaaa"), (2, 1));
        assert_eq!(stored_choices(&file, "0.1.0+bbbb"), (1, 2));
        assert_eq!(prune_choices(&file, "0.1.0+aaaa").unwrap(), 1);
        assert_eq!(stored_choices(&file, "0.1.0+aaaa"), (2, 0));
        // The kept choices still answer without timing.
        let again = Autotuner::new(Some(file.clone()), true);
        let key = "rmsnorm|NVIDIA H100|sm_90a|kgen 0.1.0+aaaa|n=2";
        assert_eq!(again.pick_for_key(key, &labels(2), |_| panic!("timed")), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn disabled_or_failing_candidates() {
        let off = Autotuner::new(None, false);
        assert_eq!(
            off.pick_for_key("k||||s", &labels(3), |_| panic!("disabled")),
            0
        );
        let on = Autotuner::new(None, true);
        // Candidate 0 fails to build: the fastest working one wins.
        let i = on.pick_for_key("k||||s", &labels(3), |i| {
            if i == 0 {
                Err(RuntimeError::LaunchConfig("too many registers".into()))
            } else {
                Ok(i as f32)
            }
        });
        assert_eq!(i, 1);
        // All fail: the default.
        let j = on.pick_for_key("k||||t", &labels(3), |_| {
            Err(RuntimeError::LaunchConfig("no".into()))
        });
        assert_eq!(j, 0);
        // The interpreter never tunes.
        let d = Device::interpreter();
        assert_eq!(
            on.pick("k", &d, "s", &labels(3), |_| panic!("interpreter")),
            0
        );
    }
}
