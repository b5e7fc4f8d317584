//! Bruck's all-gather among any number of ranks: ⌈log2 N⌉ rounds. In round k (d = 2^k) each
//! rank sends the blocks it holds, its own and the d − 1 after it (at most N − d in the last
//! round), to rank r − d, and receives as many from rank r + d, which holds the blocks after
//! those. The blocks gather in scratch in rotated order (own block first) and go in place at
//! the end. Every rank receives each block once, `(N − 1)·n` bytes as the ring, in ⌈log2 N⌉
//! messages where the ring takes N − 1 and the both-ways gather ⌈(N − 1)/2⌉. With one-byte
//! tokens it is the dissemination barrier.
//!
//! Bruck's all-to-all, also ⌈log2 N⌉ rounds: each rank lays its blocks out in scratch rotated
//! (at `i` the block for rank r + i); in round k (d = 2^k) it sends the blocks at every `i`
//! with bit k set to rank r + d and receives as many from rank r − d into the same places.
//! Then the block at `i` came from rank r − i. Each round moves about half the blocks, so a
//! rank sends `⌈log2 N⌉·N/2` blocks where the pairwise exchange sends N − 1, in ⌈log2 N⌉
//! messages to 2⌈log2 N⌉ peers where it sends N − 1 to every other rank: for small blocks.

use super::call::Call;
use super::engine::{Network, Rounds, Scratch};
use super::geometry::{Geometry, blocks_by_rank, ring_index, whole_frame};
use super::plan::{Plan, Span, Step, Transfer};
use crate::error::Result;
use crate::reduce::copy;

/// The rounds of Bruck's all-gather of `block` bytes per rank, over a scratch buffer of
/// `size` blocks that holds block `r + i` at `i`. The first round also exchanges headers
/// with both ring neighbours, so each notices a neighbour that called something else (it
/// sends to one and receives from the other).
pub(crate) fn all_gather_plans(g: &Geometry, block: usize) -> Vec<Plan> {
    let n = g.size;
    distances(n)
        .map(|d| {
            let bytes = d.min(n - d) * block;
            let sends = Span::output(0, bytes);
            round(g, -(d as isize), sends, Span::output(d * block, bytes))
        })
        .collect()
}

/// A round that sends `sends` to the rank `to` places along the ring and receives as many
/// bytes into `receives` from the rank as many places the other way; the first (`to` = ±1)
/// exchanges headers with both ring neighbours.
fn round(g: &Geometry, to: isize, sends: Span, receives: Span) -> Plan {
    let n = g.size;
    let transfer = Transfer::new(
        Some(g.channel_to(ring_index(g.rank, to, n), 0)),
        Some(g.channel_to(ring_index(g.rank, -to, n), 0)),
        vec![Step::copy(sends, receives)],
        whole_frame(sends.len),
    );
    Plan {
        transfers: vec![transfer],
        headers_both_ways: match to.unsigned_abs() {
            1 => vec![g.left_channel(0), g.right_channel(0)],
            _ => Vec::new(),
        },
        ..Plan::default()
    }
}

/// Gathers every rank's block of `block` bytes into `output` (`size` blocks), whose own block
/// the caller has filled ([`all_gather_plans`]).
pub(crate) fn all_gather(
    net: &mut Network,
    g: &Geometry,
    scratch: &mut Scratch,
    output: &mut [u8],
    block: usize,
    call: &Call,
) -> Result<()> {
    let plans = all_gather_plans(g, block);
    let (n, own) = (g.size, g.rank * block);
    let rotated = scratch.bytes(n * block);
    copy(&mut rotated[..block], &output[own..own + block]);
    Rounds::new(net, &plans, call).run_all(rotated)?;
    blocks_by_rank(output, rotated, g.rank, block);
    Ok(())
}

/// The places (in rotated order) that round `d` of Bruck's all-to-all among `size` ranks
/// moves: those with bit `d` set.
fn moved(size: usize, d: usize) -> impl Iterator<Item = usize> {
    (0..size).filter(move |i| i & d != 0)
}

/// The most places any round of Bruck's all-to-all among `size` ranks moves.
fn most_moved(size: usize) -> usize {
    distances(size)
        .map(|d| moved(size, d).count())
        .max()
        .unwrap_or(0)
}

/// The rounds' distances: 1, 2, 4, ... below `size`.
fn distances(size: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(1usize), |d| d.checked_mul(2)).take_while(move |&d| d < size)
}

/// The rounds of Bruck's all-to-all of `block` bytes per pair of ranks, over a scratch
/// buffer of `size` blocks in rotated order, then the blocks a round sends (packed), then
/// those it receives. The first round also exchanges headers with both ring neighbours, as
/// the all-gather's.
pub(crate) fn all_to_all_plans(g: &Geometry, block: usize) -> Vec<Plan> {
    let n = g.size;
    let (outbox, inbox) = (n * block, (n + most_moved(n)) * block);
    distances(n)
        .map(|d| {
            let bytes = moved(n, d).count() * block;
            let sends = Span::output(outbox, bytes);
            round(g, d as isize, sends, Span::output(inbox, bytes))
        })
        .collect()
}

/// Sends block `d` of `input` (`size` blocks of `block` bytes) to rank d and puts rank s's
/// block for this rank at block `s` of `output` ([`all_to_all_plans`]).
pub(crate) fn all_to_all(
    net: &mut Network,
    g: &Geometry,
    scratch: &mut Scratch,
    input: &[u8],
    output: &mut [u8],
    block: usize,
    call: &Call,
) -> Result<()> {
    let plans = all_to_all_plans(g, block);
    let (n, r) = (g.size, g.rank);
    let (outbox, inbox) = (n * block, (n + most_moved(n)) * block);
    let buf = scratch.bytes(inbox + most_moved(n) * block);
    let at = |i: usize| i * block..(i + 1) * block;
    for i in 0..n {
        copy(&mut buf[at(i)], &input[at((r + i) % n)]);
    }
    let mut rounds = Rounds::new(net, &plans, call);
    for (k, d) in distances(n).enumerate() {
        for (j, i) in moved(n, d).enumerate() {
            buf.copy_within(at(i), outbox + j * block);
        }
        rounds.run(k, &mut *buf, None)?;
        for (j, i) in moved(n, d).enumerate() {
            buf.copy_within(inbox + j * block..inbox + (j + 1) * block, i * block);
        }
    }
    for i in 0..n {
        copy(&mut output[at((r + n - i) % n)], &buf[at(i)]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At every size each round's send reaches a rank that receives exactly it (the same
    /// length, from this rank), and after the last round every rank holds every block once.
    #[test]
    fn every_rank_gathers_every_block_once() {
        for size in 2..=40 {
            let g = |rank| Geometry {
                rank,
                size,
                wires: 2,
                mesh: false,
            };
            let plans: Vec<Vec<Plan>> = (0..size).map(|r| all_gather_plans(&g(r), 3)).collect();
            let rounds = size.next_power_of_two().trailing_zeros() as usize;
            // held[r]: the blocks rank r holds, in its scratch order.
            let mut held: Vec<Vec<usize>> = (0..size).map(|r| vec![r]).collect();
            assert!(plans.iter().all(|p| p.len() == rounds), "{size} ranks");
            for d in (0..rounds).map(|k| 1usize << k) {
                let (k, before) = (d.trailing_zeros() as usize, held.clone());
                for (r, mine) in held.iter_mut().enumerate() {
                    let t = &plans[r][k].transfers[0];
                    let from = (r + d) % size;
                    let sender = &plans[from][k].transfers[0];
                    assert_eq!(sender.steps[0].send.len, t.steps[0].recv.len, "{size}: {k}");
                    assert_eq!(t.rx, Some(g(r).channel_to(from, 0)));
                    assert_eq!(sender.tx, Some(g(from).channel_to(r, 0)));
                    assert_eq!(t.steps[0].recv.off, d * 3);
                    let count = t.steps[0].recv.len / 3;
                    mine.extend_from_slice(&before[from][..count]);
                }
            }
            for (r, blocks) in held.iter().enumerate() {
                let expect: Vec<usize> = (0..size).map(|i| (r + i) % size).collect();
                assert_eq!(blocks, &expect, "{size} ranks, rank {r}");
            }
        }
    }

    /// At every size each round's send reaches a rank that receives exactly it, and after
    /// the last round every rank holds, at each block, the block that rank sent it.
    #[test]
    fn every_block_of_the_all_to_all_reaches_its_rank() {
        for size in 2..=40 {
            let g = |rank| Geometry {
                rank,
                size,
                wires: 1,
                mesh: false,
            };
            let plans: Vec<Vec<Plan>> = (0..size).map(|r| all_to_all_plans(&g(r), 2)).collect();
            // slots[r][i]: (from, to) of the block rank r holds at rotated place i.
            let mut slots: Vec<Vec<(usize, usize)>> = (0..size)
                .map(|r| (0..size).map(|i| (r, (r + i) % size)).collect())
                .collect();
            for (k, d) in distances(size).enumerate() {
                let before = slots.clone();
                for (r, mine) in slots.iter_mut().enumerate() {
                    let from = (r + size - d) % size;
                    let t = &plans[r][k].transfers[0];
                    let sender = &plans[from][k].transfers[0];
                    assert_eq!(sender.steps[0].send.len, t.steps[0].recv.len, "{size}: {k}");
                    assert_eq!(t.rx, Some(g(r).channel_to(from, 0)));
                    assert_eq!(sender.tx, Some(g(from).channel_to(r, 0)));
                    for i in moved(size, d) {
                        mine[i] = before[from][i];
                    }
                }
            }
            for (r, mine) in slots.iter().enumerate() {
                for (i, &(from, to)) in mine.iter().enumerate() {
                    assert_eq!(
                        (from, to),
                        ((r + size - i) % size, r),
                        "{size}: rank {r} at {i}"
                    );
                }
            }
        }
    }
}
