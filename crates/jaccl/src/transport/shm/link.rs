//! A [`Link`] over shared memory: two single-producer byte rings, each in its sender's segment.
//!
//! The sender copies bytes into its ring and publishes the new tail; the receiver offers them
//! to the consumer straight out of the ring (both ends map it twice back to back, so the bytes
//! are contiguous across the ring's end, and the reduction reads them in place) and publishes
//! the new head. Tails and heads only grow (64-bit byte counts), so "something changed since I
//! last looked" is a comparison, which is what [`Link::arm`] checks before a rank sleeps.
//!
//! Who writes what, and what the reader checks (a peer is an authenticated member of the job,
//! but a bug or a hostile member must not make this rank panic or touch memory outside its
//! mappings):
//! - a ring's **tail** is written by its sender only; the receiver checks that it never goes
//!   back and is never more than a ring ahead of the receiver's own head
//!   ([`ShmLink::readable`]);
//! - a ring's **head** is written by its receiver only; the sender checks that it never goes
//!   back and never passes the sender's own tail ([`ShmLink::room`]);
//! - the ring's **bytes** are written by the sender only, before it publishes the tail; the
//!   receiver reads at most what the checked tail covers, at offsets it computes itself.
//!
//! A value that breaks these rules makes the link [`LinkError::Broken`], which the call reports
//! as `Error::Protocol` naming the peer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::event::PollFd;

use super::{Local, Mapping, Peer};
use crate::transport::{Interest, Link, LinkError, Readiness};

/// One wire to one peer on this host.
pub(crate) struct ShmLink {
    local: Arc<Local>,
    peer: Arc<Peer>,
    /// This rank's outgoing ring, and the peer's ring this rank reads.
    tx: usize,
    rx: usize,
    cap: u64,
    /// This rank's copies of the cursors only it writes.
    tail: u64,
    head: u64,
    /// The peer's tail when `try_recv` last found nothing usable, and the peer's head when
    /// `try_send` last found the ring full: readiness means "moved since".
    stalled_tail: u64,
    stalled_head: u64,
    /// The peer's head as last checked: it may never go back.
    seen_head: u64,
    /// Why the peer is gone, once [`Link::arm`] found out.
    gone: Option<String>,
}

impl ShmLink {
    /// The link sending on this rank's ring `tx` and receiving on the peer's ring `rx` (which
    /// must be mapped in `peer`).
    pub(crate) fn new(local: Arc<Local>, peer: Arc<Peer>, tx: usize, rx: usize) -> ShmLink {
        let cap = local.layout.ring_bytes as u64;
        ShmLink {
            local,
            peer,
            tx,
            rx,
            cap,
            tail: 0,
            head: 0,
            stalled_tail: 0,
            stalled_head: 0,
            seen_head: 0,
            gone: None,
        }
    }

    /// The tail (written by the sender) and head (written by the reader) of ring `ring` in the
    /// control page `main`, laid out as `local`'s (every rank's layout is the same).
    fn cursors<'a>(
        local: &Local,
        main: &'a Mapping,
        ring: usize,
    ) -> (&'a AtomicU64, &'a AtomicU64) {
        let (tail, head) = local.layout.ring_cursors(ring);
        (main.atomic_u64(tail), main.atomic_u64(head))
    }

    /// Bytes the peer published and this rank has not consumed: `tail` (the peer's) less this
    /// rank's head, checked.
    fn readable(&self, tail: u64) -> Result<usize, LinkError> {
        match tail.checked_sub(self.head) {
            Some(n) if n <= self.cap => Ok(n as usize),
            _ => Err(LinkError::Broken(format!(
                "the peer's ring tail {tail} is outside 0..={} bytes past this rank's head {}",
                self.cap, self.head
            ))),
        }
    }

    /// Room in this rank's outgoing ring, given the `head` its reader (the peer) published.
    fn room(&self, head: u64) -> Result<usize, LinkError> {
        match self.tail.checked_sub(head) {
            Some(used) if used <= self.cap && head >= self.seen_head => {
                Ok((self.cap - used) as usize)
            }
            _ => Err(LinkError::Broken(format!(
                "the peer's ring head {head} is outside {}..={} (it read bytes this rank never \
                 sent, or went back)",
                self.seen_head, self.tail
            ))),
        }
    }

    /// The error for a peer that will never read or write again.
    fn closed(&self) -> Option<LinkError> {
        self.gone
            .clone()
            .or_else(|| self.peer.departed())
            .map(LinkError::Closed)
    }
}

impl Link for ShmLink {
    fn try_send(&mut self, parts: &[&[u8]]) -> Result<usize, LinkError> {
        if let Some(e) = self.closed() {
            return Err(e);
        }
        let (tail_word, head_word) = Self::cursors(&self.local, &self.local.main, self.tx);
        let head = head_word.load(Ordering::Acquire);
        let room = self.room(head)?;
        self.seen_head = head;
        if room == 0 {
            self.stalled_head = head;
            return Ok(0);
        }
        let ring = &self.local.rings[self.tx];
        let mut sent = 0;
        for part in parts {
            let n = part.len().min(room - sent);
            ring.write(((self.tail + sent as u64) % self.cap) as usize, &part[..n]);
            sent += n;
            if sent == room {
                break;
            }
        }
        if sent > 0 {
            self.tail += sent as u64;
            tail_word.store(self.tail, Ordering::Release);
            self.peer.wake();
        }
        Ok(sent)
    }

    fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<usize, LinkError> {
        let (tail_word, head_word) = Self::cursors(&self.local, &self.peer.main, self.rx);
        let mut tail = tail_word.load(Ordering::Acquire);
        if tail == self.head
            && let Some(e) = self.closed()
        {
            // Whatever it published before leaving is still to be read.
            tail = tail_word.load(Ordering::Acquire);
            if tail == self.head {
                return Err(e);
            }
        }
        let available = self.readable(tail)?;
        let offered = available.min(max);
        let used = match (&self.peer.rings[self.rx], offered) {
            (_, 0) | (None, _) => 0,
            (Some(ring), _) => ring
                .with_bytes((self.head % self.cap) as usize, offered, |bytes| {
                    consume(bytes)
                })
                .min(offered),
        };
        if used == 0 {
            self.stalled_tail = tail;
            return Ok(0);
        }
        self.head += used as u64;
        head_word.store(self.head, Ordering::Release);
        self.peer.wake();
        Ok(used)
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn arm(&mut self, interest: Interest) -> Result<Readiness, LinkError> {
        self.local.arm().map_err(LinkError::Io)?;
        let (tail_word, _) = Self::cursors(&self.local, &self.peer.main, self.rx);
        let (_, head_word) = Self::cursors(&self.local, &self.local.main, self.tx);
        let readable = interest.read && tail_word.load(Ordering::Acquire) != self.stalled_tail;
        let writable = interest.write && head_word.load(Ordering::Acquire) != self.stalled_head;
        if readable || writable {
            return Ok(Readiness::Ready);
        }
        if let Some(why) = self.peer.lost() {
            // The next pass reads what is left, then reports it.
            self.gone = Some(why);
            return Ok(Readiness::Ready);
        }
        Ok(Readiness::Armed)
    }

    fn wait_fds<'a>(&'a self, _interest: Interest, fds: &mut Vec<PollFd<'a>>) {
        let read = Interest {
            read: true,
            write: false,
        };
        fds.push(read.poll_fd(self.local.doorbell.fd()));
        fds.push(self.peer.poll_liveness());
    }

    fn disarm(&mut self) {
        self.local.disarm();
    }
}
