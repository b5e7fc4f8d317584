//! Links: one connection ("wire") to one peer, driven without blocking.
//!
//! The algorithms in [`crate::algo`] are written once over [`Link`]. Its receive side is shaped
//! like RDMA verbs: data lands in a buffer the link owns (a registered frame for RDMA, a ring in
//! the shared mapping for shared memory, a small staging buffer for TCP) and the algorithm
//! reduces or copies straight out of it. Its send side takes borrowed bytes: TCP hands them to
//! the kernel directly, while transports with their own buffers copy them in and publish them.
//! Measured on loopback TCP, sending from the caller's buffer instead of a frame saved a copy
//! per byte, and receiving into a small reused buffer instead of the caller's buffer halved the
//! kernel's receive cost (see docs/algorithms.md).
//!
//! # Waiting: the readiness interface
//!
//! A link never blocks. When a pass over the lanes moves nothing, the engine waits for the
//! links it needs, with the link telling it how:
//! 1. The engine first re-checks the links for the spin phase of the rank's
//!    [`WaitPolicy`](crate::WaitPolicy): a check costs a load on [`Link::in_memory`] links
//!    (shared memory, RDMA), a `recv` that finds nothing on TCP, far less than sleeping and
//!    being woken across cores. Then it yields the CPU between checks for the yield phase
//!    (at most 50 µs of it on links that need a system call; [`crate::wait`]).
//! 2. [`Link::arm`] prepares to sleep for an [`Interest`]. A link that can already make progress
//!    (bytes arrived or room appeared since it last returned 0, a peer that went away) answers
//!    [`Readiness::Ready`] and the engine does not sleep.
//! 3. Otherwise the engine sleeps in `poll(2)` on every armed link's [`Link::wait_fds`] (a
//!    socket, a shared-memory doorbell, an RDMA completion channel) until one fires or the
//!    deadline passes, then calls [`Link::disarm`] on each and tries again.

use std::io;
use std::os::fd::BorrowedFd;

use rustix::event::PollFd;

pub(crate) mod connector;
pub(crate) mod frame;
pub(crate) mod listener;
pub(crate) mod questions;
pub(crate) mod rdma;
pub(crate) mod shm;
pub(crate) mod tcp;

/// Why a link failed.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// The peer closed or reset the connection, left the group, or its process is gone.
    Closed(String),
    /// Any other operating-system error.
    Io(io::Error),
    /// The transport reported a failure that is neither of the above (an RDMA completion
    /// with an error status): a bug or a broken device, named by its own words.
    Broken(String),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Closed(why) | LinkError::Broken(why) => f.write_str(why),
            LinkError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// What a waiting engine needs from a link: bytes to read, room to write, or both.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interest {
    pub(crate) read: bool,
    pub(crate) write: bool,
}

impl Interest {
    /// Whether anything is wanted at all.
    pub(crate) fn any(self) -> bool {
        self.read || self.write
    }

    /// A poll entry for `fd` with this interest.
    pub(crate) fn poll_fd(self, fd: BorrowedFd<'_>) -> PollFd<'_> {
        crate::os::poll_fd(fd, self.read, self.write)
    }
}

/// The answer of [`Link::arm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// The link can make progress now: do not sleep.
    Ready,
    /// Sleeping on [`Link::wait_fds`] is safe: they fire when the link may progress.
    Armed,
}

/// One connection to one peer. `try_send` and `try_recv` return at once: 0 bytes means "not
/// now", and the caller waits as the [module docs](self) describe before trying again.
pub(crate) trait Link: Send {
    /// Hands the bytes of `parts`, in order, to the transport; returns how many it took. The
    /// caller may reuse the bytes as soon as this returns.
    fn try_send(&mut self, parts: &[&[u8]]) -> Result<usize, LinkError>;

    /// Offers at most `max` received bytes, in order, to `consume`, which returns how many it
    /// used (it may use fewer, e.g. only whole elements; the rest is offered again, followed by
    /// what arrives later). Returns the number used.
    fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<usize, LinkError>;

    /// Receives at most `dst.len()` bytes into `dst`, in order; returns how many. For bytes
    /// that are only copied: a transport may put them there without a stop on the way.
    fn try_recv_into(&mut self, dst: &mut [u8]) -> Result<usize, LinkError> {
        self.try_recv(dst.len(), &mut copying_into(dst))
    }

    /// True when re-checking the link costs no system call: waits on it also yield the CPU
    /// between checks before sleeping (see [`crate::wait`]).
    fn in_memory(&self) -> bool;

    /// Prepares to sleep until the link may progress on `interest`.
    fn arm(&mut self, interest: Interest) -> Result<Readiness, LinkError>;

    /// The descriptors to sleep on while armed for `interest`.
    fn wait_fds<'a>(&'a self, interest: Interest, fds: &mut Vec<PollFd<'a>>);

    /// Undoes [`Link::arm`] after the sleep (or when another link was ready).
    fn disarm(&mut self);
}

/// A consumer for [`Link::try_recv`] that copies what it is offered into `dst`, from its start
/// (`dst` takes at most its length: the caller offers no more).
pub(crate) fn copying_into(dst: &mut [u8]) -> impl FnMut(&[u8]) -> usize + '_ {
    |bytes| {
        crate::reduce::copy(&mut dst[..bytes.len()], bytes);
        bytes.len()
    }
}

/// The place of a link not made yet (to a rank off the ring, made when a call first needs it):
/// every use fails, so a plan that reaches it by mistake fails instead of waiting.
pub(crate) struct Unopened {
    pub(crate) peer: usize,
}

impl Unopened {
    fn error(&self) -> LinkError {
        LinkError::Broken(format!(
            "internal error: no connection to rank {} has been made",
            self.peer
        ))
    }
}

impl Link for Unopened {
    fn try_send(&mut self, _parts: &[&[u8]]) -> Result<usize, LinkError> {
        Err(self.error())
    }

    fn try_recv(
        &mut self,
        _max: usize,
        _consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<usize, LinkError> {
        Err(self.error())
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn arm(&mut self, _interest: Interest) -> Result<Readiness, LinkError> {
        Err(self.error())
    }

    fn wait_fds<'a>(&'a self, _interest: Interest, _fds: &mut Vec<PollFd<'a>>) {}

    fn disarm(&mut self) {}
}
