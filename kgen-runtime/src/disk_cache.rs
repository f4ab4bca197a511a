//! The on-disk kernel cache: the driver's JIT output (a cubin) per compiled kernel.
//!
//! kgen's own compile is milliseconds; the driver's PTX→SASS JIT is most of a first
//! launch. So an entry stores the cubin, keyed by everything that determines it: the
//! kernel source, the specialization (defines, warps, tensor alignments), the arch, the
//! kgen compiler version and this format's version, plus the GPU name (the cubin is for
//! one SM). On a hit the runtime still compiles the kernel (for its ABI) and checks that
//! the PTX it gets hashes to the one the entry was built from; so an entry made by
//! another compiler build, a hash collision or a hand-edited file is never trusted.
//!
//! File format (one file per key, `<dir>/<key hex>.kgbin`):
//! `KGENCUBIN1\n`, one JSON header line `{key, description, ptx_sha256, cubin_len,
//! cubin_sha256}`, then the cubin bytes. Anything that does not parse, has the wrong
//! length, or whose checksums or key do not match is `Lookup::Rejected` (and deleted).
//! Writes go to a temporary file renamed into place, so readers never see half a file.
//! Every failure (unwritable directory, full disk) is reported, never fatal.
//!
//! Pure: no driver calls; unit-tested on any machine.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"KGENCUBIN1\n";
/// Bumped when the entry format or what it depends on changes.
pub const FORMAT_VERSION: u32 = 1;

/// Hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// What identifies one cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey {
    /// Hex SHA-256 of `description`: the file name.
    pub hash: String,
    /// Everything the entry depends on, readable (stored in the header and compared).
    pub description: String,
}

impl CacheKey {
    /// The key of a kernel build: source text, specialization key, arch, GPU name and
    /// compiler version.
    pub fn new(source: &str, spec_key: &str, arch: &str, gpu: &str, compiler: &str) -> CacheKey {
        let description = format!(
            "format={FORMAT_VERSION};kgen={compiler};arch={arch};gpu={gpu};spec={spec_key};source_sha256={}",
            sha256_hex(source.as_bytes())
        );
        CacheKey {
            hash: sha256_hex(description.as_bytes()),
            description,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    key: String,
    description: String,
    ptx_sha256: String,
    cubin_len: usize,
    cubin_sha256: String,
}

/// The result of a lookup.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Hit(Vec<u8>),
    Miss,
    /// An entry existed but could not be trusted (the reason); it was removed.
    Rejected(String),
}

/// A cache directory.
#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    pub fn new(dir: impl Into<PathBuf>) -> DiskCache {
        DiskCache { dir: dir.into() }
    }

    /// `KGEN_CACHE_DIR`, else the user cache directory (`~/.cache/kgen` on Linux);
    /// `None` when `KGEN_CACHE=0` disables it or no directory is known.
    pub fn from_env() -> Option<DiskCache> {
        if std::env::var("KGEN_CACHE").is_ok_and(|v| v == "0" || v == "off") {
            return None;
        }
        let dir = match std::env::var_os("KGEN_CACHE_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => dirs::cache_dir()?.join("kgen"),
        };
        Some(DiskCache::new(dir))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.kgbin", key.hash))
    }

    /// Looks `key` up; `ptx` is the PTX the caller just compiled (the entry must have
    /// been built from exactly that).
    pub fn load(&self, key: &CacheKey, ptx: &str) -> Lookup {
        let path = self.path(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Rejected(format!("unreadable: {e}")),
        };
        match parse(&bytes, key, ptx) {
            Ok(cubin) => Lookup::Hit(cubin),
            Err(why) => {
                let _ = std::fs::remove_file(&path);
                Lookup::Rejected(why)
            }
        }
    }

    /// Stores an entry atomically. Errors are returned for the caller to report.
    pub fn store(&self, key: &CacheKey, ptx: &str, cubin: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let header = Header {
            key: key.hash.clone(),
            description: key.description.clone(),
            ptx_sha256: sha256_hex(ptx.as_bytes()),
            cubin_len: cubin.len(),
            cubin_sha256: sha256_hex(cubin),
        };
        let mut out = MAGIC.to_vec();
        out.extend(serde_json::to_vec(&header).map_err(std::io::Error::other)?);
        out.push(b'\n');
        out.extend_from_slice(cubin);
        let tmp = self
            .dir
            .join(format!(".{}.{}.tmp", key.hash, std::process::id()));
        std::fs::write(&tmp, &out)?;
        let r = std::fs::rename(&tmp, self.path(key));
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }
}

fn parse(bytes: &[u8], key: &CacheKey, ptx: &str) -> Result<Vec<u8>, String> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or("not a kgen cache entry (bad magic)")?;
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("truncated header")?;
    let header: Header =
        serde_json::from_slice(&rest[..nl]).map_err(|e| format!("corrupt header: {e}"))?;
    let cubin = &rest[nl + 1..];
    if header.key != key.hash || header.description != key.description {
        return Err("the entry belongs to another key".into());
    }
    if header.cubin_len != cubin.len() {
        return Err(format!(
            "truncated: {} of {} cubin bytes",
            cubin.len(),
            header.cubin_len
        ));
    }
    if header.cubin_sha256 != sha256_hex(cubin) {
        return Err("cubin checksum mismatch".into());
    }
    if header.ptx_sha256 != sha256_hex(ptx.as_bytes()) {
        return Err("stale: built from different PTX".into());
    }
    Ok(cubin.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "kgen-cache-test-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn key(src: &str) -> CacheKey {
        CacheKey::new(src, "k<T=f32>;warps=4", "sm_90a", "NVIDIA H100", "0.1.0")
    }

    #[test]
    fn hit_after_store_and_miss_before() {
        let c = DiskCache::new(temp_dir("hit"));
        let k = key("kernel a() {}");
        assert_eq!(c.load(&k, "PTX"), Lookup::Miss);
        c.store(&k, "PTX", b"\x7fELF cubin bytes").unwrap();
        assert_eq!(
            c.load(&k, "PTX"),
            Lookup::Hit(b"\x7fELF cubin bytes".to_vec())
        );
    }

    #[test]
    fn key_depends_on_every_input() {
        let base = CacheKey::new("s", "spec", "sm_90a", "gpu", "1");
        for other in [
            CacheKey::new("s2", "spec", "sm_90a", "gpu", "1"),
            CacheKey::new("s", "spec2", "sm_90a", "gpu", "1"),
            CacheKey::new("s", "spec", "sm_80", "gpu", "1"),
            CacheKey::new("s", "spec", "sm_90a", "gpu2", "1"),
            CacheKey::new("s", "spec", "sm_90a", "gpu", "2"),
        ] {
            assert_ne!(base.hash, other.hash);
        }
        assert_eq!(base, CacheKey::new("s", "spec", "sm_90a", "gpu", "1"));
    }

    #[test]
    fn corrupt_truncated_and_stale_entries_are_rejected_and_removed() {
        let c = DiskCache::new(temp_dir("bad"));
        let k = key("kernel b() {}");
        let path = c.path(&k);
        let cubin = vec![7u8; 100];
        // Flipped cubin byte.
        c.store(&k, "PTX", &cubin).unwrap();
        let mut b = std::fs::read(&path).unwrap();
        let n = b.len();
        b[n - 1] ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert!(matches!(c.load(&k, "PTX"), Lookup::Rejected(w) if w.contains("checksum")));
        assert!(!path.exists(), "a rejected entry is deleted");
        // Truncated.
        c.store(&k, "PTX", &cubin).unwrap();
        let b = std::fs::read(&path).unwrap();
        std::fs::write(&path, &b[..b.len() - 10]).unwrap();
        assert!(matches!(c.load(&k, "PTX"), Lookup::Rejected(w) if w.contains("truncated")));
        // Garbage.
        std::fs::create_dir_all(c.dir()).unwrap();
        std::fs::write(&path, b"hello").unwrap();
        assert!(matches!(c.load(&k, "PTX"), Lookup::Rejected(w) if w.contains("magic")));
        // Corrupt header.
        let mut g = MAGIC.to_vec();
        g.extend(b"{not json\n");
        std::fs::write(&path, &g).unwrap();
        assert!(matches!(c.load(&k, "PTX"), Lookup::Rejected(w) if w.contains("header")));
        // Stale: built from other PTX.
        c.store(&k, "OLD PTX", &cubin).unwrap();
        assert!(matches!(c.load(&k, "NEW PTX"), Lookup::Rejected(w) if w.contains("stale")));
        // Another key's file under this name.
        let k2 = key("kernel c() {}");
        c.store(&k2, "PTX", &cubin).unwrap();
        std::fs::copy(c.path(&k2), &path).unwrap();
        assert!(matches!(c.load(&k, "PTX"), Lookup::Rejected(w) if w.contains("another key")));
        // Rebuilt after a rejection.
        c.store(&k, "PTX", &cubin).unwrap();
        assert_eq!(c.load(&k, "PTX"), Lookup::Hit(cubin));
    }

    #[test]
    fn unwritable_directory_is_an_error_not_a_panic() {
        let d = temp_dir("ro");
        std::fs::create_dir_all(d.parent().unwrap()).unwrap();
        std::fs::write(&d, b"a file where the directory should be").unwrap();
        let c = DiskCache::new(&d);
        let k = key("x");
        assert!(c.store(&k, "PTX", b"cubin").is_err());
        assert!(!matches!(c.load(&k, "PTX"), Lookup::Hit(_)));
        let _ = std::fs::remove_file(&d);
    }
}
