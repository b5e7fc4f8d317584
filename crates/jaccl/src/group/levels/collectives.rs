//! The collectives that go in two levels ([`Levels`]). Each element is reduced within its
//! host first (in the order of the host's reduce-scatter), then across hosts (in the order of
//! the cross group's all-reduce, reduce or reduce-scatter), the same on every rank: the result is
//! bit-identical on every rank and from run to run. `Avg` is summed on both levels, for the
//! caller to divide once.

use std::collections::VecDeque;
use std::ops::Range;

use super::super::{Group, Request};
use super::{Level, Levels};
use crate::algo::call::Call;
use crate::algo::hosts::{ALL_REDUCE_CHUNK_MIN, GATHER_CHUNK_MIN, two_level_chunks};
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Result};
use crate::liveness::INTERRUPT_EVERY;
use crate::reduce::copy;

impl Levels {
    /// The all-reduce of `input` (else `output`, in place) with `op` into `output`, elements
    /// of `dtype`, for the group's `call`: the host reduce-scatters, the ranks of each local
    /// rank all-reduce their slice across hosts, the host all-gathers ([`Levels::in_chunks`]).
    pub(in crate::group) fn all_reduce(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        call: &Call,
    ) -> Result<()> {
        let op = summed(op);
        let chunks = two_level_chunks(output.len(), ALL_REDUCE_CHUNK_MIN);
        let parts = slices(output.len(), chunks, self.local.size(), dtype);
        self.in_chunks(
            chunks,
            call,
            (input, output),
            |levels, (input, output), c| {
                let (bytes, counts) = parts(c);
                let whole = &input.unwrap_or(&**output)[bytes];
                levels.host_slice(whole, &counts, dtype, op, call)
            },
            move |cross, mut slice: Vec<u8>| {
                cross.all_reduce_raw_in_place(&mut slice, dtype, op)?;
                Ok(slice)
            },
            |levels, (_, output), c, slice| {
                let (bytes, counts) = parts(c);
                levels.host_gather(&slice, &mut output[bytes], &counts, dtype, call)
            },
        )
    }

    /// The reduce of `input` with `op` into `output` of the group's `call.root` (elsewhere
    /// not written): the host reduce-scatters, the ranks of each local rank reduce their slice
    /// across hosts to the root's host, whose ranks gather the slices to the root
    /// ([`Levels::in_chunks`]). Across hosts it moves what the all-reduce's level does (the
    /// cross group's reduce of slices of 64 KiB or more is its all-reduce); the gain is the
    /// host's last part, which gathers to one rank instead of all.
    pub(in crate::group) fn reduce(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        call: &Call,
    ) -> Result<()> {
        let op = summed(op);
        let chunks = two_level_chunks(input.len(), ALL_REDUCE_CHUNK_MIN);
        let parts = slices(input.len(), chunks, self.local.size(), dtype);
        let (root_host, root_here) = self.place_of(call.root)?;
        let on_root_host = root_host == self.hosts.host();
        self.in_chunks(
            chunks,
            call,
            (input, output),
            |levels, (input, _), c| {
                let (bytes, counts) = parts(c);
                levels.host_slice(&input[bytes], &counts, dtype, op, call)
            },
            move |cross, slice: Vec<u8>| {
                let mut reduced = match cross.rank() == root_host {
                    true => vec![0u8; slice.len()],
                    false => Vec::new(),
                };
                cross.reduce_raw(&slice, &mut reduced, dtype, op, root_host)?;
                Ok(reduced)
            },
            |levels, (_, output), c, reduced| {
                if !on_root_host {
                    return Ok(());
                }
                let (bytes, counts) = parts(c);
                let block = block_of(&counts, dtype);
                let mut padded = reduced;
                padded.resize(block, 0);
                let is_root = levels.local.rank() == root_here;
                let mut gathered = vec![0u8; if is_root { block * counts.len() } else { 0 }];
                levels
                    .local
                    .gather_raw(&padded, &mut gathered, dtype, root_here)
                    .map_err(|e| levels.in_group(e, Level::Host, call))?;
                if is_root {
                    for (message, blocks) in in_blocks(bytes.start, &counts, dtype) {
                        copy(&mut output[message], &gathered[blocks]);
                    }
                }
                Ok(())
            },
        )
    }

    /// The broadcast of `data` from the group's `call.root`: the root scatters it over the
    /// ranks of its host, the ranks of each local rank broadcast their slice across hosts from
    /// the root's host, and every host all-gathers the slices ([`Levels::in_chunks`]).
    pub(in crate::group) fn broadcast(
        &mut self,
        data: &mut [u8],
        dtype: Dtype,
        call: &Call,
    ) -> Result<()> {
        let chunks = two_level_chunks(data.len(), GATHER_CHUNK_MIN);
        let parts = slices(data.len(), chunks, self.local.size(), dtype);
        let (root_host, root_here) = self.place_of(call.root)?;
        let on_root_host = root_host == self.hosts.host();
        self.in_chunks(
            chunks,
            call,
            data,
            |levels, data, c| {
                let (bytes, counts) = parts(c);
                let block = block_of(&counts, dtype);
                let mut slice = vec![0u8; block];
                if on_root_host {
                    let mut blocks = Vec::new();
                    if levels.local.rank() == root_here {
                        blocks = vec![0u8; block * counts.len()];
                        for (message, at) in in_blocks(bytes.start, &counts, dtype) {
                            copy(&mut blocks[at], &data[message]);
                        }
                    }
                    levels
                        .local
                        .scatter_raw(&blocks, &mut slice, dtype, root_here)
                        .map_err(|e| levels.in_group(e, Level::Host, call))?;
                }
                Ok(slice)
            },
            move |cross, mut slice: Vec<u8>| {
                cross.broadcast_raw(&mut slice, dtype, root_host)?;
                Ok(slice)
            },
            |levels, data, c, slice| {
                let (bytes, counts) = parts(c);
                levels.host_gather(&slice, &mut data[bytes], &counts, dtype, call)
            },
        )
    }

    /// The all-gather of `input` (every rank's block) into `output`, in rank order: the ranks
    /// of each local rank gather their blocks across hosts, then the host gathers what its
    /// ranks hold, which comes by local rank, then host, and is put in rank order
    /// ([`Levels::in_chunks`] of the block).
    pub(in crate::group) fn all_gather(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        call: &Call,
    ) -> Result<()> {
        let block = input.len();
        let (chunks, bytes) = block_chunks(block, output.len(), dtype);
        let hosts = self.hosts.count();
        self.in_chunks(
            chunks,
            call,
            (input, output),
            |_, (input, _), c| Ok(input[bytes(c)].to_vec()),
            move |cross, mine: Vec<u8>| {
                let mut across = vec![0u8; hosts * mine.len()];
                cross.all_gather_raw(&mine, &mut across, dtype)?;
                Ok(across)
            },
            |levels, (_, output), c, across| {
                let mut gathered = vec![0u8; across.len() * levels.local.size()];
                levels
                    .local
                    .all_gather_raw(&across, &mut gathered, dtype)
                    .map_err(|e| levels.in_group(e, Level::Host, call))?;
                let bytes = bytes(c);
                for (rank, at) in levels.by_local_rank_then_host(bytes.len()) {
                    copy(
                        &mut output[rank * block + bytes.start..][..bytes.len()],
                        &gathered[at],
                    );
                }
                Ok(())
            },
        )
    }

    /// The reduce-scatter with `op` of `input` (a block for every rank, in rank order) into
    /// `output` (this rank's block): the host reduce-scatters the blocks ordered by local rank,
    /// then host, each rank keeping those of its local rank on every host, which the ranks of
    /// each local rank then reduce-scatter across hosts ([`Levels::in_chunks`] of the block).
    pub(in crate::group) fn reduce_scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: Dtype,
        op: ReduceOp,
        call: &Call,
    ) -> Result<()> {
        let op = summed(op);
        let block = output.len();
        let (chunks, bytes) = block_chunks(block, input.len(), dtype);
        let hosts = self.hosts.count();
        self.in_chunks(
            chunks,
            call,
            (input, output),
            |levels, (input, _), c| {
                let bytes = bytes(c);
                let len = bytes.len();
                let mut arranged = vec![0u8; input.len() / block.max(1) * len];
                for (rank, at) in levels.by_local_rank_then_host(len) {
                    copy(
                        &mut arranged[at],
                        &input[rank * block + bytes.start..][..len],
                    );
                }
                let mut partial = vec![0u8; hosts * len];
                levels
                    .local
                    .reduce_scatter_raw(&arranged, &mut partial, dtype, op)
                    .map_err(|e| levels.in_group(e, Level::Host, call))?;
                Ok(partial)
            },
            move |cross, partial: Vec<u8>| {
                let mut mine = vec![0u8; partial.len() / hosts.max(1)];
                cross.reduce_scatter_raw(&partial, &mut mine, dtype, op)?;
                Ok(mine)
            },
            |_, (_, output), c, mine| {
                copy(&mut output[bytes(c)], &mine);
                Ok(())
            },
        )
    }

    /// The host of the group's rank `root` and its place among that host's ranks: the ranks
    /// of the cross group and of that host's group that stand for it.
    fn place_of(&self, root: usize) -> Result<(usize, usize)> {
        self.hosts.place_of(root).ok_or_else(|| {
            Error::InvalidArgument(format!("root {root} is not a rank of the group"))
        })
    }

    /// This rank's slice of `whole` (`counts` elements for each of the host's ranks) reduced
    /// with `op` over the host: the host's first part of the all-reduce and the reduce.
    fn host_slice(
        &mut self,
        whole: &[u8],
        counts: &[usize],
        dtype: Dtype,
        op: ReduceOp,
        call: &Call,
    ) -> Result<Vec<u8>> {
        let mut slice = vec![0u8; counts[self.local.rank()] * dtype.size()];
        self.local
            .reduce_scatter_v_raw(whole, &mut slice, counts, dtype, op)
            .map_err(|e| self.in_group(e, Level::Host, call))?;
        Ok(slice)
    }

    /// Gathers every rank's slice (`counts` elements each; this rank's at the start of
    /// `slice`) into `whole` over the host: the host's last part of the all-reduce and the
    /// broadcast.
    fn host_gather(
        &mut self,
        slice: &[u8],
        whole: &mut [u8],
        counts: &[usize],
        dtype: Dtype,
        call: &Call,
    ) -> Result<()> {
        let mine = &slice[..counts[self.local.rank()] * dtype.size()];
        self.local
            .all_gather_v_raw(mine, whole, counts, dtype)
            .map_err(|e| self.in_group(e, Level::Host, call))
    }

    /// Runs a collective chunk by chunk: for each chunk, the host's first part on this thread
    /// (`host_first`), the network's part on the cross group's progress thread (`across`),
    /// then the host's last part (`host_then`), so that the network works on one chunk while
    /// the host works on the next. `data` is the call's buffers, which both host parts use.
    fn in_chunks<D, T, U>(
        &mut self,
        chunks: usize,
        call: &Call,
        mut data: D,
        mut host_first: impl FnMut(&mut Levels, &mut D, usize) -> Result<T>,
        across: impl FnOnce(&mut Group, T) -> Result<U> + Clone + Send + 'static,
        mut host_then: impl FnMut(&mut Levels, &mut D, usize, U) -> Result<()>,
    ) -> Result<()>
    where
        T: Send + 'static,
        U: Send + 'static,
    {
        self.act_for(call);
        let mut pending = VecDeque::new();
        for c in 0..chunks {
            let ready = host_first(self, &mut data, c)?;
            let job = across.clone();
            pending.push_back((c, self.cross.start(move |g| job(g, ready))));
            // One chunk on the network while the host works on the next; after the last, all.
            while pending.len() > 1 || (c + 1 == chunks && !pending.is_empty()) {
                if let Some((done, request)) = pending.pop_front() {
                    let result = self.wait_across(request, call)?;
                    host_then(self, &mut data, done, result)?;
                }
            }
        }
        Ok(())
    }

    /// Every rank of the group with the bytes of its block of `block` bytes in a buffer of
    /// every rank's block ordered by local rank, then host: what the host's level gathers
    /// after the level across hosts, and reduce-scatters before it.
    fn by_local_rank_then_host(&self, block: usize) -> Vec<(usize, Range<usize>)> {
        let (hosts, here) = (self.hosts.count(), self.hosts.local_size());
        (0..here * hosts)
            .map(|i| {
                let rank = self.hosts.ranks_on(i % hosts)[i / hosts];
                (rank, i * block..(i + 1) * block)
            })
            .collect()
    }

    /// The network's part of a chunk, once done; meanwhile the group's interrupt check is
    /// asked (the cross group's progress thread does not ask it).
    fn wait_across<T>(&self, across: Request<T>, call: &Call) -> Result<T> {
        while !across.wait_timeout(INTERRUPT_EVERY) {
            if let Some(group) = &self.group {
                group.check_interrupt(call.op, call.interruptible)?;
            }
        }
        across
            .wait()
            .map_err(|e| self.in_group(e, Level::Across, call))
    }
}

/// The reduction both levels apply for `op`: `Avg` is summed, then divided once by the caller.
fn summed(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg => ReduceOp::Sum,
        other => other,
    }
}

/// How a two-level all-gather or reduce-scatter of a buffer of `whole` bytes cuts each block of
/// `block` bytes of `dtype`: how many chunks, and the bytes of chunk `c` within the block.
fn block_chunks(
    block: usize,
    whole: usize,
    dtype: Dtype,
) -> (usize, impl Fn(usize) -> Range<usize> + Copy) {
    let size = dtype.size();
    let count = block / size;
    let chunks = two_level_chunks(whole, GATHER_CHUNK_MIN).min(count.max(1));
    let bytes = move |c: usize| {
        let span = part(count, chunks, c);
        span.start * size..span.end * size
    };
    (chunks, bytes)
}

/// How a two-level all-reduce or reduce of a message of `bytes` in `chunks` cuts chunk `c`:
/// its bytes in the message, and the elements of it each of the host's `ranks` reduces.
fn slices(
    bytes: usize,
    chunks: usize,
    ranks: usize,
    dtype: Dtype,
) -> impl Fn(usize) -> (Range<usize>, Vec<usize>) + Copy {
    let size = dtype.size();
    let count = bytes / size;
    move |c| {
        let span = part(count, chunks, c);
        let counts = (0..ranks)
            .map(|r| part(span.len(), ranks, r).len())
            .collect();
        (span.start * size..span.end * size, counts)
    }
}

/// The bytes of a block that holds the longest of slices of `counts` elements of `dtype`: the
/// host's gather and scatter move the slices, which differ by an element at most, in blocks
/// of one length.
fn block_of(counts: &[usize], dtype: Dtype) -> usize {
    counts.iter().max().copied().unwrap_or(0) * dtype.size()
}

/// Where each slice of `counts` elements of `dtype` is in the message (the first from byte
/// `start`) and in blocks of [`block_of`] bytes.
fn in_blocks(
    start: usize,
    counts: &[usize],
    dtype: Dtype,
) -> impl Iterator<Item = (Range<usize>, Range<usize>)> {
    let block = block_of(counts, dtype);
    let message = counts.iter().scan(start, move |at, &n| {
        let len = n * dtype.size();
        *at += len;
        Some(*at - len..*at)
    });
    let at =
        move |(r, span): (usize, Range<usize>)| (span.clone(), r * block..r * block + span.len());
    message.enumerate().map(at)
}

/// Part `i` of `n` near-equal parts of `0..count` (the first `count % n` one longer).
fn part(count: usize, n: usize, i: usize) -> Range<usize> {
    let (base, extra) = (count / n, count % n);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}
