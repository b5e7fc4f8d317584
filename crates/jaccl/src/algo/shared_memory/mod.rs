//! Collectives among ranks that all share memory (every rank of the group on one host).
//!
//! Every rank has two areas in its segment; a round of a collective copies this rank's data into
//! one, waits until every rank has done the same, then reads the peers' areas directly. Rounds
//! alternate between the two areas, and a rank only reuses an area after the next round's
//! synchronisation, which no peer reaches before it has finished reading the area: so the
//! stamps of the synchronisation points are the only coordination, with no barrier between
//! calls. See docs/algorithms.md for the steps and the memory traffic of each collective.
//!
//! - **Small all-reduce** (up to 64 KiB for 2 ranks, 8 KiB for more): one
//!   round; every rank reduces all the vectors itself, in rank order.
//! - **Large all-reduce**: per round (a chunk of at most an area), each rank copies in all of
//!   its chunk but its own slice, reduces its slice out of every rank's data in rank order
//!   (writing the result to its output and its area), and after a second synchronisation
//!   copies the other slices' results out of their owners' areas.
//! - **All-gather**: per round, copy in, synchronise, copy every peer's part out.
//! - **Reduce-scatter**: per round, copy in the peers' blocks, synchronise, reduce own block.
//! - **Barrier**: one synchronisation.
//! - **Small broadcast** (up to `EAGER_DATA_BYTES`, 40): eager. The root posts the data and the
//!   call's description in one of its eager lines and goes on; the others wait for that line
//!   only. It is a synchronisation point for every rank (each publishes its stamp), but the
//!   root waits only when it comes back to a line a peer may still read, `EAGER_LINES`
//!   broadcasts later: a rank that published a later stamp has read it.
//!
//! Each element is reduced in rank order 0, 1, …, N − 1 by exactly one rank (large) or by
//! every rank in the same order (small), so every rank ends with the same bits, run after run.
//! Every call starts by publishing its description; the first synchronisation checks every
//! peer's, so ranks that call different things fail with `Mismatch` instead of mixing data.
//! Eager broadcasts do not take a call slot (their root may be `EAGER_LINES` calls ahead):
//! their description travels in the line, and a receiver checks its root's. What the root
//! cannot check at once (another rank thought itself the root too) shows at the next call that
//! waits for every rank, whose description counts the broadcasts each rank was the root of
//! ([`Direct::check_roots`]). Descriptions carry the exact number of calls before
//! ([`Direct::made`]), so ranks that skipped or repeated one disagree.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use super::call::Call;
use super::channel::{Channel, PeerAhead};
use super::geometry::lane_slice;
use super::select::{DirectAllReduce, Shape};
use crate::error::{Error, Result};
use crate::liveness::Liveness;
use crate::reduce::{Reducer, copy};
use crate::transport::shm::{Board, EAGER_LINES, INLINE_BYTES};

mod sync;
mod tuner;

use tuner::{StoreTuner, Timing};

/// Reductions work through a cache-resident scratch block of this many bytes.
const BLOCK: usize = 16 * 1024;

/// The direct collectives of one group.
pub(crate) struct Direct {
    rank: usize,
    size: usize,
    board: Arc<Board>,
    /// Every other rank, in rank order.
    others: Vec<usize>,
    /// Calls started, synchronisation points reached, rounds started.
    calls: u64,
    stamp: u64,
    rounds: u64,
    /// Calls made so far, eager broadcasts included (modulo 2^32), as descriptions carry it in
    /// their sequence field: ranks that skipped or repeated a call disagree on it.
    made: u32,
    /// The sequence field of the current call's description.
    described: u32,
    /// Eager (and flat) broadcasts since the last call that waits for every rank, and of how
    /// many of them this rank was the root ([`Direct::check_roots`]).
    eager_run: Run,
    /// `eager_run` as the current call began: what its first synchronisation checks.
    eager_before: Run,
    /// A stamp every peer was seen to have published: an eager root need not wait for it.
    peers_reached: u64,
    /// Indices into `others` not yet seen at the current synchronisation point (reused).
    pending: Vec<usize>,
    scratch: Vec<u128>,
    /// Whether this call writes its areas with streaming stores (see [`StoreTuner`]).
    streaming: bool,
    /// Rank 0's measurements; `None` on the other ranks.
    tuner: Option<Box<StoreTuner>>,
    liveness: Arc<Liveness>,
}

impl Direct {
    /// The direct collectives of `rank` of a group of `size` over `board`.
    pub(crate) fn new(
        rank: usize,
        size: usize,
        board: Arc<Board>,
        liveness: Arc<Liveness>,
    ) -> Direct {
        // The deadlock search goes by the stamp peers see: its mailbox.
        let shown = Arc::clone(&board);
        liveness.show_stamp(Box::new(move || shown.shown_stamp()));
        Direct {
            rank,
            size,
            board,
            others: (0..size).filter(|&q| q != rank).collect(),
            calls: 0,
            stamp: 0,
            rounds: 0,
            made: 0,
            described: 0,
            eager_run: Run::default(),
            eager_before: Run::default(),
            peers_reached: 0,
            pending: Vec::with_capacity(size),
            scratch: vec![0; BLOCK / size_of::<u128>()],
            streaming: false,
            tuner: (rank == 0).then(|| Box::new(StoreTuner::new())),
            liveness,
        }
    }

    /// Whether `peer` has entered a direct collective this rank has not: its synchronisation
    /// stamp is ahead of this rank's (a stamp that fails its checks is an error). A connection
    /// to the peer asks while a send or receive waits on it: in a program whose ranks call the
    /// same operations, a peer gets ahead only after its side of the send or receive is done,
    /// so the wait cannot be for anything else.
    pub(crate) fn ahead(&self, peer: usize) -> Option<PeerAhead> {
        let board = Arc::clone(&self.board);
        (peer != self.rank && peer < self.size)
            .then(|| Box::new(move || board.ahead(peer)) as PeerAhead)
    }

    /// All-reduce of `output.len()` bytes from `input` (or in place).
    pub(crate) fn all_reduce(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
        channels: &mut [Channel],
        shape: &Shape,
    ) -> Result<()> {
        let bytes = output.len();
        self.reduction(input, output, bytes, None, reducer, call, channels, shape)
    }

    /// Reduce of `input` to rank `root`'s `output` (elsewhere `output` is not written and
    /// may be empty): the all-reduce's rounds, where only the root reads the results.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        root: usize,
        reducer: &Reducer,
        call: &Call,
        channels: &mut [Channel],
        shape: &Shape,
    ) -> Result<()> {
        let bytes = input.len();
        self.reduction(
            Some(input),
            output,
            bytes,
            Some(root),
            reducer,
            call,
            channels,
            shape,
        )
    }

    /// The reduction of `bytes` of every rank's `input` (or in place: `output`) into
    /// `output`: on every rank, or with `root` only there (an `output` that is not written
    /// elsewhere, and may be empty).
    #[allow(clippy::too_many_arguments)]
    fn reduction(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        bytes: usize,
        root: Option<usize>,
        reducer: &Reducer,
        call: &Call,
        channels: &mut [Channel],
        shape: &Shape,
    ) -> Result<()> {
        let keeps = root.is_none_or(|r| r == self.rank);
        let (seq, timing) = self.begin(call, bytes)?;
        if shape.direct_all_reduce(bytes, self.area_bytes()) == DirectAllReduce::OneRound {
            self.all_reduce_small(input, output, bytes, keeps, reducer, call, seq, channels)?;
            self.end(timing);
            return Ok(());
        }
        let elem = reducer.elem_size();
        let chunk = self.area_bytes() / elem * elem;
        for (k, at) in (0..bytes).step_by(chunk).enumerate() {
            let len = chunk.min(bytes - at);
            let area = self.next_area();
            let mine = self.slice(len / elem, self.rank, elem);
            {
                let own = input.unwrap_or(output);
                self.write_area(area, &own[at..at + mine.start]);
                self.write_area(area + mine.end, &own[at + mine.end..at + len]);
            }
            self.sync(call, (k == 0).then_some(seq), channels)?;
            // Reduce this rank's slice, block by block, in rank order.
            // Taken out for the loop (`fold` borrows `self`); nothing in it returns early.
            let mut scratch = std::mem::take(&mut self.scratch);
            let blocks: &mut [u8] = bytemuck::cast_slice_mut(scratch.as_mut_slice());
            for b in (mine.start..mine.end).step_by(BLOCK) {
                let n = BLOCK.min(mine.end - b);
                let tmp = &mut blocks[..n];
                self.fold(
                    tmp,
                    area + b,
                    &input.unwrap_or(output)[at + b..at + b + n],
                    reducer,
                );
                if keeps {
                    copy(&mut output[at + b..at + b + n], tmp);
                }
                self.write_area(area + b, tmp);
            }
            self.scratch = scratch;
            self.sync(call, None, channels)?;
            if !keeps {
                continue;
            }
            for &q in &self.others {
                let theirs = self.slice(len / elem, q, elem);
                self.board.read(
                    q,
                    area + theirs.start,
                    &mut output[at + theirs.start..at + theirs.end],
                );
            }
        }
        self.end(timing);
        Ok(())
    }

    /// One round: every rank reduces every vector, in rank order. Up to [`INLINE_BYTES`] bytes
    /// travel in the mailbox line the peers wait on, so they arrive with the stamp.
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_small(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        n: usize,
        keeps: bool,
        reducer: &Reducer,
        call: &Call,
        seq: u64,
        channels: &mut [Channel],
    ) -> Result<()> {
        let area = self.one_round_area(seq, n);
        self.write_area(area, input.unwrap_or(output));
        self.sync(call, Some(seq), channels)?;
        if keeps {
            // This rank's own vector from its area: `output` may be the input.
            self.board.with_bytes(self.rank, area, n, |own| {
                self.fold(output, area, own, reducer);
            });
        }
        Ok(())
    }

    /// All-gather: `output` holds `size` blocks of `input.len()` bytes.
    pub(crate) fn all_gather(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        call: &Call,
        channels: &mut [Channel],
    ) -> Result<()> {
        let blocks = equal_blocks(self.size, input.len());
        self.gather_blocks(input, output, &blocks, None, call, channels)
    }

    /// Gathers every rank's block into the byte range `blocks[r]` of `output`: on every rank,
    /// or with `root` only there (elsewhere `output` is not written and may be empty). Rank
    /// r's `input` is `blocks[r].len()` bytes.
    pub(crate) fn gather_blocks(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        blocks: &[Range<usize>],
        root: Option<usize>,
        call: &Call,
        channels: &mut [Channel],
    ) -> Result<()> {
        let keeps = root.is_none_or(|r| r == self.rank);
        let largest = blocks.iter().map(Range::len).max().unwrap_or(0);
        let (seq, timing) = self.begin(call, largest)?;
        if keeps {
            copy(&mut output[blocks[self.rank].clone()], input);
        }
        let chunk = self.area_bytes();
        let rounds = largest.div_ceil(chunk).max(1);
        for k in 0..rounds {
            let at = k * chunk;
            let part = |len: usize| at.min(len)..(at + chunk).min(len);
            let mine = part(input.len());
            let area = self.one_round_area(seq, largest);
            self.write_area(area, &input[mine]);
            self.sync(call, (k == 0).then_some(seq), channels)?;
            if !keeps {
                continue;
            }
            for &q in &self.others {
                let theirs = part(blocks[q].len());
                let start = blocks[q].start;
                let dst = &mut output[start + theirs.start..start + theirs.end];
                self.board.read(q, area, dst);
            }
        }
        self.end(timing);
        Ok(())
    }

    /// Broadcast of `data` from `root`: per round (an area), the root copies a chunk into its
    /// area, and after the synchronisation every other rank copies it out, while the root
    /// already copies the next chunk into its other area.
    pub(crate) fn broadcast(
        &mut self,
        data: &mut [u8],
        root: usize,
        call: &Call,
        channels: &mut [Channel],
    ) -> Result<()> {
        let bytes = data.len();
        let (seq, timing) = self.begin(call, bytes)?;
        let chunk = self.area_bytes();
        let rounds = bytes.div_ceil(chunk).max(1);
        for k in 0..rounds {
            let range = (k * chunk).min(bytes)..((k + 1) * chunk).min(bytes);
            let area = self.one_round_area(seq, bytes);
            if self.rank == root {
                self.write_area(area, &data[range.clone()]);
            }
            self.sync(call, (k == 0).then_some(seq), channels)?;
            if self.rank != root {
                match bytes >= STREAM_OUT {
                    true => self.board.read_streaming(root, area, &mut data[range]),
                    false => self.board.read(root, area, &mut data[range]),
                }
            }
        }
        self.end(timing);
        Ok(())
    }

    /// Broadcast of `data` (at most `EAGER_DATA_BYTES`) from `root`, eagerly (see the module
    /// docs): back-to-back broadcasts pipeline, as MPI's eager ones do.
    pub(crate) fn broadcast_eager(
        &mut self,
        data: &mut [u8],
        root: usize,
        call: &Call,
        channels: &mut [Channel],
    ) -> Result<()> {
        let words = self.describe(call)?;
        self.eager_run.broadcasts += 1;
        self.eager_run.rooted += u8::from(self.rank == root);
        self.stamp += 1;
        let stamp = self.stamp;
        if self.rank == root {
            // The line's last broadcast was at `stamp - EAGER_LINES`: read by every rank that
            // has published a later stamp.
            let read_by = (stamp + 1).saturating_sub(EAGER_LINES as u64);
            if read_by > self.peers_reached {
                self.wait_for_others(call, None, read_by, channels)?;
                // They may be further on: fewer waits in a long pipeline.
                let mut least = u64::MAX;
                for &q in &self.others {
                    least = least.min(self.stamp_of(call, q)?);
                }
                self.peers_reached = self.peers_reached.max(least);
            }
            self.board.post_eager(stamp, words, data);
        }
        self.publish(stamp);
        if self.rank == root {
            return Ok(());
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.clear();
        // `others` is every rank but this one, in order.
        pending.push(if root < self.rank { root } else { root - 1 });
        let result = self.wait(call, None, Await::EagerLine, stamp, &mut pending, channels);
        self.pending = pending;
        result?;
        if self.eager_stamp(call, root, stamp)? != stamp {
            return Err(Error::Mismatch {
                rank: call.rank,
                peer: root,
                op: call.op,
                detail: format!(
                    "rank {root} is at this synchronisation point in another collective than \
                     this broadcast from it"
                ),
            });
        }
        let words = self.board.eager_call(root, stamp);
        self.check_words(root, words, || [0; 32], call)?;
        self.board.read_eager(root, stamp, data);
        Ok(())
    }

    /// Scatter from `root` of `input` (`size` blocks of `output.len()` bytes, read on the root
    /// only): per round, the root copies a part of every block into its area, and every rank
    /// copies its part out.
    pub(crate) fn scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        root: usize,
        call: &Call,
        channels: &mut [Channel],
    ) -> Result<()> {
        let block = output.len();
        let (seq, timing) = self.begin(call, block * self.size)?;
        let part = (self.area_bytes() / self.size).max(1);
        let rounds = block.div_ceil(part).max(1);
        for k in 0..rounds {
            let at = k * part;
            let len = part.min(block - at.min(block));
            let area = self.next_area();
            if self.rank == root {
                for q in 0..self.size {
                    let src = &input[q * block + at..q * block + at + len];
                    match q == root {
                        true => copy(&mut output[at..at + len], src),
                        false => self.write_area(area + q * part, src),
                    }
                }
            }
            self.sync(call, (k == 0).then_some(seq), channels)?;
            if self.rank != root {
                self.board
                    .read(root, area + self.rank * part, &mut output[at..at + len]);
            }
        }
        self.end(timing);
        Ok(())
    }

    /// All-to-all with any counts: this rank's byte range `sends[d]` of `input` goes to rank
    /// d, and rank s's block for this rank lands in `recvs[s]` of `output` (the caller
    /// copied this rank's own block). A rank's area has a slot per rank; per round, every rank
    /// copies the next slot's worth of each of its blocks into that rank's slot, and after the
    /// wait every rank copies its slot out of every peer's area: so every rank copies in and
    /// out in every round, whatever the counts. `largest` is the largest block of any rank
    /// (the same on every rank), which sets the number of rounds.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_to_all(
        &mut self,
        input: &[u8],
        sends: &[Range<usize>],
        output: &mut [u8],
        recvs: &[Range<usize>],
        largest: usize,
        call: &Call,
        channels: &mut [Channel],
    ) -> Result<()> {
        let (seq, timing) = self.begin(call, input.len())?;
        // Slots on cache-line boundaries, or side by side inline.
        let all_slots = largest.saturating_mul(self.size);
        let slot = match all_slots <= INLINE_BYTES {
            true => largest,
            false => (self.area_bytes() / self.size / 64 * 64).max(64),
        };
        let rounds = largest.div_ceil(slot.max(1)).max(1);
        let streams_out = output.len() >= STREAM_OUT;
        for k in 0..rounds {
            let at = k * slot;
            let part =
                |r: &Range<usize>| (r.start + at).min(r.end)..(r.start + at + slot).min(r.end);
            let area = self.one_round_area(seq, all_slots);
            for &d in &self.others {
                self.write_area(area + d * slot, &input[part(&sends[d])]);
            }
            self.sync(call, (k == 0).then_some(seq), channels)?;
            for &p in &self.others {
                let dst = &mut output[part(&recvs[p])];
                let from = area + self.rank * slot;
                match streams_out {
                    true => self.board.read_streaming(p, from, dst),
                    false => self.board.read(p, from, dst),
                }
            }
        }
        self.end(timing);
        Ok(())
    }

    /// Reduce-scatter: `input` holds `size` blocks of `output.len()` bytes; this rank keeps the
    /// reduction of block `rank`.
    pub(crate) fn reduce_scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
        channels: &mut [Channel],
    ) -> Result<()> {
        let (seq, timing) = self.begin(call, input.len())?;
        let elem = reducer.elem_size();
        let block = output.len();
        // Each round moves a part of every block; a rank's area holds one per rank.
        let part = (self.area_bytes() / self.size / elem).max(1) * elem;
        let rounds = block.div_ceil(part).max(1);
        for k in 0..rounds {
            let at = k * part;
            let len = part.min(block - at);
            let area = self.next_area();
            for q in (0..self.size).filter(|&q| q != self.rank) {
                let src = &input[q * block + at..q * block + at + len];
                self.write_area(area + q * part, src);
            }
            self.sync(call, (k == 0).then_some(seq), channels)?;
            let own = &input[self.rank * block + at..self.rank * block + at + len];
            self.fold(
                &mut output[at..at + len],
                area + self.rank * part,
                own,
                reducer,
            );
        }
        self.end(timing);
        Ok(())
    }

    /// Returns once every rank has entered.
    pub(crate) fn barrier(&mut self, call: &Call, channels: &mut [Channel]) -> Result<()> {
        let (seq, _) = self.begin(call, 0)?;
        self.sync(call, Some(seq), channels)
    }

    /// Publishes the description of the next call, which moves `bytes` (the size rank 0
    /// tunes stores by), and picks this call's stores. Returns the call's number, and on rank 0
    /// what [`Direct::end`] needs to time it.
    fn begin(&mut self, call: &Call, bytes: usize) -> Result<(u64, Option<Timing>)> {
        let seq = self.calls;
        let mut words = self.describe(call)?;
        self.calls += 1;
        // The eager broadcasts this rank was the root of since the last call that waited for
        // every rank, in the byte of the description `Header::to_words` leaves free.
        words[0] |= u64::from(self.eager_run.rooted) << 56;
        self.eager_before = std::mem::take(&mut self.eager_run);
        // Published by the next stamp.
        if let Some(digest) = &call.counts {
            self.board.publish_counts(seq, digest);
        }
        self.board.publish_call(seq, words);
        // Stores as rank 0 said with the previous call (any choice is correct; they only
        // differ in speed, so a late hint costs nothing but time).
        let class = StoreTuner::class(bytes);
        self.streaming = match (class, seq) {
            (Some(k), 1..) => self.board.hints(seq - 1) & (1 << k) != 0,
            _ => false,
        };
        let Some(tuner) = self.tuner.as_deref() else {
            return Ok((seq, None));
        };
        self.board.publish_hints(seq, tuner.hints);
        let timing = class.map(|class| Timing {
            class,
            bytes,
            streaming: self.streaming,
            start: Instant::now(),
        });
        Ok((seq, timing))
    }

    /// Ends a call: rank 0 records how long it took.
    fn end(&mut self, timing: Option<Timing>) {
        if let (Some(tuner), Some(t)) = (self.tuner.as_deref_mut(), timing) {
            tuner.record(t.class, t.streaming, t.bytes, t.start.elapsed());
        }
    }

    /// Copies `src` into this rank's own segment at `offset`, with this call's stores.
    fn write_area(&self, offset: usize, src: &[u8]) {
        self.board.write(offset, src, self.streaming);
    }

    /// Where call `seq` writes what it moves in a round, `bytes` in all: inline in the
    /// mailbox line the peers wait on when it fits (it arrives with the stamp: one cache line
    /// less to fetch), else the next round's area. Inline data of `seq`'s parity is
    /// rewritten two calls later, after a synchronisation no peer passes before reading it.
    fn one_round_area(&mut self, seq: u64, bytes: usize) -> usize {
        match bytes <= INLINE_BYTES {
            true => self.board.inline(seq),
            false => self.next_area(),
        }
    }

    /// The offset of the next round's area.
    fn next_area(&mut self) -> usize {
        let parity = self.rounds % 2;
        self.rounds += 1;
        self.board.area(parity)
    }

    pub(crate) fn area_bytes(&self) -> usize {
        self.board.area_bytes()
    }

    /// The byte range of rank `q`'s slice of a chunk of `count` elements.
    fn slice(&self, count: usize, q: usize, elem: usize) -> Range<usize> {
        let s = lane_slice(count, self.size, q);
        s.start * elem..s.end * elem
    }

    /// `dst` = the reduction, in rank order, of every rank's contribution: this rank's is
    /// `own`, each peer's the `dst.len()` bytes at `offset` of its segment.
    fn fold(&self, dst: &mut [u8], offset: usize, own: &[u8], reducer: &Reducer) {
        self.contribution(0, offset, own, |a0| {
            self.contribution(1, offset, own, |a1| reducer.combine(dst, a0, a1));
        });
        for q in 2..self.size {
            self.contribution(q, offset, own, |a| reducer.accumulate(dst, a));
        }
    }

    /// Runs `f` over rank `q`'s contribution: `own` for this rank, else `own.len()` bytes at
    /// `offset` of its segment.
    fn contribution<R>(
        &self,
        q: usize,
        offset: usize,
        own: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        match q == self.rank {
            true => f(own),
            false => self.board.with_bytes(q, offset, own.len(), f),
        }
    }
}

/// A run of eager (and flat) broadcasts ([`Direct::eager_run`]).
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    broadcasts: u8,
    /// Those this rank was the root of.
    rooted: u8,
}

/// How a wait sees that a peer reached a synchronisation point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Await {
    /// Its stamp.
    Stamp,
    /// Its eager line for the point, or its stamp (an eager broadcast's receivers).
    EagerLine,
}

/// `size` byte ranges of `block` bytes, back to back.
pub(crate) fn equal_blocks(size: usize, block: usize) -> Vec<Range<usize>> {
    (0..size).map(|r| r * block..(r + 1) * block).collect()
}

/// Outputs of at least this many bytes are copied into with non-temporal stores: far beyond
/// the caches (2 MiB of L2 per core, 32 MiB of L3 for both here), every line an ordinary store
/// writes is first read from memory, then evicted. Measured (`jaccl bench -n 4 --op broadcast
/// --transport shm`, 32 MiB): 5.07 GB/s with ordinary stores, 6.19-6.28 with streaming ones.
const STREAM_OUT: usize = 8 << 20;
