//! Reduce-scatter by recursive halving among any number of ranks, over links made on first use
//! (where the ranks pair up on the ring or the mesh, `super::doubling::reduce_scatter` halves with
//! those partners): `log2 N` messages per rank where the ring takes `N − 1` hops, the same bytes.
//! The partners are recursive doubling's ([`Geometry::doubling_role`]), nearest first, so the first
//! step, which also shows the call's header to the ring neighbour that is no partner, pairs ring
//! neighbours: a neighbour that called something else (or took the ring for another length) fails
//! at once with `Mismatch` (an extra rank, which only sends in its first round, through its partner
//! or the deadlock search). Among a count that is not a power of two `p`, the ranks beyond it hand
//! their whole input to the rank above, which reduces the two inputs and halves for both, then
//! hands back the extra rank's block: 2 + log2 p rounds, the extra ranks' input sent once more.
//!
//! A doubling rank stands for its own block and its extra rank's (a pair's blocks are
//! neighbours, so its *slot* is one range of the input). To halve nearest first yet end on its
//! own slot, a rank lays its input's slots out in scratch in bit-reversed order (slot `s` holds
//! the blocks of doubling index `reverse(s)`): the halves it sends are then aligned groups of
//! slots, and its own slot lands at `reverse(index)`. Each block is reduced on one rank only
//! (the extra rank's input after the own, then each partner's partial sum step by step), so no
//! other rank's bits need to agree with it.

use std::ops::Range;

use super::call::Call;
use super::doubling::{aligned_blocks, around_hand_over, hand_over, with_peer};
use super::engine::{Network, Rounds, Scratch};
use super::geometry::{DoublingRole, Geometry, folded_index, folded_ranks};
use super::plan::{Plan, Span};
use crate::error::Result;
use crate::reduce::{Reducer, copy};

/// `i` with its lowest `bits` bits in reverse order.
fn reversed(i: usize, bits: u32) -> usize {
    match bits {
        0 => 0,
        _ => i.reverse_bits() >> (usize::BITS - bits),
    }
}

/// Where each doubling rank's blocks lie in scratch, in slot order, for blocks of `bytes`.
struct Slots {
    bytes: usize,
    /// The halving steps: log2 of the doubling ranks.
    steps: u32,
    /// The slot of this rank.
    me: usize,
    /// Slot `s` is the scratch bytes `offsets[s]..offsets[s + 1]`.
    offsets: Vec<usize>,
    /// Slot `s` holds the input bytes `sources[s]`.
    sources: Vec<Range<usize>>,
}

impl Slots {
    fn new(g: &Geometry, bytes: usize) -> Slots {
        let steps = g.size.checked_ilog2().unwrap_or(0);
        let sources: Vec<Range<usize>> = (0..1 << steps)
            .map(|s| folded_ranks(g.size, reversed(s, steps)))
            .map(|b| b.start * bytes..b.end * bytes)
            .collect();
        let offsets = std::iter::once(0)
            .chain(sources.iter().scan(0, |end, r| {
                *end += r.len();
                Some(*end)
            }))
            .collect();
        Slots {
            bytes,
            steps,
            me: reversed(folded_index(g.size, g.rank), steps),
            offsets,
            sources,
        }
    }

    /// The scratch bytes of the aligned group of 2^k slots around `slot`.
    fn group(&self, slot: usize, k: usize) -> Range<usize> {
        let slots = aligned_blocks(slot, k);
        self.offsets[slots.start]..self.offsets[slots.end]
    }
}

/// The rounds of a rank in `role` laid out as `slots`: in the step with the partner whose slot
/// differs in bit `k` (from the highest bit down, so the nearest rank first), send the group of
/// 2^k slots around the partner's, receive the group around its own; before and after, the
/// hand-over of an extra rank's input and its block.
fn reduce_scatter_plans(g: &Geometry, role: &DoublingRole, slots: &Slots) -> Vec<Plan> {
    let bytes = slots.bytes;
    // An extra rank's block comes first in its partner's slot.
    let back = Span::input(slots.offsets[slots.me], bytes);
    around_hand_over(g, role, g.size * bytes, back, |partners| {
        (0..slots.steps as usize)
            .rev()
            .zip(partners)
            .map(|(k, &partner)| {
                let (theirs, mine) = (
                    slots.group(slots.me ^ (1 << k), k),
                    slots.group(slots.me, k),
                );
                let send = Span::input(theirs.start, theirs.len());
                with_peer(g, partner, send, Span::output(mine.start, mine.len()))
            })
            .collect()
    })
}

/// Reduces the `size` blocks of `input` over every rank, leaving block `rank` in `output`
/// ([`reduce_scatter_plans`]). Scratch holds the input in slot order (with an extra rank's
/// reduced in), reduced in place step by step, and what the extra rank or each partner sends.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_scatter(
    net: &mut Network,
    g: &Geometry,
    scratch: &mut Scratch,
    input: &[u8],
    output: &mut [u8],
    reducer: &Reducer,
    call: &Call,
) -> Result<()> {
    let bytes = output.len();
    let role = g.doubling_role();
    let slots = Slots::new(g, bytes);
    let plans = reduce_scatter_plans(g, &role, &slots);
    let mut rounds = Rounds::new(net, &plans, call);
    let extra = match role {
        DoublingRole::HandOver { .. } => return hand_over(&mut rounds, Some(input), output),
        DoublingRole::Double { extra, .. } => extra.is_some(),
    };
    if slots.steps == 0 {
        copy(output, &input[..bytes]);
        return Ok(());
    }
    let all = scratch.bytes(2 * g.size * bytes);
    let (laid_out, theirs) = all.split_at_mut(g.size * bytes);
    if extra {
        rounds.run(0, &mut *theirs, None)?;
    }
    for (s, source) in slots.sources.iter().enumerate() {
        let slot = &mut laid_out[slots.offsets[s]..slots.offsets[s + 1]];
        match extra {
            true => reducer.combine(slot, &input[source.clone()], &theirs[source.clone()]),
            false => copy(slot, &input[source.clone()]),
        }
    }
    let first = usize::from(extra);
    for (i, k) in (0..slots.steps as usize).rev().enumerate() {
        let mine = slots.group(slots.me, k);
        rounds.run(first + i, &mut *theirs, Some(&*laid_out))?;
        match k == 0 && !extra {
            true => reducer.combine(output, &laid_out[mine.clone()], &theirs[mine]),
            false => reducer.accumulate(&mut laid_out[mine.clone()], &theirs[mine]),
        }
    }
    if extra {
        let own = slots.offsets[slots.me] + bytes;
        copy(output, &laid_out[own..own + bytes]);
        rounds.run(first + slots.steps as usize, output, Some(&*laid_out))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Among any number of ranks: partners send each other exactly what the other receives,
    /// the first step pairs ring neighbours, an extra rank's input and block go whole to and
    /// from the rank above, and each doubling rank ends on the slot of its own block (and its
    /// extra rank's), the slots tiling the input.
    #[test]
    fn partners_agree_and_each_rank_ends_on_its_own_block() {
        for (size, mesh) in (2..=40)
            .chain([64, 100, 256])
            .flat_map(|n| [(n, false), (n, true)])
        {
            let g = |rank| Geometry {
                rank,
                size,
                wires: 2,
                mesh,
            };
            if g(0).doubling_partners().is_some() {
                continue;
            }
            let bytes = 24;
            let at = format!("{size} ranks, mesh {mesh}");
            let roles: Vec<DoublingRole> = (0..size).map(|r| g(r).doubling_role()).collect();
            let plans: Vec<Vec<Plan>> = (0..size)
                .map(|r| reduce_scatter_plans(&g(r), &roles[r], &Slots::new(&g(r), bytes)))
                .collect();
            let spans = |p: &Plan, recv: bool| -> Vec<(usize, usize)> {
                p.transfers
                    .iter()
                    .map(|t| match recv {
                        true => t.steps[0].recv,
                        false => t.steps[0].send,
                    })
                    .map(|s| (s.off, s.len))
                    .collect()
            };
            let mut tiles = Vec::new();
            for (r, role) in roles.iter().enumerate() {
                let (extra, partners) = match role {
                    DoublingRole::HandOver { to } => {
                        assert_eq!(plans[r].len(), 2, "{at}: rank {r}");
                        assert_eq!(spans(&plans[r][0], false), spans(&plans[*to][0], true));
                        let back = plans[*to].last().expect("rounds");
                        let lens = |spans: Vec<(usize, usize)>| spans.iter().map(|s| s.1).sum();
                        let back_len: usize = lens(spans(back, false));
                        assert_eq!(lens(spans(&plans[r][1], true)), back_len, "{at}");
                        assert_eq!(back_len, bytes, "{at}: rank {r}");
                        let slots = Slots::new(&g(*to), bytes);
                        assert_eq!(slots.sources[slots.me].start, r * bytes, "{at}: rank {r}");
                        continue;
                    }
                    DoublingRole::Double { extra, partners } => (extra.is_some(), partners),
                };
                // The first round talks to a ring neighbour.
                let first = plans[r][0].transfers[0].tx.or(plans[r][0].transfers[0].rx);
                let neighbours = [g(r).left_channel(0), g(r).right_channel(0)];
                assert!(
                    first.is_some_and(|c| neighbours.contains(&c)),
                    "{at}: rank {r}"
                );
                let slots = Slots::new(&g(r), bytes);
                assert_eq!(
                    plans[r].len(),
                    slots.steps as usize + 2 * usize::from(extra)
                );
                for (i, &partner) in partners.iter().enumerate() {
                    let of = |rank: usize| i + usize::from(plans[rank].len() > partners.len());
                    let (mine, theirs) = (&plans[r][of(r)], &plans[partner][of(partner)]);
                    assert_eq!(
                        spans(mine, false),
                        spans(theirs, true),
                        "{at}: {r} to {partner}"
                    );
                }
                let own = &slots.sources[slots.me];
                assert!(own.contains(&(r * bytes)), "{at}: rank {r}");
                assert_eq!(
                    own.len(),
                    (1 + usize::from(extra)) * bytes,
                    "{at}: rank {r}"
                );
                tiles.push(own.clone());
            }
            tiles.sort_by_key(|r| r.start);
            let mut next = 0;
            for range in tiles {
                assert_eq!(range.start, next, "{at}");
                next = range.end;
            }
            assert_eq!(next, size * bytes, "{at}");
        }
    }
}
