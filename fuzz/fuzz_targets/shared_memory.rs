//! Segment offers and mailbox call descriptions from shared-memory peers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jaccl::fuzzing::shared_memory(data));
