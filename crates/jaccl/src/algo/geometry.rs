//! The channels of a group and how data is cut into lanes over them.
//!
//! A rank talks to its left and right ring neighbour over `wires` parallel channels each, and
//! to every other rank over one channel more (opened at start-up with the mesh, else when a
//! call first needs it). Data is cut into lanes, one per
//! (direction, wire): direction 0 moves data to the right (rank r sends to r + 1 and receives
//! from r − 1), direction 1 to the left. Within every block (a chunk of the all-reduce, a
//! rank's block of the all-gather or reduce-scatter), lane `l = dir · wires + wire` owns the
//! `l`-th of `dirs · wires` equal slices ([`lane_slice`]); how many lanes a message uses is
//! [`super::select::lanes`]'s choice. Each lane hands the link at most a frame at a time
//! ([`frame_bytes`]).

use std::ops::Range;

use super::select::{self, Shape};

/// Frames are `MIN_FRAME << k` bytes, k = 0..=7 (4 KiB to 512 KiB).
const MIN_FRAME: usize = 4096;
const MAX_FRAME: usize = MIN_FRAME << 7;

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

/// The frame for a transfer of one step of `bytes`: the smallest that holds it all (at most
/// 512 KiB), as nothing follows that halves would let overlap.
pub(crate) fn whole_frame(bytes: usize) -> usize {
    bytes.next_power_of_two().clamp(MIN_FRAME, MAX_FRAME)
}

/// `(rank + delta) mod size` for any signed delta.
pub(crate) fn ring_index(rank: usize, delta: isize, size: usize) -> usize {
    let size_i = size as isize;
    ((rank as isize + delta).rem_euclid(size_i)) as usize
}

/// The ring's geometry: which channel index is which wire to which peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) wires: usize,
    /// The mesh: the channels to the ranks that are not ring neighbours (after the ring's
    /// channels, in rank order) were opened at start-up, so small collectives take one step
    /// over them. Without it they open when a call first needs them.
    pub(crate) mesh: bool,
}

impl Geometry {
    pub(crate) fn left(&self) -> usize {
        ring_index(self.rank, -1, self.size)
    }

    pub(crate) fn right(&self) -> usize {
        ring_index(self.rank, 1, self.size)
    }

    /// The ranks that are neither this one nor a ring neighbour, in rank order: each has one
    /// channel of its own.
    pub(crate) fn non_neighbours(&self) -> impl Iterator<Item = usize> + use<> {
        let (rank, left, right) = (self.rank, self.left(), self.right());
        (0..self.size).filter(move |&p| p != rank && p != left && p != right)
    }

    /// The channel for talking to `peer` on wire `w` (a channel off the ring has wire 0 only), both
    /// ways. With two ranks both neighbours are the same rank: both then use the connections
    /// rank 0 opened (its right channels, rank 1's left ones), so that each side's data carries
    /// the acknowledgement of the other's (a one-way connection each way costs a bare ACK per
    /// message: 9.5 µs against 5.2–6.6 µs per 8-byte exchange in C on loopback).
    pub(crate) fn channel_to(&self, peer: usize, w: usize) -> usize {
        match peer {
            _ if self.size == 2 && self.rank == 0 => self.right_channel(w),
            _ if self.size == 2 => self.left_channel(w),
            p if p == self.left() => self.left_channel(w),
            p if p == self.right() => self.right_channel(w),
            // Off the ring: its place among the ranks other than this one and its neighbours
            // (three distinct ranks from 3 ranks up).
            _ => {
                let skipped = [self.rank, self.left(), self.right()];
                2 * self.wires + peer - skipped.iter().filter(|&&r| r < peer).count()
            }
        }
    }

    /// Wires for a message of `bytes` to or from `peer`: split over the ring's wires to a
    /// neighbour, one wire to another rank of the mesh.
    pub(crate) fn wires_to(&self, bytes: usize, peer: usize) -> usize {
        if peer == self.left() || peer == self.right() {
            select::lanes(bytes, bytes, 1, self.wires).wires
        } else {
            1
        }
    }

    /// The peer at the other end of channel `c` (`None`: no such channel): the inverse of
    /// [`Geometry::channel_to`], in constant time.
    pub(crate) fn peer_on(&self, c: usize) -> Option<usize> {
        let w = self.wires;
        if c < w {
            return Some(self.left());
        }
        if c < 2 * w {
            return Some(self.right());
        }
        // The (c − 2w)-th rank other than this one and its neighbours, in rank order.
        let mut skipped = [self.rank, self.left(), self.right()];
        skipped.sort_unstable();
        let mut peer = c - 2 * w;
        let mut last = None;
        for s in skipped {
            if last != Some(s) && s <= peer {
                peer += 1;
            }
            last = Some(s);
        }
        (peer < self.size).then_some(peer)
    }

    /// The peer at the other end of channel `c`, and that peer's index for the same channel.
    #[cfg(test)]
    pub(crate) fn far_end(&self, c: usize) -> (usize, usize) {
        let w = self.wires;
        let peer = self.peer_on(c).expect("a channel of the group");
        match c {
            _ if c < w => (peer, c + w),
            _ if c < 2 * w => (peer, c - w),
            _ => {
                let theirs = Geometry {
                    rank: peer,
                    ..*self
                };
                (peer, theirs.channel_to(self.rank, 0))
            }
        }
    }

    /// Channel index of wire `w` to the left neighbour (the one it opened to us).
    pub(crate) fn left_channel(&self, w: usize) -> usize {
        w
    }

    /// Channel index of wire `w` to the right neighbour (the one we opened).
    pub(crate) fn right_channel(&self, w: usize) -> usize {
        self.wires + w
    }

    /// `(send channel, receive channel, step direction)` of direction `dir` on wire `w`:
    /// direction 0 sends right and receives from the left, so block indices step by −1.
    pub(crate) fn lane_channels(&self, dir: usize, w: usize) -> (usize, usize, isize) {
        if dir == 0 {
            (self.right_channel(w), self.left_channel(w), 1)
        } else {
            (self.left_channel(w), self.right_channel(w), -1)
        }
    }

    pub(crate) fn block(&self, delta: isize) -> usize {
        ring_index(self.rank, delta, self.size)
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

    /// This rank's part in a recursive-doubling all-reduce among any number of ranks. Where
    /// the ranks pair up ([`Geometry::doubling_partners`]) every rank doubles. Otherwise, with
    /// `p` the largest power of two up to `size` and `rem = size − p`, the first `2·rem` ranks
    /// pair up as (2i, 2i + 1) around the doubling, as MPICH does: the even one hands its
    /// vector to the odd one, which doubles for both and hands back the result; the `p` ranks
    /// that double (in rank order: the odd ones of the pairs, then the rest) partner in step k
    /// the one whose index among them differs in bit k, over links made on first use. Both
    /// orders (a pair's even rank first, a lower doubling index first) follow rank order, so
    /// every rank builds the same expression.
    pub(crate) fn doubling_role(&self) -> DoublingRole {
        if let Some(partners) = self.doubling_partners() {
            return DoublingRole::Double {
                extra: None,
                partners,
            };
        }
        let (r, n) = (self.rank, self.size);
        let paired = 2 * n.saturating_sub(largest_power_of_two(n));
        if r < paired && r % 2 == 0 {
            return DoublingRole::HandOver { to: r + 1 };
        }
        let index = folded_index(n, r);
        DoublingRole::Double {
            extra: (r < paired).then(|| r - 1),
            partners: (0..largest_power_of_two(n).trailing_zeros())
                .map(|k| folded_ranks(n, index ^ (1 << k)).end - 1)
                .collect(),
        }
    }

    /// What the algorithm choice depends on ([`Shape`]); `rdma` and `direct` as every rank of
    /// the group agreed at set-up.
    pub(crate) fn shape(&self, rdma: bool, direct: bool) -> Shape {
        Shape {
            size: self.size,
            mesh: self.mesh,
            pairs: self.doubling_partners().is_some(),
            rdma,
            direct,
            on_hosts: false,
            host_blocks: None,
            scattered_hosts: false,
            shared_hosts: false,
        }
    }
}

/// A rank's part in a recursive-doubling all-reduce ([`Geometry::doubling_role`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DoublingRole {
    /// Swaps partial results with `partners`, in step order; first takes in the vector of
    /// `extra` (the rank below; in recursive doubling its value comes first) if there is one,
    /// and last hands it the result.
    Double {
        extra: Option<usize>,
        partners: Vec<usize>,
    },
    /// Hands its vector to `to` (the rank above), which hands back the result.
    HandOver { to: usize },
}

/// The largest power of two up to `n` (1 for none).
fn largest_power_of_two(n: usize) -> usize {
    1 << n.checked_ilog2().unwrap_or(0)
}

/// The ranks that doubling index `i` stands for among `n` ranks whose extra ranks fold in
/// ([`Geometry::doubling_role`]): a pair's (the extra rank first) or its own.
pub(crate) fn folded_ranks(n: usize, i: usize) -> Range<usize> {
    let pairs = n.saturating_sub(largest_power_of_two(n));
    match i < pairs {
        true => 2 * i..2 * i + 2,
        false => i + pairs..i + pairs + 1,
    }
}

/// The doubling index of rank `r` among `n` ranks whose extra ranks fold in (for an extra
/// rank, its partner's): the inverse of [`folded_ranks`].
pub(crate) fn folded_index(n: usize, r: usize) -> usize {
    let pairs = n.saturating_sub(largest_power_of_two(n));
    match r < 2 * pairs {
        true => r / 2,
        false => r - pairs,
    }
}

/// Blocks of `block` bytes, one per rank, from rank order (`ranked`) into the order of their
/// distance from rank `origin` (`by_distance`: the origin's block first), as the binomial
/// trees and Bruck's rounds hold them.
pub(crate) fn blocks_by_distance(
    by_distance: &mut [u8],
    ranked: &[u8],
    origin: usize,
    block: usize,
) {
    rotate_into(by_distance, ranked, origin * block);
}

/// The inverse of [`blocks_by_distance`], for every rank's block (`ranked` holds them all).
pub(crate) fn blocks_by_rank(ranked: &mut [u8], by_distance: &[u8], origin: usize, block: usize) {
    rotate_into(ranked, by_distance, ranked.len() - origin * block);
}

/// `to` = `from[at..]`, then `from[..at]`.
fn rotate_into(to: &mut [u8], from: &[u8], at: usize) {
    let (head, tail) = from.split_at(at);
    to[..tail.len()].copy_from_slice(tail);
    to[tail.len()..tail.len() + head.len()].copy_from_slice(head);
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn channels_off_the_ring_follow_rank_order_and_name_their_peer() {
        for size in 1..=20 {
            for wires in [1, 2, 3] {
                for rank in 0..size {
                    let g = Geometry {
                        rank,
                        size,
                        wires,
                        mesh: true,
                    };
                    let others: Vec<usize> = g.non_neighbours().collect();
                    for (i, &peer) in others.iter().enumerate() {
                        assert_eq!(g.channel_to(peer, 0), 2 * wires + i, "{rank} of {size}");
                        assert_eq!(g.peer_on(2 * wires + i), Some(peer), "{rank} of {size}");
                    }
                    assert_eq!(g.peer_on(2 * wires + others.len()), None);
                }
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

    #[test]
    fn a_whole_frame_holds_the_message_up_to_512k() {
        assert_eq!(whole_frame(0), 4096);
        assert_eq!(whole_frame(4097), 8192);
        assert_eq!(whole_frame(32 * 1024), 32 * 1024);
        assert_eq!(whole_frame(100_000), 128 * 1024);
        assert_eq!(whole_frame(1 << 30), 512 * 1024);
    }
}
