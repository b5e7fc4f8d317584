//! Start-up data: what every rank publishes (JSON), rank 0's table of it, RDMA offers and outcomes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jaccl::fuzzing::startup(data));
