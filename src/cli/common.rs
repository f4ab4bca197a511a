//! Helpers shared by the subcommands: argument parsers, source loading, diagnostics
//! output, stdout writing that survives a closed pipe, and opening the GPU.

use super::SpecArgs;
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

pub fn parse_arch(s: &str) -> Result<Arch, String> {
    s.parse::<Arch>()
}

/// `--grid X[,Y,Z]`.
pub fn parse_grid(s: &str) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = s.split([',', 'x']).map(str::trim).collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(format!(
            "grid `{s}`: expected 1 to 3 block counts, e.g. `64` or `8,4`"
        ));
    }
    let mut g = [1u32; 3];
    for (i, p) in parts.iter().enumerate() {
        g[i] = p.parse::<u32>().map_err(|_| {
            format!("grid `{s}`: `{p}` is not a block count (a non-negative integer)")
        })?;
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
    let text = String::from_utf8(bytes)
        .map_err(|_| CliError::Msg(format!("`{}` is not UTF-8 text", path.display())))?;
    Ok(SourceFile::new(path.display().to_string(), text))
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

/// Compile options from the shared specialization arguments.
pub fn options(arch: Arch, spec: &SpecArgs) -> CompileOptions {
    let mut o = CompileOptions::new(arch);
    o.kernel = spec.kernel.clone();
    o.defines = spec.defines.clone();
    o.num_warps = spec.warps;
    o.min_blocks_per_sm = spec.min_blocks_per_sm;
    o.num_stages = spec.stages;
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
        assert_eq!(fmt_err(Some(1.5e-7)), "1.50e-7");
        assert_eq!(fmt_err(None), "-");
    }
}
