//! `kgen compile` and `kgen check`.

use super::common::{options, print_diags, read_source, say, CliError, CliResult};
use super::{CheckArgs, CompileArgs, Emit};
use kgen::core::{compile_to_ir, front, CompileOptions};
use std::io::Write;

pub fn compile(a: CompileArgs) -> CliResult {
    let file = read_source(&a.file)?;
    let opts = options(a.arch, &a.spec);
    let text = match a.emit {
        Emit::Ir => match compile_to_ir(&file, &opts) {
            Ok((func, _spec)) => format!("{func}"),
            Err(d) => {
                print_diags(&d, &file);
                return Err(CliError::Exit(1));
            }
        },
        Emit::Ptx => match kgen::core::compile(&file, &opts) {
            Ok(k) => k.ptx,
            Err(d) => {
                print_diags(&d, &file);
                return Err(CliError::Exit(1));
            }
        },
    };
    match &a.output {
        Some(path) => std::fs::write(path, text.as_bytes())
            .map_err(|e| CliError::Msg(format!("cannot write `{}`: {e}", path.display()))),
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
                Ok(()) => Ok(()),
                // `kgen compile ... | head`: the reader left; not an error.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                Err(e) => Err(CliError::Msg(format!("writing to stdout: {e}"))),
            }
        }
    }
}

pub fn check(a: CheckArgs) -> CliResult {
    let file = read_source(&a.file)?;
    let module = match front::parse(&file) {
        Ok(m) => m,
        Err(d) => {
            print_diags(&d, &file);
            return Err(CliError::Exit(1));
        }
    };
    let kernels: Vec<(String, Vec<String>)> = module
        .kernels
        .iter()
        .map(|k| {
            (
                k.name.name.clone(),
                k.generics.iter().map(|g| g.name.name.clone()).collect(),
            )
        })
        .collect();
    let selected: Vec<&(String, Vec<String>)> = match &a.spec.kernel {
        Some(name) => {
            let Some(k) = kernels.iter().find(|(n, _)| n == name) else {
                let names: Vec<&str> = kernels.iter().map(|(n, _)| n.as_str()).collect();
                return Err(CliError::Msg(format!(
                    "no kernel `{name}` in `{}` (it has: {})",
                    file.name,
                    names.join(", ")
                )));
            };
            vec![k]
        }
        None => kernels.iter().collect(),
    };
    let mut failed = 0usize;
    for (name, generics) in &selected {
        let mut opts: CompileOptions = options(a.arch, &a.spec);
        opts.kernel = Some(name.clone());
        // A define goes to the kernels that declare it; one that no kernel declares goes
        // to every kernel, so that the checker reports it.
        opts.defines = a
            .spec
            .defines
            .iter()
            .filter(|(d, _)| generics.contains(d) || !kernels.iter().any(|(_, g)| g.contains(d)))
            .cloned()
            .collect();
        if let Err(d) = kgen::core::compile(&file, &opts) {
            print_diags(&d, &file);
            failed += 1;
        }
    }
    if failed > 0 {
        eprintln!(
            "error: {failed} of {} kernel(s) in `{}` failed to compile",
            selected.len(),
            file.name
        );
        return Err(CliError::Exit(1));
    }
    say(format_args!("ok: {} kernel(s)", selected.len()));
    Ok(())
}
