//! A deterministic harness for the engine: every plan of the ring runs on all ranks, in one
//! thread, over in-memory fake links that misbehave as a real transport may. They take partial
//! writes of random size, offer received bytes one at a time (or a few, or many) so elements
//! arrive in pieces, fill up (small capacities), and answer readiness in a shuffled way:
//! spurious `Ready`s, ranks scheduled in random order, and a rank that sleeps is only woken when
//! a link it armed fires. So a plan that waits on the wrong link, forgets to arm one, or merges
//! a byte before it may (reduce-scatter's merge-after-send) deadlocks or computes a wrong
//! result here, reproducibly from the seed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng};
use rustix::event::PollFd;

use super::call::{Buffers, Call};
use super::channel::Channel;
use super::engine::Execution;
use super::geometry::Geometry;
use super::plan::{Plan, Span};
use super::waiting;
use super::{doubling, mesh, p2p, ring};
use crate::dtype::{Dtype, ReduceOp};
use crate::error::Op;
use crate::reduce::Reducer;
use crate::transport::{Interest, Link, LinkError, Readiness};
use crate::wait::WaitPolicy;

/// One direction of a fake connection.
#[derive(Default)]
struct Pipe {
    bytes: VecDeque<u8>,
    cap: usize,
    /// The reader armed for bytes / the writer armed for room, and whether that fired since.
    reader: Alarm,
    writer: Alarm,
}

#[derive(Default, Clone, Copy)]
struct Alarm {
    armed: bool,
    fired: bool,
}

impl Alarm {
    fn ring(&mut self) {
        self.fired |= self.armed;
    }
}

type Shared = Arc<Mutex<Pipe>>;

fn lock(p: &Shared) -> MutexGuard<'_, Pipe> {
    p.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct FakeLink {
    tx: Shared,
    rx: Shared,
    rng: TestRng,
    /// How many bytes were queued when `try_recv` last returned 0: readable again only when
    /// more arrived.
    stalled_at: Option<usize>,
}

impl FakeLink {
    /// A chunk size: often 1, often small, sometimes large.
    fn chunk(&mut self) -> usize {
        match self.rng.random_range(0..10) {
            0..=2 => 1,
            3..=6 => self.rng.random_range(2..64),
            _ => self.rng.random_range(64..8192),
        }
    }
}

impl Link for FakeLink {
    fn try_send(&mut self, parts: &[&[u8]]) -> Result<usize, LinkError> {
        let want = self.chunk();
        let mut tx = lock(&self.tx);
        let mut n = want.min(tx.cap - tx.bytes.len());
        let mut sent = 0;
        for part in parts {
            let k = n.min(part.len());
            tx.bytes.extend(&part[..k]);
            sent += k;
            n -= k;
        }
        if sent > 0 {
            tx.reader.ring();
        }
        Ok(sent)
    }

    fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<usize, LinkError> {
        let mut offer = self.chunk();
        let rx = Arc::clone(&self.rx);
        let mut rx = lock(&rx);
        let avail = rx.bytes.len().min(max);
        loop {
            let k = offer.min(avail);
            let piece: Vec<u8> = rx.bytes.iter().take(k).copied().collect();
            let used = if k == 0 { 0 } else { consume(&piece).min(k) };
            if used > 0 {
                rx.bytes.drain(..used);
                rx.writer.ring();
                self.stalled_at = None;
                return Ok(used);
            }
            if k == avail {
                self.stalled_at = Some(rx.bytes.len());
                return Ok(0);
            }
            // The consumer needs more (a whole element): offer a longer prefix.
            offer = k + 1;
        }
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn arm(&mut self, interest: Interest) -> Result<Readiness, LinkError> {
        if self.rng.random_range(0..8) == 0 {
            return Ok(Readiness::Ready); // spurious, and legal
        }
        let (mut rx, mut tx) = (lock(&self.rx), lock(&self.tx));
        let readable = rx.bytes.len() > self.stalled_at.unwrap_or(0);
        let writable = tx.bytes.len() < tx.cap;
        if (interest.read && readable) || (interest.write && writable) {
            return Ok(Readiness::Ready);
        }
        rx.reader.armed = interest.read;
        tx.writer.armed = interest.write;
        Ok(Readiness::Armed)
    }

    fn wait_fds<'a>(&'a self, _interest: Interest, _fds: &mut Vec<PollFd<'a>>) {}

    fn disarm(&mut self) {
        lock(&self.rx).reader = Alarm::default();
        lock(&self.tx).writer = Alarm::default();
    }
}

/// The pipes of one channel, kept by the harness to see whether an armed link fired.
struct Ends {
    tx: Shared,
    rx: Shared,
}

impl Ends {
    fn fired(&self) -> bool {
        lock(&self.rx).reader.fired || lock(&self.tx).writer.fired
    }
}

/// The ring's channels for every rank (as `Ring::new` lays them out, with the mesh's if
/// `mesh`), over fake links.
fn fake_ring(
    size: usize,
    wires: usize,
    mesh: bool,
    seed: u64,
) -> (Vec<Vec<Channel>>, Vec<Vec<Ends>>) {
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed));
    let geos: Vec<Geometry> = (0..size).map(|r| geometry(r, size, wires, mesh)).collect();
    let mut slots: Vec<Vec<Option<(Channel, Ends)>>> = geos
        .iter()
        .map(|g| {
            (0..2 * wires + g.non_neighbours().count())
                .map(|_| None)
                .collect()
        })
        .collect();
    for (r, g) in geos.iter().enumerate() {
        // Each channel is made once, by the side whose far end is not made yet.
        for c in 0..slots[r].len() {
            if slots[r][c].is_some() {
                continue;
            }
            let (peer, theirs) = g.far_end(c);
            // At least two elements: a receiver that may merge only what it has sent itself
            // (merge after send) needs whole elements in its buffer, as every real one has.
            let mut cap = || [16, 24, 64, 1000, 1 << 16][rng.random_range(0..5)];
            let caps = [cap(), cap()];
            let [(mine, my_ends), (far, far_ends)] = fake_connection(caps, &mut rng);
            slots[r][c] = Some((Channel::new(Box::new(mine), peer), my_ends));
            slots[peer][theirs] = Some((Channel::new(Box::new(far), r), far_ends));
        }
    }
    slots
        .into_iter()
        .map(|chans| chans.into_iter().flatten().unzip())
        .unzip()
}

/// The two ends of one fake connection whose pipes hold `caps` bytes (from the first end, from
/// the second).
fn fake_connection(caps: [usize; 2], rng: &mut TestRng) -> [(FakeLink, Ends); 2] {
    let [out, back] = caps.map(|cap| {
        Arc::new(Mutex::new(Pipe {
            cap,
            ..Pipe::default()
        }))
    });
    let mut end = |tx: &Shared, rx: &Shared| {
        let link = FakeLink {
            tx: Arc::clone(tx),
            rx: Arc::clone(rx),
            rng: TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(rng.random())),
            stalled_at: None,
        };
        let ends = Ends {
            tx: Arc::clone(tx),
            rx: Arc::clone(rx),
        };
        (link, ends)
    };
    [end(&out, &back), end(&back, &out)]
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&seed.to_le_bytes());
    b
}

/// One rank's part in a harness run.
struct RankCall {
    plan: Plan,
    input: Option<Vec<u8>>,
    output: Vec<u8>,
    call: Call,
}

enum Phase {
    Runnable,
    Sleeping { armed: usize },
    Done,
}

/// Runs every rank's call to the end over fake links, scheduling ranks at random. Panics on a
/// deadlock (no rank can run and not all are done) or an error.
fn run_all(ranks: Vec<RankCall>, wires: usize, mesh: bool, seed: u64) -> Vec<Vec<u8>> {
    let sequences = ranks.into_iter().map(|rc| vec![rc]).collect();
    run_sequences(sequences, wires, mesh, seed)
        .into_iter()
        .flatten()
        .collect()
}

/// Like [`run_all`] with a sequence of calls per rank, each rank starting its next call as
/// soon as its last one is done. Returns each rank's outputs in call order.
fn run_sequences(
    mut ranks: Vec<Vec<RankCall>>,
    wires: usize,
    mesh: bool,
    seed: u64,
) -> Vec<Vec<Vec<u8>>> {
    let size = ranks.len();
    let (mut channels, ends) = fake_ring(size, wires, mesh, seed);
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(!seed));
    let reducer = Reducer::new(Dtype::Int64, ReduceOp::Sum).expect("sum applies to i64");
    {
        let mut queues: Vec<_> = ranks.iter_mut().map(|calls| calls.iter_mut()).collect();
        let mut start_next = |r: usize, chans: &mut [Channel]| {
            queues[r].next().map(|rc| {
                let bufs = Buffers::new(rc.input.as_deref(), &mut rc.output);
                (
                    Execution::start(chans, &rc.plan, bufs, Some(&reducer), &rc.call),
                    rc.call,
                )
            })
        };
        let mut execs: Vec<_> = (0..size).map(|r| start_next(r, &mut channels[r])).collect();
        let mut phases: Vec<Phase> = execs
            .iter()
            .map(|e| {
                if e.is_some() {
                    Phase::Runnable
                } else {
                    Phase::Done
                }
            })
            .collect();
        for _ in 0..20_000_000u64 {
            let runnable: Vec<usize> = (0..size)
                .filter(|&r| match phases[r] {
                    Phase::Runnable => true,
                    Phase::Sleeping { .. } => ends[r].iter().any(Ends::fired),
                    Phase::Done => false,
                })
                .collect();
            if runnable.is_empty() {
                assert!(
                    phases.iter().all(|p| matches!(p, Phase::Done)),
                    "deadlock: no rank can run (seed {seed})"
                );
                break;
            }
            let r = runnable[rng.random_range(0..runnable.len())];
            let chans = &mut channels[r];
            let Some((exec, call)) = &mut execs[r] else {
                unreachable!("a rank without a call is done")
            };
            if let Phase::Sleeping { armed } = phases[r] {
                waiting::disarm(chans, exec.wants(), armed);
                phases[r] = Phase::Runnable;
            }
            let progress = exec
                .pass(chans)
                .unwrap_or_else(|e| panic!("rank {r}: {e} (seed {seed})"));
            if exec.done() {
                execs[r] = start_next(r, chans);
                if execs[r].is_none() {
                    phases[r] = Phase::Done;
                }
            } else if !progress {
                let wants = exec.wants().to_vec();
                match waiting::arm(chans, &wants, call) {
                    (armed, Ok(Readiness::Armed)) => phases[r] = Phase::Sleeping { armed },
                    (armed, Ok(Readiness::Ready)) => waiting::disarm(chans, &wants, armed),
                    (_, Err(e)) => panic!("rank {r}: {e} (seed {seed})"),
                }
            }
        }
        assert!(
            phases.iter().all(|p| matches!(p, Phase::Done)),
            "did not finish (seed {seed})"
        );
    }
    ranks
        .into_iter()
        .map(|calls| calls.into_iter().map(|rc| rc.output).collect())
        .collect()
}

fn call(rank: usize, op: Op, count: usize) -> Call {
    Call {
        rank,
        op,
        dtype: Dtype::Int64,
        reduce: ReduceOp::Sum,
        count,
        root: 0,
        counts: None,
        message: if matches!(op, Op::Send | Op::Recv) {
            count
        } else {
            0
        },
        number: 0,
        history: [0; 32],
        timeout: Duration::from_secs(60),
        wait: WaitPolicy::SLEEP,
        interruptible: true,
    }
}

fn value(rank: usize, i: usize) -> i64 {
    (rank as i64 + 1) * 1_000_003 + i as i64 * 7919
}

fn bytes(values: impl Iterator<Item = i64>) -> Vec<u8> {
    values.flat_map(i64::to_le_bytes).collect()
}

fn geometry(rank: usize, size: usize, wires: usize, mesh: bool) -> Geometry {
    Geometry {
        rank,
        size,
        wires,
        mesh,
    }
}

/// Bytes read ahead come before the link's, and a consumer of whole elements gets a read-ahead
/// tail that ends mid-element joined with the link's next bytes.
#[test]
fn read_ahead_bytes_come_first_even_mid_element() {
    let data: Vec<u8> = (0..4000).map(|i| (i * 7 + i / 256) as u8).collect();
    for seed in 0..100u64 {
        let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed));
        let [(mut sender, _), (far, _)] = fake_connection([100, 100], &mut rng);
        let mut receiver = Channel::new(Box::new(far), 1);
        let (mut sent, mut got) = (0, Vec::new());
        while got.len() < data.len() {
            sent += sender
                .try_send(&[&data[sent..]])
                .expect("fake links do not fail");
            if rng.random_range(0..3) == 0 {
                receiver.read_ahead_idle();
                continue;
            }
            let max = data.len() - got.len();
            receiver
                .try_recv(max, &mut |bytes| {
                    let whole = bytes.len() - bytes.len() % 8;
                    got.extend_from_slice(&bytes[..whole]);
                    whole
                })
                .expect("fake links do not fail");
        }
        assert!(got == data, "seed {seed}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// All-reduce by the ring's reduce-scatter + all-gather, in place and out of place, with
    /// counts that give one lane (small) or both directions on every wire.
    #[test]
    fn all_reduce_over_misbehaving_links(
        size in 2usize..=5, wires in 1usize..=3, small in any::<bool>(),
        extra in 0usize..40, in_place in any::<bool>(), seed in any::<u64>(),
    ) {
        let count = if small { extra } else { 4097 + extra };
        let ranks = (0..size)
            .map(|r| {
                let mine = bytes((0..count).map(|i| value(r, i)));
                let plan = ring::all_reduce(&geometry(r, size, wires, false), count, 8, in_place);
                let (input, output) = if in_place { (None, mine) } else { (Some(mine), vec![0; count * 8]) };
                RankCall { plan, input, output, call: call(r, Op::AllReduce, count) }
            })
            .collect();
        let expect = bytes((0..count).map(|i| (0..size).map(|r| value(r, i)).sum()));
        for out in run_all(ranks, wires, false, seed) {
            prop_assert!(out == expect);
        }
    }

    /// Reduce-scatter: each step receives into the span it sends from (merge after send).
    #[test]
    fn reduce_scatter_over_misbehaving_links(
        size in 2usize..=5, wires in 1usize..=3, small in any::<bool>(),
        extra in 0usize..40, seed in any::<u64>(),
    ) {
        let count = if small { 1 + extra } else { 4097 + extra };
        let ranks = (0..size)
            .map(|r| RankCall {
                plan: ring::reduce_scatter(&geometry(r, size, wires, false), count, 8),
                input: Some(bytes((0..size * count).map(|i| value(r, i)))),
                output: vec![0; count * 8],
                call: call(r, Op::ReduceScatter, count),
            })
            .collect();
        for (r, out) in run_all(ranks, wires, false, seed).into_iter().enumerate() {
            let expect = bytes((0..count).map(|i| (0..size).map(|q| value(q, r * count + i)).sum()));
            prop_assert!(out == expect, "rank {}", r);
        }
    }

    /// All-gather by the ring (large) and by whole blocks both ways (small).
    #[test]
    fn all_gather_over_misbehaving_links(
        size in 2usize..=6, wires in 1usize..=3, small in any::<bool>(),
        extra in 0usize..40, seed in any::<u64>(),
    ) {
        let block = if small { 8 * (1 + extra) } else { 40_000 + extra };
        let ranks = (0..size)
            .map(|r| {
                let g = geometry(r, size, wires, false);
                let mut output = vec![0u8; size * block];
                for (i, b) in output[r * block..(r + 1) * block].iter_mut().enumerate() {
                    *b = (r * 31 + i) as u8;
                }
                let plan = if small { ring::gather_both_ways(&g, block) } else { ring::all_gather(&g, block) };
                RankCall { plan, input: None, output, call: call(r, Op::AllGather, block) }
            })
            .collect();
        let expect: Vec<u8> = (0..size)
            .flat_map(|r| (0..block).map(move |i| (r * 31 + i) as u8))
            .collect();
        for out in run_all(ranks, wires, false, seed) {
            prop_assert!(out == expect);
        }
    }

    /// Send and receive between two neighbours, split over the wires; the other ranks idle.
    #[test]
    fn send_recv_over_misbehaving_links(
        size in 2usize..=4, wires in 1usize..=3, len in 0usize..50_000, seed in any::<u64>(),
    ) {
        let data: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
        let ranks = (0..size)
            .map(|r| {
                let g = geometry(r, size, wires, false);
                match r {
                    0 => RankCall { plan: p2p::send(&g, len, 1), input: Some(data.clone()), output: Vec::new(), call: call(r, Op::Send, len) },
                    1 => RankCall { plan: p2p::recv(&g, len, 0), input: None, output: vec![0; len], call: call(r, Op::Recv, len) },
                    _ => RankCall { plan: Plan::default(), input: None, output: Vec::new(), call: call(r, Op::Recv, 0) },
                }
            })
            .collect();
        let outs = run_all(ranks, wires, false, seed);
        prop_assert!(outs[1] == data);
    }

    /// The mesh's one-step exchange (the small all-gather, all-reduce and barrier, and with
    /// blocks from the input, reduce-scatter), over the ring's wire 0 and the mesh channels.
    #[test]
    fn mesh_exchange_over_misbehaving_links(
        size in 2usize..=7, wires in 1usize..=3, block in 0usize..300, scatter in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let value = |r: usize, b: usize, i: usize| (r * 31 + b * 7 + i) as u8;
        let ranks = (0..size)
            .map(|r| {
                let g = geometry(r, size, wires, true);
                let mut output = vec![0u8; size * block];
                let input: Vec<u8> = (0..size * block).map(|j| value(r, j / block.max(1), j % block.max(1))).collect();
                let plan = if scatter {
                    mesh::exchange_with_all(&g, block, |p| Span::input(p * block, block))
                } else {
                    output[r * block..(r + 1) * block].copy_from_slice(&input[r * block..(r + 1) * block]);
                    mesh::gather(&g, block)
                };
                RankCall { plan, input: Some(input), output, call: call(r, Op::AllGather, block) }
            })
            .collect();
        for (r, out) in run_all(ranks, wires, true, seed).into_iter().enumerate() {
            for p in (0..size).filter(|&p| p != r) {
                // Gathering, rank p sends its own block; scattering, block r of its input.
                let b = if scatter { r } else { p };
                let expect: Vec<u8> = (0..block).map(|i| value(p, b, i)).collect();
                prop_assert!(out[p * block..(p + 1) * block] == expect[..], "rank {} from {}", r, p);
            }
        }
    }

    /// Send and receive between any two ranks of the mesh (neighbours split over the wires,
    /// others on their one channel); the other ranks idle.
    #[test]
    fn mesh_send_recv_over_misbehaving_links(
        size in 2usize..=6, wires in 1usize..=3, len in 0usize..20_000, pick in any::<(usize, usize)>(),
        seed in any::<u64>(),
    ) {
        let from = pick.0 % size;
        let to = (from + 1 + pick.1 % (size - 1)) % size;
        let data: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
        let ranks = (0..size)
            .map(|r| {
                let g = geometry(r, size, wires, true);
                if r == from {
                    RankCall { plan: p2p::send(&g, len, to), input: Some(data.clone()), output: Vec::new(), call: call(r, Op::Send, len) }
                } else if r == to {
                    RankCall { plan: p2p::recv(&g, len, from), input: None, output: vec![0; len], call: call(r, Op::Recv, len) }
                } else {
                    RankCall { plan: Plan::default(), input: None, output: Vec::new(), call: call(r, Op::Recv, 0) }
                }
            })
            .collect();
        let outs = run_all(ranks, wires, true, seed);
        prop_assert!(outs[to] == data);
    }

    /// Sends in a cycle: every rank sends to the rank `shift` after it (a neighbour, or any
    /// rank with the mesh) before it receives from the one `shift` before, with more bytes than
    /// the links hold, then all-reduces. Only reading ahead while blocked sending lets the
    /// cycle move; the all-reduce may then find its peers' first bytes, in pieces and
    /// mid-element, in the read-ahead buffers.
    #[test]
    fn send_cycles_over_misbehaving_links(
        size in 2usize..=6, wires in 1usize..=3, mesh in any::<bool>(), len in 0usize..20_000,
        pick in any::<usize>(), count in 1usize..600, seed in any::<u64>(),
    ) {
        let shift = match (mesh, pick % 2) {
            (true, _) => 1 + pick % (size - 1),
            (false, 0) => 1,
            (false, _) => size - 1,
        };
        let data = |r: usize| -> Vec<u8> { (0..len).map(|i| (r * 31 + i * 7) as u8).collect() };
        let ranks = (0..size)
            .map(|r| {
                let g = geometry(r, size, wires, mesh);
                let (to, from) = ((r + shift) % size, (r + size - shift) % size);
                vec![
                    RankCall { plan: p2p::send(&g, len, to), input: Some(data(r)), output: Vec::new(), call: call(r, Op::Send, len) },
                    RankCall { plan: p2p::recv(&g, len, from), input: None, output: vec![0; len], call: call(r, Op::Recv, len) },
                    RankCall {
                        plan: ring::all_reduce(&g, count, 8, false),
                        input: Some(bytes((0..count).map(|i| value(r, i)))),
                        output: vec![0; count * 8],
                        call: call(r, Op::AllReduce, count),
                    },
                ]
            })
            .collect();
        let sum = bytes((0..count).map(|i| (0..size).map(|r| value(r, i)).sum()));
        for (r, outs) in run_sequences(ranks, wires, mesh, seed).into_iter().enumerate() {
            prop_assert!(outs[1] == data((r + size - shift) % size), "rank {} received", r);
            prop_assert!(outs[2] == sum, "rank {} all-reduce", r);
        }
    }

    /// One step of the recursive-doubling all-reduce: every rank swaps its vector with that
    /// step's partner (a neighbour split over the wires, or a mesh channel).
    #[test]
    fn doubling_swaps_over_misbehaving_links(
        shape in 0usize..3, wires in 1usize..=3, len in 1usize..40_000, step in 0usize..3,
        seed in any::<u64>(),
    ) {
        let (size, mesh) = [(2, false), (4, false), (8, true)][shape];
        let data = |r: usize| -> Vec<u8> { (0..len).map(|i| (r * 31 + i * 7) as u8).collect() };
        let mut partners = Vec::new();
        let ranks = (0..size)
            .map(|r| {
                let g = geometry(r, size, wires, mesh);
                let steps = g.doubling_partners().expect("pairs up");
                let k = step % steps.len();
                partners.push(steps[k]);
                RankCall {
                    plan: doubling::swap_with(&g, &steps, k, Span::input(0, len), Span::output(0, len)),
                    input: Some(data(r)),
                    output: vec![0; len],
                    call: call(r, Op::AllReduce, len),
                }
            })
            .collect();
        for (r, out) in run_all(ranks, wires, mesh, seed).into_iter().enumerate() {
            prop_assert!(out == data(partners[r]), "rank {} from {}", r, partners[r]);
        }
    }
}
