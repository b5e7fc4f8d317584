//! jaccl's C interface: `include/jaccl.h` (generated from this crate by cbindgen and compared
//! with it by `tests/header.rs`), built as `libjaccl.so` and `libjaccl.a`.
//!
//! Thin over `jaccl::Group`'s byte-level (`_raw`) methods: every entry point checks its
//! arguments (null, misaligned or too short buffers, unknown element types and reductions:
//! `JACCL_INVALID_ARGUMENT`), builds the operation as a closure over the caller's buffers
//! (`calls`), and runs it at once, on the group's progress thread (the `_start` forms,
//! `requests`), or at the end of a batch (`batch`). No panic crosses into C: every entry
//! point runs under `errors::guard`, which turns one into `JACCL_INTERNAL_ERROR`.
//!
//! Names are C's (`jaccl_comm_t`, `JACCL_SUCCESS`), so the header reads like a C header.
#![allow(non_camel_case_types)]

pub mod batch;
mod buffers;
mod calls;
pub mod collectives;
pub mod comm;
pub mod config;
pub mod errors;
mod operation;
mod pending;
pub mod point_to_point;
pub mod requests;
pub mod rooted;
pub mod types;
