//! Fuzz target: arbitrary bytes as `model.safetensors.index.json` next to two
//! small valid shards, loaded buffered and mapped.
//!
//! Never panics; both strategies agree; an index that loads maps every tensor
//! to a shard holding it, and no tensor is ever read from outside the
//! checkpoint directory (see `safeload_fuzz::index_fixture`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = safeload_fuzz::index_fixture();
    std::fs::write(dir.join("model.safetensors.index.json"), data).expect("writing the input");
    let results = safeload_fuzz::load_both(dir);
    if let Some(loaded) = safeload_fuzz::check_agreement(results) {
        safeload_fuzz::check_index_load(data, &loaded);
    }
});
