//! The caller's buffers and arrays: checked (null, misaligned, a byte count that overflows),
//! then lent to an operation as byte slices. With `jaccl_comm_t::from_ptr`, the only place
//! that turns C's pointers into Rust references.
//!
//! The header's contract: a buffer passed to a call holds `count` elements of its type and
//! stays valid, unread and unwritten by anyone else, until the call returns, or, for a
//! `_start` form, until its request completes (or its communicator is destroyed); a batch's,
//! until `jaccl_batch_end` returns.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use crate::errors::{Failure, invalid};

/// Bytes a caller lends an operation: an address and a length (plain numbers, so that an
/// operation holding them can move to the progress thread).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lent {
    addr: usize,
    len: usize,
}

/// What a call's checks name in their messages: its rank and operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site<'a> {
    pub(crate) rank: usize,
    pub(crate) op: &'a str,
}

impl Site<'_> {
    pub(crate) fn invalid(self, why: impl std::fmt::Display) -> Failure {
        invalid(Some(self.rank), self.op, why)
    }
}

impl Lent {
    /// No bytes.
    pub(crate) const NONE: Lent = Lent { addr: 0, len: 0 };

    /// `count` elements of `dtype` at `ptr` (`what`: the argument's name), checked.
    #[inline]
    pub(crate) fn new(
        ptr: *const c_void,
        count: usize,
        dtype: jaccl::Dtype,
        what: &str,
        site: Site<'_>,
    ) -> Result<Lent, Failure> {
        let addr = ptr as usize;
        let Some(len) = count.checked_mul(dtype.size()) else {
            return Err(site.invalid(format!("{what}: {count} elements of {dtype} overflow")));
        };
        if len == 0 {
            return Ok(Lent::NONE);
        }
        if ptr.is_null() {
            return Err(site.invalid(format!("{what} is NULL with {count} elements")));
        }
        let align = crate::types::alignment(dtype);
        if !addr.is_multiple_of(align) {
            let why = format!("{what} ({ptr:p}) is not aligned to {align} bytes, as {dtype} needs");
            return Err(site.invalid(why));
        }
        if addr
            .checked_add(len)
            .is_none_or(|end| end > isize::MAX as usize)
        {
            return Err(site.invalid(format!(
                "{what}: {len} bytes at {ptr:p} pass the address space"
            )));
        }
        Ok(Lent { addr, len })
    }

    pub(crate) fn len(self) -> usize {
        self.len
    }

    /// Whether the two share a byte.
    pub(crate) fn overlaps(self, other: Lent) -> bool {
        self.len > 0
            && other.len > 0
            && self.addr < other.addr + other.len
            && other.addr < self.addr + self.len
    }

    /// Whether both are the same bytes.
    pub(crate) fn same(self, other: Lent) -> bool {
        self.addr == other.addr && self.len == other.len
    }

    /// Copies these bytes over `to`'s (as many as the shorter has), which may overlap them.
    ///
    /// # Safety
    /// Both are lent (the header's contract), and no slice of either lives meanwhile.
    pub(crate) unsafe fn copy_to(self, to: Lent) {
        // SAFETY: both ranges were checked by `Lent::new` and, by the caller's contract, are
        // live; `ptr::copy` allows overlap and makes no references.
        unsafe {
            std::ptr::copy(
                self.addr as *const u8,
                to.addr as *mut u8,
                self.len.min(to.len),
            );
        }
    }

    /// The bytes, for reading.
    ///
    /// # Safety
    /// The buffer is still lent (the header's contract above), and nothing writes it while
    /// the slice lives.
    pub(crate) unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `Lent::new` checked the pointer non-null and the range within the address
        // space; by the caller's contract it is live and unwritten for `'a`. u8 needs no
        // alignment and every byte is a valid u8.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// The bytes, for writing.
    ///
    /// # Safety
    /// As [`Lent::bytes`], and no other slice of these bytes lives meanwhile.
    pub(crate) unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and by the caller's contract the bytes are writable and not
        // aliased for `'a`.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

/// An operation's input: the caller's bytes, or a copy of them made when they overlap the
/// output (the library reads inputs and writes outputs as separate slices).
#[derive(Debug)]
pub(crate) enum Input {
    Lent(Lent),
    Copied(Vec<u8>),
}

impl Input {
    /// `input`, copied now if it overlaps `output`.
    ///
    /// # Safety
    /// `input` is lent (the header's contract).
    pub(crate) unsafe fn apart_from(input: Lent, output: Lent) -> Input {
        match input.overlaps(output) {
            // SAFETY: by the caller's contract, `input` is lent; nothing writes it during
            // this copy (the call has not started).
            true => Input::Copied(unsafe { input.bytes() }.to_vec()),
            false => Input::Lent(input),
        }
    }

    /// The bytes.
    ///
    /// # Safety
    /// As [`Lent::bytes`].
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: by the caller's contract.
            Input::Lent(lent) => unsafe { lent.bytes() },
            Input::Copied(copy) => copy,
        }
    }
}

/// `size` counts (`size_t`) at `ptr`, one per rank.
///
/// # Safety
/// `ptr` is null or points to `size` readable `size_t`s.
pub(crate) unsafe fn counts(
    ptr: *const usize,
    what: &str,
    size: usize,
    site: Site<'_>,
) -> Result<Vec<usize>, Failure> {
    if ptr.is_null() {
        return Err(site.invalid(format!("{what} is NULL")));
    }
    if !(ptr as usize).is_multiple_of(align_of::<usize>()) {
        return Err(site.invalid(format!("{what} ({ptr:p}) is misaligned")));
    }
    // SAFETY: non-null, aligned, and by the caller's contract `size` readable counts.
    Ok(unsafe { std::slice::from_raw_parts(ptr, size) }.to_vec())
}

/// `n` ranks (`int`) at `ptr`, each checked to be one of `size` ranks.
///
/// # Safety
/// `ptr` is null or points to `n` readable ints.
pub(crate) unsafe fn ranks(
    ptr: *const c_int,
    n: usize,
    size: usize,
    site: Site<'_>,
) -> Result<Vec<usize>, Failure> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if ptr.is_null() || !(ptr as usize).is_multiple_of(align_of::<c_int>()) {
        return Err(site.invalid(format!(
            "ranks ({ptr:p}) is NULL or misaligned with {n} ranks"
        )));
    }
    if n > size {
        return Err(site.invalid(format!("{n} ranks, in a communicator of {size}")));
    }
    // SAFETY: non-null, aligned, and by the caller's contract `n` readable ints.
    let given = unsafe { std::slice::from_raw_parts(ptr, n) };
    given.iter().map(|&r| rank(r, size, site)).collect()
}

/// `value` as one of `size` ranks.
pub(crate) fn rank(value: c_int, size: usize, site: Site<'_>) -> Result<usize, Failure> {
    usize::try_from(value)
        .ok()
        .filter(|&r| r < size)
        .ok_or_else(|| site.invalid(format!("rank {value} is not in 0..{size}")))
}
