//! Recursive doubling for ranks that fill hosts in blocks (`super::hosts::HostLayout::blocks`):
//! `L` ranks per host, ranks `hL..(h + 1)L` on host `h`, `L` and the number of hosts `H`
//! powers of two. Plain recursive doubling swaps the whole vector across hosts in its last
//! log2 H steps, every rank of a host at once: L times the message through each host's port.
//! Here the ranks of a host first double among themselves (log2 L steps over shared memory:
//! each then holds the host's sum), then local rank j swaps only slice j of it across hosts
//! (log2 H steps with the rank of local rank j on the partner host: the message once through
//! the port), then the host gathers the slices (log2 L steps). Every combination takes the
//! lower rank's value first, so every rank that holds a slice holds the same bits.

use std::ops::Range;

use super::call::Call;
use super::doubling::{aligned_blocks, combine_in_place, neighbours_apart, with_peer};
use super::engine::{Network, Rounds, Scratch};
use super::geometry::{Geometry, lane_slice};
use super::plan::{Plan, Span};
use crate::error::Result;
use crate::reduce::{Reducer, copy};

/// Who a rank swaps with, step by step.
struct Partners {
    /// Within the host, bit by bit of the local rank.
    local: Vec<usize>,
    /// Across hosts, bit by bit of the host, the same local rank.
    across: Vec<usize>,
    /// This rank's local rank.
    local_rank: usize,
    per_host: usize,
}

impl Partners {
    fn of(g: &Geometry, per_host: usize) -> Partners {
        let (r, hosts) = (g.rank, g.size / per_host.max(1));
        Partners {
            local: (0..per_host.trailing_zeros())
                .map(|k| r ^ (1 << k))
                .collect(),
            across: (0..hosts.trailing_zeros())
                .map(|k| r ^ (per_host << k))
                .collect(),
            local_rank: r % per_host.max(1),
            per_host,
        }
    }

    /// Bytes of slice `j` (by elements) of a vector of `count` elements of `elem` bytes.
    fn slice(&self, j: usize, count: usize, elem: usize) -> Range<usize> {
        let elems = lane_slice(count, self.per_host, j);
        elems.start * elem..elems.end * elem
    }

    /// Bytes of slices `blocks`.
    fn slices(&self, blocks: Range<usize>, count: usize, elem: usize) -> Range<usize> {
        self.slice(blocks.start, count, elem).start..self.slice(blocks.end - 1, count, elem).end
    }
}

/// The rounds of the all-reduce of `count` elements of `elem` bytes for rank `g.rank` of ranks
/// `per_host` to a host ([`all_reduce`]): the whole vector within the host, this rank's slice
/// across hosts, then the host's gather of the slices, which swaps the aligned groups of
/// slices each partner holds. The first round also exchanges headers with the ring neighbours
/// no round talks to.
pub(crate) fn all_reduce_plans(
    g: &Geometry,
    per_host: usize,
    count: usize,
    elem: usize,
) -> Vec<Plan> {
    let p = Partners::of(g, per_host);
    let bytes = count * elem;
    let whole = |partner| with_peer(g, partner, Span::input(0, bytes), Span::output(0, bytes));
    let mine = p.slice(p.local_rank, count, elem);
    let slice = |partner| {
        let (send, recv) = (
            Span::input(mine.start, mine.len()),
            Span::output(mine.start, mine.len()),
        );
        with_peer(g, partner, send, recv)
    };
    let gather = p.local.iter().enumerate().map(|(k, &partner)| {
        let span = |r: usize| {
            let held = p.slices(aligned_blocks(r % per_host, k), count, elem);
            Span::output(held.start, held.len())
        };
        with_peer(g, partner, span(g.rank), span(partner))
    });
    let mut plans: Vec<Plan> = p
        .local
        .iter()
        .map(|&partner| whole(partner))
        .chain(p.across.iter().map(|&partner| slice(partner)))
        .chain(gather)
        .collect();
    let peers: Vec<usize> = p.local.iter().chain(&p.across).copied().collect();
    if let Some(first) = plans.first_mut() {
        first.headers_both_ways = neighbours_apart(g, &peers);
    }
    plans
}

/// The all-reduce of `input` (else `output`, in place) into `output` among ranks `per_host` to
/// a host ([`all_reduce_plans`]). Scratch holds the partial result and the partner's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce(
    net: &mut Network,
    g: &Geometry,
    scratch: &mut Scratch,
    input: Option<&[u8]>,
    output: &mut [u8],
    reducer: &Reducer,
    call: &Call,
    per_host: usize,
) -> Result<()> {
    let (bytes, elem) = (output.len(), reducer.elem_size());
    let count = bytes / elem.max(1);
    let p = Partners::of(g, per_host);
    let plans = all_reduce_plans(g, per_host, count, elem);
    let mut rounds = Rounds::new(net, &plans, call);
    let all = scratch.bytes(2 * bytes);
    let (partial, theirs) = all.split_at_mut(bytes);
    // Combines the partner's `theirs[range]` into `partial[range]`, the lower rank's first.
    let combine = |partial: &mut [u8], theirs: &mut [u8], partner: usize, range: Range<usize>| {
        let (mine, other) = (&mut partial[range.clone()], &mut theirs[range]);
        combine_in_place(reducer, g.rank, partner, mine, other);
    };
    copy(partial, input.unwrap_or(&*output));
    let mut round = 0;
    for &partner in &p.local {
        rounds.run(round, theirs, Some(partial))?;
        combine(partial, theirs, partner, 0..bytes);
        round += 1;
    }
    let mine = p.slice(p.local_rank, count, elem);
    for &partner in &p.across {
        rounds.run(round, theirs, Some(partial))?;
        combine(partial, theirs, partner, mine.clone());
        round += 1;
    }
    copy(&mut output[mine.clone()], &partial[mine]);
    for k in round..plans.len() {
        rounds.run(k, output, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::plan::Merge;

    /// 2 hosts × 4 ranks: two steps within the host, one across with a quarter of the
    /// vector (the slice of the rank's local rank, to the same local rank), two gathering
    /// steps that swap one slice, then two; the partners agree on every span.
    #[test]
    fn across_hosts_each_rank_swaps_its_slice_with_the_same_local_rank() {
        let (per_host, count, elem) = (4, 10, 4);
        let plans_of = |rank| {
            let g = Geometry {
                rank,
                size: 8,
                wires: 1,
                mesh: false,
            };
            (g, all_reduce_plans(&g, per_host, count, elem))
        };
        for rank in 0..8 {
            let (g, plans) = plans_of(rank);
            assert_eq!(plans.len(), 5, "rank {rank}");
            let spans = |plan: &Plan| {
                let step = &plan.transfers[0].steps[0];
                (step.send, step.recv)
            };
            let peer_of = |plan: &Plan| {
                let channel = plan.transfers[0].tx.or(plan.transfers[0].rx).unwrap();
                g.peer_on(channel).unwrap()
            };
            let partners: Vec<usize> = plans.iter().map(peer_of).collect();
            assert_eq!(
                partners,
                [rank ^ 1, rank ^ 2, rank ^ 4, rank ^ 1, rank ^ 2],
                "rank {rank}"
            );
            // Slices of 10 elements among 4: 3, 3, 3, 1 elements.
            let slice = [0..12, 12..24, 24..36, 36..40][rank % 4].clone();
            let (send, recv) = spans(&plans[2]);
            assert_eq!(
                (send.off, send.len),
                (slice.start, slice.len()),
                "rank {rank}"
            );
            assert_eq!(
                (recv.off, recv.len),
                (slice.start, slice.len()),
                "rank {rank}"
            );
            assert_eq!(spans(&plans[0]).0.len, 40);
            // Each gathering step receives what the partner sends.
            for (k, plan) in plans.iter().enumerate().skip(3) {
                let (partner_g, partner_plans) = plans_of(partners[k]);
                let (send, recv) = spans(plan);
                let (their_send, their_recv) = spans(&partner_plans[k]);
                assert_eq!((recv.off, recv.len), (their_send.off, their_send.len));
                assert_eq!((send.off, send.len), (their_recv.off, their_recv.len));
                let back = partner_plans[k].transfers[0].tx.unwrap();
                assert_eq!(partner_g.peer_on(back), Some(rank));
                assert!(matches!(plan.transfers[0].steps[0].merge, Merge::Copy));
            }
        }
    }
}
