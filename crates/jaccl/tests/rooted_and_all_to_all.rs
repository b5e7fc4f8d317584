//! Broadcast, reduce, gather, scatter, all-to-all (even and uneven), all-gather-v and
//! reduce-scatter-v: every dtype (and reduction), every root, uneven counts with zeros and
//! with one rank holding everything, over every net of `JACCL_TEST_NETS`, 1 to 8 ranks and 1
//! to 4 wires, one thread per rank; compared with plain references. And their error contract:
//! what is refused before any data moves, and what a disagreement between ranks gives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
#[macro_use]
mod common;

use std::any::TypeId;

use common::*;
use jaccl::half::{bf16, f16};
use jaccl::num_complex::Complex32;
use jaccl::{Error, Group, ReduceOp};

/// Element `i` of rank `rank`'s data for the collectives that only move data: special values
/// (NaN, ±0, infinities) included, so any bit that moves wrong shows.
fn data<T: TestElem>(rank: usize, i: usize) -> T {
    T::value(rank, i, ReduceOp::Max)
}

/// Rank `rank`'s data of `len` elements (made once for all the rank threads: the key's
/// size field holds the rank, and the reduction is the one [`data`] takes values for).
fn vector<T: TestElem>(rank: usize, len: usize) -> Vec<T> {
    let made = shared(
        ("vector", TypeId::of::<T>(), rank, len, ReduceOp::Max),
        || (0..len).map(|i| data::<T>(rank, i)).collect::<Vec<T>>(),
    );
    made.to_vec()
}

/// What non-roots pass as the root's buffers they do not use: `output` as long as the root's
/// (holding values that must stay) on odd ranks, empty on even ones.
fn unused<T: TestElem>(rank: usize, len: usize) -> Vec<T> {
    match rank % 2 {
        1 => vector(1000 + rank, len),
        _ => Vec::new(),
    }
}

/// Runs `case` on every net, on 1 to 8 ranks, over 1, 2 or 4 wires (a different count for
/// each size, so that all appear without running every combination).
fn on_every_group(case: impl Fn(Net, &mut Group) + Sync) {
    for net in nets() {
        for (i, &size) in SIZES.iter().enumerate() {
            let wires = WIRES[i % WIRES.len()];
            with_group(net, size, wires, |g| case(net, g));
        }
    }
}

/// Lengths for every dtype, and the ones only the byte types also take (long enough for the
/// ring's pipelines and several shared-memory areas).
fn lengths<T: TestElem>() -> Vec<usize> {
    let mut v = vec![0, 1, 7, 4097];
    if size_of::<T>() <= 2 {
        v.push(600_001);
    }
    v
}

fn broadcast_case<T: TestElem>(g: &mut Group) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    for len in lengths::<T>() {
        for root in 0..size {
            let what = format!(
                "broadcast {} len {len} root {root} rank {rank}/{size}",
                T::DTYPE
            );
            let mut buf = vector::<T>(rank, len);
            g.broadcast(&mut buf, root)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_same_values(&buf, &vector::<T>(root, len), &what);
        }
    }
    Vec::new()
}

#[test]
fn broadcast_from_every_root() {
    on_every_group(|net, g| {
        for_all_dtypes!(net, broadcast_case, g);
    });
}

/// Many small broadcasts in a row, from a root that changes every few calls: over shared
/// memory a root runs ahead of its receivers by up to its 256 eager lines and then waits for
/// them, so this goes round the lines several times, in place and with every root.
#[test]
fn back_to_back_small_broadcasts_arrive_in_order() {
    for net in nets() {
        for size in [2, 4] {
            with_group(net, size, 1, |g| {
                let rank = g.rank();
                for i in 0..1500u64 {
                    let root = (i / 3) as usize % size;
                    let sent = [i, !i, i * 31 + root as u64];
                    let mut buf = if rank == root { sent } else { [u64::MAX; 3] };
                    let what = format!("{net:?} broadcast #{i} from {root} at rank {rank}/{size}");
                    g.broadcast(&mut buf, root)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(buf, sent, "{what}");
                }
            });
        }
    }
}

/// Ranks that each think they are the root: a root waits for no one, so the broadcast itself
/// may succeed. Over shared memory the next call that waits for every rank fails with
/// `Mismatch` on every rank (descriptions count the broadcasts each rank was the root of), also
/// when the others follow one root or the other (4 ranks in two camps); over the network the
/// leftover broadcast arrives instead of the barrier on at least one rank, and the others fail
/// by their next call.
#[test]
fn ranks_that_disagree_on_the_root_fail_by_the_next_call() {
    for net in nets() {
        let errors = with_group(net, 2, 1, |g| {
            let rank = g.rank();
            let mut buf = [rank as u32; 2];
            let first = g.broadcast(&mut buf, rank).and_then(|()| g.barrier());
            (first.clone(), first.and_then(|()| g.barrier()))
        });
        let all_shared = matches!(net, Net::Shm | Net::MeshLocal);
        for (rank, (first, by_next)) in errors.iter().enumerate() {
            assert!(
                matches!(
                    by_next,
                    Err(Error::Mismatch { .. } | Error::PeerLost { .. })
                ),
                "{net:?} rank {rank}: {by_next:?}"
            );
            if all_shared {
                let Err(Error::Mismatch { detail, .. }) = first else {
                    panic!("{net:?} rank {rank}: {first:?}");
                };
                assert!(
                    detail.contains("took themselves for the root 2 time"),
                    "{detail}"
                );
            }
        }
        assert!(
            errors
                .iter()
                .any(|(first, _)| matches!(first, Err(Error::Mismatch { .. }))),
            "{net:?}: {errors:?}"
        );
        if all_shared {
            let camps = with_group(net, 4, 1, |g| {
                let mut buf = [g.rank() as u32; 2];
                let root = g.rank() / 2 * 2;
                g.broadcast(&mut buf, root).and_then(|()| g.barrier())
            });
            for (rank, e) in camps.iter().enumerate() {
                assert!(
                    matches!(e, Err(Error::Mismatch { detail, .. }) if detail.contains("root 2 time")),
                    "{net:?} rank {rank} of 4: {e:?}"
                );
            }
        }
    }
}

fn reduce_case<T: TestElem>(g: &mut Group) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    for len in [0, 1, 13, 5000] {
        for op in ops_of::<T>() {
            let ins = inputs::<T>(size, len, op);
            for root in 0..size {
                let what = format!(
                    "reduce {} {op} len {len} root {root} rank {rank}/{size}",
                    T::DTYPE
                );
                let mut out = match rank == root {
                    true => vec![T::default(); len],
                    false => unused(rank, len),
                };
                let before = bits(&out);
                g.reduce(&ins[rank], &mut out, op, root)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                if rank == root {
                    let expect = bits_for(op, &expected_reduction::<T>(size, len, op));
                    assert_same(&bits_for(op, &out), &expect, &what);
                } else {
                    assert_same(
                        &bits(&out),
                        &before,
                        &format!("{what}: a non-root's output"),
                    );
                }
            }
        }
    }
    Vec::new()
}

#[test]
fn reduce_to_every_root_with_every_reduction() {
    on_every_group(|net, g| {
        for_all_dtypes!(net, reduce_case, g);
        // Large enough for the ring and the shared-memory areas, one type.
        let (rank, size) = (g.rank(), g.size());
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let ins = inputs::<f32>(size, 300_001, op);
            let root = size - 1;
            let mut out = vec![0f32; if rank == root { 300_001 } else { 0 }];
            g.reduce(&ins[rank], &mut out, op, root).unwrap();
            if rank == root {
                let expect = bits(&expected_reduction::<f32>(size, 300_001, op));
                assert_same(&bits(&out), &expect, &format!("reduce f32 {op} large"));
            }
        }
    });
}

fn gather_scatter_case<T: TestElem>(g: &mut Group) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    for len in lengths::<T>() {
        // Every rank's block, and the root's blocks to hand out, in rank order.
        let all: Vec<T> = (0..size).flat_map(|r| vector::<T>(r, len)).collect();
        let mine = vector::<T>(rank, len);
        let untouched = unused::<T>(rank, size * len);
        for root in 0..size {
            let what = format!("{} len {len} root {root} rank {rank}/{size}", T::DTYPE);
            let mut out = match rank == root {
                true => vec![T::default(); size * len],
                false => untouched.clone(),
            };
            g.gather(&mine, &mut out, root)
                .unwrap_or_else(|e| panic!("gather {what}: {e}"));
            match rank == root {
                true => assert_same_values(&out, &all, &format!("gather {what}")),
                false => assert_same_values(&out, &untouched, &format!("gather {what}: non-root")),
            }

            // Scatter hands out block r of the root's `size` blocks (here: rank r's data).
            let input = match rank == root {
                true => all.clone(),
                false => untouched.clone(),
            };
            let mut got = vec![T::default(); len];
            g.scatter(&input, &mut got, root)
                .unwrap_or_else(|e| panic!("scatter {what}: {e}"));
            assert_same_values(&got, &mine, &format!("scatter {what}"));
        }
    }
    Vec::new()
}

#[test]
fn gather_to_and_scatter_from_every_root() {
    on_every_group(|net, g| {
        for_all_dtypes!(net, gather_scatter_case, g);
    });
}

/// Rank s's block for rank d in an all-to-all: its data from index `d * block` on.
fn all_to_all_case<T: TestElem>(g: &mut Group) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    let blocks: &[usize] = if size_of::<T>() <= 2 {
        &[0, 1, 3, 1000, 70_001]
    } else {
        &[0, 1, 3, 1000]
    };
    for &block in blocks {
        let what = format!("all_to_all {} block {block} rank {rank}/{size}", T::DTYPE);
        let input = vector::<T>(rank, size * block);
        let mut out = vec![T::default(); size * block];
        g.all_to_all(&input, &mut out)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let expect: Vec<T> = (0..size)
            .flat_map(|s| vector::<T>(s, size * block)[rank * block..(rank + 1) * block].to_vec())
            .collect();
        assert_same_values(&out, &expect, &what);
    }
    Vec::new()
}

#[test]
fn all_to_all_of_equal_blocks() {
    on_every_group(|net, g| {
        for_all_dtypes!(net, all_to_all_case, g);
    });
}

/// From 8 ranks over TCP, small all-to-alls take Bruck's rounds (any number of ranks, primes
/// too), larger ones and uneven blocks the pairwise exchange, and all-to-all-v its counts
/// through Bruck's rounds.
#[test]
fn all_to_all_among_8_to_17_ranks() {
    for size in [8, 11, 16, 17] {
        with_group(Net::Tcp, size, 1, |g| {
            all_to_all_case::<u8>(g);
            all_to_all_case::<f64>(g);
            all_to_all_v_case::<i32>(g);
        });
    }
}

/// Count matrices for `size` ranks: `counts[s][d]` elements from rank s to rank d.
fn count_matrices(size: usize) -> Vec<(&'static str, Vec<Vec<usize>>)> {
    let matrix = |f: &dyn Fn(usize, usize) -> usize| -> Vec<Vec<usize>> {
        (0..size)
            .map(|s| (0..size).map(|d| f(s, d)).collect())
            .collect()
    };
    let last = size - 1;
    vec![
        // A third zeros, the rest up to 2000 elements.
        (
            "random",
            matrix(&|s, d| match mix(s, d) % 3 {
                0 => 0,
                _ => (mix(d, s) % 2000) as usize,
            }),
        ),
        (
            "all to one",
            matrix(&|_, d| if d == last { 30_001 } else { 0 }),
        ),
        (
            "one to all",
            matrix(&|s, _| if s == 0 { 30_001 } else { 0 }),
        ),
        (
            "only to itself",
            matrix(&|s, d| if s == d { 17 } else { 0 }),
        ),
        ("nothing", matrix(&|_, _| 0)),
    ]
}

fn all_to_all_v_case<T: TestElem>(g: &mut Group) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    for (name, counts) in count_matrices(size) {
        let what = format!("all_to_all_v {} {name} rank {rank}/{size}", T::DTYPE);
        let send: Vec<usize> = counts[rank].clone();
        let recv: Vec<usize> = (0..size).map(|s| counts[s][rank]).collect();
        let input = vector::<T>(rank, send.iter().sum());
        let mut out = vec![T::default(); recv.iter().sum()];
        g.all_to_all_v(&input, &send, &mut out, &recv)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // Rank s's elements for this rank start after those it sends to lower ranks.
        let expect: Vec<T> = (0..size)
            .flat_map(|s| {
                let start: usize = counts[s][..rank].iter().sum();
                (start..start + counts[s][rank]).map(move |i| data::<T>(s, i))
            })
            .collect();
        assert_same_values(&out, &expect, &what);
    }
    Vec::new()
}

#[test]
fn all_to_all_v_with_uneven_counts() {
    on_every_group(|net, g| {
        for_all_dtypes!(net, all_to_all_v_case, g);
    });
}

/// Block lengths for `size` ranks: with zeros, all on one rank, none at all.
fn count_vectors(size: usize) -> Vec<(&'static str, Vec<usize>)> {
    vec![
        (
            "random",
            (0..size)
                .map(|r| match mix(r, 7) % 3 {
                    0 => 0,
                    _ => (mix(r, 8) % 3000) as usize,
                })
                .collect(),
        ),
        (
            "one rank has all",
            (0..size)
                .map(|r| if r == size / 2 { 50_003 } else { 0 })
                .collect(),
        ),
        ("ascending", (0..size).map(|r| r * 1000 + 1).collect()),
        ("nothing", vec![0; size]),
    ]
}

fn all_gather_v_case<T: TestElem>(g: &mut Group) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    for (name, counts) in count_vectors(size) {
        let what = format!("all_gather_v {} {name} rank {rank}/{size}", T::DTYPE);
        let mut out = vec![T::default(); counts.iter().sum()];
        g.all_gather_v(&vector::<T>(rank, counts[rank]), &mut out, &counts)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let expect: Vec<T> = (0..size).flat_map(|r| vector::<T>(r, counts[r])).collect();
        assert_same_values(&out, &expect, &what);
    }
    Vec::new()
}

#[test]
fn all_gather_v_with_uneven_counts() {
    on_every_group(|net, g| {
        for_all_dtypes!(net, all_gather_v_case, g);
    });
}

fn reduce_scatter_v_case<T: TestElem>(g: &mut Group) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    for (name, counts) in count_vectors(size) {
        let total: usize = counts.iter().sum();
        let start: usize = counts[..rank].iter().sum();
        // Every reduction on the small cases, two on the large one.
        let ops = match total > 20_000 {
            true => vec![ReduceOp::Sum, ReduceOp::Max],
            false => ops_of::<T>(),
        };
        for op in ops {
            let what = format!(
                "reduce_scatter_v {} {op} {name} rank {rank}/{size}",
                T::DTYPE
            );
            let ins = inputs::<T>(size, total, op);
            let mut out = vec![T::default(); counts[rank]];
            g.reduce_scatter_v(&ins[rank], &mut out, &counts, op)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let full = expected_reduction::<T>(size, total, op);
            let expect = bits_for(op, &full[start..start + counts[rank]]);
            assert_same(&bits_for(op, &out), &expect, &what);
        }
    }
    Vec::new()
}

#[test]
fn reduce_scatter_v_with_uneven_counts() {
    on_every_group(|net, g| {
        for_all_dtypes!(net, reduce_scatter_v_case, g);
    });
}

/// Arguments that cannot work are refused on every rank before any data moves, and the group
/// goes on.
#[test]
fn bad_roots_lengths_and_reductions_are_refused_and_the_group_goes_on() {
    for net in nets() {
        with_group(net, 3, 1, |g| {
            let rank = g.rank();
            let invalid = |r: jaccl::Result<()>, what: &str| match r {
                Err(Error::InvalidArgument(m)) => m,
                other => panic!("{what}: {other:?}"),
            };
            let mut buf = [1f32; 4];
            let m = invalid(g.broadcast(&mut buf, 3), "root 3");
            assert!(m.contains("root 3"), "{m}");
            invalid(
                g.reduce(&[1f32; 4], &mut [0f32; 4], ReduceOp::Sum, 7),
                "reduce root 7",
            );
            invalid(
                g.gather(&[1u8; 2], &mut [0u8; 2], usize::MAX),
                "gather root MAX",
            );
            // The root's output must hold every block; a non-root's may be empty or as long.
            if rank == 0 {
                invalid(g.gather(&[1u8; 2], &mut [0u8; 5], 0), "gather output");
                invalid(
                    g.reduce(&[1u8; 2], &mut [0u8; 1], ReduceOp::Sum, 0),
                    "reduce output",
                );
            }
            // An input a non-root passes must be empty or as long as the root's.
            invalid(g.scatter(&[1u8; 5], &mut [0u8; 2], 0), "scatter input");
            let m = invalid(
                g.all_reduce(&[1f32; 2], &mut [0f32; 2], ReduceOp::BitAnd),
                "band on f32",
            );
            assert!(m.contains("band") && m.contains("f32"), "{m}");
            invalid(
                g.all_reduce(&[true; 2], &mut [false; 2], ReduceOp::Avg),
                "avg on bool",
            );
            invalid(
                g.all_to_all(&[1u8; 4], &mut [0u8; 4]),
                "4 elements in 3 blocks",
            );
            invalid(
                g.all_to_all_v(&[1u8; 3], &[1, 1], &mut [0u8; 3], &[1, 1, 1]),
                "2 send counts",
            );
            invalid(
                g.all_to_all_v(&[1u8; 3], &[1, 1, 2], &mut [0u8; 3], &[1, 1, 1]),
                "counts that do not add up",
            );
            invalid(
                g.all_gather_v(&[1u8; 2], &mut [0u8; 6], &[2, 2, 3]),
                "output shorter than the counts",
            );
            invalid(g.send(&[1u8], rank), "a send to itself");
            invalid(g.recv(&mut [0u8], 3), "a receive from rank 3");
            // Nothing moved: the group works.
            let mut data = [rank as u32; 3];
            g.broadcast(&mut data, 2).unwrap();
            assert_eq!(data, [2; 3]);
        });
    }
}

/// A sender's count against its receiver's: every rank fails with `Mismatch` before any data
/// moves, each naming the pair.
#[test]
fn disagreeing_all_to_all_counts_are_a_mismatch_on_every_rank() {
    for net in nets() {
        let errors = with_group(net, 4, 1, |g| {
            let rank = g.rank();
            // Rank 1 sends 3 elements to rank 2, which expects 2 of them.
            let mut send = vec![1usize; 4];
            let mut recv = vec![1usize; 4];
            if rank == 1 {
                send[2] = 3;
            }
            if rank == 2 {
                recv[1] = 2;
            }
            let input = vec![7u16; send.iter().sum()];
            let mut out = vec![0u16; recv.iter().sum()];
            g.all_to_all_v(&input, &send, &mut out, &recv).unwrap_err()
        });
        for (rank, e) in errors.iter().enumerate() {
            let Error::Mismatch { peer, detail, .. } = e else {
                panic!("{net:?} rank {rank}: {e:?}");
            };
            assert!(
                detail.contains("rank 1 sends 3 element(s) to rank 2, which expects 2"),
                "{net:?} rank {rank}: {detail}"
            );
            let expect_peer = if rank == 1 { 2 } else { 1 };
            assert_eq!(*peer, expect_peer, "{net:?} rank {rank}: {e}");
        }
    }
}

/// Counts of the variable-size collectives must be the same on every rank.
#[test]
fn ranks_that_pass_different_counts_get_a_mismatch() {
    for net in nets() {
        let errors = with_group(net, 3, 1, |g| {
            let rank = g.rank();
            let counts = if rank == 2 { [1, 1, 2] } else { [1, 2, 1] };
            let mine = vec![1u8; counts[rank]];
            let mut out = vec![0u8; 4];
            g.all_gather_v(&mine, &mut out, &counts).unwrap_err()
        });
        for (rank, e) in errors.iter().enumerate() {
            assert!(
                matches!(e, Error::Mismatch { .. } | Error::PeerLost { .. }),
                "{net:?} rank {rank}: {e:?}"
            );
        }
        assert!(
            errors.iter().any(|e| matches!(e, Error::Mismatch { .. })),
            "{net:?}: {errors:?}"
        );
    }
}

/// Counts that differ while adding up to the same total (which a short digest of them could
/// not always tell apart), and counts that a 48-bit digest made equal: every rank fails, none
/// returns data, and a `Mismatch` shows the rank's counts.
#[test]
fn counts_that_differ_are_a_mismatch_whatever_they_add_up_to() {
    let cases: [[[usize; 2]; 2]; 3] =
        [[[1, 2], [2, 1]], [[257, 0], [1, 111_872]], [[0, 3], [3, 0]]];
    for net in nets() {
        for counts in cases {
            for variable in ["all_gather_v", "reduce_scatter_v"] {
                let results = with_group(net, 2, 1, |g| {
                    let c = counts[g.rank()];
                    let total = c[0] + c[1];
                    let r = match variable {
                        "all_gather_v" => {
                            let mine = vec![1u8; c[g.rank()]];
                            g.all_gather_v(&mine, &mut vec![0u8; total], &c)
                        }
                        _ => {
                            let input = vec![1u8; total];
                            let mut out = vec![0u8; c[g.rank()]];
                            g.reduce_scatter_v(&input, &mut out, &c, ReduceOp::Sum)
                        }
                    };
                    r.and_then(|()| g.barrier())
                });
                let what = format!("{net:?} {variable} {counts:?}");
                for (rank, r) in results.iter().enumerate() {
                    assert!(
                        matches!(r, Err(Error::Mismatch { .. } | Error::PeerLost { .. })),
                        "{what} rank {rank}: {r:?}"
                    );
                }
                let shown = results.iter().find_map(|r| match r {
                    Err(e @ Error::Mismatch { .. }) => Some(e.to_string()),
                    _ => None,
                });
                let shown = shown.unwrap_or_else(|| panic!("{what}: {results:?}"));
                assert!(
                    shown.contains("this rank's counts are ["),
                    "{what}: {shown}"
                );
            }
        }
    }
}

/// A broadcast whose length differs between ranks, so that over shared memory some take the
/// eager way and others not (a receiver, then the root, with the other length): every rank
/// fails, none hangs, and one names the mismatch.
#[test]
fn broadcasts_of_different_lengths_fail_every_rank() {
    for net in nets() {
        for odd in [2, 0] {
            let errors = with_group(net, 3, 1, |g| {
                let len = if g.rank() == odd { 100 } else { 8 };
                let mut buf = vec![1u8; len];
                g.broadcast(&mut buf, 0).and_then(|()| g.barrier())
            });
            for (rank, e) in errors.iter().enumerate() {
                assert!(
                    matches!(e, Err(Error::Mismatch { .. } | Error::PeerLost { .. })),
                    "{net:?} rank {odd} odd, rank {rank}: {e:?}"
                );
            }
            assert!(
                errors
                    .iter()
                    .any(|e| matches!(e, Err(Error::Mismatch { .. }))),
                "{net:?} rank {odd} odd: {errors:?}"
            );
        }
    }
}
