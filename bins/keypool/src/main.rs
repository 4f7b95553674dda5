//! The `keypool` command: parse the command line, load the configuration, run.
//!
//! The server itself lives in `keypool-proxy`; this binary only wires things together.

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") | Some("-V") => {
            println!("keypool {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        _ => {
            eprintln!(
                "keypool {}: the server commands (serve, check-config, keygen, demo) are not built yet",
                env!("CARGO_PKG_VERSION")
            );
            std::process::exit(2);
        }
    }
}
