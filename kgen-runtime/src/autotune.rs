//! Autotuning: pick the fastest of a kernel's candidate configurations, once per shape.
//!
//! A caller (an op) lists candidates (tile sizes, warps, ...) and a shape key (e.g.
//! `"rows=16384,cols=4096,T=bf16"`). The first time a (kernel, GPU, arch, compiler
//! version, shape key) is seen, [`Autotuner::pick`] times every candidate (warm-up, then
//! the median of several timed runs, each through the caller's closure, which launches
//! with that candidate and returns milliseconds from CUDA events), keeps the fastest in
//! memory and in `<KGEN_CACHE_DIR>/autotune.json`, and returns its index. Later calls,
//! in this process or the next, return the stored choice without timing anything.
//!
//! `KGEN_AUTOTUNE=0` turns tuning off: the first candidate (the default) is used. The
//! interpreter never tunes. Sweeps of more than a few candidates print progress on
//! stderr. A candidate that fails (does not compile, needs too many registers) is
//! skipped; if all fail, the first is used and the caller's own launch reports why.

use crate::device::Device;
use crate::error::RuntimeError;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// Timed runs per candidate (after `WARMUP` untimed ones).
pub const RUNS: usize = 7;
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
        let file = crate::disk_cache::DiskCache::from_env().map(|c| c.dir().join("autotune.json"));
        Autotuner::new(file, enabled)
    }

    /// A tuner storing its choices in `file` (none: memory only).
    pub fn new(file: Option<PathBuf>, enabled: bool) -> Autotuner {
        let choices = file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
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
        let mut best: Option<(f32, usize)> = None;
        for (i, label) in labels.iter().enumerate() {
            let mut times = Vec::with_capacity(RUNS);
            let mut failed = None;
            for r in 0..WARMUP + RUNS {
                match time(i) {
                    Ok(ms) if r >= WARMUP => times.push(ms),
                    Ok(_) => {}
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                if verbose {
                    eprintln!(
                        "autotune {kernel} [{shape_key}] {}/{}: {label}: skipped ({e})",
                        i + 1,
                        labels.len()
                    );
                }
                continue;
            }
            times.sort_by(f32::total_cmp);
            let median = times[times.len() / 2];
            if verbose {
                eprintln!(
                    "autotune {kernel} [{shape_key}] {}/{}: {label}: {:.1} us",
                    i + 1,
                    labels.len(),
                    median * 1e3
                );
            }
            if best.is_none_or(|(b, _)| median < b) {
                best = Some((median, i));
            }
        }
        let Some((_, i)) = best else {
            return 0;
        };
        if let Ok(mut c) = self.choices.lock() {
            c.insert(key, labels[i].clone());
            if let Some(f) = &self.file {
                if let Some(dir) = f.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let tmp = f.with_extension(format!("json.{}.tmp", std::process::id()));
                if let Ok(bytes) = serde_json::to_vec_pretty(&*c) {
                    if std::fs::write(&tmp, bytes).is_ok() {
                        let _ = std::fs::rename(&tmp, f);
                    }
                }
            }
        }
        i
    }

    /// The stored choice for a key, if any (for reports).
    pub fn stored(&self, key: &str) -> Option<String> {
        self.choices.lock().ok().and_then(|c| c.get(key).cloned())
    }
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
