//! The collectives that go in two levels ([`Levels`]). Each element is reduced within its
//! host first (in the order of the host's reduce-scatter), then across hosts (in the order of
//! the cross group's all-reduce or reduce-scatter), the same on every rank: the result is
//! bit-identical on every rank and from run to run. `Avg` is summed on both levels, for the
//! caller to divide once.

use std::collections::VecDeque;
use std::ops::Range;

use super::super::Request;
use super::{Level, Levels};
use crate::algo::call::Call;
use crate::algo::hosts::two_level_chunks;
use crate::dtype::{Dtype, ReduceOp};
use crate::error::Result;
use crate::liveness::INTERRUPT_EVERY;
use crate::reduce::copy;

impl Levels {
    /// The all-reduce of `input` (else `output`, in place) with `op` into `output`, elements
    /// of `dtype`, for the group's `call`: the host reduce-scatters, the ranks of each local
    /// rank all-reduce their slice across hosts, the host all-gathers. Chunk by chunk: the
    /// network all-reduces one chunk (on the cross group's progress thread) while the host
    /// reduce-scatters the next and gathers the one before.
    pub(in crate::group) fn all_reduce(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        call: &Call,
    ) -> Result<()> {
        self.act_for(call);
        let op = summed(op);
        let size = dtype.size();
        let count = output.len() / size;
        let chunks = two_level_chunks(output.len());
        let ranks = self.local.size();
        let mut pending = VecDeque::new();
        for c in 0..chunks {
            let span = part(count, chunks, c);
            let counts: Vec<usize> = (0..ranks)
                .map(|r| part(span.len(), ranks, r).len())
                .collect();
            let bytes = span.start * size..span.end * size;
            let mut slice = vec![0u8; counts[self.local.rank()] * size];
            let whole = &input.unwrap_or(&*output)[bytes.clone()];
            self.local
                .reduce_scatter_v_raw(whole, &mut slice, &counts, dtype, op)
                .map_err(|e| self.in_group(e, Level::Host, call))?;
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
                        .map_err(|e| self.in_group(e, Level::Host, call))?;
                    if c + 1 < chunks {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// The all-gather of `input` (every rank's block) into `output`, in rank order: the ranks
    /// of each local rank gather their blocks across hosts, then the host gathers what its
    /// ranks hold, which comes by local rank, then host, and is put in rank order.
    pub(in crate::group) fn all_gather(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        call: &Call,
    ) -> Result<()> {
        self.act_for(call);
        let block = input.len();
        let mut across = vec![0u8; self.hosts.count() * block];
        self.cross
            .all_gather_raw(input, &mut across, dtype)
            .map_err(|e| self.in_group(e, Level::Across, call))?;
        let mut gathered = vec![0u8; output.len()];
        self.local
            .all_gather_raw(&across, &mut gathered, dtype)
            .map_err(|e| self.in_group(e, Level::Host, call))?;
        for (rank, at) in self.by_local_rank_then_host(block) {
            copy(&mut output[rank * block..][..block], &gathered[at]);
        }
        Ok(())
    }

    /// The reduce-scatter with `op` of `input` (a block for every rank, in rank order) into
    /// `output` (this rank's block): the host reduce-scatters the blocks ordered by local rank,
    /// then host, each rank keeping those of its local rank on every host, which the ranks of
    /// each local rank then reduce-scatter across hosts.
    pub(in crate::group) fn reduce_scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        call: &Call,
    ) -> Result<()> {
        self.act_for(call);
        let op = summed(op);
        let block = output.len();
        let mut arranged = vec![0u8; input.len()];
        for (rank, at) in self.by_local_rank_then_host(block) {
            copy(&mut arranged[at], &input[rank * block..][..block]);
        }
        let mut partial = vec![0u8; self.hosts.count() * block];
        self.local
            .reduce_scatter_raw(&arranged, &mut partial, dtype, op)
            .map_err(|e| self.in_group(e, Level::Host, call))?;
        self.cross
            .reduce_scatter_raw(&partial, output, dtype, op)
            .map_err(|e| self.in_group(e, Level::Across, call))
    }

    /// Every rank of the group with the bytes of its block of `block` bytes in a buffer of
    /// every rank's block ordered by local rank, then host: what the host's level gathers
    /// after the level across hosts, and reduce-scatters before it.
    fn by_local_rank_then_host(&self, block: usize) -> Vec<(usize, Range<usize>)> {
        let (hosts, here) = (self.hosts.count(), self.hosts.local_size());
        (0..here * hosts)
            .map(|i| {
                let rank = self.hosts.ranks_on(i % hosts)[i / hosts];
                (rank, i * block..(i + 1) * block)
            })
            .collect()
    }

    /// The network's part of a chunk, once done; meanwhile the group's interrupt check is
    /// asked (the cross group's progress thread does not ask it).
    fn wait_across(&self, across: Request<Vec<u8>>, call: &Call) -> Result<Vec<u8>> {
        while !across.wait_timeout(INTERRUPT_EVERY) {
            if let Some(group) = &self.group {
                group.check_interrupt(call.op, call.interruptible)?;
            }
        }
        across
            .wait()
            .map_err(|e| self.in_group(e, Level::Across, call))
    }
}

/// The reduction both levels apply for `op`: `Avg` is summed, then divided once by the caller.
fn summed(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg => ReduceOp::Sum,
        other => other,
    }
}

/// Part `i` of `n` near-equal parts of `0..count` (the first `count % n` one longer).
fn part(count: usize, n: usize, i: usize) -> Range<usize> {
    let (base, extra) = (count / n, count % n);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}
