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

/// The rounds of a binomial-tree broadcast of `bytes` from `root` over the mesh: in round k
/// every rank that has the data (relative rank below 2^k) sends it to the rank 2^k above it,
/// so ⌈log2 size⌉ rounds reach every rank. Headers travel with the data only, as in the
/// ring's chains (`super::ring::broadcast`).
pub(crate) fn broadcast_tree(g: &Geometry, root: usize, bytes: usize) -> Vec<Plan> {
    let n = g.size;
    let me = (g.rank + n - root) % n;
    let rank_of = |v: usize| (v + root) % n;
    let data = Span::output(0, bytes);
    let rounds = usize::BITS - (n - 1).leading_zeros();
    (0..rounds as usize)
        .map(|k| {
            let step = 1 << k;
            let mut plan = Plan::default();
            let transfer = if me < step && me + step < n {
                let channel = g.channel_to(rank_of(me + step), 0);
                Some((Some(channel), None, data, Span::EMPTY))
            } else if (step..2 * step).contains(&me) {
                let channel = g.channel_to(rank_of(me - step), 0);
                Some((None, Some(channel), Span::EMPTY, data))
            } else {
                None
            };
            if let Some((tx, rx, send, recv)) = transfer {
                let steps = vec![Step::copy(send, recv)];
                plan.transfers
                    .push(Transfer::new(tx, rx, steps, whole_frame(bytes)));
            }
            plan
        })
        .collect()
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

    #[test]
    fn the_broadcast_tree_reaches_every_rank() {
        for size in 2..=9 {
            for root in 0..size {
                let bytes = 6;
                let init = |r: usize| {
                    let out = match r == root {
                        true => (0..bytes as i64).collect(),
                        false => vec![-1; bytes],
                    };
                    (Vec::<i64>::new(), out)
                };
                // The rounds in turn, each on every rank.
                let mut state: Vec<Vec<i64>> = (0..size).map(|r| init(r).1).collect();
                let rounds = broadcast_tree(
                    &Geometry {
                        rank: 0,
                        size,
                        wires: 1,
                        mesh: true,
                    },
                    root,
                    bytes,
                )
                .len();
                for k in 0..rounds {
                    let before = state.clone();
                    state = crate::algo::simulate::simulate_by_rounds(
                        size,
                        1,
                        true,
                        |g| broadcast_tree(g, root, bytes).swap_remove(k),
                        |r| (vec![], before[r].clone()),
                    );
                }
                for (r, out) in state.iter().enumerate() {
                    assert_eq!(
                        out,
                        &(0..bytes as i64).collect::<Vec<_>>(),
                        "size {size} root {root} rank {r}"
                    );
                }
            }
        }
    }
}
