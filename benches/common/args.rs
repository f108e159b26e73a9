//! The benchmarks' one option parser: each benchmark declares its flags as a
//! `clap` derive (`#[derive(Parser)]`); this reads the command line into it.

/// Parses this process's arguments into `T`. A usage error prints the usage
/// and exits with code 2; `--help` prints the flags and their defaults.
///
/// `--bench`, which `cargo bench` passes to every benchmark without the test
/// harness, is dropped first.
pub fn parse<T: clap::Parser>() -> T {
    T::parse_from(std::env::args_os().filter(|a| a != "--bench"))
}
