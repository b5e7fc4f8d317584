//! Receiving from any source ([`Network::next_sender`]): whose message a `recv_any` takes.
//!
//! The receiver does not know who will send, so it first makes itself reachable by every peer:
//! it opens the links it would open itself for a send (to higher ranks it has none to; see
//! `crate::connect::late`), and takes those the lower ranks open when they send to it, as they
//! arrive. Then it waits until the header of a peer's next operation has arrived on its first
//! wire (which carries the first bytes, the header, of every operation with that peer), read
//! ahead without consuming anything. A send's header names that peer: an ordinary receive then
//! takes the message whole, checking the header (type, length, tag) as `recv` does. Any other
//! header is a collective this rank has not entered yet, and the peer can send this rank
//! nothing before this rank enters it: that peer is passed over, as is a peer in a direct
//! collective (shared memory) with nothing sent before it.
//!
//! Of several messages whose headers have arrived, it takes that of the first peer in the
//! round that starts after the peer of the previous one: senders are taken in turn, and none
//! starves however fast another sends. A peer whose links closed (it left the group) can send
//! no more and is passed over; when every peer has left or is in a collective, the receive
//! fails (`PeerLost`, or `Mismatch` naming a peer in a collective).

use std::sync::Arc;

use super::call::Call;
use super::channel::lost;
use super::engine::Network;
use super::geometry::Geometry;
use super::waiting::{BlockedReport, PeerAhead, flows, sleep_also};
use crate::error::{Error, Result};
use crate::liveness::Flow;
use crate::op_header::{Header, Kind};
use crate::transport::{Interest, LinkError};
use crate::wait::{Backoff, Idle};

impl Network {
    /// The peer whose message a receive from any source takes (see the module docs), the
    /// round starting after `after`.
    ///
    /// # Errors
    /// Every peer left; a lost peer, a deadlock, an interrupt or the timeout, as every wait;
    /// every peer left or in a collective this rank did not call (`Mismatch`).
    pub(crate) fn next_sender(&mut self, g: &Geometry, after: usize, call: &Call) -> Result<usize> {
        let order: Vec<usize> = (1..=g.size)
            .map(|k| (after + k) % g.size)
            .filter(|&p| p != g.rank)
            .collect();
        let higher = order.iter().filter(|&&p| p > g.rank);
        self.reach(higher.map(|&p| g.channel_to(p, 0)), call)?;
        let mut gone: Vec<usize> = Vec::new();
        // Peers whose next operation is a collective, and that collective's header.
        let mut in_collective: Vec<(usize, Header)> = Vec::new();
        let mut backoff = Backoff::new(call.wait, call.timeout);
        let liveness = Arc::clone(&self.liveness);
        let mut blocked = BlockedReport::new(&liveness);
        let mut peer_ahead = PeerAhead::default();
        let mut reported: Option<Vec<Flow>> = None;
        loop {
            self.take_arrived(g, &order, call)?;
            let passed = |p: &usize, gone: &[usize], coll: &[(usize, Header)]| {
                gone.contains(p) || coll.iter().any(|(q, _)| q == p)
            };
            for &p in &order {
                let ch = &mut self.channels[g.channel_to(p, 0)];
                if in_collective.iter().any(|(q, _)| *q == p) {
                    // Its collective's bytes are read ahead, so that the deadlock search sees
                    // nothing on its way from it should no sender come.
                    ch.read_ahead_idle();
                }
                if !ch.is_open() || passed(&p, &gone, &in_collective) {
                    continue;
                }
                match ch.peek_header() {
                    Ok(Some(bytes)) => match Header::decode(&bytes) {
                        Ok(h) if h.kind == Kind::SendRecv => return Ok(p),
                        Ok(h) => in_collective.push((p, h)),
                        Err(detail) => {
                            return Err(Error::Protocol {
                                rank: call.rank,
                                peer: p,
                                op: call.op,
                                detail,
                            });
                        }
                    },
                    Ok(None) => {}
                    Err(LinkError::Closed(_)) => gone.push(p),
                    Err(e) => return Err(lost(e, p, call)),
                }
            }
            let waiting: Vec<usize> = order
                .iter()
                .copied()
                .filter(|p| !passed(p, &gone, &in_collective))
                .collect();
            if waiting.is_empty() {
                return Err(match in_collective.first() {
                    Some((peer, theirs)) => in_a_collective(*peer, &theirs.to_string(), call),
                    None => {
                        let why = "every other rank has left the group".into();
                        lost(
                            LinkError::Closed(why),
                            gone.last().copied().unwrap_or(after),
                            call,
                        )
                    }
                });
            }
            liveness.check(call.op)?;
            let wants: Vec<Interest> = (0..self.channels.len())
                .map(|c| Interest {
                    read: waiting
                        .iter()
                        .any(|&p| g.channel_to(p, 0) == c && self.channels[c].is_open()),
                    write: false,
                })
                .collect();
            // Peers in a direct collective (shared memory) that sent nothing before it: passed
            // over by the deadlock search too (they wait for this rank, not it for them).
            let mut in_direct = Vec::new();
            for &p in &waiting {
                let ch = &self.channels[g.channel_to(p, 0)];
                if ch.is_open() && ch.peer_ahead(call)? {
                    in_direct.push(g.channel_to(p, 0));
                }
            }
            // Once bytes they sent before they moved on have had time to arrive (TCP), none
            // is coming: when every peer waited on is in one, nobody can send.
            if in_direct.len() == waiting.len() {
                if peer_ahead.grace_over() {
                    return Err(in_a_collective(waiting[0], "a direct collective", call));
                }
            } else {
                peer_ahead.clear();
            }
            let awaited: Vec<Interest> = (0..wants.len())
                .map(|c| Interest {
                    read: wants[c].read && !in_direct.contains(&c),
                    write: false,
                })
                .collect();
            let in_memory = self
                .channels
                .iter()
                .zip(&wants)
                .all(|(ch, w)| !w.read || ch.in_memory());
            match backoff.idle(in_memory) {
                Idle::Retry => {}
                Idle::TimedOut => return Err(call.timed_out()),
                Idle::Sleep(limit) => {
                    let limit = peer_ahead.sleep_limit(limit);
                    // A peer passed over since the report, or bytes read ahead from one: the
                    // deadlock search must judge what this waits for now, not what it first
                    // reported (stale, it counts a peer in a collective as one that may send).
                    // Waiting on no one (every peer in a direct collective) is no deadlock
                    // but the Mismatch above, once the grace is over.
                    let now = flows(&self.channels, &awaited);
                    if reported.as_ref().is_some_and(|before| *before != now) {
                        blocked.withdraw();
                    }
                    reported = None;
                    if now.iter().any(|f| f.reading) {
                        blocked.report(call.op, || now.clone(), None);
                        reported = Some(now);
                    }
                    let also = self.late.as_ref().map(|late| late.arrivals());
                    sleep_also(&mut self.channels, &liveness, &wants, also, limit, call)?;
                }
            }
        }
    }

    /// Opens the channels of the lower ranks of `peers` whose links have arrived.
    fn take_arrived(&mut self, g: &Geometry, peers: &[usize], call: &Call) -> Result<()> {
        let waiting: Vec<usize> = peers
            .iter()
            .copied()
            .filter(|&p| p < g.rank && !self.channels[g.channel_to(p, 0)].is_open())
            .collect();
        let Some(late) = self.late.as_mut().filter(|_| !waiting.is_empty()) else {
            return Ok(());
        };
        for (peer, link) in late.arrived(&waiting, call)? {
            self.channels[g.channel_to(peer, 0)].open(link);
        }
        Ok(())
    }
}

/// The `Mismatch` of a receive from any source that no other rank can send to any more:
/// `peer` (one of them) is in a collective (`theirs`) this rank did not call.
fn in_a_collective(peer: usize, theirs: &str, call: &Call) -> Error {
    Error::Mismatch {
        rank: call.rank,
        peer,
        op: call.op,
        detail: format!(
            "rank {peer} is in a collective this rank did not call ({theirs}), and no other rank \
             can send to this one any more; this rank called {} from any rank",
            call.header(0, call.rank)
        ),
    }
}
