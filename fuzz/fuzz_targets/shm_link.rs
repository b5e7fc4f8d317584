//! Two shared-memory links over real segments, one end writing hostile ring cursors.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jaccl::fuzzing::shm_link(data));
