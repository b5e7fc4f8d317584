//! Sub-groups (`Group::split`, `Group::subgroup`) and nonblocking operations
//! (`Group::start`), over every net of `JACCL_TEST_NETS`, against plain references.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use common::*;
use jaccl::{Config, Error, Group, ReduceOp, Transport};

/// Checks that `sub` is the group of the parent ranks `members` (in their new order) as seen
/// from parent rank `parent`: its rank and size, and, by an all-gather and an all-reduce over
/// it, who its members are, bit-identical on all of them.
fn check_members(sub: &mut Group, parent: usize, members: &[usize]) {
    let me = members.iter().position(|&r| r == parent).unwrap();
    assert_eq!((sub.rank(), sub.size()), (me, members.len()));
    let mut all = vec![0u64; members.len()];
    sub.all_gather(&[parent as u64], &mut all).unwrap();
    let expect: Vec<u64> = members.iter().map(|&r| r as u64).collect();
    assert_eq!(all, expect, "members of the group of parent rank {parent}");
    let mut sum = [0u64; 2];
    sub.all_sum(&[parent as u64, 1], &mut sum).unwrap();
    assert_eq!(sum, [expect.iter().sum(), members.len() as u64]);
}

/// The ranks of a split with `colors` and `keys` (per parent rank), for the group of `color`:
/// ordered by (key, parent rank), as `MPI_Comm_split` orders them.
fn reference_split(colors: &[Option<u32>], keys: &[u32], color: u32) -> Vec<usize> {
    let mut members: Vec<(u32, usize)> = (0..colors.len())
        .filter(|&r| colors[r] == Some(color))
        .map(|r| (keys[r], r))
        .collect();
    members.sort();
    members.into_iter().map(|(_, r)| r).collect()
}

/// Splits with `color` and `key` (functions of the rank and size) and checks every group.
fn split_and_check(
    g: &mut Group,
    color: impl Fn(usize, usize) -> Option<u32>,
    key: impl Fn(usize, usize) -> u32,
) -> Option<Group> {
    let n = g.size();
    let colors: Vec<Option<u32>> = (0..n).map(|r| color(r, n)).collect();
    let keys: Vec<u32> = (0..n).map(|r| key(r, n)).collect();
    let mut sub = g.split(colors[g.rank()], keys[g.rank()]).unwrap();
    match (colors[g.rank()], &mut sub) {
        (None, None) => {}
        (Some(c), Some(sub)) => check_members(sub, g.rank(), &reference_split(&colors, &keys, c)),
        (c, s) => panic!("rank {}: color {c:?} but group {:?}", g.rank(), s.is_some()),
    }
    sub
}

#[test]
fn splits_by_parity_halves_and_none_with_keys_that_reorder() {
    for net in nets() {
        for size in [1, 2, 3, 5, 8] {
            with_group(net, size, 1, |g| {
                let parity = split_and_check(g, |r, _| Some((r % 2) as u32), |_, _| 0);
                // Halves, each in reverse order (the key reorders).
                let half =
                    split_and_check(g, |r, n| Some(u32::from(r >= n / 2)), |r, n| (n - r) as u32);
                // Every third rank joins no group; equal keys keep the parent's order.
                let some = split_and_check(g, |r, _| (r % 3 != 0).then_some(7), |_, _| 1);
                // The parent still works, and so do the sub-groups after it.
                let mut x = [0u32; 1];
                g.all_sum(&[1], &mut x).unwrap();
                assert_eq!(x[0] as usize, size);
                for mut sub in [parity, half, some].into_iter().flatten() {
                    sub.barrier().unwrap();
                }
            });
        }
    }
}

#[test]
fn nested_splits_and_subgroups() {
    for net in nets() {
        with_group(net, 8, 2, |g| {
            let rank = g.rank();
            // Halves, then within each half by parity: the parent ranks of each quarter.
            let mut half = g.split(Some((rank / 4) as u32), 0).unwrap().unwrap();
            let mut quarter = half.split(Some((rank % 2) as u32), 0).unwrap().unwrap();
            let base = rank / 4 * 4 + rank % 2;
            check_members(&mut quarter, rank, &[base, base + 2]);
            // An explicit list, in a new order; the others get no group.
            let list = [6, 1, 3];
            match g.subgroup(&list).unwrap() {
                Some(mut sub) => check_members(&mut sub, rank, &list),
                None => assert!(!list.contains(&rank)),
            }
            // A sub-group of a sub-group, by list: rank 1 of `half` first.
            let mut swapped = half.subgroup(&[1, 0]).unwrap();
            if let Some(sub) = &mut swapped {
                let members: Vec<usize> = [1, 0].iter().map(|&h| rank / 4 * 4 + h).collect();
                check_members(sub, rank, &members);
            }
            // Large data through a sub-group: a reduce-scatter checked against its reference.
            let n = quarter.size();
            let input: Vec<f32> = (0..n * 40_000)
                .map(|i| (i % 97) as f32 + rank as f32)
                .collect();
            let mut out = vec![0f32; 40_000];
            quarter
                .reduce_scatter(&input, &mut out, ReduceOp::Sum)
                .unwrap();
            let members = [base, base + 2];
            for (i, v) in out.iter().enumerate() {
                let j = quarter.rank() * 40_000 + i;
                let expect: f32 = members.iter().map(|&r| (j % 97) as f32 + r as f32).sum();
                assert_eq!(*v, expect);
            }
        });
    }
}

#[test]
fn sub_groups_that_only_their_members_form() {
    for net in nets() {
        with_group(net, 5, 1, |g| {
            let rank = g.rank();
            // Two groups at once, each formed by its members alone, one in a new order.
            let (list, name) = if rank < 3 {
                (vec![2, 0, 1], "first")
            } else {
                (vec![3, 4], "second")
            };
            let mut sub = g.subgroup_of_members(&list, name).unwrap();
            check_members(&mut sub, rank, &list);
            // The same members again, under another name: another group.
            let mut again = g.subgroup_of_members(&list, "again").unwrap();
            check_members(&mut again, rank, &list);
            assert!(g.subgroup_of_members(&[(rank + 1) % 5], "x").is_err());
        });
    }
}

/// A small generator for the random sequences below: the same seed gives every rank the same
/// sequence.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }

    /// A non-empty list of distinct ranks below `n`, in a random order.
    fn list(&mut self, n: usize) -> Vec<usize> {
        let mut ranks: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            ranks.swap(i, self.below(i + 1));
        }
        ranks.truncate(1 + self.below(n));
        ranks
    }
}

/// 50 random sequences of splits (some ranks join no group), subgroups (some ranks are left
/// out) and sub-groups formed by their members alone (a name and list may come twice), on 5
/// ranks, each sequence on the same parent group (whose count of splits must stay in step on
/// every rank); every group formed is then used, and the parent.
#[test]
fn fifty_random_sequences_of_splits_and_subgroups_stay_in_step() {
    let nets = nets();
    let per_net = 50usize.div_ceil(nets.len());
    for (n, net) in nets.into_iter().enumerate() {
        with_group(net, 5, 1, |g| {
            let rank = g.rank();
            for s in 0..per_net {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (n * 1000 + s + 1) as u64);
                let mut formed: Vec<(Group, Vec<usize>)> = Vec::new();
                for step in 0..4 {
                    let what = format!("{net:?} sequence {s} step {step} rank {rank}");
                    match rng.below(3) {
                        0 => {
                            let colors: Vec<Option<u32>> = (0..5)
                                .map(|_| (rng.below(4) != 0).then(|| rng.below(3) as u32))
                                .collect();
                            let keys: Vec<u32> = (0..5).map(|_| rng.below(3) as u32).collect();
                            let sub = g.split(colors[rank], keys[rank]).expect(&what);
                            match (colors[rank], sub) {
                                (Some(c), Some(sub)) => {
                                    formed.push((sub, reference_split(&colors, &keys, c)));
                                }
                                (None, None) => {}
                                (c, sub) => panic!("{what}: color {c:?}, {sub:?}"),
                            }
                        }
                        1 => {
                            let list = rng.list(5);
                            match g.subgroup(&list).expect(&what) {
                                Some(sub) => formed.push((sub, list)),
                                None => assert!(!list.contains(&rank), "{what}"),
                            }
                        }
                        _ => {
                            let list = rng.list(5);
                            let name = format!("s{}", rng.below(2));
                            if list.contains(&rank) {
                                let sub = g.subgroup_of_members(&list, &name).expect(&what);
                                formed.push((sub, list));
                            }
                        }
                    }
                }
                for (mut sub, members) in formed {
                    check_members(&mut sub, rank, &members);
                }
                let mut x = [0u32; 1];
                g.all_sum(&[1], &mut x).unwrap();
                assert_eq!(x[0], 5);
            }
        });
    }
}

/// A sub-group formed with a timeout of its own waits that long, not its parent's (60 s here):
/// for its start-up (rank 2 never comes while the others wait) and for its operations (rank 1
/// never sends). Each rank that is not to come waits for the others' failures for 30 s, and
/// then comes after all: with the parent's timeouts, the others would then succeed.
#[test]
fn sub_groups_of_members_with_a_timeout_of_their_own() {
    for net in nets() {
        let failed = (Mutex::new(0), Condvar::new());
        let fail = |result: Result<(), Error>| {
            *failed.0.lock().unwrap() += 1;
            failed.1.notify_all();
            result
        };
        let others_failed = |count: usize| {
            let waited = failed.1.wait_timeout_while(
                failed.0.lock().unwrap(),
                Duration::from_secs(30),
                |n| *n < count,
            );
            !waited.unwrap().1.timed_out()
        };
        let second = Duration::from_secs(1);
        let got = with_group(net, 3, 1, |g| {
            let late = match g.rank() {
                2 if others_failed(2) => return Ok(()),
                2 => g.subgroup_of_members_with_timeout(&[0, 1, 2], "late", second),
                _ => {
                    return fail(
                        g.subgroup_of_members_with_timeout(&[0, 1, 2], "late", second)
                            .map(drop),
                    );
                }
            };
            late.map(drop)
        });
        // Rank 0 times out; rank 1 hears of it from rank 0.
        assert!(
            matches!(&got[0], Err(Error::Bootstrap(why)) if why.contains("timed out")),
            "{net:?}: {got:?}"
        );
        assert!(
            matches!(&got[1], Err(Error::Bootstrap(_))),
            "{net:?}: {got:?}"
        );
        *failed.0.lock().unwrap() = 0;
        let got = with_group(net, 3, 1, |g| {
            let mut pair = match g.rank() {
                2 => return Ok(()),
                _ => g.subgroup_of_members_with_timeout(&[0, 1], "pair", second)?,
            };
            match g.rank() {
                0 => fail(pair.recv(&mut [0u8], 1)),
                _ if others_failed(1) => Ok(()),
                _ => pair.send(&[1u8], 0),
            }
        });
        assert!(
            matches!(&got[0], Err(Error::Timeout { after, .. }) if *after == second),
            "{net:?}: {got:?}"
        );
    }
}

/// Two sub-groups of the same members and name, formed one after the other by their members
/// alone, are two groups: what one sends, the other never receives.
#[test]
fn sub_groups_with_one_name_and_list_do_not_cross() {
    for net in nets() {
        with_group(net, 3, 1, |g| {
            let all = [0, 1, 2];
            let mut a = g.subgroup_of_members(&all, "x").unwrap();
            let mut b = g.subgroup_of_members(&all, "x").unwrap();
            match g.rank() {
                0 => {
                    a.send(&[1u32], 2).unwrap();
                    b.send(&[2u32], 2).unwrap();
                }
                2 => {
                    // b's first: crossed links would hand it a's message.
                    let mut got = [0u32; 2];
                    b.recv(&mut got[1..], 0).unwrap();
                    a.recv(&mut got[..1], 0).unwrap();
                    assert_eq!(got, [1, 2], "{net:?}");
                }
                _ => {}
            }
            a.barrier().unwrap();
            b.barrier().unwrap();
        });
    }
}

/// Forming a sub-group waits for its members, and that wait listens: to an abort of the
/// parent from another thread, and to a member that has left the parent (its start-up
/// timeout, a minute here, would end it otherwise).
#[test]
fn forming_a_sub_group_ends_by_abort_or_a_member_that_left() {
    for net in nets() {
        let make = || {
            configs(net, 2, 1, Duration::from_secs(60))
                .into_iter()
                .map(|c| c.startup_timeout(Duration::from_secs(60)))
                .collect()
        };
        // Rank 1 never comes; rank 0's own thread aborts it.
        let results = with_configs(make, |g| {
            if g.rank() == 1 {
                std::thread::sleep(Duration::from_millis(1500));
                return None;
            }
            let abort = g.abort_handle();
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                abort.abort();
            });
            let formed = g.subgroup_of_members(&[0, 1], "never");
            aborter.join().unwrap();
            Some(formed.map(drop))
        });
        assert!(
            matches!(results[0], Some(Err(Error::Aborted { .. }))),
            "{net:?}: {:?}",
            results[0]
        );
        // Rank 1 has left the group before rank 0 forms one with it.
        let results = with_configs(make, |g| {
            if g.rank() == 1 {
                return None;
            }
            std::thread::sleep(Duration::from_millis(500));
            Some(g.subgroup_of_members(&[0, 1], "gone").map(drop))
        });
        assert!(
            matches!(results[0], Some(Err(Error::PeerLost { peer: 1, .. }))),
            "{net:?}: {:?}",
            results[0]
        );
    }
}

#[test]
fn members_that_formed_their_group_and_left_the_parent_do_not_fail_the_others() {
    // Each rank drops the parent as soon as its own sub-group is formed, while other members
    // may still be forming theirs: one that formed it did its part and is no loss. (A narrow
    // window: the members meet before any of them finishes, so this rarely catches it.)
    for size in [7, 12, 24] {
        for round in 0..3 {
            let results = with_group(Net::Tcp, size, 1, |g| {
                let color = (g.rank() % 2) as u32;
                if round == 2 {
                    g.subgroup(&(0..size).rev().collect::<Vec<_>>())
                        .map(|s| s.is_some())
                } else {
                    // Round 1 orders each new group backwards.
                    let key = if round == 0 {
                        0
                    } else {
                        (size - g.rank()) as u32
                    };
                    g.split(Some(color), key).map(|s| s.is_some())
                }
            });
            for (rank, r) in results.iter().enumerate() {
                assert!(
                    matches!(r, Ok(true)),
                    "{size} ranks, round {round}: rank {rank}: {r:?}"
                );
            }
        }
    }
}

#[test]
fn split_mismatches_are_errors_that_name_the_ranks_not_hangs() {
    for net in nets() {
        // Lists that differ: every rank fails with Mismatch naming one that differs from it.
        let errors = with_group(net, 4, 1, |g| {
            let list: Vec<usize> = if g.rank() == 3 {
                vec![0, 1]
            } else {
                vec![0, 2]
            };
            g.subgroup(&list).err()
        });
        for (rank, e) in errors.into_iter().enumerate() {
            match e {
                Some(Error::Mismatch { peer, .. }) => {
                    assert!(rank == 3 || peer == 3, "rank {rank} named {peer}");
                    assert_ne!(peer, rank);
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
        // split against subgroup.
        let errors = with_group(net, 3, 1, |g| match g.rank() {
            0 => g.subgroup(&[0, 1, 2]).err(),
            _ => g.split(Some(0), 0).err(),
        });
        for (rank, e) in errors.into_iter().enumerate() {
            let e = e.unwrap_or_else(|| panic!("rank {rank} formed a group"));
            assert!(matches!(e, Error::Mismatch { .. }), "rank {rank}: {e}");
            assert!(e.to_string().contains("subgroup"), "rank {rank}: {e}");
        }
        // A bad list is the same InvalidArgument on every rank, and leaves the group usable.
        let results = with_group(net, 3, 1, |g| {
            let errors = [
                g.subgroup(&[]).err(),
                g.subgroup(&[0, 3]).err(),
                g.subgroup(&[1, 1]).err(),
            ];
            let mut x = [0u8; 1];
            g.all_sum(&[1], &mut x).unwrap();
            (errors.map(|e| e.map(|e| e.to_string())), x[0])
        });
        for (errors, sum) in results {
            assert_eq!(sum, 3);
            for e in errors {
                assert!(e.unwrap().contains("invalid argument"));
            }
        }
    }
}

/// 2 pretend hosts × 4 ranks: per-host groups use the direct shared-memory collectives, a
/// group of the ranks with the same local index goes across hosts (TCP, or RDMA where there
/// is a port).
#[test]
fn two_hosts_split_into_hosts_and_across() {
    let results = with_group(Net::Mixed, 8, 1, |g| {
        let rank = g.rank();
        let mut host = g.split(Some((rank / 4) as u32), 0).unwrap().unwrap();
        let mut across = g.split(Some((rank % 4) as u32), 0).unwrap().unwrap();
        check_members(
            &mut host,
            rank,
            &(rank / 4 * 4..rank / 4 * 4 + 4).collect::<Vec<_>>(),
        );
        check_members(&mut across, rank, &[rank % 4, rank % 4 + 4]);
        (
            host.shares_memory_with_all(),
            host.transport(),
            across.transport(),
        )
    });
    let remote = if rdma_here() {
        Transport::Rdma
    } else {
        Transport::Tcp
    };
    for (rank, (direct, host, across)) in results.into_iter().enumerate() {
        assert!(
            direct,
            "rank {rank}: the host's group is not direct over shm"
        );
        assert!(
            host.iter().all(|(_, t)| *t == Transport::Shm),
            "rank {rank}: {host:?}"
        );
        assert_eq!(across, vec![(1 - rank / 4, remote)], "rank {rank}");
    }
}

/// A data-parallel and a tensor-parallel group, used from two threads of every rank at once,
/// each for 1000 calls of mixed collectives whose results are checked.
#[test]
fn data_and_tensor_parallel_groups_from_two_threads_at_once() {
    for net in nets() {
        with_group(net, 4, 1, |g| {
            let rank = g.rank();
            let tp = g.split(Some((rank / 2) as u32), 0).unwrap().unwrap();
            let dp = g.split(Some((rank % 2) as u32), 0).unwrap().unwrap();
            std::thread::scope(|s| {
                for mut sub in [tp, dp] {
                    s.spawn(move || mixed_calls(&mut sub, 1000, rank));
                }
            });
            // The parent is untouched by all that.
            let mut x = [0u16; 1];
            g.all_sum(&[rank as u16], &mut x).unwrap();
            assert_eq!(x[0], 6);
        });
    }
}

/// `calls` collectives of several kinds and sizes on `g`, each checked; `tag` names this
/// process in the values.
fn mixed_calls(g: &mut Group, calls: usize, tag: usize) {
    let (rank, n) = (g.rank(), g.size());
    let mut ranks = vec![0u64; n];
    g.all_gather(&[tag as u64], &mut ranks).unwrap();
    for i in 0..calls {
        let len = [1, 7, 300, 5000][i % 4];
        let value = |r: usize, j: usize| (ranks[r] * 1000 + (i + j) as u64 % 1000) as f64;
        match i % 5 {
            0 => {
                let input: Vec<f64> = (0..len).map(|j| value(rank, j)).collect();
                let mut out = vec![0.0; len];
                g.all_sum(&input, &mut out).unwrap();
                for (j, v) in out.iter().enumerate() {
                    assert_eq!(*v, (0..n).map(|r| value(r, j)).sum::<f64>());
                }
            }
            1 => {
                let input: Vec<f64> = (0..len).map(|j| value(rank, j)).collect();
                let mut out = vec![0.0; len * n];
                g.all_gather(&input, &mut out).unwrap();
                for (k, v) in out.iter().enumerate() {
                    assert_eq!(*v, value(k / len, k % len));
                }
            }
            2 => {
                let root = i % n;
                let mut data: Vec<f64> = (0..len).map(|j| value(rank, j)).collect();
                g.broadcast(&mut data, root).unwrap();
                assert!(data.iter().enumerate().all(|(j, v)| *v == value(root, j)));
            }
            3 => {
                let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
                let input: Vec<f64> = (0..len).map(|j| value(rank, j)).collect();
                let mut out = vec![0.0; len];
                g.send(&input, right).unwrap();
                g.recv(&mut out, left).unwrap();
                assert!(out.iter().enumerate().all(|(j, v)| *v == value(left, j)));
            }
            _ => g.barrier().unwrap(),
        }
    }
}

#[test]
fn a_dropped_sub_group_leaves_the_parent_usable_and_its_peers_fail() {
    for net in nets() {
        let results = with_group(net, 4, 1, |g| {
            let rank = g.rank();
            let mut sub = g.split(Some(0), 0).unwrap().unwrap();
            let lost = if rank == 1 {
                drop(sub);
                None
            } else {
                let mut x = [0u8; 1];
                Some(sub.all_sum(&[1], &mut x).unwrap_err())
            };
            let mut x = [0u8; 1];
            g.all_sum(&[1], &mut x).unwrap();
            (lost, x[0])
        });
        for (rank, (lost, sum)) in results.into_iter().enumerate() {
            assert_eq!(sum, 4);
            if rank != 1 {
                let e = lost.unwrap();
                assert!(
                    matches!(e, Error::PeerLost { .. }),
                    "{net:?} rank {rank}: {e}"
                );
            }
        }
    }
}

#[test]
fn a_sub_group_outlives_its_parent() {
    for net in nets() {
        with_group(net, 3, 1, |g| {
            let mut sub = g.split(Some(0), 2 - g.rank() as u32).unwrap().unwrap();
            let mut parent = std::mem::replace(g, jaccl::init_with(Config::new(0, 1)).unwrap());
            // Every rank drops the parent before the sub-group's first call.
            parent.barrier().unwrap();
            drop(parent);
            let mut x = [0u8; 1];
            sub.all_sum(&[1], &mut x).unwrap();
            assert_eq!(x[0], 3);
        });
    }
}

// Nonblocking operations.

#[test]
fn sixteen_all_reduces_waited_in_reverse_order() {
    for net in nets() {
        for size in [1, 2, 4] {
            with_group(net, size, 1, |g| {
                let rank = g.rank();
                let requests: Vec<_> = (0..16usize)
                    .map(|k| {
                        let len = [8, 1000, 70_000, 300_000][k % 4];
                        let mut data: Vec<i64> =
                            (0..len).map(|i| (rank * 31 + k + i) as i64).collect();
                        g.start(move |g| {
                            g.all_reduce_in_place(&mut data, ReduceOp::Sum)?;
                            Ok((k, data))
                        })
                    })
                    .collect();
                for request in requests.into_iter().rev() {
                    let (k, data) = request.wait().unwrap();
                    for (i, v) in data.iter().enumerate() {
                        let expect: i64 = (0..size).map(|r| (r * 31 + k + i) as i64).sum();
                        assert_eq!(*v, expect, "{net:?} size {size} op {k} element {i}");
                    }
                }
            });
        }
    }
}

#[test]
fn blocking_and_nonblocking_calls_run_in_the_order_they_were_started() {
    for net in nets() {
        with_group(net, 4, 1, |g| {
            let rank = g.rank();
            let n = g.size();
            let mut expected = Vec::new();
            let mut requests = Vec::new();
            for k in 0..40u32 {
                let input = vec![rank as u32 * 100 + k; 3000];
                if k % 3 == 0 {
                    // Blocking: it must run after every one started before it.
                    let mut out = vec![0u32; 3000 * n];
                    g.all_gather(&input, &mut out).unwrap();
                    assert_eq!(out[3000 * (n - 1)], (n as u32 - 1) * 100 + k);
                } else {
                    let root = k as usize % n;
                    requests.push(g.start(move |g| {
                        let mut data = input;
                        g.broadcast(&mut data, root)?;
                        Ok(data[0])
                    }));
                    expected.push(root as u32 * 100 + k);
                }
            }
            let got: Vec<u32> = requests.into_iter().map(|r| r.wait().unwrap()).collect();
            assert_eq!(got, expected);
        });
    }
}

#[test]
fn sixty_four_outstanding_operations_of_every_kind() {
    for net in nets() {
        with_group(net, 3, 1, |g| {
            let (rank, n) = (g.rank(), g.size());
            let requests: Vec<_> = (0..64usize)
                .map(|k| {
                    g.start(move |g| {
                        let input = vec![(rank + k) as f32; 64];
                        let mut out = vec![0f32; 64 * n];
                        match k % 4 {
                            0 => g.all_gather(&input, &mut out)?,
                            1 => g.all_to_all(&out.clone(), &mut out)?,
                            2 => g.reduce_scatter(&out.clone(), &mut out[..64], ReduceOp::Max)?,
                            _ => {
                                let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
                                g.send(&input, right)?;
                                g.recv(&mut out[..64], left)?;
                            }
                        }
                        Ok((k, out))
                    })
                })
                .collect();
            for request in requests {
                let (k, out) = request.wait().unwrap();
                if k % 4 == 0 {
                    assert!((0..n).all(|r| out[r * 64] == (r + k) as f32));
                }
                if k % 4 == 3 {
                    assert_eq!(out[0], ((rank + n - 1) % n + k) as f32);
                }
            }
        });
    }
}

#[test]
fn a_request_can_be_polled_and_waited_with_a_timeout() {
    let results = with_group(Net::Tcp, 2, 1, |g| {
        if g.rank() == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let request = g.start(Group::barrier);
        let early = request.is_done();
        let timed_out = !request.wait_timeout(Duration::from_millis(50));
        assert!(request.wait_timeout(Duration::from_secs(30)));
        assert!(request.is_done());
        request.wait().unwrap();
        (early, timed_out)
    });
    // Rank 0 waited for rank 1, which came 300 ms later.
    assert_eq!(results[0], (false, true));
}

#[test]
fn errors_come_through_the_handles_and_poison_the_group() {
    for net in nets() {
        let results = with_group(net, 3, 1, |g| {
            // An argument error: the group stays usable.
            let bad = g.start(|g| g.all_sum(&[1u8, 2], &mut [0u8; 1])).wait();
            assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
            // Ranks that disagree on the length: Mismatch, then the later ones fail alike.
            let len = if g.rank() == 2 { 5 } else { 4 };
            let first = g.start(move |g| g.all_sum(&vec![1u8; len], &mut vec![0u8; len]));
            let second = g.start(Group::barrier);
            let blocking = g.barrier();
            (first.wait(), second.wait(), blocking)
        });
        for (rank, (first, second, blocking)) in results.into_iter().enumerate() {
            let first = first.unwrap_err();
            assert!(
                matches!(first, Error::Mismatch { .. } | Error::PeerLost { .. }),
                "{net:?} rank {rank}: {first}"
            );
            assert_eq!(second.unwrap_err().to_string(), first.to_string());
            assert_eq!(blocking.unwrap_err().to_string(), first.to_string());
        }
    }
}

#[test]
fn dropping_a_group_with_operations_in_flight_fails_them_without_hanging() {
    for net in nets() {
        let results = with_group(net, 3, 1, |g| {
            let mut parent = std::mem::replace(g, jaccl::init_with(Config::new(0, 1)).unwrap());
            // Rank 0 starts operations its peers never call, and drops the group.
            if parent.rank() != 0 {
                return Vec::new();
            }
            let requests: Vec<_> = (0..8)
                .map(|k| {
                    let mut data = vec![k as f32; 1 << 16];
                    parent.start(move |g| {
                        g.all_reduce_in_place(&mut data, ReduceOp::Sum)?;
                        Ok(data)
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(100));
            drop(parent);
            requests.into_iter().map(|r| r.wait().map(drop)).collect()
        });
        for result in &results[0] {
            let e = result.as_ref().unwrap_err();
            assert!(
                matches!(e, Error::Closed { rank: 0 } | Error::PeerLost { .. }),
                "{net:?}: {e}"
            );
        }
        assert_eq!(results[0].len(), 8);
    }
}

#[test]
fn nonblocking_operations_run_on_sub_groups_too() {
    for net in nets() {
        with_group(net, 4, 1, |g| {
            let rank = g.rank();
            let mut sub = g.split(Some((rank % 2) as u32), 0).unwrap().unwrap();
            let on_sub = sub.start(move |s| {
                let mut x = [0u32; 1];
                s.all_sum(&[rank as u32], &mut x)?;
                Ok(x[0])
            });
            let on_parent = g.start(move |p| {
                let mut x = [0u32; 1];
                p.all_sum(&[rank as u32], &mut x)?;
                Ok(x[0])
            });
            assert_eq!(on_parent.wait().unwrap(), 6);
            assert_eq!(on_sub.wait().unwrap(), if rank % 2 == 0 { 2 } else { 4 });
        });
    }
}
