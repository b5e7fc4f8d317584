//! Bruck's all-gather among any number of ranks: ⌈log2 N⌉ rounds. In round k (d = 2^k) each
//! rank sends the blocks it holds, its own and the d − 1 after it (at most N − d in the last
//! round), to rank r − d, and receives as many from rank r + d, which holds the blocks after
//! those. The blocks gather in scratch in rotated order (own block first) and go in place at
//! the end. Every rank receives each block once, `(N − 1)·n` bytes as the ring, in ⌈log2 N⌉
//! messages where the ring takes N − 1 and the both-ways gather ⌈(N − 1)/2⌉. With one-byte
//! tokens it is the dissemination barrier.

use super::call::Call;
use super::engine::{Network, Rounds, Scratch};
use super::geometry::{Geometry, ring_index, whole_frame};
use super::plan::{Plan, Span, Step, Transfer};
use crate::error::Result;
use crate::reduce::copy;

/// The rounds of Bruck's all-gather of `block` bytes per rank, over a scratch buffer of
/// `size` blocks that holds block `r + i` at `i`. The first round also exchanges headers
/// with both ring neighbours, so each notices a neighbour that called something else (it
/// sends to one and receives from the other).
pub(crate) fn all_gather_plans(g: &Geometry, block: usize) -> Vec<Plan> {
    let n = g.size;
    let distances = std::iter::successors(Some(1usize), |d| d.checked_mul(2));
    distances
        .take_while(|&d| d < n)
        .map(|d| {
            let bytes = d.min(n - d) * block;
            let to = ring_index(g.rank, -(d as isize), n);
            let from = ring_index(g.rank, d as isize, n);
            let transfer = Transfer::new(
                Some(g.channel_to(to, 0)),
                Some(g.channel_to(from, 0)),
                vec![Step::copy(
                    Span::output(0, bytes),
                    Span::output(d * block, bytes),
                )],
                whole_frame(bytes),
            );
            Plan {
                transfers: vec![transfer],
                headers_both_ways: match d {
                    1 => vec![g.left_channel(0), g.right_channel(0)],
                    _ => Vec::new(),
                },
                ..Plan::default()
            }
        })
        .collect()
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
    let mut rounds = Rounds {
        net,
        plans: &plans,
        call,
    };
    for k in 0..plans.len() {
        rounds.run(k, &mut *rotated, None)?;
    }
    // Blocks r .. N − 1, then 0 .. r − 1.
    let (upper, lower) = rotated.split_at((n - g.rank) * block);
    copy(&mut output[own..], upper);
    copy(&mut output[..own], lower);
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
}
