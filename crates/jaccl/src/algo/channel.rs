//! A channel: one link to one peer, with the operation counts that number its headers and
//! the bytes read ahead of the calls that will use them.

use super::call::Call;
use crate::error::{Error, Result};
use rustix::event::PollFd;

use crate::op_header::HEADER_LEN;
use crate::transport::{Interest, Link, LinkError, copying_into};

/// One link to one peer, with the count of operations started on it in each direction (the
/// `seq` of the operation headers), and the bytes read ahead of the calls that will use them.
pub(crate) struct Channel {
    pub(super) link: Box<dyn Link>,
    pub(super) peer: usize,
    pub(super) sent_ops: u32,
    pub(super) received_ops: u32,
    /// Bytes the peer sent that no call has consumed yet, read ahead while this rank was
    /// blocked sending ([`Channel::read_ahead`]); from `early_pos` on they come before the
    /// link's own.
    pub(super) early: Vec<u8>,
    pub(super) early_pos: usize,
    /// The link failed while reading ahead: the call that next receives on it reports that.
    pub(super) read_ahead_failed: bool,
    /// With the direct collectives: whether the peer has entered one this rank has not.
    pub(super) ahead: Option<PeerAhead>,
    /// Bytes handed to the link and taken from it since the group started, for the deadlock
    /// search ([`crate::liveness::Flow`]).
    pub(super) bytes_sent: u64,
    pub(super) bytes_received: u64,
    /// False while the link is a placeholder ([`Channel::unopened`]).
    pub(super) opened: bool,
}

/// Whether the peer of a channel has entered a direct collective this rank has not: a send or
/// receive that waits on it then fails with `Mismatch` (see [`drive`]). `Err`: its stamp is
/// one no honest rank writes, and why (a `Protocol` error).
pub(crate) type PeerAhead = Box<dyn Fn() -> std::result::Result<bool, String> + Send>;

/// The most a pass reads ahead from one channel, so a fast peer cannot keep a pass going.
const READ_AHEAD_PER_PASS: usize = 4 << 20;

/// The most a channel holds read ahead of the calls that will consume it: what ranks that
/// send before they receive (in a cycle) may have in flight to this one. A peer that sends
/// more waits until this rank receives (its bytes stay in the transport), so no peer can make
/// a rank buffer more, whatever it sends.
const READ_AHEAD_MAX: usize = 64 << 20;

impl Channel {
    pub(crate) fn new(link: Box<dyn Link>, peer: usize) -> Channel {
        Channel {
            link,
            peer,
            sent_ops: 0,
            received_ops: 0,
            early: Vec::new(),
            early_pos: 0,
            read_ahead_failed: false,
            ahead: None,
            bytes_sent: 0,
            bytes_received: 0,
            opened: true,
        }
    }

    /// A channel to `peer` whose link is made later ([`Channel::open`]).
    pub(crate) fn unopened(peer: usize) -> Channel {
        Channel {
            opened: false,
            ..Channel::new(Box::new(crate::transport::Unopened { peer }), peer)
        }
    }

    /// Whether the channel waits for its link ([`Channel::unopened`]).
    pub(crate) fn is_open(&self) -> bool {
        self.opened
    }

    /// Gives an unopened channel its link, as new.
    pub(crate) fn open(&mut self, link: Box<dyn Link>) {
        let ahead = self.ahead.take();
        *self = Channel::new(link, self.peer);
        self.ahead = ahead;
    }

    pub(crate) fn peer(&self) -> usize {
        self.peer
    }

    /// Watches the peer's progress in the direct collectives (see [`drive`]).
    pub(crate) fn watch(&mut self, ahead: Option<PeerAhead>) {
        self.ahead = ahead;
    }

    /// The descriptors to sleep on for `interest` (see [`Link::wait_fds`]).
    pub(crate) fn wait_fds<'a>(&'a self, interest: Interest, fds: &mut Vec<PollFd<'a>>) {
        self.link.wait_fds(interest, fds);
    }

    /// The header of the next operation the peer sent on this channel, once all of it has
    /// arrived (read ahead: the call that receives it takes it from there).
    ///
    /// # Errors
    /// The link failed (the peer closed it, say).
    pub(crate) fn peek_header(
        &mut self,
    ) -> std::result::Result<Option<[u8; HEADER_LEN]>, LinkError> {
        let have = self.read_ahead_bytes().len();
        if have < HEADER_LEN {
            self.read_ahead(HEADER_LEN - have)?;
        }
        Ok(self.read_ahead_bytes().first_chunk::<HEADER_LEN>().copied())
    }

    /// Whether re-checking the link costs no system call ([`Link::in_memory`]).
    pub(crate) fn in_memory(&self) -> bool {
        self.link.in_memory()
    }

    /// Whether the peer has entered a direct collective this rank has not ([`Channel::watch`]).
    ///
    /// # Errors
    /// Its stamp is one no honest rank writes (`Protocol`).
    pub(crate) fn peer_ahead(&self, call: &Call) -> Result<bool> {
        let Some(ahead) = &self.ahead else {
            return Ok(false);
        };
        ahead().map_err(|detail| Error::Protocol {
            rank: call.rank,
            peer: self.peer,
            op: call.op,
            detail,
        })
    }

    /// The bytes read ahead and not consumed yet.
    pub(crate) fn read_ahead_bytes(&self) -> &[u8] {
        &self.early[self.early_pos..]
    }

    /// [`Link::try_recv`], offering the bytes read ahead first.
    pub(super) fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> std::result::Result<usize, LinkError> {
        if self.early_pos == self.early.len() {
            let n = self.link.try_recv(max, consume)?;
            self.bytes_received += n as u64;
            return Ok(n);
        }
        let mut offered = (self.early.len() - self.early_pos).min(max);
        let mut used = consume(&self.early[self.early_pos..self.early_pos + offered]);
        if used == 0 && offered < max {
            // The consumer needs more bytes in one piece (a whole element): append the link's.
            self.read_ahead(max - offered)?;
            offered = (self.early.len() - self.early_pos).min(max);
            used = consume(&self.early[self.early_pos..self.early_pos + offered]);
        }
        self.early_pos += used.min(offered);
        if self.early_pos == self.early.len() {
            // Reading ahead is rare: give the memory back rather than keep the largest ever.
            self.early = Vec::new();
            self.early_pos = 0;
        }
        Ok(used)
    }

    /// [`Link::try_recv_into`], the bytes read ahead first.
    pub(super) fn try_recv_into(
        &mut self,
        dst: &mut [u8],
    ) -> std::result::Result<usize, LinkError> {
        if self.early_pos < self.early.len() {
            return self.try_recv(dst.len(), &mut copying_into(dst));
        }
        let n = self.link.try_recv_into(dst)?;
        self.bytes_received += n as u64;
        Ok(n)
    }

    /// Reads up to `limit` bytes the peer has sent into the read-ahead buffer (which holds at
    /// most [`READ_AHEAD_MAX`]), without blocking. Returns how many arrived.
    fn read_ahead(&mut self, limit: usize) -> std::result::Result<usize, LinkError> {
        if self.early_pos > 0 {
            self.early.drain(..self.early_pos);
            self.early_pos = 0;
        }
        let limit = limit.min(READ_AHEAD_MAX.saturating_sub(self.early.len()));
        let mut total = 0;
        while total < limit {
            let early = &mut self.early;
            let n = self.link.try_recv(limit - total, &mut |bytes| {
                early.extend_from_slice(bytes);
                bytes.len()
            })?;
            self.bytes_received += n as u64;
            if n == 0 {
                break;
            }
            total += n;
        }
        Ok(total)
    }

    /// Whether [`Channel::read_ahead_idle`] reads: the link is open and has not failed.
    pub(crate) fn reads_ahead(&self) -> bool {
        self.opened && !self.read_ahead_failed
    }

    /// Reads ahead on a channel the current call does not receive on: for a call that is
    /// blocked sending (the peer may itself be blocked sending to this rank, both having called
    /// `send` before `recv`, or to a rank that waits on this one, and only reading its bytes
    /// lets the cycle move), and for a direct collective about to sleep (bytes from a peer it
    /// waits for mean that peer called `send` instead). A failed link is left for the call that
    /// receives on it to report (its peer may have finished and left). Returns how many bytes
    /// arrived.
    pub(crate) fn read_ahead_idle(&mut self) -> usize {
        if !self.reads_ahead() {
            return 0;
        }
        match self.read_ahead(READ_AHEAD_PER_PASS) {
            Ok(n) => n,
            Err(_) => {
                self.read_ahead_failed = true;
                0
            }
        }
    }
}

/// The error of a link's failure `e`, on the channel to `peer`, in `call`.
pub(crate) fn lost(e: LinkError, peer: usize, call: &Call) -> Error {
    match e {
        LinkError::Closed(cause) => Error::PeerLost {
            rank: call.rank,
            peer,
            op: call.op,
            cause,
        },
        LinkError::Io(e) => Error::io(call.rank, format!("{} with rank {peer}", call.op), e),
        LinkError::Broken(detail) => Error::Protocol {
            rank: call.rank,
            peer,
            op: call.op,
            detail,
        },
    }
}
