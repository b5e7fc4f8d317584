//! Agreement among the living ranks of a group, whichever ranks died and whenever: on the AND
//! of a flag, on the ranks alive, and on the ranks a caller left out. [`crate::Group::agree`]
//! and [`crate::Group::shrink`] run it; it needs nothing of the group but the job's listeners,
//! so it works after the group failed, rank 0 (the heartbeat's hub) included.
//!
//! The lowest rank a rank does not know to be lost coordinates: every other rank connects to
//! it through the job's listener and sends what it brings; the coordinator waits until each
//! rank has come or is known lost, decides (the ranks that came, the AND of their flags) and
//! sends the decision to each. A rank is known lost when its listener refuses a connection
//! (its process ended: its host's kernel says so at once) or when it has not answered a
//! question for the liveness window (stopped, hung, or its host gone; a rank the heartbeat
//! has already declared lost was silent that long already). Questions go to the accepting
//! thread (`crate::transport::questions`), which answers while the application computes.
//!
//! A rank that learns the decision keeps it where its listener answers questions, so a
//! decision once sent is the decision: when the coordinator dies half-way through sending
//! it, the next coordinator asks the ranks that do not come and adopts what one of them
//! already received; a rank that was taken for lost and comes back learns the decision
//! the same way, and finds itself left out. Every wait ends: by an answer, by the liveness
//! window for silent ranks, by the operation timeout for living ranks that never come, or
//! by `go_on` (an interrupt, the group closing).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::auth::Purpose;
use crate::error::{Error, Op, Result};
use crate::op_header::{Reader, to_u32};
use crate::os::{deadline_after, poll};
use crate::transport::frame::{read_frame, write_frame};
use crate::transport::listener::JobListener;
use crate::transport::questions::{Answer, MAX_DECISION};

/// How long one question to a rank's listener may take: answering costs its accepting thread
/// a handshake, milliseconds even on a loaded host.
const ASK_WITHIN: Duration = Duration::from_millis(500);

/// How often a rank that waits asks again about a rank that has not come (the coordinator)
/// or has not decided (a member, about the coordinator).
const ASK_EVERY: Duration = Duration::from_millis(200);

/// The longest a wait sleeps before it looks at everything again.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// One agreement among the ranks of a group.
pub(crate) struct Agreement<'a> {
    pub(crate) job: &'a JobListener,
    /// The agreement's id, in its connections and in the questions about it; the same on
    /// every rank, and never used by another agreement of the job.
    pub(crate) id: u64,
    /// The job's rank of each rank of the group.
    pub(crate) job_rank: &'a [usize],
    /// This rank in the group.
    pub(crate) rank: usize,
    /// How long a rank may be silent before it counts as lost (the liveness window).
    pub(crate) window: Duration,
    /// When to stop waiting for ranks that live but do not come (the operation timeout).
    pub(crate) deadline: Instant,
    /// The operation, for errors.
    pub(crate) op: Op,
    /// Asked between waits: its error (an interrupt, the group closing) ends the agreement.
    pub(crate) go_on: &'a dyn Fn() -> Result<()>,
}

/// What a rank brings to an agreement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bringing {
    pub(crate) flag: bool,
    /// Ranks the caller leaves out, sorted (every rank must bring the same).
    pub(crate) left_out: Vec<usize>,
}

/// What the ranks agreed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The AND of the flags of the ranks alive, and those ranks (sorted).
    Agreed { flag: bool, alive: Vec<usize> },
    /// `peer` brought other ranks to leave out than the coordinator `by`.
    Mismatch {
        by: usize,
        peer: usize,
        detail: String,
    },
}

/// What a rank learnt of the coordinator it follows.
enum Followed {
    Decided(Decision),
    /// The coordinator is lost: the next rank coordinates.
    Lost,
    /// The connection failed, but the coordinator lives: try again.
    Again,
}

/// What a question about a rank found.
enum Heard {
    Lost,
    Decided(Vec<u8>),
    /// It lives (or has not been silent for the window yet).
    Maybe,
}

impl Agreement<'_> {
    /// Runs the agreement: `hints` are ranks the heartbeat already declared lost (a silent one
    /// counts as silent for the window already; one whose listener still answers is not
    /// lost).
    pub(crate) fn run(&self, mine: &Bringing, hints: &[usize]) -> Result<Decision> {
        let now = Instant::now();
        let long_ago = now.checked_sub(self.window).unwrap_or(now);
        let mut silent: HashMap<usize, Instant> = hints
            .iter()
            .filter(|&&r| r != self.rank)
            .map(|&r| (r, long_ago))
            .collect();
        let mut lost: BTreeSet<usize> = mine.left_out.iter().copied().collect();
        loop {
            (self.go_on)()?;
            self.check_deadline(&[])?;
            let size = self.job_rank.len();
            let Some(coordinator) = (0..size).find(|r| !lost.contains(r)) else {
                return Err(self.io("no rank is left to coordinate"));
            };
            if coordinator == self.rank {
                return self.coordinate(mine, lost, &mut silent);
            }
            match self.follow(coordinator, mine, &lost, &mut silent)? {
                Followed::Decided(decision) => return Ok(decision),
                Followed::Lost => {
                    lost.insert(coordinator);
                }
                Followed::Again => std::thread::sleep(LOOK_AGAIN),
            }
        }
    }

    /// A member: sends what it brings to `coordinator` and waits for the decision.
    fn follow(
        &self,
        coordinator: usize,
        mine: &Bringing,
        lost: &BTreeSet<usize>,
        silent: &mut HashMap<usize, Instant>,
    ) -> Result<Followed> {
        match self.hear(coordinator, silent) {
            Heard::Lost => return Ok(Followed::Lost),
            Heard::Decided(d) => return self.decided(coordinator, &d).map(Followed::Decided),
            Heard::Maybe => {}
        }
        let peer = self.job_rank[coordinator];
        let Ok(mut stream) = self
            .job
            .dial_once(Purpose::Side, self.id, peer, ASK_WITHIN * 2)
        else {
            return Ok(Followed::Again);
        };
        let hello = encode_bringing(mine, lost);
        if write_frame(&mut stream, &hello, deadline_after(ASK_WITHIN)).is_err() {
            return Ok(Followed::Again);
        }
        let mut asked = Instant::now();
        loop {
            (self.go_on)()?;
            self.check_deadline(&[coordinator])?;
            if crate::os::wait_readable(stream.as_fd(), LOOK_AGAIN)
                .map_err(|e| Error::io(self.rank, self.op.name(), e))?
            {
                // The decision, or the end of the stream: either is there now.
                if let Ok(d) = read_frame(&mut stream, deadline_after(ASK_WITHIN), MAX_DECISION) {
                    return self.decided(coordinator, &d).map(Followed::Decided);
                }
                return Ok(match self.hear(coordinator, silent) {
                    Heard::Lost => Followed::Lost,
                    Heard::Decided(d) => Followed::Decided(self.decided(coordinator, &d)?),
                    Heard::Maybe => Followed::Again,
                });
            }
            if asked.elapsed() >= ASK_EVERY {
                asked = Instant::now();
                match self.hear(coordinator, silent) {
                    Heard::Lost => return Ok(Followed::Lost),
                    Heard::Decided(d) => {
                        return self.decided(coordinator, &d).map(Followed::Decided);
                    }
                    Heard::Maybe => {}
                }
            }
        }
    }

    /// The coordinator: waits until every rank not `lost` has come or is lost, decides, and
    /// tells every rank that came.
    fn coordinate(
        &self,
        mine: &Bringing,
        mut lost: BTreeSet<usize>,
        silent: &mut HashMap<usize, Instant>,
    ) -> Result<Decision> {
        let size = self.job_rank.len();
        let mut came: BTreeMap<usize, (TcpStream, Bringing)> = BTreeMap::new();
        let mut asked: HashMap<usize, Instant> = HashMap::new();
        loop {
            (self.go_on)()?;
            for r in 0..size {
                if r == self.rank || lost.contains(&r) || came.contains_key(&r) {
                    continue;
                }
                let slot = (Purpose::Side, self.id, self.job_rank[r], 0);
                let taken = self.job.take_parked(slot).map_err(|why| self.io(&why))?;
                let Some(mut stream) = taken else { continue };
                let hello = read_frame(&mut stream, deadline_after(ASK_WITHIN), MAX_DECISION);
                // One that cannot say what it brings is asked about like one that did not come.
                let Some((theirs, their_lost)) = hello.ok().and_then(|h| decode_bringing(&h, size))
                else {
                    continue;
                };
                // What it found lost is lost, unless that one came (it lives after all).
                for l in their_lost {
                    if l != self.rank && !came.contains_key(&l) {
                        lost.insert(l);
                    }
                }
                came.insert(r, (stream, theirs));
            }
            // One that came and whose connection ended has died (it waits for the decision).
            let ended: Vec<usize> = came
                .iter()
                .filter(|(_, (s, _))| {
                    crate::os::wait_readable(s.as_fd(), Duration::ZERO).unwrap_or(true)
                })
                .map(|(&r, _)| r)
                .collect();
            for r in ended {
                came.remove(&r);
                lost.insert(r);
            }
            let absent: Vec<usize> = (0..size)
                .filter(|r| *r != self.rank && !lost.contains(r) && !came.contains_key(r))
                .collect();
            if absent.is_empty() {
                let decision = self.decide(mine, &came);
                return Ok(self.tell(decision, came));
            }
            self.check_deadline(&absent)?;
            for &r in &absent {
                if asked.get(&r).is_some_and(|at| at.elapsed() < ASK_EVERY) {
                    continue;
                }
                asked.insert(r, Instant::now());
                match self.hear(r, silent) {
                    Heard::Lost => {
                        lost.insert(r);
                    }
                    // A decision was made before (by a coordinator that died sending it): it
                    // stands.
                    Heard::Decided(d) => {
                        let decision = self.decided(r, &d)?;
                        return Ok(self.tell(decision, came));
                    }
                    Heard::Maybe => {}
                }
            }
            let mut fds = [PollFd::from_borrowed_fd(self.job.arrivals(), PollFlags::IN)];
            poll(&mut fds, LOOK_AGAIN).map_err(|e| Error::io(self.rank, self.op.name(), e))?;
        }
    }

    /// The coordinator's decision over the ranks that `came` and itself.
    fn decide(&self, mine: &Bringing, came: &BTreeMap<usize, (TcpStream, Bringing)>) -> Decision {
        for (&peer, (_, theirs)) in came {
            if theirs.left_out != mine.left_out {
                return Decision::Mismatch {
                    by: self.rank,
                    peer,
                    detail: format!(
                        "rank {} leaves out ranks {:?}, rank {peer} {:?}",
                        self.rank, mine.left_out, theirs.left_out
                    ),
                };
            }
        }
        let mut alive: Vec<usize> = came.keys().copied().collect();
        alive.push(self.rank);
        alive.sort_unstable();
        Decision::Agreed {
            flag: mine.flag && came.values().all(|(_, b)| b.flag),
            alive,
        }
    }

    /// Keeps `decision` for the questions of others, and sends it to every rank that came (one
    /// that died since fails what comes next, not this).
    fn tell(&self, decision: Decision, came: BTreeMap<usize, (TcpStream, Bringing)>) -> Decision {
        let bytes = encode_decision(&decision);
        self.job.answers().decide(self.id, &bytes);
        for (_, (mut stream, _)) in came {
            let _ = write_frame(&mut stream, &bytes, deadline_after(ASK_WITHIN));
        }
        decision
    }

    /// The decision `from` sent or answered, checked, and kept for the questions of others.
    fn decided(&self, from: usize, bytes: &[u8]) -> Result<Decision> {
        let decision =
            decode_decision(bytes, self.job_rank.len()).ok_or_else(|| Error::Protocol {
                rank: self.rank,
                peer: from,
                op: self.op,
                detail: "its decision is not one of jaccl's".into(),
            })?;
        self.job.answers().decide(self.id, bytes);
        Ok(decision)
    }

    /// Asks about rank `r`: lost when its listener is gone, or silent for the window.
    fn hear(&self, r: usize, silent: &mut HashMap<usize, Instant>) -> Heard {
        match self.job.ask(self.job_rank[r], self.id, ASK_WITHIN) {
            Answer::Gone => Heard::Lost,
            Answer::Decided(d) => Heard::Decided(d),
            Answer::Undecided => {
                silent.remove(&r);
                Heard::Maybe
            }
            Answer::Silent => {
                let since = *silent.entry(r).or_insert_with(Instant::now);
                if since.elapsed() >= self.window {
                    Heard::Lost
                } else {
                    Heard::Maybe
                }
            }
        }
    }

    /// [`Error::Timeout`] once the operation timeout passed, naming the ranks waited for.
    fn check_deadline(&self, waiting_for: &[usize]) -> Result<()> {
        if Instant::now() < self.deadline {
            return Ok(());
        }
        tracing::warn!(rank = self.rank, ?waiting_for, "agreement timed out");
        Err(Error::Timeout {
            rank: self.rank,
            op: self.op,
            after: self.deadline.saturating_duration_since(Instant::now()),
        })
    }

    fn io(&self, why: &str) -> Error {
        Error::io(
            self.rank,
            self.op.name(),
            std::io::Error::other(why.to_owned()),
        )
    }
}

/// A list of ranks: its length, then each (`u32`s, little-endian).
fn encode_ranks(b: &mut Vec<u8>, ranks: impl ExactSizeIterator<Item = usize>) {
    b.extend_from_slice(&to_u32(ranks.len()).to_le_bytes());
    for r in ranks {
        b.extend_from_slice(&to_u32(r).to_le_bytes());
    }
}

/// Reads [`encode_ranks`]' list: strictly increasing ranks below `size`.
fn decode_ranks(r: &mut Reader<'_>, size: usize) -> Option<Vec<usize>> {
    let n = r.u32().ok()? as usize;
    if n > size {
        return None;
    }
    let ranks: Vec<usize> = (0..n)
        .map(|_| r.u32().map(|x| x as usize))
        .collect::<std::result::Result<_, _>>()
        .ok()?;
    let increasing = ranks.windows(2).all(|w| w[0] < w[1]);
    (increasing && ranks.iter().all(|&x| x < size)).then_some(ranks)
}

/// A member's hello: its flag, the ranks it leaves out, the ranks it found lost.
fn encode_bringing(b: &Bringing, lost: &BTreeSet<usize>) -> Vec<u8> {
    let mut bytes = vec![u8::from(b.flag)];
    encode_ranks(&mut bytes, b.left_out.iter().copied());
    encode_ranks(&mut bytes, lost.iter().copied());
    bytes
}

fn decode_bringing(bytes: &[u8], size: usize) -> Option<(Bringing, Vec<usize>)> {
    let mut r = Reader(bytes);
    let flag = match r.u8().ok()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let left_out = decode_ranks(&mut r, size)?;
    let lost = decode_ranks(&mut r, size)?;
    r.end().ok()?;
    Some((Bringing { flag, left_out }, lost))
}

/// A decision: 0, the flag and the ranks alive; or 1, the coordinator, the peer, the detail.
fn encode_decision(d: &Decision) -> Vec<u8> {
    match d {
        Decision::Agreed { flag, alive } => {
            let mut b = vec![0, u8::from(*flag)];
            encode_ranks(&mut b, alive.iter().copied());
            b
        }
        Decision::Mismatch { by, peer, detail } => {
            let mut b = vec![1];
            b.extend_from_slice(&to_u32(*by).to_le_bytes());
            b.extend_from_slice(&to_u32(*peer).to_le_bytes());
            b.extend_from_slice(detail.as_bytes());
            b
        }
    }
}

fn decode_decision(bytes: &[u8], size: usize) -> Option<Decision> {
    let mut r = Reader(bytes);
    match r.u8().ok()? {
        0 => {
            let flag = match r.u8().ok()? {
                0 => false,
                1 => true,
                _ => return None,
            };
            let alive = decode_ranks(&mut r, size)?;
            r.end().ok()?;
            (!alive.is_empty()).then_some(Decision::Agreed { flag, alive })
        }
        1 => {
            let by = r.u32().ok()? as usize;
            let peer = r.u32().ok()? as usize;
            let detail = String::from_utf8_lossy(r.rest()).into_owned();
            (by < size && peer < size).then_some(Decision::Mismatch { by, peer, detail })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn messages_round_trip_and_foreign_bytes_are_refused() {
        let b = Bringing {
            flag: true,
            left_out: vec![1, 3],
        };
        let lost = BTreeSet::from([0, 2]);
        assert_eq!(
            decode_bringing(&encode_bringing(&b, &lost), 4),
            Some((b, vec![0, 2]))
        );
        let agreed = Decision::Agreed {
            flag: false,
            alive: vec![0, 2, 3],
        };
        assert_eq!(decode_decision(&encode_decision(&agreed), 4), Some(agreed));
        let mismatch = Decision::Mismatch {
            by: 0,
            peer: 2,
            detail: "x".into(),
        };
        assert_eq!(
            decode_decision(&encode_decision(&mismatch), 4),
            Some(mismatch)
        );
        // Ranks out of range, out of order, twice; an empty group; a bad flag.
        for bad in [
            vec![0, 1, 1, 0, 0, 0, 4, 0, 0, 0],
            vec![0, 1, 2, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0],
            vec![0, 1, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0],
            vec![0, 1, 0, 0, 0, 0],
            vec![0, 2, 0, 0, 0, 0],
        ] {
            assert_eq!(decode_decision(&bad, 4), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_decision(&bytes, 8);
            let _ = decode_bringing(&bytes, 8);
        }
    }
}
