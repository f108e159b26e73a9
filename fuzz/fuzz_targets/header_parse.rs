//! Fuzz target: arbitrary bytes as a `.safetensors` file, given straight to the header parser.
//!
//! No file, no thread, no `/proc`: `safeload::__fuzz::parse_file`, the
//! parser a load calls, against the reference's verdict and reading
//! (`safeload_fuzz::check_parse`): never panics; accepts exactly what
//! `safetensors::SafeTensors::deserialize` accepts but a tensor named twice;
//! on accept, the same tensors, dtypes, shapes, offsets and metadata.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    safeload_fuzz::check_parse(data, safeload::__fuzz::parse_file(data));
});
