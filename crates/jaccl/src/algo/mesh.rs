//! The mesh family: one step in which every rank sends straight to every other rank, over the
//! mesh's channels and the ring's wire 0 to the neighbours (and between two ranks, their one
//! connection both ways). The small collectives of the mesh use it: gathers, and with blocks
//! taken from the input, reduce-scatter.

use super::geometry::{Geometry, frame_bytes};
use super::plan::{Merge, Plan, Span, Step, Transfer};

/// Every rank sends `send(p)` to every other rank p and receives p's into block p of the
/// output (`block` bytes each).
pub(crate) fn exchange_with_all(g: &Geometry, block: usize, send: impl Fn(usize) -> Span) -> Plan {
    let transfers = (0..g.size)
        .filter(|&p| p != g.rank)
        .map(|p| {
            let channel = g.channel_to(p, 0);
            Transfer {
                tx: Some(channel),
                rx: Some(channel),
                steps: vec![Step {
                    send: send(p),
                    recv: Span::output(p * block, block),
                    merge: Merge::Copy,
                }],
                frame: frame_bytes(block),
                merge_after_send: false,
            }
        })
        .collect();
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
    use crate::algo::simulate::simulate;

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
                let init = |r: usize| {
                    let mut out = vec![-1i64; size * block];
                    for i in 0..block {
                        out[r * block + i] = (r * 100 + i) as i64;
                    }
                    (vec![], out)
                };
                let expect: Vec<i64> = (0..size)
                    .flat_map(|r| (0..block).map(move |i| (r * 100 + i) as i64))
                    .collect();
                let outs = simulate(size, wires, mesh, |g| gather(g, block), init, false);
                for out in &outs {
                    assert_eq!(out, &expect, "size {size} mesh {mesh} wires {wires}");
                }
            }
        }
    }
}
