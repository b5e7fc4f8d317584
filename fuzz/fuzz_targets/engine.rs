//! One rank's collective run by the real engine over links that deliver the input as its peers' bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jaccl::fuzzing::engine(data));
