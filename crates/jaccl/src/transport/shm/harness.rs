//! Two shared-memory links of one wire, joined within one process over real sealed segments,
//! and a hand on the cursors each side publishes: for the tests and the fuzz target that play
//! a hostile peer writing any tail or head.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::link::ShmLink;
use super::segment::Layout;
use super::setup::{PeerSpec, map_peer};
use super::{Local, Peer};
use crate::transport::{Link, LinkError};

/// Ranks 0 and 1, joined by one wire: rank 0's right ring to rank 1's left.
pub(crate) struct Pair {
    /// Rank 0's link to rank 1, and rank 1's to rank 0.
    pub(crate) links: [ShmLink; 2],
    locals: [Arc<Local>; 2],
    /// Each rank's view of the other (the segment mapped a second time).
    _peers: [Arc<Peer>; 2],
}

impl Pair {
    /// A pair whose rings hold `ring_bytes` (rounded up to pages).
    ///
    /// # Errors
    /// A segment, mapping or socket cannot be made.
    pub(crate) fn new(ring_bytes: usize) -> std::io::Result<Pair> {
        let layout = Layout::new(1, 2, ring_bytes, 4096);
        let (a, seg_a) = Local::create(layout)?;
        let (b, seg_b) = Local::create(layout)?;
        let (sock_a, sock_b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let door = |l: &Local| l.doorbell.fd().try_clone_to_owned();
        // Rank 0 sends on its ring 1 (right) and reads rank 1's ring 0 (left); rank 1 the
        // mirror.
        let peer_of = |rank, reads, seg: &std::os::fd::OwnedFd, door, sock| {
            let spec = PeerSpec {
                rank,
                name: String::new(),
                reads,
            };
            map_peer(&spec, layout, seg, door, sock).map_err(std::io::Error::other)
        };
        let b_seen_by_a = Arc::new(peer_of(1, vec![0], &seg_b, door(&b)?, sock_a)?);
        let a_seen_by_b = Arc::new(peer_of(0, vec![1], &seg_a, door(&a)?, sock_b)?);
        let (a, b) = (Arc::new(a), Arc::new(b));
        let links = [
            ShmLink::new(Arc::clone(&a), Arc::clone(&b_seen_by_a), 1, 0),
            ShmLink::new(Arc::clone(&b), Arc::clone(&a_seen_by_b), 0, 1),
        ];
        Ok(Pair {
            links,
            locals: [a, b],
            _peers: [b_seen_by_a, a_seen_by_b],
        })
    }

    /// Rank `rank` writes `value` over the tail of the ring it sends on, as a hostile sender.
    pub(crate) fn write_tail(&self, rank: usize, value: u64) {
        let ring = 1 - rank;
        let local = &self.locals[rank];
        let (tail, _) = local.layout.ring_cursors(ring);
        local.main.atomic_u64(tail).store(value, Ordering::Release);
    }

    /// Rank `rank` writes `value` over the head of the ring it reads (in the peer's segment,
    /// which only the reader writes), as a hostile reader.
    pub(crate) fn write_head(&self, rank: usize, value: u64) {
        let peer = &self.locals[1 - rank];
        let ring = rank;
        let (_, head) = peer.layout.ring_cursors(ring);
        peer.main.atomic_u64(head).store(value, Ordering::Release);
    }
}

/// Sends `data` on `link`; the bytes taken.
pub(crate) fn send(link: &mut ShmLink, data: &[u8]) -> Result<usize, LinkError> {
    link.try_send(&[data])
}

/// Receives up to `max` bytes from `link` into `into`; the bytes taken.
pub(crate) fn recv(link: &mut ShmLink, max: usize, into: &mut Vec<u8>) -> Result<usize, LinkError> {
    link.try_recv(max, &mut |bytes| {
        into.extend_from_slice(bytes);
        bytes.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cross_and_hostile_cursors_are_protocol_errors_not_panics() {
        let mut pair = Pair::new(4096).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let (mut sent, mut got) = (0, Vec::new());
        while got.len() < data.len() {
            let [a, b] = &mut pair.links;
            sent += send(a, &data[sent..]).unwrap();
            recv(b, usize::MAX, &mut got).unwrap();
        }
        assert_eq!(got, data);
        // A tail far ahead of what the ring holds, and one behind the reader's head.
        for bad in [u64::MAX, 10_000 + 4096 + 1, 5] {
            pair.write_tail(0, bad);
            let [_, b] = &mut pair.links;
            let e = recv(b, usize::MAX, &mut Vec::new()).unwrap_err();
            assert!(matches!(e, LinkError::Broken(_)), "tail {bad}: {e}");
        }
        // A head past what was sent, or going back.
        let mut pair = Pair::new(4096).unwrap();
        let [a, _] = &mut pair.links;
        assert_eq!(send(a, &[1; 100]).unwrap(), 100);
        for bad in [101, u64::MAX] {
            pair.write_head(1, bad);
            let [a, _] = &mut pair.links;
            let e = send(a, &[1]).unwrap_err();
            assert!(matches!(e, LinkError::Broken(_)), "head {bad}: {e}");
        }
        pair.write_head(1, 50);
        let [a, _] = &mut pair.links;
        send(a, &[1]).unwrap();
        pair.write_head(1, 10);
        let [a, _] = &mut pair.links;
        assert!(matches!(send(a, &[1]), Err(LinkError::Broken(_))));
    }
}
