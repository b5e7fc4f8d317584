//! How a call waits when it cannot move: it arms the links it waits on and sleeps in
//! `poll(2)` (with the liveness wake-up), and reports itself blocked to the deadlock search
//! (`crate::liveness`) meanwhile. The plan runner (`super::engine`), the direct collectives
//! (`super::shared_memory`) and the receive from any source all wait here.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::call::Call;
use super::channel::{Channel, lost};
use crate::error::{Error, Op, Result};
use crate::liveness::{Flow, Liveness};
use crate::os::poll;
use crate::transport::{Interest, Readiness};

/// How long a send or receive waits, without progress, on a peer that has entered a direct
/// collective before it fails with `Mismatch`.
const PEER_AHEAD_GRACE: Duration = Duration::from_millis(250);

/// Since when a peer this call waits on has been in a direct collective this rank is not in.
/// Bytes its side sent before it moved on may still be on their way (TCP): the call waits a
/// moment ([`PEER_AHEAD_GRACE`]) for them before calling it a mismatch.
#[derive(Default)]
pub(crate) struct PeerAhead {
    since: Option<Instant>,
}

impl PeerAhead {
    /// No peer waited on is ahead (any more).
    pub(crate) fn clear(&mut self) {
        self.since = None;
    }

    /// A peer waited on is ahead now: whether it has been for the whole grace.
    pub(crate) fn grace_over(&mut self) -> bool {
        self.since.get_or_insert_with(Instant::now).elapsed() >= PEER_AHEAD_GRACE
    }

    /// The longest sleep, given the backoff's `limit`: within the grace while a peer is ahead.
    pub(crate) fn sleep_limit(&self, limit: Duration) -> Duration {
        match self.since {
            Some(_) => limit.min(PEER_AHEAD_GRACE),
            None => limit,
        }
    }
}

/// The report of a call that sleeps (for the deadlock search, `crate::liveness`): made once
/// per stretch of waiting, withdrawn when the call moves or ends.
pub(crate) struct BlockedReport<'a> {
    liveness: &'a Liveness,
    reported: bool,
}

impl<'a> BlockedReport<'a> {
    pub(crate) fn new(liveness: &'a Liveness) -> BlockedReport<'a> {
        BlockedReport {
            liveness,
            reported: false,
        }
    }

    /// Reports the call as blocked (once per stretch of waiting), with the `flows` that
    /// [`flows`] gives and, in a direct collective, the stamp it `awaits`.
    pub(crate) fn report(
        &mut self,
        op: Op,
        flows: impl FnOnce() -> Vec<Flow>,
        awaits: Option<u64>,
    ) {
        if !self.reported {
            self.liveness.report_blocked(op, flows(), awaits);
            self.reported = true;
        }
    }

    /// The call moved.
    pub(crate) fn withdraw(&mut self) {
        if self.reported {
            self.liveness.report_moving();
            self.reported = false;
        }
    }
}

/// Each peer's traffic over the open `channels` and what the call waits for from it (`wants`).
/// Channels not opened yet (made on first use) are left out: a flow to a peer says this rank
/// has a connection to it.
pub(crate) fn flows(channels: &[Channel], wants: &[Interest]) -> Vec<Flow> {
    let mut flows: Vec<Flow> = Vec::new();
    for (ch, want) in channels.iter().zip(wants).filter(|(ch, _)| ch.is_open()) {
        let i = match flows.iter().position(|f| f.peer == ch.peer) {
            Some(i) => i,
            None => {
                flows.push(Flow::new(ch.peer));
                flows.len() - 1
            }
        };
        let flow = &mut flows[i];
        flow.sent += ch.bytes_sent;
        flow.received += ch.bytes_received;
        flow.reading |= want.read;
        flow.writing |= want.write;
    }
    flows
}

impl Drop for BlockedReport<'_> {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// Arms every channel with an interest and, unless one is ready already, sleeps until one of
/// their descriptors fires or `limit` passes; then disarms them.
pub(crate) fn sleep(
    channels: &mut [Channel],
    liveness: &Liveness,
    wants: &[Interest],
    limit: Duration,
    call: &Call,
) -> Result<()> {
    sleep_also(channels, liveness, wants, None, limit, call)
}

/// [`sleep`], also woken when `also` is readable (with `also`, `wants` may be empty).
pub(crate) fn sleep_also(
    channels: &mut [Channel],
    liveness: &Liveness,
    wants: &[Interest],
    also: Option<BorrowedFd<'_>>,
    limit: Duration,
    call: &Call,
) -> Result<()> {
    let (armed, mut outcome) = match also.is_some() && !wants.iter().any(|w| w.any()) {
        true => (0, Ok(Readiness::Armed)),
        false => arm(channels, wants, call),
    };
    if let Ok(Readiness::Armed) = outcome {
        let mut fds: Vec<PollFd<'_>> =
            vec![PollFd::from_borrowed_fd(liveness.wake_fd(), PollFlags::IN)];
        fds.extend(also.map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN)));
        for (ch, w) in channels.iter().zip(wants) {
            if w.any() {
                ch.link.wait_fds(*w, &mut fds);
            }
        }
        outcome = poll(&mut fds, liveness.sleep_limit(limit))
            .map(|_| Readiness::Armed)
            .map_err(|e| Error::io(call.rank, format!("{}: poll", call.op), e));
    }
    disarm(channels, wants, armed);
    outcome?;
    liveness.check_interrupt(call.op, call.interruptible)
}

/// Arms the channels with an interest in order, stopping at the first that is ready (or
/// fails). Returns how many were armed, to [`disarm`] later, and the outcome.
pub(crate) fn arm(
    channels: &mut [Channel],
    wants: &[Interest],
    call: &Call,
) -> (usize, Result<Readiness>) {
    let mut armed = 0;
    for (ch, w) in channels.iter_mut().zip(wants) {
        if !w.any() {
            continue;
        }
        armed += 1;
        match ch.link.arm(*w) {
            Ok(Readiness::Armed) => {}
            Ok(Readiness::Ready) => return (armed, Ok(Readiness::Ready)),
            Err(e) => return (armed, Err(lost(e, ch.peer, call))),
        }
    }
    if armed == 0 {
        // Every unfinished lane waits on a channel, so this cannot happen; fail rather than hang.
        let bug = std::io::Error::other("internal error: nothing to wait for");
        return (0, Err(Error::io(call.rank, call.op, bug)));
    }
    (armed, Ok(Readiness::Armed))
}

/// Disarms the first `armed` channels with an interest (those [`arm`] armed).
pub(crate) fn disarm(channels: &mut [Channel], wants: &[Interest], armed: usize) {
    let waited = channels.iter_mut().zip(wants).filter(|(_, w)| w.any());
    for (ch, _) in waited.take(armed) {
        ch.link.disarm();
    }
}
