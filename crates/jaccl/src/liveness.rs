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
//! declares anything it checks that they held at one instant (see [`DeadlockWatch`]).
//!
//! A rank that drops its group says goodbye, and one whose group fails says goodbye with the
//! cause ([`Liveness::fail`]); the coordinator passes both on, so a rank whose connection to it
//! closes learns at once why, rather than taking it for a death or reporting only the closed
//! connection ([`Liveness::explain`]). A failed coordinator goes on passing news until its group
//! is dropped.
//!
//! Operations look at the verdict whenever they would wait, and sleeps wake when it arrives
//! ([`Liveness::wake_fd`]). The same object carries the caller's interrupt check
//! ([`crate::Group::interrupt_when`]), which sleeping operations consult.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::error::{Error, Op};
use crate::transport::{event_counter, signal};
use crate::wire::{Reader, to_u32, u32_at};

/// What this rank knows about the others, shared by the heartbeat thread and the operations.
pub(crate) struct Liveness {
    rank: usize,
    /// Set once a verdict is in (checked on every wait: one load).
    lost: AtomicBool,
    verdict: Mutex<Option<Verdict>>,
    /// Readable once a verdict is in, so that sleeping operations wake.
    wake: OwnedFd,
    /// Asked after each sleep (sleeps then last at most [`INTERRUPT_EVERY`]).
    interrupt: Mutex<Option<InterruptCheck>>,
    /// What the call in progress waits for, while it sleeps.
    blocked: Mutex<Option<Blocked>>,
    /// Numbers the stretches of waiting ([`Blocked::episode`]).
    episodes: AtomicU64,
    /// The stamp this rank last published for the direct collectives ([`Blocked::stamp`]).
    stamp: AtomicU64,
    /// The ranks known to have left the group (dropped it, or it failed).
    departed: Mutex<Vec<Departure>>,
    /// Readable after a departure, for [`Liveness::explain`].
    departures: OwnedFd,
    /// Why this rank's group failed, as its goodbye tells the others ([`Liveness::fail`]).
    farewell: Mutex<Option<String>>,
    /// The cause behind this rank's failure when that was another rank's departure.
    root: Mutex<Option<String>>,
    /// Readable once this rank's group failed, so that the heartbeat says so.
    failed: OwnedFd,
}

/// A rank that left the group, as its goodbye said.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Departure {
    rank: usize,
    /// `None`: it dropped its group; else its group failed, for this reason (the first cause
    /// of a chain of failures).
    farewell: Option<String>,
}

impl Departure {
    /// Why waiting for this rank fails.
    fn cause(&self) -> String {
        match &self.farewell {
            None => left(self.rank),
            Some(why) => format!("rank {}'s group failed: {why}", self.rank),
        }
    }

    /// The first cause, for a rank that fails because of this one to pass on.
    fn root(&self) -> String {
        self.farewell.clone().unwrap_or_else(|| left(self.rank))
    }
}

/// Why the group cannot go on, as the heartbeat found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// `peer` stopped answering or its process ended.
    Lost { peer: usize, why: String },
    /// Every rank waits for another and no data is on its way ([`deadlocked`]).
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
    /// (shared memory, every rank on one host; 0 without them).
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
        }
    }
}

impl Liveness {
    /// No verdict yet; a heartbeat ([`coordinate`], [`attend`]) may deliver one.
    pub(crate) fn new(rank: usize) -> io::Result<Arc<Liveness>> {
        Ok(Arc::new(Liveness {
            rank,
            lost: AtomicBool::new(false),
            verdict: Mutex::new(None),
            wake: event_counter()?,
            interrupt: Mutex::new(None),
            blocked: Mutex::new(None),
            episodes: AtomicU64::new(0),
            stamp: AtomicU64::new(0),
            departed: Mutex::new(Vec::new()),
            departures: event_counter()?,
            farewell: Mutex::new(None),
            root: Mutex::new(None),
            failed: event_counter()?,
        }))
    }

    /// `rank` left the group and will never send again: it dropped its group (`farewell`
    /// `None`) or its group failed. The first word about a rank stays.
    fn depart(&self, rank: usize, farewell: Option<String>) {
        if let Ok(mut departed) = self.departed.lock()
            && !departed.iter().any(|d| d.rank == rank)
        {
            departed.push(Departure { rank, farewell });
        }
        signal(&self.departures);
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

    /// Installs (or with `None` removes) the interrupt check.
    pub(crate) fn set_interrupt(&self, check: Option<InterruptCheck>) {
        if let Ok(mut slot) = self.interrupt.lock() {
            *slot = check;
        }
    }

    /// The longest a sleep of `limit` may last: [`INTERRUPT_EVERY`] with an interrupt check.
    pub(crate) fn sleep_limit(&self, limit: Duration) -> Duration {
        match self.interrupt.lock() {
            Ok(slot) if slot.is_some() => limit.min(INTERRUPT_EVERY),
            _ => limit,
        }
    }

    /// After a sleep: [`Error::Interrupted`] if the interrupt check asks to stop.
    pub(crate) fn check_interrupt(&self, op: Op) -> Result<(), Error> {
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

    /// Why a connection of operation `op` to `peer` (if it is known) failed: the verdict, or
    /// that `peer` left the group or failed, whichever comes first within `limit`. A connection closing
    /// is the first sign of either: the heartbeat brings the cause a moment later.
    pub(crate) fn explain(&self, peer: Option<usize>, limit: Duration, op: Op) -> Option<Error> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = self.verdict() {
                return Some(v.error(self.rank, op));
            }
            if let Some(d) = peer.and_then(|p| self.departure(p)) {
                if let Ok(mut root) = self.root.lock() {
                    *root = Some(d.root());
                }
                return Some(Error::PeerLost {
                    rank: self.rank,
                    peer: d.rank,
                    op,
                    cause: d.cause(),
                });
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return None;
            }
            let mut fds = [
                PollFd::new(&self.wake, PollFlags::IN),
                PollFd::new(&self.departures, PollFlags::IN),
            ];
            let _ = crate::transport::poll(&mut fds, remaining);
            if fds[1].revents().contains(PollFlags::IN) {
                let mut count = [0u8; 8];
                let _ = rustix::io::read(&self.departures, &mut count);
            }
        }
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
                stamp: self.stamp.load(Ordering::Relaxed),
                awaits,
                flows,
            });
        }
    }

    /// This rank published `stamp` for the direct collectives (before it waits on it).
    pub(crate) fn published(&self, stamp: u64) {
        self.stamp.store(stamp, Ordering::Relaxed);
    }

    /// The call that reported itself blocked moved or ended.
    pub(crate) fn report_moving(&self) {
        if let Ok(mut slot) = self.blocked.lock() {
            *slot = None;
        }
    }

    fn blocked(&self) -> Option<Blocked> {
        self.blocked.lock().ok().and_then(|b| b.clone())
    }
}

/// Whether ranks blocked as `reports` say (every rank of the group, by rank, at one instant;
/// `None` for a rank that has left the group) can never move again. A blocked rank moves only
/// when bytes reach it from a peer it reads from, or when such a peer takes the bytes it waits
/// to send, or (in a direct collective) when a peer it waits for has published the stamp it
/// waits for. A rank that waits on a peer that has left fails soon (`PeerLost`), as does a send
/// or receive that waits on a peer already in a direct collective (`Mismatch`): both count as
/// moving. If no rank can move, nothing ever will: every rank is in a call, and publishes or
/// sends more only after that call moved.
fn deadlocked(reports: &[Option<&Blocked>]) -> bool {
    let flows: HashMap<(usize, usize), &Flow> = reports
        .iter()
        .enumerate()
        .filter_map(|(rank, b)| Some((rank, (*b)?)))
        .flat_map(|(rank, b)| b.flows.iter().map(move |f| ((rank, f.peer), f)))
        .collect();
    let blocked = reports
        .iter()
        .enumerate()
        .filter_map(|(r, b)| Some((r, (*b)?)));
    blocked.into_iter().all(|(rank, b)| {
        b.flows.iter().filter(|f| f.reading).all(|f| {
            let Some(Some(peer)) = reports.get(f.peer) else {
                return false; // it has left (or is unknown): this rank fails
            };
            let coming = flows
                .get(&(f.peer, rank))
                .is_some_and(|back| back.sent > f.received || back.writing);
            let arrived = match b.awaits {
                Some(target) => peer.stamp >= target,
                None => peer.stamp > b.stamp,
            };
            !coming && !arrived
        })
    })
}

/// The deadlock as the error message gives it: what each rank waits for.
fn describe(reports: &[Option<&Blocked>]) -> String {
    const SHOWN: usize = 8;
    let mut parts: Vec<String> = reports
        .iter()
        .enumerate()
        .take(SHOWN)
        .map(|(rank, b)| {
            let Some(b) = b else {
                return format!("rank {rank} has left");
            };
            // A rank that waits to send also reads whatever comes (so that sends in a cycle
            // go through): name only what it waits to send then.
            let sending = b.flows.iter().any(|f| f.writing);
            let waits_for: Vec<String> = b
                .flows
                .iter()
                .filter(|f| if sending { f.writing } else { f.reading })
                .map(|f| match (sending, b.awaits) {
                    (true, _) => format!("rank {} to take its data", f.peer),
                    (false, Some(_)) => format!("rank {} to join", f.peer),
                    (false, None) => format!("data from rank {}", f.peer),
                })
                .collect();
            format!(
                "rank {rank} in {} waits for {}",
                b.op,
                waits_for.join(" and ")
            )
        })
        .collect();
    if reports.len() > SHOWN {
        parts.push(format!("and {} more ranks", reports.len() - SHOWN));
    }
    format!(
        "every rank waits for another and no data is on its way ({}): the calls do not match \
         up (for example, both ranks of a pair called recv before send)",
        parts.join("; ")
    )
}

/// The coordinator's deadlock search. Each member's report was true when the member sent
/// it, but they were sent at different moments. So a deadlock seen in one set of reports is
/// only suspected, and a new round is announced; it is declared once every member has sent a
/// report after seeing that round, each from the same stretch of waiting as before (and rank
/// 0 is still in its own). Then every rank was blocked, as reported, at the moment the
/// suspicion arose: nothing moved for any of them in between. (Members that have left the
/// group stay gone: they report nothing more.)
#[derive(Default)]
struct DeadlockWatch {
    round: u32,
    suspect: Option<Suspect>,
}

struct Suspect {
    round: u32,
    /// Each rank's stretch of waiting; `None` for a rank that has left.
    episodes: Vec<Option<u64>>,
    detail: String,
}

/// A member as the deadlock search sees it.
#[derive(Clone, Copy)]
enum Member<'a> {
    /// Not in a blocked call (or not known to be).
    Moving,
    /// Blocked, as its latest beat says, sent after it saw this round.
    Blocked(u32, &'a Blocked),
    /// It left the group (said goodbye): it will never send again.
    Left,
}

impl DeadlockWatch {
    /// Looks at rank 0's own report and the members'; looks for a new suspicion only if
    /// `search` (the full check is linear in the connections of the whole group: once a beat
    /// interval). Returns the description of a confirmed deadlock.
    fn update<'a>(
        &mut self,
        own: Option<&'a Blocked>,
        members: impl Iterator<Item = Member<'a>>,
        search: bool,
    ) -> Option<String> {
        let (mut reports, mut rounds, mut all_blocked) = (vec![own], Vec::new(), own.is_some());
        for member in members {
            let (report, round) = match member {
                Member::Moving => (None, 0),
                Member::Blocked(round, b) => (Some(b), round),
                Member::Left => (None, u32::MAX),
            };
            all_blocked &= !matches!(member, Member::Moving);
            reports.push(report);
            rounds.push(round);
        }
        if !all_blocked {
            // A rank is not blocked: nothing is, or will be, declared from these reports.
            self.suspect = None;
            return None;
        }
        let episodes: Vec<Option<u64>> = reports.iter().map(|b| b.map(|b| b.episode)).collect();
        if let Some(s) = &self.suspect
            && s.episodes == episodes
        {
            // (Rank 0's own report is read now: it has no round.)
            let after_the_round = rounds.iter().all(|&round| round >= s.round);
            return after_the_round.then(|| s.detail.clone());
        }
        self.suspect = None;
        if search && deadlocked(&reports) {
            self.round = self.round.wrapping_add(1);
            self.suspect = Some(Suspect {
                round: self.round,
                episodes,
                detail: describe(&reports),
            });
        }
        None
    }

    /// Whether a suspicion waits for its confirmation.
    fn suspects(&self) -> bool {
        self.suspect.is_some()
    }
}

/// The beat interval for a liveness `window`: a fifth of it, between 50 ms and 1 s.
pub(crate) fn interval(window: Duration) -> Duration {
    (window / 5).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// The heartbeat thread of one rank; dropping it says goodbye and stops it.
pub(crate) struct Heartbeat {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        signal(&*self.stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Message kinds on the side channel after start-up.
const BEAT: u8 = 1;
const BYE: u8 = 2;
const STATUS: u8 = 3;
const GONE: u8 = 4;
/// The verdicts a status may carry.
const LOST: u8 = 1;
const DEADLOCK: u8 = 2;

/// A message on the side channel after start-up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// A member's beat: `BEAT`, then, if one of its calls is blocked, the latest round of the
    /// deadlock search it has seen (u32) and its report.
    Beat(Option<(u32, Blocked)>),
    /// `BYE`: the group was dropped; or, followed by the reason, it failed.
    Bye(Option<String>),
    /// The coordinator's status: `STATUS`, the round of its deadlock search (u32), then its
    /// verdict if it has one: `LOST`, the rank (u32) and the reason, or `DEADLOCK` and the
    /// description.
    Status {
        round: u32,
        verdict: Option<Verdict>,
    },
    /// The coordinator passes on a goodbye (its own, if its group failed): `GONE`, the rank
    /// (u32), the reason if any.
    Gone {
        rank: usize,
        farewell: Option<String>,
    },
}

/// The longest text a verdict carries.
const MAX_TEXT: usize = 4096;

/// A goodbye's reason: none if empty (a failure always has one).
fn reason(bytes: &[u8]) -> Option<String> {
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(bytes).into_owned())
}

fn text(s: &str) -> &[u8] {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

impl Message {
    fn encode(&self) -> Vec<u8> {
        match self {
            Message::Beat(None) => vec![BEAT],
            Message::Beat(Some((round, b))) => {
                let mut m = vec![BEAT];
                m.extend(round.to_le_bytes());
                m.extend(b.episode.to_le_bytes());
                m.extend(b.stamp.to_le_bytes());
                match b.awaits {
                    None => m.push(0),
                    Some(target) => {
                        m.push(1);
                        m.extend(target.to_le_bytes());
                    }
                }
                let op = &b.op.as_bytes()[..b.op.len().min(64)];
                m.push(op.len() as u8);
                m.extend(op);
                m.extend(to_u32(b.flows.len()).to_le_bytes());
                for f in &b.flows {
                    m.extend(to_u32(f.peer).to_le_bytes());
                    m.extend(f.sent.to_le_bytes());
                    m.extend(f.received.to_le_bytes());
                    m.push(u8::from(f.reading) | u8::from(f.writing) << 1);
                }
                m
            }
            Message::Bye(farewell) => {
                let mut m = vec![BYE];
                m.extend(text(farewell.as_deref().unwrap_or_default()));
                m
            }
            Message::Gone { rank, farewell } => {
                let mut m = vec![GONE];
                m.extend(to_u32(*rank).to_le_bytes());
                m.extend(text(farewell.as_deref().unwrap_or_default()));
                m
            }
            Message::Status { round, verdict } => {
                let mut m = vec![STATUS];
                m.extend(round.to_le_bytes());
                match verdict {
                    None => {}
                    Some(Verdict::Lost { peer, why }) => {
                        m.push(LOST);
                        m.extend(to_u32(*peer).to_le_bytes());
                        m.extend(text(why));
                    }
                    Some(Verdict::Deadlock { detail }) => {
                        m.push(DEADLOCK);
                        m.extend(text(detail));
                    }
                }
                m
            }
        }
    }

    fn decode(payload: &[u8]) -> Result<Message, String> {
        let mut r = Reader(payload);
        let message = match r.u8()? {
            BEAT if r.0.is_empty() => Message::Beat(None),
            BEAT => {
                let round = r.u32()?;
                let episode = r.u64()?;
                let stamp = r.u64()?;
                let awaits = match r.u8()? {
                    0 => None,
                    1 => Some(r.u64()?),
                    other => return Err(format!("bad stamp flag {other}")),
                };
                let op_len = usize::from(r.u8()?);
                let op = String::from_utf8_lossy(r.take(op_len)?).into_owned();
                let n = r.u32()? as usize;
                let mut flows = Vec::with_capacity(n.min(r.0.len() / FLOW_BYTES));
                for _ in 0..n {
                    let peer = r.u32()? as usize;
                    let (sent, received, flags) = (r.u64()?, r.u64()?, r.u8()?);
                    flows.push(Flow {
                        peer,
                        sent,
                        received,
                        reading: flags & 1 != 0,
                        writing: flags & 2 != 0,
                    });
                }
                let blocked = Blocked {
                    episode,
                    op,
                    stamp,
                    awaits,
                    flows,
                };
                Message::Beat(Some((round, blocked)))
            }
            BYE => Message::Bye(reason(r.rest())),
            GONE => Message::Gone {
                rank: r.u32()? as usize,
                farewell: reason(r.rest()),
            },
            STATUS => {
                let round = r.u32()?;
                let verdict = match r.0.first() {
                    None => None,
                    Some(&LOST) => {
                        r.u8()?;
                        let peer = r.u32()? as usize;
                        let why = String::from_utf8_lossy(r.rest()).into_owned();
                        Some(Verdict::Lost { peer, why })
                    }
                    Some(&DEADLOCK) => {
                        r.u8()?;
                        let detail = String::from_utf8_lossy(r.rest()).into_owned();
                        Some(Verdict::Deadlock { detail })
                    }
                    Some(other) => return Err(format!("unknown verdict {other}")),
                };
                Message::Status { round, verdict }
            }
            other => return Err(format!("unknown message kind {other}")),
        };
        r.end()?;
        Ok(message)
    }
}

/// The bytes of one [`Flow`] in a beat.
const FLOW_BYTES: usize = 21;

/// Takes the complete messages out of `buf`. Fails on bytes that are not ours.
pub(crate) fn decode(buf: &mut Vec<u8>) -> Result<Vec<Message>, String> {
    let mut messages = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 4 {
        let len = u32_at(buf, at) as usize;
        if len == 0 || len > MAX_MESSAGE {
            return Err(format!("a message of {len} bytes"));
        }
        if buf.len() - at < 4 + len {
            break;
        }
        messages.push(Message::decode(&buf[at + 4..at + 4 + len])?);
        at += 4 + len;
    }
    buf.drain(..at);
    Ok(messages)
}

/// The largest message: a beat with a flow for every other rank of the largest group.
const MAX_MESSAGE: usize = 128 + crate::Config::MAX_SIZE * FLOW_BYTES;

/// Starts the heartbeat of a coordinator over its `members` (rank i + 1 at index i).
pub(crate) fn coordinate(
    members: Vec<TcpStream>,
    window: Duration,
    liveness: Arc<Liveness>,
) -> io::Result<Heartbeat> {
    let mut peers = members
        .into_iter()
        .enumerate()
        .map(|(i, s)| Peer::new(s, i + 1))
        .collect::<io::Result<Vec<_>>>()?;
    start(liveness, move |live, stop| {
        let tick = interval(window);
        let mut next = Instant::now();
        let mut watch = DeadlockWatch::default();
        // Whether the members have heard that this rank's group failed.
        let mut announced = false;
        // Dropped after a failure: until when to go on passing news (see LINGER).
        let mut linger: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let ticked = now >= next;
            if ticked {
                next = now + tick;
                for p in peers.iter_mut().filter(|p| p.watched) {
                    if now.duration_since(p.heard) > window {
                        live.declare(Verdict::Lost {
                            peer: p.rank,
                            why: silent(p.rank, window),
                        });
                        p.watched = false;
                    }
                }
                let status = Message::Status {
                    round: watch.round,
                    verdict: live.verdict(),
                };
                for p in peers.iter_mut().filter(|p| p.watched) {
                    // A failed socket shows as the member's end of stream in `receive`.
                    let _ = p.send(&status);
                }
            }
            let stopped = {
                let unless = |done: bool| {
                    if done {
                        PollFlags::empty()
                    } else {
                        PollFlags::IN
                    }
                };
                let mut fds: Vec<PollFd<'_>> = vec![
                    PollFd::new(stop, unless(linger.is_some())),
                    PollFd::new(&live.failed, unless(announced)),
                ];
                fds.extend(peers.iter().filter(|p| p.watched).map(|p| p.poll()));
                let until = linger.map_or(next, |l| l.min(next));
                let _ = crate::transport::poll(&mut fds, until.saturating_duration_since(now));
                fds[0].revents().contains(PollFlags::IN)
            };
            if stopped {
                if live.farewell().is_none() {
                    for p in peers.iter_mut().filter(|p| p.watched) {
                        p.say_goodbye(None);
                    }
                    return;
                }
                linger = Some(Instant::now() + LINGER);
            }
            // Departures to pass on: this rank's failure, and the members' goodbyes.
            let mut left = Vec::new();
            if !announced && let Some(why) = live.farewell() {
                announced = true;
                left.push((0, Some(why)));
            }
            let (known, round) = (live.verdict().is_some(), watch.round);
            for p in peers.iter_mut().filter(|p| p.watched) {
                let heard = p.receive();
                for message in heard.messages {
                    match message {
                        Message::Beat(report) => p.report = report,
                        Message::Bye(farewell) => {
                            p.watched = false;
                            p.left = true;
                            left.push((p.rank, farewell));
                        }
                        Message::Status { .. } | Message::Gone { .. } => {}
                    }
                }
                if heard.gone && p.watched {
                    live.declare(Verdict::Lost {
                        peer: p.rank,
                        why: gone(p.rank),
                    });
                    p.watched = false;
                }
            }
            for (rank, farewell) in left {
                if rank != 0 {
                    live.depart(rank, farewell.clone());
                }
                let gone = Message::Gone { rank, farewell };
                for p in peers.iter_mut().filter(|p| p.watched) {
                    // A failed socket shows as the member's end of stream in `receive`.
                    let _ = p.send(&gone);
                }
            }
            if !known && (ticked || watch.suspects()) {
                let own = live.blocked();
                let reports = peers.iter().map(Peer::as_member);
                if let Some(detail) = watch.update(own.as_ref(), reports, ticked) {
                    live.declare(Verdict::Deadlock { detail });
                }
            }
            if (!known && live.verdict().is_some()) || watch.round != round {
                next = Instant::now(); // tell everyone now
            }
            if let Some(until) = linger
                && (Instant::now() >= until || peers.iter().all(|p| !p.watched))
            {
                let farewell = live.farewell();
                for p in peers.iter_mut().filter(|p| p.watched) {
                    p.say_goodbye(farewell.clone());
                }
                return;
            }
        }
    })
}

/// How long a coordinator whose group failed goes on, once dropped, passing on why the members
/// fail (each fails when its neighbour does) before it leaves: until every member has left, at
/// most this long.
const LINGER: Duration = Duration::from_millis(500);

/// Starts the heartbeat of a member over its side-channel `stream` to rank 0.
pub(crate) fn attend(
    stream: TcpStream,
    window: Duration,
    liveness: Arc<Liveness>,
) -> io::Result<Heartbeat> {
    let mut coordinator = Peer::new(stream, 0)?;
    start(liveness, move |live, stop| {
        let tick = interval(window);
        let mut next = Instant::now();
        // The latest round of the coordinator's deadlock search.
        let mut round = 0;
        loop {
            let now = Instant::now();
            if now >= next {
                next = now + tick;
                let report = live.blocked().map(|b| (round, b));
                // A failed socket shows as rank 0's end of stream in `receive`.
                let _ = coordinator.send(&Message::Beat(report));
            }
            if now.duration_since(coordinator.heard) > window {
                live.declare(Verdict::Lost {
                    peer: 0,
                    why: silent(0, window),
                });
                return;
            }
            let stopped = {
                let mut fds = [
                    PollFd::new(stop, PollFlags::IN),
                    PollFd::new(&live.failed, PollFlags::IN),
                    coordinator.poll(),
                ];
                let _ = crate::transport::poll(&mut fds, next.saturating_duration_since(now));
                fds[0].revents().contains(PollFlags::IN)
            };
            // A member whose group failed says why and leaves.
            let farewell = live.farewell();
            if stopped || farewell.is_some() {
                coordinator.say_goodbye(farewell);
                return;
            }
            let heard = coordinator.receive();
            for message in heard.messages {
                match message {
                    Message::Status {
                        round: latest,
                        verdict,
                    } => {
                        if latest != round {
                            // A deadlock is suspected: report again, from now.
                            round = latest;
                            next = Instant::now();
                        }
                        if let Some(v) = verdict {
                            live.declare(v);
                        }
                    }
                    Message::Gone { rank, farewell } => live.depart(rank, farewell),
                    // Rank 0 left the group: nothing more to watch.
                    Message::Bye(farewell) => {
                        live.depart(0, farewell);
                        return;
                    }
                    Message::Beat(_) => {}
                }
            }
            if heard.gone {
                live.declare(Verdict::Lost {
                    peer: 0,
                    why: gone(0),
                });
                return;
            }
        }
    })
}

fn start(
    liveness: Arc<Liveness>,
    run: impl FnOnce(&Liveness, &OwnedFd) + Send + 'static,
) -> io::Result<Heartbeat> {
    let stop = Arc::new(event_counter()?);
    let stop_fd = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name(format!("jaccl-heartbeat-{}", liveness.rank))
        .spawn(move || run(&liveness, &stop_fd))?;
    Ok(Heartbeat {
        stop,
        thread: Some(thread),
    })
}

fn silent(rank: usize, window: Duration) -> String {
    format!(
        "rank {rank} has been silent for {window:?} (stopped, hung, or its host or network is \
         gone; see Config::liveness / JACCL_LIVENESS)"
    )
}

/// Why a rank that dropped its group is missing (shared memory says the same).
pub(crate) fn left(rank: usize) -> String {
    format!("rank {rank} left the group (it dropped it)")
}

fn gone(rank: usize) -> String {
    format!("rank {rank}'s process ended or its connection to rank 0 was lost")
}

/// What a peer said since last time.
struct Heard {
    messages: Vec<Message>,
    /// The stream ended, failed, or carried bytes that are not ours.
    gone: bool,
}

/// One side-channel connection as the heartbeat sees it: framed messages, non-blocking.
struct Peer {
    stream: TcpStream,
    rank: usize,
    buf: Vec<u8>,
    /// The part of a message the socket did not take yet.
    outbox: Vec<u8>,
    heard: Instant,
    watched: bool,
    /// The report of the member's latest beat (at the coordinator).
    report: Option<(u32, Blocked)>,
    /// It said goodbye (at the coordinator).
    left: bool,
}

/// How long a goodbye may wait for the socket to take it.
const GOODBYE_WITHIN: Duration = Duration::from_millis(100);

impl Peer {
    fn new(stream: TcpStream, rank: usize) -> io::Result<Peer> {
        stream.set_nonblocking(true)?;
        // Each message goes out at once: Nagle's algorithm would hold one back until the last
        // is acknowledged (up to the peer's delayed-ACK time), and a goodbye held back is lost
        // when the socket closes.
        stream.set_nodelay(true)?;
        Ok(Peer {
            stream,
            rank,
            buf: Vec::new(),
            outbox: Vec::new(),
            heard: Instant::now(),
            watched: true,
            report: None,
            left: false,
        })
    }

    /// The member as the deadlock search sees it.
    fn as_member(&self) -> Member<'_> {
        match &self.report {
            _ if self.left => Member::Left,
            Some((round, b)) if self.watched => Member::Blocked(*round, b),
            _ => Member::Moving,
        }
    }

    fn poll(&self) -> PollFd<'_> {
        PollFd::new(&self.stream, PollFlags::IN)
    }

    /// Sends `message` as far as the socket takes it now. A message is queued only once the
    /// earlier ones are out, so a peer too slow to read misses whole messages (it is found by
    /// its own silence), never parts of one.
    ///
    /// # Errors
    /// The socket failed (the peer is gone).
    fn send(&mut self, message: &Message) -> io::Result<()> {
        self.flush()?;
        if self.outbox.is_empty() {
            let payload = message.encode();
            self.outbox.extend(to_u32(payload.len()).to_le_bytes());
            self.outbox.extend(payload);
            self.flush()?;
        }
        Ok(())
    }

    /// Writes as much of the outbox as the socket takes now.
    ///
    /// # Errors
    /// The socket failed (the peer is gone); a full socket is not an error.
    fn flush(&mut self) -> io::Result<()> {
        while !self.outbox.is_empty() {
            match self.stream.write(&self.outbox) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => drop(self.outbox.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends a goodbye, waiting up to [`GOODBYE_WITHIN`] for the socket to take it (without
    /// it the peer would take this rank's leaving for a death). A peer already gone needs
    /// none: polling its failed socket would return at once, over and over, until the
    /// deadline.
    fn say_goodbye(&mut self, farewell: Option<String>) {
        let deadline = Instant::now() + GOODBYE_WITHIN;
        let mut said = false;
        loop {
            if self.flush().is_err() {
                return;
            }
            if self.outbox.is_empty() {
                if said {
                    // Closing a socket with unread bytes resets the connection, and a reset
                    // may discard what the peer has not yet taken in: read them first.
                    let _ = self.receive();
                    return;
                }
                if self.send(&Message::Bye(farewell.clone())).is_err() {
                    return;
                }
                said = true;
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut fds = [PollFd::new(&self.stream, PollFlags::OUT)];
            let _ = crate::transport::poll(&mut fds, left);
        }
    }

    /// Reads what arrived: the complete messages, and whether the stream is gone (messages
    /// before its end still count: a goodbye, or a verdict).
    fn receive(&mut self) -> Heard {
        let mut chunk = [0u8; 4096];
        let mut gone = false;
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    gone = true;
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        let messages = match decode(&mut self.buf) {
            Ok(messages) => messages,
            Err(_) => {
                gone = true;
                Vec::new()
            }
        };
        if !messages.is_empty() {
            self.heard = Instant::now();
        }
        Heard { messages, gone }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn framed(message: &Message) -> Vec<u8> {
        let payload = message.encode();
        let mut b = to_u32(payload.len()).to_le_bytes().to_vec();
        b.extend_from_slice(&payload);
        b
    }

    /// Every rank's report, none left.
    fn all(reports: &[Blocked]) -> Vec<Option<&Blocked>> {
        reports.iter().map(Some).collect()
    }

    fn blocked(episode: u64, flows: &[(usize, u64, u64, bool, bool)]) -> Blocked {
        Blocked {
            episode,
            stamp: 0,
            awaits: None,
            op: "recv".into(),
            flows: flows
                .iter()
                .map(|&(peer, sent, received, reading, writing)| Flow {
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
        // Nothing known about rank 2: no explanation.
        assert!(
            live.explain(Some(2), Duration::ZERO, Op::AllReduce)
                .is_none()
        );
        // Rank 2 failed because rank 1 left; this rank then fails because of rank 2.
        live.depart(2, Some(left(1)));
        live.depart(2, None); // the first word about a rank stays
        let error = live
            .explain(Some(2), Duration::from_secs(60), Op::AllReduce)
            .expect("rank 2's departure");
        let Error::PeerLost {
            rank, peer, cause, ..
        } = &error
        else {
            panic!("expected PeerLost, got {error:?}");
        };
        assert_eq!((*rank, *peer), (3, 2));
        assert_eq!(
            cause,
            "rank 2's group failed: rank 1 left the group (it dropped it)"
        );
        // Its own goodbye names the first cause, not the chain, so chains never grow.
        live.fail(&error);
        assert_eq!(live.farewell(), Some(left(1)));
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

    #[test]
    fn messages_round_trip_in_pieces() {
        let messages = [
            Message::Beat(None),
            Message::Beat(Some((7, blocked(3, &[(1, 10, 20, true, false)])))),
            Message::Status {
                round: 2,
                verdict: Some(Verdict::Lost {
                    peer: 3,
                    why: "silent".into(),
                }),
            },
            Message::Status {
                round: 4,
                verdict: Some(Verdict::Deadlock {
                    detail: "ranks 0 and 1".into(),
                }),
            },
            Message::Status {
                round: 5,
                verdict: None,
            },
            Message::Bye(None),
            Message::Bye(Some("rank 3: all_reduce: timed out".into())),
            Message::Gone {
                rank: 2,
                farewell: None,
            },
            Message::Gone {
                rank: 0,
                farewell: Some("rank 1 left the group".into()),
            },
        ];
        let stream: Vec<u8> = messages.iter().flat_map(framed).collect();
        let mut buf = stream[..3].to_vec();
        assert_eq!(decode(&mut buf), Ok(vec![]));
        buf.extend_from_slice(&stream[3..]);
        assert_eq!(decode(&mut buf).as_deref(), Ok(&messages[..]));
        assert!(buf.is_empty());
        assert!(decode(&mut vec![1, 0, 0, 0, 9]).is_err());
        assert!(decode(&mut vec![0, 0, 0, 0]).is_err());
    }

    #[test]
    fn a_receive_cycle_with_nothing_on_its_way_is_a_deadlock() {
        // Ranks 0 and 1 each wait for the other, and each has taken all the other sent.
        let cycle = |received_by_0| {
            [
                blocked(1, &[(1, 40, received_by_0, true, false)]),
                blocked(1, &[(0, 40, 40, true, false)]),
            ]
        };
        assert!(deadlocked(&all(&cycle(40))));
        // Bytes on their way to rank 0, which reads: it will move.
        assert!(!deadlocked(&all(&cycle(30))));
        // Rank 1 waits to send to rank 0, which reads from it: it will move.
        let sending = [
            blocked(1, &[(1, 40, 40, true, false)]),
            blocked(1, &[(0, 40, 40, false, true)]),
        ];
        assert!(!deadlocked(&all(&sending)));
        // Rank 1 sends to rank 0, which reads only from rank 2, which waits for rank 0.
        let stuck = [
            blocked(1, &[(1, 0, 0, false, false), (2, 0, 0, true, false)]),
            blocked(1, &[(0, 64, 0, false, true), (2, 0, 0, false, false)]),
            blocked(1, &[(0, 0, 0, true, false), (1, 0, 0, false, false)]),
        ];
        assert!(deadlocked(&all(&stuck)));
        let detail = describe(&all(&stuck));
        assert!(
            detail.contains("rank 1 in recv waits for rank 0 to take its data"),
            "{detail}"
        );
    }

    #[test]
    fn a_direct_collective_waits_for_stamps() {
        let at = |stamp, awaits, b: Blocked| Blocked { stamp, awaits, ..b };
        // Ranks 0 and 1 receive from each other; rank 2 (no connection to rank 0) waits in a
        // direct collective for both to publish stamp 5.
        let group = |stamp_of_1| {
            [
                at(4, None, blocked(1, &[(1, 0, 0, true, false)])),
                at(stamp_of_1, None, blocked(1, &[(0, 0, 0, true, false)])),
                at(
                    5,
                    Some(5),
                    blocked(1, &[(1, 0, 0, true, false), (0, 0, 0, true, false)]),
                ),
            ]
        };
        assert!(deadlocked(&all(&group(4))));
        let detail = describe(&all(&group(4)));
        assert!(
            detail.contains("rank 2 in recv waits for rank 1 to join and rank 0 to join"),
            "{detail}"
        );
        // Rank 1 has published 5: rank 2 will see it. (And rank 0, which waits on rank 1, is
        // waiting on a rank in a collective it did not call: it fails with a mismatch.)
        assert!(!deadlocked(&all(&group(5))));
        // Ranks 0 and 1 receive from each other after rank 2 left: still a deadlock, unless one
        // of them waits on rank 2 (which then fails with `PeerLost`).
        let left = |reading_2| {
            let waits_on_2 = blocked(1, &[(1, 0, 0, true, false), (2, 0, 0, reading_2, false)]);
            vec![
                Some(waits_on_2),
                Some(blocked(1, &[(0, 0, 0, true, false)])),
                None,
            ]
        };
        let with_left = |r: &[Option<Blocked>]| -> bool {
            deadlocked(&r.iter().map(Option::as_ref).collect::<Vec<_>>())
        };
        assert!(with_left(&left(false)));
        assert!(!with_left(&left(true)));
    }

    #[test]
    fn a_deadlock_is_declared_only_after_a_round_that_every_member_saw() {
        let own = blocked(5, &[(1, 8, 8, true, false)]);
        let member = |episode| blocked(episode, &[(0, 8, 8, true, false)]);
        let (nine, ten) = (member(9), member(10));
        let mut watch = DeadlockWatch::default();
        let mut update = |m: Member<'_>, search| watch.update(Some(&own), [m].into_iter(), search);
        // Only a search finds a new suspicion.
        assert_eq!(update(Member::Blocked(0, &nine), false), None);
        assert_eq!(update(Member::Blocked(0, &nine), true), None);
        // The same report again, sent before the member saw round 1: not yet.
        assert_eq!(update(Member::Blocked(0, &nine), false), None);
        assert!(update(Member::Blocked(1, &nine), false).is_some());
        // The member moved in between (a new stretch of waiting): suspected again, not declared.
        let mut watch = DeadlockWatch::default();
        let mut update = |m: Member<'_>| watch.update(Some(&own), [m].into_iter(), true);
        assert_eq!(update(Member::Blocked(0, &nine)), None);
        assert_eq!(update(Member::Blocked(1, &ten)), None);
        // A member that is not blocked: nothing.
        assert_eq!(update(Member::Moving), None);
        assert_eq!(watch.round, 2);
        assert!(!watch.suspects());
        // Rank 0 not blocked: nothing.
        assert_eq!(
            watch.update(None, [Member::Blocked(2, &ten)].into_iter(), true),
            None
        );
        assert!(!watch.suspects());
        // Rank 1 has left; ranks 0 and 2 wait for each other: a deadlock, and the rank that
        // left needs no round.
        let own = blocked(5, &[(2, 0, 0, true, false)]);
        let two = blocked(3, &[(0, 0, 0, true, false)]);
        let members = || [Member::Left, Member::Blocked(0, &two)].into_iter();
        let members_later = || [Member::Left, Member::Blocked(1, &two)].into_iter();
        let mut watch = DeadlockWatch::default();
        assert_eq!(watch.update(Some(&own), members(), true), None);
        let detail = watch.update(Some(&own), members_later(), false);
        assert!(detail.is_some_and(|d| d.contains("rank 1 has left")));
    }

    proptest! {
        /// Frames with plausible lengths and kinds, random contents.
        #[test]
        fn heartbeat_messages_never_panic(kind in 0u8..6, body in proptest::collection::vec(any::<u8>(), 0..64), cut in 0usize..80) {
            let mut payload = vec![kind];
            payload.extend(body);
            let mut buf = to_u32(payload.len()).to_le_bytes().to_vec();
            buf.extend(payload);
            buf.truncate(cut.max(1));
            let _ = decode(&mut buf);
        }

        /// Beats with reports: whole, they round-trip; cut short or with a byte changed, they
        /// decode to something or fail, never panic.
        #[test]
        fn beats_with_reports_round_trip_and_survive_damage(
            round in any::<u32>(),
            episode in any::<u64>(),
            stamp in any::<u64>(),
            awaits in any::<Option<u64>>(),
            flows in proptest::collection::vec((0usize..100, any::<u64>(), any::<u64>(), any::<bool>(), any::<bool>()), 0..20),
            cut in 0usize..600,
            at in 0usize..600,
            byte in any::<u8>(),
        ) {
            let report = Blocked { stamp, awaits, ..blocked(episode, &flows) };
            let beat = Message::Beat(Some((round, report)));
            let whole = framed(&beat);
            prop_assert_eq!(decode(&mut whole.clone()), Ok(vec![beat]));
            let mut damaged = whole.clone();
            let at = at % damaged.len();
            damaged[at] = byte;
            let _ = decode(&mut damaged);
            let _ = decode(&mut whole[..cut.min(whole.len())].to_vec());
        }
    }
}
