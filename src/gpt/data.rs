//! The GPT's data: bytes of real text, split into training and validation parts, cut into
//! random windows; and the `.npy` files the PyTorch twin (`bench/gpt_torch.py`) reads.
//!
//! The default corpus needs no download: the Python standard library's `.py` files on
//! this machine (`python3`'s `sysconfig` stdlib path without `site-packages`, else the
//! newest `/usr/lib/python3*/`), else this repository's own `src/**/*.rs` and `*.md`
//! (found through the path the crate was built from), else the README compiled into the
//! binary. `--data PATH` takes any file or folder (every file under it, in path order,
//! skipping hidden entries and files with NUL bytes in their first 8 KiB).
//!
//! The split: the text is cut into chunks of `clamp(len / 200, 1 KiB, 1 MiB)` bytes and
//! every 20th chunk (the 20th, 40th, ...) is validation text: 5%, spread over the corpus.

use super::GptError;
use std::path::{Path, PathBuf};

/// At most this many bytes are read from a corpus folder (in path order).
pub const MAX_CORPUS_BYTES: usize = 64 << 20;

/// Training and validation bytes, and where they came from.
#[derive(Clone, Debug)]
pub struct Corpus {
    pub train: Vec<u8>,
    pub val: Vec<u8>,
    /// A one-line description: the path and the number of files.
    pub source: String,
}

impl Corpus {
    /// Splits `text` (see the module docs).
    pub fn from_bytes(text: &[u8], source: impl Into<String>) -> Corpus {
        let chunk = (text.len() / 200).clamp(1024, 1 << 20);
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for (i, c) in text.chunks(chunk).enumerate() {
            if i % 20 == 19 {
                val.extend_from_slice(c);
            } else {
                train.extend_from_slice(c);
            }
        }
        Corpus {
            train,
            val,
            source: source.into(),
        }
    }

    /// Every file under `path` (or `path` itself), in path order, up to
    /// [`MAX_CORPUS_BYTES`]; with `ext`, only files with that extension.
    pub fn from_path(path: &Path, ext: Option<&str>) -> Result<Corpus, GptError> {
        let mut files = Vec::new();
        if path.is_dir() {
            collect(path, ext, &mut files)?;
            files.sort();
        } else if path.is_file() {
            files.push(path.to_path_buf());
        } else {
            return Err(GptError::Data(format!(
                "{}: no such file or folder",
                path.display()
            )));
        }
        let mut text = Vec::new();
        let mut used = 0usize;
        for f in &files {
            if text.len() >= MAX_CORPUS_BYTES {
                break;
            }
            let bytes = std::fs::read(f)
                .map_err(|e| GptError::Data(format!("reading {}: {e}", f.display())))?;
            if bytes[..bytes.len().min(8192)].contains(&0) {
                continue;
            }
            let room = MAX_CORPUS_BYTES - text.len();
            text.extend_from_slice(&bytes[..bytes.len().min(room)]);
            if !text.ends_with(b"\n") {
                text.push(b'\n');
            }
            used += 1;
        }
        if text.is_empty() {
            return Err(GptError::Data(format!("{}: no text files", path.display())));
        }
        let what = format!(
            "{} ({used} file{}, {:.1} MB)",
            path.display(),
            if used == 1 { "" } else { "s" },
            text.len() as f64 / 1e6
        );
        Ok(Corpus::from_bytes(&text, what))
    }

    /// The default corpus (module docs).
    pub fn default_corpus() -> Result<Corpus, GptError> {
        if let Some(dir) = python_stdlib() {
            if let Ok(c) = Corpus::from_path(&dir, Some("py")) {
                return Ok(Corpus {
                    source: format!("the Python standard library: {}", c.source),
                    ..c
                });
            }
        }
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut text = Vec::new();
        let mut files = Vec::new();
        if repo.join("src").is_dir() {
            collect(&repo.join("src"), Some("rs"), &mut files)?;
        }
        if let Ok(rd) = std::fs::read_dir(repo) {
            files.extend(
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "md")),
            );
        }
        files.sort();
        for f in &files {
            if let Ok(b) = std::fs::read(f) {
                text.extend_from_slice(&b);
            }
        }
        if text.len() > 64 * 1024 {
            let what = format!("this repository's sources ({} files)", files.len());
            return Ok(Corpus::from_bytes(&text, what));
        }
        Ok(Corpus::from_bytes(
            include_str!("../../README.md").as_bytes(),
            "kgen's README (compiled into the binary)",
        ))
    }
}

/// The Python standard library's folder, if there is one.
fn python_stdlib() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['stdlib'])",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(p) = out.filter(|p| p.join("os.py").is_file()) {
        return Some(p);
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
                && p.join("os.py").is_file()
        })
        .collect();
    // The newest: python3.12 after python3.9.
    dirs.sort_by_key(|p| {
        let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        n.trim_start_matches("python3.").parse::<u32>().unwrap_or(0)
    });
    dirs.pop()
}

/// Files under `dir` (recursively), skipping hidden entries, `site-packages` and
/// `__pycache__`; with `ext`, only files with that extension.
fn collect(dir: &Path, ext: Option<&str>, out: &mut Vec<PathBuf>) -> Result<(), GptError> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| GptError::Data(format!("reading {}: {e}", dir.display())))?;
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "site-packages" || name == "__pycache__" {
            continue;
        }
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            collect(&p, ext, out)?;
        } else if ft.is_file() && ext.is_none_or(|x| p.extension().is_some_and(|e| e == x)) {
            out.push(p);
        }
    }
    Ok(())
}

/// SplitMix64: the GPT's seeded randomness (initialization, batches, sampling).
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.uniform() * n as f64) as usize).min(n.saturating_sub(1))
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// One batch: `batch` windows of `seq + 1` bytes, as inputs `x` and targets `y` (each
/// `[batch * seq]`, row-major).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub x: Vec<i32>,
    pub y: Vec<i32>,
}

impl Batch {
    /// The windows of `text` starting at `starts`.
    pub fn from_starts(text: &[u8], starts: &[usize], seq: usize) -> Batch {
        let mut b = Batch::default();
        for &s in starts {
            let w = &text[s..s + seq + 1];
            b.x.extend(w[..seq].iter().map(|&c| c as i32));
            b.y.extend(w[1..].iter().map(|&c| c as i32));
        }
        b
    }
}

/// Random training windows.
pub struct Batches<'a> {
    text: &'a [u8],
    batch: usize,
    seq: usize,
    rng: SplitMix,
}

impl<'a> Batches<'a> {
    pub fn new(text: &'a [u8], batch: usize, seq: usize, seed: u64) -> Batches<'a> {
        Batches {
            text,
            batch,
            seq,
            rng: SplitMix::new(seed ^ 0x5eed_ba7c),
        }
    }

    /// The next batch (the text must hold at least `seq + 1` bytes).
    pub fn next_batch(&mut self) -> Batch {
        let room = self.text.len() - self.seq;
        let starts: Vec<usize> = (0..self.batch).map(|_| self.rng.below(room)).collect();
        Batch::from_starts(self.text, &starts, self.seq)
    }
}

/// `count` batches of windows evenly spaced over `text` (the validation set: the same
/// windows at every evaluation).
pub fn fixed_batches(text: &[u8], batch: usize, seq: usize, count: usize) -> Vec<Batch> {
    let windows = batch * count;
    let room = text.len() - seq - 1;
    let starts: Vec<usize> = (0..windows).map(|i| i * room / windows.max(1)).collect();
    starts
        .chunks(batch)
        .map(|s| Batch::from_starts(text, s, seq))
        .collect()
}

/// Writes a little-endian `.npy` file (format 1.0) of `descr` (`<f4`, `<i8`) elements.
fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> Result<(), GptError> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).map_err(|e| GptError::Io(format!("{}: {e}", path.display())))
}

/// `data` as an f32 `.npy` of `shape`.
pub fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), GptError> {
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy(path, "<f4", shape, &bytes)
}

/// `data` as an int64 `.npy` of `shape`.
pub fn write_npy_i64(path: &Path, shape: &[usize], data: &[i64]) -> Result<(), GptError> {
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy(path, "<i8", shape, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_five_percent_and_batches_are_shifted_windows() {
        let text: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let c = Corpus::from_bytes(&text, "t");
        assert_eq!(c.train.len() + c.val.len(), text.len());
        let frac = c.val.len() as f64 / text.len() as f64;
        assert!((0.04..0.06).contains(&frac), "{frac}");
        let mut b = Batches::new(&c.train, 3, 8, 1);
        let x = b.next_batch();
        assert_eq!((x.x.len(), x.y.len()), (24, 24));
        for r in 0..3 {
            assert_eq!(&x.x[r * 8 + 1..r * 8 + 8], &x.y[r * 8..r * 8 + 7]);
        }
        let v = fixed_batches(&c.val, 2, 8, 3);
        assert_eq!(v.len(), 3);
    }

    #[test]
    fn npy_header_is_64_byte_aligned() {
        let dir = std::env::temp_dir().join(format!("kgen-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npy");
        write_npy_f32(&p, &[2, 3], &[1.0; 6]).unwrap();
        let b = std::fs::read(&p).unwrap();
        let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        assert_eq!(b.len(), 10 + hlen + 24);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
