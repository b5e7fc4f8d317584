//! An RDMA link's accounting of the peer's immediate data: lengths, reports, credits.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jaccl::fuzzing::rdma_immediates(data));
