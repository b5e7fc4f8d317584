//! The collectives of uneven blocks ([`Collectives`]): all-to-all, all-gather and
//! reduce-scatter with a count per rank.

use std::ops::Range;

use super::super::call::{Buffers, Call};
use super::super::plan::Span;
use super::super::select::{AllGatherV, AllToAll, ReduceScatterV};
use super::super::{bruck, mesh, ring};
use super::{Collectives, direct};
use crate::dtype::Dtype;
use crate::error::{Error, Op, Result};
use crate::reduce::{Reducer, copy};

impl Collectives {
    /// All-to-all with any counts (elements of `elem` bytes): first the counts, checked pair
    /// by pair, and the verdict shared by every rank, so that disagreeing counts fail every
    /// rank alike with `Mismatch` before any data moves; then the data.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn all_to_all_v(
        &mut self,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
        elem: usize,
        call: &Call,
    ) -> Result<()> {
        let (n, me) = (self.geometry.size, self.geometry.rank);
        let (sends, recvs) = (blocks_of(send_counts, elem), blocks_of(recv_counts, elem));
        // Every sender's count for this rank.
        let words = Call {
            dtype: Dtype::UInt64,
            count: 1,
            ..*call
        };
        let mine: Vec<u64> = send_counts.iter().map(|&c| c as u64).collect();
        let mut theirs = vec![0u64; n];
        {
            let (a, b): (&[u8], &mut [u8]) = (
                bytemuck::cast_slice(&mine),
                bytemuck::cast_slice_mut(&mut theirs),
            );
            self.all_to_all(a, b, &words)?;
        }
        // This rank's first disagreement, and its largest block, for every rank to see.
        let bad = (0..n).find(|&s| theirs[s] != recv_counts[s] as u64);
        let report = [
            bad.map_or(u64::MAX, |s| s as u64),
            bad.map_or(0, |s| theirs[s]),
            bad.map_or(0, |s| recv_counts[s] as u64),
            sends.iter().map(|r| r.len() as u64).max().unwrap_or(0),
        ];
        let mut reports = vec![0u64; 4 * n];
        let verdict = Call { count: 4, ..words };
        self.all_gather(
            bytemuck::cast_slice(&report),
            bytemuck::cast_slice_mut(&mut reports),
            &verdict,
        )?;
        if let Some((d, r)) = reports
            .chunks_exact(4)
            .enumerate()
            .find(|(_, r)| r[0] != u64::MAX)
        {
            let s = r[0] as usize;
            let peer = if me == s { d } else { s };
            return Err(Error::Mismatch {
                rank: me,
                peer,
                op: Op::AllToAllV,
                detail: format!(
                    "rank {s} sends {} element(s) to rank {d}, which expects {} from it \
                     (send_counts[{d}] of rank {s} against recv_counts[{s}] of rank {d})",
                    r[1], r[2]
                ),
            });
        }
        let largest = reports.chunks_exact(4).map(|r| r[3] as usize).max();
        let largest = largest.unwrap_or(0);
        self.exchange_blocks(input, &sends, output, &recvs, largest, call)
    }

    /// Every rank's byte range `sends[d]` of `input` to rank d, rank s's into `recvs[s]` of
    /// `output`; `largest` is the largest block of any rank (the same on every rank: the
    /// direct collectives' rounds follow it).
    pub(super) fn exchange_blocks(
        &mut self,
        input: &[u8],
        sends: &[Range<usize>],
        output: &mut [u8],
        recvs: &[Range<usize>],
        largest: usize,
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        copy(
            &mut output[recvs[g.rank].clone()],
            &input[sends[g.rank].clone()],
        );
        match self.shape.all_to_all(largest) {
            AllToAll::Direct => {
                let direct = direct(&mut self.direct, call)?;
                let channels = &mut self.net.channels;
                direct.all_to_all(input, sends, output, recvs, largest, call, channels)
            }
            // Every block padded to the largest: the rounds move blocks of one length.
            AllToAll::Bruck => {
                let mut padded = vec![0u8; 2 * g.size * largest];
                let (outgoing, incoming) = padded.split_at_mut(g.size * largest);
                for (d, r) in sends.iter().enumerate() {
                    copy(&mut outgoing[d * largest..][..r.len()], &input[r.clone()]);
                }
                let scratch = &mut self.scratch;
                bruck::all_to_all(
                    &mut self.net,
                    &g,
                    scratch,
                    outgoing,
                    incoming,
                    largest,
                    call,
                )?;
                for (s, r) in recvs.iter().enumerate().filter(|&(s, _)| s != g.rank) {
                    copy(&mut output[r.clone()], &incoming[s * largest..][..r.len()]);
                }
                Ok(())
            }
            AllToAll::Pairwise => {
                if self.shape.pairwise_announces() {
                    let neighbours = ring::neighbour_headers(&g);
                    self.net.run(&neighbours, Buffers::none(), None, call)?;
                }
                let others = (0..g.size).filter(|&p| p != g.rank);
                self.net.reach(others.map(|p| g.channel_to(p, 0)), call)?;
                let span = |r: &Range<usize>, input: bool| match input {
                    true => Span::input(r.start, r.len()),
                    false => Span::output(r.start, r.len()),
                };
                let plan =
                    mesh::exchange(&g, |p| span(&sends[p], true), |p| span(&recvs[p], false));
                let bufs = Buffers::new(Some(input), output);
                self.net.run(&plan, bufs, None, call)
            }
        }
    }

    /// All-gather of blocks of `counts[r]` elements of `elem` bytes.
    pub(crate) fn all_gather_v(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        counts: &[usize],
        elem: usize,
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        let blocks = blocks_of(counts, elem);
        let largest = blocks.iter().map(Range::len).max().unwrap_or(0);
        match self.shape.all_gather_v(largest, output.len()) {
            AllGatherV::Direct => {
                let direct = direct(&mut self.direct, call)?;
                let channels = &mut self.net.channels;
                direct.gather_blocks(input, output, &blocks, None, call, channels)
            }
            AllGatherV::Padded => {
                let mut spare = std::mem::take(&mut self.spare);
                let all = spare.bytes(largest * (g.size + 1));
                let (padded, gathered) = all.split_at_mut(largest);
                copy(&mut padded[..input.len()], input);
                let result = self.all_gather(padded, gathered, call);
                if result.is_ok() {
                    for (r, block) in blocks.iter().enumerate() {
                        copy(
                            &mut output[block.clone()],
                            &gathered[r * largest..][..block.len()],
                        );
                    }
                }
                self.spare = spare;
                result
            }
            AllGatherV::Ring => {
                copy(&mut output[blocks[g.rank].clone()], input);
                let plan = ring::all_gather_v(&g, &blocks);
                let bufs = Buffers::new(None, output);
                self.net.run(&plan, bufs, None, call)
            }
        }
    }

    /// Reduce-scatter of parts of `counts[r]` elements.
    pub(crate) fn reduce_scatter_v(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        counts: &[usize],
        reducer: &Reducer,
        call: &Call,
    ) -> Result<()> {
        let (g, elem) = (self.geometry, reducer.elem_size());
        let largest = counts.iter().max().copied().unwrap_or(0) * elem;
        let offset: usize = counts[..g.rank].iter().sum::<usize>() * elem;
        let mut spare = std::mem::take(&mut self.spare);
        let result = match self.shape.reduce_scatter_v(largest, input.len()) {
            ReduceScatterV::Padded => {
                let all = spare.bytes(largest * (g.size + 1));
                let (padded, part) = all.split_at_mut(largest * g.size);
                for (r, part) in blocks_of(counts, elem).into_iter().enumerate() {
                    copy(&mut padded[r * largest..][..part.len()], &input[part]);
                }
                let result = self.reduce_scatter(padded, part, reducer, call);
                if result.is_ok() {
                    copy(output, &part[..output.len()]);
                }
                result
            }
            ReduceScatterV::AllReduce => {
                let all = spare.bytes(input.len());
                let result = self.all_reduce(Some(input), all, reducer, call);
                if result.is_ok() {
                    copy(output, &all[offset..offset + output.len()]);
                }
                result
            }
        };
        self.spare = spare;
        result
    }
}

/// The byte ranges of consecutive blocks of `counts[r]` elements of `elem` bytes.
fn blocks_of(counts: &[usize], elem: usize) -> Vec<Range<usize>> {
    let mut at = 0;
    counts
        .iter()
        .map(|&c| {
            let block = at * elem..(at + c) * elem;
            at += c;
            block
        })
        .collect()
}
