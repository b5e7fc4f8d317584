//! The two-level all-reduce of a group whose ranks span hosts, as NCCL and Open MPI's `han`
//! do it: the ranks of each host reduce-scatter the data over shared memory, the ranks of the
//! same local rank on every host all-reduce their slice over the network (each rank on its
//! own slice, so every rank's connection works and each byte crosses the network once each
//! way), and each host all-gathers the slices. Chunk by chunk: the network all-reduces one
//! chunk (on the cross group's progress thread) while the host reduce-scatters the next and
//! gathers the one before.
//!
//! Each element is reduced within its host first (in the order of the host's reduce-scatter),
//! then across hosts (in the order of the cross group's all-reduce), the same on every rank:
//! the result is bit-identical on every rank and from run to run.
//!
//! The two sub-groups work for the group: its timeout is theirs, and closing, aborting or
//! interrupting it reaches their waits (their liveness follows the group's,
//! `Liveness::lead`). Before the data moves, every rank exchanges the call's header with its
//! ring neighbours in the group, so ranks whose calls differ (a length on either side of
//! [`TWO_LEVEL_MIN`], `Avg` against `Sum`) fail with [`Error::Mismatch`] as on the flat path,
//! never wait for each other in different sub-groups.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Group, Request, VERDICT_GRACE};
use crate::algo::call::Call;
use crate::algo::hosts::HostLayout;
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Op, Result};
use crate::liveness::{INTERRUPT_EVERY, Liveness};
use crate::wait::WaitPolicy;

/// From this many bytes the all-reduce goes in two levels. Measured on pretend hosts, 2 × 4
/// ranks over 1 Gbit/s, against the flat all-reduce (ms, out of place / in place): 1 MiB
/// 9.1–9.4 / 9.0–9.1 against 15.4 / 15.4, 4 MiB 36.2–36.6 / 36.2 against 61.5–61.9 /
/// 61.5–62.3; but 256 KiB 2.2–5.0 / 8.2–8.8 against 3.9 / 3.8, and 64 KiB level.
const TWO_LEVEL_MIN: usize = 1 << 20;

/// The most chunks an all-reduce is cut into, and the least bytes of one.
const CHUNKS_MAX: usize = 8;
const CHUNK_MIN: usize = 512 << 10;

/// A group's two levels: the ranks of this rank's host, and the ranks of its local rank on
/// every host.
pub(super) struct Levels {
    local: Group,
    cross: Group,
    /// The group's rank of each rank of `local`, and of `cross`.
    local_ranks: Vec<usize>,
    cross_ranks: Vec<usize>,
    /// The group's liveness, whose interrupt check is asked while the network's part runs.
    group: Option<Arc<Liveness>>,
    /// How the host's group waits when the group's call runs on the caller's thread.
    local_wait: WaitPolicy,
}

/// Which level an error came from.
#[derive(Clone, Copy)]
enum Level {
    Host,
    Across,
}

/// Whether the all-reduce of `bytes` among ranks laid out as `hosts` goes in two levels.
pub(super) fn goes_in_two_levels(hosts: &HostLayout, bytes: usize) -> bool {
    two_levels_from(hosts).is_some_and(|min| bytes >= min)
}

/// From how many bytes all-reduces among ranks laid out as `hosts` go in two levels: on
/// several hosts, each with the same number of ranks, at least 2.
fn two_levels_from(hosts: &HostLayout) -> Option<usize> {
    let here = hosts.local_size();
    let even = (0..hosts.count()).all(|h| hosts.ranks_on(h).len() == here);
    (hosts.count() >= 2 && here >= 2 && even).then_some(TWO_LEVEL_MIN)
}

impl Levels {
    /// Forms the two levels of `group`: every rank of it calls this in the same call.
    pub(super) fn form(group: &Group) -> Result<Levels> {
        let hosts = group.hosts();
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
            local_wait: local.wait,
            local,
            cross,
            local_ranks,
            cross_ranks,
            group: group.liveness.clone(),
        })
    }

    /// The all-reduce of `input` (else `output`, in place) with `op` into `output`, elements
    /// of `dtype`, for the group's `call`; `Avg` is left a sum, for the caller to divide.
    fn all_reduce(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        call: &Call,
    ) -> Result<()> {
        // The host's part runs on the thread of the group's call, and waits as the call would:
        // on the group's progress thread, without asking the interrupt check or spinning.
        self.local.on_progress_thread = !call.interruptible;
        self.local.wait = match call.interruptible {
            true => self.local_wait,
            false => self.local_wait.in_background(),
        };
        let op = match op {
            ReduceOp::Avg => ReduceOp::Sum,
            other => other,
        };
        let size = dtype.size();
        let count = output.len() / size;
        let chunks = (output.len() / CHUNK_MIN).clamp(1, CHUNKS_MAX);
        let ranks = self.local.size();
        let mut pending = VecDeque::new();
        for c in 0..chunks {
            let span = part(count, chunks, c);
            let counts: Vec<usize> = (0..ranks)
                .map(|r| part(span.len(), ranks, r).len())
                .collect();
            let bytes = span.start * size..span.end * size;
            let mut slice = vec![0u8; counts[self.local.rank()] * size];
            match input {
                Some(input) => self.local.reduce_scatter_v_raw(
                    &input[bytes.clone()],
                    &mut slice,
                    &counts,
                    dtype,
                    op,
                ),
                None => self.local.reduce_scatter_v_raw(
                    &output[bytes.clone()],
                    &mut slice,
                    &counts,
                    dtype,
                    op,
                ),
            }
            .map_err(|e| self.in_group(e, Level::Host))?;
            let across = self.cross.start(move |g| {
                g.all_reduce_raw_in_place(&mut slice, dtype, op)?;
                Ok(slice)
            });
            pending.push_back((bytes, counts, across));
            // One chunk on the network while the host works on the next.
            if pending.len() > 1 || c + 1 == chunks {
                while let Some((bytes, counts, across)) = pending.pop_front() {
                    let slice = self.wait_across(across, call)?;
                    self.local
                        .all_gather_v_raw(&slice, &mut output[bytes], &counts, dtype)
                        .map_err(|e| self.in_group(e, Level::Host))?;
                    if c + 1 < chunks {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// The network's part of a chunk, once done; meanwhile the group's interrupt check is
    /// asked (the cross group's progress thread does not ask it).
    fn wait_across(&self, across: Request<Vec<u8>>, call: &Call) -> Result<Vec<u8>> {
        while !across.wait_timeout(INTERRUPT_EVERY) {
            if let Some(group) = &self.group {
                group.check_interrupt(call.op, call.interruptible)?;
            }
        }
        across.wait().map_err(|e| self.in_group(e, Level::Across))
    }

    /// [`Levels::all_reduce`] on the levels `held`, which are dropped if it fails: their
    /// members then fail promptly, not at their timeout.
    pub(super) fn all_reduce_held(
        held: &Mutex<Option<Levels>>,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        call: &Call,
    ) -> Result<()> {
        let rank = call.rank;
        let mut held = held.lock().map_err(|_| poisoned(rank))?;
        let Some(levels) = held.as_mut() else {
            return Err(Error::Closed { rank });
        };
        let result = levels.all_reduce(input, output, dtype, op, call);
        if result.is_err() {
            *held = None;
        }
        result
    }

    /// An error of the host's group or the cross group, as the group reports it.
    fn in_group(&self, error: Error, level: Level) -> Error {
        let (ranks, which) = match level {
            Level::Host => (&self.local_ranks, "host"),
            Level::Across => (&self.cross_ranks, "across hosts"),
        };
        let within = format!(
            "in the two-level all-reduce's level {which}, of ranks {ranks:?} of this group, \
             numbered 0..{} there",
            ranks.len()
        );
        error.seen_from(
            Op::AllReduce,
            |r| ranks.get(r).copied().unwrap_or(r),
            &within,
        )
    }
}

impl Group {
    /// The size in bytes from which this group's all-reduces go in two levels (inside each
    /// host, then across hosts: docs/algorithms.md), or `None` if they never do: its ranks
    /// are on one host, or on hosts of different sizes, or alone on theirs.
    pub fn all_reduce_in_two_levels_from(&self) -> Option<usize> {
        two_levels_from(&self.hosts)
    }

    /// The group's two levels ([`Levels`]), formed on the first call that needs them: every
    /// rank makes that call.
    pub(super) fn levels(&mut self, op: Op) -> Result<Arc<Mutex<Option<Levels>>>> {
        let levels = Arc::clone(&self.levels);
        let mut held = levels.lock().map_err(|_| poisoned(self.rank))?;
        if held.is_none() {
            *held = Some(Levels::form(self).map_err(|e| self.not_formed(e, op))?);
        }
        drop(held);
        Ok(levels)
    }

    /// Why the levels of call `op` could not be formed: a rank of the group lost or gone, as
    /// the heartbeat tells within [`VERDICT_GRACE`] (a member that fails to form them may only
    /// have seen another give up), else `error`.
    fn not_formed(&self, error: Error, op: Op) -> Error {
        let within = "forming the two levels of an all-reduce across hosts";
        if let Error::Interrupted { .. } | Error::Aborted { .. } | Error::Closed { .. } = error {
            // This rank stopped it.
            return error.seen_from(op, |_| self.rank, within);
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
        error.seen_from(op, |r| r, within)
    }
}

/// The error of a call that finds the levels' lock poisoned (an operation panicked holding
/// it): the group fails, and with it the levels' peers.
fn poisoned(rank: usize) -> Error {
    let why = std::io::Error::other("an operation panicked in the two levels earlier");
    Error::io(rank, "all-reduce across hosts", why)
}

/// Part `i` of `n` near-equal parts of `0..count` (the first `count % n` one longer).
fn part(count: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    let (base, extra) = (count / n, count % n);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}
