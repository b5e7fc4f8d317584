//! Receiving from any source ([`Network::next_sender`]): whose message a `recv_any` takes.
//!
//! The receiver does not know who will send, so it first makes itself reachable by every peer:
//! it opens the links it would open itself for a send (to higher ranks it has none to; see
//! `crate::connect::late`), and takes those the lower ranks open when they send to it, as they
//! arrive. Then it waits until the header of a message (a send's, not a later collective's: a
//! peer that has moved on to one may be ahead of the sender) has arrived on a peer's first wire
//! (which carries the first bytes of every message from that peer) and names that peer; an
//! ordinary receive then takes the message whole, checking its header (type, length, tag) as
//! `recv` does. What is read while looking is read ahead, for the calls that take it.
//!
//! Of several messages whose headers have arrived, it takes that of the first peer in the round
//! that starts after the peer of the previous one: senders are taken in turn, and none starves
//! however fast another sends. A peer whose links closed (it left the group) can send no more
//! and is passed over; when every peer has, the receive fails.

use std::sync::Arc;
use std::time::Instant;

use super::engine::{BlockedReport, Call, Network, PEER_AHEAD_GRACE, flows, lost, sleep_also};
use super::geometry::Geometry;
use crate::error::{Error, Result};
use crate::transport::{Interest, LinkError};
use crate::wait::{Backoff, Idle};
use crate::wire::{Header, Kind};

impl Network {
    /// The peer whose message a receive from any source takes (see the module docs), the
    /// round starting after `after`.
    ///
    /// # Errors
    /// Every peer left; a lost peer, a deadlock, an interrupt or the timeout, as every wait;
    /// a peer in a direct collective this rank did not call (`Mismatch`).
    pub(crate) fn next_sender(&mut self, g: &Geometry, after: usize, call: &Call) -> Result<usize> {
        let order: Vec<usize> = (1..=g.size)
            .map(|k| (after + k) % g.size)
            .filter(|&p| p != g.rank)
            .collect();
        let higher = order.iter().filter(|&&p| p > g.rank);
        self.reach(higher.map(|&p| g.channel_to(p, 0)), call)?;
        let mut gone: Vec<usize> = Vec::new();
        let mut backoff = Backoff::new(call.wait, call.timeout);
        let liveness = Arc::clone(&self.liveness);
        let mut blocked = BlockedReport::new(&liveness);
        let mut peer_ahead_since: Option<Instant> = None;
        loop {
            self.take_arrived(g, &order, call)?;
            for &p in &order {
                let ch = &mut self.channels[g.channel_to(p, 0)];
                if !ch.is_open() || gone.contains(&p) {
                    continue;
                }
                match ch.peek_header() {
                    Ok(Some(bytes)) => match Header::decode(&bytes) {
                        Ok(header) if header.kind == Kind::SendRecv => return Ok(p),
                        // The peer is already in a later collective: not a message for this.
                        // Its bytes are read ahead, so that the deadlock search sees nothing
                        // on its way from it should no sender come.
                        Ok(_) => {
                            ch.read_ahead_idle();
                        }
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
            if gone.len() == order.len() {
                let last = gone.last().copied().unwrap_or(after);
                return Err(lost(
                    LinkError::Closed("every other rank has left the group".into()),
                    last,
                    call,
                ));
            }
            liveness.check(call.op)?;
            let wants: Vec<Interest> = (0..self.channels.len())
                .map(|c| Interest {
                    read: order.iter().any(|&p| {
                        g.channel_to(p, 0) == c && !gone.contains(&p) && self.channels[c].is_open()
                    }),
                    write: false,
                })
                .collect();
            let mut ahead = None;
            for &p in &order {
                let ch = &self.channels[g.channel_to(p, 0)];
                if ch.is_open() && ch.peer_ahead(call)? {
                    ahead = Some(p);
                    break;
                }
            }
            if let Some(peer) = ahead {
                // Bytes it sent before it moved on may still be on their way (TCP).
                let since = *peer_ahead_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= PEER_AHEAD_GRACE {
                    return Err(Error::Mismatch {
                        rank: call.rank,
                        peer,
                        op: call.op,
                        detail: format!(
                            "rank {peer} is in a collective this rank did not call; this rank \
                             called {} from any rank",
                            call.header(0, call.rank)
                        ),
                    });
                }
            }
            let in_memory = self
                .channels
                .iter()
                .zip(&wants)
                .all(|(ch, w)| !w.read || ch.in_memory());
            match backoff.idle(in_memory) {
                Idle::Retry => {}
                Idle::TimedOut => return Err(call.timed_out()),
                Idle::Sleep(limit) => {
                    let limit = match peer_ahead_since {
                        Some(_) => limit.min(PEER_AHEAD_GRACE),
                        None => limit,
                    };
                    blocked.report(call.op, || flows(&self.channels, &wants), None);
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
