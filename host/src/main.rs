//! The `sluice` command; everything but parsing lives in the library (`sluice::cli`).

fn main() -> std::process::ExitCode {
    sluice::cli::main()
}
