//! All-reduce by recursive halving then recursive doubling (Rabenseifner's algorithm), among
//! any number of ranks. The ranks beyond a power of two hand their vectors over and get the
//! result back, as in recursive doubling ([`Geometry::doubling_role`]). The `p` ranks that
//! double cut the vector into `p` blocks of whole elements, one per rank (at its doubling index
//! with the bits reversed, [`by_block_bit`]); they reduce-scatter the blocks by recursive
//! halving (doubling's steps in its order: send the partner the half of the current group of
//! blocks around its block, reduce the half around one's own with what it sends back), then
//! all-gather them by recursive doubling (the steps in reverse, each swapping the group of
//! blocks gathered so far).
//!
//! 2·log2 p rounds (2 more with hand-overs) that move 2(p−1)/p of the vector per rank, against
//! recursive doubling's log2 p whole vectors and the ring's 2(N−1) rounds: the choice for
//! middle sizes. Each block is reduced on one rank only, in the tree of the halving steps (in
//! each, the own partial result first, then the partner's), then copied to every other, so
//! every rank gets the same bits.

use std::ops::Range;

use super::call::Call;
use super::doubling::{aligned_blocks, around_hand_over, hand_over, with_peer};
use super::engine::{Network, Rounds, Scratch};
use super::geometry::{DoublingRole, Geometry, lane_slice};
use super::plan::{Plan, Span};
use crate::error::Result;
use crate::reduce::{Reducer, copy};

/// The partners in the order of the bit of the block position they differ in (halving runs
/// them from the last to the first). A rank's block is at its doubling index with the bits
/// reversed, so that halving's first step pairs ranks as doubling's first does: the ring
/// neighbours where the ranks pair up, who then see each other's header (and a `Mismatch`)
/// first. At 4 ranks both partners are ring neighbours, and only doubling's order halves (the
/// pair, then the other neighbour, [`Geometry::doubling_partners`], whose second pairs must
/// hold the same half after the first): there the blocks stay at the doubling index.
fn by_block_bit(g: &Geometry, partners: &[usize]) -> Vec<usize> {
    match g.size {
        4 => partners.to_vec(),
        _ => partners.iter().rev().copied().collect(),
    }
}

/// A rank's index among the ranks that double, from its partners in some order: with the k-th
/// partner it differs in bit k, and the lower index is the lower rank.
fn doubling_index(rank: usize, partners: &[usize]) -> usize {
    partners
        .iter()
        .enumerate()
        .map(|(k, &p)| usize::from(rank > p) << k)
        .sum()
}

/// The byte range of the aligned group of 2^k blocks around block `index`, when `count`
/// elements of `elem` bytes are cut into `blocks` blocks ([`lane_slice`]).
fn group_bytes(count: usize, elem: usize, blocks: usize, index: usize, k: usize) -> Range<usize> {
    let group = aligned_blocks(index, k);
    let start = lane_slice(count, blocks, group.start).start;
    let end = lane_slice(count, blocks, group.end - 1).end;
    start * elem..end * elem
}

/// The rounds of a Rabenseifner all-reduce of `count` elements of `elem` bytes for a rank in
/// `role`, in the order it runs them: the halving steps send from the input (the output after
/// the first) and receive into scratch, the doubling steps swap within the output.
pub(crate) fn all_reduce_plans(
    g: &Geometry,
    role: &DoublingRole,
    count: usize,
    elem: usize,
) -> Vec<Plan> {
    let bytes = count * elem;
    around_hand_over(g, role, bytes, Span::output(0, bytes), |partners| {
        let partners = by_block_bit(g, partners);
        let (steps, me) = (partners.len(), doubling_index(g.rank, &partners));
        let group = |index: usize, k: usize| group_bytes(count, elem, 1 << steps, index, k);
        let span =
            |range: Range<usize>, buf: fn(usize, usize) -> Span| buf(range.start, range.len());
        let halving = (0..steps).rev().map(|k| {
            let (theirs, mine) = (group(me ^ (1 << k), k), group(me, k));
            with_peer(
                g,
                partners[k],
                span(theirs, Span::input),
                span(mine, Span::output),
            )
        });
        let doubling = (0..steps).map(|k| {
            let (mine, theirs) = (group(me, k), group(me ^ (1 << k), k));
            with_peer(
                g,
                partners[k],
                span(mine, Span::output),
                span(theirs, Span::output),
            )
        });
        halving.chain(doubling).collect()
    })
}

/// All-reduce of `input` (or `output` in place) into `output` by Rabenseifner's algorithm
/// ([`all_reduce_plans`]). Scratch holds what the partner of a halving step (or the extra
/// rank) sends.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_reduce(
    net: &mut Network,
    g: &Geometry,
    scratch: &mut Scratch,
    input: Option<&[u8]>,
    output: &mut [u8],
    reducer: &Reducer,
    call: &Call,
    role: &DoublingRole,
) -> Result<()> {
    let (bytes, elem) = (output.len(), reducer.elem_size());
    let count = bytes / elem;
    let plans = all_reduce_plans(g, role, count, elem);
    let mut rounds = Rounds::new(net, &plans, call);
    let (extra, partners) = match role {
        DoublingRole::HandOver { .. } => return hand_over(&mut rounds, input, output),
        DoublingRole::Double { extra, partners } => (*extra, partners.as_slice()),
    };
    let theirs = scratch.bytes(bytes);
    let (mut input, mut round) = (input, 0);
    if extra.is_some() {
        // The extra rank's vector and this one's, combined into the output.
        rounds.run(round, &mut *theirs, None)?;
        match input.take() {
            Some(input) => reducer.combine(output, input, theirs),
            None => reducer.accumulate(output, theirs),
        }
        round += 1;
    }
    let partners = by_block_bit(g, partners);
    let (steps, me) = (partners.len(), doubling_index(g.rank, &partners));
    for k in (0..steps).rev() {
        let mine = group_bytes(count, elem, 1 << steps, me, k);
        match input.take() {
            Some(input) => {
                rounds.run(round, &mut *theirs, Some(input))?;
                reducer.combine(
                    &mut output[mine.clone()],
                    &input[mine.clone()],
                    &theirs[mine],
                );
            }
            None => {
                rounds.run(round, &mut *theirs, Some(&*output))?;
                reducer.accumulate(&mut output[mine.clone()], &theirs[mine]);
            }
        }
        round += 1;
    }
    if let Some(input) = input {
        // A group of one: the vector is the result.
        copy(output, input);
    }
    for _ in 0..steps {
        rounds.run(round, &mut *output, None)?;
        round += 1;
    }
    match extra {
        Some(_) => rounds.run(round, output, None),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::plan::Step;

    /// Among any number of ranks: each doubling rank's halving ends on its own block, partners
    /// send each other exactly what the other expects, and the blocks tile the vector.
    #[test]
    fn halving_then_doubling_among_any_number_of_ranks_matches_partners() {
        for (size, count, mesh) in (2..=40)
            .flat_map(|size| [1, 5, 64, 1000].map(|count| (size, count)))
            .flat_map(|(size, count)| [false, true].map(|mesh| (size, count, mesh)))
        {
            let g = |rank| Geometry {
                rank,
                size,
                wires: 2,
                mesh,
            };
            let at = format!("{size} ranks, {count} elements, mesh {mesh}");
            let roles: Vec<DoublingRole> = (0..size).map(|r| g(r).doubling_role()).collect();
            let plans: Vec<Vec<Plan>> = (0..size)
                .map(|r| all_reduce_plans(&g(r), &roles[r], count, 4))
                .collect();
            let mut owned = Vec::new();
            for (r, role) in roles.iter().enumerate() {
                let DoublingRole::Double { extra, partners } = role else {
                    assert_eq!(plans[r].len(), 2, "{at}: rank {r} hands over");
                    continue;
                };
                let partners = by_block_bit(&g(r), partners);
                let steps = partners.len();
                let me = doubling_index(r, &partners);
                owned.push(group_bytes(count, 4, 1 << steps, me, 0));
                let first = usize::from(extra.is_some());
                assert_eq!(plans[r].len(), 2 * steps + 2 * first, "{at}: rank {r}");
                for (i, plan) in plans[r][first..first + 2 * steps].iter().enumerate() {
                    let k = if i < steps { steps - 1 - i } else { i - steps };
                    let peer = partners[k];
                    let DoublingRole::Double {
                        partners: theirs, ..
                    } = &roles[peer]
                    else {
                        panic!("{at}: {r}'s partner {peer} hands over");
                    };
                    let theirs = by_block_bit(&g(peer), theirs);
                    let back = &plans[peer][first_round(&roles[peer]) + i];
                    assert_eq!(theirs[k], r, "{at}: step {k}");
                    let spans = |p: &Plan, side: fn(&Step) -> Span| -> Vec<(usize, usize)> {
                        p.transfers
                            .iter()
                            .map(|t| side(&t.steps[0]))
                            .map(|s| (s.off, s.len))
                            .collect()
                    };
                    assert_eq!(
                        spans(plan, |s| s.send),
                        spans(back, |s| s.recv),
                        "{at}: {r} to {peer}, round {i}"
                    );
                }
            }
            owned.sort_by_key(|r| r.start);
            let mut next = 0;
            for range in owned {
                assert_eq!(range.start, next, "{at}");
                next = range.end;
            }
            assert_eq!(next, count * 4, "{at}");
        }
    }

    fn first_round(role: &DoublingRole) -> usize {
        match role {
            DoublingRole::Double { extra, .. } => usize::from(extra.is_some()),
            DoublingRole::HandOver { .. } => 0,
        }
    }
}
