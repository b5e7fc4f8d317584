//! Hellos and operation headers as they arrive on data connections.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jaccl::fuzzing::data_connection(data));
