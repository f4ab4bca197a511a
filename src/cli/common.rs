//! Helpers shared by the subcommands: argument parsers, source loading, diagnostics
//! output, stdout writing that survives a closed pipe, and opening the GPU.

use super::SpecArgs;
use kgen::core::front::ast;
use kgen::core::target::MAX_GRID;
use kgen::core::{Arch, CompileOptions, Diagnostics, SourceFile};
use kgen::runtime::{Gpu, RuntimeError};
use std::io::{IsTerminal, Write};
use std::path::Path;

/// How a subcommand fails.
#[derive(Debug)]
pub enum CliError {
    /// Printed as `error: <message>`, exit status 1.
    Msg(String),
    /// Already reported (diagnostics, a failed table); exit with this status.
    Exit(i32),
}

impl From<String> for CliError {
    fn from(s: String) -> CliError {
        CliError::Msg(s)
    }
}

pub type CliResult = Result<(), CliError>;

fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

fn split_name_value<'a>(
    s: &'a str,
    what: &str,
    example: &str,
) -> Result<(&'a str, &'a str), String> {
    let Some((name, value)) = s.split_once('=') else {
        return Err(format!("expected {what}, e.g. `{example}`"));
    };
    let (name, value) = (name.trim(), value.trim());
    if !is_ident(name) {
        return Err(format!(
            "`{name}` is not a parameter name (expected {what}, e.g. `{example}`)"
        ));
    }
    if value.is_empty() {
        return Err(format!("no value after `{name}=` (e.g. `{example}`)"));
    }
    Ok((name, value))
}

/// `-D NAME=VALUE`.
pub fn parse_define(s: &str) -> Result<(String, String), String> {
    let (n, v) = split_name_value(s, "NAME=VALUE", "BLOCK=1024")?;
    Ok((n.to_string(), v.to_string()))
}

/// `--align TENSOR=BYTES`.
pub fn parse_align(s: &str) -> Result<(String, u32), String> {
    let (n, v) = split_name_value(s, "TENSOR=BYTES", "x=4")?;
    match v.parse::<u32>() {
        Ok(b @ (1 | 2 | 4 | 8 | 16)) => Ok((n.to_string(), b)),
        _ => Err(format!(
            "alignment `{v}` for `{n}`: expected 1, 2, 4, 8 or 16 bytes"
        )),
    }
}

/// `--arg NAME=SPEC`.
pub fn parse_arg_spec(s: &str) -> Result<(String, String), String> {
    let (n, v) = split_name_value(s, "NAME=SPEC", "x=1000x4097")?;
    Ok((n.to_string(), v.to_string()))
}

/// `--input NAME=FILE.npy`.
pub fn parse_input(s: &str) -> Result<(String, std::path::PathBuf), String> {
    let (n, v) = split_name_value(s, "NAME=FILE.npy", "x=x.npy")?;
    Ok((n.to_string(), std::path::PathBuf::from(v)))
}

pub fn parse_arch(s: &str) -> Result<Arch, String> {
    s.parse::<Arch>()
}

/// `--grid X[,Y,Z]`: 1 to 3 block counts, each at least 1 and within the launch limits
/// ([`MAX_GRID`], the GPU's; the interpreter keeps them too).
pub fn parse_grid(s: &str) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = s.split([',', 'x']).map(str::trim).collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(format!(
            "grid `{s}`: expected 1 to 3 block counts, e.g. `64` or `8,4`"
        ));
    }
    let mut g = [1u32; 3];
    for (i, p) in parts.iter().enumerate() {
        let n = p
            .parse::<u64>()
            .map_err(|_| format!("grid `{s}`: `{p}` is not a block count (a positive integer)"))?;
        if n == 0 {
            return Err(format!(
                "grid `{s}`: axis {i} has 0 blocks; a launch needs at least 1 block along \
                 each axis (an empty grid would run nothing and leave the outputs unwritten)"
            ));
        }
        if n > MAX_GRID[i] as u64 {
            return Err(format!(
                "grid `{s}`: axis {i} has {n} blocks; a launch allows at most {} along axis {i} \
                 (the limits are {}, {}, {})",
                MAX_GRID[i], MAX_GRID[0], MAX_GRID[1], MAX_GRID[2]
            ));
        }
        g[i] = n as u32;
    }
    Ok(g)
}

/// Reads a `.kg` file; the name shown in diagnostics is the path as given.
pub fn read_source(path: &Path) -> Result<SourceFile, CliError> {
    if path.is_dir() {
        return Err(CliError::Msg(format!(
            "`{}` is a directory, not a .kg file",
            path.display()
        )));
    }
    let bytes = std::fs::read(path)
        .map_err(|e| CliError::Msg(format!("cannot read `{}`: {e}", path.display())))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        CliError::Msg(not_utf8(
            &path.display().to_string(),
            e.as_bytes(),
            e.utf8_error(),
        ))
    })?;
    Ok(SourceFile::new(path.display().to_string(), text))
}

/// Where the first invalid byte of a non-UTF-8 file is: `file:line:col`, the byte and
/// its offset (lines and columns count from 1, columns in characters).
fn not_utf8(name: &str, bytes: &[u8], e: std::str::Utf8Error) -> String {
    let at = e.valid_up_to();
    // The prefix before `at` is valid UTF-8 by definition of `valid_up_to`.
    let before = std::str::from_utf8(&bytes[..at]).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let what = match e.error_len() {
        Some(n) => {
            let bad: Vec<String> = bytes[at..at + n]
                .iter()
                .map(|b| format!("0x{b:02X}"))
                .collect();
            format!("byte {} at offset {at} is not valid UTF-8", bad.join(" "))
        }
        None => format!("the file ends inside a UTF-8 sequence that starts at byte offset {at}"),
    };
    format!("{name}:{line}:{col}: not UTF-8 text: {what} (kgen reads .kg files as UTF-8; re-save the file as UTF-8)")
}

/// Whether to colour stderr.
pub fn color_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Renders diagnostics for stderr (coloured on a terminal).
pub fn render_diags(d: &Diagnostics, file: &SourceFile) -> String {
    if color_stderr() {
        d.render_color(file)
    } else {
        d.render(file)
    }
}

pub fn print_diags(d: &Diagnostics, file: &SourceFile) {
    let text = render_diags(d, file);
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = err.write_all(b"\n");
    }
}

/// Writes a line to stdout; a closed pipe (`| head`) is not an error worth a panic.
pub fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A repeated `-D NAME=...` or `--align NAME=...`: an error naming both values (the
/// compiler would take the last one; a script that sets a value twice has a bug).
pub fn check_repeats(spec: &SpecArgs) -> Result<(), CliError> {
    for (i, (n, v)) in spec.defines.iter().enumerate() {
        if let Some((_, first)) = spec.defines[..i].iter().find(|(m, _)| m == n) {
            return Err(CliError::Msg(format!(
                "`-D {n}` is given twice: `-D {n}={first}` and `-D {n}={v}`; give each \
                 compile-time parameter once"
            )));
        }
    }
    for (i, (n, v)) in spec.aligns.iter().enumerate() {
        if let Some((_, first)) = spec.aligns[..i].iter().find(|(m, _)| m == n) {
            return Err(CliError::Msg(format!(
                "`--align {n}` is given twice: `--align {n}={first}` and `--align {n}={v}`; \
                 give each tensor's alignment once"
            )));
        }
    }
    Ok(())
}

fn tensor_names(k: &ast::Kernel) -> Vec<&str> {
    k.params
        .iter()
        .filter(|p| matches!(p.ty, ast::ParamType::Tensor(_)))
        .map(|p| p.name.name.as_str())
        .collect()
}

/// Whether kernel `k` has a tensor parameter `name`.
pub fn has_tensor(k: &ast::Kernel, name: &str) -> bool {
    tensor_names(k).contains(&name)
}

/// Every `--align NAME` must name a tensor parameter of one of `kernels` (the kernels
/// the command compiles); otherwise an error listing their tensor parameters.
pub fn check_align_names(spec: &SpecArgs, kernels: &[&ast::Kernel]) -> Result<(), CliError> {
    for (name, bytes) in &spec.aligns {
        if kernels.iter().any(|k| has_tensor(k, name)) {
            continue;
        }
        let scalar_of = kernels.iter().find(|k| {
            k.params
                .iter()
                .any(|p| &p.name.name == name && matches!(p.ty, ast::ParamType::Scalar(_)))
        });
        let lists: Vec<String> = kernels
            .iter()
            .map(|k| {
                let t = tensor_names(k);
                let t = if t.is_empty() {
                    "none".to_string()
                } else {
                    t.join(", ")
                };
                if kernels.len() == 1 {
                    format!("its tensor parameters: {t}")
                } else {
                    format!("`{}`: {t}", k.name.name)
                }
            })
            .collect();
        let head = match (scalar_of, kernels) {
            (Some(k), _) => format!(
                "`--align {name}={bytes}`: `{name}` is a scalar parameter of kernel `{}`; \
                 --align takes a tensor parameter",
                k.name.name
            ),
            (None, [k]) => format!(
                "`--align {name}={bytes}`: kernel `{}` has no tensor parameter `{name}`",
                k.name.name
            ),
            (None, _) => format!(
                "`--align {name}={bytes}`: no kernel in the file has a tensor parameter `{name}`"
            ),
        };
        let sep = if kernels.len() == 1 {
            " ("
        } else {
            " (tensor parameters: "
        };
        return Err(CliError::Msg(format!("{head}{sep}{})", lists.join("; "))));
    }
    Ok(())
}

/// The kernel a compile of `opts.kernel` would take (the named one, else the first),
/// when there is one; the compiler reports the other case (E0205).
pub fn selected_kernel<'m>(module: &'m ast::Module, name: Option<&str>) -> Option<&'m ast::Kernel> {
    match name {
        Some(n) => module.kernels.iter().find(|k| k.name.name == n),
        None => module.kernels.first(),
    }
}

/// Compile options for one kernel command (`compile`, `run`), after the checks the
/// compiler cannot make (a repeated `-D` or `--align`, `--align` naming no tensor).
/// A source that does not parse, or names no such kernel, passes here and is reported
/// by the compiler with its diagnostics.
pub fn checked_options(
    file: &SourceFile,
    arch: Arch,
    spec: &SpecArgs,
) -> Result<CompileOptions, CliError> {
    check_repeats(spec)?;
    // Only `--align` names need the kernel's parameters: without one, the file is parsed
    // once, by the compile.
    if spec.aligns.is_empty() {
        return Ok(options(arch, spec));
    }
    if let Ok(module) = kgen::core::front::parse(file) {
        if let Some(k) = selected_kernel(&module, spec.kernel.as_deref()) {
            check_align_names(spec, &[k])?;
        }
    }
    Ok(options(arch, spec))
}

/// Compile options from the shared specialization arguments.
pub fn options(arch: Arch, spec: &SpecArgs) -> CompileOptions {
    let mut o = CompileOptions::new(arch);
    o.kernel = spec.kernel.clone();
    o.defines = spec.defines.clone();
    o.num_warps = spec.warps;
    o.min_blocks_per_sm = spec.min_blocks_per_sm;
    o.num_stages = spec.stages;
    o.no_tma = spec.no_tma;
    o.ws = spec.ws;
    o.tma_store = spec.tma_store;
    o.multicast = spec.multicast;
    o.pingpong = spec.pingpong;
    o.tensor_align = spec.aligns.clone();
    o
}

/// Opens GPU 0, or says why there is no usable one.
pub fn open_gpu() -> Result<Gpu, String> {
    match Gpu::new(0) {
        Ok(g) => {
            if g.arch().is_none() {
                return Err(format!("found {}", g.info()));
            }
            Ok(g)
        }
        Err(RuntimeError::NoDriver(m)) => Err(m),
        Err(e) => Err(e.to_string()),
    }
}

/// `1.234e-5`, or `-` for a missing value.
pub fn fmt_err(v: Option<f64>) -> String {
    match v {
        None => "-".to_string(),
        Some(0.0) => "0".to_string(),
        Some(x) if x.is_infinite() => "inf".to_string(),
        Some(x) if x.is_nan() => "nan".to_string(),
        Some(x) => format!("{x:.2e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(
            parse_define("BLOCK=1024"),
            Ok(("BLOCK".into(), "1024".into()))
        );
        assert_eq!(parse_define(" T = bf16 "), Ok(("T".into(), "bf16".into())));
        assert!(parse_define("BLOCK").is_err());
        assert!(parse_define("1X=3").is_err());
        assert!(parse_define("X=").is_err());
        assert_eq!(parse_align("x=4"), Ok(("x".into(), 4)));
        assert!(parse_align("x=3").is_err());
        assert_eq!(parse_grid("64"), Ok([64, 1, 1]));
        assert_eq!(parse_grid("2147483647"), Ok([i32::MAX as u32, 1, 1]));
        assert_eq!(parse_grid("1,65535,65535"), Ok([1, 65535, 65535]));
        for bad in [
            "0",
            "4,0",
            "1,1,0",
            "2147483648",
            "1,65536",
            "1,1,65536",
            "99999999999",
        ] {
            let e = parse_grid(bad).unwrap_err();
            assert!(
                e.contains("axis") || e.contains("not a block count"),
                "{bad}: {e}"
            );
        }
        assert_eq!(parse_grid("8,4"), Ok([8, 4, 1]));
        assert_eq!(parse_grid("2,3,4"), Ok([2, 3, 4]));
        assert!(parse_grid("1,2,3,4").is_err());
        assert!(parse_grid("-1").is_err());
        assert!(parse_grid("").is_err());
        assert_eq!(
            parse_arg_spec("x=1000x4097"),
            Ok(("x".into(), "1000x4097".into()))
        );
        assert!(parse_arch("sm_70").is_err());
        assert!(parse_arch("sm_90").unwrap_err().contains("sm_90a"));
        assert_eq!(fmt_err(Some(1.5e-7)), "1.50e-7");
        assert_eq!(fmt_err(None), "-");
    }

    #[test]
    fn non_utf8_names_the_first_bad_byte() {
        let bytes = b"kernel k() {\n  // caf\xC3\xA9 \xFF\n}".to_vec();
        let e = String::from_utf8(bytes.clone()).unwrap_err();
        let m = not_utf8("k.kg", &bytes, e.utf8_error());
        // Line 2; column 11 counts the two-byte `é` as one character; offset 24.
        let off = bytes.iter().position(|&b| b == 0xFF).unwrap();
        assert!(
            m.starts_with(&format!(
                "k.kg:2:11: not UTF-8 text: byte 0xFF at offset {off} "
            )),
            "{m}"
        );
        let cut = b"ok\xE2\x82".to_vec();
        let e = String::from_utf8(cut.clone()).unwrap_err();
        let m = not_utf8("c.kg", &cut, e.utf8_error());
        assert!(
            m.starts_with("c.kg:1:3: not UTF-8 text: the file ends inside"),
            "{m}"
        );
    }
}
