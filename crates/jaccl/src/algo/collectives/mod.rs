//! [`Collectives`]: the collectives of one group, each run by the algorithm that
//! [`super::select`] picks for its size and the group's shape.

use std::sync::Arc;

mod uneven;

use super::call::{Buffers, Call};
use super::channel::Channel;
use super::cost::{DEFAULT_REDUCE_RATE, Rates};
use super::engine::{LateLinks, Network, Rounds, Scratch};
use super::geometry::{DoublingRole, Geometry, blocks_by_distance, blocks_by_rank};
use super::hosts::AcrossHosts;
use super::hosts::HostLayout;
use super::plan::Span;
use super::pricing::ByModel;
use super::select::{AllGather, AllReduce, Barrier, Broadcast, ReduceScatter, Rooted, Shape};
use super::shared_memory::{Direct, equal_blocks};
use super::{bruck, doubling, halving, host_doubling, mesh, p2p, rabenseifner, ring, tree};
use crate::config::LinkSpeed;
use crate::dtype::{Dtype, ReduceOp};
use crate::error::{Error, Result};
use crate::liveness::Liveness;
use crate::reduce::{Reducer, copy};
use crate::transport::shm::Board;

/// An all-reduce among any number of ranks, by their part in recursive doubling.
type AmongAnyNumber = fn(
    &mut Network,
    &Geometry,
    &mut Scratch,
    Option<&[u8]>,
    &mut [u8],
    &Reducer,
    &Call,
    &DoublingRole,
) -> Result<()>;

/// A group's channels and algorithms.
pub(crate) struct Collectives {
    geometry: Geometry,
    shape: Shape,
    /// With the links' figures (`Config::link`), the all-reduce the cost model prices least.
    by_model: Option<ByModel>,
    net: Network,
    /// The direct collectives, when every rank shares memory with this one.
    direct: Option<Direct>,
    scratch: Scratch,
    /// A second buffer, for what a call keeps while the algorithm it calls uses `scratch`.
    spare: Scratch,
    /// The sender of the last receive from any rank: the next one looks at the others first.
    last_source: usize,
    /// Which ranks share a host, where they are on several: the trees cross to each host once.
    hosts: Option<HostLayout>,
}

impl Collectives {
    /// Bytes sent to and received from the peers `across` names, over the channels since the
    /// group started (the direct collectives read shared memory, not channels).
    pub(crate) fn bytes_with(&self, across: impl Fn(usize) -> bool) -> AcrossHosts {
        self.net
            .channels
            .iter()
            .filter(|ch| across(ch.peer))
            .map(|ch| AcrossHosts {
                sent: ch.bytes_sent,
                received: ch.bytes_received,
            })
            .fold(AcrossHosts::default(), |sum, ch| sum + ch)
    }

    /// The collectives over `channels` (laid out as [`Geometry`] says). `rdma` says whether any
    /// pair of ring neighbours in the group uses RDMA, `board` gives every rank's shared memory
    /// when all are on this host, `link` the links' figures: every rank must pass the same,
    /// so that all choose alike.
    pub(crate) fn new(
        geometry: Geometry,
        mut channels: Vec<Channel>,
        liveness: Arc<Liveness>,
        rdma: bool,
        board: Option<Arc<Board>>,
        late: Option<Box<dyn LateLinks>>,
        link: Option<LinkSpeed>,
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
            by_model: link.map(|l| ByModel::new(Rates::of_link(&l, DEFAULT_REDUCE_RATE))),
            net: Network {
                channels,
                liveness,
                late,
            },
            direct,
            scratch: Scratch::default(),
            spare: Scratch::default(),
            last_source: geometry.rank,
            hosts: None,
        }
    }

    /// Tells the choices where the ranks are ([`Shape::on_hosts`], [`Shape::host_blocks`]), and
    /// the trees (`tree::broadcast`, `tree::reduce`).
    pub(crate) fn set_hosts(&mut self, hosts: &HostLayout) {
        self.shape.on_hosts = hosts.even();
        self.shape.host_blocks = hosts.blocks();
        self.shape.scattered_hosts = hosts.count() > 1 && !hosts.contiguous();
        self.shape.shared_hosts = hosts.count() > 1 && hosts.count() < self.geometry.size;
        self.hosts = (hosts.count() > 1).then(|| hosts.clone());
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
        let choice = match &mut self.by_model {
            Some(model) => model.all_reduce(&self.shape, &g, bytes, reducer.elem_size()),
            None => self.shape.all_reduce(bytes),
        };
        match choice {
            AllReduce::Direct => {
                let shape = self.shape;
                let direct = direct(&mut self.direct, call)?;
                direct.all_reduce(input, output, reducer, call, &mut self.net.channels, &shape)
            }
            AllReduce::Doubling => {
                self.among_any_number(doubling::all_reduce, input, output, reducer, call)
            }
            AllReduce::DoublingOnHosts(per_host) => {
                let (net, scratch) = (&mut self.net, &mut self.scratch);
                host_doubling::all_reduce(net, &g, scratch, input, output, reducer, call, per_host)
            }
            AllReduce::Rabenseifner => {
                self.among_any_number(rabenseifner::all_reduce, input, output, reducer, call)
            }
            AllReduce::Ring => {
                let elem = reducer.elem_size();
                let plan = ring::all_reduce(&g, bytes / elem, elem, input.is_none());
                self.net
                    .run(&plan, Buffers::new(input, output), Some(reducer), call)
            }
            AllReduce::Gather(how) => {
                // Every rank's vector, reduced here in rank order.
                let all = self.scratch.bytes(g.size * bytes);
                copy(
                    &mut all[g.rank * bytes..(g.rank + 1) * bytes],
                    input.unwrap_or(output),
                );
                let bufs = Buffers::new(None, all);
                self.net
                    .run(&ring::small_gather(&g, how, bytes), bufs, None, call)?;
                fold_in_rank_order(output, all, reducer);
                Ok(())
            }
        }
    }

    /// Exchanges the header of `call` with both ring neighbours, and nothing else: for a call
    /// whose data goes through sub-groups, so that ranks whose calls differ still fail with
    /// a mismatch, as the headers of the ring's own plans would tell them.
    pub(crate) fn check_neighbours(&mut self, call: &Call) -> Result<()> {
        let plan = ring::neighbour_headers(&self.geometry);
        self.net.run(&plan, Buffers::none(), None, call)
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
                self.gather_with(choice, output, block, call)
            }
        }
    }

    /// Returns once every rank has entered: an all-gather of one-byte tokens.
    pub(crate) fn barrier(&mut self, call: &Call) -> Result<()> {
        match self.shape.barrier() {
            Barrier::Gather(AllGather::Direct) => {
                direct(&mut self.direct, call)?.barrier(call, &mut self.net.channels)
            }
            Barrier::Gather(choice) => {
                let mut tokens = std::mem::take(&mut self.spare);
                let result = self.gather_with(choice, tokens.bytes(self.geometry.size), 1, call);
                self.spare = tokens;
                result
            }
            Barrier::Doubling => {
                let reducer = Reducer::new(Dtype::UInt8, ReduceOp::BitOr)
                    .ok_or_else(|| internal(call, "bytes have no bitwise or"))?;
                self.among_any_number(doubling::all_reduce, None, &mut [1u8], &reducer, call)
            }
        }
    }

    /// All-reduce by `algorithm`, recursive doubling ([`doubling::all_reduce`]) or
    /// Rabenseifner's ([`rabenseifner::all_reduce`]), among any number of ranks: those beyond a
    /// power of two hand over their vectors ([`Geometry::doubling_role`]).
    fn among_any_number(
        &mut self,
        algorithm: AmongAnyNumber,
        input: Option<&[u8]>,
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
    ) -> Result<()> {
        let g = self.geometry;
        let role = g.doubling_role();
        let scratch = &mut self.scratch;
        algorithm(
            &mut self.net,
            &g,
            scratch,
            input,
            output,
            reducer,
            call,
            &role,
        )
    }

    /// Gathers every rank's block of `block` bytes into `output`, whose own block is filled.
    fn gather_with(
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
            AllGather::Bruck => {
                let scratch = &mut self.scratch;
                return bruck::all_gather(&mut self.net, &g, scratch, output, block, call);
            }
            AllGather::Small(how) => ring::small_gather(&g, how, block),
            AllGather::Ring | AllGather::Direct => ring::all_gather(&g, block),
        };
        let bufs = Buffers::new(None, output);
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
                let bufs = Buffers::new(Some(input), all);
                self.net.run(&plan, bufs, None, call)?;
                fold_in_rank_order(output, all, reducer);
                Ok(())
            }
            ReduceScatter::Halving => {
                // Where the ranks pair up on the ring or the mesh, with those partners; else
                // (a power of two over links made on first use) nearest first.
                let (net, scratch) = (&mut self.net, &mut self.scratch);
                match g.doubling_partners() {
                    Some(partners) => {
                        let (i, o) = (input, output);
                        doubling::reduce_scatter(net, &g, scratch, i, o, reducer, call, &partners)
                    }
                    None => halving::reduce_scatter(net, &g, scratch, input, output, reducer, call),
                }
            }
            ReduceScatter::Ring => {
                let elem = reducer.elem_size();
                let plan = ring::reduce_scatter(&g, bytes / elem, elem);
                let bufs = Buffers::new(Some(input), output);
                self.net.run(&plan, bufs, Some(reducer), call)
            }
        }
    }

    /// Sends `data` to `dst`.
    pub(crate) fn send(&mut self, data: &[u8], dst: usize, call: &Call) -> Result<()> {
        self.net.reach([self.geometry.channel_to(dst, 0)], call)?;
        let plan = p2p::send(&self.geometry, data.len(), dst);
        let bufs = Buffers::new(Some(data), &mut []);
        self.net.run(&plan, bufs, None, call)
    }

    /// Receives into `out` from `src`.
    pub(crate) fn recv(&mut self, out: &mut [u8], src: usize, call: &Call) -> Result<()> {
        self.net.reach([self.geometry.channel_to(src, 0)], call)?;
        let plan = p2p::recv(&self.geometry, out.len(), src);
        let bufs = Buffers::new(None, out);
        self.net.run(&plan, bufs, None, call)
    }

    /// Receives into `out` the next message from any rank (see `super::any_source`); returns
    /// the sender.
    pub(crate) fn recv_any(&mut self, out: &mut [u8], call: &Call) -> Result<usize> {
        let src = self
            .net
            .next_sender(&self.geometry, self.last_source, call)?;
        self.recv(out, src, call)?;
        self.last_source = src;
        Ok(src)
    }

    /// Broadcast of `data` from `call.root`.
    pub(crate) fn broadcast(&mut self, data: &mut [u8], call: &Call) -> Result<()> {
        let (g, root) = (self.geometry, call.root);
        let bufs = |output| Buffers::new(None, output);
        let eager = self.direct.as_ref().is_some_and(Direct::eager_allowed);
        match self.shape.broadcast(data.len()) {
            Broadcast::Eager if eager => {
                let direct = direct(&mut self.direct, call)?;
                direct.broadcast_eager(data, root, call, &mut self.net.channels)
            }
            Broadcast::Flat if eager => {
                // Its root only sends: checked later, as an eager broadcast's is.
                direct(&mut self.direct, call)?.count_broadcast(root);
                let plan = mesh::broadcast_flat(&g, root, data.len());
                self.net.run(&plan, bufs(data), None, call)
            }
            Broadcast::Eager | Broadcast::Flat | Broadcast::Direct => {
                let direct = direct(&mut self.direct, call)?;
                direct.broadcast(data, root, call, &mut self.net.channels)
            }
            Broadcast::Tree => {
                let plans = tree::broadcast(&g, self.hosts.as_ref(), root, data.len());
                Rounds::new(&mut self.net, &plans, call).run_all(data)
            }
            choice @ (Broadcast::Chain | Broadcast::WholeChains) => {
                let whole = choice == Broadcast::WholeChains;
                let lanes = ring::broadcast_lanes(&g, data.len(), whole);
                let plan = ring::broadcast(&g, root, &lanes);
                self.net.run(&plan, bufs(data), None, call)
            }
        }
    }

    /// Reduce of `input` to `call.root`'s `output` (elsewhere not written).
    pub(crate) fn reduce(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        reducer: &Reducer,
        call: &Call,
    ) -> Result<()> {
        let root = call.root;
        match self.shape.reduce(input.len()) {
            Rooted::Direct => {
                let shape = self.shape;
                let direct = direct(&mut self.direct, call)?;
                let channels = &mut self.net.channels;
                direct.reduce(input, output, root, reducer, call, channels, &shape)
            }
            Rooted::Tree => {
                let (g, bytes) = (self.geometry, input.len());
                let (plans, receives) = tree::reduce(&g, self.hosts.as_ref(), root, bytes);
                let mut spare = std::mem::take(&mut self.spare);
                // This rank's partial result: its input, then each child's reduced after it.
                let partial = match g.rank == root {
                    true => output,
                    false => spare.bytes(bytes),
                };
                copy(partial, input);
                let theirs = self.scratch.bytes(bytes);
                let mut rounds = Rounds::new(&mut self.net, &plans, call);
                let result = (0..plans.len()).try_for_each(|k| {
                    rounds.run(k, &mut *theirs, Some(&*partial))?;
                    if receives[k] {
                        reducer.accumulate(partial, theirs);
                    }
                    Ok(())
                });
                self.spare = spare;
                result
            }
            Rooted::ViaAll | Rooted::Chain => {
                if self.geometry.rank == root {
                    return self.all_reduce(Some(input), output, reducer, call);
                }
                let mut spare = std::mem::take(&mut self.spare);
                let result = self.all_reduce(Some(input), spare.bytes(input.len()), reducer, call);
                self.spare = spare;
                result
            }
        }
    }

    /// Gather of every rank's `input` into `call.root`'s `output`.
    pub(crate) fn gather(&mut self, input: &[u8], output: &mut [u8], call: &Call) -> Result<()> {
        let (g, root, block) = (self.geometry, call.root, input.len());
        let is_root = g.rank == root;
        match self.shape.gather(block) {
            Rooted::Direct => {
                let direct = direct(&mut self.direct, call)?;
                let blocks = equal_blocks(g.size, block);
                let channels = &mut self.net.channels;
                direct.gather_blocks(input, output, &blocks, Some(root), call, channels)
            }
            Rooted::Tree => {
                let plans = tree::gather(&g, root, block);
                let held = self.scratch.bytes(tree::subtree_blocks(&g, root) * block);
                copy(&mut held[..block], input);
                Rounds::new(&mut self.net, &plans, call).run_all(held)?;
                if is_root {
                    blocks_by_rank(output, held, root, block);
                }
                Ok(())
            }
            Rooted::ViaAll => {
                if is_root {
                    return self.all_gather(input, output, call);
                }
                let mut spare = std::mem::take(&mut self.spare);
                let result = self.all_gather(input, spare.bytes(g.size * block), call);
                self.spare = spare;
                result
            }
            Rooted::Chain => {
                let plan = ring::gather(&g, root, block);
                if is_root {
                    copy(&mut output[root * block..(root + 1) * block], input);
                    let bufs = Buffers::new(None, output);
                    return self.net.run(&plan, bufs, None, call);
                }
                let held = ring::chain_scratch_blocks(&g, root, true) * block;
                let bufs = Buffers::new(Some(input), self.scratch.bytes(held));
                self.net.run(&plan, bufs, None, call)
            }
        }
    }

    /// Scatter of `call.root`'s `input` (`size` blocks) to every rank's `output`.
    pub(crate) fn scatter(&mut self, input: &[u8], output: &mut [u8], call: &Call) -> Result<()> {
        let (g, root, block) = (self.geometry, call.root, output.len());
        match self.shape.scatter(block) {
            Rooted::Direct => {
                let direct = direct(&mut self.direct, call)?;
                direct.scatter(input, output, root, call, &mut self.net.channels)
            }
            Rooted::Tree => {
                let plans = tree::scatter(&g, root, block);
                let held = self.scratch.bytes(tree::subtree_blocks(&g, root) * block);
                if g.rank == root {
                    blocks_by_distance(held, input, root, block);
                }
                Rounds::new(&mut self.net, &plans, call).run_all(held)?;
                copy(output, &held[..block]);
                Ok(())
            }
            Rooted::ViaAll | Rooted::Chain => {
                let plan = ring::scatter(&g, root, block);
                if g.rank == root {
                    copy(output, &input[root * block..(root + 1) * block]);
                    let bufs = Buffers::new(Some(input), &mut []);
                    return self.net.run(&plan, bufs, None, call);
                }
                let held = ring::chain_scratch_blocks(&g, root, false) * block;
                let scratch = self.scratch.bytes(held);
                let bufs = Buffers::new(None, &mut *scratch);
                self.net.run(&plan, bufs, None, call)?;
                copy(output, &scratch[held - block..]);
                Ok(())
            }
        }
    }

    /// All-to-all of `size` equal blocks each way.
    pub(crate) fn all_to_all(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        call: &Call,
    ) -> Result<()> {
        let block = input.len() / self.geometry.size;
        let blocks = equal_blocks(self.geometry.size, block);
        self.exchange_blocks(input, &blocks, output, &blocks, block, call)
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
