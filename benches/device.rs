//! `cargo bench --bench device`: placeholder, written below.
fn main() {}
