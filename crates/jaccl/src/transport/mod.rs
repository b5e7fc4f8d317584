//! Links: one connection ("wire") to one peer, driven without blocking.
//!
//! The algorithms in [`crate::algo`] are written once over [`Link`]. Its receive side is shaped
//! like RDMA verbs: data lands in a buffer the link owns (a registered frame for RDMA, a slot in
//! the shared mapping for shared memory, a small staging buffer for TCP) and the algorithm
//! reduces or copies straight out of it. Its send side takes borrowed bytes: TCP hands them to
//! the kernel directly, while transports with registered buffers copy them into a free frame and
//! post it. Measured on loopback TCP, sending from the caller's buffer instead of a frame saved
//! a copy per byte, and receiving into a small reused buffer instead of the caller's buffer
//! halved the kernel's receive cost (see docs/algorithms.md).

use std::io;
use std::os::fd::BorrowedFd;

pub(crate) mod tcp;

/// Why a link failed.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// The peer closed or reset the connection.
    Closed(String),
    /// Any other operating-system error.
    Io(io::Error),
}

/// One connection to one peer. All methods return at once: 0 bytes means "not now", and the
/// caller waits for [`Link::fd`] to become readable or writable before trying again.
pub(crate) trait Link: Send {
    /// Hands the bytes of `parts`, in order, to the transport; returns how many it took. The
    /// caller may reuse the bytes as soon as this returns.
    fn try_send(&mut self, parts: &[&[u8]]) -> Result<usize, LinkError>;

    /// Offers at most `max` received bytes, in order, to `consume`, which returns how many it
    /// used (it may use fewer, e.g. only whole elements; the rest is offered again). Returns the
    /// number used.
    fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<usize, LinkError>;

    /// What to wait on when a call returned 0: readable means data, writable means room.
    fn fd(&self) -> BorrowedFd<'_>;
}
