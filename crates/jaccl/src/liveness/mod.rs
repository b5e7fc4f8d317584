//! Liveness: a heartbeat between the ranks through the side channel, from a thread that beats
//! while the application computes; and the search for deadlocks that rides on it.
//!
//! Every member sends a beat to the coordinator (rank 0) every [`interval`]; the coordinator
//! answers each interval with a status that carries its verdict, if it has one. A member that
//! stays silent for the liveness window (its process is stopped or hung, or its host or link is
//! gone), or whose connection ends without a goodbye (it died), is declared lost by the
//! coordinator, which tells every rank at once; a coordinator that stays silent is declared
//! lost by every member. So every rank names the same rank, within the window plus an
//! interval, whatever the transport. A rank that is only busy in its own code keeps beating.
//!
//! A call that sleeps waiting for its peers reports what it waits for and how many bytes
//! it has exchanged with each peer ([`Blocked`]); its beats carry that report. When every rank
//! is blocked and no byte is on its way to a rank that waits for it, nothing can ever move
//! again (for example, two ranks that both call `recv` from each other first): the coordinator
//! declares a deadlock, and every rank fails with [`Error::Deadlock`] instead of waiting for
//! the operation timeout. The reports reach the coordinator at different moments, so before it
//! declares anything it checks that they held at one instant (see [`deadlock::DeadlockWatch`]).
//!
//! A rank that drops its group says goodbye, and one whose group fails says goodbye with the
//! cause ([`Liveness::fail`]); the coordinator passes both on, so a rank whose connection to it
//! closes learns at once why, rather than taking it for a death or reporting only the closed
//! connection ([`Liveness::explain`]). A goodbye also counts the collectives the rank finished,
//! so a rank that still makes links for a call knows whether one that left did its part
//! ([`Liveness::check_collective`]). The coordinator, once dropped, goes on passing news until
//! every member has left, for at most half a second.
//!
//! Operations look at the verdict whenever they would wait, and sleeps wake when it arrives
//! ([`Liveness::wake_fd`]). The same object carries the caller's interrupt check
//! ([`crate::Group::interrupt_when`]), which sleeping operations consult.
//!
//! The parts: [`message`] (what travels on the side channel), [`heartbeat`] (the threads of the
//! coordinator and of the members), [`deadlock`] (the coordinator's search); this module holds
//! what a rank knows ([`Liveness`]), which the operations consult.

mod deadlock;
mod heartbeat;
mod message;

use message::Goodbye;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::error::{Error, Op, left_the_group as left};
use crate::os::{event_counter, poll, signal};

pub(crate) use heartbeat::{Heartbeat, attend, coordinate};
#[cfg(feature = "fuzzing")]
pub(crate) use message::decode;

/// What this rank knows about the others, shared by the heartbeat thread and the operations.
pub(crate) struct Liveness {
    rank: usize,
    /// The group's size (what a peer says of a rank is checked against it).
    size: usize,
    /// In a sub-group, the job's rank of each of its ranks (for messages).
    job_rank: Option<Arc<[usize]>>,
    /// Set once a verdict is in (checked on every wait: one load).
    lost: AtomicBool,
    verdict: Mutex<Option<Verdict>>,
    /// Readable once a verdict is in, so that sleeping operations wake.
    wake: OwnedFd,
    /// Asked after each sleep (sleeps then last at most [`INTERRUPT_EVERY`]).
    interrupt: Mutex<Option<InterruptCheck>>,
    /// Set when the group is dropped with operations in flight ([`Liveness::close`]), or
    /// aborted ([`Liveness::abort`]).
    closing: AtomicBool,
    /// Set when the group was aborted: stopped operations fail with [`Error::Aborted`].
    aborted: AtomicBool,
    /// The rank that revoked the group, once one did: stopped operations fail with
    /// [`Error::Revoked`].
    revoked_by: OnceLock<usize>,
    /// What the call in progress waits for, while it sleeps.
    blocked: Mutex<Option<Blocked>>,
    /// Numbers the stretches of waiting ([`Blocked::episode`]).
    episodes: AtomicU64,
    /// Reads the stamp this rank shows for the direct collectives ([`Blocked::stamp`]); unset
    /// without them.
    shown_stamp: OnceLock<StampSource>,
    /// The ranks known to have left the group (dropped it, or it failed).
    departed: Mutex<Vec<Departure>>,
    /// Readable after a departure, for [`Liveness::explain`].
    departures: OwnedFd,
    /// Rank 0 said its last goodbye: no news of the others can come any more.
    news_ended: AtomicBool,
    /// Why this rank's group failed, as its goodbye tells the others ([`Liveness::fail`]).
    farewell: Mutex<Option<String>>,
    /// The collective calls this rank finished on the group, as its goodbye tells the others.
    calls: AtomicU64,
    /// The cause behind this rank's failure when that was another rank's departure.
    root: Mutex<Option<String>>,
    /// Readable once this rank's group failed, so that the heartbeat says so.
    failed: OwnedFd,
    /// The liveness of groups that work for this one (the two levels of an all-reduce across
    /// hosts): closing, aborting or an interrupt check reaches their waits too.
    followers: Mutex<Vec<Weak<Liveness>>>,
}

/// A rank that left the group, as its goodbye said.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Departure {
    rank: usize,
    goodbye: Goodbye,
}

impl Departure {
    /// Why waiting for this rank fails.
    fn cause(&self) -> String {
        match &self.goodbye.farewell {
            None => left(self.rank),
            Some(why) => format!("rank {}'s group failed: {why}", self.rank),
        }
    }

    /// The first cause, for a rank that fails because of this one to pass on.
    fn root(&self) -> String {
        self.goodbye
            .farewell
            .clone()
            .unwrap_or_else(|| left(self.rank))
    }
}

/// Why the group cannot go on, as the heartbeat found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// `peer` stopped answering or its process ended.
    Lost { peer: usize, why: String },
    /// Every rank waits for another and no data is on its way ([`deadlock`]).
    Deadlock { detail: String },
}

impl Verdict {
    /// The error that a call `op` on `rank` fails with.
    pub(crate) fn error(&self, rank: usize, op: Op) -> Error {
        match self {
            Verdict::Lost { peer, why } => Error::PeerLost {
                rank,
                peer: *peer,
                op,
                cause: why.clone(),
            },
            Verdict::Deadlock { detail } => Error::Deadlock {
                rank,
                op,
                detail: detail.clone(),
            },
        }
    }
}

/// Reads a rank's stamp for the direct collectives where its peers read it (its mailbox).
pub(crate) type StampSource = Box<dyn Fn() -> u64 + Send + Sync>;

/// A check that says whether the caller wants the current operation to stop (for example, the
/// Python bindings answer whether Ctrl-C was pressed). See [`crate::Group::interrupt_when`].
pub(crate) type InterruptCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// How often a sleeping operation asks the interrupt check, when there is one.
pub(crate) const INTERRUPT_EVERY: Duration = Duration::from_millis(100);

/// A call that sleeps until its peers move, as it reports itself to the deadlock search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocked {
    /// Which stretch of waiting this is: a new number each time a call starts to sleep after
    /// progress, so equal numbers in two reports mean nothing moved in between.
    episode: u64,
    /// The call's name, for the error message.
    op: String,
    /// How many synchronisation points of the direct collectives this rank has published
    /// (shared memory, every rank on one host; 0 without them), as its peers read it: its
    /// mailbox, read when the report is sent. A peer sees that, not what this rank meant to
    /// publish, should anything have written over it.
    stamp: u64,
    /// In a direct collective: the stamp it waits for from the peers it reads from (who may
    /// have no connection to this rank).
    awaits: Option<u64>,
    /// One entry for each peer this rank has connections to, and for each it waits for.
    flows: Vec<Flow>,
}

/// The traffic between this rank and one peer, over all the connections to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flow {
    pub(crate) peer: usize,
    /// Bytes handed to the connections to `peer` since the group started.
    pub(crate) sent: u64,
    /// Bytes taken from the connections from `peer` since the group started.
    pub(crate) received: u64,
    /// The call waits for bytes from `peer`.
    pub(crate) reading: bool,
    /// The call waits until `peer` takes bytes (the connection is full).
    pub(crate) writing: bool,
    /// The call waits for `peer` to open a connection to this rank, made on first use
    /// (`crate::connect::late`); `reading` too. The peer's report then has a flow to this rank
    /// once it has one.
    pub(crate) connecting: bool,
}

impl Flow {
    /// No traffic with `peer` yet, and nothing waited for.
    pub(crate) fn new(peer: usize) -> Flow {
        Flow {
            peer,
            sent: 0,
            received: 0,
            reading: false,
            writing: false,
            connecting: false,
        }
    }
}

impl Liveness {
    /// No verdict yet; a heartbeat ([`coordinate`], [`attend`]) may deliver one.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn new(rank: usize) -> io::Result<Arc<Liveness>> {
        Liveness::of_group(rank, usize::MAX, None)
    }

    /// The liveness (no verdict yet) of a group of `size` whose rank `r` is the job's rank
    /// `job_rank[r]` (a sub-group: messages name both).
    pub(crate) fn of_group(
        rank: usize,
        size: usize,
        job_rank: Option<Arc<[usize]>>,
    ) -> io::Result<Arc<Liveness>> {
        Ok(Arc::new(Liveness {
            rank,
            size,
            job_rank,
            lost: AtomicBool::new(false),
            verdict: Mutex::new(None),
            wake: event_counter()?,
            interrupt: Mutex::new(None),
            closing: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            revoked_by: OnceLock::new(),
            blocked: Mutex::new(None),
            episodes: AtomicU64::new(0),
            shown_stamp: OnceLock::new(),
            departed: Mutex::new(Vec::new()),
            departures: event_counter()?,
            news_ended: AtomicBool::new(false),
            farewell: Mutex::new(None),
            calls: AtomicU64::new(0),
            root: Mutex::new(None),
            failed: event_counter()?,
            followers: Mutex::new(Vec::new()),
        }))
    }

    /// How messages name the group's `rank`: `rank 1`, or in a sub-group `rank 1 (the job's
    /// rank 5)`.
    pub(crate) fn name(&self, rank: usize) -> String {
        match self.job_rank.as_ref().and_then(|j| j.get(rank)) {
            Some(job) => format!("rank {rank} (the job's rank {job})"),
            None => format!("rank {rank}"),
        }
    }

    /// `rank` left the group and will never send again: it dropped its group (no
    /// farewell) or its group failed. The first word about a rank stays.
    fn depart(&self, rank: usize, goodbye: Goodbye) {
        if let Ok(mut departed) = self.departed.lock()
            && !departed.iter().any(|d| d.rank == rank)
        {
            departed.push(Departure { rank, goodbye });
        }
        signal(&self.departures);
    }

    /// Rank 0 left the group and stops passing news on (its last goodbye, at a member).
    fn coordinator_left(&self, goodbye: Goodbye) {
        self.news_ended.store(true, Ordering::Release);
        self.depart(0, goodbye);
    }

    fn departure(&self, rank: usize) -> Option<Departure> {
        let departed = self.departed.lock().ok()?;
        departed.iter().find(|d| d.rank == rank).cloned()
    }

    /// This rank's group failed with `error`: the heartbeat tells the others (a member in its
    /// goodbye, the coordinator to every member), naming the first cause.
    pub(crate) fn fail(&self, error: &Error) {
        let root = self.root.lock().ok().and_then(|mut r| r.take());
        if let Ok(mut farewell) = self.farewell.lock()
            && farewell.is_none()
        {
            *farewell = Some(root.unwrap_or_else(|| error.to_string()));
        }
        signal(&self.failed);
    }

    fn farewell(&self) -> Option<String> {
        self.farewell.lock().ok().and_then(|f| f.clone())
    }

    /// What this rank's goodbye says.
    fn goodbye(&self) -> Goodbye {
        Goodbye {
            calls: self.calls.load(Ordering::Acquire),
            farewell: self.farewell(),
            revoked_by: self.revoked_by.get().copied(),
        }
    }

    /// This rank finished a collective call on the group (every rank calls them in one
    /// order, so the count numbers them alike everywhere).
    pub(crate) fn finished_a_collective(&self) {
        self.calls.fetch_add(1, Ordering::AcqRel);
    }

    /// Installs (or with `None` removes) the interrupt check, here and in the followers.
    pub(crate) fn set_interrupt(&self, check: Option<InterruptCheck>) {
        if let Ok(mut slot) = self.interrupt.lock() {
            slot.clone_from(&check);
        }
        for follower in self.followers() {
            follower.set_interrupt(check.clone());
        }
    }

    /// Makes `follower` (the liveness of a group that works for this one) follow this
    /// group: it gets the interrupt check, and is closed or aborted with this group, now if
    /// that already happened.
    pub(crate) fn lead(&self, follower: &Arc<Liveness>) {
        if let Ok(mut followers) = self.followers.lock() {
            followers.retain(|f| f.strong_count() > 0);
            followers.push(Arc::downgrade(follower));
        }
        if let Ok(slot) = self.interrupt.lock() {
            follower.set_interrupt(slot.clone());
        }
        if self.closing() {
            self.stop_follower(follower);
        }
    }

    fn followers(&self) -> Vec<Arc<Liveness>> {
        match self.followers.lock() {
            Ok(followers) => followers.iter().filter_map(Weak::upgrade).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The longest a sleep of `limit` may last: [`INTERRUPT_EVERY`] with an interrupt check.
    pub(crate) fn sleep_limit(&self, limit: Duration) -> Duration {
        match self.interrupt.lock() {
            Ok(slot) if slot.is_some() => limit.min(INTERRUPT_EVERY),
            _ => limit,
        }
    }

    /// After a sleep: [`Error::Closed`] if the group is being dropped, [`Error::Aborted`] if
    /// it was aborted, or [`Error::Interrupted`] if the interrupt check asks to stop (only
    /// asked on the thread that installed it: `interruptible`).
    pub(crate) fn check_interrupt(&self, op: Op, interruptible: bool) -> Result<(), Error> {
        if self.closing() {
            return Err(self.stopped());
        }
        self.check_interrupt_only(op, interruptible)
    }

    /// [`Error::Interrupted`] if the interrupt check asks to stop (see
    /// [`Liveness::check_interrupt`]), whether or not the group is closing: for what a failed,
    /// aborted or revoked group still does (agree, shrink).
    pub(crate) fn check_interrupt_only(&self, op: Op, interruptible: bool) -> Result<(), Error> {
        if !interruptible {
            return Ok(());
        }
        let check = match self.interrupt.lock() {
            Ok(slot) => slot.clone(),
            Err(_) => None,
        };
        match check {
            Some(stop) if stop() => Err(Error::Interrupted {
                rank: self.rank,
                op,
            }),
            _ => Ok(()),
        }
    }

    /// The group is being dropped: the operation in flight stops at its next wait, which
    /// this wakes, and fails with [`Error::Closed`].
    pub(crate) fn close(&self) {
        self.stop(false);
    }

    /// The group was aborted from another thread: as [`Liveness::close`], but the operations
    /// stopped fail with [`Error::Aborted`].
    pub(crate) fn abort(&self) {
        self.stop(true);
    }

    /// Rank `by` revoked the group: as [`Liveness::abort`], but the operations stopped fail
    /// with [`Error::Revoked`] naming it. The first revocation stays; true if this is it.
    pub(crate) fn revoke(&self, by: usize) -> bool {
        let first = self.revoked_by.set(by).is_ok();
        self.stop(true);
        first
    }

    /// The rank the heartbeat declared lost, if it did.
    pub(crate) fn lost_peer(&self) -> Option<usize> {
        match self.verdict()? {
            Verdict::Lost { peer, .. } => Some(peer),
            Verdict::Deadlock { .. } => None,
        }
    }

    /// [`Liveness::close`] (`aborted`: [`Liveness::abort`]), here and in the followers.
    fn stop(&self, aborted: bool) {
        if aborted {
            self.aborted.store(true, Ordering::Release);
        }
        self.closing.store(true, Ordering::Release);
        signal(&self.wake);
        for follower in self.followers() {
            self.stop_follower(&follower);
        }
    }

    /// Stops `follower` as this group was stopped: revoked, aborted or closed.
    fn stop_follower(&self, follower: &Liveness) {
        match self.revoked_by.get() {
            Some(&by) => {
                follower.revoke(by);
            }
            None => follower.stop(self.aborted.load(Ordering::Acquire)),
        }
    }

    /// The rank that revoked the group, once one did.
    pub(crate) fn revoked_by(&self) -> Option<usize> {
        self.revoked_by.get().copied()
    }

    /// The error of an operation stopped by [`Liveness::close`] or [`Liveness::abort`].
    pub(crate) fn stopped(&self) -> Error {
        if let Some(&by) = self.revoked_by.get() {
            return Error::Revoked {
                rank: self.rank,
                by,
            };
        }
        match self.aborted.load(Ordering::Acquire) {
            true => Error::Aborted { rank: self.rank },
            false => Error::Closed { rank: self.rank },
        }
    }

    /// Whether [`Liveness::close`] (or [`Liveness::abort`]) was called.
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Records the verdict (the first stays) and wakes sleeping operations.
    fn declare(&self, found: Verdict) {
        let Ok(mut verdict) = self.verdict.lock() else {
            return;
        };
        if verdict.is_none() {
            match &found {
                Verdict::Lost { peer, why } => {
                    tracing::warn!(rank = self.rank, peer, %why, "rank declared lost");
                }
                Verdict::Deadlock { detail } => {
                    tracing::warn!(rank = self.rank, %detail, "deadlock declared");
                }
            }
            *verdict = Some(found);
            self.lost.store(true, Ordering::Release);
            signal(&self.wake);
        }
    }

    /// The verdict, if any.
    fn verdict(&self) -> Option<Verdict> {
        if !self.lost.load(Ordering::Acquire) {
            return None;
        }
        self.verdict.lock().ok().and_then(|v| v.clone())
    }

    /// The error for operation `op` if there is a verdict.
    pub(crate) fn check(&self, op: Op) -> Result<(), Error> {
        match self.verdict() {
            None => Ok(()),
            Some(v) => Err(v.error(self.rank, op)),
        }
    }

    /// Why the call `op` failed with `failure`, a connection that closed or broke: the
    /// verdict, or that the peer left the group or failed, whichever comes first within
    /// `limit` (a connection closing is the first sign of either: the heartbeat brings the
    /// cause a moment later); else `failure` itself. Once rank 0 has said its last goodbye no
    /// news can come: then at once, adding that rank 0 left (most likely why the peer failed).
    pub(crate) fn explain(&self, failure: Error, limit: Duration, op: Op) -> Error {
        let peer = match &failure {
            Error::PeerLost { peer, .. } | Error::Protocol { peer, .. } => Some(*peer),
            _ => None,
        };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = self.verdict() {
                return v.error(self.rank, op);
            }
            if let Some(d) = peer.and_then(|p| self.departure(p)) {
                return self.lost(&d, op);
            }
            if self.news_ended.load(Ordering::Acquire) {
                return match (failure, self.departure(0)) {
                    (
                        Error::PeerLost {
                            rank,
                            peer,
                            op,
                            cause,
                        },
                        Some(coordinator),
                    ) => Error::PeerLost {
                        rank,
                        peer,
                        op,
                        cause: format!("{cause}; earlier, {}", coordinator.cause()),
                    },
                    (failure, _) => failure,
                };
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return failure;
            }
            let mut fds = [
                PollFd::new(&self.wake, PollFlags::IN),
                PollFd::new(&self.departures, PollFlags::IN),
            ];
            let _ = poll(&mut fds, remaining);
            if fds[1].revents().contains(PollFlags::IN) {
                let mut count = [0u8; 8];
                let _ = rustix::io::read(&self.departures, &mut count);
            }
        }
    }

    /// The error of `op` that waited for `departed`, which left; its cause is the first
    /// cause this rank passes on if it fails.
    fn lost(&self, departed: &Departure, op: Op) -> Error {
        if let Ok(mut root) = self.root.lock() {
            *root = Some(departed.root());
        }
        // Its group was revoked: so is this one (the revocation may not have reached this
        // rank yet), and its goodbye says so in turn.
        if let Some(by) = departed.goodbye.revoked_by.filter(|&by| by < self.size) {
            let by = *self.revoked_by.get_or_init(|| by);
            return Error::Revoked {
                rank: self.rank,
                by,
            };
        }
        Error::PeerLost {
            rank: self.rank,
            peer: departed.rank,
            op,
            cause: departed.cause(),
        }
    }

    /// For a wait on `peers` that no connection watches (one made on first use): the
    /// verdict, or that one of them left the group, as the error of `op`. Sleeps should
    /// wake on [`Liveness::departures_fd`] too.
    pub(crate) fn check_peers(&self, op: Op, peers: &[usize]) -> Result<(), Error> {
        self.check(op)?;
        match peers.iter().find_map(|&p| self.departure(p)) {
            Some(d) => Err(self.lost(&d, op)),
            None => Ok(()),
        }
    }

    /// [`Liveness::check_peers`] for a collective's wait that no connection watches: any of
    /// `ranks` (every other rank: all take part) that left without doing its part of this
    /// call fails it, that is one whose group failed or that left before finishing as many
    /// collectives as this rank has started. One that finished this call and left did its
    /// part, links to this rank included.
    pub(crate) fn check_collective(&self, op: Op, ranks: &[usize]) -> Result<(), Error> {
        self.check(op)?;
        let this_call = self.calls.load(Ordering::Acquire);
        let missing = |&p: &usize| {
            self.departure(p)
                .filter(|d| d.goodbye.farewell.is_some() || d.goodbye.calls <= this_call)
        };
        match ranks.iter().find_map(missing) {
            Some(d) => Err(self.lost(&d, op)),
            None => Ok(()),
        }
    }

    /// Readable after a departure (see [`Liveness::check_peers`]); reading it resets it.
    pub(crate) fn departures_fd(&self) -> BorrowedFd<'_> {
        self.departures.as_fd()
    }

    /// Readable once a verdict is in: add it to every sleep.
    pub(crate) fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// The call `op` sleeps until its peers move, with `flows` as its traffic so far; a direct
    /// collective `awaits` a stamp from the peers it reads from.
    pub(crate) fn report_blocked(&self, op: Op, flows: Vec<Flow>, awaits: Option<u64>) {
        let episode = self.episodes.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut slot) = self.blocked.lock() {
            *slot = Some(Blocked {
                episode,
                op: op.name().to_owned(),
                stamp: 0, // read when sent ([`Liveness::blocked`])
                awaits,
                flows,
            });
        }
    }

    /// Where the reports read this rank's stamp for the direct collectives (set once, by
    /// them).
    pub(crate) fn show_stamp(&self, source: StampSource) {
        let _ = self.shown_stamp.set(source);
    }

    /// The call that reported itself blocked moved or ended.
    pub(crate) fn report_moving(&self) {
        if let Ok(mut slot) = self.blocked.lock() {
            *slot = None;
        }
    }

    /// The report of the call that sleeps, with the stamp its peers see now. Read under the
    /// report's lock: an honest rank publishes no stamp while it stays blocked, so that is the
    /// stamp it published before (a call withdraws its report before it moves on).
    fn blocked(&self) -> Option<Blocked> {
        let slot = self.blocked.lock().ok()?;
        let stamp = self.shown_stamp.get().map_or(0, |read| read());
        slot.clone().map(|b| Blocked { stamp, ..b })
    }
}

/// The beat interval for a liveness `window`: a fifth of it, between 50 ms and 1 s.
pub(crate) fn interval(window: Duration) -> Duration {
    (window / 5).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of a call blocked in `recv` with these flows (peer, sent, received, reading,
    /// writing).
    pub(super) fn blocked(episode: u64, flows: &[(usize, u64, u64, bool, bool)]) -> Blocked {
        Blocked {
            episode,
            stamp: 0,
            awaits: None,
            op: "recv".into(),
            flows: flows
                .iter()
                .map(|&(peer, sent, received, reading, writing)| Flow {
                    connecting: false,
                    peer,
                    sent,
                    received,
                    reading,
                    writing,
                })
                .collect(),
        }
    }

    #[test]
    fn a_failure_down_the_line_passes_on_the_first_cause() {
        let live = Liveness::new(3).expect("an eventfd");
        // Nothing known about rank 2: the failure as it was.
        let closed = closed_connection(3, 2);
        let error = live.explain(closed.clone(), Duration::ZERO, Op::AllReduce);
        assert_eq!(cause_of(&error), cause_of(&closed));
        // Rank 2 failed because rank 1 left; this rank then fails because of rank 2.
        live.depart(
            2,
            Goodbye {
                calls: 0,
                farewell: Some(left(1)),
                revoked_by: None,
            },
        );
        live.depart(2, Goodbye::default()); // the first word about a rank stays
        let error = live.explain(closed, Duration::from_secs(60), Op::AllReduce);
        assert!(matches!(
            error,
            Error::PeerLost {
                rank: 3,
                peer: 2,
                ..
            }
        ));
        assert_eq!(
            cause_of(&error),
            "rank 2's group failed: rank 1 left the group (it dropped it)"
        );
        // Its own goodbye names the first cause, not the chain, so chains never grow.
        live.fail(&error);
        assert_eq!(live.farewell(), Some(left(1)));
    }

    #[test]
    fn once_rank_0_has_gone_a_closed_connection_is_explained_at_once() {
        let live = Liveness::new(2).expect("an eventfd");
        live.coordinator_left(Goodbye::default());
        // No news can come: no waiting (a wait would last the minute), and rank 0's
        // departure, the likely first cause, is named.
        let error = live.explain(
            closed_connection(2, 1),
            Duration::from_secs(60),
            Op::Barrier,
        );
        assert!(matches!(
            error,
            Error::PeerLost {
                rank: 2,
                peer: 1,
                ..
            }
        ));
        assert_eq!(
            cause_of(&error),
            "the connection was closed; earlier, rank 0 left the group (it dropped it)"
        );
    }

    fn closed_connection(rank: usize, peer: usize) -> Error {
        Error::PeerLost {
            rank,
            peer,
            op: Op::AllReduce,
            cause: "the connection was closed".into(),
        }
    }

    fn cause_of(error: &Error) -> &str {
        match error {
            Error::PeerLost { cause, .. } => cause,
            other => panic!("expected PeerLost, got {other:?}"),
        }
    }

    #[test]
    fn a_failure_of_its_own_is_passed_on_as_its_error() {
        let live = Liveness::new(1).expect("an eventfd");
        let error = Error::Interrupted {
            rank: 1,
            op: Op::Barrier,
        };
        live.fail(&error);
        assert_eq!(live.farewell(), Some(error.to_string()));
    }
}
