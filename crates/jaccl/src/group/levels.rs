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

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Group, VERDICT_GRACE};
use crate::algo::hosts::HostLayout;
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Op, Result};

/// From this many bytes the all-reduce goes in two levels (measured on pretend hosts, 2 × 4
/// ranks over 1 Gbit/s, against the flat all-reduce: 1 MiB and more 1.63–1.76×; 64 and 128
/// KiB level, 256 KiB 1.2–1.8×, but below 1 MiB the flat path stays for now: a mismatch
/// between ranks is reported by the ring neighbours of the rank that differs, which two
/// levels would not always do).
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
}

/// Whether the all-reduce of `bytes` among ranks laid out as `hosts` goes in two levels: on
/// several hosts, each with the same number of ranks, at least 2.
pub(super) fn goes_in_two_levels(hosts: &HostLayout, bytes: usize) -> bool {
    let here = hosts.local_size();
    bytes >= TWO_LEVEL_MIN
        && hosts.count() >= 2
        && here >= 2
        && (0..hosts.count()).all(|h| hosts.ranks_on(h).len() == here)
}

impl Levels {
    /// Forms the two levels of `group`: every rank of it calls this in the same call.
    pub(super) fn form(group: &Group) -> Result<Levels> {
        let hosts = group.hosts();
        let local_ranks = hosts.ranks_on(hosts.host()).to_vec();
        let cross_ranks: Vec<usize> = (0..hosts.count())
            .map(|h| hosts.ranks_on(h)[hosts.local_rank()])
            .collect();
        let local = group.subgroup_of_members(&local_ranks, "jaccl-levels-host")?;
        let cross = group.subgroup_of_members(&cross_ranks, "jaccl-levels-across")?;
        Ok(Levels {
            local,
            cross,
            local_ranks,
            cross_ranks,
        })
    }

    /// The all-reduce of `input` (else `output`, in place) with `op` into `output`, elements
    /// of `dtype`; `Avg` is left a sum, for the caller to divide.
    pub(super) fn all_reduce(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
    ) -> Result<()> {
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
            .map_err(|e| self.in_group(e, true))?;
            let across = self.cross.start(move |g| {
                g.all_reduce_raw_in_place(&mut slice, dtype, op)?;
                Ok(slice)
            });
            pending.push_back((bytes, counts, across));
            // One chunk on the network while the host works on the next.
            if pending.len() > 1 || c + 1 == chunks {
                while let Some((bytes, counts, across)) = pending.pop_front() {
                    let slice = across.wait().map_err(|e| self.in_group(e, false))?;
                    self.local
                        .all_gather_v_raw(&slice, &mut output[bytes], &counts, dtype)
                        .map_err(|e| self.in_group(e, true))?;
                    if c + 1 < chunks {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// [`Levels::all_reduce`] on the levels `held` (by rank `rank` of the group), which are
    /// dropped if it fails: their members then fail promptly, not at their timeout.
    pub(super) fn all_reduce_held(
        held: &Mutex<Option<Levels>>,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        rank: usize,
    ) -> Result<()> {
        let mut held = held.lock().map_err(|_| Error::Closed { rank })?;
        let Some(levels) = held.as_mut() else {
            return Err(Error::Closed { rank });
        };
        let result = levels.all_reduce(input, output, dtype, op);
        if result.is_err() {
            *held = None;
        }
        result
    }

    /// An error of the host's group (`local`) or the cross group, as the group reports it.
    fn in_group(&self, error: Error, local: bool) -> Error {
        let ranks = match local {
            true => &self.local_ranks,
            false => &self.cross_ranks,
        };
        error.seen_from(Op::AllReduce, |r| ranks.get(r).copied().unwrap_or(r))
    }
}

impl Group {
    /// The group's two levels ([`Levels`]), formed on the first call that needs them: every
    /// rank makes that call.
    pub(super) fn levels(&mut self, op: Op) -> Result<Arc<Mutex<Option<Levels>>>> {
        let levels = Arc::clone(&self.levels);
        let mut held = levels
            .lock()
            .map_err(|_| self.invalid(op, "the two levels are poisoned".into()))?;
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
        error.seen_from(op, |r| r)
    }
}

/// Part `i` of `n` near-equal parts of `0..count` (the first `count % n` one longer).
fn part(count: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    let (base, extra) = (count / n, count % n);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}
