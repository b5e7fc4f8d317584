//! Entry points of the fuzz targets in `fuzz/`: every parser of bytes that come from a peer,
//! and the code that acts on them (the engine's plans, the shared-memory and RDMA links'
//! accounting). Enabled by the `fuzzing` feature; not a stable API. Each target must return
//! normally on any input: a panic, an out-of-bounds access, a hang or an allocation the input
//! sized is a bug.

use std::time::Duration;

use rustix::event::PollFd;

use crate::algo::call::Call;
use crate::algo::channel::Channel;
use crate::algo::collectives::Collectives;
use crate::algo::geometry::Geometry;
use crate::dtype::{Dtype, ReduceOp};
use crate::error::Op;
use crate::liveness::Liveness;
use crate::reduce::Reducer;
use crate::transport::{Interest, Link, LinkError, Readiness};
use crate::wait::WaitPolicy;

/// Bytes of the input, taken from the front.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |x, i| x | u64::from(self.byte()) << (8 * i))
    }

    /// The next `len`-prefixed piece (a `u16` length, then that many bytes or what is left).
    fn piece(&mut self) -> &'a [u8] {
        let len = usize::from(self.u16()).min(self.0.len());
        let (piece, rest) = self.0.split_at(len);
        self.0 = rest;
        piece
    }
}

/// The header this rank would expect in the fuzz targets' calls: what a peer's header is
/// compared with.
fn expected_header() -> crate::op_header::Header {
    crate::op_header::Header {
        seq: 3,
        number: 1,
        kind: crate::op_header::Kind::of(Op::AllReduce),
        dtype: Dtype::Float32,
        reduce: ReduceOp::Sum,
        sender: 1,
        count: 1024,
        root: 0,
        counts: None,
        message: 0,
        // The seeds' bytes 32-64 of an all-reduce: no rooted call before.
        history: Some([0; 32]),
    }
}

/// A connection's hello, then operation headers, as they arrive on data connections: each
/// parsed, and compared with what this rank would expect.
pub fn data_connection(bytes: &[u8]) {
    if let Some(b) = bytes.first_chunk::<{ crate::auth::HELLO_LEN }>() {
        let _ = crate::auth::Claim::parse(b);
    }
    let expect = expected_header();
    for chunk in bytes.chunks(crate::op_header::HEADER_LEN) {
        if let Some(b) = chunk.first_chunk::<{ crate::op_header::HEADER_LEN }>()
            && let Ok(header) = crate::op_header::Header::decode(b)
        {
            let _ = expect.mismatch(&header);
            let _ = header.to_string();
        }
    }
}

/// Every side-channel message after the handshake: all-gather results, and the heartbeat's
/// messages (beats with their reports, statuses, goodbyes).
pub fn side_channel(bytes: &[u8]) {
    let expected = bytes.first().map_or(0, |&b| usize::from(b));
    let _ = crate::bootstrap::decode_list(bytes, expected);
    let _ = crate::liveness::decode(&mut bytes.to_vec());
}

/// What ranks publish at start-up: every rank's settings and each transport's blob (JSON) as
/// rank 0 reads them, rank 0's table of them as a member reads it and the connectors read its
/// entries, and RDMA's endpoint offers and outcomes.
pub fn startup(bytes: &[u8]) {
    crate::connect::check_published(bytes);
    crate::transport::rdma::check_offers(bytes);
}

/// What a shared-memory peer hands over and publishes: a segment offer, and a call
/// description in its mailbox.
pub fn shared_memory(bytes: &[u8]) {
    use crate::transport::shm::{self, Layout};
    let layout = Layout::new(1, 4, shm::RING_BYTES, shm::AREA_BYTES);
    let _ = shm::check_offer_bytes(layout, bytes);
    let mut input = Input(bytes);
    let words = [input.u64(), input.u64()];
    let mut digest = [0u8; 32];
    digest.iter_mut().for_each(|b| *b = input.byte());
    if let Ok(header) = crate::op_header::Header::from_words(words, 1, || digest) {
        let _ = expected_header().mismatch(&header);
        let _ = header.to_string();
    }
}

/// Two shared-memory links over real segments, one of whose ends also writes any tail or head
/// the input says between sends and receives: the other end must report `Broken`, never
/// panic, read or write outside its rings.
pub fn shm_link(bytes: &[u8]) {
    use crate::transport::shm::harness::{self, Pair};
    static DATA: [u8; 9000] = [0x5a; 9000];
    let Ok(mut pair) = Pair::new(4096) else {
        return;
    };
    let mut input = Input(bytes);
    let mut got = Vec::new();
    for _ in 0..64 {
        let (rank, n) = (
            usize::from(input.byte() & 1),
            usize::from(input.u16()) % 9000,
        );
        let [a, b] = &mut pair.links;
        let link = if rank == 0 { a } else { b };
        let _ = match input.byte() % 4 {
            0 => harness::send(link, &DATA[..n]).map(drop),
            1 => {
                got.clear();
                harness::recv(link, n, &mut got).map(drop)
            }
            2 => {
                pair.write_tail(rank, input.u64());
                Ok(())
            }
            _ => {
                pair.write_head(rank, input.u64());
                Ok(())
            }
        };
        if input.0.is_empty() {
            break;
        }
    }
}

/// An RDMA link's accounting of the peer's immediate data (data lengths, reports of consumed
/// bytes and reposted receives), with this side sending and consuming as the input says: the
/// counts stay consistent whatever the peer claims.
pub fn rdma_immediates(bytes: &[u8]) {
    use crate::transport::rdma::link::{Counts, RECEIVES, report_imm};
    let cap = 1 << 20;
    let mut counts = Counts::new(cap);
    let mut input = Input(bytes);
    while !input.0.is_empty() {
        match input.byte() % 4 {
            // This side posts a message (as `try_send` does, within its room and credits).
            0 => {
                let room = cap - (counts.tail - counts.peer_head);
                let len = u64::from(input.u16()).min(room);
                if len > 0 && counts.credits > 0 {
                    counts.tail += len;
                    counts.credits -= 1;
                }
            }
            // This side consumes what arrived.
            1 => {
                let n = u64::from(input.u16()).min(counts.arrived - counts.head);
                counts.head += n;
            }
            // The peer reports, possibly lying.
            2 => {
                let imm = report_imm(usize::from(input.byte()), u64::from(input.u16()) << 4);
                let _ = counts.receive(Some(imm));
            }
            // Any immediate at all.
            _ => {
                let imm = u32::from(input.u16()) | u32::from(input.u16()) << 16;
                let _ = counts.receive((input.byte() != 0).then_some(imm));
            }
        }
        assert!(counts.arrived - counts.head <= cap, "{counts:?}");
        assert!(counts.peer_head <= counts.tail, "{counts:?}");
        assert!(counts.credits <= RECEIVES, "{counts:?}");
    }
}

/// One rank's collective (any of them, any shape of group, any element type and length) run
/// by the real engine and algorithms over links whose incoming bytes are the input's: the
/// peers' headers and data are whatever the fuzzer makes them, and the links take sends in
/// pieces and fill up. The call must end, with its result or an error.
pub fn engine(bytes: &[u8]) {
    let mut input = Input(bytes);
    let size = 2 + usize::from(input.byte() % 7);
    let rank = usize::from(input.byte()) % size;
    let wires = 1 + usize::from(input.byte() % 4);
    let mesh = input.byte() & 1 == 1;
    let dtype = Dtype::ALL[usize::from(input.byte()) % Dtype::ALL.len()];
    let reduce = ReduceOp::ALL[usize::from(input.byte()) % ReduceOp::ALL.len()];
    let ops = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Send,
        Op::Recv,
        Op::Barrier,
        Op::Broadcast,
        Op::Reduce,
        Op::Gather,
        Op::Scatter,
        Op::AllToAll,
        Op::AllToAllV,
        Op::AllGatherV,
        Op::ReduceScatterV,
    ];
    let op = ops[usize::from(input.byte()) % ops.len()];
    let root = usize::from(input.byte()) % size;
    let count = usize::from(input.u16() % 4096);
    let chunk = 1 + usize::from(input.u16() % 9000);
    let room = usize::from(input.u16()) * 16;
    let geometry = Geometry {
        rank,
        size,
        wires,
        mesh,
    };
    let links = 2 * wires + geometry.non_neighbours().count();
    let peer_of = |c: usize| match c {
        c if c < wires => geometry.left(),
        c if c < 2 * wires => geometry.right(),
        c => geometry
            .non_neighbours()
            .nth(c - 2 * wires)
            .unwrap_or(geometry.left()),
    };
    let channels: Vec<Channel> = (0..links)
        .map(|c| {
            let link = FuzzLink {
                incoming: input.piece().to_vec(),
                at: 0,
                chunk,
                room,
            };
            Channel::new(Box::new(link), peer_of(c))
        })
        .collect();
    let Ok(liveness) = Liveness::new(rank) else {
        return;
    };
    let mut collectives = Collectives::new(geometry, channels, liveness, false, None, None, None);
    let elem = dtype.size();
    let call = Call {
        rank,
        op,
        dtype,
        reduce,
        count,
        root,
        counts: None,
        // The group's first collective, as the seeds' headers say.
        number: 0,
        history: [0; 32],
        // A send's message is its one piece, as the seeds' headers say.
        message: if matches!(op, Op::Send | Op::Recv) {
            count
        } else {
            0
        },
        timeout: Duration::from_secs(1),
        wait: WaitPolicy::SLEEP,
        interruptible: true,
    };
    let Some(reducer) = Reducer::new(dtype, reduce) else {
        return;
    };
    let data = vec![0x3cu8; count * elem * size];
    let mut out = vec![0u8; count * elem * size];
    let one = count * elem;
    let peer = peer_of(usize::from(input.byte()) % links);
    // Uneven counts from the input, adding up to at most `size × count`.
    let counts: Vec<usize> = (0..size)
        .map(|_| usize::from(input.byte()) * count / 255)
        .collect();
    let c = &mut collectives;
    let _ = match op {
        Op::AllReduce => c.all_reduce(Some(&data[..one]), &mut out[..one], &reducer, &call),
        Op::AllGather => c.all_gather(&data[..one], &mut out, &call),
        Op::ReduceScatter => c.reduce_scatter(&data, &mut out[..one], &reducer, &call),
        Op::Send => c.send(&data[..one], peer, &call),
        Op::Recv => c.recv(&mut out[..one], peer, &call),
        Op::Broadcast => c.broadcast(&mut out[..one], &call),
        Op::Reduce => c.reduce(&data[..one], &mut out[..one], &reducer, &call),
        Op::Gather => c.gather(&data[..one], &mut out, &call),
        Op::Scatter => c.scatter(&data, &mut out[..one], &call),
        Op::AllToAll => c.all_to_all(&data, &mut out, &call),
        Op::AllToAllV => {
            let total = counts.iter().sum::<usize>() * elem;
            let (input, output) = (&data[..total], &mut out[..total]);
            c.all_to_all_v(input, &counts, output, &counts, elem, &call)
        }
        Op::AllGatherV => {
            let total = counts.iter().sum::<usize>() * elem;
            let mine = &data[..counts[rank] * elem];
            c.all_gather_v(mine, &mut out[..total], &counts, elem, &call)
        }
        Op::ReduceScatterV => {
            let total = counts.iter().sum::<usize>() * elem;
            let mine = &mut out[..counts[rank] * elem];
            c.reduce_scatter_v(&data[..total], mine, &counts, &reducer, &call)
        }
        _ => c.barrier(&call),
    };
}

/// A link whose peer's bytes are given: it offers them `chunk` at a time and takes at most
/// `room` bytes of sends. Nothing else ever arrives, so a call that has to wait on it fails
/// at once ([`Link::arm`]).
struct FuzzLink {
    incoming: Vec<u8>,
    at: usize,
    chunk: usize,
    room: usize,
}

impl Link for FuzzLink {
    fn try_send(&mut self, parts: &[&[u8]]) -> Result<usize, LinkError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let n = total.min(self.room).min(self.chunk);
        self.room -= n;
        Ok(n)
    }

    fn try_recv(
        &mut self,
        max: usize,
        consume: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Result<usize, LinkError> {
        let n = (self.incoming.len() - self.at).min(max).min(self.chunk);
        if n == 0 {
            return Ok(0);
        }
        let used = consume(&self.incoming[self.at..self.at + n]).min(n);
        self.at += used;
        Ok(used)
    }

    fn in_memory(&self) -> bool {
        true
    }

    /// The engine arms a link only after a whole pass moved nothing; with every byte there is
    /// already offered, nothing can move any more.
    fn arm(&mut self, _interest: Interest) -> Result<Readiness, LinkError> {
        Err(LinkError::Closed("the fuzz input ended".into()))
    }

    fn wait_fds<'a>(&'a self, _interest: Interest, _fds: &mut Vec<PollFd<'a>>) {}

    fn disarm(&mut self) {}
}
