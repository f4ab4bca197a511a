//! The on-disk kernel cache: kgen's compiled kernels (PTX, parameter ABI, launch hints,
//! specialization), so a later process skips kgen's compile.
//!
//! An entry is keyed by everything that determines it: the kernel source, the
//! specialization (defines, warps, blocks-per-SM bound, tensor alignments), the arch,
//! the compiler's fingerprint (its version and a hash of its own sources,
//! `kgen_core::COMPILER_FINGERPRINT`) and this format's version. So an entry made by
//! another compiler build is never found, and a key collision is caught by comparing the
//! stored description. The driver's PTX→SASS JIT output is not stored here: the runtime
//! loads PTX with `cuModuleLoadData` (whole-program code; the linker's `cuLink*` path
//! compiles PTX as relocatable code, which measured other register counts and spills on
//! an H100), and the driver keeps its own JIT cache (`~/.nv/ComputeCache`, off with
//! `CUDA_CACHE_DISABLE=1`).
//!
//! File format (one file per key, `<dir>/<key hex>.kgk`): `KGENKERNEL2\n`, one JSON
//! header line `{key, description, body_len, body_sha256}`, then the body: the compiled
//! kernel as JSON. Anything that does not parse, has the wrong length, whose checksum or
//! key do not match, or whose kernel is inconsistent (its entry name is not its
//! specialization's, or the PTX does not declare it) is `Lookup::Rejected` (and
//! deleted). Writes go to a temporary file renamed into place, so readers never see half
//! a file. Every failure (unwritable directory, full disk) is reported, never fatal.
//! The previous format's entries (`*.kgbin`: the linker's cubins) are deleted on the
//! first store into a directory.
//!
//! Maintenance (`kgen cache`): [`DiskCache::inventory`] counts the entries by whether
//! this compiler build can use them (a new build keys its own, so an old build's entries
//! are never read but stay on disk), [`DiskCache::prune`] removes what this build cannot
//! use, [`DiskCache::clear`] every entry.
//!
//! Pure: no driver calls; unit-tested on any machine.

use kgen_core::abi::CompiledKernel;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"KGENKERNEL2\n";
/// Bumped when the entry format or what it depends on changes.
pub const FORMAT_VERSION: u32 = 2;

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
    /// The key of a kernel build: source text, specialization key, arch and compiler
    /// fingerprint.
    pub fn new(source: &str, spec_key: &str, arch: &str, compiler: &str) -> CacheKey {
        let description = format!(
            "format={FORMAT_VERSION};kgen={compiler};arch={arch};spec={spec_key};source_sha256={}",
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
    body_len: usize,
    body_sha256: String,
}

/// The result of a lookup.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    Hit(Box<CompiledKernel>),
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
        self.dir.join(format!("{}.kgk", key.hash))
    }

    /// Looks `key` up.
    pub fn load(&self, key: &CacheKey) -> Lookup {
        let path = self.path(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Rejected(format!("unreadable: {e}")),
        };
        match parse(&bytes, key) {
            Ok(k) => Lookup::Hit(Box::new(k)),
            Err(why) => {
                self.remove(key);
                Lookup::Rejected(why)
            }
        }
    }

    /// Removes `key`'s entry (if any): one that did not parse, or one the caller could
    /// not use (the driver refused its PTX).
    pub fn remove(&self, key: &CacheKey) {
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Stores an entry atomically. Errors are returned for the caller to report.
    pub fn store(&self, key: &CacheKey, kernel: &CompiledKernel) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        self.remove_old_format_entries();
        let body = serde_json::to_vec(kernel).map_err(std::io::Error::other)?;
        let header = Header {
            key: key.hash.clone(),
            description: key.description.clone(),
            body_len: body.len(),
            body_sha256: sha256_hex(&body),
        };
        let mut out = MAGIC.to_vec();
        out.extend(serde_json::to_vec(&header).map_err(std::io::Error::other)?);
        out.push(b'\n');
        out.extend_from_slice(&body);
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

/// The extension of the previous format's entries (the linker's cubins, format 1).
const OLD_FORMAT_EXTENSION: &str = "kgbin";

impl DiskCache {
    /// Deletes the previous format's entries in this directory, which nothing reads any
    /// more: once per directory and process, on the first store.
    fn remove_old_format_entries(&self) {
        static SWEPT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
        let Ok(mut swept) = SWEPT.lock() else {
            return;
        };
        if swept.contains(&self.dir) {
            return;
        }
        swept.push(self.dir.clone());
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) == Some(OLD_FORMAT_EXTENSION) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// A number of files and their size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileCount {
    pub files: usize,
    pub bytes: u64,
}

impl FileCount {
    fn add(&mut self, bytes: u64) {
        self.files += 1;
        self.bytes += bytes;
    }
}

/// What a cache directory holds, by whether this compiler build can use it
/// ([`DiskCache::inventory`]), or what [`DiskCache::prune`] / [`DiskCache::clear`] removed.
/// Files that are not kgen's (any other name) are neither counted nor touched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Entries of this compiler build and entry format: the ones lookups can hit.
    pub current: FileCount,
    /// Well-formed entries of another compiler build or format version. This build never
    /// reads them (their key differs); another build sharing the directory may.
    pub other_builds: FileCount,
    /// Files no build reads: entries whose magic or header does not parse, the previous
    /// format's `*.kgbin`, and temporary files an interrupted write left behind.
    pub unusable: FileCount,
}

/// A temporary file younger than this may belong to a write in progress in another
/// process: `prune` leaves it alone.
const TEMP_FILE_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// How one file of a cache directory counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileClass {
    Current,
    OtherBuild,
    Unusable,
    /// A temporary file of a write (kernel entry or tuning file).
    Temporary,
    /// Not kgen's kernel cache: left alone (`autotune.json` is the tuner's).
    Foreign,
}

fn classify(name: &str, path: &Path, compiler: &str) -> FileClass {
    if name.ends_with(".tmp") && (name.starts_with('.') || name.starts_with("autotune.json.")) {
        return FileClass::Temporary;
    }
    if name.ends_with(&format!(".{OLD_FORMAT_EXTENSION}")) {
        return FileClass::Unusable;
    }
    if !name.ends_with(".kgk") {
        return FileClass::Foreign;
    }
    let Some(description) = std::fs::read(path).ok().and_then(|b| entry_description(&b)) else {
        return FileClass::Unusable;
    };
    if description.starts_with(&format!("format={FORMAT_VERSION};kgen={compiler};")) {
        FileClass::Current
    } else {
        FileClass::OtherBuild
    }
}

/// The key description in an entry's header, if the magic and header parse (the body is
/// checked only by a lookup).
fn entry_description(bytes: &[u8]) -> Option<String> {
    split_entry(bytes)
        .ok()
        .map(|(header, _)| header.description)
}

impl DiskCache {
    /// Counts the directory's entries by whether the compiler build with fingerprint
    /// `compiler` (`kgen_core::COMPILER_FINGERPRINT`) can use them. A missing directory
    /// is an empty cache.
    pub fn inventory(&self, compiler: &str) -> std::io::Result<Inventory> {
        self.sweep(compiler, Sweep::Count)
    }

    /// Removes what the build `compiler` cannot use: other builds' entries, unusable
    /// files, and temporary files older than ten minutes. Returns what it removed.
    pub fn prune(&self, compiler: &str) -> std::io::Result<Inventory> {
        self.sweep(compiler, Sweep::Prune)
    }

    /// Removes every kernel entry (any build), unusable and temporary file. Other files,
    /// the tuner's `autotune.json` among them, stay. Returns what it removed, counted as
    /// [`DiskCache::inventory`] would for `compiler`.
    pub fn clear(&self, compiler: &str) -> std::io::Result<Inventory> {
        self.sweep(compiler, Sweep::Clear)
    }

    /// Walks the directory once: each kgen file is classified, then counted (`Count`) or
    /// removed and counted if removed.
    fn sweep(&self, compiler: &str, sweep: Sweep) -> std::io::Result<Inventory> {
        let mut inv = Inventory::default();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(inv),
            Err(e) => return Err(e),
        };
        for e in entries.flatten() {
            let path = e.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let class = classify(name, &path, compiler);
            let count = match (sweep, class) {
                (_, FileClass::Foreign) => false,
                (Sweep::Count, _) => true,
                (Sweep::Prune, FileClass::Current) => false,
                (Sweep::Prune, FileClass::Temporary) => {
                    let age = meta.modified().ok().and_then(|m| m.elapsed().ok());
                    age.is_some_and(|a| a >= TEMP_FILE_GRACE) && std::fs::remove_file(&path).is_ok()
                }
                (Sweep::Prune | Sweep::Clear, _) => std::fs::remove_file(&path).is_ok(),
            };
            if count {
                match class {
                    FileClass::Current => inv.current.add(meta.len()),
                    FileClass::OtherBuild => inv.other_builds.add(meta.len()),
                    _ => inv.unusable.add(meta.len()),
                }
            }
        }
        Ok(inv)
    }
}

/// What [`DiskCache::sweep`] does with the files it classifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sweep {
    Count,
    Prune,
    Clear,
}

/// An entry's header and body, if its magic and header line parse.
fn split_entry(bytes: &[u8]) -> Result<(Header, &[u8]), String> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or("not a kgen cache entry (bad magic)")?;
    let nl = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("truncated header")?;
    let header: Header =
        serde_json::from_slice(&rest[..nl]).map_err(|e| format!("corrupt header: {e}"))?;
    Ok((header, &rest[nl + 1..]))
}

fn parse(bytes: &[u8], key: &CacheKey) -> Result<CompiledKernel, String> {
    let (header, body) = split_entry(bytes)?;
    if header.key != key.hash || header.description != key.description {
        return Err("the entry belongs to another key".into());
    }
    if header.body_len != body.len() {
        return Err(format!(
            "truncated: {} of {} body bytes",
            body.len(),
            header.body_len
        ));
    }
    if header.body_sha256 != sha256_hex(body) {
        return Err("body checksum mismatch".into());
    }
    let k: CompiledKernel =
        serde_json::from_slice(body).map_err(|e| format!("corrupt kernel: {e}"))?;
    if k.entry != k.spec.entry_name() || !k.ptx.contains(&format!(".entry {}(", k.entry)) {
        return Err(format!(
            "inconsistent: entry `{}` is not its specialization's or not in its PTX",
            k.entry
        ));
    }
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autotune::TUNING_FILE as TUNING_FILE_NAME;
    use kgen_core::{compile, Arch, CompileOptions, SourceFile};

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
        CacheKey::new(src, "k<T=f32>;warps=4", "sm_90a", "0.1.0+0123456789abcdef")
    }

    fn kernel(block: u32) -> CompiledKernel {
        let file = SourceFile::new(
            "k.kg",
            "kernel k<BLOCK: int = 64>(x: tensor<f32, 1>, y: tensor<f32, 1>) {\n\
             store(y, [bid(0)], load(x, [bid(0)], [BLOCK]) * 2.0);\n}\n",
        );
        compile(
            &file,
            &CompileOptions::new(Arch::Sm90a).define("BLOCK", block),
        )
        .unwrap_or_else(|d| panic!("{}", d.render(&file)))
    }

    #[test]
    fn hit_after_store_and_miss_before() {
        let c = DiskCache::new(temp_dir("hit"));
        let k = key("kernel a() {}");
        assert_eq!(c.load(&k), Lookup::Miss);
        let compiled = kernel(64);
        c.store(&k, &compiled).unwrap();
        assert_eq!(c.load(&k), Lookup::Hit(Box::new(compiled)));
    }

    #[test]
    fn the_first_store_removes_the_previous_formats_entries() {
        let dir = temp_dir("old");
        std::fs::create_dir_all(&dir).unwrap();
        let old = dir.join("0123abcd.kgbin");
        let other = dir.join("notes.txt");
        std::fs::write(&old, b"KGENCUBIN1\n{}\n").unwrap();
        std::fs::write(&other, b"not ours").unwrap();
        let c = DiskCache::new(&dir);
        let k = key("kernel o() {}");
        c.store(&k, &kernel(64)).unwrap();
        assert!(!old.exists(), "a format-1 entry is removed");
        assert!(other.exists(), "other files stay");
        assert!(matches!(c.load(&k), Lookup::Hit(_)));
    }

    #[test]
    fn key_depends_on_every_input() {
        let base = CacheKey::new("s", "spec", "sm_90a", "1");
        for other in [
            CacheKey::new("s2", "spec", "sm_90a", "1"),
            CacheKey::new("s", "spec2", "sm_90a", "1"),
            CacheKey::new("s", "spec", "sm_80", "1"),
            CacheKey::new("s", "spec", "sm_90a", "2"),
        ] {
            assert_ne!(base.hash, other.hash);
        }
        assert_eq!(base, CacheKey::new("s", "spec", "sm_90a", "1"));
    }

    #[test]
    fn corrupt_truncated_and_inconsistent_entries_are_rejected_and_removed() {
        let c = DiskCache::new(temp_dir("bad"));
        let k = key("kernel b() {}");
        let path = c.path(&k);
        let compiled = kernel(64);
        // Flipped body byte.
        c.store(&k, &compiled).unwrap();
        let mut b = std::fs::read(&path).unwrap();
        let n = b.len();
        b[n - 2] ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert!(matches!(c.load(&k), Lookup::Rejected(w) if w.contains("checksum")));
        assert!(!path.exists(), "a rejected entry is deleted");
        // Truncated.
        c.store(&k, &compiled).unwrap();
        let b = std::fs::read(&path).unwrap();
        std::fs::write(&path, &b[..b.len() - 10]).unwrap();
        assert!(matches!(c.load(&k), Lookup::Rejected(w) if w.contains("truncated")));
        // Garbage, and the previous format's magic.
        std::fs::create_dir_all(c.dir()).unwrap();
        for junk in [&b"hello"[..], b"KGENCUBIN1\n{}\n\x7fELF"] {
            std::fs::write(&path, junk).unwrap();
            assert!(matches!(c.load(&k), Lookup::Rejected(w) if w.contains("magic")));
        }
        // Corrupt header.
        let mut g = MAGIC.to_vec();
        g.extend(b"{not json\n");
        std::fs::write(&path, &g).unwrap();
        assert!(matches!(c.load(&k), Lookup::Rejected(w) if w.contains("header")));
        // A body with a valid checksum that is not a kernel.
        let body = b"[1, 2, 3]";
        let header = Header {
            key: k.hash.clone(),
            description: k.description.clone(),
            body_len: body.len(),
            body_sha256: sha256_hex(body),
        };
        let mut g = MAGIC.to_vec();
        g.extend(serde_json::to_vec(&header).unwrap());
        g.push(b'\n');
        g.extend(body);
        std::fs::write(&path, &g).unwrap();
        assert!(matches!(c.load(&k), Lookup::Rejected(w) if w.contains("corrupt kernel")));
        // A kernel whose entry is not its specialization's (checksums recomputed).
        let mut odd = compiled.clone();
        odd.entry = "k__BLOCK_128__w2".into();
        c.store(&k, &odd).unwrap();
        assert!(matches!(c.load(&k), Lookup::Rejected(w) if w.contains("inconsistent")));
        // Another key's file under this name.
        let k2 = key("kernel c() {}");
        c.store(&k2, &kernel(128)).unwrap();
        std::fs::copy(c.path(&k2), &path).unwrap();
        assert!(matches!(c.load(&k), Lookup::Rejected(w) if w.contains("another key")));
        // Another compiler build: another key, so a miss (its entry is never read).
        let other = CacheKey::new("kernel b() {}", "k<T=f32>;warps=4", "sm_90a", "0.1.0+ffff");
        assert_eq!(c.load(&other), Lookup::Miss);
        // Rebuilt after a rejection; an entry the caller could not use is removed.
        c.store(&k, &compiled).unwrap();
        assert_eq!(c.load(&k), Lookup::Hit(Box::new(compiled)));
        c.remove(&k);
        assert_eq!(c.load(&k), Lookup::Miss);
    }

    #[test]
    fn inventory_prune_and_clear_sort_entries_by_compiler_build() {
        let dir = temp_dir("prune");
        let c = DiskCache::new(&dir);
        let (this, other) = ("0.1.0+aaaa", "0.1.0+bbbb");
        assert_eq!(
            c.inventory(this).unwrap(),
            Inventory::default(),
            "no directory yet"
        );
        let at = |src: &str, compiler: &str| {
            let k = CacheKey::new(src, "k<T=f32>;warps=4", "sm_90a", compiler);
            c.store(&k, &kernel(64)).unwrap();
            k
        };
        let mine = [at("kernel a() {}", this), at("kernel b() {}", this)];
        let theirs = at("kernel a() {}", other);
        std::fs::write(dir.join("0badc0de.kgk"), b"not an entry").unwrap();
        std::fs::write(dir.join("0123.kgbin"), b"KGENCUBIN1\n").unwrap();
        let fresh_tmp = dir.join(format!(".{}.999.tmp", mine[0].hash));
        std::fs::write(&fresh_tmp, b"half a write").unwrap();
        let stale_tmp = dir.join(format!(".{}.998.tmp", mine[1].hash));
        std::fs::write(&stale_tmp, b"left by a crash").unwrap();
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&stale_tmp)
            .and_then(|f| f.set_modified(hour_ago))
            .unwrap();
        std::fs::write(dir.join(TUNING_FILE_NAME), b"{}").unwrap();
        std::fs::write(dir.join("notes.txt"), b"not ours").unwrap();
        let size = |k: &CacheKey| std::fs::metadata(c.path(k)).unwrap().len();

        let inv = c.inventory(this).unwrap();
        assert_eq!(inv.current.files, 2);
        assert_eq!(inv.current.bytes, size(&mine[0]) + size(&mine[1]));
        assert_eq!(
            inv.other_builds,
            FileCount {
                files: 1,
                bytes: size(&theirs)
            }
        );
        assert_eq!(
            inv.unusable.files, 4,
            "bad magic, the old format, two temporary files"
        );
        // The other build sees the same files the other way round.
        let inv_other = c.inventory(other).unwrap();
        assert_eq!(
            (inv_other.current.files, inv_other.other_builds.files),
            (1, 2)
        );

        let removed = c.prune(this).unwrap();
        assert_eq!(removed.current, FileCount::default());
        assert_eq!(removed.other_builds.files, 1);
        assert_eq!(
            removed.unusable.files, 3,
            "a fresh temporary file may be a write in progress"
        );
        assert!(fresh_tmp.exists() && !stale_tmp.exists());
        assert!(
            matches!(c.load(&mine[0]), Lookup::Hit(_)),
            "this build's entries stay"
        );
        assert_eq!(c.load(&theirs), Lookup::Miss);
        let inv = c.inventory(this).unwrap();
        assert_eq!(
            (
                inv.current.files,
                inv.other_builds.files,
                inv.unusable.files
            ),
            (2, 0, 1)
        );

        let removed = c.clear(this).unwrap();
        assert_eq!(
            (removed.current.files, removed.unusable.files),
            (2, 1),
            "clear counts by class too"
        );
        assert_eq!(c.inventory(this).unwrap(), Inventory::default());
        assert!(dir.join(TUNING_FILE_NAME).exists() && dir.join("notes.txt").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unwritable_directory_is_an_error_not_a_panic() {
        let d = temp_dir("ro");
        std::fs::create_dir_all(d.parent().unwrap()).unwrap();
        std::fs::write(&d, b"a file where the directory should be").unwrap();
        let c = DiskCache::new(&d);
        let k = key("x");
        assert!(c.store(&k, &kernel(64)).is_err());
        assert!(!matches!(c.load(&k), Lookup::Hit(_)));
        let _ = std::fs::remove_file(&d);
    }
}
