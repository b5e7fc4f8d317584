//! A TCP link: one connection to one peer.
//!
//! Sockets stay in blocking mode (handy for set-up); the data path passes `MSG_DONTWAIT` on
//! every call, and `MSG_NOSIGNAL` so a closed peer is an error, not a `SIGPIPE` that kills a
//! host program which did not ignore it.

use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::AsFd;

use rustix::event::PollFd;
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};

use crate::error::Result;
use crate::transport::{Interest, Link, LinkError, Readiness, copying_into};

/// Receive staging per rank, split over its receiving links: headers, small messages and
/// bytes that are reduced arrive through it, several in one system call; with four ranks
/// sharing a core, 128 KiB per link measured slower than 32-64 KiB, because the staging then
/// no longer fits in L2.
pub(crate) const STAGING_PER_RANK: usize = 128 * 1024;

pub(crate) const MIN_STAGING: usize = 16 * 1024;

/// Received bytes that are only copied (broadcast, gathers, the all-gather half of an
/// all-reduce) go straight into the destination while at least this many are awaited.
/// Measured over TCP on loopback (`jaccl bench --transport tcp`, µs, 3 runs, 2026-12-07,
/// straight in against through the staging): 2 ranks broadcast 32 MiB 1842-1914 against
/// 2838-3033, all-gather 32 MiB 5662-5829 against 8566-9381, all-reduce of f32 32 MiB
/// 10 843-11 913 against 12 888-15 155; 8 ranks broadcast 32 MiB 16 943-17 114 against
/// 23 625-25 321; 64 ranks broadcast 4 MiB 53.6-57.3 ms against 64.6-65.9. (Measured before
/// connections within a host were unpaced, the staging had been the faster: docs/algorithms.md,
/// "Congestion control within a host".)
const DIRECT_MIN: usize = 64 * 1024;

/// Staged bytes are moved back to this alignment so kernels can view them as any element type
/// (the reductions have a slower unaligned path for the rest).
const STAGING_ALIGN: usize = 16;

/// Staged bytes are moved back into alignment only when they are at most this many times what
/// the consumer asks for: small messages that arrive many at a time (the leaves of a tree run
/// ahead) would otherwise move the rest of the staging once per message. Measured over TCP on
/// loopback (`jaccl bench --transport tcp --dtype u8`, µs, 3 interleaved runs, 2026-12-07,
/// moving always against bounded): reduce 8 B 16 ranks 25.5-26.1 against 21.3-22.0, 32 ranks
/// 55-59 against 45-47, 64 ranks 117-123 against 101-105; gather 32 B 32 ranks 52-56 against
/// 43-44. Messages whose lengths are multiples of the alignment never misalign the staging.
const REALIGN_MAX_RATIO: usize = 4;

/// A TCP connection to one peer.
pub(crate) struct TcpLink {
    socket: TcpStream,
    /// Received bytes not yet consumed are `staging[head..tail]`.
    staging: Box<[u128]>,
    head: usize,
    tail: usize,
}

impl TcpLink {
    /// A link over `socket` receiving through `staging` bytes of buffer.
    pub(crate) fn new(socket: TcpStream, staging: usize) -> io::Result<TcpLink> {
        socket.set_nodelay(true)?;
        super::congestion::choose(&socket)?;
        socket.set_nonblocking(false)?;
        socket.set_read_timeout(None)?;
        socket.set_write_timeout(None)?;
        Ok(TcpLink {
            socket,
            staging: vec![0u128; staging.div_ceil(size_of::<u128>())].into_boxed_slice(),
            head: 0,
            tail: 0,
        })
    }
}

impl Link for TcpLink {
    fn try_send(&mut self, parts: &[&[u8]]) -> Result<usize, LinkError> {
        let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
        let mut slices = [IoSlice::new(&[]); 4];
        let mut n = 0;
        for part in parts.iter().filter(|p| !p.is_empty()) {
            if n == slices.len() {
                break;
            }
            slices[n] = IoSlice::new(part);
            n += 1;
        }
        loop {
            let sent = match n {
                0 => return Ok(0),
                1 => rustix::net::send(&self.socket, &slices[0], flags),
                _ => rustix::net::sendmsg(
                    &self.socket,
                    &slices[..n],
                    &mut SendAncillaryBuffer::default(),
                    flags,
                ),
            };
            match sent {
                Ok(sent) => return Ok(sent),
                Err(Errno::AGAIN) => return Ok(0),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(classify(e)),
            }
        }
    }

    fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<usize, LinkError> {
        if max == 0 {
            return Ok(0);
        }
        let buf: &mut [u8] = bytemuck::cast_slice_mut(&mut self.staging);
        loop {
            if self.head < self.tail {
                let staged = self.tail - self.head;
                if !self.head.is_multiple_of(STAGING_ALIGN)
                    && staged <= max.saturating_mul(REALIGN_MAX_RATIO)
                {
                    buf.copy_within(self.head..self.tail, 0);
                    self.tail -= self.head;
                    self.head = 0;
                }
                let offered = (self.tail - self.head).min(max);
                let used = consume(&buf[self.head..self.head + offered]).min(offered);
                self.head += used;
                if self.head == self.tail {
                    self.head = 0;
                    self.tail = 0;
                }
                if used > 0 || offered == max {
                    return Ok(used);
                }
            }
            // The consumer needs more bytes than are staged: read what the kernel has.
            if self.tail == buf.len() {
                buf.copy_within(self.head..self.tail, 0);
                self.tail -= self.head;
                self.head = 0;
            }
            match receive(&self.socket, &mut buf[self.tail..])? {
                0 => return Ok(0),
                n => self.tail += n,
            }
        }
    }

    /// Straight from the kernel into `dst` when nothing is staged and `dst` is large
    /// ([`DIRECT_MIN`]), sparing the copy out of the staging.
    fn try_recv_into(&mut self, dst: &mut [u8]) -> Result<usize, LinkError> {
        if self.head < self.tail || dst.len() < DIRECT_MIN {
            return self.try_recv(dst.len(), &mut copying_into(dst));
        }
        receive(&self.socket, dst)
    }

    fn in_memory(&self) -> bool {
        false
    }

    /// Staged bytes are only left over when the consumer could not use them (part of an
    /// element), so the link can progress only when the kernel has more: always sleep.
    fn arm(&mut self, _interest: Interest) -> Result<Readiness, LinkError> {
        Ok(Readiness::Armed)
    }

    fn wait_fds<'a>(&'a self, interest: Interest, fds: &mut Vec<PollFd<'a>>) {
        fds.push(interest.poll_fd(self.socket.as_fd()));
    }

    fn disarm(&mut self) {}
}

/// What the kernel has for `socket`, up to `buf.len()` bytes, into `buf`, without waiting:
/// how many (0: nothing now).
fn receive(socket: &TcpStream, buf: &mut [u8]) -> Result<usize, LinkError> {
    loop {
        match rustix::net::recv(socket, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => {
                return Err(LinkError::Closed(
                    "the connection was closed (end of stream)".into(),
                ));
            }
            Ok((n, _)) => return Ok(n),
            Err(Errno::AGAIN) => return Ok(0),
            Err(Errno::INTR) => {}
            Err(e) => return Err(classify(e)),
        }
    }
}

fn classify(e: Errno) -> LinkError {
    match e {
        Errno::PIPE | Errno::CONNRESET | Errno::CONNABORTED | Errno::NOTCONN | Errno::TIMEDOUT => {
            LinkError::Closed(format!("the connection was reset ({e})"))
        }
        _ => LinkError::Io(e.into()),
    }
}
