//! The `kgen` command line: compile, check, run and selftest. See `kgen --help`.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
