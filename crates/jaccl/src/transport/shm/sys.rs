//! Every `unsafe` of the shared-memory transport: sealed memfd segments, their mappings, and
//! access to memory that other processes of the job read and write too.
//!
//! A segment is a `memfd`: anonymous memory with no name in any file system, so nothing is
//! left in `/dev/shm` or `/tmp` however the job ends. It is sealed against shrinking and
//! growing before it is handed to a peer, and a peer's segment is only mapped after its seals
//! and size are checked, so no access through a mapping can fault (`SIGBUS`), whatever the peer
//! does later.
//!
//! Concurrency: control words are atomics. Data ranges are plain bytes whose ownership the
//! protocols above hand over with release/acquire on those atomics (a rank writes a range only
//! before publishing it, and peers read it only after seeing it published and before they
//! announce they are done with it). A peer that breaks the protocol can only change the values
//! we read, never make us read or write outside a mapping: peers are authenticated members of
//! the job, trusted with our data as they are over TCP.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// The seals every segment carries: its size is fixed for good.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Creates a sealed segment of `len` bytes (zero-filled; pages are allocated when touched).
pub(crate) fn create_segment(len: usize) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("jaccl", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SEALS)?;
    Ok(fd)
}

/// Checks that a peer's segment is a sealed memfd of exactly `len` bytes.
pub(crate) fn check_segment(fd: BorrowedFd<'_>, len: usize) -> Result<(), String> {
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| format!("not a sealed memfd ({e})"))?;
    if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
        return Err(format!("its size is not sealed (seals {seals:?})"));
    }
    let stat = rustix::fs::fstat(fd).map_err(|e| format!("cannot stat it ({e})"))?;
    if u64::try_from(stat.st_size).ok() != Some(len as u64) {
        return Err(format!("it has {} bytes, expected {len}", stat.st_size));
    }
    Ok(())
}

/// A shared mapping of part of a segment. With `mirrored`, the part is mapped twice back to
/// back, so a ring buffer's bytes are contiguous across its end.
pub(crate) struct Mapping {
    base: NonNull<u8>,
    /// Bytes that may be accessed (twice the part when mirrored).
    len: usize,
}

// SAFETY: a Mapping is plain memory shared with other processes; every access goes through
// atomics or the protocol-guarded copies below, which are as valid from any thread as from the
// one that mapped it.
unsafe impl Send for Mapping {}
// SAFETY: as for Send; `&Mapping` only offers atomics and copies.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset` (both page multiples), readable and writable.
    pub(crate) fn new(fd: BorrowedFd<'_>, offset: usize, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel overlaps nothing of ours; the segment
        // is sealed, so its pages stay valid for the mapping's life.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                offset as u64,
            )?
        };
        Mapping::owning(ptr.cast(), len)
    }

    /// Maps `len` bytes of `fd` from `offset` twice, back to back: byte `i` and byte `i + len`
    /// are the same memory.
    pub(crate) fn mirrored(fd: BorrowedFd<'_>, offset: usize, len: usize) -> io::Result<Mapping> {
        // SAFETY: reserves 2 × len bytes of address space that nothing else uses.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                2 * len,
                ProtFlags::empty(),
                MapFlags::PRIVATE,
            )?
        };
        let mapping = Mapping::owning(base.cast(), 2 * len)?;
        for half in [0, len] {
            // SAFETY: MAP_FIXED replaces pages of our own reservation only (base..base+2len,
            // owned by `mapping`, which unmaps all of it on drop or on this error).
            unsafe {
                rustix::mm::mmap(
                    mapping.base.as_ptr().add(half).cast(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED | MapFlags::FIXED,
                    fd,
                    offset as u64,
                )?;
            }
        }
        Ok(mapping)
    }

    /// The first byte, for registering the mapping with a device (`transport::rdma`).
    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Bytes that may be accessed (twice the part when mirrored).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `len` bytes (a page multiple) of memory of this process that no other process maps;
    /// with `mirrored`, mapped twice back to back like [`Mapping::mirrored`].
    pub(crate) fn private(len: usize, mirrored: bool) -> io::Result<Mapping> {
        let segment = create_segment(len)?;
        let fd = std::os::fd::AsFd::as_fd(&segment);
        if mirrored {
            Mapping::mirrored(fd, 0, len)
        } else {
            Mapping::new(fd, 0, len)
        }
    }

    fn owning(ptr: *mut u8, len: usize) -> io::Result<Mapping> {
        let base = NonNull::new(ptr).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { base, len })
    }

    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "shared-memory access {offset}+{len} outside a mapping of {} bytes",
            self.len
        );
        // SAFETY: in bounds, as just checked.
        unsafe { self.base.as_ptr().add(offset) }
    }

    /// The 8-byte-aligned atomic at `offset`.
    pub(crate) fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8), "unaligned atomic at {offset}");
        // SAFETY: in bounds and aligned; atomics may be shared with any other accessor, and the
        // mapping outlives the borrow.
        unsafe { AtomicU64::from_ptr(self.at(offset, 8).cast()) }
    }

    /// The 4-byte-aligned atomic at `offset`.
    pub(crate) fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4), "unaligned atomic at {offset}");
        // SAFETY: as for atomic_u64.
        unsafe { AtomicU32::from_ptr(self.at(offset, 4).cast()) }
    }

    /// Copies `src` to `offset`. The caller owns that range under the protocol (no peer
    /// accesses it until the caller publishes it).
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        let dst = self.at(offset, src.len());
        // SAFETY: in bounds; no one else accesses the range while we write it (the protocol),
        // and it cannot overlap `src`, a Rust slice (we never hand out slices of a mapping for
        // writing, and this one dies with the call).
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, src.len()) };
        crate::reduce::copy(dst, src);
    }

    /// [`Mapping::write`] with non-temporal stores where the CPU has them (x86-64): the bytes
    /// go to memory instead of this core's cache, and copies in other cores' caches are
    /// dropped without the per-line round trips that ordinary stores to lines another core
    /// holds cost. Faster when readers sit on other core complexes, slower when they share a
    /// cache with the writer; `algo::shared_memory` measures which.
    pub(crate) fn write_streaming(&self, offset: usize, src: &[u8]) {
        let dst = self.at(offset, src.len());
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: as in `write`: in bounds, not aliased, owned by the caller under the
            // protocol; `stream` only touches dst..dst + src.len().
            unsafe { stream(dst, src) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.write(offset, src);
    }

    /// Copies `dst.len()` bytes at `offset` into `dst` (see [`Mapping::with_bytes`]).
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) {
        self.with_bytes(offset, dst.len(), |src| crate::reduce::copy(dst, src));
    }

    /// [`Mapping::read`] with non-temporal stores into `dst` (see [`copy_streaming`]).
    pub(crate) fn read_streaming(&self, offset: usize, dst: &mut [u8]) {
        self.with_bytes(offset, dst.len(), |src| copy_streaming(dst, src));
    }

    /// Runs `f` over `len` bytes at `offset`. The protocol guarantees no one writes them while
    /// `f` runs (see the module docs for a peer that breaks it).
    pub(crate) fn with_bytes<R>(&self, offset: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let ptr = self.at(offset, len);
        // SAFETY: in bounds; the bytes are initialised (a segment starts zero-filled) and not
        // written while the borrow lives, by the protocol.
        f(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

/// Copies `src` into `dst` (the same length) with non-temporal stores where the CPU has them:
/// for destinations far larger than the caches, whose lines would only be read from memory
/// to be overwritten (write-allocate) and then evicted.
pub(crate) fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `dst` is a live mutable slice of `src.len()` bytes, which cannot overlap
        // the shared slice `src`.
        unsafe { stream(dst.as_mut_ptr(), src) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    crate::reduce::copy(dst, src);
}

/// Copies `src` to `dst` with non-temporal 16-byte stores (SSE2, part of x86-64), the
/// unaligned ends with ordinary ones, then fences so the stores are visible before anything
/// the caller publishes next.
///
/// # Safety
/// `dst..dst + src.len()` must be valid for writes and not overlap `src`.
#[cfg(target_arch = "x86_64")]
unsafe fn stream(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let n = src.len();
    let head = dst.align_offset(16).min(n);
    let body = head + (n - head) / 64 * 64;
    // SAFETY: the caller's contract covers dst..dst + n; head and body are within it.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
        for i in (head..body).step_by(64) {
            let s = src.as_ptr().add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let v = [
                _mm_loadu_si128(s),
                _mm_loadu_si128(s.add(1)),
                _mm_loadu_si128(s.add(2)),
                _mm_loadu_si128(s.add(3)),
            ];
            for (k, v) in v.into_iter().enumerate() {
                // `d` is 16-byte aligned (past `head`), as movntdq requires.
                _mm_stream_si128(d.add(k), v);
            }
        }
        std::ptr::copy_nonoverlapping(src.as_ptr().add(body), dst.add(body), n - body);
        _mm_sfence();
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what this Mapping mapped; no borrow of it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The system's page size.
pub(crate) fn page_size() -> usize {
    rustix::param::page_size()
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn mirrored_mappings_wrap_around() {
        let page = page_size();
        let fd = create_segment(3 * page).unwrap();
        check_segment(fd.as_fd(), 3 * page).unwrap();
        assert!(check_segment(fd.as_fd(), 2 * page).is_err());
        let ring = Mapping::mirrored(fd.as_fd(), page, page).unwrap();
        ring.write(page - 2, &[1, 2, 3, 4]);
        ring.with_bytes(0, 2, |b| assert_eq!(b, [3, 4]));
        let plain = Mapping::new(fd.as_fd(), 0, 2 * page).unwrap();
        plain.with_bytes(2 * page - 2, 2, |b| assert_eq!(b, [1, 2]));
        plain
            .atomic_u64(8)
            .store(7, std::sync::atomic::Ordering::Relaxed);
        let data: Vec<u8> = (0..1000).map(|i| i as u8).collect();
        for at in [0, 3, 17, 64] {
            plain.write_streaming(page + at, &data);
            let mut back = vec![0u8; data.len()];
            plain.read(page + at, &mut back);
            assert_eq!(back, data, "streamed at {at}");
        }
        assert!(rustix::fs::ftruncate(&fd, 0).is_err(), "sealed");
    }

    #[test]
    fn unsealed_memory_is_refused() {
        let fd = rustix::fs::memfd_create("other", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        assert!(
            check_segment(fd.as_fd(), 4096)
                .unwrap_err()
                .contains("sealed")
        );
    }
}
