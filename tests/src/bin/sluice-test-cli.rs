//! The `sluice` command, for tests that run it as a child process.

fn main() -> std::process::ExitCode {
    sluice::cli::main()
}
