//! The binomial-tree family: the rooted collectives in ⌈log2 N⌉ rounds, over the mesh's
//! channels or links made on first use. Ranks are numbered by their distance from the root
//! (`v = rank − root mod N`); in round k the ranks with `v mod 2^(k+1) = 2^k` talk to
//! `v − 2^k`: they hand their subtree's data up (gather, reduce) or get it from there
//! (broadcast, scatter). The call's header travels with the data only (but for a gather's
//! large messages, [`GATHER_EAGER_MAX`]), so a rank that only sends goes on at once, as MPI's
//! eager sends do: in a loop of small gathers or reduces the leaves run ahead of the root.
//! Ranks that disagree on the root may so leave a message unread;
//! the call that reads it later fails with `Mismatch`, as the header carries the call's number
//! in the group (`crate::op_header::Header::number`), never taking it for its own, and so does
//! any call in which two of those ranks exchange headers, which carry a digest of the rooted
//! calls before (`Header::history`; docs/algorithms.md, "Broadcast", on what that leaves).
//!
//! Blocks of gather and scatter travel in a buffer of the blocks of the rank's subtree in order
//! of distance from the root (the rank's own first, [`subtree_blocks`]; the root's holds all),
//! so each subtree's blocks are one span.

use super::geometry::{Geometry, whole_frame};
use super::hosts::HostLayout;
use super::plan::{Plan, Span, Step, Transfer};

/// A binomial tree over some of the group's ranks, as this rank, one of them, sees it.
#[derive(Debug, Clone)]
struct Tree {
    /// The tree's ranks by distance from its root (the root first).
    ranks: Vec<usize>,
    /// This rank's distance from the root.
    me: usize,
}

/// A tree that a broadcast or reduce goes through, in the same rounds on every rank: `tree` is
/// `None` on ranks outside it, which idle those rounds.
struct Stage {
    tree: Option<Tree>,
    rounds: usize,
}

/// The largest message of a gather's tree edge that goes eagerly (header with the data, the
/// sender on at once); larger ones wait for the receiver, as MPI's rendezvous does. In a loop
/// of gathers, leaves that ran ahead with large blocks slowed the ranks that forward them
/// (`jaccl bench --op gather --dtype u8` over TCP, the root's buffer, µs, 2 runs, every edge
/// eager / those over 16 KiB waiting / every edge waiting): 8 ranks 256 KiB 133-239 / 92-106
/// / 58-126; 16 ranks 256 KiB 264-291 / 164-174 / 198-234; 32 ranks 128 KiB 186-197 / 162-165
/// / 279-287, 32 KiB 54-61 / 62-64 / 176-206. Scatters and reduces were fastest with every edge
/// eager (32 ranks, 256 KiB scatter 130-132 against 344-379 with 16 KiB; 32 KiB reduce 274-314
/// against 420-510 waiting).
const GATHER_EAGER_MAX: usize = 16 * 1024;

/// ⌈log2 n⌉: the rounds of a binomial tree of `n` ranks.
fn rounds(n: usize) -> usize {
    (usize::BITS - n.saturating_sub(1).leading_zeros()) as usize
}

impl Tree {
    /// The tree of all the group's ranks, from `root`.
    fn of(g: &Geometry, root: usize) -> Tree {
        Tree {
            ranks: (0..g.size).map(|v| (v + root) % g.size).collect(),
            me: (g.rank + g.size - root) % g.size,
        }
    }

    /// The tree of `ranks` (by distance from its root), if this rank is one of them.
    fn over(g: &Geometry, ranks: Vec<usize>) -> Option<Tree> {
        let me = ranks.iter().position(|&r| r == g.rank)?;
        Some(Tree { ranks, me })
    }

    fn n(&self) -> usize {
        self.ranks.len()
    }

    fn rank_of(&self, v: usize) -> usize {
        self.ranks[v]
    }

    /// In round `k`: the rank (by distance) this one hands its subtree to, if it does.
    fn parent(&self, k: usize) -> Option<usize> {
        let step = 1 << k;
        (self.me % (2 * step) == step).then(|| self.me - step)
    }

    /// In round `k`: the rank (by distance) that hands this one its subtree, if any.
    fn child(&self, k: usize) -> Option<usize> {
        let step = 1 << k;
        (self.me.is_multiple_of(2 * step) && self.me + step < self.n()).then(|| self.me + step)
    }

    /// The span of this rank's buffer holding the subtree that `v` heads in round `k`: `v`
    /// and the `2^k − 1` after it, as far as there are ranks.
    fn subtree(&self, v: usize, k: usize, block: usize) -> (usize, usize) {
        (
            (v - self.me) * block,
            (1usize << k).min(self.n() - v) * block,
        )
    }

    /// One transfer with the rank at distance `v`: sending `send`, receiving into `recv`, the
    /// call's header with the data (the receiver checks the sender's operation, type, count,
    /// root and call number), or, for a message of more than `eager_max` bytes, both ways: the
    /// sender then goes on only once the receiver has reached the call.
    fn with(&self, g: &Geometry, v: usize, send: Span, recv: Span, eager_max: usize) -> Plan {
        let channel = g.channel_to(self.rank_of(v), 0);
        let len = send.len.max(recv.len);
        let (tx, rx) = match len > eager_max {
            true => (true, true),
            false => (recv.len == 0 || send.len > 0, send.len == 0 || recv.len > 0),
        };
        Plan {
            transfers: vec![Transfer::new(
                tx.then_some(channel),
                rx.then_some(channel),
                vec![Step::copy(send, recv)],
                whole_frame(len),
            )],
            ..Plan::default()
        }
    }
}

/// The trees a broadcast from `root` goes through, in order (a reduce's, reversed): among
/// ranks on one host, the binomial tree of all; across hosts (`hosts`), first the tree of the
/// hosts' heads (the root, and the lowest rank of every other host, hosts in order from the
/// root's), so that the data crosses to each host once, then each host's tree from its head
/// (the ranks of the host in order from it), its rounds as many as the largest host's.
fn stages(g: &Geometry, hosts: Option<&HostLayout>, root: usize) -> Vec<Stage> {
    let Some(hosts) = hosts.filter(|h| h.count() > 1) else {
        let tree = Tree::of(g, root);
        return vec![Stage {
            rounds: rounds(tree.n()),
            tree: Some(tree),
        }];
    };
    let (count, home) = (hosts.count(), hosts.host_of(root).unwrap_or(0));
    let head = |h: usize| match h == home {
        true => root,
        false => hosts.ranks_on(h).first().copied().unwrap_or(root),
    };
    let heads = (0..count).map(|i| head((home + i) % count)).collect();
    let mine = hosts.ranks_on(hosts.host());
    let at = mine
        .iter()
        .position(|&r| r == head(hosts.host()))
        .unwrap_or(0);
    let host = mine[at..].iter().chain(&mine[..at]).copied().collect();
    let largest = (0..count).map(|h| hosts.ranks_on(h).len()).max();
    vec![
        Stage {
            tree: Tree::over(g, heads),
            rounds: rounds(count),
        },
        Stage {
            tree: Tree::over(g, host),
            rounds: rounds(largest.unwrap_or(1)),
        },
    ]
}

/// The rounds of a binomial-tree broadcast of `bytes` from `root` (over hosts `hosts`, where
/// the group spans several: [`stages`]): in round k of a tree every rank that has the data
/// (distance below 2^k) sends it to the rank 2^k further, so ⌈log2 size⌉ rounds reach every
/// rank. Headers travel with the data only, as in the ring's chains
/// (`super::ring::broadcast`).
pub(crate) fn broadcast(
    g: &Geometry,
    hosts: Option<&HostLayout>,
    root: usize,
    bytes: usize,
) -> Vec<Plan> {
    let data = Span::output(0, bytes);
    let in_round = |t: &Tree, k: usize| {
        let step = 1 << k;
        if t.me < step && t.me + step < t.n() {
            t.with(g, t.me + step, data, Span::EMPTY, usize::MAX)
        } else if (step..2 * step).contains(&t.me) {
            t.with(g, t.me - step, Span::EMPTY, data, usize::MAX)
        } else {
            Plan::default()
        }
    };
    let stages = stages(g, hosts, root);
    let rounds = stages
        .iter()
        .flat_map(|s| (0..s.rounds).map(move |k| (s, k)));
    rounds
        .map(|(s, k)| {
            s.tree
                .as_ref()
                .map_or_else(Plan::default, |t| in_round(t, k))
        })
        .collect()
}

/// The rounds of a binomial-tree gather of `block` bytes per rank to `root`, over a buffer of
/// the rank's subtree ([`subtree_blocks`]) whose first block, its own, the caller has filled:
/// each rank receives its children's subtrees, then sends its own subtree up.
pub(crate) fn gather(g: &Geometry, root: usize, block: usize) -> Vec<Plan> {
    let t = Tree::of(g, root);
    (0..rounds(t.n()))
        .map(|k| {
            if let Some(parent) = t.parent(k) {
                let (off, len) = t.subtree(t.me, k, block);
                t.with(
                    g,
                    parent,
                    Span::output(off, len),
                    Span::EMPTY,
                    GATHER_EAGER_MAX,
                )
            } else if let Some(child) = t.child(k) {
                let (off, len) = t.subtree(child, k, block);
                t.with(
                    g,
                    child,
                    Span::EMPTY,
                    Span::output(off, len),
                    GATHER_EAGER_MAX,
                )
            } else {
                Plan::default()
            }
        })
        .collect()
}

/// The rounds of a binomial-tree scatter of `block` bytes per rank from `root`, over a buffer
/// of the rank's subtree ([`subtree_blocks`]; the root's filled by the caller, by distance):
/// each rank receives its subtree's blocks, then hands its children theirs, the largest
/// subtree first. A rank's own block ends first in its buffer.
pub(crate) fn scatter(g: &Geometry, root: usize, block: usize) -> Vec<Plan> {
    let t = Tree::of(g, root);
    (0..rounds(t.n()))
        .rev()
        .map(|k| {
            if let Some(parent) = t.parent(k) {
                let (off, len) = t.subtree(t.me, k, block);
                t.with(g, parent, Span::EMPTY, Span::output(off, len), usize::MAX)
            } else if let Some(child) = t.child(k) {
                let (off, len) = t.subtree(child, k, block);
                t.with(g, child, Span::output(off, len), Span::EMPTY, usize::MAX)
            } else {
                Plan::default()
            }
        })
        .collect()
}

/// The rounds of a binomial-tree reduce of `bytes` per rank to `root` (over hosts `hosts`,
/// where the group spans several: [`stages`], in reverse), and whether this rank receives a
/// partial result in each: in each round of a tree a rank receives a child's partial result
/// into its output (and the caller reduces it into its own), or sends its partial result, from
/// its input, to its parent. So the root's result is `((v0 ⊕ v1) ⊕ (v2 ⊕ v3)) ⊕ …` by
/// distance from the root, the own partial first at every step; across hosts, each host's
/// ranks are so reduced by distance from the host's head, then the heads' results by distance
/// from the root's host.
pub(crate) fn reduce(
    g: &Geometry,
    hosts: Option<&HostLayout>,
    root: usize,
    bytes: usize,
) -> (Vec<Plan>, Vec<bool>) {
    let in_round = |t: &Tree, k: usize| {
        if let Some(parent) = t.parent(k) {
            (
                t.with(g, parent, Span::input(0, bytes), Span::EMPTY, usize::MAX),
                false,
            )
        } else if let Some(child) = t.child(k) {
            (
                t.with(g, child, Span::EMPTY, Span::output(0, bytes), usize::MAX),
                true,
            )
        } else {
            (Plan::default(), false)
        }
    };
    let stages = stages(g, hosts, root);
    let rounds = stages
        .iter()
        .rev()
        .flat_map(|s| (0..s.rounds).map(move |k| (s, k)));
    rounds
        .map(|(s, k)| match &s.tree {
            Some(t) => in_round(t, k),
            None => (Plan::default(), false),
        })
        .unzip()
}

/// The blocks of a rank's subtree in a gather or scatter from `root`: all for the root, else
/// the rank and those it serves, `2^j` (its distance has `j` trailing zeros) as far as there
/// are ranks.
pub(crate) fn subtree_blocks(g: &Geometry, root: usize) -> usize {
    let t = Tree::of(g, root);
    match t.me {
        0 => t.n(),
        me => (1usize << me.trailing_zeros()).min(t.n() - me),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::simulate::simulate_by_rounds;

    /// Runs `plans(g)`'s rounds one after another over every rank, each from the buffers
    /// `state` holds (input, output), with `between(rank, round, state)` after each round;
    /// returns the outputs. Elements are blocks.
    fn by_rounds(
        size: usize,
        plans: impl Fn(&Geometry) -> Vec<Plan>,
        mut state: Vec<(Vec<i64>, Vec<i64>)>,
        between: impl Fn(usize, usize, &mut (Vec<i64>, Vec<i64>)),
    ) -> Vec<(Vec<i64>, Vec<i64>)> {
        let any = Geometry {
            rank: 0,
            size,
            wires: 1,
            mesh: false,
        };
        for k in 0..plans(&any).len() {
            let before = state.clone();
            let outputs = simulate_by_rounds(
                size,
                1,
                false,
                |g| plans(g).swap_remove(k),
                |r| before[r].clone(),
            );
            for (r, out) in outputs.into_iter().enumerate() {
                state[r].1 = out;
                between(r, k, &mut state[r]);
            }
        }
        state
    }

    fn geometry(rank: usize, size: usize) -> Geometry {
        Geometry {
            rank,
            size,
            wires: 1,
            mesh: false,
        }
    }

    #[test]
    fn every_rooted_tree_delivers_every_block() {
        for size in 1..=20 {
            for root in 0..size {
                let at = format!("{size} ranks, root {root}");
                let dist = |r: usize| (r + size - root) % size;
                let held = |r: usize| subtree_blocks(&geometry(r, size), root);
                // Broadcast: the root's six values everywhere.
                let start = (0..size)
                    .map(|r| {
                        (
                            vec![],
                            if r == root {
                                (0..6).collect()
                            } else {
                                vec![-1; 6]
                            },
                        )
                    })
                    .collect();
                for (r, (_, out)) in
                    by_rounds(size, |g| broadcast(g, None, root, 6), start, |_, _, _| {})
                        .iter()
                        .enumerate()
                {
                    assert_eq!(
                        out,
                        &(0..6).collect::<Vec<i64>>(),
                        "broadcast, {at}, rank {r}"
                    );
                }
                // Gather: each rank's block first in its buffer; the root's holds all, by
                // distance.
                let start = (0..size)
                    .map(|r| {
                        let mut buf = vec![-1; held(r)];
                        buf[0] = 100 + r as i64;
                        (vec![], buf)
                    })
                    .collect();
                let gathered = by_rounds(size, |g| gather(g, root, 1), start, |_, _, _| {});
                let expect: Vec<i64> = (0..size)
                    .map(|v| 100 + ((v + root) % size) as i64)
                    .collect();
                assert_eq!(gathered[root].1, expect, "gather, {at}");
                // Scatter: the root's buffer by distance; each rank's block first in its own.
                let start = (0..size)
                    .map(|r| match r == root {
                        true => (vec![], expect.clone()),
                        false => (vec![], vec![-1; held(r)]),
                    })
                    .collect();
                let scattered = by_rounds(size, |g| scatter(g, root, 1), start, |_, _, _| {});
                for (r, (_, buf)) in scattered.iter().enumerate() {
                    assert_eq!(
                        buf[0],
                        100 + r as i64,
                        "scatter, {at}, rank {r} ({})",
                        dist(r)
                    );
                }
                // Reduce: sums of 2^rank, so each rank's part shows once and only once.
                let start = (0..size).map(|r| (vec![1i64 << r], vec![0])).collect();
                let reduced = by_rounds(
                    size,
                    |g| reduce(g, None, root, 1).0,
                    start,
                    |r, k, state| {
                        if reduce(&geometry(r, size), None, root, 1).1[k] {
                            state.0[0] += state.1[0];
                        }
                    },
                );
                assert_eq!(reduced[root].0[0], (1i64 << size) - 1, "reduce, {at}");
            }
        }
    }

    /// How many times rank `g.rank` sends data to a rank on another host in `plans` (not
    /// counting bare headers).
    fn sends_across(g: &Geometry, hosts: &HostLayout, plans: &[Plan]) -> usize {
        let transfers = plans.iter().flat_map(|p| &p.transfers);
        let data = transfers.filter(|t| t.steps.iter().any(|s| s.send.len > 0));
        let peers = data.filter_map(|t| t.tx.and_then(|c| g.peer_on(c)));
        peers
            .filter(|&p| hosts.host_of(p) != Some(hosts.host()))
            .count()
    }

    #[test]
    fn trees_across_hosts_cross_to_each_host_once_and_reach_every_rank() {
        let layouts: [&[usize]; 6] = [
            &[0, 0, 0, 0, 1, 1, 1, 1],
            &[0, 1, 0, 1, 0, 1, 0, 1],
            &[0, 1, 2, 0, 1, 2, 0, 1, 2],
            &[0, 1, 0, 2, 1, 0, 2, 1, 0],
            &[0, 0, 1, 1, 2, 2, 3, 3],
            &[0, 1, 2, 3, 4],
        ];
        for host_of in layouts {
            let size = host_of.len();
            let hosts_seen = |r: usize| HostLayout::new(r, host_of.to_vec()).unwrap();
            let count = hosts_seen(0).count();
            for root in 0..size {
                let at = format!("{host_of:?}, root {root}");
                let broadcast_of = |g: &Geometry| broadcast(g, Some(&hosts_seen(g.rank)), root, 6);
                let reduce_of = |g: &Geometry| reduce(g, Some(&hosts_seen(g.rank)), root, 1);
                // Each rank of a host other than the root's gets the data from across once; the
                // root's host gets nothing from across. A reduce goes the other way.
                let across: usize = (0..size)
                    .map(|r| {
                        let g = geometry(r, size);
                        sends_across(&g, &hosts_seen(r), &broadcast_of(&g))
                    })
                    .sum();
                assert_eq!(across, count - 1, "broadcast, {at}");
                let across: usize = (0..size)
                    .map(|r| {
                        let g = geometry(r, size);
                        sends_across(&g, &hosts_seen(r), &reduce_of(&g).0)
                    })
                    .sum();
                assert_eq!(across, count - 1, "reduce, {at}");
                let start = (0..size)
                    .map(|r| (vec![], vec![if r == root { 7 } else { -1 }; 6]))
                    .collect();
                for (r, (_, out)) in by_rounds(size, broadcast_of, start, |_, _, _| {})
                    .iter()
                    .enumerate()
                {
                    assert_eq!(out, &vec![7; 6], "broadcast, {at}, rank {r}");
                }
                let start = (0..size).map(|r| (vec![1i64 << r], vec![0])).collect();
                let reduced = by_rounds(
                    size,
                    |g| reduce_of(g).0,
                    start,
                    |r, k, state| {
                        if reduce_of(&geometry(r, size)).1[k] {
                            state.0[0] += state.1[0];
                        }
                    },
                );
                assert_eq!(reduced[root].0[0], (1i64 << size) - 1, "reduce, {at}");
            }
        }
    }
}
