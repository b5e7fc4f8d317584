//! Every collective, every dtype and reduction, in place and out of place, with one thread per
//! rank over real loopback TCP, real shared memory, and a ring that mixes both (two pretend
//! hosts); compared with the reference and across ranks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
#[macro_use]
mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::*;
use jaccl::half::{bf16, f16};
use jaccl::num_complex::Complex32;
use jaccl::{Config, Dtype, Element, Error, Group, ReduceOp, Topology, Transport, WaitPolicy};

fn all_reduce_case<T: TestElem>(g: &mut Group, lengths: &[usize]) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    let mut digest = Vec::new();
    for &len in lengths {
        for op in ops_of::<T>() {
            let ins = inputs::<T>(size, len, op);
            let expect = bits_for(op, &expected_reduction::<T>(size, len, op));
            let what = format!("{} {op} len {len} rank {rank}/{size}", T::DTYPE);
            let mut out = vec![T::default(); len];
            g.all_reduce(&ins[rank], &mut out, op)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_same(
                &bits_for(op, &out),
                &expect,
                &format!("out of place: {what}"),
            );
            let mut data = ins[rank].clone();
            g.all_reduce_in_place(&mut data, op)
                .unwrap_or_else(|e| panic!("{what} in place: {e}"));
            assert_same(&bits_for(op, &data), &expect, &format!("in place: {what}"));
            digest.extend(bits(&out));
        }
    }
    digest
}

/// Sizes around the shared-memory algorithms' limits: the inline payload (8 bytes), the
/// one-round all-reduce (8 KiB, 64 KiB with 2 ranks) and an area (1 MiB) per round.
fn shm_lengths<T: Element>() -> Vec<usize> {
    let elems = |bytes: usize| bytes / size_of::<T>().max(1);
    let mut v: Vec<usize> = [8, 8 * 1024, 64 * 1024, 1 << 20]
        .into_iter()
        .flat_map(|b| [elems(b).saturating_sub(1), elems(b), elems(b) + 1])
        .collect();
    v.push(elems(3 << 20) + 7);
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn all_reduce_every_dtype_op_size_and_wires() {
    for net in nets() {
        for size in SIZES {
            for wires in WIRES {
                let digests = with_group(net, size, wires, |g| {
                    for_all_dtypes!(net, all_reduce_case, g, &edge_lengths(size, wires))
                });
                for (rank, d) in digests.iter().enumerate() {
                    assert_eq!(
                        d, &digests[0],
                        "{net:?}: rank {rank} differs from rank 0 (size {size} wires {wires})"
                    );
                }
            }
        }
    }
}

/// Every group size from 1 to 17 over TCP, primes included. All-reduce: recursive doubling
/// among any number of ranks (5 or more; the ranks beyond a power of two hand over their
/// vectors before and take the result after), the both-ways gather, Rabenseifner's halving
/// then doubling (64 KiB, in blocks of uneven length) and the ring past it. All-gather:
/// Bruck's rounds (6 ranks or more), the gathers and the ring. Reduce-scatter: recursive
/// halving (3 ranks or more, those beyond a power of two folded in) up to 16 KiB per rank, the
/// ring past it. The barrier. Then every other
/// collective once, the rooted ones from every root, with uneven counts (some empty). Against
/// the reference and across ranks.
#[test]
fn collectives_at_every_size_up_to_17() {
    for size in 1..=17 {
        let digests = with_group(Net::Tcp, size, 1, |g| {
            let mut d = all_reduce_case::<f32>(g, &[1, 13, 4099, 16_411, 100_003]);
            d.extend(all_reduce_case::<i64>(g, &[2, 5003]));
            d.extend(all_gather_case::<f32>(g, &[1, 7, 3001, 4_500, 40_000]));
            d.extend(all_gather_case::<u8>(g, &[5]));
            reduce_scatter_case::<f32>(g, &[1, 3, 1001, 4096, 4097]);
            reduce_scatter_case::<i64>(g, &[2]);
            g.barrier()
                .unwrap_or_else(|e| panic!("barrier among {size}: {e}"));
            let roots: Vec<usize> = (0..size).collect();
            let wrong = every_collective_once(g, &roots)
                .unwrap_or_else(|e| panic!("rank {} of {size}: {e}", g.rank()));
            assert_eq!(wrong, None, "rank {} of {size}", g.rank());
            d
        });
        for (rank, d) in digests.iter().enumerate() {
            assert_eq!(d, &digests[0], "rank {rank} of {size} differs from rank 0");
        }
    }
}

/// Broadcasts among 16 and 17 ranks over TCP, where each kind runs: the tree (up to 32 KiB),
/// all of the data each way to half the ranks (above, up to 128 KiB per hop), the ring's
/// halves all the way round (above that); on one wire and on three; lengths of odd bytes, from
/// the first, a middle and the last rank, bytes that are only copied going straight from the
/// kernel into the output (from 64 KiB). Against the root's data on every rank.
#[test]
fn broadcasts_of_every_kind_among_many_ranks() {
    for (size, wires) in [(16, 1), (17, 1), (16, 3)] {
        with_group(Net::Tcp, size, wires, |g| {
            for len in [20_001, 40_001, 1_000_003, 2_200_003] {
                for root in [0, size / 2, size - 1] {
                    let expect: Vec<u8> = (0..len).map(|k| ((k * 31 + root) % 251) as u8).collect();
                    let mut data = match g.rank() == root {
                        true => expect.clone(),
                        false => vec![0u8; len],
                    };
                    g.broadcast(&mut data, root).unwrap();
                    let what = format!("len {len} root {root} rank {}/{size}", g.rank());
                    assert!(data == expect, "{what}");
                }
            }
        });
    }
}

/// Given its links' figures (`Config::link`), a group chooses its all-reduces by the cost
/// model, at sizes and rank counts where the measured thresholds choose otherwise (over TCP
/// without the mesh, 1 Gb/s with 50 µs: the ring from 16 KiB among 6 ranks; 100 Gb/s with
/// 2 µs: recursive doubling at 16 KiB, Rabenseifner's among 9 from 64 KiB), and sub-groups
/// choose alike. Against the reference and across ranks.
#[test]
fn all_reduces_chosen_by_the_cost_model_for_given_links() {
    for link in ["1Gb/s,50us", "100Gb/s,2us"] {
        for size in [3, 6, 9] {
            let make = || {
                configs(Net::Tcp, size, 1, Duration::from_secs(60))
                    .into_iter()
                    .map(|c| c.link(link.parse().unwrap()))
                    .collect()
            };
            let digests = with_configs(make, |g| {
                let lengths = [1, 7, 13, 1000, 4099, 16_411, 100_003, 300_001];
                let mut d = all_reduce_case::<f32>(g, &lengths);
                d.extend(all_reduce_case::<i16>(g, &[5, 70_001]));
                let mut sub = g.split(Some(u32::from(g.rank() % 2 == 0)), 0).unwrap();
                if let Some(sub) = sub.as_mut() {
                    all_reduce_case::<f64>(sub, &[3, 9000]);
                }
                d
            });
            for (rank, d) in digests.iter().enumerate() {
                assert_eq!(d, &digests[0], "{link}: rank {rank} of {size}");
            }
        }
    }
}

/// The model's choice is the one that runs: links that cost only latency (1 s a message, 1 TB/s)
/// make recursive doubling the cheapest among 6 ranks at 4 MiB, where the measured thresholds
/// take the ring, and links that cost only bytes (1 B/s, no latency) make the ring the cheapest
/// at 64 KiB, where they take Rabenseifner's. Doubling and Rabenseifner's connect to ranks off
/// the ring on first use; the ring does not.
#[test]
fn the_cost_models_choice_is_the_one_that_runs() {
    for (link, len, off_the_ring) in [("1TB/s,1s", 1 << 20, true), ("1B/s,0ns", 16 << 10, false)] {
        let make = || {
            configs(Net::Tcp, 6, 1, Duration::from_secs(60))
                .into_iter()
                .map(|c| c.link(link.parse().unwrap()))
                .collect()
        };
        let peers = with_configs(make, |g| {
            let before = g.transport().len();
            let mut data = vec![1.0f32; len];
            g.all_reduce_in_place(&mut data, ReduceOp::Sum).unwrap();
            assert!(data.iter().all(|&v| v == 6.0), "{link}");
            (before, g.transport().len())
        });
        assert!(peers.iter().all(|&(before, _)| before == 2), "{peers:?}");
        let opened = peers.iter().any(|&(_, after)| after > 2);
        assert_eq!(opened, off_the_ring, "{link}: {peers:?}");
    }
}

/// 64 ranks over TCP: every collective, the rooted ones from every root, uneven blocks
/// (some empty), against references and a float sum bit-identical on every rank.
#[test]
fn every_collective_from_every_root_among_64_ranks() {
    let wrong = with_group(Net::Tcp, 64, 1, |g| {
        let roots: Vec<usize> = (0..g.size()).collect();
        every_collective_once(g, &roots).unwrap_or_else(|e| panic!("rank {}: {e}", g.rank()))
    });
    for (rank, w) in wrong.iter().enumerate() {
        assert_eq!(w, &None, "rank {rank}");
    }
}

/// Every collective from every root across pretend hosts of each layout: 2 × 4, 3 × 3
/// interleaved, 4 + 3 + 2 interleaved and 4 × 2 (shared memory within a host, TCP between
/// hosts, or RDMA where the machine has a port; the sizes of the flat algorithms), every
/// result against the reference.
#[test]
fn every_collective_from_every_root_across_pretend_hosts() {
    let layouts: [&[usize]; 4] = [
        &[0, 0, 0, 0, 1, 1, 1, 1],
        &[0, 1, 2, 0, 1, 2, 0, 1, 2],
        &[0, 1, 0, 2, 1, 0, 2, 1, 0],
        &[0, 0, 1, 1, 2, 2, 3, 3],
    ];
    for host_of in layouts {
        let make = || on_pretend_hosts(host_of);
        let wrong = with_configs(make, |g| {
            let roots: Vec<usize> = (0..g.size()).collect();
            every_collective_once(g, &roots)
                .unwrap_or_else(|e| panic!("{host_of:?} rank {}: {e}", g.rank()))
        });
        for (rank, w) in wrong.iter().enumerate() {
            assert_eq!(w, &None, "{host_of:?} rank {rank}");
        }
    }
}

#[test]
fn shared_memory_sizes_around_every_algorithm_limit() {
    for size in [2, 3, 4] {
        let digests = with_group(Net::Shm, size, 1, |g| {
            let mut d = all_reduce_case::<f32>(g, &shm_lengths::<f32>());
            d.extend(all_reduce_case::<u8>(g, &shm_lengths::<u8>()));
            d.extend(all_reduce_case::<Complex32>(g, &shm_lengths::<Complex32>()));
            d.extend(all_gather_case::<f64>(g, &shm_lengths::<f64>()));
            reduce_scatter_case::<i16>(g, &shm_lengths::<i16>());
            d
        });
        assert!(digests.iter().all(|d| d == &digests[0]), "size {size}");
    }
}

#[test]
fn transports_are_chosen_per_neighbour() {
    for net in nets() {
        for size in [2, 3, 4, 5] {
            let seen = with_group(net, size, 1, |g| {
                (g.transport(), g.shares_memory_with_all())
            });
            for (rank, (transports, direct)) in seen.into_iter().enumerate() {
                let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
                let mut expect = vec![(left, net.between(rank, left, size))];
                if right != left {
                    expect.push((right, net.between(rank, right, size)));
                }
                // Other ranks: at start-up those on this host (shared memory), with the mesh
                // all (TCP to other hosts).
                let others = (0..size).filter(|&p| p != rank && p != left && p != right);
                expect.extend(others.filter_map(|p| match net.local(rank, p, size) {
                    true => Some((p, Transport::Shm)),
                    false => net.mesh().then_some((p, Transport::Tcp)),
                }));
                assert_eq!(transports, expect, "{net:?} size {size} rank {rank}");
                assert_eq!(direct, net.direct(), "{net:?} size {size} rank {rank}");
            }
        }
    }
}

#[test]
fn large_messages_of_byte_types_take_the_ring_path() {
    // Small messages gather whole vectors; 1-byte elements need long vectors to reach the ring.
    for net in nets() {
        for (size, wires) in [(2, 1), (3, 3), (5, 1)] {
            let lengths = [300_007];
            let digests = with_group(net, size, wires, |g| {
                let mut d = all_reduce_case::<bool>(g, &lengths);
                d.extend(all_reduce_case::<i8>(g, &lengths));
                d.extend(all_reduce_case::<u8>(g, &lengths));
                d.extend(all_gather_case::<u8>(g, &lengths));
                d
            });
            assert!(digests.iter().all(|d| d == &digests[0]));
        }
    }
}

fn all_gather_case<T: TestElem>(g: &mut Group, lengths: &[usize]) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    let mut digest = Vec::new();
    for &len in lengths {
        let ins = inputs::<T>(size, len, ReduceOp::Sum);
        let expect: Vec<T> = ins.concat();
        let mut out = vec![T::default(); size * len];
        g.all_gather(&ins[rank], &mut out)
            .unwrap_or_else(|e| panic!("{} len {len} rank {rank}: {e}", T::DTYPE));
        assert_eq!(
            bits(&out),
            bits(&expect),
            "{} len {len} rank {rank}/{size}",
            T::DTYPE
        );
        digest.extend(bits(&out));
    }
    digest
}

fn reduce_scatter_case<T: TestElem>(g: &mut Group, lengths: &[usize]) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    for &len in lengths {
        for op in ops_of::<T>() {
            let ins = inputs::<T>(size, size * len, op);
            let full = expected_reduction::<T>(size, size * len, op);
            let expect = bits_for(op, &full[rank * len..(rank + 1) * len]);
            let mut out = vec![T::default(); len];
            g.reduce_scatter(&ins[rank], &mut out, op)
                .unwrap_or_else(|e| panic!("{} {op} len {len} rank {rank}: {e}", T::DTYPE));
            let what = format!("{} {op} len {len} rank {rank}/{size}", T::DTYPE);
            assert_same(&bits_for(op, &out), &expect, &what);
        }
    }
    Vec::new()
}

#[test]
fn all_gather_and_reduce_scatter_every_dtype_size_and_wires() {
    for net in nets() {
        for size in SIZES {
            for wires in WIRES {
                let lengths = edge_lengths(size, wires);
                let digests = with_group(net, size, wires, |g| {
                    let mut d = for_all_dtypes!(net, all_gather_case, g, &lengths);
                    d.extend(for_all_dtypes!(net, reduce_scatter_case, g, &lengths));
                    d
                });
                assert!(digests.iter().all(|d| d == &digests[0]), "{net:?}");
            }
        }
    }
}

fn send_recv_case<T: TestElem>(g: &mut Group, lengths: &[usize]) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    for &len in lengths {
        // Shift right, then left. Even ranks send first, odd ranks receive first. The left
        // shift is tagged, with a tag above the 16 bits shared memory describes it in.
        for (to, from, tag) in [(right, left, 0), (left, right, u32::MAX - len as u32)] {
            let mine: Vec<T> = (0..len).map(|i| T::value(rank, i, ReduceOp::Sum)).collect();
            let expect: Vec<T> = (0..len).map(|i| T::value(from, i, ReduceOp::Sum)).collect();
            let mut got = vec![T::default(); len];
            if rank % 2 == 0 {
                g.send_tagged(&mine, to, tag).unwrap();
                g.recv_tagged(&mut got, from, tag).unwrap();
            } else {
                g.recv_tagged(&mut got, from, tag).unwrap();
                g.send_tagged(&mine, to, tag).unwrap();
            }
            assert_eq!(
                bits(&got),
                bits(&expect),
                "{} len {len} rank {rank}/{size}",
                T::DTYPE
            );
        }
    }
    Vec::new()
}

#[test]
fn send_recv_to_both_neighbours() {
    for net in nets() {
        for size in [2, 3, 4, 5] {
            for wires in WIRES {
                // 300 KiB of u8 and more of wider types overflow a shared-memory ring.
                let lengths = [0, 1, 5, 4096, 70_001, 300_007];
                with_group(net, size, wires, |g| {
                    for_all_dtypes!(net, send_recv_case, g, &lengths)
                });
            }
        }
    }
}

/// Sends in a cycle complete: every rank sends before it receives (to its right neighbour, to
/// both neighbours, and with the mesh to every other rank), with messages far larger than a
/// connection or a shared-memory ring holds. A rank blocked sending reads ahead what its peers
/// send it; without that, every rank waits for a receiver that is itself sending.
#[test]
fn sends_in_a_cycle_complete() {
    fn cycle_case<T: TestElem>(g: &mut Group, lengths: &[usize]) -> Vec<u64> {
        let (rank, size) = (g.rank(), g.size());
        let mesh = g.topology() == Some(Topology::Mesh);
        // Shifts by 1 (right), by -1 (left), then by every distance at once with the mesh.
        let mut rounds: Vec<Vec<usize>> = vec![vec![1], vec![size - 1]];
        if mesh {
            rounds.push((1..size).collect());
        } else if size > 2 {
            rounds.push(vec![1, size - 1]);
        }
        let value = |from: usize, to: usize, i: usize| T::value(from * size + to, i, ReduceOp::Sum);
        for &len in lengths {
            for shifts in &rounds {
                for &s in shifts {
                    let to = (rank + s) % size;
                    let mine: Vec<T> = (0..len).map(|i| value(rank, to, i)).collect();
                    g.send(&mine, to).unwrap();
                }
                for &s in shifts {
                    let from = (rank + size - s) % size;
                    let mut got = vec![T::default(); len];
                    g.recv(&mut got, from).unwrap();
                    let expect: Vec<T> = (0..len).map(|i| value(from, rank, i)).collect();
                    assert_eq!(
                        bits(&got),
                        bits(&expect),
                        "{} len {len} {from} → {rank}",
                        T::DTYPE
                    );
                }
            }
        }
        Vec::new()
    }
    for net in nets() {
        for size in [2, 3, 4] {
            with_group(net, size, 1, |g| {
                cycle_case::<u8>(g, &[1, 300_007]);
                cycle_case::<f32>(g, &[2 << 20]);
            });
        }
    }
}

/// Every rank sends to and receives from every other one, in one global order of pairs (so no
/// rank waits on a pair that cannot proceed), whatever their distance: over the mesh's links,
/// shared memory within a host, or connections made on first use; afterwards every rank has a
/// link to every other.
#[test]
fn send_recv_between_every_pair_of_ranks() {
    fn pairs_case<T: TestElem>(g: &mut Group, lengths: &[usize]) -> Vec<u64> {
        let (rank, size) = (g.rank(), g.size());
        for &len in lengths {
            for (from, to) in (0..size).flat_map(|a| (0..size).map(move |b| (a, b))) {
                let value = |i| T::value(from * size + to, i, ReduceOp::Sum);
                if from == to {
                    continue;
                } else if rank == from {
                    let mine: Vec<T> = (0..len).map(value).collect();
                    g.send(&mine, to).unwrap();
                } else if rank == to {
                    let mut got = vec![T::default(); len];
                    g.recv(&mut got, from).unwrap();
                    let expect: Vec<T> = (0..len).map(value).collect();
                    assert_eq!(
                        bits(&got),
                        bits(&expect),
                        "{} len {len} {from} → {to}",
                        T::DTYPE
                    );
                }
            }
        }
        Vec::new()
    }
    for net in nets() {
        let sizes: &[usize] = if net.mesh() { &[2, 4, 5, 6] } else { &[2, 5] };
        for &size in sizes {
            for wires in [1, 2] {
                let peers = with_group(net, size, wires, |g| {
                    pairs_case::<u8>(g, &[0, 1, 4097, 300_007]);
                    pairs_case::<f64>(g, &[3, 70_001]);
                    pairs_case::<Complex32>(g, &[5]);
                    g.transport()
                });
                for (rank, peers) in peers.iter().enumerate() {
                    let mut ranks: Vec<usize> = peers.iter().map(|p| p.0).collect();
                    ranks.sort_unstable();
                    let others: Vec<usize> = (0..size).filter(|&p| p != rank).collect();
                    assert_eq!(ranks, others, "{net:?} size {size}: rank {rank}'s links");
                }
            }
        }
    }
}

/// Receives from any rank: the lowest and the highest rank each take one message from every
/// other (small and large, after which the senders drop their groups), from ranks with and
/// without a link yet (on the ring and off it: pretend hosts make links on first use); each
/// sender's messages arrive in the order it sent them; a tag that differs is a `Mismatch`; a
/// group of one has nobody to receive from.
#[test]
fn recv_any_takes_every_sender_in_turn() {
    for net in nets() {
        for size in [2, 3, 5] {
            for receiver in [0, size - 1] {
                let got = with_group(net, size, 2, |g| {
                    let (rank, n) = (g.rank(), g.size() as u64);
                    if rank != receiver {
                        for k in 0..3u64 {
                            let len = if k == 1 { 300_007 } else { 3 };
                            g.send(&vec![rank as u64 * 100 + k; len], receiver).unwrap();
                        }
                        return Vec::new();
                    }
                    let mut seen = Vec::new();
                    while (seen.len() as u64) < 3 * (n - 1) {
                        // Which message comes next is unknown: try the small length first.
                        let mut small = [0u64; 3];
                        let (src, first) = match g.recv_any(&mut small) {
                            Ok(src) => (src, small[0]),
                            Err(e) => panic!("{net:?} size {size} rank {rank}: {e}"),
                        };
                        assert!(small.iter().all(|&v| v == first), "{net:?}: {small:?}");
                        seen.push((src, first));
                        if first % 100 == 0 {
                            // The next from this sender is the large one: take it from it.
                            let mut large = vec![0u64; 300_007];
                            g.recv(&mut large, src).unwrap();
                            assert!(large.iter().all(|&v| v == first + 1));
                            seen.push((src, first + 1));
                        }
                    }
                    seen
                });
                let seen = &got[receiver];
                let what = format!("{net:?} size {size} receiver {receiver}: {seen:?}");
                for sender in (0..size).filter(|&r| r != receiver) {
                    let from: Vec<u64> = seen
                        .iter()
                        .filter(|(src, _)| *src == sender)
                        .map(|(_, v)| *v)
                        .collect();
                    let base = sender as u64 * 100;
                    assert_eq!(from, [base, base + 1, base + 2], "{what}");
                }
            }
        }
        let results = with_group(net, 2, 1, |g| match g.rank() {
            0 => g.send_tagged(&[1u8], 1, 6),
            _ => g.recv_any_tagged(&mut [0u8], 5).map(drop),
        });
        let Err(Error::Mismatch { detail, .. }) = &results[1] else {
            panic!("{net:?}: {results:?}");
        };
        assert!(
            detail.contains("with tag 6") && detail.contains("with tag 5"),
            "{detail}"
        );
        // A rank that moved on to the next collective is no sender: its header, which comes
        // first (the sender waits a moment), is left for the barrier.
        with_group(net, 3, 1, |g| {
            for _ in 0..5 {
                match g.rank() {
                    0 => assert_eq!(g.recv_any(&mut [0u8; 4]).unwrap(), 1, "{net:?}"),
                    1 => {
                        std::thread::sleep(Duration::from_millis(20));
                        g.send(&[1u8; 4], 0).unwrap();
                    }
                    _ => {}
                }
                g.barrier().unwrap();
            }
        });
        // Every rank waiting for any other: the heartbeat names the deadlock.
        let results = with_group(net, 3, 1, |g| g.recv_any(&mut [0u8]));
        for (rank, r) in results.iter().enumerate() {
            assert!(
                matches!(r, Err(Error::Deadlock { .. } | Error::PeerLost { .. })),
                "{net:?} rank {rank}: {r:?}"
            );
        }
    }
    let mut alone = jaccl::init_with(Config::new(0, 1)).unwrap();
    assert!(matches!(
        alone.recv_any(&mut [0u8]),
        Err(Error::InvalidArgument(_))
    ));
}

/// A receive from any source passes over a peer that has gone on to a collective (its header
/// waits at the receiver, or it waits in a direct collective over shared memory): it can send
/// nothing before the receiver enters that collective too, so the message is another's. With
/// every other rank in a collective, the receive is a `Mismatch` naming one.
#[test]
fn recv_any_passes_over_peers_in_a_collective() {
    for net in nets() {
        let got = with_group(net, 3, 1, |g| match g.rank() {
            0 => {
                let mut x = [0u32];
                let src = g.recv_any(&mut x)?;
                g.barrier()?;
                Ok(Some((src, x[0])))
            }
            1 => g.barrier().map(|()| None),
            _ => {
                // Long after rank 1 entered the barrier (and the 250 ms a peer may be ahead).
                std::thread::sleep(Duration::from_secs(1));
                g.send(&[7u32], 0)?;
                g.barrier().map(|()| None)
            }
        });
        assert!(matches!(got[0], Ok(Some((2, 7)))), "{net:?}: {got:?}");
        let got = with_group(net, 2, 1, |g| match g.rank() {
            0 => g.recv_any(&mut [0u8]).map(drop),
            _ => g.barrier(),
        });
        assert!(
            matches!(&got[0], Err(Error::Mismatch { peer: 1, detail, .. }) if detail.contains("in a collective")),
            "{net:?}: {got:?}"
        );
    }
}

/// A receive from any source that nobody can answer is a `Deadlock`, also when a peer it
/// waited for goes on to a collective after the receive first told the deadlock search what
/// it waits for (that report, kept, counted the peer as one that may still send).
#[test]
fn recv_any_that_nobody_answers_is_a_deadlock() {
    for net in nets() {
        let got = with_group(net, 3, 1, |g| match g.rank() {
            0 => g.recv(&mut [0u32], 2),
            1 => {
                std::thread::sleep(Duration::from_millis(500));
                g.barrier()
            }
            _ => g.recv_any(&mut [0u32]).map(drop),
        });
        // Once the deadlock is declared, the rank that receives from any source may see
        // rank 0 leave first: then the only rank left is in a collective (Mismatch).
        let ended = |r: &jaccl::Result<()>| {
            matches!(
                r,
                Err(Error::Deadlock { .. } | Error::Mismatch { .. } | Error::PeerLost { .. })
            )
        };
        let deadlock = got.iter().any(|r| matches!(r, Err(Error::Deadlock { .. })));
        assert!(deadlock && got.iter().all(ended), "{net:?}: {got:?}");
    }
}

/// Every rank knows, alike, which ranks share a host: from the host identities they publish
/// (pretend hosts of 4, 3 and 2 ranks, interleaved), and a sub-group from its own members. It
/// is the layout the transports follow: shared memory exactly between ranks of one host.
#[test]
fn every_rank_knows_the_same_host_layout_and_a_sub_group_its_own() {
    let host_of = [0, 1, 0, 2, 1, 0, 2, 1, 0];
    let size = host_of.len();
    let expect: [&[usize]; 3] = [&[0, 2, 5, 8], &[1, 4, 7], &[3, 6]];
    let make = || on_pretend_hosts(&host_of);
    let seen = with_configs(make, |g| {
        let mut sum = [0u64];
        g.all_sum(&[1u64 << g.rank()], &mut sum).unwrap();
        // Ranks 1.. : the sub-group's rank r is the job's rank r + 1.
        let members: Vec<usize> = (1..size).collect();
        let sub = g.subgroup(&members).unwrap().map(|s| s.hosts().clone());
        (g.hosts().clone(), g.transport(), sum[0], sub)
    });
    for (rank, (hosts, transport, sum, sub)) in seen.into_iter().enumerate() {
        assert_eq!(sum, (1 << size) - 1, "rank {rank}");
        assert_eq!(hosts.count(), 3, "rank {rank}");
        for (h, ranks) in expect.iter().enumerate() {
            assert_eq!(hosts.ranks_on(h), *ranks, "rank {rank}");
        }
        assert_eq!(hosts.host(), host_of[rank]);
        let here = expect[host_of[rank]];
        assert_eq!(here[hosts.local_rank()], rank);
        assert_eq!(hosts.local_size(), here.len());
        for (peer, t) in transport {
            let same = host_of[peer] == host_of[rank];
            assert_eq!(t == Transport::Shm, same, "rank {rank} to {peer}: {t}");
        }
        // Without job rank 0, the sub-group's first host is the job's host 1 (its lowest rank,
        // job rank 1, is the sub-group's rank 0), then the job's hosts 0 and 2.
        match sub {
            None => assert_eq!(rank, 0),
            Some(sub) => {
                let sub_expect: [&[usize]; 3] = [&[0, 3, 6], &[1, 4, 7], &[2, 5]];
                for (h, ranks) in sub_expect.iter().enumerate() {
                    assert_eq!(sub.ranks_on(h), *ranks, "rank {rank}");
                }
                assert_eq!(sub.host(), [0, 1, 2, 0, 1, 2, 0, 1][rank - 1]);
            }
        }
    }
}

/// Small all-reduces among hosts that hold the ranks in blocks (2 × 4, 2 × 2, 4 × 2) double
/// within each host and swap slices across hosts from 2 KiB: lengths on both sides of that,
/// slices of different lengths, every reduction, in and out of place, against the reference
/// and the same bits on every rank; a rank sends its slice of a 32 KiB all-reduce across
/// hosts (1/L of it) at each step across, where plain doubling sends all of it. Interleaved
/// hosts (2 × 4 alternating) take plain doubling, checked alike; so do RDMA rings (in the RDMA
/// VM).
#[test]
fn small_all_reduces_across_hosts_in_blocks_double_within_hosts() {
    // Each layout with the bytes of a 32 KiB all-reduce a rank sends across: its slice (1/L) at
    // each of the steps across hosts, or the whole message where plain doubling runs.
    let s = 32 << 10;
    let in_blocks = |per_host: usize, steps: usize| match rdma_here() {
        true => s * steps,
        false => s / per_host * steps,
    };
    let layouts: [(&[usize], usize); 4] = [
        (&[0, 0, 0, 0, 1, 1, 1, 1], in_blocks(4, 1)),
        (&[0, 0, 1, 1], in_blocks(2, 1)),
        (&[0, 0, 1, 1, 2, 2, 3, 3], in_blocks(2, 2)),
        (&[0, 1, 0, 1, 0, 1, 0, 1], s),
    ];
    for (host_of, across) in layouts {
        let make = || on_pretend_hosts(host_of);
        let digests = with_configs(make, |g| {
            let mut d = all_reduce_case::<f32>(g, &[1, 13, 511, 513, 4099, 8192]);
            d.extend(all_reduce_case::<u8>(g, &[2, 9, s]));
            d.extend(all_reduce_case::<f64>(g, &[5, 4095]));
            let before = g.bytes_across_hosts().unwrap().sent;
            let mut out = vec![0u8; s];
            let rank = u8::try_from(g.rank()).unwrap();
            g.all_reduce(&vec![rank; s], &mut out, ReduceOp::Max)
                .unwrap();
            let sent = g.bytes_across_hosts().unwrap().sent - before;
            let top = u8::try_from(g.size() - 1).unwrap();
            assert!(out.iter().all(|&v| v == top), "{host_of:?}");
            // The data, and headers of at most a few hundred bytes.
            let data = across as u64;
            assert!(
                (data..data + 512).contains(&sent),
                "{host_of:?}: {sent} B across"
            );
            d
        });
        for (rank, d) in digests.iter().enumerate() {
            assert_eq!(
                d, &digests[0],
                "{host_of:?}: rank {rank} differs from rank 0"
            );
        }
    }
}

/// All-reduces, reduces, all-gathers, reduce-scatters and (on hosts whose ranks alternate)
/// broadcasts across hosts of equal size, at least 2 ranks each, go in two levels from 512 KiB
/// (the first two) and 1 MiB (4 hosts × 2 ranks, 3 × 3 interleaved); uneven hosts
/// (4 + 3 + 2) and smaller messages take the flat algorithms. Every result against the reference,
/// in and out of place, with the averaging left to the group, and the same on every rank.
#[test]
fn collectives_across_pretend_hosts_in_two_levels() {
    let layouts: [&[usize]; 3] = [
        &[0, 0, 1, 1, 2, 2, 3, 3],
        &[0, 1, 2, 0, 1, 2, 0, 1, 2],
        &[0, 1, 0, 2, 1, 0, 2, 1, 0],
    ];
    for host_of in layouts {
        let size = host_of.len();
        let make = || on_pretend_hosts(host_of);
        let digests = with_configs(make, |g| {
            let mut digest = Vec::new();
            // f32: 512 KiB less one element (flat), 512 KiB (two levels, one chunk), then 3 MiB
            // and 7 elements (chunks of uneven length).
            for len in [(1 << 17) - 1, 1 << 17, (3 << 18) + 7] {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    let what = format!("{host_of:?} rank {} {op:?} {len}", g.rank());
                    let input = &inputs::<f32>(size, len, op)[g.rank()];
                    let expect = expected_reduction::<f32>(size, len, op);
                    let mut out = vec![0f32; len];
                    g.all_reduce(input, &mut out, op).unwrap();
                    assert_same_values(&out, &expect, &what);
                    let mut data = input.clone();
                    g.all_reduce_in_place(&mut data, op).unwrap();
                    assert_same_values(&data, &expect, &what);
                    digest.extend(bits(&out[..64]));
                    // Reduces to two roots: rank 1 and the last.
                    for root in [1, size - 1] {
                        let mut out = vec![0f32; if g.rank() == root { len } else { 0 }];
                        g.reduce(input, &mut out, op, root).unwrap();
                        if g.rank() == root {
                            assert_same_values(&out, &expect, &format!("{what} reduce"));
                        }
                    }
                }
                // Broadcasts from two roots: from 1 MiB in two levels where the hosts' ranks
                // alternate (else along the chain), below down the trees there.
                for root in [1, size - 1] {
                    let expect = &inputs::<f32>(size, len, ReduceOp::Sum)[root];
                    let mut data = match g.rank() == root {
                        true => expect.clone(),
                        false => vec![0f32; len],
                    };
                    g.broadcast(&mut data, root).unwrap();
                    let what = format!("{host_of:?} rank {} {len} from {root}", g.rank());
                    assert_same_values(&data, expect, &what);
                }
                let ints = &inputs::<i32>(size, len, ReduceOp::Prod)[g.rank()];
                let mut out = vec![0i32; len];
                g.all_reduce(ints, &mut out, ReduceOp::Prod).unwrap();
                let expect = expected_reduction::<i32>(size, len, ReduceOp::Prod);
                assert_same_values(&out, &expect, "i32 product");
            }
            // All-gathers (by the output) and reduce-scatters (by the input) on either side of
            // 1 MiB, then in 2 chunks of uneven length.
            for block in [
                (1 << 18) / size - 1,
                (1usize << 18).div_ceil(size) + 5,
                (5 << 18) / size + 7,
            ] {
                let what = format!("{host_of:?} rank {} block {block}", g.rank());
                let all = inputs::<i32>(size, block, ReduceOp::Sum);
                let mut out = vec![0i32; size * block];
                g.all_gather(&all[g.rank()], &mut out).unwrap();
                assert_same_values(&out, &all.concat(), &what);
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    let input = &inputs::<f32>(size, size * block, op)[g.rank()];
                    let expect = expected_reduction::<f32>(size, size * block, op);
                    let mut out = vec![0f32; block];
                    g.reduce_scatter(input, &mut out, op).unwrap();
                    assert_same_values(&out, &expect[g.rank() * block..][..block], &what);
                }
            }
            // Two at once on the progress thread (whose calls use the levels' own).
            let len = (3 << 18) + 7;
            let input = inputs::<f32>(size, len, ReduceOp::Sum)[g.rank()].clone();
            let requests: Vec<_> = (0..2)
                .map(|_| {
                    let mut data = input.clone();
                    g.start(move |g| {
                        g.all_reduce_in_place(&mut data, ReduceOp::Sum)?;
                        Ok(data)
                    })
                })
                .collect();
            let expect = expected_reduction::<f32>(size, len, ReduceOp::Sum);
            for request in requests {
                assert_same_values(&request.wait().unwrap(), &expect, "started");
            }
            // Every byte a rank sent to another host, that host received, levels included
            // (counted after the same call everywhere, which every rank has finished).
            let traffic = g.bytes_across_hosts().unwrap();
            let mut all = vec![0u64; 2 * size];
            g.all_gather(&[traffic.sent, traffic.received], &mut all)
                .unwrap();
            let sent: u64 = all.iter().step_by(2).sum();
            let received: u64 = all.iter().skip(1).step_by(2).sum();
            assert!(sent > (1 << 20), "{host_of:?}: {all:?}");
            assert_eq!(sent, received, "{host_of:?}: {all:?}");
            digest
        });
        assert!(digests.iter().all(|d| d == &digests[0]), "{host_of:?}");
    }
}

/// `auto` builds the mesh for 4 ranks or more when each is on a host of its own and they talk
/// TCP (here: pretend hosts, so no shared memory; inside the RDMA VM they talk RDMA instead and
/// keep the ring).
#[test]
fn auto_builds_the_mesh_for_one_rank_per_host_over_tcp() {
    for size in [3, 4, 6] {
        let make = || {
            let cfgs = configs(Net::Mixed, size, 1, Duration::from_secs(60));
            let hosts = cfgs.into_iter().enumerate();
            hosts.map(|(r, c)| c.host_id(format!("host{r}"))).collect()
        };
        let seen = with_configs(make, |g| {
            let mut out = [0u64; 3];
            g.all_sum(&[g.rank() as u64; 3], &mut out).unwrap();
            (g.topology(), g.transport().len(), out)
        });
        let mesh = size >= 4 && !rdma_here();
        let sum = (size * (size - 1) / 2) as u64;
        for (rank, (topology, peers, out)) in seen.into_iter().enumerate() {
            let expect = if mesh { Topology::Mesh } else { Topology::Ring };
            assert_eq!(topology, Some(expect), "size {size} rank {rank}");
            assert_eq!(peers, if mesh { size - 1 } else { 2 }, "size {size}");
            assert_eq!(out, [sum; 3]);
        }
    }
}

#[test]
fn barrier_waits_for_every_rank() {
    for (net, size) in nets().into_iter().flat_map(|n| SIZES.map(|s| (n, s))) {
        let entered = Mutex::new(vec![0usize; size]);
        with_group(net, size, 1, |g| {
            for round in 1..=20 {
                entered.lock().unwrap()[g.rank()] = round;
                g.barrier().unwrap();
                let seen = entered.lock().unwrap().clone();
                assert!(
                    seen.iter().all(|&r| r >= round),
                    "{net:?}: rank {} left barrier {round} before all entered: {seen:?}",
                    g.rank()
                );
                // A second barrier keeps anyone from entering round + 1 before all checked.
                g.barrier().unwrap();
            }
        });
    }
}

/// Ranks that wait differently fence differently when they publish (the shared-memory
/// module's `Peer::wake`): here rank 1 sleeps at once while ranks 0 and 2 spin briefly, so the
/// pair 0–2 uses asymmetric fences and the pairs with rank 1 plain ones. A lost wake-up would
/// end in the timeout.
#[test]
fn ranks_with_different_waiting_policies_work_together() {
    let spin = WaitPolicy {
        spin: Duration::from_micros(20),
        yield_for: Duration::ZERO,
    };
    let make = || {
        let cfgs = configs(Net::Shm, 3, 1, Duration::from_secs(20)).into_iter();
        let waits = [spin, WaitPolicy::SLEEP, spin];
        cfgs.zip(waits).map(|(c, w)| c.wait(w)).collect()
    };
    let digests = with_configs(make, |g| {
        let rank = g.rank();
        let mut digest = Vec::new();
        for i in 0..3000 {
            let len = [1, 2, 300, 5000][i % 4];
            let x: Vec<u32> = (0..len).map(|j| mix(rank, i + j) as u32 % 1000).collect();
            let mut y = vec![0u32; len];
            g.all_sum(&x, &mut y).unwrap();
            let expect: Vec<u32> = (0..len)
                .map(|j| (0..3).map(|r| mix(r, i + j) as u32 % 1000).sum())
                .collect();
            assert_eq!(y, expect, "rank {rank} call {i}");
            digest.push(y[0]);
        }
        digest
    });
    assert!(digests.iter().all(|d| *d == digests[0]));
}

#[test]
fn wrappers_raw_api_and_mixed_sequences() {
    for (net, size) in nets()
        .into_iter()
        .flat_map(|n| [1, 2, 3, 4].map(|s| (n, s)))
    {
        with_group(net, size, 2, |g| {
            let (rank, n) = (g.rank(), g.size());
            for _ in 0..3 {
                let x = vec![rank as i32 + 1; 1000];
                let mut y = vec![0i32; 1000];
                g.all_sum(&x, &mut y).unwrap();
                assert!(y.iter().all(|&v| v == (n * (n + 1) / 2) as i32));
                g.all_max(&x, &mut y).unwrap();
                assert!(y.iter().all(|&v| v == n as i32));
                g.all_min(&x, &mut y).unwrap();
                assert!(y.iter().all(|&v| v == 1));
                g.barrier().unwrap();
                let mut gathered = vec![0u8; n * 3];
                g.all_gather(&[rank as u8; 3], &mut gathered).unwrap();
                assert_eq!(
                    gathered,
                    (0..n).flat_map(|r| [r as u8; 3]).collect::<Vec<_>>()
                );

                // Raw bytes: f32 and bool (any non-zero byte is true; output is 0/1).
                let xs: Vec<u8> = (0..64)
                    .flat_map(|i| (i as f32 + rank as f32).to_ne_bytes())
                    .collect();
                let mut out = vec![0u8; xs.len()];
                g.all_reduce_raw(&xs, &mut out, Dtype::Float32, ReduceOp::Max)
                    .unwrap();
                for (i, c) in out.chunks_exact(4).enumerate() {
                    assert_eq!(
                        f32::from_ne_bytes(c.try_into().unwrap()),
                        (i + n - 1) as f32
                    );
                }
                let flags: Vec<u8> = (0..10).map(|i| if i == rank { 7 } else { 0 }).collect();
                let mut any = vec![9u8; 10];
                g.all_reduce_raw(&flags, &mut any, Dtype::Bool, ReduceOp::Sum)
                    .unwrap();
                let expect: Vec<u8> = (0..10).map(|i| u8::from(i < n)).collect();
                assert_eq!(any, expect);
                let mut flags = flags;
                g.all_reduce_raw_in_place(&mut flags, Dtype::Bool, ReduceOp::Max)
                    .unwrap();
                assert_eq!(flags, expect);

                // The other raw calls: u16 elements as bytes, and lengths that are not whole
                // elements, refused before anything is sent.
                let mine: Vec<u8> = [rank as u16 + 1; 4 * 8]
                    .iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .collect();
                let mut all = vec![0u8; n * mine.len()];
                g.all_gather_raw(&mine, &mut all, Dtype::UInt16).unwrap();
                assert_eq!(
                    all.chunks(mine.len()).nth(n - 1),
                    Some(&[n as u8, 0].repeat(32)[..])
                );
                let block = mine.len() / n.min(4) / 2 * 2;
                let mut reduced = vec![0u8; block];
                let whole = &mine[..block * n];
                g.reduce_scatter_raw(whole, &mut reduced, Dtype::UInt16, ReduceOp::Sum)
                    .unwrap();
                let sum = (n * (n + 1) / 2) as u16;
                assert_eq!(reduced, sum.to_ne_bytes().repeat(block / 2));
                let odd = [0u8; 3];
                for e in [
                    g.all_gather_raw(&odd, &mut vec![0; 3 * n], Dtype::UInt16),
                    g.reduce_scatter_raw(
                        &vec![0; 3 * n],
                        &mut [0; 3],
                        Dtype::UInt16,
                        ReduceOp::Sum,
                    ),
                    g.all_reduce_raw_in_place(&mut [0; 3], Dtype::UInt16, ReduceOp::Sum),
                    g.send_raw(&odd, (rank + 1) % n, Dtype::UInt16, 0),
                    g.recv_raw(&mut [0; 3], (rank + 1) % n, Dtype::UInt16, 0),
                ] {
                    assert!(matches!(e, Err(Error::InvalidArgument(_))), "{e:?}");
                }
                if n > 1 {
                    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
                    let mut got = vec![0u8; 20];
                    let data = vec![rank as u8 + 3; 20];
                    if rank % 2 == 0 {
                        g.send_raw(&data, right, Dtype::Bool, 0).unwrap();
                        g.recv_raw(&mut got, left, Dtype::Bool, 0).unwrap();
                    } else {
                        g.recv_raw(&mut got, left, Dtype::Bool, 0).unwrap();
                        g.send_raw(&data, right, Dtype::Bool, 0).unwrap();
                    }
                    // bool bytes arrive as 0 or 1.
                    assert_eq!(got, vec![1u8; 20]);
                }
            }
        });
    }
}

#[test]
fn float_sums_are_bit_identical_across_ranks_and_runs() {
    for net in nets() {
        float_sums_are_bit_identical_on(net);
    }
}

fn float_sums_are_bit_identical_on(net: Net) {
    // Values whose sums round, so the order of additions matters, and NaNs with a payload per
    // rank: a sum of two NaNs keeps one payload, so operand order shows even where addition
    // commutes. Over TCP, 50 003 f32 per rank take the ring (Rabenseifner's halving then
    // doubling at 13 ranks), 20 011 Rabenseifner's (with hand-overs at 5 and 13 ranks) as f32
    // and f16, 4099 recursive doubling (with hand-overs at 5 and 13) as f32, and as f16 too.
    let run = |size| {
        with_group(net, size, 2, |g| {
            let rank = g.rank();
            let nan = f32::from_bits(0x7fc0_0000 | (rank as u32 + 1) << 13);
            let x: Vec<f32> = (0..50_003 + 20_011 + 4099)
                .map(|i| match i % 1000 {
                    7 => nan,
                    _ => (mix(rank, i) % 1_000_003) as f32 * 1.37e-3 + 1e-7,
                })
                .collect();
            let mut bits = Vec::new();
            for x in [&x[..50_003], &x[50_003..70_014], &x[70_014..]] {
                let mut y = vec![0f32; x.len()];
                g.all_sum(x, &mut y).unwrap();
                let h: Vec<f16> = x.iter().map(|v| f16::from_f32(*v)).collect();
                let mut hy = vec![f16::ZERO; h.len()];
                g.all_sum(&h, &mut hy).unwrap();
                bits.extend(y.iter().map(|v| v.to_bits() as u64));
                bits.extend(hy.iter().map(|v| v.to_bits() as u64));
            }
            bits
        })
    };
    for size in [4, 5, 13] {
        let first = run(size);
        for (rank, r) in first.iter().enumerate() {
            assert_eq!(r, &first[0], "{net:?}: rank {rank} of {size} differs");
        }
        assert_eq!(
            run(size)[0],
            first[0],
            "{net:?}: a second run gives other bits"
        );
    }
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn random_shapes_match_the_reference(
            net_index in 0usize..3,
            size in 2usize..=5,
            wires in 1usize..=3,
            len in 0usize..400_000,
            op_index in 0usize..5,
        ) {
            // Up to 1.6 MB of f32: past the small-message limits and over several rounds of
            // the shared-memory areas (1 MiB). Sum, max, min, prod and avg apply to all three
            // types.
            let (net, op) = (nets()[net_index % nets().len()], ReduceOp::ALL[op_index]);
            let results = with_group(net, size, wires, |g| {
                let rank = g.rank();
                let ins = inputs::<f32>(size, len, op);
                let mut out = vec![0f32; len];
                g.all_reduce(&ins[rank], &mut out, op).unwrap();
                let gathered_in = inputs::<u16>(size, len, op);
                let mut gathered = vec![0u16; size * len];
                g.all_gather(&gathered_in[rank], &mut gathered).unwrap();
                let rs_in = inputs::<i64>(size, size * len, op);
                let mut rs = vec![0i64; len];
                g.reduce_scatter(&rs_in[rank], &mut rs, op).unwrap();
                (bits(&out), gathered, rs)
            });
            let expect = bits(&expected_reduction::<f32>(size, len, op));
            let gathered = inputs::<u16>(size, len, op).concat();
            let rs_full = expected_reduction::<i64>(size, size * len, op);
            for (rank, (out, g, rs)) in results.into_iter().enumerate() {
                prop_assert_eq!(&out, &expect);
                prop_assert_eq!(&g, &gathered);
                prop_assert_eq!(&rs[..], &rs_full[rank * len..(rank + 1) * len]);
            }
        }
    }
}
