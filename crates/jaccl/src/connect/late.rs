//! Links made after start-up, when a call first needs them: to a rank off the ring (a `send`
//! to any rank, an all-to-all's pairwise exchange) when start-up did not make one. Ranks that
//! share a host got shared-memory links to each other at start-up (cheap: no network, and the
//! segments are exchanged anyway); the mesh made TCP links to all. What is left are ranks on
//! other hosts without the mesh: they get a TCP connection here, authenticated like every
//! other (`crate::auth`), to the listener each rank published at start-up, and kept for the
//! life of the group. The lower rank connects; the higher one takes the connection from its
//! acceptor thread ([`JobListener`]), so neither waits for the other to reach its call to
//! connect. Every wait ends by the call's timeout, or by liveness when a peer is lost or the
//! deadlock search finds that the peers it waits for will never connect (each blocked in a
//! call that does not, as when ranks disagree on the root of a tree).

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::algo::call::Call;
use crate::algo::engine::LateLinks;
use crate::algo::waiting::BlockedReport;
use crate::config::Transport;
use crate::error::{Error, Op, Result};
use crate::liveness::{Flow, Liveness};
use crate::os::{deadline_after, poll};
use crate::transport::Link;
use crate::transport::listener::{DialError, JobListener};

/// The peers a group made late links to, and their transports (for `Group::transport`).
pub(crate) type Opened = Arc<Mutex<Vec<(usize, Transport)>>>;

/// [`LateLinks`] over TCP, through the job's listener.
pub(crate) struct Late {
    pub(crate) tcp: Arc<JobListener>,
    /// The group the links serve (0: the group `init` made).
    pub(crate) group: u64,
    /// The job's rank of each rank of the group.
    pub(crate) job_rank: Arc<[usize]>,
    pub(crate) opened: Opened,
}

/// The longest a wait for a connection sleeps before it looks at liveness again.
const LOOK_AGAIN: Duration = Duration::from_millis(100);

impl Late {
    /// The job's rank of the group's rank `peer`.
    fn job(&self, peer: usize) -> usize {
        self.job_rank.get(peer).copied().unwrap_or(usize::MAX)
    }

    /// Notes links to `peers` for `Group::transport`.
    fn note(&self, peers: &[usize]) {
        if let Ok(mut opened) = self.opened.lock() {
            opened.extend(peers.iter().map(|&p| (p, Transport::Tcp)));
        }
    }
}

impl LateLinks for Late {
    fn open(
        &mut self,
        peers: &[usize],
        known: Vec<Flow>,
        call: &Call,
        liveness: &Liveness,
    ) -> Result<Vec<Box<dyn Link>>> {
        let me = call.rank;
        let deadline = deadline_after(call.timeout);
        // Every rank takes part in a collective: any one that left without doing its part of
        // this call fails it, whatever peer this waits for (a peer that left no longer
        // accepts). A rank that finished this call, links to this one included, may drop the
        // group while this one still takes in its link or makes those of a later round. (A
        // rank 0 that finished and left brings no more news of the others: a failure after
        // that ends this wait at the call's timeout.)
        let others: Vec<usize> = (0..self.job_rank.len()).filter(|&p| p != me).collect();
        let mut go_on = || {
            match call.op {
                Op::Send | Op::Recv => liveness.check_peers(call.op, peers)?,
                _ => liveness.check_collective(call.op, &others)?,
            }
            liveness.check_interrupt(call.op, call.interruptible)
        };
        let failed = |peer: usize, why: String| {
            let why = std::io::Error::other(why);
            Error::io(me, format!("{}: connecting to rank {peer}", call.op), why)
        };
        let mut links: Vec<Option<Box<dyn Link>>> = peers.iter().map(|_| None).collect();
        // Higher ranks first: their acceptors take the connections whatever they are doing.
        for (slot, &peer) in links.iter_mut().zip(peers).filter(|(_, p)| **p > me) {
            let link = self
                .tcp
                .open(self.group, self.job(peer), 0, deadline, &mut go_on)
                .map_err(|e| match e {
                    DialError::Stopped(e) => e,
                    DialError::Failed(_) if Instant::now() >= deadline => call.timed_out(),
                    DialError::Failed(why) => failed(peer, why),
                })?;
            *slot = Some(Box::new(link));
        }
        // Then what the lower ones open, as it arrives.
        let mut blocked = BlockedReport::new(liveness);
        loop {
            for (slot, &peer) in links.iter_mut().zip(peers) {
                if slot.is_none()
                    && let Some(link) = self
                        .tcp
                        .take(self.group, self.job(peer), 0)
                        .map_err(|why| failed(peer, why))?
                {
                    *slot = Some(Box::new(link));
                    blocked.withdraw();
                }
            }
            if links.iter().all(Option::is_some) {
                break;
            }
            go_on()?;
            blocked.report(call.op, || waits(&known, peers, &links), None);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(call.timed_out());
            }
            let mut fds = [
                PollFd::from_borrowed_fd(self.tcp.arrivals(), PollFlags::IN),
                PollFd::from_borrowed_fd(liveness.wake_fd(), PollFlags::IN),
                PollFd::from_borrowed_fd(liveness.departures_fd(), PollFlags::IN),
            ];
            poll(&mut fds, liveness.sleep_limit(left.min(LOOK_AGAIN)))
                .map_err(|e| Error::io(me, format!("{}: waiting for a connection", call.op), e))?;
            crate::os::drain(liveness.departures_fd());
        }
        self.note(peers);
        Ok(links.into_iter().flatten().collect())
    }

    fn arrived(&mut self, peers: &[usize], call: &Call) -> Result<Vec<(usize, Box<dyn Link>)>> {
        let mut links: Vec<(usize, Box<dyn Link>)> = Vec::new();
        for &peer in peers {
            let taken = self
                .tcp
                .take(self.group, self.job(peer), 0)
                .map_err(|why| {
                    let why = std::io::Error::other(why);
                    Error::io(
                        call.rank,
                        format!("{}: connecting to rank {peer}", call.op),
                        why,
                    )
                })?;
            if let Some(link) = taken {
                links.push((peer, Box::new(link)));
            }
        }
        let peers: Vec<usize> = links.iter().map(|(p, _)| *p).collect();
        self.note(&peers);
        Ok(links)
    }

    fn arrivals(&self) -> BorrowedFd<'_> {
        self.tcp.arrivals()
    }
}

/// What a wait for the links to `peers` reports to the deadlock search: the traffic over the
/// links made before (`known`), a flow to each peer whose link is made (`links`), so a peer that
/// waits for it sees it coming, and a wait for each other to connect. A rank off the ring has
/// one channel, whose link this makes, so `known` has no flow to any of `peers`.
fn waits(known: &[Flow], peers: &[usize], links: &[Option<Box<dyn Link>>]) -> Vec<Flow> {
    let made = peers.iter().zip(links).map(|(&peer, link)| {
        let waiting = link.is_none();
        Flow {
            reading: waiting,
            connecting: waiting,
            ..Flow::new(peer)
        }
    });
    known.iter().copied().chain(made).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Unopened;

    /// The links made before keep their traffic, a link made gives a plain flow (the peer
    /// waiting for it sees it coming), a link awaited a connecting one.
    #[test]
    fn a_wait_reports_the_links_made_and_those_awaited() {
        let known = Flow {
            sent: 64,
            received: 8,
            ..Flow::new(1)
        };
        let made: Option<Box<dyn Link>> = Some(Box::new(Unopened { peer: 4 }));
        let flows = waits(&[known], &[4, 6], &[made, None]);
        let awaited = Flow {
            reading: true,
            connecting: true,
            ..Flow::new(6)
        };
        assert_eq!(flows, [known, Flow::new(4), awaited]);
    }
}
