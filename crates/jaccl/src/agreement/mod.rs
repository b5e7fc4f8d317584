//! Agreement among the living ranks of a group, whichever ranks died and whenever: on the AND
//! of a flag, on the ranks alive, and on what was called (which operation, which ranks the
//! caller leaves out). [`crate::Group::agree`] and [`crate::Group::shrink`] run it; it needs
//! nothing of the group but the job's listeners, so it works after the group failed, rank 0
//! (the heartbeat's hub) included.
//!
//! The lowest rank a rank does not count as lost coordinates: every other rank connects to it
//! through the job's listener and sends what it brings; the coordinator waits until each rank
//! has come or is counted as lost, decides (the ranks that came, the AND of their flags) and
//! sends the decision to each. A rank is counted as lost when its listener refuses a
//! connection (its process ended: its host's kernel says so at once), when it has not
//! answered questions for the liveness window (stopped, hung, cut off; twice is enough for a
//! rank the heartbeat already declared lost), or when another rank counts it as lost.
//!
//! Every rank says where it stands (taking part, with its call and the ranks it counts as
//! lost; decided, and what; out) through its listener's answers
//! (`crate::transport::questions`), which come while the application computes. So:
//! - a decision is made in two steps: the coordinator proposes it to every rank that came,
//!   and makes it final only once each has taken it (one that does not is left out, and the
//!   rest proposed again). A member that loses its coordinator after taking a proposal keeps
//!   it as the decision (the coordinator may have made it final for others), and a decision
//!   one rank holds is adopted by any later coordinator that asks it: a coordinator that dies
//!   half-way is replaced without a second decision;
//! - counting a rank as lost spreads and is never undone: a rank that learns that another
//!   counts it as lost is out (its call fails with [`Error::LeftOut`]), which ends a
//!   coordinator that was stopped and resumed while the others went on;
//! - a coordinator decides only with more than half of the ranks not known to have ended
//!   (left-out ones aside): of the two sides of a network partition, at most one goes on;
//! - calls that differ (another operation, other ranks left out) fail with a
//!   [`Decision::Mismatch`] on every rank, the coordinator asking the ranks left out whether
//!   they take part; a rank whose part fails (an interrupt) says it is out, so that no one
//!   waits for it.
//!
//! What is not covered: a coordinator that dies while it proposes again (without a member
//! that did not take the first proposal in time) can leave its members with the two
//! proposals, which `agree` then returns (a shrink's forming fails for both, and the next
//! attempt agrees); a partition whose firewall refuses connections (a TCP reset) makes the
//! ranks across it look ended, so both sides may count a majority; a rank stopped through
//! more than a thousand agreements of the others finds theirs forgotten and waits for the
//! operation timeout.
//!
//! Every wait ends: by an answer, by the liveness window for silent ranks, by the operation
//! timeout for living ranks that never come, or by `go_on` (an interrupt).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::auth::Purpose;
use crate::error::{Error, Op, Result};
use crate::os::{deadline_after, poll};
use crate::transport::frame::{read_frame, write_frame};
use crate::transport::listener::JobListener;
use crate::transport::questions::{Answer, MAX_STANDING};
pub(crate) use wire::{Bringing, Call, Decision};
use wire::{Standing, decode_bringing, decode_standing, encode_decision, encode_standing};

mod member;
mod wire;

/// How long one question to a rank's listener may take: answering costs its accepting thread
/// a handshake, milliseconds even on a loaded host.
const ASK_WITHIN: Duration = Duration::from_millis(500);

/// How often a coordinator asks again about a rank that has not come (one that died is then
/// found at once).
const ASK_EVERY: Duration = Duration::from_millis(200);

/// The longest a wait sleeps before it looks at everything again.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// What a coordinator sends a member that came: a proposal to take (then the decision follows
/// as a bare [`COMMIT`]), or a decision already final; and what the member answers a proposal.
const PROPOSE: u8 = 0;
const FINAL: u8 = 1;
const COMMIT: u8 = 2;
const TAKEN: u8 = 3;
/// A member that did not take a proposal within the liveness window is left out: told so
/// before its connection closes.
const DROPPED: u8 = 4;

/// One agreement among the ranks of a group.
pub(crate) struct Agreement<'a> {
    pub(crate) job: &'a Arc<JobListener>,
    /// The agreement's id, in its connections and in the questions about it; the same on
    /// every rank, and never used by another agreement of the job.
    pub(crate) id: u64,
    /// The job's rank of each rank of the group.
    pub(crate) job_rank: &'a [usize],
    /// This rank in the group.
    pub(crate) rank: usize,
    /// How long a rank may be silent before it counts as lost (the liveness window).
    pub(crate) window: Duration,
    /// The operation timeout, and when it ends: the longest living ranks that do not come
    /// are waited for.
    pub(crate) timeout: Duration,
    pub(crate) deadline: Instant,
    /// The operation, for errors.
    pub(crate) op: Op,
    /// Asked between waits: its error (an interrupt) ends the agreement.
    pub(crate) go_on: &'a dyn Fn() -> Result<()>,
}

/// What the ranks of this agreement have learnt of one another.
#[derive(Default)]
struct Known {
    /// Counted as lost (never undone).
    lost: BTreeSet<usize>,
    /// Of those, the ones whose process is known to have ended.
    gone: BTreeSet<usize>,
    /// Since when each rank has not answered, and how many times in a row.
    silent: HashMap<usize, (Instant, u32)>,
    /// Ranks the heartbeat already declared lost.
    hinted: BTreeSet<usize>,
}

/// What a question about a rank found.
enum Heard {
    Lost,
    Said(Standing),
    /// It lives, or has not been silent for long enough.
    Nothing,
}

/// How a rank's part of the agreement ends, short of the coordinator's decision.
enum Outcome {
    /// A decision made elsewhere, which stands.
    Adopt(Decision),
    /// `peer` called something else.
    Mismatch { peer: usize, detail: String },
    /// This rank is out of it.
    Fail(Error),
}

/// What a member learnt of the coordinator it follows.
enum Followed {
    Done(Outcome),
    /// The coordinator is lost: the next rank coordinates.
    Lost,
    /// The connection failed, but the coordinator may live: try again.
    Again,
}

/// Marks this process as gone on from agreement `id` (the next attempt of a shrink whose
/// group it formed): ranks that ask fail with [`Error::LeftOut`] rather than wait for it.
pub(crate) fn moved_on(job: &JobListener, id: u64) {
    job.answers()
        .stand(id, &encode_standing(&Standing::MovedOn), true);
}

impl Agreement<'_> {
    /// Runs the agreement: `hints` are ranks the heartbeat already declared lost. A rank that
    /// fails (an interrupt, a timeout) says it is out, so that no one waits for it.
    pub(crate) fn run(&self, mine: &Bringing, hints: &[usize]) -> Result<Decision> {
        let ran = self.run_until_decided(mine, hints);
        if ran.is_err() {
            self.stand(&Standing::Out);
        }
        ran
    }

    fn run_until_decided(&self, mine: &Bringing, hints: &[usize]) -> Result<Decision> {
        let mut known = Known {
            lost: mine.call.left_out.iter().copied().collect(),
            hinted: hints.iter().copied().filter(|&r| r != self.rank).collect(),
            ..Known::default()
        };
        loop {
            (self.go_on)()?;
            self.check_deadline(&[])?;
            self.stand_taking(mine, &known);
            let size = self.job_rank.len();
            let Some(coordinator) = (0..size).find(|r| !known.lost.contains(r)) else {
                return Err(self.io("no rank is left to coordinate"));
            };
            if coordinator == self.rank {
                return self.coordinate(mine, &mut known);
            }
            match self.follow(coordinator, mine, &mut known)? {
                Followed::Done(outcome) => return self.end(outcome, BTreeMap::new()),
                Followed::Lost => {
                    known.lost.insert(coordinator);
                }
                Followed::Again => std::thread::sleep(LOOK_AGAIN),
            }
        }
    }

    /// The coordinator: waits until every rank not lost has come or is lost, decides, and
    /// tells every rank that came.
    fn coordinate(&self, mine: &Bringing, known: &mut Known) -> Result<Decision> {
        let size = self.job_rank.len();
        let mut came: BTreeMap<usize, (TcpStream, Bringing)> = BTreeMap::new();
        let mut asked: HashMap<usize, Instant> = HashMap::new();
        // Questions to absent ranks run on threads of their own, so that a slow answer holds
        // up neither the others nor the ranks that come meanwhile.
        let (answered, answers) = mpsc::channel::<(usize, Answer)>();
        let mut asking: BTreeSet<usize> = BTreeSet::new();
        loop {
            (self.go_on)()?;
            self.stand_taking(mine, known);
            let mut reports: Vec<Vec<usize>> = Vec::new();
            for r in 0..size {
                if r == self.rank || known.lost.contains(&r) || came.contains_key(&r) {
                    continue;
                }
                let slot = (Purpose::Side, self.id, self.job_rank[r], 0);
                let taken = self.job.take_parked(slot).map_err(|why| self.io(&why))?;
                let Some(mut stream) = taken else { continue };
                let hello = read_frame(&mut stream, deadline_after(ASK_WITHIN), MAX_STANDING);
                // One that cannot say what it brings is asked about like one that did not come.
                let Some((theirs, their_lost)) = hello.ok().and_then(|h| decode_bringing(&h, size))
                else {
                    continue;
                };
                if theirs.call != mine.call {
                    came.insert(r, (stream, theirs.clone()));
                    let detail = self.differ(&mine.call, r, &theirs.call);
                    return self.end(Outcome::Mismatch { peer: r, detail }, came);
                }
                known.silent.remove(&r);
                came.insert(r, (stream, theirs));
                reports.push(their_lost);
            }
            // What they found lost, once all that came are known (they live after all).
            let protected: BTreeSet<usize> = came.keys().copied().collect();
            for their_lost in reports {
                self.absorb(known, &their_lost, &protected);
            }
            // One that came and whose connection ended died, gave up on this rank, or
            // learnt a decision elsewhere: ask it.
            let ended: Vec<usize> = came
                .iter()
                .filter(|(_, (s, _))| {
                    crate::os::wait_readable(s.as_fd(), Duration::ZERO).unwrap_or(true)
                })
                .map(|(&r, _)| r)
                .collect();
            for r in ended {
                came.remove(&r);
                let protected: BTreeSet<usize> = came.keys().copied().collect();
                if let Some(outcome) = self.hear(r, mine, known, &protected)? {
                    return self.end(outcome, came);
                }
            }
            let absent: Vec<usize> = (0..size)
                .filter(|r| *r != self.rank && !known.lost.contains(r) && !came.contains_key(r))
                .collect();
            if absent.is_empty() {
                return self.conclude(mine, known, came);
            }
            self.check_deadline(&absent)?;
            let protected: BTreeSet<usize> = came.keys().copied().collect();
            while let Ok((r, answer)) = answers.try_recv() {
                asking.remove(&r);
                if known.lost.contains(&r) || protected.contains(&r) {
                    continue;
                }
                if let Some(outcome) = self.interpret(r, answer, mine, known, &protected)? {
                    return self.end(outcome, came);
                }
            }
            for &r in &absent {
                let due = asked.get(&r).is_none_or(|at| at.elapsed() >= ASK_EVERY);
                if due && !asking.contains(&r) && !known.lost.contains(&r) {
                    asked.insert(r, Instant::now());
                    if self.ask_aside(r, &answered) {
                        asking.insert(r);
                    }
                }
            }
            let mut fds = [PollFd::from_borrowed_fd(self.job.arrivals(), PollFlags::IN)];
            poll(&mut fds, LOOK_AGAIN).map_err(|e| Error::io(self.rank, self.op.name(), e))?;
        }
    }

    /// Every rank not lost has come: checks that the ranks left out take no part and that
    /// more than half of the ranks not known to have ended came, then proposes the decision
    /// to the ranks that came and, once each has taken it, makes it final. One that does
    /// not take it is left out and the rest is checked and proposed again.
    fn conclude(
        &self,
        mine: &Bringing,
        known: &mut Known,
        mut came: BTreeMap<usize, (TcpStream, Bringing)>,
    ) -> Result<Decision> {
        // Left-out ranks that do not answer may be alive across a partition, where the others
        // may leave these out in turn: they count in the majority.
        let mut unreachable = BTreeSet::new();
        for (r, answer) in self.ask_all(&mine.call.left_out) {
            if answer == Answer::Silent {
                unreachable.insert(r);
            }
            match self.read_answer(r, answer, known)? {
                Heard::Said(Standing::Decided(d)) => return self.end(Outcome::Adopt(d), came),
                Heard::Said(Standing::Taking { call, .. }) => {
                    let detail = format!(
                        "{} (it takes part, though left out)",
                        self.differ(&mine.call, r, &call)
                    );
                    return self.end(Outcome::Mismatch { peer: r, detail }, came);
                }
                _ => {}
            }
        }
        loop {
            if let Err(e) = self.check_majority(mine, known, &unreachable, came.len() + 1) {
                return self.end(Outcome::Fail(e), came);
            }
            let mut alive: Vec<usize> = came.keys().copied().collect();
            alive.push(self.rank);
            alive.sort_unstable();
            let flag = mine.flag && came.values().all(|(_, b)| b.flag);
            let decision = Decision::Agreed { flag, alive };
            let refused = self.propose(&decision, &mut came)?;
            if refused.is_empty() {
                self.stand(&Standing::Decided(decision.clone()));
                for (mut stream, _) in came.into_values() {
                    let _ = write_frame(&mut stream, &[COMMIT], deadline_after(ASK_WITHIN));
                }
                return Ok(decision);
            }
            for r in refused {
                // Told before its connection closes, so that it drops the proposal it may
                // yet take (it may be only slow) rather than keep it as the decision.
                if let Some((mut stream, _)) = came.remove(&r) {
                    let _ = write_frame(&mut stream, &[DROPPED], deadline_after(ASK_WITHIN));
                }
                known.lost.insert(r);
            }
        }
    }

    /// Sends `decision` to every rank that came, as a proposal, and waits (up to the liveness
    /// window) for each to take it; returns the ranks that did not (their connection ended,
    /// or they stayed silent).
    fn propose(
        &self,
        decision: &Decision,
        came: &mut BTreeMap<usize, (TcpStream, Bringing)>,
    ) -> Result<Vec<usize>> {
        let proposal = [&[PROPOSE][..], &encode_decision(decision)].concat();
        let mut waiting: Vec<usize> = Vec::new();
        for (&r, (stream, _)) in came.iter_mut() {
            if write_frame(stream, &proposal, deadline_after(ASK_WITHIN)).is_ok() {
                waiting.push(r);
            }
        }
        let mut refused: Vec<usize> = came
            .keys()
            .copied()
            .filter(|r| !waiting.contains(r))
            .collect();
        let until = deadline_after(self.window);
        while !waiting.is_empty() {
            (self.go_on)()?;
            self.check_deadline(&waiting)?;
            let mut still = Vec::new();
            for r in waiting {
                let Some((stream, _)) = came.get_mut(&r) else {
                    continue;
                };
                match crate::os::wait_readable(stream.as_fd(), Duration::ZERO) {
                    Ok(true) => match read_frame(stream, deadline_after(ASK_WITHIN), 1) {
                        Ok(ack) if ack == [TAKEN] => {}
                        _ => refused.push(r),
                    },
                    Ok(false) if Instant::now() < until => still.push(r),
                    _ => refused.push(r),
                }
            }
            waiting = still;
            if !waiting.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(refused)
    }

    /// An error unless more than half of the ranks not known to have ended (left out ones
    /// aside, but for those `unreachable`) are among the `alive`; ranks counted as lost are
    /// asked first whether they have ended.
    fn check_majority(
        &self,
        mine: &Bringing,
        known: &mut Known,
        unreachable: &BTreeSet<usize>,
        alive: usize,
    ) -> Result<()> {
        let counted = |known: &Known| {
            (0..self.job_rank.len())
                .filter(|r| !mine.call.left_out.contains(r) || unreachable.contains(r))
                .filter(|r| !known.gone.contains(r))
                .count()
        };
        if 2 * alive > counted(known) {
            return Ok(());
        }
        let unproven: Vec<usize> = known
            .lost
            .iter()
            .copied()
            .filter(|r| !known.gone.contains(r) && !mine.call.left_out.contains(r))
            .collect();
        for (r, answer) in self.ask_all(&unproven) {
            if answer == Answer::Gone {
                known.gone.insert(r);
            }
        }
        if 2 * alive > counted(known) {
            return Ok(());
        }
        Err(self.io(&format!(
            "only {alive} of the {} ranks not known to have ended took part (ranks {:?} are \
             silent): fewer than half, which a network partition or a stop of most ranks \
             looks like, so no group is formed",
            counted(known),
            known.lost.difference(&known.gone).collect::<Vec<_>>()
        )))
    }

    /// Ends this rank's part with `outcome`: a decision is kept and told to the ranks that
    /// `came`; a failure makes this rank out (the ranks that came then go to the next
    /// coordinator).
    fn end(
        &self,
        outcome: Outcome,
        came: BTreeMap<usize, (TcpStream, Bringing)>,
    ) -> Result<Decision> {
        match outcome {
            Outcome::Adopt(decision) => self.settle(decision, came),
            Outcome::Mismatch { peer, detail } => {
                let decision = Decision::Mismatch {
                    by: self.rank,
                    peer,
                    detail,
                };
                self.settle(decision, came)
            }
            Outcome::Fail(e) => {
                self.stand(&Standing::Out);
                Err(e)
            }
        }
    }

    /// Keeps `decision`, made elsewhere or a mismatch, for the questions of others, and sends
    /// it to every rank that came as final (one that died since fails what comes next, not
    /// this).
    fn settle(
        &self,
        decision: Decision,
        came: BTreeMap<usize, (TcpStream, Bringing)>,
    ) -> Result<Decision> {
        self.stand(&Standing::Decided(decision.clone()));
        let bytes = [&[FINAL][..], &encode_decision(&decision)].concat();
        for (_, (mut stream, _)) in came {
            let _ = write_frame(&mut stream, &bytes, deadline_after(ASK_WITHIN));
        }
        Ok(decision)
    }

    /// Asks about rank `r` and takes in the answer ([`Agreement::interpret`]).
    fn hear(
        &self,
        r: usize,
        mine: &Bringing,
        known: &mut Known,
        protected: &BTreeSet<usize>,
    ) -> Result<Option<Outcome>> {
        let answer = self.job.ask(self.job_rank[r], self.id, ASK_WITHIN);
        self.interpret(r, answer, mine, known, protected)
    }

    /// Takes in what rank `r` answered: what it found lost spreads (but never to the ranks
    /// `protected`, which came to this coordinator alive); what ends this rank's part is
    /// returned.
    fn interpret(
        &self,
        r: usize,
        answer: Answer,
        mine: &Bringing,
        known: &mut Known,
        protected: &BTreeSet<usize>,
    ) -> Result<Option<Outcome>> {
        Ok(match self.read_answer(r, answer, known)? {
            Heard::Lost => {
                known.lost.insert(r);
                None
            }
            Heard::Nothing => None,
            Heard::Said(Standing::Decided(d)) => Some(Outcome::Adopt(d)),
            Heard::Said(Standing::MovedOn) => Some(Outcome::Fail(self.left_out(format!(
                "rank {r} went on with the group an earlier attempt formed without this rank"
            )))),
            Heard::Said(Standing::Out) => {
                known.lost.insert(r);
                None
            }
            Heard::Said(Standing::Taking { call, .. }) if call != mine.call => {
                let detail = self.differ(&mine.call, r, &call);
                Some(Outcome::Mismatch { peer: r, detail })
            }
            Heard::Said(Standing::Taking { lost, .. }) if lost.contains(&self.rank) => {
                Some(Outcome::Fail(self.left_out(format!(
                    "rank {r} counts this rank as lost (it was silent for the liveness window)"
                ))))
            }
            Heard::Said(Standing::Taking { lost, .. }) => {
                self.absorb(known, &lost, protected);
                None
            }
        })
    }

    /// What `answer` says of rank `r`: lost when its process ended, or when it has been silent
    /// for the window (twice in a row, for a rank the heartbeat declared lost).
    fn read_answer(&self, r: usize, answer: Answer, known: &mut Known) -> Result<Heard> {
        Ok(match answer {
            Answer::Gone => {
                known.gone.insert(r);
                Heard::Lost
            }
            Answer::Nothing => {
                known.silent.remove(&r);
                Heard::Nothing
            }
            Answer::Said(bytes) => {
                known.silent.remove(&r);
                let standing =
                    decode_standing(&bytes, self.job_rank.len()).ok_or_else(|| self.foreign(r))?;
                Heard::Said(standing)
            }
            Answer::Silent => {
                let (since, times) = known.silent.entry(r).or_insert((Instant::now(), 0));
                *times += 1;
                let long = since.elapsed() >= self.window;
                if long || (known.hinted.contains(&r) && *times >= 2) {
                    Heard::Lost
                } else {
                    Heard::Nothing
                }
            }
        })
    }

    /// Counts `lost` as lost too, but for this rank and the ranks `protected`.
    fn absorb(&self, known: &mut Known, lost: &[usize], protected: &BTreeSet<usize>) {
        for &l in lost {
            if l != self.rank && !protected.contains(&l) {
                known.lost.insert(l);
            }
        }
    }

    /// Asks about rank `r` on a thread of its own, which sends the answer to `answered`;
    /// false if no thread could start (the rank is asked again later).
    fn ask_aside(&self, r: usize, answered: &mpsc::Sender<(usize, Answer)>) -> bool {
        let (job, id, peer) = (Arc::clone(self.job), self.id, self.job_rank[r]);
        let answered = answered.clone();
        std::thread::Builder::new()
            .name("jaccl-ask".into())
            .spawn(move || {
                let _ = answered.send((r, job.ask(peer, id, ASK_WITHIN)));
            })
            .is_ok()
    }

    /// Asks each of `ranks` at once ([`Agreement::ask_aside`]) and waits for the answers: a
    /// question that could not start, or that has not ended well after [`ASK_WITHIN`],
    /// counts as unanswered.
    fn ask_all(&self, ranks: &[usize]) -> Vec<(usize, Answer)> {
        let (answered, answers) = mpsc::channel();
        let asked = ranks
            .iter()
            .filter(|&&r| self.ask_aside(r, &answered))
            .count();
        let until = deadline_after(ASK_WITHIN * 3);
        let mut got: HashMap<usize, Answer> = HashMap::with_capacity(asked);
        while got.len() < asked {
            let left = until.saturating_duration_since(Instant::now());
            let Ok((r, answer)) = answers.recv_timeout(left) else {
                break;
            };
            got.insert(r, answer);
        }
        ranks
            .iter()
            .map(|&r| (r, got.remove(&r).unwrap_or(Answer::Silent)))
            .collect()
    }

    fn stand_taking(&self, mine: &Bringing, known: &Known) {
        let lost = known.lost.iter().copied().collect();
        self.stand(&Standing::Taking {
            call: mine.call.clone(),
            lost,
        });
    }

    fn stand(&self, standing: &Standing) {
        self.job
            .answers()
            .stand(self.id, &encode_standing(standing), false);
    }

    /// How this rank's call and rank `r`'s differ.
    fn differ(&self, mine: &Call, r: usize, theirs: &Call) -> String {
        format!(
            "rank {} called {}, rank {r} {}",
            self.rank,
            describe(mine),
            describe(theirs)
        )
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
            after: self.timeout,
        })
    }

    fn left_out(&self, detail: String) -> Error {
        Error::LeftOut {
            rank: self.rank,
            op: self.op,
            detail,
        }
    }

    fn foreign(&self, peer: usize) -> Error {
        Error::Protocol {
            rank: self.rank,
            peer,
            op: self.op,
            detail: "what it says of the agreement is not jaccl's".into(),
        }
    }

    fn io(&self, why: &str) -> Error {
        Error::io(
            self.rank,
            self.op.name(),
            std::io::Error::other(why.to_owned()),
        )
    }
}

/// A call in words.
fn describe(call: &Call) -> String {
    let op = match call.kind {
        1 => "agree",
        2 => "shrink",
        _ => "another operation",
    };
    format!("{op} leaving out ranks {:?}", call.left_out)
}
