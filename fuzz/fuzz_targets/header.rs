//! Fuzz target: arbitrary bytes as a `.safetensors` file, loaded buffered and mapped.
//!
//! Never panics; both strategies agree; a file that loads is also accepted by
//! the reference parser, with the same bytes for every tensor.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = safeload_fuzz::scratch("header").join("model.safetensors");
    std::fs::write(&path, data).expect("writing the input");
    let results = safeload_fuzz::load_both(&path);
    if let Some(loaded) = safeload_fuzz::check_agreement(results) {
        safeload_fuzz::check_against_reference(data, &loaded);
    }
});
