//! Join requests, replies and all-gather results of the coordinator's side channel.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| jaccl::fuzzing::side_channel(data));
