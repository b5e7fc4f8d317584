//! The mesh family: one step in which every rank sends straight to every other rank, over the
//! mesh's channels and the ring's wire 0 to the neighbours (and between two ranks, their one
//! connection both ways). The small collectives of the mesh use it: gathers, and with blocks
//! taken from the input, reduce-scatter.

use super::geometry::{Geometry, whole_frame};
use super::plan::{Plan, Span, Step, Transfer};

/// Every rank sends `send(p)` to every other rank p and receives p's into block p of the
/// output (`block` bytes each).
pub(crate) fn exchange_with_all(g: &Geometry, block: usize, send: impl Fn(usize) -> Span) -> Plan {
    exchange(g, send, |p| Span::output(p * block, block))
}

/// Every rank sends `send(p)` to every other rank p, over one channel per pair, and receives
/// p's into `recv(p)`: one step, every pair at once (all-to-all's pairwise exchange).
pub(crate) fn exchange(
    g: &Geometry,
    send: impl Fn(usize) -> Span,
    recv: impl Fn(usize) -> Span,
) -> Plan {
    let transfers = (0..g.size)
        .filter(|&p| p != g.rank)
        .map(|p| {
            let channel = g.channel_to(p, 0);
            let (send, recv) = (send(p), recv(p));
            Transfer::new(
                Some(channel),
                Some(channel),
                vec![Step::copy(send, recv)],
                whole_frame(send.len.max(recv.len)),
            )
        })
        .collect();
    Plan {
        transfers,
        ..Plan::default()
    }
}

/// A broadcast of `bytes` in one step: the root sends them to every other rank over its
/// channel to it; headers travel with the data, so the root returns once it has handed them
/// over (over shared memory, rings deep enough to run many calls ahead of slow receivers).
pub(crate) fn broadcast_flat(g: &Geometry, root: usize, bytes: usize) -> Plan {
    let data = Span::output(0, bytes);
    let one = |tx: Option<usize>, rx: Option<usize>, send: Span, recv: Span| {
        Transfer::new(tx, rx, vec![Step::copy(send, recv)], whole_frame(bytes))
    };
    let transfers = match g.rank == root {
        true => (0..g.size)
            .filter(|&p| p != root)
            .map(|p| one(Some(g.channel_to(p, 0)), None, data, Span::EMPTY))
            .collect(),
        false => vec![one(None, Some(g.channel_to(root, 0)), Span::EMPTY, data)],
    };
    Plan {
        transfers,
        ..Plan::default()
    }
}

/// Gathers every rank's block of `block` bytes into an output of `size` blocks whose own block
/// the caller has filled, in one step.
pub(crate) fn gather(g: &Geometry, block: usize) -> Plan {
    let own = Span::output(g.rank * block, block);
    exchange_with_all(g, block, |_| own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::simulate::{all_gather_case, simulate};

    #[test]
    fn the_mesh_exchange_sends_each_block_to_its_rank() {
        for size in 2..=8 {
            for wires in [1, 2] {
                let block = 3;
                let value = |r: usize, b: usize, i: usize| (r * 100 + b * 10 + i) as i64;
                let init = |r: usize| {
                    let input = (0..size)
                        .flat_map(|b| (0..block).map(move |i| value(r, b, i)))
                        .collect();
                    (input, vec![-1; size * block])
                };
                let outs = simulate(
                    size,
                    wires,
                    true,
                    |g| exchange_with_all(g, block, |p| Span::input(p * block, block)),
                    init,
                    false,
                );
                for (r, out) in outs.iter().enumerate() {
                    for p in (0..size).filter(|&p| p != r) {
                        let got = &out[p * block..(p + 1) * block];
                        let expect: Vec<i64> = (0..block).map(|i| value(p, r, i)).collect();
                        assert_eq!(got, expect, "size {size} wires {wires} rank {r} from {p}");
                    }
                }
            }
        }
    }

    #[test]
    fn gathering_in_one_step_delivers_every_block() {
        for size in 2..=8 {
            for (mesh, wires) in [(true, 1), (true, 3), (false, 2)] {
                if !mesh && size > 2 {
                    continue; // without the mesh only two ranks reach each other directly
                }
                let block = 5;
                let (init, expect) = all_gather_case(size, block);
                let outs = simulate(size, wires, mesh, |g| gather(g, block), &init, false);
                for out in &outs {
                    assert_eq!(out, &expect, "size {size} mesh {mesh} wires {wires}");
                }
            }
        }
    }
}
