//! The ring family: data moves between ring neighbours only, a block per step, on every lane
//! at once ([`super::geometry`]). All-reduce is a reduce-scatter then an all-gather; small
//! messages instead gather whole blocks both ways. See docs/algorithms.md for the steps and the
//! bytes on the wire.

use super::geometry::{Geometry, frame_bytes, lane_slice};
use super::plan::{Merge, Plan, Span, Step, Transfer};
use super::select;

/// An empty plan for a collective: headers go both ways to both neighbours on wire 0, so that
/// a neighbour that called something else notices.
pub(crate) fn collective_plan(g: &Geometry) -> Plan {
    Plan {
        transfers: Vec::new(),
        headers_both_ways: vec![g.left_channel(0), g.right_channel(0)],
        ..Plan::default()
    }
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
                steps.push(Step {
                    send: Span::output(send_off, send_len),
                    recv: Span::output(recv_off, recv_len),
                    merge: Merge::Copy,
                });
            }
            plan.transfers.push(Transfer {
                tx: Some(tx),
                rx: Some(rx),
                steps,
                frame: frame_bytes(slice.len() * elem),
                merge_after_send: false,
            });
        }
    }
    plan
}

/// All-gather of `block` bytes per rank into an output of `size` blocks, whose own block the
/// caller has already filled.
pub(crate) fn all_gather(g: &Geometry, block: usize) -> Plan {
    let n = g.size;
    let lanes = select::lanes(block, block, n, g.wires);
    let mut plan = collective_plan(g);
    for dir in 0..lanes.dirs {
        for w in 0..lanes.wires {
            let (tx, rx, d) = g.lane_channels(dir, w);
            let slice = lane_slice(block, lanes.count(), dir * lanes.wires + w);
            let span = |b: usize| Span::output(b * block + slice.start, slice.len());
            let steps = (0..n as isize - 1)
                .map(|t| Step {
                    send: span(g.block(-d * t)),
                    recv: span(g.block(-d * (t + 1))),
                    merge: Merge::Copy,
                })
                .collect();
            plan.transfers.push(Transfer {
                tx: Some(tx),
                rx: Some(rx),
                steps,
                frame: frame_bytes(slice.len()),
                merge_after_send: false,
            });
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
            Transfer {
                tx: Some(tx),
                rx: Some(rx),
                steps: (0..steps[dir] as isize)
                    .map(|s| Step {
                        send: span(g.block(-d * s)),
                        recv: span(g.block(-d * (s + 1))),
                        merge: Merge::Copy,
                    })
                    .collect(),
                frame: frame_bytes(block),
                merge_after_send: false,
            }
        })
        .collect();
    Plan {
        transfers,
        ..collective_plan(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::simulate::simulate;

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
                for (mesh, wires) in [(false, 1), (true, 1), (true, 3)] {
                    let outs = simulate(
                        size,
                        wires,
                        mesh,
                        |g| gather_both_ways(g, block),
                        init,
                        false,
                    );
                    for out in &outs {
                        assert_eq!(out, &expect, "size {size} block {block} mesh {mesh}");
                    }
                }
            }
        }
    }
}
