//! Start-up data every rank publishes (JSON): settings, each transport's blob, RDMA offers and outcomes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jaccl::fuzzing::startup(data));
