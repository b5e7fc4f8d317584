//! A TCP link: one connection to one peer.
//!
//! Sockets stay in blocking mode (handy for set-up); the data path passes `MSG_DONTWAIT` on
//! every call, and `MSG_NOSIGNAL` so a closed peer is an error, not a `SIGPIPE` that kills a
//! host program which did not ignore it.

use std::io::{self, IoSlice};
use std::net::{IpAddr, TcpStream};
use std::os::fd::AsFd;

use rustix::event::PollFd;
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};

use crate::error::Result;
use crate::transport::{Interest, Link, LinkError, Readiness};

/// Receive staging per rank, split over its receiving links. Receiving into a small buffer
/// that stays in cache and copying out of it measured 1.5-2× cheaper on loopback than
/// receiving into the caller's (large, cold) buffer; with four ranks sharing a core, 128 KiB
/// per link measured slower than 32-64 KiB, because the staging then no longer fits in L2.
pub(crate) const STAGING_PER_RANK: usize = 128 * 1024;

pub(crate) const MIN_STAGING: usize = 16 * 1024;

/// Staged bytes are kept at this alignment so kernels can view them as any element type.
const STAGING_ALIGN: usize = 16;

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
        if within_host(socket.local_addr()?.ip(), socket.peer_addr()?.ip()) {
            // Not fatal: an administrator may have removed Reno from the allowed algorithms.
            if let Err(e) = rustix::net::sockopt::set_tcp_congestion(&socket, "reno") {
                tracing::debug!(error = %e, "keeping the default congestion control");
            }
        }
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
                if !self.head.is_multiple_of(STAGING_ALIGN) {
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
            match rustix::net::recv(&self.socket, &mut buf[self.tail..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => {
                    return Err(LinkError::Closed(
                        "the connection was closed (end of stream)".into(),
                    ));
                }
                Ok((n, _)) => self.tail += n,
                Err(Errno::AGAIN) => return Ok(0),
                Err(Errno::INTR) => {}
                Err(e) => return Err(classify(e)),
            }
        }
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

/// Whether a connection from `local` to `peer` stays within this host (over the loopback
/// device): the peer is a loopback address or our own. There is no congestion to control there,
/// and the system default may cost throughput: BBR (this machine's default) paces every
/// connection with timers, and 4 ranks all-reducing 32 MiB over loopback took 42-50 ms with it
/// against 36-41 ms with Reno (docs/algorithms.md, "Congestion control within a host"). Links
/// to other hosts keep the administrator's choice.
fn within_host(local: IpAddr, peer: IpAddr) -> bool {
    peer.is_loopback() || peer == local
}

fn classify(e: Errno) -> LinkError {
    match e {
        Errno::PIPE | Errno::CONNRESET | Errno::CONNABORTED | Errno::NOTCONN | Errno::TIMEDOUT => {
            LinkError::Closed(format!("the connection was reset ({e})"))
        }
        _ => LinkError::Io(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn only_connections_within_the_host_count_as_such() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(within_host(ip("127.0.0.1"), ip("127.0.0.1")));
        assert!(within_host(ip("127.0.0.1"), ip("127.0.0.2")));
        assert!(within_host(ip("::1"), ip("::1")));
        assert!(within_host(ip("10.0.0.1"), ip("10.0.0.1")));
        assert!(!within_host(ip("10.0.0.1"), ip("10.0.0.2")));
        assert!(!within_host(ip("fd00::1"), ip("fd00::2")));
    }

    #[test]
    fn loopback_links_use_reno_on_both_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let connected = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let accepted = listener.accept().unwrap().0;
        for socket in [connected, accepted] {
            let link = TcpLink::new(socket, MIN_STAGING).unwrap();
            let algorithm = rustix::net::sockopt::tcp_congestion(&link.socket).unwrap();
            assert_eq!(algorithm, "reno");
        }
    }
}
