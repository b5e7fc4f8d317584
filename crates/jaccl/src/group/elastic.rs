//! Going on after a lost rank: [`Group::agree`] among the living ranks and [`Group::shrink`]
//! to them, as MPI's ULFM (`MPIX_Comm_agree`, `MPIX_Comm_shrink`) and NCCL's
//! `ncclCommShrink` do. Both run the agreement of `crate::agreement` through the job's
//! listeners, so they need nothing of this group's connections, heartbeat or rank 0.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Group;
use super::split::{Watch, group_id, list_digest};
use crate::agreement::{self, Agreement, Bringing, Call, Decision};
use crate::config::Config;
use crate::error::{Error, Op, Result};
use crate::os::deadline_after;

/// The operations an agreement compares ([`Call::kind`]).
const AGREE: u8 = 1;
const SHRINK: u8 = 2;

/// What [`Group::agree`] decided: the same on every rank that returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    /// The AND of the flags of the ranks in `alive`.
    pub flag: bool,
    /// The ranks that took part, in rank order.
    pub alive: Vec<usize>,
    /// The ranks that did not: their process ended, or they did not answer for the liveness
    /// window ([`crate::Config::liveness`]).
    pub lost: Vec<usize>,
}

impl Group {
    /// Agrees, among the ranks alive, on the AND of `flag` and on which ranks are alive, as
    /// MPI's `MPIX_Comm_agree` does: every rank that returns `Ok` gets the same [`Agreed`],
    /// whichever ranks die before or during the call (rank 0 included), and whether or not
    /// this group has failed or was revoked. Every living rank of the group must call it
    /// (as the n-th agreement or shrink of this group on each). A rank counts as lost when
    /// its process has ended (found at once: its listener refuses connections), when it has
    /// not answered for the liveness window (stopped or cut off), or when another rank counts
    /// it as lost; a rank that learns it was counted as lost fails with [`Error::LeftOut`].
    /// An agreement needs more than half of the ranks not known to have ended: with as many
    /// ranks silent as answering (a network partition cannot be told from stopped ranks), it
    /// fails rather than decide for one side. It waits for living ranks that have not called
    /// it yet up to the operation timeout. How it works: docs/elastic.md.
    ///
    /// ```no_run
    /// # fn main() -> jaccl::Result<()> {
    /// let mut group = jaccl::init()?;
    /// let step_ok = group.barrier().is_ok();
    /// // Every survivor learns whether every survivor finished the step, and who is gone.
    /// let agreed = group.agree(step_ok)?;
    /// if !agreed.flag {
    ///     let mut group = group.shrink()?; // the survivors, renumbered
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::LeftOut`] when the others agreed without this rank (they took it for lost);
    /// [`Error::Mismatch`] when ranks called something else ([`Group::shrink`], or it with
    /// other ranks left out); [`Error::Timeout`] when a living rank did not come within the
    /// operation timeout; [`Error::Io`] when fewer than half of the ranks not known to have
    /// ended took part; [`Error::Interrupted`] from the interrupt check
    /// ([`Group::interrupt_when`]).
    pub fn agree(&mut self, flag: bool) -> Result<Agreed> {
        let round = self.family.agreements.fetch_add(1, Ordering::Relaxed);
        let deadline = deadline_after(self.operation_timeout());
        let bringing = Bringing {
            call: Call {
                kind: AGREE,
                left_out: Vec::new(),
            },
            flag,
        };
        let (flag, alive) = self.agree_on(Op::Agree, round, 0, &bringing, deadline)?;
        let lost = (0..self.size).filter(|r| !alive.contains(r)).collect();
        Ok(Agreed { flag, alive, lost })
    }

    /// Forms the group of the ranks alive, as MPI's `MPIX_Comm_shrink` and NCCL's
    /// `ncclCommShrink` do: after a rank died or stopped (this group then fails with
    /// [`Error::PeerLost`]), or after [`Group::revoke`], every survivor calls it and gets a new
    /// group of exactly the ranks alive, renumbered in their order here, with its connections,
    /// transports and algorithms chosen afresh (ranks left on one host get shared memory).
    /// Any rank may be the one lost, rank 0 included, and a rank lost during the shrink is
    /// left out too. Which ranks are alive is agreed as [`Group::agree`] agrees it; the new
    /// group then forms through the listener each rank opened at start-up. On a group that
    /// has not failed, it makes a fresh copy of the group.
    ///
    /// This group is left as it was (failed, revoked, or not): drop it. A new group forms in
    /// well under a second after a rank's death (measured: docs/elastic.md). Should the new
    /// group's rank 0 die while it releases the others from forming, those that formed it go
    /// on (and shrink it in turn) while those that did not fail with [`Error::LeftOut`].
    ///
    /// ```no_run
    /// # fn main() -> jaccl::Result<()> {
    /// let mut group = jaccl::init()?;
    /// let mut grads = vec![1.0f32; 1024];
    /// if let Err(jaccl::Error::PeerLost { .. } | jaccl::Error::Revoked { .. }) =
    ///     group.all_reduce_in_place(&mut grads, jaccl::ReduceOp::Sum)
    /// {
    ///     group = group.shrink()?;
    ///     // redo the step on the survivors
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Group::agree`]; the new group cannot form within the operation timeout (its
    /// members keep dying).
    pub fn shrink(&mut self) -> Result<Group> {
        self.shrink_excluding(&[])
    }

    /// [`Group::shrink`] to the ranks alive except `ranks`, for callers that decide whom to
    /// drop (PyTorch's `shrink_group(ranks_to_exclude)`): the ranks listed are not waited
    /// for and are left out whether they live or not (they do not call it). Every caller must
    /// pass the same ranks (in any order): when lists differ, no two groups form; the callers
    /// fail with [`Error::Mismatch`], or, when one side decided before the other called,
    /// that side goes on and the other fails with [`Error::LeftOut`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a rank out of range or this rank; otherwise as
    /// [`Group::shrink`].
    pub fn shrink_excluding(&mut self, ranks: &[usize]) -> Result<Group> {
        let mut left_out = ranks.to_vec();
        left_out.sort_unstable();
        left_out.dedup();
        if let Some(&r) = left_out.iter().find(|&&r| r >= self.size || r == self.rank) {
            let why = match r == self.rank {
                true => "a rank cannot leave itself out (the ranks left out do not call it)".into(),
                false => format!("rank {r} does not exist in a group of {}", self.size),
            };
            return Err(self.invalid(Op::Shrink, why));
        }
        let round = self.family.agreements.fetch_add(1, Ordering::Relaxed);
        let deadline = deadline_after(self.operation_timeout());
        let bringing = Bringing {
            call: Call {
                kind: SHRINK,
                left_out,
            },
            flag: true,
        };
        let window = self.family.config.liveness;
        let mut attempt = 0u64;
        loop {
            let (_, alive) = self.agree_on(Op::Shrink, round, attempt, &bringing, deadline)?;
            let parts: [&[u8]; 3] = [
                &round.to_le_bytes(),
                &attempt.to_le_bytes(),
                &list_digest(&alive),
            ];
            let id = group_id("shrink", self.family.id, &parts);
            // A member lost since the agreement makes the forming fail, on every member, within
            // the liveness window: then agree again (without it) and form again.
            match self.form(&alive, id, (Some(window), None), Watch::Survivors) {
                Ok(mut group) => {
                    // The window bounded the forming alone: the new group's own start-up
                    // waits (a grow, its sub-groups) are this group's.
                    let config = Config {
                        startup_timeout: self.family.config.startup_timeout,
                        ..(*group.family.config).clone()
                    };
                    group.family.config = Arc::new(config);
                    // A member whose forming failed while this rank's did not (the new
                    // group's rank 0 died releasing the others) must not wait for this one
                    // in the next attempt.
                    if let Some(job) = &self.family.job {
                        agreement::moved_on(job, self.agreement_id(round, attempt + 1));
                    }
                    return Ok(group);
                }
                Err(e @ (Error::Interrupted { .. } | Error::InvalidArgument(_))) => return Err(e),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    tracing::info!(rank = self.rank, error = %e, "shrink: forming failed, agreeing again");
                }
            }
            attempt += 1;
        }
    }

    /// The id of agreement `round` (its `attempt`) of this group.
    fn agreement_id(&self, round: u64, attempt: u64) -> u64 {
        let parts: [&[u8]; 2] = [&round.to_le_bytes(), &attempt.to_le_bytes()];
        group_id("agreement", self.family.id, &parts)
    }

    /// The job's rank of each rank of this group (the group `init` made: `0..size`): how a
    /// group made by [`Group::shrink`] or [`Group::split`] maps to the job, and through it to
    /// the group it came from. Processes that joined later ([`Group::grow`]) have job's ranks
    /// of their own, drawn at random from 2^20 to 2^31 for each grow.
    pub fn job_ranks(&self) -> &[usize] {
        &self.family.job_rank
    }

    /// Runs agreement `round` (its `attempt`) of this group: the flag and the ranks alive.
    fn agree_on(
        &self,
        op: Op,
        round: u64,
        attempt: u64,
        bringing: &Bringing,
        deadline: Instant,
    ) -> Result<(bool, Vec<usize>)> {
        let job = match &self.family.job {
            Some(job) if self.size > 1 => job,
            _ => return Ok((bringing.flag, vec![self.rank])),
        };
        let liveness = self.liveness.clone();
        let interruptible = !self.on_progress_thread;
        let go_on = || match &liveness {
            Some(l) => l.check_interrupt_only(op, interruptible),
            None => Ok(()),
        };
        let hints: Vec<usize> = self.liveness.iter().filter_map(|l| l.lost_peer()).collect();
        let agreement = Agreement {
            job,
            id: self.agreement_id(round, attempt),
            job_rank: &self.family.job_rank,
            rank: self.rank,
            window: self.family.config.liveness,
            timeout: self.operation_timeout(),
            deadline,
            op,
            go_on: &go_on,
        };
        match agreement.run(bringing, &hints)? {
            Decision::Agreed { flag, alive } if alive.contains(&self.rank) => Ok((flag, alive)),
            Decision::Agreed { alive, .. } => Err(Error::LeftOut {
                rank: self.rank,
                op,
                detail: format!("they agreed on ranks {alive:?} alive"),
            }),
            Decision::Mismatch { peer, detail, .. } => Err(Error::Mismatch {
                rank: self.rank,
                peer,
                op,
                detail,
            }),
        }
    }
}
