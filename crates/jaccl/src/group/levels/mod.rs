//! Collectives of a group whose ranks span hosts, in two levels, as NCCL and Open MPI's `han`
//! run them: a sub-group of the ranks of each host (shared memory) and a sub-group of the
//! ranks of the same local rank on every host (the network), so that each byte crosses the
//! network once each way and every rank's connection works. The collectives themselves (the
//! all-reduce, the reduce, the broadcast, the all-gather and the reduce-scatter) are in
//! `collectives`.
//!
//! The two sub-groups work for the group: its timeout is theirs, and closing, aborting or
//! interrupting it reaches their waits (their liveness follows the group's,
//! `Liveness::lead`). Before the data moves, every rank exchanges the call's header with its
//! ring neighbours in the group, as the flat path of the same call does first (the flat
//! broadcasts and reduces too, where the call goes in two levels at some size:
//! [`Group::agree_before_trees`]), so ranks whose calls differ (a length on either side of the
//! size of two levels, another root, `Avg` against `Sum`) fail with [`Error::Mismatch`], never
//! wait for each other in different sub-groups or trees. Forming
//! the levels waits as long as an operation would, and ends when any rank of the group failed
//! or left.

mod collectives;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Group, VERDICT_GRACE};
use crate::algo::call::Call;
use crate::algo::collectives::Collectives;
use crate::algo::hosts::{AcrossHosts, HostLayout};
use crate::error::{Error, Op, Result};
use crate::liveness::Liveness;
use crate::wait::WaitPolicy;

/// A group's two levels: the ranks of this rank's host, and the ranks of its local rank on
/// every host.
pub(super) struct Levels {
    local: Group,
    cross: Group,
    /// Which ranks of the group share a host.
    hosts: Arc<HostLayout>,
    /// The group's liveness, whose interrupt check is asked while the network's part runs.
    group: Option<Arc<Liveness>>,
    /// How the host's group and the cross group wait when the group's call runs on the
    /// caller's thread.
    waits: [WaitPolicy; 2],
}

/// Which level an error came from.
#[derive(Clone, Copy)]
enum Level {
    Host,
    Across,
}

/// Whether `op` of `bytes` among ranks laid out as `hosts` goes in two levels.
pub(super) fn goes_in_two_levels(hosts: &HostLayout, op: Op, bytes: usize) -> bool {
    hosts.two_levels_from(op).is_some_and(|min| bytes >= min)
}

impl Levels {
    /// Forms the two levels of `group`: every rank of it calls this in the same call.
    fn form(group: &Group) -> Result<Levels> {
        let hosts = Arc::clone(&group.hosts);
        let local_ranks = hosts.ranks_on(hosts.host()).to_vec();
        let cross_ranks: Vec<usize> = (0..hosts.count())
            .map(|h| hosts.ranks_on(h)[hosts.local_rank()])
            .collect();
        let mut local = group.internal_subgroup(&local_ranks, "two levels: host")?;
        let mut cross = group.internal_subgroup(&cross_ranks, "two levels: across")?;
        for level in [&mut local, &mut cross] {
            level.timeout = Arc::clone(&group.timeout);
            if let (Some(group), Some(level)) = (&group.liveness, &level.liveness) {
                group.lead(level);
            }
        }
        Ok(Levels {
            waits: [local.wait, cross.wait],
            local,
            cross,
            hosts,
            group: group.liveness.clone(),
        })
    }

    /// Lets both levels run on the thread of the group's `call`, and wait as the call would:
    /// on the group's progress thread, without asking the interrupt check or spinning.
    fn act_for(&mut self, call: &Call) {
        for (level, wait) in [&mut self.local, &mut self.cross]
            .into_iter()
            .zip(self.waits)
        {
            level.on_progress_thread = !call.interruptible;
            level.wait = match call.interruptible {
                true => wait,
                false => wait.in_background(),
            };
        }
    }

    /// An error of the host's group or the cross group, as the group reports it (for the
    /// group's `call`).
    fn in_group(&self, error: Error, level: Level, call: &Call) -> Error {
        let hosts = &self.hosts;
        let (ranks, which): (Vec<usize>, _) = match level {
            Level::Host => (hosts.ranks_on(hosts.host()).to_vec(), "host"),
            Level::Across => {
                let on = |h| hosts.ranks_on(h)[hosts.local_rank()];
                ((0..hosts.count()).map(on).collect(), "across hosts")
            }
        };
        let within = format!(
            "in the level {which} of the {}, of ranks {ranks:?} of this group, numbered \
             0..{} there",
            call.op,
            ranks.len()
        );
        error.seen_from(call.op, |r| ranks.get(r).copied().unwrap_or(r), &within)
    }
}

impl Group {
    /// The size in bytes from which this group's `op` goes in two levels (inside each host,
    /// then across hosts: docs/algorithms.md): all-reduces and reduces (the message) from 512
    /// KiB, all-gathers (the output) and reduce-scatters (the input) from 1 MiB, broadcasts
    /// from 1 MiB where some host's ranks are not consecutive in rank order. `None` if it never
    /// does: another operation, or the group's ranks are on one host, or on hosts of different
    /// sizes, or alone on theirs.
    pub fn two_levels_from(&self, op: Op) -> Option<usize> {
        self.hosts.two_levels_from(op)
    }

    /// Bytes this rank has sent to and received from ranks on other hosts since the group
    /// started: what its operations put on the network, its two levels' included. The
    /// difference over a call is that call's traffic across hosts (`jaccl bench` reports it).
    /// Waits for the operations in flight on the progress thread ([`Group::start`]).
    ///
    /// # Errors
    /// The error that poisoned the group.
    pub fn bytes_across_hosts(&mut self) -> Result<AcrossHosts> {
        let hosts = Arc::clone(&self.hosts);
        let flat = self
            .on_collectives(|c| c.bytes_with(|peer| hosts.host_of(peer) != Some(hosts.host())))?;
        let mut levels = self
            .levels
            .lock()
            .map_err(|_| poisoned(self.rank, "traffic"))?;
        let across = match levels.as_mut() {
            // The host's level stays on the host.
            Some(levels) => levels.cross.bytes_across_hosts()?,
            None => AcrossHosts::default(),
        };
        Ok(flat.unwrap_or_default() + across)
    }

    /// Runs `call` as `op` does it on the group's two levels: the ring neighbours agree on the
    /// call first, the levels are formed on the first such call (every rank makes it), and
    /// dropped if `op` fails (their members then fail promptly, not at their timeout), which
    /// poisons the group.
    pub(super) fn in_two_levels(
        &mut self,
        call: Call,
        op: impl FnOnce(&mut Levels, &Call) -> Result<()>,
    ) -> Result<()> {
        // Before any rank waits in a level, or forms them: the data goes through the levels,
        // which cannot tell that the calls differ.
        self.run(call, Collectives::check_neighbours)?;
        // A failure to form them fails the call, as one while data moves would.
        let levels = self.levels(call.op);
        self.run(call, |_, call| {
            let held = levels?;
            let mut held = held.lock().map_err(|_| poisoned(call.rank, call.op))?;
            let Some(levels) = held.as_mut() else {
                return Err(Error::Closed { rank: call.rank });
            };
            let result = op(levels, call);
            if result.is_err() {
                *held = None;
            }
            result
        })
    }

    /// Before a broadcast or reduce that does not go in two levels where the same call of
    /// another length would: the ring neighbours agree on the call, as they do first on the two
    /// levels' path ([`Group::in_two_levels`]). The trees these take talk to other ranks than the
    /// neighbours (over links made on first use), so a rank whose length falls on the other side
    /// of the two levels' size, or that names another root, would otherwise wait in its tree
    /// while the others wait in theirs or in the levels, until the timeout; now all fail with
    /// [`Error::Mismatch`]. The other collectives' flat algorithms begin with the neighbours'
    /// headers anyway.
    pub(super) fn agree_before_trees(&mut self, call: Call) -> Result<()> {
        match self.hosts.two_levels_from(call.op) {
            Some(_) => self.run(call, Collectives::check_neighbours),
            None => Ok(()),
        }
    }

    /// The group's two levels ([`Levels`]), formed on the first call that needs them.
    fn levels(&mut self, op: Op) -> Result<Arc<Mutex<Option<Levels>>>> {
        let levels = Arc::clone(&self.levels);
        let mut held = levels.lock().map_err(|_| poisoned(self.rank, op))?;
        if held.is_none() {
            *held = Some(Levels::form(self).map_err(|e| self.not_formed(e, op))?);
        }
        drop(held);
        Ok(levels)
    }

    /// Why the levels of call `op` could not be formed: this rank stopped it; or a rank of the
    /// group lost or gone, as the heartbeat tells within [`VERDICT_GRACE`] (a member that
    /// fails to form them may only have seen another give up); else `error`.
    fn not_formed(&self, error: Error, op: Op) -> Error {
        let within = format!("forming the two levels of the {op}");
        if let Error::Interrupted { .. } | Error::Aborted { .. } | Error::Closed { .. } = error {
            return error.seen_from(op, |_| self.rank, &within);
        }
        if let Some(liveness) = &self.liveness {
            let others: Vec<usize> = (0..self.size).filter(|&r| r != self.rank).collect();
            let deadline = Instant::now() + VERDICT_GRACE;
            loop {
                if let Err(lost) = liveness.check_peers(op, &others) {
                    return lost;
                }
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        error.seen_from(op, |r| r, &within)
    }
}

/// The error of a call that finds the levels' lock poisoned (an operation panicked holding
/// it): the group fails, and with it the levels' peers.
fn poisoned(rank: usize, op: impl std::fmt::Display) -> Error {
    let why = std::io::Error::other("an operation panicked in the two levels earlier");
    Error::io(rank, op, why)
}
