//! A [`Link`] over one RDMA reliable-connected queue pair.
//!
//! Each side has a byte ring that its peer writes into ([`RING_BYTES`], registered for remote
//! writes, mapped twice back to back so that bytes are contiguous across its end) and a
//! staging ring it sends from. Sending copies the caller's bytes into the staging ring and
//! posts one RDMA write with immediate data of up to [`MAX_MESSAGE`] bytes (never across the
//! ring's end) to the same position of the peer's ring; the immediate data carries the length. The receiver learns of
//! it from the completion (a write with immediate data consumes a posted receive, which needs
//! no buffer) and offers the bytes to the consumer straight out of its ring.
//!
//! Flow control ("credits"): a sender never writes more than the ring holds past the last
//! position the receiver reported consumed, and never posts more messages than the receiver
//! has receives posted ([`RECEIVES`]), so a receive is always waiting for every message. The
//! receiver reposts a receive for each completion and reports, in a control message (a write
//! of no bytes, its immediate data carrying the counts), how many it reposted and how far it
//! consumed, whenever either reaches a quarter of its capacity. Control messages use receives
//! too; data keeps [`RESERVED`] of them back so a report can always go out, and a report
//! causes the peer to report only after a quarter of the receives, so reports do not echo.
//!
//! Waiting: the completion queue is polled (no system call); to sleep, the engine arms it
//! ([`Link::arm`] asks for an event, then polls once more so a completion that arrived in
//! between is not missed) and sleeps on the completion channel's descriptor.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::PollFd;

use super::verbs::{
    Completion, QueuePair, Verbs, WC_RETRY_EXC_ERR, WC_RNR_RETRY_EXC_ERR, WC_SUCCESS,
    WC_WR_FLUSH_ERR, Write,
};
use crate::transport::{Interest, Link, LinkError, Readiness};

/// Bytes of each ring: four of the largest messages in flight.
pub(crate) const RING_BYTES: usize = 4 * MAX_MESSAGE;
/// The most one message carries: the receiver can consume a message only once all of it has
/// landed, so messages are cut to let it start early.
const MAX_MESSAGE: usize = 256 * 1024;
/// Receives each side keeps posted, hence messages a sender may have outstanding.
pub(crate) const RECEIVES: usize = 256;
/// Receives data messages leave for control messages.
const RESERVED: usize = 4;
/// Work requests a side may have posted and not yet seen complete.
pub(crate) const SENDS: usize = RECEIVES + 2 * RESERVED;
/// The `wr_id` of receives; sends count up from 0.
pub(crate) const RECEIVE_ID: u64 = u64::MAX;
/// How long a closing link waits for its goodbye to leave.
const GOODBYE_GRACE: Duration = Duration::from_millis(100);

/// The immediate data of a message: a data length, or a control message.
mod imm {
    /// Set in control messages; data messages carry their length below it.
    pub(super) const CONTROL: u32 = 1 << 31;
    /// In a control message: the sender is closing the link.
    pub(super) const GOODBYE: u32 = 1 << 30;
    const RECEIVES_SHIFT: u32 = 22;
    pub(super) const MAX_RECEIVES: usize = 0xff;
    pub(super) const MAX_BYTES: u64 = (1 << RECEIVES_SHIFT) - 1;

    pub(super) fn control(receives: usize, bytes: u64) -> u32 {
        let receives = receives.min(MAX_RECEIVES) as u32;
        CONTROL | (receives << RECEIVES_SHIFT) | bytes.min(MAX_BYTES) as u32
    }

    /// A control message's (receives reposted, bytes consumed).
    pub(super) fn report(imm: u32) -> (usize, u64) {
        (
            ((imm >> RECEIVES_SHIFT) & MAX_RECEIVES as u32) as usize,
            u64::from(imm) & MAX_BYTES,
        )
    }
}
// One report covers what reaching either threshold takes (more waits for the next report).
const _: () = assert!(RING_BYTES as u64 <= imm::MAX_BYTES && RECEIVES / 4 <= imm::MAX_RECEIVES);

/// A link's byte and message counts, and what the peer's immediate data may change in them.
/// Every count only grows; the peer's words (a data length, a report of consumed bytes and
/// reposted receives) are checked against them before they count, so no value of the peer's
/// can make a count overflow, pass the ring, or grant credits the peer does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Bytes of each ring.
    pub(crate) cap: u64,
    /// Bytes posted, and bytes whose writes completed (staging before it may be reused).
    pub(crate) tail: u64,
    pub(crate) written: u64,
    /// Bytes the peer reported consumed: its ring has room up to `peer_head + cap`.
    pub(crate) peer_head: u64,
    /// Receives the peer has posted for messages from this side.
    pub(crate) credits: usize,
    /// Bytes landed in the incoming ring, and bytes consumed.
    pub(crate) arrived: u64,
    pub(crate) head: u64,
}

/// What a checked message from the peer was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// Bytes that landed in the incoming ring (counted).
    Data,
    /// The peer is closing the link.
    Goodbye,
    /// How far it consumed and how many receives it reposted (counted).
    Report,
}

impl Counts {
    /// Nothing sent or received yet, over rings of `cap` bytes; the peer has posted
    /// [`RECEIVES`] receives.
    pub(crate) fn new(cap: u64) -> Counts {
        Counts {
            cap,
            tail: 0,
            written: 0,
            peer_head: 0,
            credits: RECEIVES,
            arrived: 0,
            head: 0,
        }
    }

    /// Counts a message of the peer's with immediate data `imm`.
    ///
    /// # Errors
    /// [`LinkError::Broken`] for a message without immediate data, a length of 0 or past what
    /// the ring holds beyond this side's head, or a report of more bytes than were sent or
    /// more receives than exist.
    pub(crate) fn receive(&mut self, imm: Option<u32>) -> Result<Incoming, LinkError> {
        let Some(imm) = imm else {
            return Err(broken("a message without immediate data"));
        };
        if imm & imm::CONTROL == 0 {
            let len = u64::from(imm);
            // `arrived - head` is at most `cap`: the sum cannot overflow.
            if len == 0 || self.arrived - self.head + len > self.cap {
                return Err(broken(&format!("the peer wrote {len} bytes past the ring")));
            }
            self.arrived += len;
            Ok(Incoming::Data)
        } else if imm & imm::GOODBYE != 0 {
            Ok(Incoming::Goodbye)
        } else {
            let (receives, bytes) = imm::report(imm);
            if bytes > self.tail - self.peer_head || receives > RECEIVES - self.credits {
                return Err(broken("the peer reported more than was sent"));
            }
            self.peer_head += bytes;
            self.credits += receives;
            Ok(Incoming::Report)
        }
    }
}

/// The immediate data of a control message reporting `receives` reposted receives and
/// `bytes` consumed (for tests and the fuzz target, which play the peer).
#[cfg(feature = "fuzzing")]
pub(crate) fn report_imm(receives: usize, bytes: u64) -> u32 {
    imm::control(receives, bytes)
}

/// Where this link writes: the peer's incoming ring.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerRing {
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
}

/// Why a link stopped working.
#[derive(Debug, Clone)]
enum Failure {
    /// The peer left, vanished or stopped answering.
    Closed(String),
    /// A completion failed for another reason.
    Broken(String),
}

/// One wire to one peer over RDMA: a queue pair with its staging ring (outgoing, local access
/// only) and the ring the peer writes (incoming), which it owns.
pub(crate) struct RdmaLink {
    qp: QueuePair,
    verbs: Arc<Verbs>,
    peer_ring: PeerRing,
    counts: Counts,
    /// Posted sends not yet completed, in order: each one's id and the tail after it.
    sends: VecDeque<(u64, u64)>,
    next_id: u64,
    /// What the peer was last told: consumed bytes, and receives reposted since.
    reported_head: u64,
    reposted: usize,
    /// `arrived` when `try_recv` last offered nothing usable: readiness means "more since".
    stalled_arrived: u64,
    /// A control message came (the first is the hello of [`RdmaLink::greet`]).
    heard: bool,
    failure: Option<Failure>,
}

impl RdmaLink {
    /// A link over `qp` (connected, with [`RECEIVES`] receives posted), sending from its
    /// outgoing region into `peer_ring` and receiving in its incoming one, both rings of the
    /// same size.
    pub(crate) fn new(qp: QueuePair, verbs: Arc<Verbs>, peer_ring: PeerRing) -> RdmaLink {
        let cap = qp.incoming().len() as u64;
        RdmaLink {
            qp,
            verbs,
            peer_ring,
            counts: Counts::new(cap),
            sends: VecDeque::new(),
            next_id: 0,
            reported_head: 0,
            reposted: 0,
            stalled_arrived: 0,
            heard: false,
            failure: None,
        }
    }

    /// Sends the hello that tells the peer this side is connected.
    ///
    /// # Errors
    /// Posting failed.
    pub(crate) fn greet(&mut self) -> Result<(), LinkError> {
        self.post(0, 0, imm::control(0, 0))
    }

    /// Whether the peer's hello arrived and this side's left (its write completed, so the
    /// peer's device acknowledged it): the connection works both ways.
    ///
    /// # Errors
    /// The connection failed.
    pub(crate) fn greeted(&mut self) -> Result<bool, LinkError> {
        self.progress()?;
        Ok(self.heard && self.sends.is_empty())
    }

    /// Posts a write of `len` staged bytes from `offset` (or none) with `imm`.
    fn post(&mut self, offset: u64, len: usize, imm: u32) -> Result<(), LinkError> {
        let id = self.next_id;
        self.qp
            .post_write(Write {
                wr_id: id,
                offset: offset as usize,
                len,
                remote_addr: self.peer_ring.addr + offset,
                rkey: self.peer_ring.rkey,
                imm,
            })
            .map_err(LinkError::Io)?;
        self.next_id += 1;
        self.counts.credits -= 1;
        self.sends.push_back((id, self.counts.tail + len as u64));
        Ok(())
    }

    /// Takes every completion waiting, then reports to the peer if it is time.
    fn progress(&mut self) -> Result<(), LinkError> {
        if self.failure.is_none() {
            let mut batch = [Completion::default(); 16];
            loop {
                let n = self
                    .qp
                    .completions()
                    .poll(&mut batch)
                    .map_err(LinkError::Io)?;
                for c in &batch[..n] {
                    self.complete(c)?;
                }
                if n < batch.len() {
                    break;
                }
            }
            self.report(false)?;
        }
        match &self.failure {
            // Bytes that landed before the failure are still offered; `try_recv` reports it
            // once they are consumed.
            Some(_) if self.counts.arrived > self.counts.head => Ok(()),
            Some(Failure::Closed(why)) => Err(LinkError::Closed(why.clone())),
            Some(Failure::Broken(why)) => Err(LinkError::Broken(why.clone())),
            None => Ok(()),
        }
    }

    fn complete(&mut self, c: &Completion) -> Result<(), LinkError> {
        if c.status != WC_SUCCESS {
            // The first failure explains; the flushes that follow it do not.
            if self.failure.is_none() || c.status != WC_WR_FLUSH_ERR {
                let text = self.verbs.status_text(c.status);
                self.failure.get_or_insert(match c.status {
                    WC_RETRY_EXC_ERR | WC_RNR_RETRY_EXC_ERR => {
                        Failure::Closed(format!("the peer stopped answering over RDMA ({text})"))
                    }
                    WC_WR_FLUSH_ERR => {
                        Failure::Closed(format!("the RDMA connection closed ({text})"))
                    }
                    s => Failure::Broken(format!(
                        "an RDMA completion failed: {text} (status {s}, vendor error {:#x})",
                        c.vendor_err
                    )),
                });
            }
            return Ok(());
        }
        if c.wr_id != RECEIVE_ID {
            let Some((id, tail)) = self.sends.pop_front() else {
                return Err(broken("a completion for a write that was never posted"));
            };
            if id != c.wr_id {
                return Err(broken("writes completed out of order"));
            }
            self.counts.written = tail;
            return Ok(());
        }
        self.qp
            .post_receives(1, RECEIVE_ID)
            .map_err(LinkError::Io)?;
        self.reposted += 1;
        match self.counts.receive(c.imm)? {
            Incoming::Data => {}
            Incoming::Goodbye => {
                self.failure
                    .get_or_insert(Failure::Closed("the peer left the group".into()));
            }
            Incoming::Report => self.heard = true,
        }
        Ok(())
    }

    /// Tells the peer how many receives were reposted and how far this side consumed, when
    /// either reached a quarter of its capacity, or with `now` when any byte was consumed.
    /// (Never for receives alone: each report reposts one on the other side, and two idle
    /// sides would then bounce reports back and forth.)
    fn report(&mut self, now: bool) -> Result<(), LinkError> {
        let consumed = self.counts.head - self.reported_head;
        let due =
            self.reposted >= RECEIVES / 4 || consumed >= self.counts.cap / 4 || now && consumed > 0;
        if !due || self.counts.credits == 0 || self.sends.len() >= SENDS {
            return Ok(());
        }
        let receives = self.reposted.min(imm::MAX_RECEIVES);
        let bytes = consumed.min(imm::MAX_BYTES);
        self.post(
            self.counts.tail % self.counts.cap,
            0,
            imm::control(receives, bytes),
        )?;
        self.reposted -= receives;
        self.reported_head += bytes;
        Ok(())
    }

    /// Whether a data message may be posted now.
    fn can_send(&self) -> bool {
        self.room() > 0 && self.counts.credits > RESERVED && self.sends.len() < SENDS
    }

    /// Bytes that may be written now: room in the peer's ring and in the staging ring.
    fn room(&self) -> u64 {
        let peer = self.counts.cap - (self.counts.tail - self.counts.peer_head);
        let staging = self.counts.cap - (self.counts.tail - self.counts.written);
        peer.min(staging)
    }
}

fn broken(what: &str) -> LinkError {
    LinkError::Broken(format!("RDMA protocol: {what}"))
}

impl Link for RdmaLink {
    fn try_send(&mut self, parts: &[&[u8]]) -> Result<usize, LinkError> {
        self.progress()?;
        match &self.failure {
            Some(Failure::Closed(why)) => return Err(LinkError::Closed(why.clone())),
            Some(Failure::Broken(why)) => return Err(LinkError::Broken(why.clone())),
            None => {}
        }
        if !self.can_send() {
            return Ok(0);
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let start = self.counts.tail % self.counts.cap;
        // A message never crosses the end of the ring: the device writes only the first of
        // the receiver's two copies.
        let len = (total as u64)
            .min(self.room())
            .min(MAX_MESSAGE as u64)
            .min(self.counts.cap - start) as usize;
        if len == 0 {
            return Ok(0);
        }
        let mut at = 0;
        for part in parts {
            let n = part.len().min(len - at);
            self.qp
                .outgoing()
                .memory()
                .write(start as usize + at, &part[..n]);
            at += n;
            if at == len {
                break;
            }
        }
        self.post(start, len, len as u32)?;
        self.counts.tail += len as u64;
        Ok(len)
    }

    fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<usize, LinkError> {
        let progress = self.progress();
        let available = (self.counts.arrived - self.counts.head).min(max as u64) as usize;
        if available == 0 {
            progress?;
            return Ok(0);
        }
        let start = (self.counts.head % self.counts.cap) as usize;
        let used = self
            .qp
            .incoming()
            .memory()
            .with_bytes(start, available, |bytes| consume(bytes))
            .min(available);
        if used == 0 {
            self.stalled_arrived = self.counts.arrived;
            return Ok(0);
        }
        self.counts.head += used as u64;
        if self.failure.is_none() {
            self.report(false)?;
        }
        Ok(used)
    }

    fn in_memory(&self) -> bool {
        // Polling the completion queue reads memory the device writes: no system call.
        true
    }

    fn arm(&mut self, interest: Interest) -> Result<Readiness, LinkError> {
        self.qp.completions().arm().map_err(LinkError::Io)?;
        // A completion that came before the arm raises no event: look once more. Consumed
        // bytes are reported now: this side is about to wait, maybe for bytes the peer cannot
        // send until it hears how far this side got.
        let progressed = self.progress().and_then(|()| self.report(true));
        let ready = progressed.is_err()
            || self.failure.is_some()
            || interest.read
                && self.counts.arrived != self.stalled_arrived
                && self.counts.arrived > self.counts.head
            || interest.write && self.can_send();
        Ok(if ready {
            Readiness::Ready
        } else {
            Readiness::Armed
        })
    }

    fn wait_fds<'a>(&'a self, _interest: Interest, fds: &mut Vec<PollFd<'a>>) {
        let read = Interest {
            read: true,
            write: false,
        };
        fds.push(read.poll_fd(self.qp.fd()));
    }

    fn disarm(&mut self) {
        self.qp.completions().drain_events();
    }
}

impl Drop for RdmaLink {
    /// Says goodbye, so that a peer waiting on this link fails at once instead of waiting for
    /// liveness, and waits briefly for it to leave before the queue pair is destroyed.
    fn drop(&mut self) {
        if self.failure.is_some() || self.counts.credits == 0 || self.sends.len() >= SENDS {
            return;
        }
        let goodbye = imm::CONTROL | imm::GOODBYE;
        if self
            .post(self.counts.tail % self.counts.cap, 0, goodbye)
            .is_err()
        {
            return;
        }
        let deadline = Instant::now() + GOODBYE_GRACE;
        while !self.sends.is_empty() && self.failure.is_none() && Instant::now() < deadline {
            if self.progress().is_err() {
                return;
            }
            std::thread::yield_now();
        }
    }
}
