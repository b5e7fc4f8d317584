//! The direct collectives' synchronisation: each rank publishes a stamp at every
//! synchronisation point and waits, sleeping on its doorbell and links (`crate::algo::waiting`),
//! until every peer's stamp has reached it; on the first point of a call it checks each
//! peer's description of the call. Every stamp and description a peer wrote is checked
//! against what an honest peer can write.

use std::time::Duration;

use rustix::event::PollFd;

use super::{Await, Direct};
use crate::algo::call::Call;
use crate::algo::channel::Channel;
use crate::algo::waiting::{self, BlockedReport};
use crate::error::{Error, Result};
use crate::liveness::Flow;
use crate::op_header::{Digest, HEADER_LEN, Header};
use crate::os::poll;
use crate::transport::{Interest, Readiness};
use crate::wait::{Backoff, Idle};

impl Direct {
    /// Publishes that this rank reached the next synchronisation point, and waits until every
    /// peer has. With `check`, the first synchronisation of call `check`, each peer's call
    /// description must match this rank's.
    pub(super) fn sync(
        &mut self,
        call: &Call,
        check: Option<u64>,
        channels: &mut [Channel],
    ) -> Result<()> {
        self.stamp += 1;
        self.publish(self.stamp);
        self.wait_for_others(call, check, self.stamp, channels)?;
        match check {
            Some(seq) => self.check_roots(call, seq),
            None => Ok(()),
        }
    }

    /// Whether the next broadcast may be eager (or flat, [`Direct::count_broadcast`]): at most
    /// `u8::MAX` in a row, so that the count of their roots fits its byte (every rank counts
    /// the same calls, so all choose alike).
    pub(crate) fn eager_allowed(&self) -> bool {
        self.eager_run.broadcasts < u8::MAX
    }

    /// Counts a flat broadcast (over the connections, the root sending to each rank) in the
    /// run of eager ones: its root only sends, so ranks that each took themselves for the
    /// root all return, and the next call that waits for every rank finds more roots than
    /// broadcasts ([`Direct::check_roots`]).
    pub(crate) fn count_broadcast(&mut self, root: usize) {
        self.eager_run.broadcasts += 1;
        self.eager_run.rooted += u8::from(self.rank == root);
    }

    /// Checks, at the first synchronisation of call `seq`, that the eager broadcasts since
    /// the last call that waited for every rank had one root each. Every receiver checked its
    /// root's description, so each had at least one rank that took itself for the root; two
    /// ranks that both did (neither waits) show as more roots than broadcasts.
    pub(super) fn check_roots(&self, call: &Call, seq: u64) -> Result<()> {
        let rooted = |q: usize| match q == self.rank {
            true => self.eager_before.rooted,
            false => (self.board.call_of(q, seq)[0] >> 56) as u8,
        };
        let roots: u64 = (0..self.size).map(|q| u64::from(rooted(q))).sum();
        if roots == u64::from(self.eager_before.broadcasts) {
            return Ok(());
        }
        let counted: Vec<String> = (0..self.size)
            .filter(|&q| rooted(q) > 0)
            .map(|q| format!("rank {q} of {}", rooted(q)))
            .collect();
        let peer = self.others.iter().copied().find(|&q| rooted(q) > 0);
        Err(Error::Mismatch {
            rank: call.rank,
            peer: peer.or(self.others.first().copied()).unwrap_or(self.rank),
            op: call.op,
            detail: format!(
                "the ranks disagree on the roots of the {} broadcast(s) before this {}: each \
                 has one root, but the ranks took themselves for the root {roots} time(s) \
                 ({})",
                self.eager_before.broadcasts,
                call.op,
                counted.join(", ")
            ),
        })
    }

    /// Publishes that this rank reached synchronisation point `stamp`, and wakes the peers.
    pub(super) fn publish(&self, stamp: u64) {
        self.board.publish_stamp(stamp);
        for &q in &self.others {
            self.board.wake(q);
        }
    }

    /// Waits until every other rank has reached synchronisation point `target` (checking
    /// descriptions as [`Direct::sync`] says).
    pub(super) fn wait_for_others(
        &mut self,
        call: &Call,
        check: Option<u64>,
        target: u64,
        channels: &mut [Channel],
    ) -> Result<()> {
        let mut pending = std::mem::take(&mut self.pending);
        pending.clear();
        pending.extend(0..self.others.len());
        let result = self.wait(call, check, Await::Stamp, target, &mut pending, channels);
        self.pending = pending;
        result?;
        self.peers_reached = self.peers_reached.max(target);
        Ok(())
    }

    /// Waits until every `pending` peer (indices into `others`) has reached synchronisation
    /// point `target`, as `awaiting` says to see it.
    pub(super) fn wait(
        &self,
        call: &Call,
        check: Option<u64>,
        awaiting: Await,
        target: u64,
        pending: &mut Vec<usize>,
        channels: &mut [Channel],
    ) -> Result<()> {
        let mut backoff: Option<Backoff> = None;
        let mut blocked = BlockedReport::new(&self.liveness);
        loop {
            let before = pending.len();
            let mut i = 0;
            while i < pending.len() {
                let peer = self.others[pending[i]];
                match self.arrival(call, peer, awaiting, target)? {
                    Arrival::Arrived => {
                        if let Some(seq) = check {
                            self.check_call(peer, seq, call)?;
                        }
                        pending.swap_remove(i);
                    }
                    Arrival::Departed(why) => {
                        return Err(self
                            .root_cause(call, pending)
                            .unwrap_or(lost(call, peer, why)));
                    }
                    Arrival::Pending => i += 1,
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            self.liveness.check(call.op)?;
            let backoff = backoff.get_or_insert_with(|| Backoff::new(call.wait, call.timeout));
            if pending.len() < before {
                backoff.progressed();
                blocked.withdraw();
            }
            match backoff.idle(true) {
                Idle::Retry => {}
                Idle::TimedOut => return Err(call.timed_out()),
                Idle::Sleep(limit) => {
                    let waits = || self.waits(pending, channels);
                    blocked.report(call.op, waits, Some(target));
                    self.sleep(call, target, pending, limit, channels)?;
                }
            }
        }
    }

    /// Whether `peer` has reached synchronisation point `target`, or left the group first.
    ///
    /// # Errors
    /// A stamp of the peer's fails its checks (`Protocol`).
    fn arrival(&self, call: &Call, peer: usize, awaiting: Await, target: u64) -> Result<Arrival> {
        // An eager root stamps its line before its mailbox: polling the line fetches one
        // cache line where the data is, not two.
        let posted =
            awaiting == Await::EagerLine && self.eager_stamp(call, peer, target)? == target;
        if posted || self.stamp_of(call, peer)? >= target {
            return Ok(Arrival::Arrived);
        }
        Ok(match self.board.departed(peer) {
            None => Arrival::Pending,
            // A peer publishes its stamp before it leaves: it may have reached the point, and
            // finished and left, since the stamp was read.
            Some(_) if self.stamp_of(call, peer)? >= target => Arrival::Arrived,
            Some(why) => Arrival::Departed(why),
        })
    }

    /// `peer`'s synchronisation stamp, checked ([`Board::stamp_of`]).
    pub(super) fn stamp_of(&self, call: &Call, peer: usize) -> Result<u64> {
        self.board
            .stamp_of(peer)
            .map_err(|detail| protocol(call, peer, detail))
    }

    /// The stamp in `peer`'s eager line for synchronisation point `point`, checked
    /// ([`Board::eager_stamp`]).
    pub(super) fn eager_stamp(&self, call: &Call, peer: usize, point: u64) -> Result<u64> {
        self.board
            .eager_stamp(peer, point)
            .map_err(|detail| protocol(call, peer, detail))
    }

    /// What a wait for the `pending` peers reports to the deadlock search: it reads from them
    /// (their stamps, and on its connections to them, bytes of a send instead of this call).
    fn waits(&self, pending: &[usize], channels: &[Channel]) -> Vec<Flow> {
        let mut flows = waiting::flows(channels, &self.watched(pending, channels));
        for &q in pending {
            let rank = self.others[q];
            if !flows.iter().any(|f| f.peer == rank) {
                flows.push(Flow {
                    reading: true,
                    ..Flow::new(rank)
                });
            }
        }
        flows
    }

    /// A read interest on each connection to a `pending` peer: a wait watches those.
    fn watched(&self, pending: &[usize], channels: &[Channel]) -> Vec<Interest> {
        channels
            .iter()
            .map(|ch| Interest {
                read: pending.iter().any(|&q| self.others[q] == ch.peer()),
                write: false,
            })
            .collect()
    }

    /// Sleeps on the doorbell until a pending peer may have arrived, left, died, or sent on a
    /// connection to this rank (which it does only in a send instead of this call).
    fn sleep(
        &self,
        call: &Call,
        target: u64,
        pending: &[usize],
        limit: Duration,
        channels: &mut [Channel],
    ) -> Result<()> {
        if let Some(e) = self.sender_instead(call, target, pending, channels) {
            return Err(e);
        }
        let wants = self.watched(pending, channels);
        let (armed, ready) = if wants.iter().any(|w| w.any()) {
            waiting::arm(channels, &wants, call)
        } else {
            (0, Ok(Readiness::Armed))
        };
        let outcome = match ready {
            Ok(Readiness::Armed) => {
                self.sleep_armed(call, target, pending, limit, channels, &wants)
            }
            other => other.map(drop),
        };
        waiting::disarm(channels, &wants, armed);
        outcome?;
        self.liveness.check_interrupt(call.op, call.interruptible)
    }

    /// The doorbell part of [`Direct::sleep`], with the connections armed as `wants` says.
    fn sleep_armed(
        &self,
        call: &Call,
        target: u64,
        pending: &[usize],
        limit: Duration,
        channels: &[Channel],
        wants: &[Interest],
    ) -> Result<()> {
        let sleep_error = |e| Error::io(call.rank, format!("{}: before sleeping", call.op), e);
        self.board.arm().map_err(sleep_error)?;
        let arrived = self
            .any_arrived(call, target, pending)
            .inspect_err(|_| self.board.disarm())?;
        let mut result = Ok(());
        if !arrived {
            let mut waited = pending.iter().map(|&q| self.others[q]);
            if let Some(e) = waited.find_map(|p| self.board.lost(p).map(|why| lost(call, p, why))) {
                self.board.disarm();
                return Err(self.root_cause(call, pending).unwrap_or(e));
            }
            let mut fds: Vec<PollFd<'_>> =
                vec![crate::os::poll_fd(self.liveness.wake_fd(), true, false)];
            self.board
                .sleep_fds(pending.iter().map(|&q| self.others[q]), &mut fds);
            for (ch, w) in channels.iter().zip(wants) {
                if w.any() {
                    ch.wait_fds(*w, &mut fds);
                }
            }
            if let Err(e) = poll(&mut fds, self.liveness.sleep_limit(limit)) {
                result = Err(Error::io(call.rank, format!("{}: poll", call.op), e));
            }
        }
        self.board.disarm();
        result
    }

    /// Whether a `pending` peer has reached `target` or left.
    fn any_arrived(&self, call: &Call, target: u64, pending: &[usize]) -> Result<bool> {
        for &q in pending {
            let peer = self.others[q];
            if self.stamp_of(call, peer)? >= target || self.board.departed(peer).is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A pending peer that sent this rank something on a connection is in a send, not in this
    /// call (in a program whose ranks call the same operations, every byte a peer sent before
    /// this call was received before it, and one it sends after has passed this point):
    /// `Mismatch`, described from the header it sent.
    fn sender_instead(
        &self,
        call: &Call,
        target: u64,
        pending: &[usize],
        channels: &mut [Channel],
    ) -> Option<Error> {
        for &q in pending {
            let peer = self.others[q];
            for ch in channels.iter_mut().filter(|ch| ch.peer() == peer) {
                ch.read_ahead_idle();
                let sent = ch.read_ahead_bytes();
                if sent.is_empty() {
                    continue;
                }
                match self.stamp_of(call, peer) {
                    Ok(stamp) if stamp >= target => continue,
                    Ok(_) => {}
                    Err(e) => return Some(e),
                }
                let ours = call.header(0, call.rank);
                let detail = match sent.first_chunk::<HEADER_LEN>().map(Header::decode) {
                    Some(Ok(theirs)) => ours.mismatch(&theirs),
                    _ => None,
                }
                .unwrap_or_else(|| format!("rank {peer} started a send; this rank called {ours}"));
                return Some(Error::Mismatch {
                    rank: call.rank,
                    peer,
                    op: call.op,
                    detail,
                });
            }
        }
        None
    }

    /// When a peer gave up, the rank it lost may be one this rank waits for too: the rank whose
    /// process vanished is the one to name, not the peer that noticed first.
    fn root_cause(&self, call: &Call, pending: &[usize]) -> Option<Error> {
        let mut waited = pending.iter().map(|&q| self.others[q]);
        waited.find_map(|p| self.board.vanished(p).map(|why| lost(call, p, why)))
    }

    /// Checks that `peer` describes call `seq` as this rank does.
    fn check_call(&self, peer: usize, seq: u64, call: &Call) -> Result<()> {
        let counts = || self.board.counts_of(peer, seq);
        self.check_words(peer, self.board.call_of(peer, seq), counts, call)
    }

    /// Checks that `peer`'s description `words` of its current call (with its digest of the
    /// counts, read only where the call has counts) is this rank's.
    pub(super) fn check_words(
        &self,
        peer: usize,
        words: [u64; 2],
        counts: impl FnOnce() -> Digest,
        call: &Call,
    ) -> Result<()> {
        // Descriptions carry no call number (`described` numbers the direct calls) nor history.
        let expect = Header {
            number: 0,
            history: None,
            ..call.header(self.described, peer)
        };
        let detail = match Header::from_words(words, crate::op_header::to_u32(peer), counts) {
            Ok(got) if got.same_call(&expect) && got.seq != expect.seq => Some(format!(
                "rank {peer} is at its call #{} of the direct collectives, this rank at #{} \
                 (one of them skipped or repeated a call before this {})",
                got.seq, expect.seq, call.op
            )),
            Ok(got) => expect.mismatch(&got),
            Err(why) => Some(format!("unreadable call description: {why}")),
        };
        match detail {
            None => Ok(()),
            Some(detail) => Err(Error::Mismatch {
                rank: call.rank,
                peer,
                op: call.op,
                detail,
            }),
        }
    }

    /// The description of `call` (the next one, numbered by [`Direct::made`]).
    ///
    /// # Errors
    /// Its count or root do not fit a description (far beyond what one host holds).
    pub(super) fn describe(&mut self, call: &Call) -> Result<[u64; 2]> {
        let header = call.header(self.made, self.rank);
        let words = header.to_words().ok_or_else(|| {
            let why = format!("{header} does not fit a shared-memory call description");
            Error::io(call.rank, call.op, std::io::Error::other(why))
        })?;
        self.described = self.made;
        self.made = self.made.wrapping_add(1);
        Ok(words)
    }
}

/// Where a peer is, from a waiting rank's point of view.
enum Arrival {
    Arrived,
    Pending,
    /// It left the group (or its group failed) without reaching the point, for this reason.
    Departed(String),
}

/// The error for a stamp of `peer`'s that no honest rank can have written.
fn protocol(call: &Call, peer: usize, detail: String) -> Error {
    Error::Protocol {
        rank: call.rank,
        peer,
        op: call.op,
        detail,
    }
}

fn lost(call: &Call, peer: usize, cause: String) -> Error {
    Error::PeerLost {
        rank: call.rank,
        peer,
        op: call.op,
        cause,
    }
}
