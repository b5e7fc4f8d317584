//! The caller's arrays as byte slices: the one place of the bindings that needs `unsafe`.
//!
//! The Python package (python/jaccl/__init__.py) passes each array as `(address, length)`: the
//! data pointer and byte count of a C-contiguous numpy array that it keeps referenced until the
//! call returns, and that it has checked to be writable where it is written. That works with
//! the stable ABI of every CPython from 3.9 (the buffer protocol joined it only in 3.11), and
//! costs nothing per call. `jaccl._native` is private: its functions trust those addresses.
#![allow(unsafe_code)]

use pyo3::FromPyObject;

/// `(address, length)` of an array's bytes, as the Python package passes it.
#[derive(Debug, Clone, Copy, FromPyObject)]
pub(crate) struct Memory(usize, usize);

impl Memory {
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
    pub(crate) fn bytes<'a>(self) -> &'a [u8] {
        if self.1 == 0 {
            return &[];
        }
        // SAFETY: by the module's contract, `self.0` is a live array of `self.1` bytes held by
        // the package until the native call (the slice's only user) returns; u8 needs no
        // alignment and every byte is valid.
        unsafe { std::slice::from_raw_parts(self.0 as *const u8, self.1) }
    }

    /// The bytes, for writing. Callers make sure no other slice of the call overlaps them
    /// ([`Memory::overlaps`]).
    pub(crate) fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.1 == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the package checked that the array is writable; the
        // native functions take a mutable slice only of ranges no other slice of the same
        // call overlaps, so it is not aliased.
        unsafe { std::slice::from_raw_parts_mut(self.0 as *mut u8, self.1) }
    }
}
