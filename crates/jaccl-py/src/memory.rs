//! The caller's arrays as byte slices: with the one call that takes them (`Group::call` in
//! lib.rs), the only `unsafe` of the bindings.
//!
//! The package's two callers pass each array as `(address, length)`: the data pointer and byte
//! count of C-contiguous memory that they keep referenced until the call returns (for a
//! nonblocking call, the native `Work` holds the references until the operation ends), and
//! that is writable where it is written. They are the numpy API (python/jaccl/__init__.py:
//! `Group._input` and `_output` check contiguity, element type and writability, `_memory`
//! gives the range) and the torch backend (python/jaccl/torch/: `_Tensor` and the staging
//! buffers are contiguous CPU tensors, always writable, `_Group._run` hands their references
//! to the call). That works with the stable ABI of every CPython from 3.9 (the buffer protocol
//! joined it only in 3.11), and costs nothing per call. `jaccl._native` is private: its
//! functions trust those addresses; an input that overlaps the output is refused here (the
//! callers copy such an input first: `jaccl._overlap`).
#![allow(unsafe_code)]

use pyo3::FromPyObject;

/// `(address, length)` of an array's bytes, as the Python package passes it.
#[derive(Debug, Clone, Copy, FromPyObject)]
pub(crate) struct Memory(usize, usize);

impl Memory {
    /// No bytes (the output of a call that writes none).
    pub(crate) const EMPTY: Memory = Memory(0, 0);

    /// The number of bytes.
    pub(crate) fn len(self) -> usize {
        self.1
    }

    /// Whether the two ranges share any byte.
    pub(crate) fn overlaps(self, other: Memory) -> bool {
        self.len() > 0
            && other.len() > 0
            && self.0 < other.0.saturating_add(other.len())
            && other.0 < self.0.saturating_add(self.len())
    }

    /// The bytes, for reading.
    ///
    /// # Safety
    /// `self` must be the `(address, length)` of a live, C-contiguous array that stays
    /// referenced, and that nothing writes, for all of `'a` (the package keeps each array
    /// referenced until the native call that uses it returns).
    pub(crate) unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.1 == 0 {
            return &[];
        }
        // SAFETY: by the caller's contract, `self.0` is a live array of `self.1` bytes that
        // stays referenced and unwritten for `'a`; u8 needs no alignment and every byte is
        // valid.
        unsafe { std::slice::from_raw_parts(self.0 as *const u8, self.1) }
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// As [`Memory::bytes`], and the array must be writable, and no other slice of its bytes
    /// may live during `'a` (callers check [`Memory::overlaps`] against the other buffers of
    /// the call).
    pub(crate) unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.1 == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and by the caller's contract the array is writable and no
        // other slice of these bytes lives for `'a`, so it is not aliased.
        unsafe { std::slice::from_raw_parts_mut(self.0 as *mut u8, self.1) }
    }
}
