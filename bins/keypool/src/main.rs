//! The `keypool` command: parse the command line, load the configuration, run.
//!
//! The server itself lives in `keypool-proxy`; this binary only wires things together.

mod cli;
mod demo;
mod document;
mod logbuf;
mod logfmt;
mod logjson;
mod probe;
mod remote;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc's malloc: the request path allocates and frees dozens of
/// small objects per request across two worker threads, where glibc spent ~13 % of the
/// CPU (`docs/BENCHMARKS.md`, issue 22).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let logs = cli::init_logging(cli.log_format, cli.command.default_log_level());
    let code = match cli::execute(cli.command) {
        Ok(code) => code,
        Err(e) => {
            drop(logs);
            eprintln!("keypool: {e:#}");
            return ExitCode::from(cli::exit_code_of(&e));
        }
    };
    drop(logs);
    code
}
