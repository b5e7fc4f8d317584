//! The ring family: data moves between ring neighbours only, a block per step, on every lane
//! at once ([`super::geometry`]). All-reduce is a reduce-scatter then an all-gather; small
//! messages instead gather whole blocks both ways. See docs/algorithms.md for the steps and the
//! bytes on the wire.

use std::ops::Range;

use super::geometry::{Geometry, frame_bytes, lane_slice};
use super::mesh;
use super::plan::{Buf, Merge, Plan, Span, Step, Transfer};
use super::select::{self, SmallGather};

/// An empty plan for a collective: headers go both ways to both neighbours on wire 0, so that
/// a neighbour that called something else notices.
pub(crate) fn collective_plan(g: &Geometry) -> Plan {
    Plan {
        transfers: Vec::new(),
        headers_both_ways: vec![g.left_channel(0), g.right_channel(0)],
        ..Plan::default()
    }
}

/// An empty plan for a chain (broadcast, gather, scatter): headers travel with the data only,
/// from each rank to the next along the chain, so the root (or, for a gather, every rank but
/// the root) returns as soon as its data is handed over, without waiting for its neighbours to
/// reach the call: back-to-back broadcasts pipeline, as MPI's do. Every rank that receives
/// checks the sender's header (operation, type, count, root), so a neighbour that called
/// something else fails with `Mismatch`, and the sender fails on its next call (or, when it
/// waits on a receiver that never comes, by the deadlock search or the timeout).
fn chain_plan() -> Plan {
    Plan::default()
}

/// All-reduce of `count` elements of `elem` bytes: reduce-scatter over `size` chunks, then
/// all-gather. Rank r ends the reduce-scatter holding chunk r + 1 (direction 0) or r − 1
/// (direction 1) fully reduced.
pub(crate) fn all_reduce(g: &Geometry, count: usize, elem: usize, in_place: bool) -> Plan {
    let n = g.size;
    let lanes = select::lanes(count * elem, count, n, g.wires);
    let chunk = count.div_ceil(n);
    let mut plan = collective_plan(g);
    for dir in 0..lanes.dirs {
        for w in 0..lanes.wires {
            let (tx, rx, d) = g.lane_channels(dir, w);
            let slice = lane_slice(chunk, lanes.count(), dir * lanes.wires + w);
            // Byte span of this lane's slice of chunk c (chunks near the end may be short).
            let span = |c: usize| {
                let start = (c * chunk + slice.start).min(count);
                let end = (c * chunk + slice.end).min(count);
                (start * elem, (end - start) * elem)
            };
            let mut steps = Vec::with_capacity(2 * (n - 1));
            for s in 0..n as isize - 1 {
                let (send_off, send_len) = span(g.block(-d * s));
                let (recv_off, recv_len) = span(g.block(-d * (s + 1)));
                steps.push(Step {
                    send: if s == 0 {
                        Span::input(send_off, send_len)
                    } else {
                        Span::output(send_off, send_len)
                    },
                    recv: Span::output(recv_off, recv_len),
                    merge: Merge::Reduce {
                        own: (!in_place).then_some(recv_off),
                    },
                });
            }
            for t in 0..n as isize - 1 {
                let (send_off, send_len) = span(g.block(d * (1 - t)));
                let (recv_off, recv_len) = span(g.block(-d * t));
                steps.push(Step::copy(
                    Span::output(send_off, send_len),
                    Span::output(recv_off, recv_len),
                ));
            }
            plan.transfers.push(Transfer::new(
                Some(tx),
                Some(rx),
                steps,
                frame_bytes(slice.len() * elem),
            ));
        }
    }
    plan
}

/// All-gather of `block` bytes per rank into an output of `size` blocks, whose own block
/// the caller has already filled.
pub(crate) fn all_gather(g: &Geometry, block: usize) -> Plan {
    let blocks: Vec<Range<usize>> = (0..g.size).map(|b| b * block..(b + 1) * block).collect();
    all_gather_v(g, &blocks)
}

/// All-gather of blocks of any lengths: rank b's block is the byte range `blocks[b]` of the
/// output (its own filled by the caller). Each lane carries its slice of every block.
pub(crate) fn all_gather_v(g: &Geometry, blocks: &[Range<usize>]) -> Plan {
    let n = g.size;
    let largest = blocks.iter().map(Range::len).max().unwrap_or(0);
    let lanes = select::lanes(largest, largest, n, g.wires);
    let mut plan = collective_plan(g);
    for dir in 0..lanes.dirs {
        for w in 0..lanes.wires {
            let (tx, rx, d) = g.lane_channels(dir, w);
            let lane = dir * lanes.wires + w;
            let span = |b: usize| {
                let slice = lane_slice(blocks[b].len(), lanes.count(), lane);
                Span::output(blocks[b].start + slice.start, slice.len())
            };
            let steps = (0..n as isize - 1)
                .map(|t| Step::copy(span(g.block(-d * t)), span(g.block(-d * (t + 1)))))
                .collect();
            plan.transfers.push(Transfer::new(
                Some(tx),
                Some(rx),
                steps,
                frame_bytes(lane_slice(largest, lanes.count(), lane).len()),
            ));
        }
    }
    plan
}

/// Reduce-scatter of an input of `size` blocks of `count` elements into this rank's block. The
/// output is the accumulator: each lane's partial sums pass through its slice of it.
pub(crate) fn reduce_scatter(g: &Geometry, count: usize, elem: usize) -> Plan {
    let n = g.size;
    let lanes = select::lanes(count * elem, count, n, g.wires);
    let block_bytes = count * elem;
    let mut plan = collective_plan(g);
    for dir in 0..lanes.dirs {
        for w in 0..lanes.wires {
            let (tx, rx, d) = g.lane_channels(dir, w);
            let slice = lane_slice(count, lanes.count(), dir * lanes.wires + w);
            let (off, len) = (slice.start * elem, slice.len() * elem);
            let input_of = |b: usize| b * block_bytes + off;
            let steps = (0..n as isize - 1)
                .map(|s| Step {
                    send: if s == 0 {
                        Span::input(input_of(g.block(-d)), len)
                    } else {
                        Span::output(off, len)
                    },
                    recv: Span::output(off, len),
                    merge: Merge::Reduce {
                        own: Some(input_of(g.block(-d * (s + 2)))),
                    },
                })
                .collect();
            plan.transfers.push(Transfer {
                tx: Some(tx),
                rx: Some(rx),
                steps,
                frame: frame_bytes(len),
                merge_after_send: true,
            });
        }
    }
    plan
}

/// This call's header swapped with both ring neighbours, nothing else: so that a neighbour
/// that called something else is named before a call waits on links made on first use.
pub(crate) fn neighbour_headers(g: &Geometry) -> Plan {
    Plan {
        headers_both_ways: vec![g.left_channel(0), g.right_channel(0)],
        ..Plan::default()
    }
}

/// Whole blocks forwarded in both directions at once, for small messages: after step `s` a
/// rank holds the blocks of the `s + 1` nearest ranks on each side, so ⌈(n − 1)/2⌉ steps
/// (instead of the ring's n − 1, or 2(n − 1) for an all-reduce) gather all. The output holds
/// `size` blocks of `block` bytes, this rank's filled by the caller.
pub(crate) fn gather_both_ways(g: &Geometry, block: usize) -> Plan {
    let n = g.size;
    let steps = [(n - 1).div_ceil(2), (n - 1) / 2];
    let transfers = (0..2)
        .filter(|&dir| steps[dir] > 0)
        .map(|dir| {
            let (tx, rx, d) = g.lane_channels(dir, 0);
            let span = |b: usize| Span::output(b * block, block);
            let steps = (0..steps[dir] as isize)
                .map(|s| Step::copy(span(g.block(-d * s)), span(g.block(-d * (s + 1)))))
                .collect();
            Transfer::new(Some(tx), Some(rx), steps, frame_bytes(block))
        })
        .collect();
    Plan {
        transfers,
        ..collective_plan(g)
    }
}

/// The plan of a small gather of `block` bytes per rank: in one step (the mesh, two ranks), or
/// both ways around the ring.
pub(crate) fn small_gather(g: &Geometry, how: SmallGather, block: usize) -> Plan {
    match how {
        SmallGather::Exchange => mesh::gather(g, block),
        SmallGather::BothWays => gather_both_ways(g, block),
    }
}

/// How far a rank is from `root` along direction `dir` (0: data moves right, rank r to r + 1;
/// 1: left): the number of hops data from the root takes to reach it that way.
fn distance(g: &Geometry, root: usize, dir: usize) -> usize {
    match dir {
        0 => (g.rank + g.size - root) % g.size,
        _ => (root + g.size - g.rank) % g.size,
    }
}

/// One lane of a chain: the bytes `span` (of the output) that travel from the root along
/// direction `dir` on wire `wire`, forwarded by each rank to the next, `reach` hops far.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChainLane {
    pub(crate) dir: usize,
    pub(crate) wire: usize,
    pub(crate) off: usize,
    pub(crate) len: usize,
    pub(crate) reach: usize,
}

/// The lanes of a broadcast of `bytes` from a root. Large messages: both directions on every
/// wire, each lane a slice of the data that goes all the way round (`size − 1` hops), so every
/// link carries half the data each way. Small ones, or `whole`: all of it each way, half the
/// ranks on each side (⌈(size − 1)/2⌉ hops), each direction's data cut over the wires of a
/// large message.
pub(crate) fn broadcast_lanes(g: &Geometry, bytes: usize, whole: bool) -> Vec<ChainLane> {
    let n = g.size;
    let lanes = select::lanes(bytes, bytes, 1, g.wires);
    if whole || lanes.dirs == 1 {
        let sides = [(0, (n - 1).div_ceil(2)), (1, (n - 1) / 2)];
        return sides
            .into_iter()
            .filter(|&(_, reach)| reach > 0)
            .flat_map(|(dir, reach)| {
                (0..lanes.wires).map(move |wire| {
                    let slice = lane_slice(bytes, lanes.wires, wire);
                    ChainLane {
                        dir,
                        wire,
                        off: slice.start,
                        len: slice.len(),
                        reach,
                    }
                })
            })
            .collect();
    }
    (0..lanes.count())
        .map(|l| {
            let slice = lane_slice(bytes, lanes.count(), l);
            ChainLane {
                dir: l / lanes.wires,
                wire: l % lanes.wires,
                off: slice.start,
                len: slice.len(),
                reach: n - 1,
            }
        })
        .collect()
}

/// Broadcast from `root` along `lanes`: the root sends each lane's span, every rank within
/// reach receives it into the same span of its output and, but the last, forwards it as it
/// arrives (a pipelined chain: forwarding works at byte granularity).
pub(crate) fn broadcast(g: &Geometry, root: usize, lanes: &[ChainLane]) -> Plan {
    let mut plan = chain_plan();
    for lane in lanes {
        let (tx, rx, _) = g.lane_channels(lane.dir, lane.wire);
        let span = Span::output(lane.off, lane.len);
        let k = distance(g, root, lane.dir);
        let receive = Step::copy(Span::EMPTY, span);
        let forward = Step::copy(span, Span::EMPTY);
        let (tx, rx, steps) = match k {
            0 => (Some(tx), None, vec![forward]),
            k if k < lane.reach => (Some(tx), Some(rx), vec![receive, forward]),
            k if k == lane.reach => (None, Some(rx), vec![receive]),
            _ => continue,
        };
        plan.transfers
            .push(Transfer::new(tx, rx, steps, frame_bytes(lane.len)));
    }
    plan
}

/// The ranks on each side of `root` that a gather collects through, or a scatter serves
/// through, in direction `dir`: the ⌈(size − 1)/2⌉ to its left send rightward to it (direction
/// 0), the rest leftward.
fn side_reach(n: usize, dir: usize) -> usize {
    match dir {
        0 => (n - 1).div_ceil(2),
        _ => (n - 1) / 2,
    }
}

/// The rank `k` hops from `root` against direction `dir` (where data comes from).
fn upstream(g: &Geometry, root: usize, dir: usize, k: usize) -> usize {
    match dir {
        0 => (root + g.size - k % g.size) % g.size,
        _ => (root + k) % g.size,
    }
}

/// One lane of a [`gather`] or [`scatter`]: a side of the root (direction `dir`, `reach`
/// ranks), this rank's distance `k` from the root on it, the lane's channels and its slice of
/// every block.
struct ChainSide {
    dir: usize,
    reach: usize,
    k: usize,
    tx: usize,
    rx: usize,
    slice: Range<usize>,
}

impl ChainSide {
    /// The lane's slice of the block at `buf_off` of `buf`.
    fn part(&self, buf_off: usize, buf: Buf) -> Span {
        Span {
            buf,
            off: buf_off + self.slice.start,
            len: self.slice.len(),
        }
    }

    fn transfer(&self, tx: bool, rx: bool, steps: Vec<Step>) -> Transfer {
        let frame = frame_bytes(self.slice.len());
        Transfer::new(tx.then_some(self.tx), rx.then_some(self.rx), steps, frame)
    }
}

/// This rank's distance from `root` on the side of direction `dir`: data moves towards the
/// root in a gather (direction `dir` sends on the channel that direction uses, so ranks to the
/// root's left, `dir` 0, send right) and away from it in a scatter.
fn chain_distance(g: &Geometry, root: usize, dir: usize, gathering: bool) -> usize {
    match gathering {
        true => distance(g, root, 1 - dir),
        false => distance(g, root, dir),
    }
}

/// The lanes of a gather or scatter of `block` bytes: both sides of the root that have ranks,
/// each wire of them.
fn chain_sides(g: &Geometry, root: usize, block: usize, gathering: bool) -> Vec<ChainSide> {
    let wires = select::lanes(block, block, 1, g.wires).wires;
    (0..2)
        .filter(|&dir| side_reach(g.size, dir) > 0)
        .flat_map(|dir| {
            (0..wires).map(move |w| {
                let (tx, rx, _) = g.lane_channels(dir, w);
                ChainSide {
                    dir,
                    reach: side_reach(g.size, dir),
                    k: chain_distance(g, root, dir, gathering),
                    tx,
                    rx,
                    slice: lane_slice(block, wires, w),
                }
            })
        })
        .collect()
}

/// Gather of `block` bytes from every rank to `root`, along the ring towards it from both
/// sides: a rank `k` hops away sends its own block, then forwards, as they arrive, the blocks
/// of the ranks behind it. On the root the output holds every rank's block at its rank's
/// place (its own filled by the caller); elsewhere the input is the rank's block and the
/// output a scratch of `reach − k` blocks for the ones it forwards. Each wire carries its
/// slice of every block.
pub(crate) fn gather(g: &Geometry, root: usize, block: usize) -> Plan {
    let mut plan = chain_plan();
    for side in chain_sides(g, root, block, true) {
        let (reach, k) = (side.reach, side.k);
        let transfer = if k == 0 {
            // The root receives the block of each rank 1..=reach hops away, nearest first.
            let steps = (1..=reach)
                .map(|j| {
                    let from = upstream(g, root, side.dir, j);
                    Step::copy(Span::EMPTY, side.part(from * block, Buf::Output))
                })
                .collect();
            side.transfer(false, true, steps)
        } else if k <= reach {
            // Send own block, then forward each block from behind as it arrives.
            let behind = reach - k;
            let steps = (0..=behind)
                .map(|j| {
                    let send = match j {
                        0 => side.part(0, Buf::Input),
                        j => side.part((j - 1) * block, Buf::Output),
                    };
                    let recv = match j < behind {
                        true => side.part(j * block, Buf::Output),
                        false => Span::EMPTY,
                    };
                    Step::copy(send, recv)
                })
                .collect();
            side.transfer(true, behind > 0, steps)
        } else {
            continue;
        };
        plan.transfers.push(transfer);
    }
    plan
}

/// Scatter of `block` bytes to every rank from `root`, the mirror of [`gather`]: the root
/// sends along each side the blocks of the ranks `reach`, `reach − 1`, …, 1 hops away,
/// farthest first; a rank `k` hops away forwards every block but the last, its own. On the
/// root the input holds every rank's block at its rank's place; elsewhere the output is a
/// scratch of `reach − k + 1` blocks, its own block last.
pub(crate) fn scatter(g: &Geometry, root: usize, block: usize) -> Plan {
    let n = g.size;
    let mut plan = chain_plan();
    for side in chain_sides(g, root, block, false) {
        let (reach, k) = (side.reach, side.k);
        // The ranks `dir` 0 serves are to the root's right.
        let downstream = |j: usize| match side.dir {
            0 => (root + j) % n,
            _ => (root + n - j) % n,
        };
        let transfer = if k == 0 {
            let steps = (0..reach)
                .map(|j| {
                    let to = downstream(reach - j);
                    Step::copy(side.part(to * block, Buf::Input), Span::EMPTY)
                })
                .collect();
            side.transfer(true, false, steps)
        } else if k <= reach {
            let blocks = reach - k + 1;
            let steps = (0..blocks)
                .map(|j| {
                    let send = match j {
                        0 => Span::EMPTY,
                        j => side.part((j - 1) * block, Buf::Output),
                    };
                    Step::copy(send, side.part(j * block, Buf::Output))
                })
                .collect();
            side.transfer(blocks > 1, true, steps)
        } else {
            continue;
        };
        plan.transfers.push(transfer);
    }
    plan
}

/// The blocks a rank `k` hops from the root holds in a [`gather`] or [`scatter`] scratch:
/// how many, in blocks (0 on the root).
pub(crate) fn chain_scratch_blocks(g: &Geometry, root: usize, gathering: bool) -> usize {
    (0..2)
        .filter_map(|dir| {
            let reach = side_reach(g.size, dir);
            let k = chain_distance(g, root, dir, gathering);
            (k > 0 && k <= reach).then(|| reach - k + usize::from(!gathering))
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::simulate::{all_gather_case, simulate};

    #[test]
    fn all_reduce_plan_sums_every_element_on_every_rank() {
        for size in 2..=5 {
            for wires in 1..=3 {
                for count in [1usize, 2, 3, 5, 16, 17, 64, 257, 10_000] {
                    for in_place in [false, true] {
                        let init = |r: usize| {
                            let v: Vec<i64> = (0..count).map(|i| (r * 1000 + i) as i64).collect();
                            if in_place {
                                (vec![], v)
                            } else {
                                (v, vec![0; count])
                            }
                        };
                        let outs = simulate(
                            size,
                            wires,
                            false,
                            |g| all_reduce(g, count, 1, in_place),
                            init,
                            true,
                        );
                        let expect: Vec<i64> = (0..count)
                            .map(|i| (0..size).map(|r| (r * 1000 + i) as i64).sum())
                            .collect();
                        for (r, out) in outs.iter().enumerate() {
                            assert_eq!(
                                out, &expect,
                                "size {size} wires {wires} count {count} in_place {in_place} rank {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn all_gather_plan_gathers_every_block() {
        for size in 2..=5 {
            for wires in 1..=3 {
                for block in [1usize, 3, 8, 100, 40_000] {
                    let init = |r: usize| {
                        let mut out = vec![-1i64; size * block];
                        for i in 0..block {
                            out[r * block + i] = (r * 100_000 + i) as i64;
                        }
                        (vec![], out)
                    };
                    let outs = simulate(size, wires, false, |g| all_gather(g, block), init, false);
                    let expect: Vec<i64> = (0..size)
                        .flat_map(|r| (0..block).map(move |i| (r * 100_000 + i) as i64))
                        .collect();
                    for out in &outs {
                        assert_eq!(out, &expect, "size {size} wires {wires} block {block}");
                    }
                }
            }
        }
    }

    #[test]
    fn reduce_scatter_plan_leaves_each_rank_its_block() {
        for size in 2..=5 {
            for wires in 1..=3 {
                for count in [1usize, 2, 7, 64, 20_000] {
                    let value = |r: usize, b: usize, i: usize| (r * 7 + b * 1000 + i) as i64;
                    let init = |r: usize| {
                        let input: Vec<i64> = (0..size)
                            .flat_map(|b| (0..count).map(move |i| value(r, b, i)))
                            .collect();
                        (input, vec![0; count])
                    };
                    let outs = simulate(
                        size,
                        wires,
                        false,
                        |g| reduce_scatter(g, count, 1),
                        init,
                        true,
                    );
                    for (r, out) in outs.iter().enumerate() {
                        let expect: Vec<i64> = (0..count)
                            .map(|i| (0..size).map(|q| value(q, r, i)).sum())
                            .collect();
                        assert_eq!(
                            out, &expect,
                            "size {size} wires {wires} count {count} rank {r}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn gathering_both_ways_delivers_every_block() {
        for size in 2..=8 {
            for block in [1usize, 5] {
                let (init, expect) = all_gather_case(size, block);
                for (mesh, wires) in [(false, 1), (true, 1), (true, 3)] {
                    let outs = simulate(
                        size,
                        wires,
                        mesh,
                        |g| gather_both_ways(g, block),
                        &init,
                        false,
                    );
                    for out in &outs {
                        assert_eq!(out, &expect, "size {size} block {block} mesh {mesh}");
                    }
                }
            }
        }
    }

    #[test]
    fn broadcast_plans_reach_every_rank_from_every_root() {
        for size in 2..=7 {
            for wires in 1..=3 {
                for (bytes, whole) in [1usize, 5, 100, 100_000]
                    .into_iter()
                    .flat_map(|b| [(b, false), (b, true)])
                {
                    for root in 0..size {
                        let value = |i: usize| (i * 7 + 3) as i64;
                        let init = |r: usize| {
                            let out = match r == root {
                                true => (0..bytes).map(value).collect(),
                                false => vec![-1; bytes],
                            };
                            (vec![], out)
                        };
                        let outs = simulate_chain(
                            size,
                            wires,
                            |g| broadcast(g, root, &broadcast_lanes(g, bytes, whole)),
                            init,
                        );
                        let expect: Vec<i64> = (0..bytes).map(value).collect();
                        for (r, out) in outs.iter().enumerate() {
                            assert_eq!(
                                out, &expect,
                                "size {size} wires {wires} bytes {bytes} whole {whole} root {root} rank {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn gather_and_scatter_chains_move_every_block() {
        for size in 2..=7 {
            for wires in 1..=3 {
                for block in [1usize, 3, 40_000] {
                    for root in 0..size {
                        let value = |r: usize, i: usize| (r * 100_000 + i) as i64;
                        // Gather: every rank's input is its block; the root's output all.
                        let outs = simulate_chain(
                            size,
                            wires,
                            |g| gather(g, root, block),
                            |r| {
                                let input: Vec<i64> = (0..block).map(|i| value(r, i)).collect();
                                let g = Geometry {
                                    rank: r,
                                    size,
                                    wires,
                                    mesh: false,
                                };
                                let out = match r == root {
                                    true => {
                                        let mut out = vec![-1; size * block];
                                        out[r * block..(r + 1) * block].copy_from_slice(&input);
                                        out
                                    }
                                    false => vec![-1; chain_scratch_blocks(&g, root, true) * block],
                                };
                                (input, out)
                            },
                        );
                        let expect: Vec<i64> = (0..size)
                            .flat_map(|r| (0..block).map(move |i| value(r, i)))
                            .collect();
                        assert_eq!(
                            outs[root], expect,
                            "gather size {size} wires {wires} block {block} root {root}"
                        );
                        // Scatter: the root's input is every block; each rank's own comes last.
                        let outs = simulate_chain(
                            size,
                            wires,
                            |g| scatter(g, root, block),
                            |r| {
                                let g = Geometry {
                                    rank: r,
                                    size,
                                    wires,
                                    mesh: false,
                                };
                                let input = match r == root {
                                    true => (0..size)
                                        .flat_map(|q| (0..block).map(move |i| value(q, i)))
                                        .collect(),
                                    false => vec![],
                                };
                                (
                                    input,
                                    vec![-1; chain_scratch_blocks(&g, root, false) * block],
                                )
                            },
                        );
                        for (r, out) in outs.iter().enumerate().filter(|(r, _)| *r != root) {
                            let own = &out[out.len() - block..];
                            let expect: Vec<i64> = (0..block).map(|i| value(r, i)).collect();
                            assert_eq!(
                                own, expect,
                                "scatter size {size} wires {wires} block {block} root {root} rank {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// [`simulate`] for plans whose steps depend on the rank (chains): steps run in lockstep
    /// by step index, which the chains' one-step-per-hop forwarding allows.
    fn simulate_chain(
        size: usize,
        wires: usize,
        plan_of: impl Fn(&Geometry) -> Plan,
        init: impl Fn(usize) -> (Vec<i64>, Vec<i64>),
    ) -> Vec<Vec<i64>> {
        crate::algo::simulate::simulate_by_rounds(size, wires, false, plan_of, init)
    }
}
