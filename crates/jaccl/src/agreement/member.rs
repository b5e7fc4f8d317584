//! A member's side of an agreement: it connects to its coordinator, sends what it brings,
//! and waits for a proposal to take and for it to be made final, watching the coordinator.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::wire::{Decision, Standing, decode_decision, encode_bringing};
use super::{
    ASK_EVERY, ASK_WITHIN, Agreement, Bringing, COMMIT, DROPPED, FINAL, Followed, Heard, Known,
    LOOK_AGAIN, Outcome, PROPOSE, TAKEN,
};
use crate::auth::Purpose;
use crate::error::{Error, Result};
use crate::os::deadline_after;
use crate::transport::frame::{read_frame, write_frame};
use crate::transport::questions::MAX_STANDING;

impl Agreement<'_> {
    /// A member: sends what it brings to `coordinator` and waits for the decision.
    pub(super) fn follow(
        &self,
        coordinator: usize,
        mine: &Bringing,
        known: &mut Known,
    ) -> Result<Followed> {
        let peer = self.job_rank[coordinator];
        if let Some(outcome) = self.hear(coordinator, mine, known, &BTreeSet::new())? {
            return Ok(Followed::Done(outcome));
        }
        if known.lost.contains(&coordinator) {
            return Ok(Followed::Lost);
        }
        let Ok(mut stream) = self
            .job
            .dial_once(Purpose::Side, self.id, peer, ASK_WITHIN * 2)
        else {
            return Ok(Followed::Again);
        };
        let hello = encode_bringing(mine, &known.lost);
        if write_frame(&mut stream, &hello, deadline_after(ASK_WITHIN)).is_err() {
            return Ok(Followed::Again);
        }
        let mut asked = Instant::now();
        loop {
            (self.go_on)()?;
            self.check_deadline(&[coordinator])?;
            let readable = crate::os::wait_readable(stream.as_fd(), LOOK_AGAIN)
                .map_err(|e| Error::io(self.rank, self.op.name(), e))?;
            if readable {
                // A proposal, a final decision, or the end of the stream: one is there now.
                let sent = read_frame(&mut stream, deadline_after(ASK_WITHIN), MAX_STANDING);
                if let Ok(bytes) = sent {
                    return match self.read_sent(coordinator, &bytes)? {
                        (FINAL, decision) => Ok(Followed::Done(Outcome::Adopt(decision))),
                        (_, proposal) => self.take(coordinator, proposal, stream, known),
                    };
                }
            }
            if readable || asked.elapsed() >= self.member_asks_every() {
                asked = Instant::now();
                if let Some(outcome) = self.hear(coordinator, mine, known, &BTreeSet::new())? {
                    return Ok(Followed::Done(outcome));
                }
                if known.lost.contains(&coordinator) {
                    return Ok(Followed::Lost);
                }
                if readable {
                    return Ok(Followed::Again);
                }
                self.stand_taking(mine, known);
            }
        }
    }

    /// A member given `proposal` by `coordinator`: takes it, and waits for the coordinator to
    /// make it final. Should the coordinator end or fall silent first, the proposal is the
    /// decision (it may have been made final for others); should it say it is out (it could
    /// not confirm every rank), or close the connection while it lives (it dropped this rank
    /// for not taking the proposal in time), the proposal is dropped.
    fn take(
        &self,
        coordinator: usize,
        mut proposal: Decision,
        mut stream: TcpStream,
        known: &mut Known,
    ) -> Result<Followed> {
        let mut open = write_frame(&mut stream, &[TAKEN], deadline_after(ASK_WITHIN)).is_ok();
        let mut asked = Instant::now();
        loop {
            (self.go_on)()?;
            self.check_deadline(&[coordinator])?;
            if open {
                let readable = crate::os::wait_readable(stream.as_fd(), LOOK_AGAIN)
                    .map_err(|e| Error::io(self.rank, self.op.name(), e))?;
                if readable {
                    match read_frame(&mut stream, deadline_after(ASK_WITHIN), MAX_STANDING) {
                        Ok(b) if b == [COMMIT] => {
                            return Ok(Followed::Done(Outcome::Adopt(proposal)));
                        }
                        Ok(b) if b == [DROPPED] => {
                            let why = "the coordinator left this rank out: it did not take the \
                                       proposal within the liveness window";
                            return Ok(Followed::Done(Outcome::Fail(self.left_out(why.into()))));
                        }
                        Ok(b) => match self.read_sent(coordinator, &b)? {
                            (FINAL, d) => return Ok(Followed::Done(Outcome::Adopt(d))),
                            (_, d) => {
                                // A new proposal, without a rank that did not take the last.
                                proposal = d;
                                open =
                                    write_frame(&mut stream, &[TAKEN], deadline_after(ASK_WITHIN))
                                        .is_ok();
                            }
                        },
                        // The connection ended: the coordinator died (the proposal may be
                        // final for others: it stands), or it dropped this rank as one that did
                        // not take the proposal in time (then the proposal is not the decision).
                        Err(_) => {
                            let answer =
                                self.job
                                    .ask(self.job_rank[coordinator], self.id, ASK_WITHIN);
                            return Ok(match self.read_answer(coordinator, answer, known)? {
                                Heard::Lost => Followed::Done(Outcome::Adopt(proposal)),
                                Heard::Said(Standing::Decided(d)) => {
                                    Followed::Done(Outcome::Adopt(d))
                                }
                                Heard::Said(Standing::Out) => {
                                    known.lost.insert(coordinator);
                                    Followed::Lost
                                }
                                Heard::Said(_) | Heard::Nothing => Followed::Again,
                            });
                        }
                    }
                    continue;
                }
            } else {
                std::thread::sleep(LOOK_AGAIN);
            }
            if asked.elapsed() < self.member_asks_every() {
                continue;
            }
            asked = Instant::now();
            let answer = self
                .job
                .ask(self.job_rank[coordinator], self.id, ASK_WITHIN);
            match self.read_answer(coordinator, answer, known)? {
                Heard::Said(Standing::Out) => {
                    known.lost.insert(coordinator);
                    return Ok(Followed::Lost);
                }
                Heard::Said(Standing::Decided(d)) => return Ok(Followed::Done(Outcome::Adopt(d))),
                Heard::Lost => return Ok(Followed::Done(Outcome::Adopt(proposal))),
                Heard::Said(_) | Heard::Nothing => {}
            }
        }
    }

    /// How often a member asks about its coordinator: a coordinator that ends closes the
    /// member's connection (seen at once), so questions only find one that stopped, which
    /// counts as lost after the window anyway; asking seldom spares the coordinator's
    /// listener, which every member asks.
    fn member_asks_every(&self) -> Duration {
        (self.window / 5).max(ASK_EVERY)
    }

    /// A proposal or final decision `coordinator` sent: its kind and the decision.
    fn read_sent(&self, coordinator: usize, bytes: &[u8]) -> Result<(u8, Decision)> {
        let (&kind, rest) = bytes
            .split_first()
            .ok_or_else(|| self.foreign(coordinator))?;
        let decision =
            decode_decision(rest, self.job_rank.len()).ok_or_else(|| self.foreign(coordinator))?;
        match kind {
            PROPOSE | FINAL => Ok((kind, decision)),
            _ => Err(self.foreign(coordinator)),
        }
    }
}
