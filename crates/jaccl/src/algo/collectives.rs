//! [`Collectives`]: the collectives of one group, each run by the algorithm that
//! [`super::select`] picks for its size and the group's shape.

use std::sync::Arc;

use super::direct::Direct;
use super::engine::{Buffers, Call, Channel, Network, Scratch};
use super::geometry::Geometry;
use super::plan::{Plan, Span};
use super::select::{AllGather, AllReduce, ReduceScatter, Shape, SmallGather};
use super::{doubling, mesh, p2p, ring};
use crate::error::{Error, Result};
use crate::liveness::Liveness;
use crate::reduce::{Reducer, copy};
use crate::transport::shm::Board;

/// A group's channels and algorithms.
pub(crate) struct Collectives {
    geometry: Geometry,
    shape: Shape,
    net: Network,
    /// The direct collectives, when every rank shares memory with this one.
    direct: Option<Direct>,
    scratch: Scratch,
}

impl Collectives {
    /// The collectives over `channels` (laid out as [`Geometry`] says). `rdma` says whether any
    /// pair of ring neighbours in the group uses RDMA, `board` gives every rank's shared memory
    /// when all are on this host: every rank must pass the same, so that all choose alike.
    pub(crate) fn new(
        geometry: Geometry,
        mut channels: Vec<Channel>,
        liveness: Arc<Liveness>,
        rdma: bool,
        board: Option<Arc<Board>>,
    ) -> Collectives {
        let direct =
            board.map(|b| Direct::new(geometry.rank, geometry.size, b, Arc::clone(&liveness)));
        if let Some(direct) = &direct {
            // A send or receive waiting on a peer that entered a direct collective fails.
            for ch in &mut channels {
                ch.watch(direct.ahead(ch.peer()));
            }
        }
        Collectives {
            geometry,
            shape: geometry.shape(rdma, direct.is_some()),
            net: Network { channels, liveness },
            direct,
            scratch: Scratch::default(),
        }
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Whether every rank shares memory with this one (the direct collectives).
    pub(crate) fn shares_memory_with_all(&self) -> bool {
        self.direct.is_some()
    }

    /// All-reduce of `output.len()` bytes: `input` into `output`, or in place when `input` is
    /// `None`. Every way reduces each element in one fixed order, so every rank gets the same
    /// bits.
    pub(crate) fn all_reduce(
        &mut self,
        input: Option<&[u8]>,
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        let bytes = output.len();
        match self.shape.all_reduce(bytes) {
            AllReduce::Direct => {
                let shape = self.shape;
                let direct = direct(&mut self.direct, call)?;
                direct.all_reduce(input, output, reducer, call, &mut self.net.channels, &shape)
            }
            AllReduce::Doubling => {
                let partners = partners(&g, call)?;
                let scratch = &mut self.scratch;
                doubling::all_reduce(
                    &mut self.net,
                    &g,
                    scratch,
                    input,
                    output,
                    reducer,
                    call,
                    &partners,
                )
            }
            AllReduce::Ring => {
                let elem = reducer.elem_size();
                let plan = ring::all_reduce(&g, bytes / elem, elem, input.is_none());
                self.net
                    .run(&plan, Buffers { input, output }, Some(reducer), call)
            }
            AllReduce::Gather(how) => {
                // Every rank's vector, reduced here in rank order.
                let all = self.scratch.bytes(g.size * bytes);
                copy(
                    &mut all[g.rank * bytes..(g.rank + 1) * bytes],
                    input.unwrap_or(output),
                );
                let bufs = Buffers {
                    input: None,
                    output: all,
                };
                self.net
                    .run(&small_gather(&g, how, bytes), bufs, None, call)?;
                fold_in_rank_order(output, all, reducer);
                Ok(())
            }
        }
    }

    /// All-gather of `input` into `output` (`size` blocks of `input.len()` bytes).
    pub(crate) fn all_gather(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        call: &Call,
    ) -> Result<()> {
        let (g, block) = (self.geometry, input.len());
        match self.shape.all_gather(block) {
            AllGather::Direct => {
                let direct = direct(&mut self.direct, call)?;
                direct.all_gather(input, output, call, &mut self.net.channels)
            }
            choice => {
                copy(&mut output[g.rank * block..(g.rank + 1) * block], input);
                self.gather(choice, output, block, call)
            }
        }
    }

    /// Returns once every rank has entered: an all-gather of one-byte tokens.
    pub(crate) fn barrier(&mut self, call: &Call) -> Result<()> {
        match self.shape.all_gather(1) {
            AllGather::Direct => {
                direct(&mut self.direct, call)?.barrier(call, &mut self.net.channels)
            }
            choice => {
                let mut tokens = std::mem::take(&mut self.scratch);
                let result = self.gather(choice, tokens.bytes(self.geometry.size), 1, call);
                self.scratch = tokens;
                result
            }
        }
    }

    /// Gathers every rank's block of `block` bytes into `output`, whose own block is filled.
    fn gather(
        &mut self,
        choice: AllGather,
        output: &mut [u8],
        block: usize,
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        let plan = match choice {
            AllGather::Doubling => {
                let partners = partners(&g, call)?;
                return doubling::all_gather(&mut self.net, &g, output, block, call, &partners);
            }
            AllGather::Small(how) => small_gather(&g, how, block),
            AllGather::Ring | AllGather::Direct => ring::all_gather(&g, block),
        };
        let bufs = Buffers {
            input: None,
            output,
        };
        self.net.run(&plan, bufs, None, call)
    }

    /// Reduce-scatter of `input` (`size` blocks of `output.len()` bytes) into `output`.
    pub(crate) fn reduce_scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        let bytes = output.len();
        match self.shape.reduce_scatter(bytes) {
            ReduceScatter::Direct => {
                let direct = direct(&mut self.direct, call)?;
                direct.reduce_scatter(input, output, reducer, call, &mut self.net.channels)
            }
            ReduceScatter::Exchange => {
                // Each block straight to its rank, which reduces them in rank order.
                let all = self.scratch.bytes(g.size * bytes);
                let own = g.rank * bytes..(g.rank + 1) * bytes;
                copy(&mut all[own.clone()], &input[own]);
                let plan = mesh::exchange_with_all(&g, bytes, |p| Span::input(p * bytes, bytes));
                let bufs = Buffers {
                    input: Some(input),
                    output: all,
                };
                self.net.run(&plan, bufs, None, call)?;
                fold_in_rank_order(output, all, reducer);
                Ok(())
            }
            ReduceScatter::Halving => {
                let partners = partners(&g, call)?;
                doubling::reduce_scatter(
                    &mut self.net,
                    &g,
                    &mut self.scratch,
                    input,
                    output,
                    reducer,
                    call,
                    &partners,
                )
            }
            ReduceScatter::Ring => {
                let elem = reducer.elem_size();
                let plan = ring::reduce_scatter(&g, bytes / elem, elem);
                let bufs = Buffers {
                    input: Some(input),
                    output,
                };
                self.net.run(&plan, bufs, Some(reducer), call)
            }
        }
    }

    /// Sends `data` to `dst`.
    pub(crate) fn send(&mut self, data: &[u8], dst: usize, call: &Call) -> Result<()> {
        let plan = p2p::send(&self.geometry, data.len(), dst);
        let bufs = Buffers {
            input: Some(data),
            output: &mut [],
        };
        self.net.run(&plan, bufs, None, call)
    }

    /// Receives into `out` from `src`.
    pub(crate) fn recv(&mut self, out: &mut [u8], src: usize, call: &Call) -> Result<()> {
        let plan = p2p::recv(&self.geometry, out.len(), src);
        let bufs = Buffers {
            input: None,
            output: out,
        };
        self.net.run(&plan, bufs, None, call)
    }
}

/// The plan of a small gather of `block` bytes per rank.
fn small_gather(g: &Geometry, how: SmallGather, block: usize) -> Plan {
    match how {
        SmallGather::Exchange => mesh::gather(g, block),
        SmallGather::BothWays => ring::gather_both_ways(g, block),
    }
}

/// The direct collectives that [`Shape::direct`] promised.
fn direct<'a>(direct: &'a mut Option<Direct>, call: &Call) -> Result<&'a mut Direct> {
    direct
        .as_mut()
        .ok_or_else(|| internal(call, "no shared memory for a direct collective"))
}

/// The doubling partners that [`Shape::pairs`] promised.
fn partners(g: &Geometry, call: &Call) -> Result<Vec<usize>> {
    g.doubling_partners()
        .ok_or_else(|| internal(call, "the ranks do not pair up for recursive doubling"))
}

fn internal(call: &Call, what: &str) -> Error {
    let bug = std::io::Error::other(format!("internal error: {what}"));
    Error::io(call.rank, call.op, bug)
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
