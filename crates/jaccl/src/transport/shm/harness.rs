//! For the tests and the fuzz target that play a hostile peer: two shared-memory links of one
//! wire, joined within one process over real sealed segments, with a hand on the cursors each
//! side publishes (any tail or head) and on each side's mailbox stamps; and, in a real group,
//! a member that writes any stamp or description into any rank's mailbox ([`Forger`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

#[cfg(test)]
use super::board::Board;
use super::link::ShmLink;
use super::segment::Layout;
#[cfg(test)]
use super::segment::{EagerLine, Mailbox};
use super::setup::{PeerSpec, map_peer};
#[cfg(test)]
use super::sys::Mapping;
use super::{Local, Peer};
use crate::transport::{Link, LinkError};

/// Ranks 0 and 1, joined by one wire: rank 0's right ring to rank 1's left.
pub(crate) struct Pair {
    /// Rank 0's link to rank 1, and rank 1's to rank 0.
    pub(crate) links: [ShmLink; 2],
    locals: [Arc<Local>; 2],
    /// Each rank's view of the other (the segment mapped a second time).
    #[cfg_attr(not(test), allow(dead_code))]
    peers: [Arc<Peer>; 2],
}

impl Pair {
    /// A pair whose rings hold `ring_bytes` (rounded up to pages).
    ///
    /// # Errors
    /// A segment, mapping or socket cannot be made.
    pub(crate) fn new(ring_bytes: usize) -> std::io::Result<Pair> {
        let layout = Layout::new(1, 2, ring_bytes, 4096);
        let (a, seg_a) = Local::create(layout)?;
        let (b, seg_b) = Local::create(layout)?;
        let (sock_a, sock_b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let door = |l: &Local| l.doorbell.fd().try_clone_to_owned();
        // Rank 0 sends on its ring 1 (right) and reads rank 1's ring 0 (left); rank 1 the
        // mirror.
        let peer_of = |rank, reads, seg: &std::os::fd::OwnedFd, door, sock| {
            let spec = PeerSpec {
                rank,
                name: String::new(),
                reads,
            };
            map_peer(&spec, layout, seg, door, sock).map_err(std::io::Error::other)
        };
        let b_seen_by_a = Arc::new(peer_of(1, vec![0], &seg_b, door(&b)?, sock_a)?);
        let a_seen_by_b = Arc::new(peer_of(0, vec![1], &seg_a, door(&a)?, sock_b)?);
        let (a, b) = (Arc::new(a), Arc::new(b));
        let links = [
            ShmLink::new(Arc::clone(&a), Arc::clone(&b_seen_by_a), 1, 0),
            ShmLink::new(Arc::clone(&b), Arc::clone(&a_seen_by_b), 0, 1),
        ];
        Ok(Pair {
            links,
            locals: [a, b],
            peers: [b_seen_by_a, a_seen_by_b],
        })
    }

    /// Rank `rank` writes `value` over the tail of the ring it sends on, as a hostile sender.
    pub(crate) fn write_tail(&self, rank: usize, value: u64) {
        let ring = 1 - rank;
        let local = &self.locals[rank];
        let (tail, _) = local.layout.ring_cursors(ring);
        local.main.atomic_u64(tail).store(value, Ordering::Release);
    }

    /// Rank `rank` writes `value` over the head of the ring it reads (in the peer's segment,
    /// which only the reader writes), as a hostile reader.
    pub(crate) fn write_head(&self, rank: usize, value: u64) {
        let peer = &self.locals[1 - rank];
        let ring = rank;
        let (_, head) = peer.layout.ring_cursors(ring);
        peer.main.atomic_u64(head).store(value, Ordering::Release);
    }

    /// Rank `rank`'s board: its segment, and the other's as it maps it.
    #[cfg(test)]
    pub(crate) fn board(&self, rank: usize) -> Board {
        let mut peers = vec![None, None];
        peers[1 - rank] = Some(Arc::clone(&self.peers[rank]));
        Board::of(Arc::clone(&self.locals[rank]), peers)
    }

    /// Rank `rank` writes `value` over its mailbox's stamp.
    #[cfg(test)]
    pub(crate) fn write_stamp(&self, rank: usize, value: u64) {
        write_stamp(&self.locals[rank].main, value);
    }

    /// Rank `rank` writes `value` over the stamp of its eager line for point `point`.
    #[cfg(test)]
    pub(crate) fn write_eager_stamp(&self, rank: usize, point: u64, value: u64) {
        write_eager_stamp(&self.locals[rank].main, point, value);
    }
}

/// Writes `value` over the stamp of the mailbox in `main`.
#[cfg(test)]
fn write_stamp(main: &Mapping, value: u64) {
    Mailbox::of(main).stamp().store(value, Ordering::Release);
}

/// Writes `value` over the stamp of the eager line for point `point` in `main`.
#[cfg(test)]
fn write_eager_stamp(main: &Mapping, point: u64, value: u64) {
    EagerLine::of(main, point)
        .stamp()
        .store(value, Ordering::Release);
}

/// A member of a real group that writes over the mailbox and eager lines of any rank of its
/// host, through its own mappings (every rank maps its peers' segments writable): a hostile
/// member, beside what its library publishes.
#[cfg(test)]
pub(crate) struct Forger {
    local: Arc<Local>,
    peers: Vec<Option<Arc<Peer>>>,
}

#[cfg(test)]
impl Forger {
    /// The forger in `group`'s rank; `None` without shared memory.
    pub(crate) fn of(group: &crate::Group) -> Option<Forger> {
        let shm = group.shared_memory()?;
        Some(Forger {
            local: Arc::clone(&shm.local),
            peers: shm.peers.clone(),
        })
    }

    fn main(&self, rank: usize) -> &Mapping {
        match self.peers.get(rank).and_then(Option::as_deref) {
            Some(peer) => &peer.main,
            None => &self.local.main,
        }
    }

    /// `rank`'s stamp, as it is.
    pub(crate) fn stamp(&self, rank: usize) -> u64 {
        Mailbox::of(self.main(rank)).stamp().load(Ordering::Acquire)
    }

    /// Waits until `rank`'s stamp is `stamp` or more (for a minute at most).
    pub(crate) fn wait_for(&self, rank: usize, stamp: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.stamp(rank) < stamp {
            assert!(
                std::time::Instant::now() < deadline,
                "rank {rank} never reached stamp {stamp}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Writes `value` over `rank`'s stamp.
    pub(crate) fn write_stamp(&self, rank: usize, value: u64) {
        write_stamp(self.main(rank), value);
    }

    /// Writes `value` over the stamp of `rank`'s eager line for point `point`.
    pub(crate) fn write_eager_stamp(&self, rank: usize, point: u64, value: u64) {
        write_eager_stamp(self.main(rank), point, value);
    }

    /// Copies `from`'s descriptions of its calls (both slots) over `to`'s, so that `to`
    /// seems to call what `from` does.
    pub(crate) fn copy_calls(&self, from: usize, to: usize) {
        for parity in 0..2 {
            let theirs = Mailbox::of(self.main(from)).call(parity);
            for (word, value) in Mailbox::of(self.main(to)).call(parity).iter().zip(theirs) {
                word.store(value.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }
}

/// Sends `data` on `link`; the bytes taken.
pub(crate) fn send(link: &mut ShmLink, data: &[u8]) -> Result<usize, LinkError> {
    link.try_send(&[data])
}

/// Receives up to `max` bytes from `link` into `into`; the bytes taken.
pub(crate) fn recv(link: &mut ShmLink, max: usize, into: &mut Vec<u8>) -> Result<usize, LinkError> {
    link.try_recv(max, &mut |bytes| {
        into.extend_from_slice(bytes);
        bytes.len()
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::transport::shm::EAGER_LINES;
    use crate::{Config, Error, Group, JobToken, Op, Transport};

    #[test]
    fn bytes_cross_and_hostile_cursors_are_protocol_errors_not_panics() {
        let mut pair = Pair::new(4096).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let (mut sent, mut got) = (0, Vec::new());
        while got.len() < data.len() {
            let [a, b] = &mut pair.links;
            sent += send(a, &data[sent..]).unwrap();
            recv(b, usize::MAX, &mut got).unwrap();
        }
        assert_eq!(got, data);
        // A tail far ahead of what the ring holds, and one behind the reader's head.
        for bad in [u64::MAX, 10_000 + 4096 + 1, 5] {
            pair.write_tail(0, bad);
            let [_, b] = &mut pair.links;
            let e = recv(b, usize::MAX, &mut Vec::new()).unwrap_err();
            assert!(matches!(e, LinkError::Broken(_)), "tail {bad}: {e}");
        }
        // A head past what was sent, or going back.
        let mut pair = Pair::new(4096).unwrap();
        let [a, _] = &mut pair.links;
        assert_eq!(send(a, &[1; 100]).unwrap(), 100);
        for bad in [101, u64::MAX] {
            pair.write_head(1, bad);
            let [a, _] = &mut pair.links;
            let e = send(a, &[1]).unwrap_err();
            assert!(matches!(e, LinkError::Broken(_)), "head {bad}: {e}");
        }
        pair.write_head(1, 50);
        let [a, _] = &mut pair.links;
        send(a, &[1]).unwrap();
        pair.write_head(1, 10);
        let [a, _] = &mut pair.links;
        assert!(matches!(send(a, &[1]), Err(LinkError::Broken(_))));
    }

    #[test]
    fn stamps_are_checked_against_what_was_seen_and_what_an_honest_rank_can_reach() {
        let pair = Pair::new(4096).unwrap();
        let board = pair.board(0);
        board.publish_stamp(10);
        let stamp = |value| {
            pair.write_stamp(1, value);
            board.stamp_of(1)
        };
        assert_eq!(stamp(5), Ok(5));
        assert!(stamp(4).unwrap_err().contains("went back from 5 to 4"));
        // Up to 256 eager broadcasts ahead of this rank: no further.
        let reach = 10 + EAGER_LINES as u64;
        assert_eq!(stamp(reach), Ok(reach));
        let far = stamp(reach + 1).unwrap_err();
        assert!(
            far.contains(&format!("{} is beyond {reach}", reach + 1)),
            "{far}"
        );
        assert!(stamp(reach - 1).unwrap_err().contains("went back"));
        assert!(stamp(u64::MAX).is_err());
        board.publish_stamp(11);
        assert_eq!(stamp(reach + 1), Ok(reach + 1));
        assert_eq!(board.ahead(1), Ok(true));

        // Eager lines: this rank waits at point 300, on line 300 % 256 = 44.
        let (point, lines) = (300, EAGER_LINES as u64);
        board.publish_stamp(point);
        let line = |value| {
            pair.write_eager_stamp(1, point, value);
            board.eager_stamp(1, point)
        };
        assert_eq!(line(0), Ok(0)); // never written
        assert_eq!(line(point - lines), Ok(point - lines)); // the line's last broadcast
        assert!(line(point - 1).unwrap_err().contains("(44 modulo 256)"));
        assert!(line(point + lines).is_err()); // only once this rank is past `point`
        assert!(line(0).unwrap_err().contains("from 44"));
        assert_eq!(line(point), Ok(point));
        assert!(line(point - lines).is_err());
    }

    /// A barrier for the threads of one test that fails the test instead of hanging when a
    /// member never comes (it panicked before, or a call it made hangs).
    struct Barrier {
        size: usize,
        /// Members arrived in this generation, and the generation.
        state: Mutex<(usize, u64)>,
        all_came: Condvar,
    }

    impl Barrier {
        fn new(size: usize) -> Barrier {
            Barrier {
                size,
                state: Mutex::new((0, 0)),
                all_came: Condvar::new(),
            }
        }

        fn wait(&self) {
            let mut state = self.state.lock().unwrap();
            let generation = state.1;
            state.0 += 1;
            if state.0 == self.size {
                *state = (0, generation + 1);
                self.all_came.notify_all();
                return;
            }
            let limit = Duration::from_secs(150);
            let (_state, waited) = self
                .all_came
                .wait_timeout_while(state, limit, |state| state.1 == generation)
                .unwrap();
            assert!(!waited.timed_out(), "a member never came to the barrier");
        }
    }

    /// The ranks of the group tests; the last one also plays the hostile member.
    const SIZE: usize = 4;
    const HOSTILE: usize = SIZE - 1;

    /// Runs `f` on every rank of a fresh group of `size` threads over shared memory, whose
    /// operations time out after a minute: a wait that should fail at once shows as a
    /// `Timeout` if it hangs instead.
    fn with_group<R: Send>(size: usize, f: impl Fn(&mut Group) -> R + Sync) -> Vec<R> {
        let token = JobToken::new(JobToken::generate().unwrap()).unwrap();
        for _attempt in 0..5 {
            // A free port below the ephemeral range, which data listeners take; another
            // test may take it before rank 0 listens: then try again.
            let coordinator = loop {
                let mut random = [0u8; 2];
                getrandom::fill(&mut random).unwrap();
                let port = 20_000 + u16::from_le_bytes(random) % 12_000;
                if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                    break format!("127.0.0.1:{port}");
                }
            };
            let results: Vec<crate::Result<R>> = std::thread::scope(|s| {
                let f = &f;
                let ranks: Vec<_> = (0..size)
                    .map(|rank| {
                        let cfg = Config::new(rank, size)
                            .coordinator(coordinator.clone())
                            .transport(Transport::Shm)
                            .timeout(Duration::from_secs(60))
                            .liveness(Duration::from_secs(2))
                            .job_token(token.clone());
                        s.spawn(move || crate::init_with(cfg).map(|mut g| f(&mut g)))
                    })
                    .collect();
                ranks.into_iter().map(|r| r.join().unwrap()).collect()
            });
            let port_taken = results.iter().any(|r| {
                matches!(r, Err(Error::Bootstrap(m))
                    if m.contains("cannot listen on the coordinator") || m.contains("another job"))
            });
            if !port_taken {
                return results.into_iter().map(Result::unwrap).collect();
            }
        }
        panic!("no free coordinator port in 5 attempts");
    }

    /// Checks that `result` is a `Protocol` error of `rank` in `op` naming the hostile member,
    /// whose detail says `what`.
    fn assert_blamed<T: std::fmt::Debug>(
        rank: usize,
        op: Op,
        result: crate::Result<T>,
        what: &str,
    ) {
        match result {
            Err(Error::Protocol {
                rank: r,
                peer: HOSTILE,
                op: o,
                detail,
            }) if r == rank && o == op && detail.contains(what) => {}
            other => panic!(
                "rank {rank}: expected a protocol error of {op} naming rank {HOSTILE} \
                 ({what}), got {other:?}"
            ),
        }
    }

    /// Three all-reduces, then the hostile member takes its stamp back (to 0, or to one less
    /// than the honest ranks saw) and the others call another: they fail at once, naming it.
    #[test]
    fn a_stamp_that_goes_back_is_a_protocol_error_on_every_honest_rank() {
        for back in [|_: u64| 0, |seen: u64| seen - 1] {
            let barrier = Barrier::new(SIZE);
            let results = with_group(SIZE, |g| {
                let me = g.rank();
                let mut sum = [0u32; 256];
                for call in 0..3 {
                    g.all_sum(&[call; 256], &mut sum).unwrap();
                    assert_eq!(sum, [call * SIZE as u32; 256]);
                }
                barrier.wait(); // every rank has read the stamps of the last call
                if me == HOSTILE {
                    let forger = Forger::of(g).unwrap();
                    forger.write_stamp(me, back(forger.stamp(me)));
                }
                barrier.wait();
                let result = (me != HOSTILE).then(|| g.all_sum(&[1u32; 256], &mut sum));
                barrier.wait(); // the hostile member stays until the others are done
                result
            });
            for (rank, result) in results.into_iter().enumerate().take(HOSTILE) {
                assert_blamed(rank, Op::AllReduce, result.unwrap(), "went back from");
            }
        }
    }

    /// Once the honest ranks are in a call, the hostile member copies rank 0's description of
    /// it and sets its stamp one beyond the most it could have reached: without the check, the
    /// honest ranks pass every synchronisation point and read its stale areas.
    #[test]
    fn a_stamp_beyond_an_honest_ranks_reach_is_a_protocol_error_not_wrong_data() {
        const N: usize = 16 * 1024; // elements per block: the areas, not the inline data
        let value = |rank: usize, i: usize, call: usize| (rank * 1_000_003 + i * 7 + call) as u32;
        for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
            let barrier = Barrier::new(SIZE);
            let results = with_group(SIZE, |g| {
                let me = g.rank();
                // Call 0 honestly (its data stays in the areas), then call 1.
                let mut outcome = None;
                for call in 0..2 {
                    if me == HOSTILE && call == 1 {
                        let forger = Forger::of(g).unwrap();
                        let stamp = forger.stamp(me);
                        // Every honest rank is in call 1 (published its first stamp of
                        // it): one still ending call 0 would see the forged stamp there.
                        for honest in 0..HOSTILE {
                            forger.wait_for(honest, stamp + 1);
                        }
                        forger.copy_calls(0, me);
                        forger.write_stamp(me, stamp + 1 + EAGER_LINES as u64 + 1);
                        break;
                    }
                    let input: Vec<u32> = (0..SIZE * N).map(|i| value(me, i, call)).collect();
                    let (result, expected): (_, Vec<u32>) = match op {
                        Op::AllReduce => {
                            let mut out = vec![0u32; N];
                            let result = g.all_sum(&input[..N], &mut out).map(|()| out);
                            let sum = |i| (0..SIZE).map(|r| value(r, i, call)).sum();
                            (result, (0..N).map(sum).collect())
                        }
                        Op::AllGather => {
                            let mut out = vec![0u32; SIZE * N];
                            let result = g.all_gather(&input[..N], &mut out).map(|()| out);
                            let block = |i: usize| value(i / N, i % N, call);
                            (result, (0..SIZE * N).map(block).collect())
                        }
                        _ => {
                            let mut out = vec![0u32; N];
                            let result = g
                                .reduce_scatter(&input, &mut out, crate::ReduceOp::Sum)
                                .map(|()| out);
                            let sum = |i| (0..SIZE).map(|r| value(r, me * N + i, call)).sum();
                            (result, (0..N).map(sum).collect())
                        }
                    };
                    let wrong = result
                        .as_ref()
                        .ok()
                        .map(|got| got.iter().zip(&expected).filter(|(a, b)| a != b).count());
                    if call == 0 {
                        assert_eq!(wrong, Some(0), "rank {me}: {op}: {result:?}");
                    }
                    outcome = Some((result.map(drop), wrong));
                }
                barrier.wait(); // the hostile member stays until the others are done
                outcome
            });
            for (rank, outcome) in results.into_iter().enumerate().take(HOSTILE) {
                let (result, wrong) = outcome.unwrap();
                assert!(
                    result.is_err(),
                    "rank {rank}: {op} returned with {wrong:?} wrong values"
                );
                assert_blamed(rank, op, result, "is beyond");
            }
        }
    }

    /// The hostile member is the root of an eager broadcast, and its eager line holds a stamp
    /// beyond the point, or one below what the others saw in that line 256 points before.
    #[test]
    fn an_eager_line_beyond_the_point_or_going_back_is_a_protocol_error() {
        let lines = EAGER_LINES as u64;
        for back in [false, true] {
            let barrier = Barrier::new(SIZE);
            let results = with_group(SIZE, |g| {
                let me = g.rank();
                let mut data = [me as u8; 8];
                if back {
                    // Its line for the next point, honestly; then around the lines once.
                    g.broadcast(&mut data, HOSTILE).unwrap();
                    assert_eq!(data, [HOSTILE as u8; 8]);
                    for _ in 1..lines {
                        g.barrier().unwrap();
                    }
                }
                if me == HOSTILE {
                    let forger = Forger::of(g).unwrap();
                    let point = forger.stamp(me) + 1;
                    let forged = if back { 0 } else { point + lines };
                    forger.write_eager_stamp(me, point, forged);
                }
                barrier.wait();
                let result = (me != HOSTILE).then(|| g.broadcast(&mut data, HOSTILE));
                barrier.wait();
                result
            });
            let what = if back {
                "seen there before"
            } else {
                "holds stamp"
            };
            for (rank, result) in results.into_iter().enumerate().take(HOSTILE) {
                assert_blamed(rank, Op::Broadcast, result.unwrap(), what);
            }
        }
    }

    /// Rank 1 roots an eager broadcast and waits in a barrier; then its line and its stamp
    /// are taken back before rank 0 saw them (so rank 0 cannot tell it from a slow rank), and
    /// rank 0 calls the broadcast. Each waits for the other: the deadlock search, going by
    /// the stamp in rank 1's mailbox (not the one its library published), says so.
    #[test]
    fn a_stamp_taken_back_before_anyone_saw_it_is_a_deadlock_not_a_hang() {
        let barrier = Barrier::new(2);
        let results = with_group(2, |g| {
            g.barrier().unwrap();
            barrier.wait(); // rank 0 saw rank 1 at the barrier's point, not further
            let mut data = [g.rank() as u8; 8];
            if g.rank() == 1 {
                g.broadcast(&mut data, 1).unwrap();
                return g.barrier();
            }
            let forger = Forger::of(g).unwrap();
            let before = forger.stamp(0);
            forger.wait_for(1, before + 2); // rank 1 is in its barrier
            forger.write_eager_stamp(1, before + 1, 0);
            forger.write_stamp(1, before);
            g.broadcast(&mut data, 1)
        });
        for (rank, result) in results.into_iter().enumerate() {
            assert!(
                matches!(result, Err(Error::Deadlock { rank: r, .. }) if r == rank),
                "rank {rank}: expected a deadlock, got {result:?}"
            );
        }
    }
}
