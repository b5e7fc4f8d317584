//! Reduce-scatter by recursive halving among a power of two of ranks, over links made on first
//! use (where the ranks pair up on the ring or the mesh, `super::doubling::reduce_scatter`
//! halves with those partners): `log2 N` messages per rank where the ring takes `N − 1` hops,
//! the same bytes. The partners are recursive doubling's, nearest first (rank `r ^ 1`, then
//! `r ^ 2`, …), so the first step, which also shows the call's header to the ring neighbour
//! that is no partner, pairs ring neighbours: a neighbour that called something else (or
//! took the ring for another length) fails at once with `Mismatch`. To halve nearest first yet
//! end on its own block, a rank works on its input's blocks in bit-reversed order (slot `s`
//! holds block `reverse(s)`): the halves it sends are then aligned groups of slots, and its own
//! slot, `reverse(r)`, holds block `r`. Each block is reduced on one rank only (its own partial
//! sum first, then the partner's, step by step), so no other rank's bits need to agree with it.

use std::ops::Range;

use super::call::Call;
use super::doubling::{aligned_blocks, neighbours_apart, with_peer};
use super::engine::{Network, Rounds, Scratch};
use super::geometry::Geometry;
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

/// The steps of halving among `size` ranks (a power of two).
fn steps(g: &Geometry) -> u32 {
    g.size.trailing_zeros()
}

/// The byte range of the aligned group of 2^k slots around `slot`, of `bytes` each.
fn group(slot: usize, k: usize, bytes: usize) -> Range<usize> {
    let slots = aligned_blocks(slot, k);
    slots.start * bytes..slots.end * bytes
}

/// The rounds of a rank whose output holds `bytes`: in the step with the partner whose slot
/// differs in bit `k` (from the highest bit down, so the nearest rank first), send the group of
/// 2^k slots around the partner's, receive the group around its own.
pub(crate) fn reduce_scatter_plans(g: &Geometry, bytes: usize) -> Vec<Plan> {
    let steps = steps(g) as usize;
    let me = reversed(g.rank, steps as u32);
    let mut plans: Vec<Plan> = (0..steps)
        .rev()
        .map(|k| {
            let partner = g.rank ^ (1 << (steps - 1 - k));
            let (theirs, mine) = (group(me ^ (1 << k), k, bytes), group(me, k, bytes));
            let send = Span::input(theirs.start, theirs.len());
            with_peer(g, partner, send, Span::output(mine.start, mine.len()))
        })
        .collect();
    let partners: Vec<usize> = (0..steps).map(|k| g.rank ^ (1 << k)).collect();
    if let Some(first) = plans.first_mut() {
        first.headers_both_ways = neighbours_apart(g, &partners);
    }
    plans
}

/// Reduces the `size` blocks of `input` over every rank, leaving block `rank` in `output`
/// ([`reduce_scatter_plans`]). Scratch holds the input in slot order, reduced in place step
/// by step, and what each partner sends.
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
    let (bytes, steps) = (output.len(), steps(g));
    if steps == 0 {
        copy(output, &input[..bytes]);
        return Ok(());
    }
    let me = reversed(g.rank, steps);
    let plans = reduce_scatter_plans(g, bytes);
    let all = scratch.bytes(2 * g.size * bytes);
    let (slots, theirs) = all.split_at_mut(g.size * bytes);
    for (s, slot) in slots.chunks_exact_mut(bytes.max(1)).enumerate() {
        let block = reversed(s, steps) * bytes;
        copy(slot, &input[block..block + bytes]);
    }
    let mut rounds = Rounds::new(net, &plans, call);
    for (i, k) in (0..steps as usize).rev().enumerate() {
        let mine = group(me, k, bytes);
        rounds.run(i, &mut *theirs, Some(&*slots))?;
        match k {
            0 => reducer.combine(output, &slots[mine.clone()], &theirs[mine]),
            _ => reducer.accumulate(&mut slots[mine.clone()], &theirs[mine]),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partners send each other exactly what the other receives, the first step pairs ring
    /// neighbours, and the last leaves each rank the slot of its own block.
    #[test]
    fn partners_agree_and_each_rank_ends_on_its_own_block() {
        for (size, mesh) in [2, 8, 16, 64, 256]
            .into_iter()
            .flat_map(|n| [(n, false), (n, true)])
        {
            let g = |rank| Geometry {
                rank,
                size,
                wires: 2,
                mesh,
            };
            let bytes = 24;
            let steps = steps(&g(0)) as usize;
            let plans: Vec<Vec<Plan>> = (0..size)
                .map(|r| reduce_scatter_plans(&g(r), bytes))
                .collect();
            let spans = |p: &Plan, recv: bool| -> Vec<(usize, usize)> {
                p.transfers
                    .iter()
                    .map(|t| {
                        if recv {
                            t.steps[0].recv
                        } else {
                            t.steps[0].send
                        }
                    })
                    .map(|s| (s.off, s.len))
                    .collect()
            };
            for r in 0..size {
                assert_eq!(plans[r].len(), steps, "{size} ranks");
                // The first partner is a ring neighbour; the other neighbour gets the header
                // then, and no later step sends headers alone.
                assert!((r ^ 1) == (r + 1) % size || (r ^ 1) == (r + size - 1) % size);
                assert_eq!(plans[r][0].headers_both_ways.len(), usize::from(size > 2));
                assert!(plans[r][1..].iter().all(|p| p.headers_both_ways.is_empty()));
                for (i, plan) in plans[r].iter().enumerate() {
                    let partner = r ^ (1 << i);
                    assert_eq!(spans(plan, false), spans(&plans[partner][i], true));
                }
                let me = reversed(r, steps as u32);
                assert_eq!(reversed(me, steps as u32), r);
                assert_eq!(group(me, 0, bytes), me * bytes..(me + 1) * bytes);
            }
        }
    }
}
