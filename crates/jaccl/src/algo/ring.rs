//! The ring: every rank talks to its left and right neighbour over `wires` parallel channels;
//! with the mesh, also to every other rank over one channel each.
//!
//! Data is cut into lanes, one per (direction, wire): direction 0 moves data to the right
//! (rank r sends to r + 1 and receives from r − 1), direction 1 to the left. Within every block
//! (a chunk of the all-reduce, a rank's block of the all-gather or reduce-scatter), lane
//! `l = dir · wires + wire` owns the `l`-th of `dirs · wires` equal slices. Messages too small
//! to split use one direction on one wire. See docs/algorithms.md for the steps and the bytes on
//! the wire.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use super::engine::{self, Buffers, Call, Channel};
use super::{Merge, Plan, Span, Step, Transfer};
use crate::error::{Error, Result};
use crate::liveness::Liveness;
use crate::reduce::{Reducer, copy};

/// Messages up to this many bytes use one direction on one wire (as upstream).
const SMALL_MESSAGE: usize = 32 * 1024;
/// All-reduce and all-gather gather whole blocks both ways while `size × block` is at most
/// this: fewer hops beat fewer bytes up to there (measured on loopback at 2, 4 and 8 ranks:
/// e.g. 64 KiB at 4 ranks took 290-350 µs gathered, 490 µs by the ring).
const GATHER_LIMIT: usize = 512 * 1024;
/// With the mesh, collectives whose vectors together are at most this many bytes take one step
/// to every rank; larger ones go around the ring. Measured with 1 ms per packet on loopback
/// (../shared/rdma-vm): one step won up to 4 KiB per rank at 4 and at 8 ranks, and lost or tied
/// at 32 KiB, where sending every vector `size − 1` times costs more than the ring's hops.
const MESH_LIMIT: usize = 64 * 1024;
/// All-reduces up to this many bytes per rank (over TCP and shared memory; [`DOUBLING_MAX_RDMA`]
/// with RDMA) use recursive doubling where the ranks pair up ([`Geometry::doubling_partners`])
/// and the mesh does not take them in one step: log2(size) steps, each swapping the whole
/// partial result with one rank, so fewer hops than the ring, fewer bytes than the gather and,
/// with 4 ranks, fewer messages than either (2 per rank against the gather's 3). Measured on
/// loopback (4 ranks on the ring, 8 with the mesh): doubling beats the gather at every size
/// (4 ranks, 8 B: 28-34 µs against 48-56; 64 KiB: 110-168 against 164-352) and the ring up to
/// 448 KiB (256 KiB: 293-529 µs against the ring's 415-602).
const DOUBLING_MAX: usize = 384 * 1024;
/// The limit when ring neighbours use RDMA, where the bytes cost more against the hops: with
/// Soft-RoCE in ../shared/rdma-vm (4 ranks), doubling took 13.1-14.6 ms against the gather's
/// 21.4-24.3 ms at 128 KiB, but 20.3-22.5 ms against the ring's 16.8-18.1 ms at 192 KiB.
const DOUBLING_MAX_RDMA: usize = 128 * 1024;
/// Two ranks reduce-scatter up to this many bytes of input in one swap
/// ([`Geometry::doubling_partners`]); larger inputs take the ring's one step, which splits the
/// data over both connections and reduces it as it arrives. Measured on loopback
/// (`jaccl bench -n 2 --op reduce-scatter`, medians): 8 B 11.7 µs against the ring's 18.8,
/// 128 KiB 46 against 60, 192 KiB 93 against 96, 256 KiB 132 against 78.
const PAIR_HALVING_MAX: usize = 192 * 1024;
/// The longest a rank that failed a recursive-doubling step with a `Mismatch` spends telling
/// the partners of the later steps (their links have room for a header, so it takes no wait).
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(1);
/// Frames are `MIN_FRAME << k` bytes, k = 0..=7 (4 KiB to 512 KiB).
const MIN_FRAME: usize = 4096;
const MAX_FRAME: usize = MIN_FRAME << 7;

/// How many directions and wires a message uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lanes {
    pub(crate) dirs: usize,
    pub(crate) wires: usize,
}

impl Lanes {
    /// Both directions on every wire, unless the message is too small to split: then one
    /// direction on one wire. `units` is the number of indivisible units (elements).
    pub(crate) fn for_message(bytes: usize, units: usize, ranks: usize, wires: usize) -> Lanes {
        if bytes <= SMALL_MESSAGE || units < ranks * 2 * wires {
            Lanes { dirs: 1, wires: 1 }
        } else {
            Lanes { dirs: 2, wires }
        }
    }

    fn count(self) -> usize {
        self.dirs * self.wires
    }
}

/// The units of a `block`-unit block that lane `lane` of `lanes` owns.
pub(crate) fn lane_slice(block: usize, lanes: usize, lane: usize) -> Range<usize> {
    let per_lane = block.div_ceil(lanes.max(1));
    let start = (lane * per_lane).min(block);
    start..(start + per_lane).min(block)
}

/// The frame for a lane moving `bytes` per step: 4 KiB × 2^k, at most half the step and at
/// most 512 KiB. On TCP a frame is the most handed to the kernel in one call: large writes
/// measured clearly faster than 32 KiB ones, and forwarding between steps works at byte
/// granularity anyway, so frames need not be small for steps to overlap.
pub(crate) fn frame_bytes(bytes: usize) -> usize {
    let mut frame = MIN_FRAME;
    while frame < MAX_FRAME && frame * 2 <= bytes / 2 {
        frame *= 2;
    }
    frame
}

/// `(rank + delta) mod size` for any signed delta.
fn ring_index(rank: usize, delta: isize, size: usize) -> usize {
    let size_i = size as isize;
    ((rank as isize + delta).rem_euclid(size_i)) as usize
}

/// The ring's geometry: which channel index is which wire to which peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) wires: usize,
    /// The mesh: one more channel to every rank that is not a ring neighbour (after the ring's
    /// channels, in rank order), so small collectives take one step and any pair may
    /// send and receive.
    pub(crate) mesh: bool,
}

impl Geometry {
    pub(crate) fn left(&self) -> usize {
        ring_index(self.rank, -1, self.size)
    }

    pub(crate) fn right(&self) -> usize {
        ring_index(self.rank, 1, self.size)
    }

    /// The ranks that are neither this one nor a ring neighbour, in rank order: with the mesh,
    /// each has one channel of its own.
    pub(crate) fn non_neighbours(&self) -> impl Iterator<Item = usize> + use<> {
        let (rank, left, right) = (self.rank, self.left(), self.right());
        (0..self.size).filter(move |&p| p != rank && p != left && p != right)
    }

    /// Whether this rank has a channel to `peer`: a ring neighbour, or any rank with the mesh.
    pub(crate) fn reaches(&self, peer: usize) -> bool {
        peer != self.rank
            && peer < self.size
            && (self.mesh || peer == self.left() || peer == self.right())
    }

    /// The channel for talking to `peer` on wire `w` (a mesh channel has wire 0 only), both
    /// ways. With two ranks both neighbours are the same rank: both then use the connections
    /// rank 0 opened (its right channels, rank 1's left ones), so that each side's data carries
    /// the acknowledgement of the other's (a one-way connection each way costs a bare ACK per
    /// message: 9.5 µs against 5.2–6.6 µs per 8-byte exchange in C on loopback).
    fn channel_to(&self, peer: usize, w: usize) -> usize {
        match peer {
            _ if self.size == 2 && self.rank == 0 => self.right_channel(w),
            _ if self.size == 2 => self.left_channel(w),
            p if p == self.left() => self.left_channel(w),
            p if p == self.right() => self.right_channel(w),
            _ => 2 * self.wires + self.non_neighbours().take_while(|&p| p < peer).count(),
        }
    }

    /// Wires for a message of `bytes` to or from `peer`: split over the ring's wires to a
    /// neighbour, one wire to another rank of the mesh.
    fn wires_to(&self, bytes: usize, peer: usize) -> usize {
        if peer == self.left() || peer == self.right() {
            Lanes::for_message(bytes, bytes, 1, self.wires).wires
        } else {
            1
        }
    }

    /// The peer at the other end of channel `c`, and that peer's index for the same channel.
    #[cfg(test)]
    pub(crate) fn far_end(&self, c: usize) -> (usize, usize) {
        let w = self.wires;
        if c < w {
            (self.left(), c + w)
        } else if c < 2 * w {
            (self.right(), c - w)
        } else {
            let peer = self
                .non_neighbours()
                .nth(c - 2 * w)
                .expect("a mesh channel");
            let theirs = Geometry {
                rank: peer,
                ..*self
            };
            (peer, theirs.channel_to(self.rank, 0))
        }
    }

    /// Channel index of wire `w` to the left neighbour (the one it opened to us).
    fn left_channel(&self, w: usize) -> usize {
        w
    }

    /// Channel index of wire `w` to the right neighbour (the one we opened).
    fn right_channel(&self, w: usize) -> usize {
        self.wires + w
    }

    /// `(send channel, receive channel, step direction)` of direction `dir` on wire `w`:
    /// direction 0 sends right and receives from the left, so block indices step by −1.
    fn lane_channels(&self, dir: usize, w: usize) -> (usize, usize, isize) {
        if dir == 0 {
            (self.right_channel(w), self.left_channel(w), 1)
        } else {
            (self.left_channel(w), self.right_channel(w), -1)
        }
    }

    fn block(&self, delta: isize) -> usize {
        ring_index(self.rank, delta, self.size)
    }

    /// All-reduce of `count` elements of `elem` bytes: reduce-scatter over `size` chunks, then
    /// all-gather. Rank r ends the reduce-scatter holding chunk r + 1 (direction 0) or r − 1
    /// (direction 1) fully reduced.
    pub(crate) fn all_reduce(&self, count: usize, elem: usize, in_place: bool) -> Plan {
        let n = self.size;
        let lanes = Lanes::for_message(count * elem, count, n, self.wires);
        let chunk = count.div_ceil(n);
        let mut plan = self.collective_plan();
        for dir in 0..lanes.dirs {
            for w in 0..lanes.wires {
                let (tx, rx, d) = self.lane_channels(dir, w);
                let slice = lane_slice(chunk, lanes.count(), dir * lanes.wires + w);
                // Byte span of this lane's slice of chunk c (chunks near the end may be short).
                let span = |c: usize| {
                    let start = (c * chunk + slice.start).min(count);
                    let end = (c * chunk + slice.end).min(count);
                    (start * elem, (end - start) * elem)
                };
                let mut steps = Vec::with_capacity(2 * (n - 1));
                for s in 0..n as isize - 1 {
                    let (send_off, send_len) = span(self.block(-d * s));
                    let (recv_off, recv_len) = span(self.block(-d * (s + 1)));
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
                    let (send_off, send_len) = span(self.block(d * (1 - t)));
                    let (recv_off, recv_len) = span(self.block(-d * t));
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

    /// All-gather of `block` bytes per rank into an output of `size` blocks, whose own block
    /// the caller has already filled.
    pub(crate) fn all_gather(&self, block: usize) -> Plan {
        let n = self.size;
        let lanes = Lanes::for_message(block, block, n, self.wires);
        let mut plan = self.collective_plan();
        for dir in 0..lanes.dirs {
            for w in 0..lanes.wires {
                let (tx, rx, d) = self.lane_channels(dir, w);
                let slice = lane_slice(block, lanes.count(), dir * lanes.wires + w);
                let span = |b: usize| Span::output(b * block + slice.start, slice.len());
                let steps = (0..n as isize - 1)
                    .map(|t| Step {
                        send: span(self.block(-d * t)),
                        recv: span(self.block(-d * (t + 1))),
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

    /// Reduce-scatter of an input of `size` blocks of `count` elements into this rank's block.
    /// The output is the accumulator: each lane's partial sums pass through its slice of it.
    pub(crate) fn reduce_scatter(&self, count: usize, elem: usize) -> Plan {
        let n = self.size;
        let lanes = Lanes::for_message(count * elem, count, n, self.wires);
        let block_bytes = count * elem;
        let mut plan = self.collective_plan();
        for dir in 0..lanes.dirs {
            for w in 0..lanes.wires {
                let (tx, rx, d) = self.lane_channels(dir, w);
                let slice = lane_slice(count, lanes.count(), dir * lanes.wires + w);
                let (off, len) = (slice.start * elem, slice.len() * elem);
                let input_of = |b: usize| b * block_bytes + off;
                let steps = (0..n as isize - 1)
                    .map(|s| Step {
                        send: if s == 0 {
                            Span::input(input_of(self.block(-d)), len)
                        } else {
                            Span::output(off, len)
                        },
                        recv: Span::output(off, len),
                        merge: Merge::Reduce {
                            own: Some(input_of(self.block(-d * (s + 2)))),
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

    /// Send of `bytes` to `dst`: a neighbour, split across wires, or (with the mesh) any rank.
    pub(crate) fn send(&self, bytes: usize, dst: usize) -> Plan {
        let wires = self.wires_to(bytes, dst);
        self.one_way(bytes, wires, |w| self.channel_to(dst, w), true)
    }

    /// Receive of `bytes` from `src`, the mirror of [`Geometry::send`].
    pub(crate) fn recv(&self, bytes: usize, src: usize) -> Plan {
        let wires = self.wires_to(bytes, src);
        self.one_way(bytes, wires, |w| self.channel_to(src, w), false)
    }

    fn one_way(
        &self,
        bytes: usize,
        wires: usize,
        channel: impl Fn(usize) -> usize,
        sending: bool,
    ) -> Plan {
        let transfers = (0..wires)
            .map(|w| {
                let slice = lane_slice(bytes, wires, w);
                let (off, len) = (slice.start, slice.len());
                Transfer {
                    tx: sending.then(|| channel(w)),
                    rx: (!sending).then(|| channel(w)),
                    steps: vec![Step {
                        send: if sending {
                            Span::input(off, len)
                        } else {
                            Span::EMPTY
                        },
                        recv: if sending {
                            Span::EMPTY
                        } else {
                            Span::output(off, len)
                        },
                        merge: Merge::Copy,
                    }],
                    frame: frame_bytes(len),
                    merge_after_send: false,
                }
            })
            .collect();
        Plan {
            transfers,
            ..Plan::default()
        }
    }

    /// Whole blocks forwarded in both directions at once, for small messages: after step `s`
    /// a rank holds the blocks of the `s + 1` nearest ranks on each side, so ⌈(n − 1)/2⌉
    /// steps (instead of the ring's n − 1, or 2(n − 1) for an all-reduce) gather all. The
    /// output holds `size` blocks of `block` bytes, this rank's filled by the caller.
    pub(crate) fn gather_both_ways(&self, block: usize) -> Plan {
        let n = self.size;
        let steps = [(n - 1).div_ceil(2), (n - 1) / 2];
        let transfers = (0..2)
            .filter(|&dir| steps[dir] > 0)
            .map(|dir| {
                let (tx, rx, d) = self.lane_channels(dir, 0);
                let span = |b: usize| Span::output(b * block, block);
                Transfer {
                    tx: Some(tx),
                    rx: Some(rx),
                    steps: (0..steps[dir] as isize)
                        .map(|s| Step {
                            send: span(self.block(-d * s)),
                            recv: span(self.block(-d * (s + 1))),
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
            ..self.collective_plan()
        }
    }

    /// Every rank sends `send(p)` straight to every other rank p and receives p's into block
    /// p of the output (`block` bytes each): one step, the mesh's small collectives. The mesh
    /// channels carry it, and the ring's wire 0 to the neighbours.
    pub(crate) fn exchange_with_all(&self, block: usize, send: impl Fn(usize) -> Span) -> Plan {
        let transfers = (0..self.size)
            .filter(|&p| p != self.rank)
            .map(|p| {
                let channel = self.channel_to(p, 0);
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

    /// Whether a collective whose vectors together take `total` bytes goes to every rank in
    /// one step. Two ranks instead swap their vectors ([`Geometry::doubling_partners`]): the
    /// same messages, without copying both vectors into one buffer first.
    fn in_one_step(&self, total: usize) -> bool {
        self.mesh && self.size > 2 && total <= MESH_LIMIT
    }

    /// The partner of each step of a recursive-doubling all-reduce, in step order, if the ranks
    /// can pair up: two ranks (one step), 4 ranks on the ring (first the rank in the same pair,
    /// 0-1 and 2-3, then the other neighbour, 0-3 and 1-2), or a power of two of ranks with the
    /// mesh (in step k
    /// the rank whose index differs in bit k). In every step the lower rank of a pair holds the
    /// partial result of the lower ranks, so "lower rank's value first" is one order for every
    /// rank. Partnership is mutual: this rank's partner in step k has this rank as its own.
    pub(crate) fn doubling_partners(&self) -> Option<Vec<usize>> {
        let (r, n) = (self.rank, self.size);
        if n == 2 {
            Some(vec![1 - r])
        } else if n == 4 {
            Some(vec![r ^ 1, 3 - r])
        } else if self.mesh && n > 4 && n.is_power_of_two() {
            Some((0..n.trailing_zeros()).map(|k| r ^ (1 << k)).collect())
        } else {
            None
        }
    }

    /// Step `k` of recursive doubling with `partners` (in step order): this rank sends `send`
    /// to `partners[k]` and receives as many bytes from it into `recv`, split over the ring's
    /// wires to a neighbour. The first step also exchanges headers with each ring
    /// neighbour that is no step's partner, so every neighbour of a rank that called
    /// something else notices; a partner gets the header with its step's data (or alone,
    /// [`Plan::announcement`], when this rank fails before), which saves a message per rank
    /// and call (with 4 ranks on the ring, a third of them).
    pub(crate) fn swap_with(&self, partners: &[usize], k: usize, send: Span, recv: Span) -> Plan {
        let peer = partners[k];
        let wires = self.wires_to(send.len, peer);
        let transfers = (0..wires)
            .map(|w| {
                let channel = self.channel_to(peer, w);
                let slice = lane_slice(send.len, wires, w);
                let part = |span: Span| Span {
                    off: span.off + slice.start,
                    len: slice.len(),
                    ..span
                };
                Transfer {
                    tx: Some(channel),
                    rx: Some(channel),
                    steps: vec![Step {
                        send: part(send),
                        recv: part(recv),
                        merge: Merge::Copy,
                    }],
                    frame: frame_bytes(slice.len()),
                    merge_after_send: false,
                }
            })
            .collect();
        let headers_both_ways = match k {
            0 => [
                (self.left(), self.left_channel(0)),
                (self.right(), self.right_channel(0)),
            ]
            .into_iter()
            .filter(|(neighbour, _)| !partners.contains(neighbour))
            .map(|(_, channel)| channel)
            .collect(),
            _ => Vec::new(),
        };
        Plan {
            transfers,
            headers_both_ways,
            ..Plan::default()
        }
    }

    /// Gathers every rank's block of `block` bytes into an output of `size` blocks whose own
    /// block the caller has filled: straight from every rank with the mesh (up to
    /// [`MESH_LIMIT`]) and between two ranks (one step either way, and the exchange uses one
    /// connection both ways; only empty messages, as two ranks otherwise swap), else whole
    /// blocks both ways around the ring.
    pub(crate) fn gather_small(&self, block: usize) -> Plan {
        if self.size <= 2 || self.in_one_step(block * self.size) {
            let own = Span::output(self.rank * block, block);
            self.exchange_with_all(block, |_| own)
        } else {
            self.gather_both_ways(block)
        }
    }

    /// An empty plan for a collective: headers go both ways to both neighbours on wire 0.
    fn collective_plan(&self) -> Plan {
        Plan {
            transfers: Vec::new(),
            headers_both_ways: vec![self.left_channel(0), self.right_channel(0)],
            ..Plan::default()
        }
    }
}

/// A ring's channels: `channels[w]` is wire w to the left neighbour, `channels[wires + w]` wire
/// w to the right one, then with the mesh one channel to each other rank (in rank order). Runs
/// each collective with the plan that suits its size.
pub(crate) struct Ring {
    pub(crate) geometry: Geometry,
    channels: Vec<Channel>,
    liveness: Arc<Liveness>,
    /// Reused buffer of the small-message algorithms (`u128` for alignment).
    scratch: Vec<u128>,
    /// The largest all-reduce (bytes per rank) that takes recursive doubling.
    doubling_max: usize,
}

impl Ring {
    /// The connections, for the direct collectives to watch (see [`crate::algo::direct`]).
    pub(crate) fn channels_mut(&mut self) -> &mut [Channel] {
        &mut self.channels
    }

    /// Lets every connection tell when its peer has entered a direct collective this rank has
    /// not (so a send or receive waiting on it fails with `Mismatch`).
    pub(crate) fn watch_direct(&mut self, direct: &super::direct::Direct) {
        for ch in &mut self.channels {
            ch.watch(direct.progress_of(ch.peer()));
        }
    }

    /// `mesh` holds the channels to [`Geometry::non_neighbours`] (empty without the mesh);
    /// `rdma` says whether any pair of ring neighbours in the group uses RDMA (which moves the
    /// algorithms' crossovers). Every rank must pass the same, so that all choose alike.
    pub(crate) fn new(
        geometry: Geometry,
        left: Vec<Channel>,
        right: Vec<Channel>,
        mesh: Vec<Channel>,
        liveness: Arc<Liveness>,
        rdma: bool,
    ) -> Ring {
        let mut channels = left;
        channels.extend(right);
        channels.extend(mesh);
        Ring {
            geometry,
            channels,
            liveness,
            scratch: Vec::new(),
            doubling_max: if rdma {
                DOUBLING_MAX_RDMA
            } else {
                DOUBLING_MAX
            },
        }
    }

    /// All-reduce of `output.len()` bytes: `input` into `output`, or in place when `input` is
    /// `None`. Messages up to [`DOUBLING_MAX`] (or [`DOUBLING_MAX_RDMA`]) use recursive
    /// doubling where the ranks pair up;
    /// other small messages (all vectors together at most [`GATHER_LIMIT`]) gather every
    /// rank's vector ([`Geometry::gather_small`]) and reduce them locally in rank order; large
    /// ones use the ring's reduce-scatter + all-gather. Each way reduces every element in one
    /// fixed order, so every rank gets the same bits.
    pub(crate) fn all_reduce(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        let bytes = output.len();
        // An empty all-reduce only exchanges headers: the gather's one step does that.
        let doubling = !g.in_one_step(bytes * g.size) && (1..=self.doubling_max).contains(&bytes);
        if let Some(partners) = g.doubling_partners().filter(|_| doubling) {
            return self.all_reduce_by_doubling(input, output, reducer, call, &partners);
        }
        if bytes * g.size > GATHER_LIMIT {
            let plan = g.all_reduce(
                bytes / reducer.elem_size(),
                reducer.elem_size(),
                input.is_none(),
            );
            return engine::run(
                &mut self.channels,
                &self.liveness,
                &plan,
                Buffers { input, output },
                Some(reducer),
                call,
            );
        }
        let all = scratch(&mut self.scratch, g.size * bytes);
        copy(
            &mut all[g.rank * bytes..(g.rank + 1) * bytes],
            input.unwrap_or(output),
        );
        let plan = g.gather_small(bytes);
        engine::run(
            &mut self.channels,
            &self.liveness,
            &plan,
            Buffers {
                input: None,
                output: all,
            },
            None,
            call,
        )?;
        fold_in_rank_order(output, all, reducer);
        Ok(())
    }

    /// All-reduce by recursive doubling: in each step this rank swaps its partial result with
    /// that step's partner and combines the two, the lower rank's first, so every rank computes
    /// every element in one order and gets the same bits. The first step sends the caller's
    /// vector; scratch vectors hold the partner's vector and, with more than one step, the
    /// partial result and, with more than two, the next one.
    fn all_reduce_by_doubling(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
        partners: &[usize],
    ) -> Result<()> {
        let g = self.geometry;
        let bytes = output.len();
        let (whole_input, whole_output) = (Span::input(0, bytes), Span::output(0, bytes));
        let plans: Vec<Plan> = (0..partners.len())
            .map(|k| g.swap_with(partners, k, whole_input, whole_output))
            .collect();
        let vectors = partners.len().min(3);
        let all = scratch(&mut self.scratch, vectors * bytes);
        let (theirs, rest) = all.split_at_mut(bytes);
        // Two steps need no `next`, one step no `partial` either: they are then empty.
        let (mut partial, mut next) = rest.split_at_mut(bytes.min(rest.len()));
        let mut swap = Swap {
            steps: DoublingSteps {
                channels: &mut self.channels,
                liveness: &self.liveness,
                plans: &plans,
                call,
            },
            rank: g.rank,
            partners,
            theirs,
            reducer,
        };
        let last = partners.len() - 1;
        if last == 0 {
            return match input {
                Some(input) => swap.step(0, input, output),
                None => swap.step_in_place(0, output),
            };
        }
        swap.step(0, input.unwrap_or(output), partial)?;
        for k in 1..last {
            swap.step(k, partial, next)?;
            std::mem::swap(&mut partial, &mut next);
        }
        swap.step(last, partial, output)
    }

    /// All-gather of `input` into `output` (`size` blocks).
    pub(crate) fn all_gather(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        let block = input.len();
        copy(&mut output[g.rank * block..(g.rank + 1) * block], input);
        gather(g, &mut self.channels, &self.liveness, output, block, call)
    }

    /// Reduce-scatter of `input` (`size` blocks of `output.len()` bytes) into `output`. With
    /// the mesh, small messages (up to [`MESH_LIMIT`]) send each block straight to its rank,
    /// which reduces them in rank order; other small ones (up to [`GATHER_LIMIT`] in all, or
    /// [`PAIR_HALVING_MAX`] with two ranks) use recursive halving where the ranks pair up; the
    /// rest go around the ring.
    pub(crate) fn reduce_scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        let bytes = output.len();
        if g.in_one_step(bytes * g.size) {
            let all = scratch(&mut self.scratch, g.size * bytes);
            let own = g.rank * bytes..(g.rank + 1) * bytes;
            copy(&mut all[own.clone()], &input[own]);
            let plan = g.exchange_with_all(bytes, |p| Span::input(p * bytes, bytes));
            let bufs = Buffers {
                input: Some(input),
                output: all,
            };
            engine::run(&mut self.channels, &self.liveness, &plan, bufs, None, call)?;
            fold_in_rank_order(output, all, reducer);
            return Ok(());
        }
        let limit = match g.size {
            2 => PAIR_HALVING_MAX,
            _ => GATHER_LIMIT,
        };
        let halving = bytes > 0 && bytes * g.size <= limit;
        if let Some(partners) = g.doubling_partners().filter(|_| halving) {
            return self.reduce_scatter_by_halving(input, output, reducer, call, &partners);
        }
        let elem = reducer.elem_size();
        let plan = self.geometry.reduce_scatter(output.len() / elem, elem);
        let bufs = Buffers {
            input: Some(input),
            output,
        };
        engine::run(
            &mut self.channels,
            &self.liveness,
            &plan,
            bufs,
            Some(reducer),
            call,
        )
    }

    /// Reduce-scatter by recursive halving, the doubling partners in reverse order: before
    /// the step with partner `partners[k]` this rank holds partial sums of the aligned group
    /// of 2^(k+1) blocks around its own; it sends the partner the half around the partner's
    /// block and reduces the half around its own with what the partner sends. `log2 size`
    /// messages per rank (2 at 4 ranks, against the ring's 3 hops), the ring's bytes. Each
    /// block is reduced on one rank only, so no other rank's bits need to agree with it.
    fn reduce_scatter_by_halving(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
        partners: &[usize],
    ) -> Result<()> {
        let g = self.geometry;
        let bytes = output.len();
        let group = |r: usize, k: usize| {
            let blocks = aligned_blocks(r, k);
            blocks.start * bytes..blocks.end * bytes
        };
        let order: Vec<usize> = (0..partners.len()).rev().collect();
        let plans: Vec<Plan> = order
            .iter()
            .map(|&k| {
                let (theirs, mine) = (group(partners[k], k), group(g.rank, k));
                let send = Span::input(theirs.start, theirs.len());
                g.swap_with(partners, k, send, Span::output(mine.start, mine.len()))
            })
            .collect();
        let all = scratch(&mut self.scratch, 2 * g.size * bytes);
        let (theirs, partial) = all.split_at_mut(g.size * bytes);
        let mut steps = DoublingSteps {
            channels: &mut self.channels,
            liveness: &self.liveness,
            plans: &plans,
            call,
        };
        for (i, &k) in order.iter().enumerate() {
            let mine = group(g.rank, k);
            let source: &[u8] = if i == 0 { input } else { partial };
            steps.run(i, &mut *theirs, Some(source))?;
            if i + 1 == order.len() {
                reducer.combine(output, &source[mine.clone()], &theirs[mine]);
            } else if i == 0 {
                reducer.combine(
                    &mut partial[mine.clone()],
                    &input[mine.clone()],
                    &theirs[mine],
                );
            } else {
                reducer.accumulate(&mut partial[mine.clone()], &theirs[mine]);
            }
        }
        Ok(())
    }

    /// Sends `data` to the neighbour `dst`.
    pub(crate) fn send(&mut self, data: &[u8], dst: usize, call: &Call) -> Result<()> {
        let plan = self.geometry.send(data.len(), dst);
        let bufs = Buffers {
            input: Some(data),
            output: &mut [],
        };
        engine::run(&mut self.channels, &self.liveness, &plan, bufs, None, call)
    }

    /// Receives into `out` from the neighbour `src`.
    pub(crate) fn recv(&mut self, out: &mut [u8], src: usize, call: &Call) -> Result<()> {
        let plan = self.geometry.recv(out.len(), src);
        engine::run(
            &mut self.channels,
            &self.liveness,
            &plan,
            Buffers {
                input: None,
                output: out,
            },
            None,
            call,
        )
    }

    /// Returns once every rank has entered: an all-gather of one-byte tokens ([`gather`]).
    pub(crate) fn barrier(&mut self, call: &Call) -> Result<()> {
        let g = self.geometry;
        let tokens = scratch(&mut self.scratch, g.size);
        gather(g, &mut self.channels, &self.liveness, tokens, 1, call)
    }
}

/// Gathers every rank's block of `block` bytes into `output` (`size` blocks), whose own block
/// the caller has filled: by recursive doubling where the ranks pair up (2 messages per rank
/// at 4 ranks, against 3 for the both-ways gather: step k swaps the 2^k blocks each partner
/// holds), else small ones by [`Geometry::gather_small`] and large ones around the ring.
fn gather(
    g: Geometry,
    channels: &mut [Channel],
    liveness: &Liveness,
    output: &mut [u8],
    block: usize,
    call: &Call,
) -> Result<()> {
    let total = block * g.size;
    let small = total <= GATHER_LIMIT;
    let doubling = small && block > 0 && !g.in_one_step(total);
    if let Some(partners) = g.doubling_partners().filter(|_| doubling) {
        let plans: Vec<Plan> = (0..partners.len())
            .map(|k| {
                // Before step k each rank holds the aligned group of 2^k blocks around its own
                // (partners differ in bit k; the ring's pairs 0-1 and 2-3 are such groups).
                let span = |r: usize| {
                    let blocks = aligned_blocks(r, k);
                    Span::output(blocks.start * block, blocks.len() * block)
                };
                g.swap_with(&partners, k, span(g.rank), span(partners[k]))
            })
            .collect();
        let mut steps = DoublingSteps {
            channels,
            liveness,
            plans: &plans,
            call,
        };
        for k in 0..plans.len() {
            steps.run(k, &mut *output, None)?;
        }
        return Ok(());
    }
    let plan = match small {
        true => g.gather_small(block),
        false => g.all_gather(block),
    };
    let bufs = Buffers {
        input: None,
        output,
    };
    engine::run(channels, liveness, &plan, bufs, None, call)
}

/// The aligned group of 2^k blocks (block indices) that holds block `r`: what a rank holds
/// after k steps of a recursive-doubling gather, or reduces before the last k steps of halving.
fn aligned_blocks(r: usize, k: usize) -> Range<usize> {
    let first = (r >> k) << k;
    first..first + (1 << k)
}

/// The steps of one recursive-doubling collective, one plan each ([`Geometry::swap_with`]).
struct DoublingSteps<'a> {
    channels: &'a mut [Channel],
    liveness: &'a Liveness,
    plans: &'a [Plan],
    call: &'a Call,
}

impl DoublingSteps<'_> {
    /// Runs step `k` over `output` (and `input`, where its plan sends from the input). On a
    /// `Mismatch` the partners of the later steps, which expect this rank's header with those
    /// steps, get it alone ([`Plan::announcement`]), so they see the mismatch too; that waits
    /// at most [`ANNOUNCE_TIMEOUT`] (this rank fails either way).
    fn run(&mut self, k: usize, output: &mut [u8], input: Option<&[u8]>) -> Result<()> {
        let bufs = Buffers { input, output };
        let (channels, liveness) = (&mut *self.channels, self.liveness);
        let result = engine::run(channels, liveness, &self.plans[k], bufs, None, self.call);
        if let Err(Error::Mismatch { .. }) = result {
            let call = Call {
                timeout: self.call.timeout.min(ANNOUNCE_TIMEOUT),
                ..*self.call
            };
            for later in &self.plans[k + 1..] {
                let bufs = Buffers {
                    input: None,
                    output: &mut [],
                };
                let _ = engine::run(channels, liveness, &later.announcement(), bufs, None, &call);
            }
        }
        result
    }
}

/// A recursive-doubling all-reduce in progress.
struct Swap<'a> {
    steps: DoublingSteps<'a>,
    rank: usize,
    /// The partner of each step.
    partners: &'a [usize],
    /// Receives the partner's partial result.
    theirs: &'a mut [u8],
    reducer: &'a Reducer,
}

impl Swap<'_> {
    /// Swaps `mine` with the partner of step `k` and leaves the two combined in `dst`, the
    /// lower rank's first.
    fn step(&mut self, k: usize, mine: &[u8], dst: &mut [u8]) -> Result<()> {
        self.steps.run(k, self.theirs, Some(mine))?;
        match self.rank < self.partners[k] {
            true => self.reducer.combine(dst, mine, self.theirs),
            false => self.reducer.combine(dst, self.theirs, mine),
        }
        Ok(())
    }

    /// [`Swap::step`] with `mine` also as `dst` (the higher rank, whose partner's value comes
    /// first, combines into the partner's vector and copies the result back).
    fn step_in_place(&mut self, k: usize, mine: &mut [u8]) -> Result<()> {
        self.steps.run(k, self.theirs, Some(mine))?;
        if self.rank < self.partners[k] {
            self.reducer.accumulate(mine, self.theirs);
        } else {
            self.reducer.accumulate(self.theirs, mine);
            copy(mine, self.theirs);
        }
        Ok(())
    }
}

/// `output` = the reduction of the `size` blocks of `all`, in rank order (the same on every
/// rank, so every rank gets the same bits). The first two blocks are combined in one pass.
fn fold_in_rank_order(output: &mut [u8], all: &[u8], reducer: &Reducer) {
    let bytes = output.len();
    if bytes == 0 {
        return;
    }
    let mut blocks = all.chunks_exact(bytes);
    match (blocks.next(), blocks.next()) {
        (Some(first), Some(second)) => reducer.combine(output, first, second),
        (Some(first), None) => copy(output, first),
        (None, _) => return,
    }
    for block in blocks {
        reducer.accumulate(output, block);
    }
}

/// `bytes` of `buf`, grown as needed, viewed as bytes.
fn scratch(buf: &mut Vec<u128>, bytes: usize) -> &mut [u8] {
    let words = bytes.div_ceil(size_of::<u128>());
    if buf.len() < words {
        buf.resize(words, 0);
    }
    &mut bytemuck::cast_slice_mut(buf.as_mut_slice())[..bytes]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Buf;

    #[test]
    fn lanes_fall_back_for_small_messages() {
        assert_eq!(
            Lanes::for_message(100, 25, 4, 4),
            Lanes { dirs: 1, wires: 1 }
        );
        assert_eq!(
            Lanes::for_message(32 * 1024, 8192, 4, 4),
            Lanes { dirs: 1, wires: 1 }
        );
        assert_eq!(
            Lanes::for_message(64 * 1024, 8192, 4, 4),
            Lanes { dirs: 2, wires: 4 }
        );
        // Many bytes but too few elements to give every lane one.
        assert_eq!(
            Lanes::for_message(1 << 20, 31, 4, 4),
            Lanes { dirs: 1, wires: 1 }
        );
    }

    #[test]
    fn lane_slices_tile_the_block() {
        for block in [0usize, 1, 2, 7, 8, 13, 97, 4096, 65537] {
            for lanes in 1..=8 {
                let mut next = 0;
                for lane in 0..lanes {
                    let s = lane_slice(block, lanes, lane);
                    assert_eq!(s.start, next.min(block), "block {block} lanes {lanes}");
                    assert!(s.end <= block);
                    next = s.end.max(next);
                }
                assert_eq!(next, block, "block {block} lanes {lanes}");
            }
        }
    }

    #[test]
    fn frames_are_4k_times_a_power_of_two() {
        assert_eq!(frame_bytes(0), 4096);
        assert_eq!(frame_bytes(1), 4096);
        assert_eq!(frame_bytes(64 * 1024), 32 * 1024);
        assert_eq!(frame_bytes(1 << 20), 512 * 1024);
        assert_eq!(frame_bytes(1 << 30), 512 * 1024);
        for b in [0, 5000, 123_456, 9_999_999] {
            let f = frame_bytes(b);
            assert!(f.is_power_of_two() && (4096..=512 * 1024).contains(&f));
        }
    }

    /// Simulates a plan's data movement on every rank (in lockstep, step by step) and checks
    /// that each rank ends with the expected blocks. This checks the index arithmetic without
    /// any network; the multi-rank tests check the real thing.
    fn simulate(
        size: usize,
        wires: usize,
        mesh: bool,
        plan_of: impl Fn(&Geometry) -> Plan,
        init: impl Fn(usize) -> (Vec<i64>, Vec<i64>),
        combine: bool,
    ) -> Vec<Vec<i64>> {
        let geos: Vec<Geometry> = (0..size)
            .map(|rank| Geometry {
                rank,
                size,
                wires,
                mesh,
            })
            .collect();
        let plans: Vec<Plan> = geos.iter().map(&plan_of).collect();
        let mut state: Vec<(Vec<i64>, Vec<i64>)> = (0..size).map(&init).collect();
        let steps = plans[0]
            .transfers
            .iter()
            .map(|t| t.steps.len())
            .max()
            .unwrap_or(0);
        for s in 0..steps {
            // Everything sent in step s, keyed by (receiver, receiver's channel).
            let mut inbox = std::collections::HashMap::new();
            for (r, plan) in plans.iter().enumerate() {
                for t in plan.transfers.iter().filter(|t| s < t.steps.len()) {
                    let step = t.steps[s];
                    // As in the engine, an in-place call (no input) reads its input spans from the output.
                    let src = match step.send.buf {
                        Buf::Input if !state[r].0.is_empty() => &state[r].0,
                        _ => &state[r].1,
                    };
                    let data: Vec<i64> = src[step.send.off..step.send.off + step.send.len].to_vec();
                    inbox.insert(geos[r].far_end(t.tx.unwrap()), data);
                }
            }
            for (r, plan) in plans.iter().enumerate() {
                for t in plan.transfers.iter().filter(|t| s < t.steps.len()) {
                    let step = t.steps[s];
                    let data = &inbox[&(r, t.rx.unwrap())];
                    assert_eq!(data.len(), step.recv.len, "rank {r} step {s}");
                    for (i, v) in data.iter().enumerate() {
                        let at = step.recv.off + i;
                        state[r].1[at] = match step.merge {
                            Merge::Copy => *v,
                            Merge::Reduce { own: Some(o) } if combine => state[r].0[o + i] + v,
                            Merge::Reduce { .. } => state[r].1[at] + v,
                        };
                    }
                }
            }
        }
        state.into_iter().map(|(_, out)| out).collect()
    }

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
                            |g| g.all_reduce(count, 1, in_place),
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
                    let outs = simulate(size, wires, false, |g| g.all_gather(block), init, false);
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
                        |g| g.reduce_scatter(count, 1),
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
                    let outs = simulate(size, wires, mesh, |g| g.gather_small(block), init, false);
                    for out in &outs {
                        assert_eq!(out, &expect, "size {size} block {block} mesh {mesh}");
                    }
                }
            }
        }
    }

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
                    |g| g.exchange_with_all(block, |p| Span::input(p * block, block)),
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
    fn with_the_mesh_every_pair_can_send_and_receive() {
        for size in 2..=7 {
            for wires in 1..=3 {
                let geo = |rank| Geometry {
                    rank,
                    size,
                    wires,
                    mesh: true,
                };
                for a in 0..size {
                    for b in (0..size).filter(|&b| b != a) {
                        assert!(geo(a).reaches(b));
                        let send = geo(a).send(1 << 20, b);
                        let recv = geo(b).recv(1 << 20, a);
                        assert_eq!(send.transfers.len(), recv.transfers.len());
                        for (s, r) in send.transfers.iter().zip(&recv.transfers) {
                            assert_eq!(geo(a).far_end(s.tx.unwrap()), (b, r.rx.unwrap()));
                            assert_eq!(s.steps[0].send.len, r.steps[0].recv.len);
                        }
                    }
                }
                // Without the mesh only neighbours are reachable.
                let ring = Geometry {
                    mesh: false,
                    ..geo(0)
                };
                assert_eq!(
                    (0..size).filter(|&p| ring.reaches(p)).count(),
                    size.min(3) - 1
                );
            }
        }
    }

    #[test]
    fn two_rank_send_uses_the_channel_the_peer_receives_on() {
        for wires in 1..=4 {
            let a = Geometry {
                rank: 0,
                size: 2,
                wires,
                mesh: false,
            };
            let b = Geometry {
                rank: 1,
                size: 2,
                wires,
                mesh: false,
            };
            let send = a.send(1 << 20, 1);
            let recv = b.recv(1 << 20, 0);
            assert_eq!(send.transfers.len(), recv.transfers.len());
            for (s, r) in send.transfers.iter().zip(&recv.transfers) {
                // a's right wire w (the connection it opened) is b's left wire w.
                assert_eq!(s.tx.unwrap(), r.rx.unwrap() + wires);
                assert_eq!(s.steps[0].send.len, r.steps[0].recv.len);
            }
        }
    }

    /// Every rank of a recursive doubling builds the same expression over all ranks (so gets
    /// the same bits), talking only to ranks it has a channel to, and partners agree.
    #[test]
    fn doubling_sends_headers_alone_only_to_neighbours_no_step_talks_to() {
        // 4 ranks on the ring: both neighbours are partners, so each step is one message to
        // one channel and no header travels alone.
        for rank in 0..4 {
            let g = Geometry {
                rank,
                size: 4,
                wires: 1,
                mesh: false,
            };
            let partners = g.doubling_partners().expect("pairs up");
            for k in 0..partners.len() {
                let plan = g.swap_with(&partners, k, Span::input(0, 8), Span::output(0, 8));
                assert_eq!(
                    plan.headers_both_ways,
                    Vec::<usize>::new(),
                    "rank {rank} step {k}"
                );
                let tx: Vec<_> = plan.transfers.iter().filter_map(|t| t.tx).collect();
                assert_eq!(
                    tx,
                    vec![g.channel_to(partners[k], 0)],
                    "rank {rank} step {k}"
                );
            }
        }
        // 8 ranks with the mesh: rank 0's partners are 1, 2 and 4; its left neighbour 7 is
        // none of them, so step 1 exchanges headers with it.
        let g = Geometry {
            rank: 0,
            size: 8,
            wires: 1,
            mesh: true,
        };
        let partners = g.doubling_partners().expect("pairs up");
        assert_eq!(partners, vec![1, 2, 4]);
        assert_eq!(
            g.swap_with(&partners, 0, Span::input(0, 8), Span::output(0, 8))
                .headers_both_ways,
            vec![g.left_channel(0)]
        );
        assert!(
            g.swap_with(&partners, 1, Span::input(0, 8), Span::output(0, 8))
                .headers_both_ways
                .is_empty()
        );
        // A rank that fails before step 2 announces itself on exactly that step's channels.
        let announcement = g
            .swap_with(&partners, 2, Span::input(0, 8), Span::output(0, 8))
            .announcement();
        assert_eq!(announcement.headers_out, vec![g.channel_to(4, 0)]);
        assert!(announcement.transfers.is_empty() && announcement.headers_both_ways.is_empty());
    }

    #[test]
    fn recursive_doubling_builds_one_expression_on_every_rank() {
        for (size, mesh) in [
            (2, false),
            (2, true),
            (4, false),
            (4, true),
            (8, true),
            (16, true),
        ] {
            let geometries: Vec<Geometry> = (0..size)
                .map(|rank| Geometry {
                    rank,
                    size,
                    wires: 2,
                    mesh,
                })
                .collect();
            let steps: Vec<Vec<usize>> = geometries
                .iter()
                .map(|g| g.doubling_partners().expect("pairs up"))
                .collect();
            // partners[k][r]: rank r's partner in step k.
            let partners: Vec<Vec<usize>> = (0..size.trailing_zeros() as usize)
                .map(|k| steps.iter().map(|s| s[k]).collect())
                .collect();
            let mut value: Vec<String> = (0..size).map(|r| r.to_string()).collect();
            for (k, partner) in partners.iter().enumerate() {
                let before = value.clone();
                for (r, g) in geometries.iter().enumerate() {
                    let peer = partner[r];
                    assert!(g.reaches(peer), "{r} to {peer} at {size} ranks");
                    assert_eq!(partner[peer], r, "pairs at step {k} of {size} ranks");
                    let (lo, hi) = (before[r.min(peer)].clone(), before[r.max(peer)].clone());
                    value[r] = format!("({lo} {hi})");
                }
            }
            assert!(value.iter().all(|v| *v == value[0]), "{value:?}");
            let mut ranks: Vec<usize> = value[0]
                .split(|c: char| !c.is_ascii_digit())
                .filter(|t| !t.is_empty())
                .map(|t| t.parse().expect("a rank"))
                .collect();
            ranks.sort_unstable();
            assert_eq!(ranks, (0..size).collect::<Vec<_>>());
        }
        for (size, mesh) in [(3, true), (5, false), (6, true), (8, false)] {
            let g = Geometry {
                rank: 0,
                size,
                wires: 1,
                mesh,
            };
            assert_eq!(g.doubling_partners(), None, "{size} ranks, mesh {mesh}");
        }
    }
}
