//! The bottom layer: what the crate asks of the operating system, with the retries and
//! deadlines every caller needs. It imports nothing of the crate, so every layer may use it.
//!
//! - event counters (eventfd) that one thread signals to wake another that polls them;
//! - `poll(2)` with a time limit, and waiting for one descriptor;
//! - TCP: accepting from a non-blocking listener, connecting with retries until a deadline;
//! - deadlines: instants that saturate instead of overflowing, the time left before one, and
//!   the pause between two attempts to reach a peer that may not be up yet.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

/// A new event counter (an eventfd, non-blocking, closed on exec): one thread [`signal`]s it
/// to wake another that polls it.
pub(crate) fn event_counter() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )?)
}

/// Adds one to the event counter `fd`, making it readable (it only grows: this never blocks).
pub(crate) fn signal(fd: impl AsFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Resets the event counter `fd` after a wake-up.
pub(crate) fn drain(fd: impl AsFd) {
    let _ = rustix::io::read(fd, &mut [0u8; 8]);
}

/// Waits in `poll(2)` until one of `fds` is ready or `limit` passes; returns how many are
/// ready (0 after a timeout or an interrupted wait, which callers treat as a wake-up).
pub(crate) fn poll(fds: &mut [PollFd<'_>], limit: Duration) -> io::Result<usize> {
    let timeout = rustix::time::Timespec::try_from(limit).unwrap_or(rustix::time::Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    });
    match rustix::event::poll(fds, Some(&timeout)) {
        Ok(n) => Ok(n),
        Err(rustix::io::Errno::INTR) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// A poll entry for `fd`, for reading, writing or both.
pub(crate) fn poll_fd(fd: BorrowedFd<'_>, read: bool, write: bool) -> PollFd<'_> {
    let mut flags = PollFlags::empty();
    flags.set(PollFlags::IN, read);
    flags.set(PollFlags::OUT, write);
    PollFd::from_borrowed_fd(fd, flags)
}

/// Waits until `fd` is readable or `limit` passes; returns whether it is readable.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, limit: Duration) -> io::Result<bool> {
    let deadline = deadline_after(limit);
    loop {
        let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
        let left = remaining(deadline);
        if poll(&mut fds, left)? > 0 {
            return Ok(true);
        }
        if left.is_zero() || Instant::now() >= deadline {
            return Ok(false);
        }
    }
}

/// How many connections a listener queues before the kernel drops new ones: enough for a
/// flood of strangers not to crowd out the members while they are accepted.
const BACKLOG: i32 = 1024;

/// A non-blocking TCP listener on `addr` (port 0: an ephemeral one).
///
/// # Errors
/// The address cannot be bound.
pub(crate) fn listen_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Accepts a pending TCP connection on a non-blocking `listener`, if there is one: the stream
/// (blocking) and the peer's address.
///
/// # Errors
/// What accept(2) reports, except that nothing is pending (`Ok(None)`).
pub(crate) fn accept_tcp(listener: &TcpListener) -> io::Result<Option<(TcpStream, String)>> {
    match listener.accept() {
        Ok((stream, from)) => {
            stream.set_nonblocking(false)?;
            Ok(Some((stream, from.to_string())))
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// What to do after accept(2) failed, as its man page says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcceptFailure {
    /// Try again at once: nothing was pending, a signal came, or the error was the pending
    /// connection's (it was aborted or its network failed before it was accepted).
    Retry,
    /// The process or the system is out of descriptors, buffers or memory: wait a moment.
    BackOff,
    /// The listener itself is broken.
    Fatal,
}

/// How to treat `e`, an error of accept(2): Linux passes the pending connection's network
/// errors on (`ECONNABORTED`, `EPROTO`, `ENETDOWN`, `ENOPROTOOPT`, `EHOSTDOWN`, `ENONET`,
/// `EHOSTUNREACH`, `EOPNOTSUPP`, `ENETUNREACH`, to be treated like `EAGAIN`), and running out
/// of descriptors (`EMFILE`, `ENFILE`) or memory (`ENOBUFS`, `ENOMEM`) passes.
pub(crate) fn accept_failure(e: &io::Error) -> AcceptFailure {
    use rustix::io::Errno;
    match Errno::from_io_error(e) {
        Some(
            Errno::AGAIN
            | Errno::INTR
            | Errno::CONNABORTED
            | Errno::PROTO
            | Errno::NETDOWN
            | Errno::NOPROTOOPT
            | Errno::HOSTDOWN
            | Errno::NONET
            | Errno::HOSTUNREACH
            | Errno::OPNOTSUPP
            | Errno::NETUNREACH,
        ) => AcceptFailure::Retry,
        Some(Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM) => AcceptFailure::BackOff,
        _ if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
            AcceptFailure::Retry
        }
        _ => AcceptFailure::Fatal,
    }
}

/// Connects to `addr`, retrying (with back-off up to half a second) until `deadline`: the other
/// side may not be listening yet.
///
/// # Errors
/// The last attempt's error once the deadline passed.
pub(crate) fn connect_with_retry(addr: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    let mut delay = RetryDelay::new();
    loop {
        let left = remaining(deadline);
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "timed out before a connection was made",
            ));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(stream) => return Ok(stream),
            Err(e) if !delay.pause(deadline) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{e} (retried until the timeout)"),
                ));
            }
            Err(_) => {}
        }
    }
}

/// The instant `after` from now, saturating: a duration too long to add (`Duration::MAX`
/// means "no timeout") gives an instant a century away.
pub(crate) fn deadline_after(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

/// Time left until `deadline` (zero once it passed).
pub(crate) fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Time left before `deadline`, as an error once it passed (a zero socket timeout would mean
/// "wait forever").
pub(crate) fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = remaining(deadline);
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
    } else {
        Ok(left)
    }
}

/// Pauses between attempts to reach a peer that may not be up yet: 1 ms, doubling up to
/// half a second, never past a deadline (a peer that starts listening a few milliseconds
/// late is reached at once; one that takes seconds costs a retry per half second).
pub(crate) struct RetryDelay(Duration);

impl RetryDelay {
    pub(crate) fn new() -> RetryDelay {
        RetryDelay(Duration::from_millis(1))
    }

    /// The next pause (1 ms, doubling up to half a second), without sleeping.
    pub(crate) fn next(&mut self) -> Duration {
        let pause = self.0;
        self.0 = (self.0 * 2).min(Duration::from_millis(500));
        pause
    }

    /// Sleeps before the next attempt; false (without sleeping) once `deadline` has passed.
    pub(crate) fn pause(&mut self, deadline: Instant) -> bool {
        let left = remaining(deadline);
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(self.next().min(left));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_saturate_and_event_counters_wake() {
        assert!(deadline_after(Duration::MAX) > Instant::now());
        assert_eq!(remaining(Instant::now()), Duration::ZERO);
        assert!(time_left(Instant::now()).is_err());
        let fd = event_counter().unwrap();
        assert!(!wait_readable(fd.as_fd(), Duration::from_millis(1)).unwrap());
        signal(&fd);
        assert!(wait_readable(fd.as_fd(), Duration::from_secs(5)).unwrap());
        drain(&fd);
        assert!(!wait_readable(fd.as_fd(), Duration::ZERO).unwrap());
    }

    #[test]
    fn accept_errors_are_retried_as_the_man_page_says() {
        let of = |e: Errno| accept_failure(&e.into());
        use rustix::io::Errno;
        for e in [
            Errno::CONNABORTED,
            Errno::PROTO,
            Errno::NETUNREACH,
            Errno::AGAIN,
        ] {
            assert_eq!(of(e), AcceptFailure::Retry, "{e}");
        }
        for e in [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM] {
            assert_eq!(of(e), AcceptFailure::BackOff, "{e}");
        }
        assert_eq!(of(Errno::BADF), AcceptFailure::Fatal);
        assert_eq!(of(Errno::INVAL), AcceptFailure::Fatal);
    }
}
