//! `kgen compile` and `kgen check`.

use super::common::{
    check_align_names, check_repeats, checked_options, has_tensor, options, print_diags,
    read_source, say, CliError, CliResult,
};
use super::{CheckArgs, CompileArgs, Emit};
use kgen::core::abi_doc::AbiDoc;
use kgen::core::{compile_to_ir, front, CompileOptions};
use std::io::Write;

pub fn compile(a: CompileArgs) -> CliResult {
    let file = read_source(&a.file)?;
    let opts = checked_options(&file, a.arch, &a.spec)?;
    let text = match a.emit {
        Emit::Ir => match compile_to_ir(&file, &opts) {
            Ok((func, _spec)) => format!("{func}"),
            Err(d) => {
                print_diags(&d, &file);
                return Err(CliError::Exit(1));
            }
        },
        Emit::Ptx | Emit::Abi => match kgen::core::compile(&file, &opts) {
            Ok(k) => {
                for n in &k.notes {
                    eprintln!("note: {n}");
                }
                if a.emit == Emit::Abi {
                    AbiDoc::of(&k).to_json()
                } else {
                    k.ptx
                }
            }
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
    check_repeats(&a.spec)?;
    let module = match front::parse(&file) {
        Ok(m) => m,
        Err(d) => {
            print_diags(&d, &file);
            return Err(CliError::Exit(1));
        }
    };
    let selected: Vec<&front::ast::Kernel> = match &a.spec.kernel {
        Some(name) => module
            .kernels
            .iter()
            .filter(|k| &k.name.name == name)
            .collect(),
        None => module.kernels.iter().collect(),
    };
    if selected.is_empty() {
        // No kernel, or no kernel of that name: the compiler's own error (E0205), worded
        // as `compile` and `run` word it.
        let opts = options(a.arch, &a.spec);
        if let Err(d) = kgen::core::compile(&file, &opts) {
            print_diags(&d, &file);
            return Err(CliError::Exit(1));
        }
        return Err(CliError::Msg(
            "internal: no kernel was selected, yet the compiler found one".into(),
        ));
    }
    check_align_names(&a.spec, &selected)?;
    let mut failed = 0usize;
    for k in &selected {
        let mut opts: CompileOptions = options(a.arch, &a.spec);
        opts.kernel = Some(k.name.name.clone());
        // A define goes to the kernels that declare it; one that no kernel declares goes
        // to every kernel, so that the checker reports it. An alignment goes to the
        // kernels that have such a tensor (every name names one in some kernel).
        let declares =
            |k: &front::ast::Kernel, d: &str| k.generics.iter().any(|g| g.name.name == d);
        opts.defines = a
            .spec
            .defines
            .iter()
            .filter(|(d, _)| declares(k, d) || !module.kernels.iter().any(|m| declares(m, d)))
            .cloned()
            .collect();
        opts.tensor_align = a
            .spec
            .aligns
            .iter()
            .filter(|(n, _)| has_tensor(k, n))
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
