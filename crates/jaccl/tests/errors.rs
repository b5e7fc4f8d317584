//! The error contract: argument errors, start-up failures, mismatched calls, vanished and
//! stopped peers, poisoning. Ranks are threads over real loopback TCP, real shared memory, or
//! a ring of both.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use std::io::Write;
use std::net::TcpListener;
use std::time::Duration;

use common::*;
use jaccl::{Config, Dtype, Error, Group, Op, ReduceOp, Topology, Transport};

fn invalid(r: jaccl::Result<()>) -> String {
    match r {
        Err(Error::InvalidArgument(msg)) => msg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn bad_lengths_are_invalid_arguments_and_leave_the_group_usable() {
    for net in nets() {
        bad_lengths_on(net);
    }
}

fn bad_lengths_on(net: Net) {
    with_group(net, 3, 2, |g| {
        let rank = g.rank();
        let mut out = vec![0f32; 9];
        let msg = invalid(g.all_sum(&[1.0f32; 10], &mut out));
        assert!(
            msg.contains(&format!("rank {rank}")) && msg.contains("all_reduce"),
            "{msg}"
        );
        let msg = invalid(g.all_gather(&[1u8; 4], &mut [0u8; 11]));
        assert!(msg.contains("all_gather") && msg.contains("3 × 4"), "{msg}");
        let msg = invalid(g.reduce_scatter(&[1i32; 10], &mut [0i32; 3], ReduceOp::Sum));
        assert!(msg.contains("reduce_scatter"), "{msg}");
        let msg =
            invalid(g.all_reduce_raw(&[0u8; 6], &mut [0u8; 6], Dtype::Float32, ReduceOp::Sum));
        assert!(msg.contains("4-byte"), "{msg}");
        // Nothing was sent, so the group still works.
        let mut sum = [0u64; 3];
        g.all_sum(&[1u64; 3], &mut sum).unwrap();
        assert_eq!(sum, [3; 3]);
    });
}

/// A receive from a rank off the ring waits for the connection that rank makes on first use;
/// that wait ends like every other: by the operation timeout when the rank never sends, and
/// at once, naming it, when the rank leaves the group.
#[test]
fn waits_for_a_connection_made_on_first_use_end() {
    for net in [Net::Tcp, Net::Mixed] {
        // Rank 3 of 5 waits for rank 0 (not a neighbour, and with `Mixed` on the other host).
        let errors = with_group_timeout(net, 5, 1, Duration::from_secs(2), |g| {
            match g.rank() {
                3 => Some(g.recv(&mut [0u8; 4], 0).unwrap_err()),
                // Busy in its own code for longer than the timeout, then gone.
                0 => {
                    std::thread::sleep(Duration::from_secs(4));
                    None
                }
                _ => None,
            }
        });
        match &errors[3] {
            Some(Error::Timeout {
                rank: 3,
                op: Op::Recv,
                ..
            }) => {}
            other => panic!("{net:?}: expected a Timeout of the recv, got {other:?}"),
        }
        let errors = with_group_timeout(net, 5, 1, Duration::from_secs(600), |g| {
            match g.rank() {
                3 => Some(g.recv(&mut [0u8; 4], 0).unwrap_err()),
                _ => None, // rank 0 drops its group
            }
        });
        match &errors[3] {
            Some(
                e @ Error::PeerLost {
                    rank: 3,
                    peer: 0,
                    op: Op::Recv,
                    ..
                },
            ) => {
                assert!(e.to_string().contains("left"), "{net:?}: {e}");
            }
            other => panic!("{net:?}: expected rank 0 lost, got {other:?}"),
        }
    }
}

#[test]
fn sends_to_itself_or_to_no_rank_fail_at_once() {
    with_group(Net::Shm, 5, 1, |g| {
        let rank = g.rank();
        assert!(invalid(g.send(&[1u8], rank)).contains("itself"));
        assert!(invalid(g.recv(&mut [0u8], rank)).contains("itself"));
        assert!(invalid(g.send(&[1u8], 9)).contains("does not exist"));
        g.barrier().unwrap();
    });
}

#[test]
fn a_group_of_one_needs_no_network() {
    let mut g = jaccl::init_with(Config::new(0, 1)).unwrap();
    let mut out = [0f64; 3];
    g.all_max(&[1.0, 2.0, 3.0], &mut out).unwrap();
    assert_eq!(out, [1.0, 2.0, 3.0]);
    let mut gathered = [0i16; 2];
    g.all_gather(&[4i16, 5], &mut gathered).unwrap();
    assert_eq!(gathered, [4, 5]);
    let mut rs = [false; 2];
    g.reduce_scatter(&[true, false], &mut rs, ReduceOp::Min)
        .unwrap();
    assert_eq!(rs, [true, false]);
    g.barrier().unwrap();
    assert!(invalid(g.send(&[1u8], 0)).contains("itself"));
}

#[test]
fn unreachable_coordinator_is_a_bootstrap_error() {
    let addr = free_coordinator();
    let cfg = Config::new(1, 2)
        .coordinator(addr.clone())
        .startup_timeout(Duration::from_millis(700));
    match jaccl::init_with(cfg) {
        Err(Error::Bootstrap(msg)) => {
            assert!(msg.contains(&addr) && msg.contains("rank 1"), "{msg}");
        }
        other => panic!("expected Bootstrap, got {other:?}"),
    }
}

#[test]
fn a_foreign_server_is_refused_with_a_clear_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        // Answers every connection with a banner, as an ssh server would.
        listener.set_nonblocking(true).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until {
            if let Ok((mut s, _)) = listener.accept() {
                let _ = s.write_all(b"SSH-2.0-OpenSSH_9\r\n");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let cfg = Config::new(1, 2)
        .coordinator(addr.clone())
        .startup_timeout(Duration::from_secs(1));
    match jaccl::init_with(cfg) {
        Err(Error::Bootstrap(msg)) => assert!(
            msg.contains(&addr) && msg.contains("closed the connection"),
            "{msg}"
        ),
        other => panic!("expected Bootstrap, got {other:?}"),
    }
    server.join().unwrap();
}

#[test]
fn a_coordinator_with_another_token_is_refused_without_learning_it() {
    // Rank 0 of one job, rank 1 of another job of the same size on the same port.
    let mut a = configs(Net::Tcp, 2, 1, Duration::from_secs(30));
    let b = configs(Net::Tcp, 2, 1, Duration::from_secs(30));
    a[1] = b[1].clone().coordinator(a[0].coordinator.clone().unwrap());
    let results = init_all(
        a.into_iter()
            .map(|c| c.startup_timeout(Duration::from_secs(2)))
            .collect(),
    );
    match &results[1] {
        Err(Error::Bootstrap(msg)) => {
            assert!(msg.contains("does not know this job's token"), "{msg}");
        }
        other => panic!("expected Bootstrap, got {other:?}"),
    }
    // Rank 0 is never told anything by the stranger and waits for its real rank 1.
    match &results[0] {
        Err(Error::Bootstrap(msg)) => assert!(msg.contains("waiting for rank(s) 1"), "{msg}"),
        other => panic!("expected Bootstrap, got {other:?}"),
    }
}

#[test]
fn invalid_configurations_are_refused_before_any_network() {
    let config_error = |cfg: Config| match jaccl::init_with(cfg) {
        Err(Error::Config(msg)) => msg,
        other => panic!("expected Config, got {other:?}"),
    };
    assert!(config_error(Config::new(3, 2)).contains("rank 3"));
    assert!(config_error(Config::new(0, 2)).contains("coordinator"));
    assert!(config_error(Config::new(0, 1).wires(9)).contains("wires"));
    // A group of one needs no links, whatever the topology.
    let alone = jaccl::init_with(Config::new(0, 1).topology(Topology::Mesh)).unwrap();
    assert_eq!(alone.topology(), None);
}

/// Without RDMA (no library, or no device: this machine outside the VM), a forced `rdma`
/// fails on every rank with the reason; `auto` quietly uses the other transports.
#[test]
fn rdma_where_there_is_none_is_unsupported_with_the_reason() {
    let cases: &[(Option<&str>, &str)] = &[
        (
            Some("/nonexistent/libibverbs.so.1"),
            "cannot load /nonexistent/libibverbs.so.1",
        ),
        (None, ""),
    ];
    for &(library, reason) in cases {
        if library.is_none() && std::env::var("RDMA_VM").is_ok() {
            continue; // The VM has a device.
        }
        let mut cfgs = configs(Net::Tcp, 2, 1, Duration::from_secs(30));
        for c in &mut cfgs {
            *c = c.clone().transport(Transport::Rdma);
            if let Some(path) = library {
                *c = c.clone().rdma_library(path);
            }
        }
        for (rank, r) in init_all(cfgs).into_iter().enumerate() {
            match r {
                Err(Error::Unsupported(msg)) => {
                    assert!(
                        msg.contains("the rdma transport is unavailable on rank"),
                        "{msg}"
                    );
                    assert!(msg.contains(reason), "{msg}");
                    assert!(
                        ["cannot load", "no RDMA device", "no active RDMA port"]
                            .iter()
                            .any(|why| msg.contains(why)),
                        "rank {rank}: {msg}"
                    );
                }
                other => panic!("rank {rank}: expected Unsupported, got {other:?}"),
            }
        }
        let make = || {
            let cfgs = configs(Net::Mixed, 4, 1, Duration::from_secs(30)).into_iter();
            cfgs.map(|c| match library {
                Some(path) => c.rdma_library(path),
                None => c,
            })
            .collect()
        };
        for transports in with_configs(make, |g| g.transport()) {
            assert!(
                transports.iter().all(|(_, t)| *t != Transport::Rdma),
                "{transports:?}"
            );
        }
    }
}

#[test]
fn ranks_that_disagree_on_wires_fail_at_start_up() {
    let mut cfgs = configs(Net::Tcp, 3, 1, Duration::from_secs(30));
    cfgs[2] = cfgs[2].clone().wires(2);
    let results = init_all(cfgs);
    for r in results {
        match r {
            Err(Error::Bootstrap(msg)) => assert!(msg.contains("wires"), "{msg}"),
            other => panic!("expected Bootstrap, got {other:?}"),
        }
    }
}

#[test]
fn ranks_that_disagree_on_the_liveness_window_fail_at_start_up() {
    let mut cfgs = configs(Net::Tcp, 3, 1, Duration::from_secs(30));
    cfgs[1] = cfgs[1].clone().liveness(Duration::MAX);
    for r in init_all(cfgs) {
        match r {
            Err(Error::Bootstrap(msg)) => {
                assert!(
                    msg.contains("liveness window") && msg.contains("off"),
                    "{msg}"
                );
            }
            other => panic!("expected Bootstrap, got {other:?}"),
        }
    }
}

#[test]
fn ranks_that_disagree_on_the_link_speed_fail_at_start_up() {
    let mut cfgs = configs(Net::Tcp, 3, 1, Duration::from_secs(30));
    cfgs[1] = cfgs[1].clone().link("100Gb/s,2us".parse().unwrap());
    for r in init_all(cfgs) {
        match r {
            Err(Error::Bootstrap(msg)) => {
                assert!(
                    msg.contains("link speed") && msg.contains("100Gb/s,2us"),
                    "{msg}"
                );
            }
            other => panic!("expected Bootstrap, got {other:?}"),
        }
    }
}

/// Rooted calls go on once their data is on its way (the trees' headers travel with the data),
/// so ranks that disagree on the root may all return, leaving messages unread. A later call
/// that reads such a message fails with `Mismatch`, never taking it for its own, even where it
/// is a reduce or gather too (the header carries the call's number in the group), and any call
/// in which two ranks that described the rooted calls before otherwise exchange headers fails
/// too (the headers carry a digest of those calls); every rank fails by the barrier after it.
/// `roots[r]` is rank r's root in the first call: for 2 ranks each takes the other, for 4 and 5
/// the ranks fall in two trees that each complete alone, leaving messages on links that no
/// call but a tree's reads (at 4 ranks the barrier reads only the ring's).
#[test]
fn rooted_calls_that_disagree_on_the_root_fail_the_call_that_reads_what_they_left() {
    for (kind, roots, next_root) in [
        ("reduce", vec![1, 0], Some(0)),
        ("reduce", vec![3, 3, 0, 0, 3], Some(0)),
        ("gather", vec![3, 3, 0, 0, 3], Some(0)),
        ("reduce", vec![2, 2, 0, 0], None),
        ("gather", vec![1, 3, 3, 1], None),
    ] {
        let n = roots.len();
        let outcomes = with_group_timeout(Net::Tcp, n, 1, Duration::from_secs(20), |g| {
            let r = g.rank();
            let mut calls = Vec::new();
            let mut out = vec![0u32; n];
            let calls_of = [(0, Some(roots[r])), (100, next_root)];
            for (i, root) in calls_of
                .into_iter()
                .filter_map(|(i, root)| Some((i, root?)))
            {
                let mine = [i + r as u32];
                calls.push(match kind {
                    "reduce" => g.reduce(&mine, &mut out[..1], ReduceOp::Sum, root),
                    _ => g.gather(&mine, &mut out, root),
                });
                // What the second call gave its root, if it returned, must be that call's.
                let right = match kind {
                    "reduce" => out[0] == (100..100 + n as u32).sum::<u32>(),
                    _ => out == (100..100 + n as u32).collect::<Vec<_>>(),
                };
                if i == 100 && r == 0 && calls.last().is_some_and(Result::is_ok) {
                    assert!(right, "{kind} {roots:?}: rank 0 returned {out:?}");
                }
            }
            calls.push(g.barrier());
            calls
        });
        for (r, calls) in outcomes.iter().enumerate() {
            let failure = calls.iter().find_map(|c| c.as_ref().err());
            match failure {
                Some(Error::Mismatch { detail, .. }) => {
                    let why = ["collective #", "earlier broadcasts"];
                    assert!(
                        why.iter().any(|w| detail.contains(w)),
                        "{kind} {roots:?} rank {r}: {detail}"
                    );
                }
                Some(Error::PeerLost { .. } | Error::Closed { .. }) => {}
                other => panic!("{kind} {roots:?} rank {r}: expected a failure, got {other:?}"),
            }
        }
        // The rank that read a message left unread names it.
        assert!(
            outcomes.iter().any(|calls| calls
                .iter()
                .any(|c| matches!(c, Err(Error::Mismatch { .. })))),
            "{kind} {roots:?}: {outcomes:?}"
        );
    }
}

/// Ranks that wait for links made on first use, or for a rank that hands its input over,
/// from ranks in another call: the deadlock search sees those waits too, so every rank fails
/// well before the timeout (before, each of these waited for it). At 4 ranks, reduces whose
/// roots disagree (a rank waits for a tree partner's connection that never comes), then a
/// barrier; at 6, one rank's reduce or gather to rank 0 among the others' reduce-scatter,
/// which hands the input of ranks 0 and 2 over to ranks 1 and 3.
#[test]
fn waits_for_links_and_hand_overs_are_seen_by_the_deadlock_search() {
    let cases: [(usize, &[usize], &str); 6] = [
        (4, &[0, 1, 0, 0], "reduce"),
        (4, &[3, 1, 0, 3], "reduce"),
        (4, &[1, 1, 2, 2], "reduce"),
        (6, &[0], "reduce"),
        (6, &[2], "reduce"),
        (6, &[0], "gather"),
    ];
    for (n, roots, kind) in cases {
        let outcomes = with_group_timeout(Net::Tcp, n, 1, Duration::from_secs(120), |g| {
            let r = g.rank();
            let (input, mut out) = (vec![1u32; n], vec![0u32; n]);
            let first = match (roots.len(), kind) {
                (1, _) if r != roots[0] => g.reduce_scatter(&input, &mut out[..1], ReduceOp::Sum),
                (1, "gather") => g.gather(&input[..1], &mut out, 0),
                (1, _) => g.reduce(&input[..1], &mut out[..1], ReduceOp::Sum, 0),
                _ => g.reduce(&input[..1], &mut out[..1], ReduceOp::Sum, roots[r]),
            };
            [first, g.barrier()]
        });
        let at = format!("{n} ranks, {kind} {roots:?}");
        for (r, calls) in outcomes.iter().enumerate() {
            match calls.iter().find_map(|c| c.as_ref().err()) {
                Some(Error::Timeout { .. }) | None => panic!("{at}: rank {r}: {calls:?}"),
                Some(_) => {}
            }
        }
        let seen = |c: &jaccl::Result<()>| {
            matches!(c, Err(Error::Deadlock { .. } | Error::Mismatch { .. }))
        };
        assert!(outcomes.iter().flatten().any(seen), "{at}: {outcomes:?}");
    }
}

/// The other side: ranks that wait for links made on first use from a rank still computing
/// (it reports nothing), or that took theirs and wait for data, are no deadlock, however long
/// they wait: 12 ranks' pairwise all-to-all (every pair gets a link; 8 KiB blocks) with each
/// rank starting up to 3 s late (several rounds of reports), then rooted calls, against the
/// reference.
#[test]
fn ranks_that_wait_for_a_late_rank_to_connect_are_no_deadlock() {
    let n = 12;
    let outcomes = with_group(Net::Tcp, n, 1, |g| {
        let r = g.rank();
        std::thread::sleep(Duration::from_millis((r * 7 % n) as u64 * 250));
        let block = 2048;
        let input: Vec<u32> = (0..n * block).map(|i| (r * n * block + i) as u32).collect();
        let mut out = vec![0u32; n * block];
        g.all_to_all(&input, &mut out)?;
        let expect =
            (0..n).flat_map(|s| (0..block).map(move |i| (s * n * block + r * block + i) as u32));
        assert!(out.iter().copied().eq(expect), "rank {r}");
        for root in [n - 1, 5] {
            std::thread::sleep(Duration::from_millis((r * 5 % n) as u64 * 100));
            let mut sum = [0u32];
            g.reduce(&[r as u32], &mut sum, ReduceOp::Sum, root)?;
            if r == root {
                assert_eq!(sum[0], (0..n as u32).sum::<u32>());
            }
        }
        g.barrier()
    });
    for (r, outcome) in outcomes.iter().enumerate() {
        assert!(outcome.is_ok(), "rank {r}: {outcome:?}");
    }
}

/// Starts a group from `cfgs`, one thread per rank, and returns how each start-up ended.
fn init_all(cfgs: Vec<Config>) -> Vec<jaccl::Result<()>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cfgs
            .into_iter()
            .map(|c| s.spawn(move || jaccl::init_with(c).map(drop)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Every rank must fail, never with a timeout; ranks next to the odd one report `Mismatch`, the
/// others that or the mismatch behind their neighbour's failure.
fn expect_mismatch(size: usize, odd: usize, results: Vec<jaccl::Result<()>>) {
    expect_mismatch_named(size, odd, results, true);
}

/// As [`expect_mismatch`]; unless `neighbours_first`, any rank may report the mismatch behind
/// another's failure: a call that makes its links to ranks off the ring before it reads its
/// neighbours' headers (the pairwise all-to-all below 8 ranks) may hear of a failure first.
fn expect_mismatch_named(
    size: usize,
    odd: usize,
    results: Vec<jaccl::Result<()>>,
    neighbours_first: bool,
) {
    for (rank, r) in results.into_iter().enumerate() {
        let neighbour_of_odd = rank == (odd + 1) % size || rank == (odd + size - 1) % size;
        let must_name = neighbours_first && (neighbour_of_odd || rank == odd);
        match r {
            Err(Error::Mismatch {
                rank: who,
                peer,
                detail,
                ..
            }) => {
                assert_eq!(who, rank);
                assert!(detail.contains("called"), "{detail}");
                assert!(rank == odd || peer == odd, "rank {rank} blames {peer}");
            }
            // Failing when a neighbour gives up, it hears why through the heartbeat.
            Err(Error::PeerLost { cause, .. }) if !must_name => {
                assert!(cause.contains("disagrees"), "rank {rank}: {cause}");
            }
            other => panic!("size {size} rank {rank}: expected Mismatch, got {other:?}"),
        }
    }
}

#[test]
fn ranks_that_disagree_on_the_transport_fail_at_start_up() {
    let mut cfgs = configs(Net::Tcp, 3, 1, Duration::from_secs(30));
    cfgs[1] = cfgs[1].clone().transport(Transport::Shm);
    let results = init_all(cfgs);
    for r in results {
        match r {
            Err(Error::Bootstrap(msg)) => assert!(msg.contains("transport"), "{msg}"),
            other => panic!("expected Bootstrap, got {other:?}"),
        }
    }
}

#[test]
fn ranks_that_disagree_on_the_topology_fail_at_start_up() {
    let mut cfgs = configs(Net::Tcp, 4, 1, Duration::from_secs(30));
    cfgs[3] = cfgs[3].clone().topology(Topology::Mesh);
    for r in init_all(cfgs) {
        match r {
            Err(Error::Bootstrap(msg)) => assert!(msg.contains("topology"), "{msg}"),
            other => panic!("expected Bootstrap, got {other:?}"),
        }
    }
}

#[test]
fn shared_memory_with_a_rank_on_another_host_is_unsupported() {
    // Forced shared memory, but rank 2 of 4 pretends to be on another host: rank 0 is not its
    // neighbour, and must not wait for those who are.
    let mut cfgs = configs(Net::Shm, 4, 1, Duration::from_secs(30));
    cfgs[2] = cfgs[2].clone().host_id("elsewhere");
    let results = init_all(cfgs);
    // Every rank sees every host, so all fail at once, naming the pair.
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Err(Error::Unsupported(msg)) => {
                assert!(
                    msg.contains("neighbours 1") && msg.contains("elsewhere"),
                    "{msg}"
                );
            }
            other => panic!("rank {rank}: expected Unsupported, got {other:?}"),
        }
    }
}

#[test]
fn different_lengths_ops_types_or_reductions_give_mismatch() {
    // 8 and 13 over TCP: recursive doubling and Rabenseifner's algorithm over links made on
    // first use (with hand-overs at 13), and Bruck's all-gather and all-to-all; the 200 kB
    // all-reduce below takes the ring at 8 ranks, Rabenseifner's at 13.
    let sizes = |net| match net {
        Net::Mesh | Net::MeshLocal => vec![2, 3, 4, 8],
        Net::Tcp => vec![2, 3, 4, 8, 13],
        _ => vec![2, 3, 4],
    };
    for (net, size) in nets()
        .into_iter()
        .flat_map(|n| sizes(n).into_iter().map(move |s| (n, s)))
    {
        let odd = size - 1;
        let timeout = Duration::from_secs(30);
        // Different lengths.
        let r = with_group_timeout(net, size, 1, timeout, |g| {
            let len = if g.rank() == odd { 10 } else { 20 };
            g.all_sum(&vec![1f32; len], &mut vec![0f32; len])
        });
        expect_mismatch(size, odd, r);
        // Different collectives with the same byte count.
        let r = with_group_timeout(net, size, 2, timeout, |g| {
            if g.rank() == odd {
                g.all_gather(&[1u8; 4], &mut vec![0u8; 4 * g.size()])
            } else {
                g.all_sum(&[1u8; 4], &mut [0u8; 4])
            }
        });
        expect_mismatch(size, odd, r);
        // Same length, different types.
        let r = with_group_timeout(net, size, 1, timeout, |g| {
            if g.rank() == odd {
                g.all_sum(&[1i32; 64], &mut [0i32; 64])
            } else {
                g.all_sum(&[1f32; 64], &mut [0f32; 64])
            }
        });
        expect_mismatch(size, odd, r);
        // All-gathers of different lengths (Bruck's rounds from 6 ranks).
        let r = with_group_timeout(net, size, 1, timeout, |g| {
            let len = if g.rank() == odd { 3 } else { 5 };
            g.all_gather(&vec![1u32; len], &mut vec![0u32; len * g.size()])
        });
        expect_mismatch(size, odd, r);
        // All-to-alls of different lengths (Bruck's rounds from 8 ranks), and one long enough
        // for the pairwise exchange against Bruck's rounds; below 8 ranks without the mesh, the
        // pairwise exchange makes its links first.
        let neighbours_first = size >= 8 || !matches!(net, Net::Tcp | Net::Mixed | Net::Rdma);
        for odd_len in [2, 4096] {
            let r = with_group_timeout(net, size, 1, timeout, |g| {
                let len = if g.rank() == odd { odd_len } else { 3 };
                g.all_to_all(&vec![1u16; len * g.size()], &mut vec![0u16; len * g.size()])
            });
            expect_mismatch_named(size, odd, r, neighbours_first);
        }
        // 64 KiB of another type (Rabenseifner's algorithm from 3 ranks).
        let r = with_group_timeout(net, size, 1, timeout, |g| {
            if g.rank() == odd {
                g.all_sum(&[1i32; 16_384], &mut [0i32; 16_384])
            } else {
                g.all_sum(&[1f32; 16_384], &mut [0f32; 16_384])
            }
        });
        expect_mismatch(size, odd, r);
        // Same everything but the reduction.
        let r = with_group_timeout(net, size, 1, timeout, |g| {
            let op = if g.rank() == odd {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            g.all_reduce(&[1u16; 100_000], &mut [0u16; 100_000], op)
        });
        expect_mismatch(size, odd, r);
        // Reduce-scatters of different lengths (recursive halving from 3 ranks), and at
        // 8 ranks over TCP, a length past halving's limit (the ring) against halving's, both
        // ways round: the halving ranks show the ring neighbours their header first.
        for (odd_len, len) in [(3, 5), (10_000, 5), (5, 10_000)] {
            let r = with_group_timeout(net, size, 1, timeout, |g| {
                let len = if g.rank() == odd { odd_len } else { len };
                let input = vec![1f64; len * g.size()];
                g.reduce_scatter(&input, &mut vec![0f64; len], ReduceOp::Sum)
            });
            expect_mismatch(size, odd, r);
        }
        // Across pretend hosts of equal size, all-reduces of 512 KiB and more go in two levels: a
        // length on either side of that, or `Avg` against `Sum` there, is still a mismatch
        // that the neighbours name.
        // Both at the call that forms the levels and once they are formed.
        let odd_calls = [((1 << 17) - 1, ReduceOp::Sum), (1 << 17, ReduceOp::Avg)];
        let two_levels = net == Net::Mixed && size % 2 == 0;
        for ((odd_len, odd_op), formed) in odd_calls.into_iter().zip([false, true]) {
            if !two_levels {
                break;
            }
            let r = with_group_timeout(net, size, 1, timeout, |g| {
                let len = 1 << 17;
                if formed {
                    g.all_sum(&vec![1f32; len], &mut vec![0f32; len])?;
                }
                let (len, op) = match g.rank() == odd {
                    true => (odd_len, odd_op),
                    false => (len, ReduceOp::Sum),
                };
                g.all_reduce(&vec![1f32; len], &mut vec![0f32; len], op)
            });
            expect_mismatch(size, odd, r);
        }
        if two_levels {
            // All-gathers whose outputs fall on either side of 1 MiB.
            let r = with_group_timeout(net, size, 1, timeout, |g| {
                let block = (1 << 18) / size - usize::from(g.rank() == odd);
                g.all_gather(&vec![1f32; block], &mut vec![0f32; block * size])
            });
            expect_mismatch(size, odd, r);
        }
    }
}

/// Reduces and broadcasts whose lengths fall on either side of the two levels' size (512 KiB
/// and 1 MiB), or whose roots differ there, fail with `Mismatch` on every rank (or, hearing of
/// it, `PeerLost` naming it), never at the timeout: the odd rank takes a tree (whose edges may
/// be links made on first use, and need not be ring neighbours) or a flat all-reduce while the
/// others take the two levels. On pretend hosts whose ranks alternate (where broadcasts go in
/// two levels), singly or in pairs, and in blocks; the odd rank second or last, the root 0 or
/// the odd rank.
#[test]
fn rooted_calls_on_either_side_of_the_two_levels_give_mismatch() {
    let layouts: [&[usize]; 4] = [
        &[0, 1, 0, 1],
        &[0, 0, 0, 1, 1, 1],
        &[0, 1, 0, 1, 0, 1, 0, 1],
        &[0, 0, 1, 1, 0, 0, 1, 1],
    ];
    for host_of in layouts {
        let size = host_of.len();
        let alternate = host_of[1] != host_of[0];
        for (odd, root) in [1, size - 1].into_iter().flat_map(|o| [(o, 0), (o, o)]) {
            let make = || on_pretend_hosts_within(host_of, Duration::from_secs(30));
            // Reduces of 512 KiB against one down the tree and one just below.
            for odd_len in [1000, (1 << 17) - 1] {
                let r = with_configs(make, |g| {
                    let len = if g.rank() == odd { odd_len } else { 1 << 17 };
                    let mut out = vec![0f32; if g.rank() == root { len } else { 0 }];
                    g.reduce(&vec![1f32; len], &mut out, ReduceOp::Sum, root)
                });
                expect_mismatch_named(size, odd, r, false);
            }
            // Reduces of 1 MiB, the odd rank naming another root.
            let r = with_configs(make, |g| {
                let len = 1 << 18;
                let at = if g.rank() == odd {
                    (root + 1) % size
                } else {
                    root
                };
                let mut out = vec![0f32; if g.rank() == at { len } else { 0 }];
                g.reduce(&vec![1f32; len], &mut out, ReduceOp::Sum, at)
            });
            expect_mismatch_named(size, odd, r, false);
            // Broadcasts of 1 MiB against one down the tree.
            if alternate {
                for odd_len in [1000, (1 << 18) - 1] {
                    let mut r = with_configs(make, |g| {
                        let len = if g.rank() == odd { odd_len } else { 1 << 18 };
                        g.broadcast(&mut vec![1f32; len], root)
                    });
                    // A root hands its data over and goes on (docs/algorithms.md,
                    // "Broadcast"): it may hear of the mismatch only at its next call.
                    if root == odd && r[odd].is_ok() {
                        r[odd] = Err(Error::Mismatch {
                            rank: odd,
                            peer: (odd + 1) % size,
                            op: Op::Broadcast,
                            detail: "called (the root went on)".into(),
                        });
                    }
                    expect_mismatch_named(size, odd, r, false);
                }
            }
        }
    }
}

/// A two-level all-reduce (1 MiB on 2 pretend hosts) that waits inside one of its levels
/// stops when its group is aborted from another thread or interrupted, or when the timeout set
/// after the levels were formed runs out: the group's controls reach the waits of the
/// sub-groups it runs on, in the host's level and in the level across hosts.
#[test]
fn the_group_stops_a_two_level_all_reduce_waiting_in_a_level() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    // (ranks, the rank late to the second call, the rank stopped while it waits). 2 × 2:
    // rank 3 is late; rank 0, its ring neighbour, waits for its header, and rank 1, whose
    // neighbours have sent theirs, waits for rank 0 in its host's level (ranks 0 and 1).
    // 2 × 3: rank 4 is late; its neighbours 3 and 5 wait for its header, and ranks 0, 1 and 2
    // pass theirs and their host's reduce-scatter, then wait across hosts for 3, 4 and 5.
    for (size, late, stopped) in [(4, 3, 1), (6, 4, 0)] {
        for how in ["abort", "interrupt", "timeout"] {
            let results = with_group_timeout(Net::Mixed, size, 1, Duration::from_secs(60), |g| {
                let mut data = vec![1f32; 1 << 18];
                // The first call forms the levels.
                g.all_reduce_in_place(&mut data, ReduceOp::Sum)?;
                let stop_later = |stop: Box<dyn FnOnce() + Send>| {
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(500));
                        stop();
                    })
                };
                if g.rank() == stopped {
                    match how {
                        "abort" => {
                            let handle = g.abort_handle();
                            stop_later(Box::new(move || handle.abort()));
                        }
                        "interrupt" => {
                            let stop = Arc::new(AtomicBool::new(false));
                            let check = Arc::clone(&stop);
                            g.interrupt_when(move || check.load(Ordering::Relaxed));
                            stop_later(Box::new(move || stop.store(true, Ordering::Relaxed)));
                        }
                        _ => g.set_timeout(Duration::from_millis(500)),
                    }
                } else if g.rank() == late {
                    std::thread::sleep(Duration::from_secs(3));
                }
                g.all_reduce_in_place(&mut data, ReduceOp::Sum)
            });
            for (rank, r) in results.iter().enumerate() {
                let what = format!("{size} ranks, {how}: rank {rank}: {r:?}");
                match (how, r) {
                    _ if rank != stopped => assert!(r.is_err(), "{what}"),
                    ("abort", Err(Error::Aborted { rank: who }))
                    | ("interrupt", Err(Error::Interrupted { rank: who, .. }))
                    | ("timeout", Err(Error::Timeout { rank: who, .. })) => {
                        assert_eq!(*who, stopped, "{what}");
                    }
                    _ => panic!("{what}"),
                }
            }
        }
    }
}

#[test]
fn a_send_of_another_length_or_tag_is_a_mismatch_at_the_receiver() {
    for net in nets() {
        let r = p2p_on(
            net,
            |g, to| g.send(&[1u32; 8], to),
            |g| g.recv(&mut [0u32; 9], 0),
        );
        expect_recv_mismatch(net, &r, "8 × u32");
        // Tags are checked, not matched, on all 32 bits: pairs that a 16-bit fold made equal.
        for (sent, expected) in [(7, 70_000), (65_536, 1), (u32::MAX, 0), (0x0001_0001, 0)] {
            let r = p2p_on(
                net,
                |g, to| g.send_tagged(&[1u32; 8], to, sent),
                |g| g.recv_tagged(&mut [0u32; 8], 0, expected),
            );
            let both = format!(
                "with tag {sent}; this rank called send/recv of 8 × u32 with tag {expected}"
            );
            expect_recv_mismatch(net, &r, &both);
        }
    }
}

/// A message sent in pieces (as the torch backend sends them) arrives whole when both ends
/// name it; when they name different messages, the receiver fails at the first piece, even
/// where the pieces agree (a 32-byte message received as 16 bytes in pieces of 16).
#[test]
fn pieces_of_different_messages_are_a_mismatch_at_the_first_piece() {
    let data: Vec<u8> = (0..32).collect();
    for net in nets() {
        let received = std::sync::Mutex::new(Vec::new());
        let r = p2p_on(
            net,
            |g, to| {
                for piece in data.chunks(16) {
                    g.send_piece_raw(piece, to, Dtype::UInt8, 5, 32)?;
                }
                Ok(())
            },
            |g| {
                let mut out = [0u8; 32];
                for piece in out.chunks_mut(16) {
                    g.recv_piece_raw(piece, 0, Dtype::UInt8, 5, 32)?;
                }
                received.lock().unwrap().extend_from_slice(&out);
                Ok(())
            },
        );
        assert!(r.iter().all(Result::is_ok), "{net:?}: {r:?}");
        assert_eq!(*received.lock().unwrap(), data, "{net:?}");
        let r = p2p_on(
            net,
            |g, to| g.send_piece_raw(&data[..16], to, Dtype::UInt8, 5, 32),
            |g| g.recv_piece_raw(&mut [0u8; 16], 0, Dtype::UInt8, 5, 16),
        );
        expect_recv_mismatch(net, &r, "a piece of a message of 32 × u8");
    }
    // A piece cannot be larger than its message, nor a message a part of an element.
    let r = with_group(Net::Tcp, 2, 1, |g| {
        let peer = 1 - g.rank();
        let piece = g.send_piece_raw(&[0u8; 8], peer, Dtype::UInt8, 0, 4);
        let part = g.recv_piece_raw(&mut [0u8; 4], peer, Dtype::Float32, 0, 6);
        [piece, part].map(|r| match r {
            Err(Error::InvalidArgument(why)) => why,
            other => panic!("{other:?}"),
        })
    });
    assert!(
        r[0][0].contains("a piece of 8 bytes of a message of 4 bytes"),
        "{r:?}"
    );
    assert!(r[0][1].contains("message has 6 bytes"), "{r:?}");
}

/// Rank 0 sends to another rank, which receives: between neighbours, and with the mesh
/// between ranks that are not (0 and 2 of 4).
fn p2p_on(
    net: Net,
    send: impl Fn(&mut Group, usize) -> jaccl::Result<()> + Sync,
    recv: impl Fn(&mut Group) -> jaccl::Result<()> + Sync,
) -> Vec<jaccl::Result<()>> {
    let (size, to) = if net.mesh() { (4, 2) } else { (2, 1) };
    with_group_timeout(net, size, 1, Duration::from_secs(30), |g| match g.rank() {
        0 => send(g, to),
        r if r == to => recv(g),
        _ => Ok(()),
    })
}

/// The sender succeeded and the receiver failed with a `Mismatch` naming rank 0 and `sent`.
fn expect_recv_mismatch(net: Net, r: &[jaccl::Result<()>], sent: &str) {
    let to = if net.mesh() { 2 } else { 1 };
    assert!(r[0].is_ok(), "{net:?}: {:?}", r[0]);
    match &r[to] {
        Err(Error::Mismatch {
            peer: 0,
            op: Op::Recv,
            detail,
            ..
        }) => assert!(detail.contains(sent), "{net:?}: {detail}"),
        other => panic!("{net:?}: {other:?}"),
    }
}

/// A rank that sends or receives while the others run a collective: the ranks that can tell
/// (the collective's side for a send, the receiver for a receive) fail with `Mismatch` naming
/// the other, and nobody waits for the timeout, on every net (with shared memory the
/// collective takes the direct path, which does not use the connections send and recv use).
#[test]
fn a_send_or_recv_against_a_collective_is_a_mismatch() {
    for net in nets() {
        for size in [2, 3] {
            for len in [4, 1 << 20] {
                for sending in [true, false] {
                    let odd = size - 1;
                    let r = with_group_timeout(net, size, 1, Duration::from_secs(20), |g| {
                        let (mine, mut out) = (vec![1f32; len], vec![0f32; len]);
                        if g.rank() != odd {
                            g.all_sum(&mine, &mut out)
                        } else if sending {
                            // Stays in the group after a send that completes at once.
                            g.send(&mine, 0).and_then(|()| g.recv(&mut out, 0))
                        } else {
                            g.recv(&mut out, 0)
                        }
                    });
                    let case = format!("{net:?} size {size} len {len} sending {sending}");
                    let (tells, other) = if sending { (0, odd) } else { (odd, 0) };
                    assert!(
                        matches!(&r[tells], Err(Error::Mismatch { peer, .. }) if *peer == other),
                        "{case}: rank {tells}: {:?}",
                        r[tells]
                    );
                    for (rank, result) in r.iter().enumerate() {
                        assert!(
                            matches!(result, Err(Error::Mismatch { .. } | Error::PeerLost { .. })),
                            "{case}: rank {rank}: {result:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_rank_that_leaves_makes_the_others_fail_with_peer_lost() {
    let cases = nets().into_iter().flat_map(|n| [2, 4, 5].map(|s| (n, s)));
    // Large all-reduces go around the ring; small ones gather (with the mesh, in one step).
    // Rank 0 leaving also ends the heartbeat: its goodbye must still arrive.
    let cases = cases.flat_map(|c| [(c, 1 << 20), (c, 8)]);
    for (((net, size), len), gone) in cases.flat_map(|c| [(c, 0), (c, 1)]) {
        let results = with_group_timeout(net, size, 2, Duration::from_secs(120), |g| {
            if g.rank() == gone {
                return None; // drops the group: its connections close
            }
            let mut out = vec![0f32; len];
            Some(g.all_sum(&vec![1f32; len], &mut out))
        });
        let mut named = 0;
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                None => assert_eq!(rank, gone),
                Some(Err(Error::PeerLost {
                    rank: who,
                    peer,
                    op: Op::AllReduce,
                    cause,
                })) => {
                    assert_eq!(who, rank);
                    // Ranks further away fail when their neighbours give up, and hear through
                    // rank 0 why ("rank 2's group failed: rank 1 left the group"), even when
                    // rank 0 is the one that left (it passes news on until the others left).
                    let first_cause = format!("rank {gone} left the group");
                    assert!(cause.contains(&first_cause), "{net:?} {rank}: {cause}");
                    named += usize::from(peer == gone);
                }
                Some(other) => {
                    panic!("{net:?} size {size} rank {rank}: expected PeerLost, got {other:?}")
                }
            }
        }
        // The first rank to fail can only have seen the rank that left.
        assert!(named > 0, "{net:?} size {size}: nobody named rank {gone}");
    }
}

/// A rank that finished its part of a call may drop the group while others still make the
/// links of the call's later rounds (recursive doubling, Rabenseifner's, Bruck's, among ranks
/// that are no ring neighbours): they go on, as its goodbye says it finished the call.
#[test]
fn ranks_that_finish_a_call_and_leave_do_not_fail_the_others() {
    for size in [5, 6, 7, 12] {
        for len in [2usize, 16_384] {
            let results = with_group(Net::Tcp, size, 1, |g| {
                let mut out = vec![0f32; len];
                g.all_sum(&vec![1f32; len], &mut out)?;
                assert!(out.iter().all(|&x| x == size as f32));
                let mut all = vec![0u32; len * g.size()];
                g.all_gather(&vec![g.rank() as u32; len], &mut all)
            });
            for (rank, r) in results.iter().enumerate() {
                assert!(
                    r.is_ok(),
                    "{size} ranks, {len} elements: rank {rank}: {r:?}"
                );
            }
        }
    }
}

#[test]
fn ranks_busy_while_rank_0_leaves_still_name_it() {
    // Rank 0 drops its group while the others compute for longer than it goes on passing news
    // (half a second). When they call, a rank that fails because its neighbour did can no
    // longer hear why, but it still names rank 0's departure (and does not wait for news).
    for net in nets() {
        let len = 1 << 18; // 1 MiB of f32: around the ring, neighbours only
        let results = with_group(net, 4, 1, |g| {
            if g.rank() == 0 {
                return None;
            }
            std::thread::sleep(Duration::from_secs(1));
            let mut out = vec![0f32; len];
            Some(g.all_sum(&vec![1f32; len], &mut out))
        });
        for (rank, r) in results.into_iter().enumerate().skip(1) {
            match r {
                Some(Err(Error::PeerLost { cause, .. })) => {
                    assert!(
                        cause.contains("rank 0 left the group"),
                        "{net:?} rank {rank}: {cause}"
                    );
                }
                other => panic!("{net:?} rank {rank}: expected PeerLost, got {other:?}"),
            }
        }
    }
}

#[test]
fn a_rank_busy_in_its_own_code_is_not_an_error() {
    // Much longer than the liveness window: the heartbeat thread keeps beating meanwhile.
    on_every_net_at_once(|net| {
        let results = with_group_timeout(net, 3, 1, Duration::from_secs(60), |g| {
            if g.rank() == 1 {
                std::thread::sleep(6 * liveness_window());
            }
            let mut out = [0u32; 4];
            g.all_sum(&[1u32; 4], &mut out).map(|()| out)
        });
        // (configs() sets the window, see common::liveness_window.)
        for r in results {
            assert_eq!(r.unwrap(), [3; 4], "{net:?}");
        }
    });
}

#[test]
fn durations_too_long_to_count_mean_no_limit() {
    let mut cfgs = configs(Net::Tcp, 2, 1, Duration::MAX);
    for c in &mut cfgs {
        *c = c
            .clone()
            .startup_timeout(Duration::MAX)
            .liveness(Duration::MAX);
    }
    let sums: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = cfgs
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let mut g = jaccl::init_with(c).unwrap();
                    let mut out = [0u32];
                    g.all_sum(&[1], &mut out).unwrap();
                    out[0]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, [2, 2]);
}

#[test]
fn a_silent_peer_times_out_and_the_group_stays_failed() {
    for net in nets() {
        silent_peer_on(net);
    }
}

fn silent_peer_on(net: Net) {
    let timeout = Duration::from_millis(300);
    let results = with_group_timeout(net, 2, 1, timeout, |g| {
        if g.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
            return None;
        }
        let first = g.all_sum(&[1u8; 10], &mut [0u8; 10]);
        // Poisoned: the same error at once, for any operation.
        let second = g.barrier();
        Some((first, second))
    });
    let (first, second) = results[0].clone().unwrap();
    match &first {
        Err(Error::Timeout {
            rank: 0,
            op: Op::AllReduce,
            after,
        }) => assert_eq!(*after, timeout),
        other => panic!("{net:?}: expected Timeout, got {other:?}"),
    }
    assert_eq!(format!("{first:?}"), format!("{second:?}"));
}

#[test]
fn an_interrupt_check_stops_a_waiting_operation_and_poisons_the_group() {
    for net in nets() {
        let results = with_group_timeout(net, 2, 1, Duration::from_secs(60), |g| {
            if g.rank() == 1 {
                std::thread::sleep(Duration::from_millis(1500));
                // Rank 0's token may have arrived before it stopped: the barrier may pass.
                let _ = g.barrier();
                return (g.all_sum(&[1u8], &mut [0u8]), None, Duration::ZERO);
            }
            let start = std::time::Instant::now();
            g.interrupt_when(move || start.elapsed() > Duration::from_millis(200));
            let first = g.barrier();
            let took = start.elapsed();
            (first, Some(g.all_sum(&[1u8], &mut [0u8])), took)
        });
        let (first, again, took) = &results[0];
        assert!(
            matches!(
                first,
                Err(Error::Interrupted {
                    rank: 0,
                    op: Op::Barrier
                })
            ),
            "{net:?}: {first:?}"
        );
        assert_eq!(
            format!("{:?}", again.clone().unwrap()),
            format!("{first:?}")
        );
        // Asked at least every 100 ms while sleeping: far sooner than rank 1 arrives.
        assert!(*took < Duration::from_millis(1400), "{net:?}: {took:?}");
        // The interrupted rank closed its connections: its peer does not wait for it.
        assert!(
            matches!(results[1].0, Err(Error::PeerLost { peer: 0, .. })),
            "{net:?}: {:?}",
            results[1].0
        );
    }
}

/// What one rank of a test group runs.
type RankProgram<'a> = dyn Fn(&mut Group) -> jaccl::Result<()> + Sync + 'a;

#[test]
fn calls_that_wait_for_each_other_are_a_deadlock_not_a_timeout() {
    // With a timeout far beyond what the test waits, a `Timeout` cannot come first.
    let timeout = Duration::from_secs(600);
    on_every_net_at_once(|net| {
        for size in [2, 3, 4] {
            let right = |r: usize| (r + 1) % size;
            let left = |r: usize| (r + size - 1) % size;
            let cases: [(&str, &RankProgram<'_>); 4] = [
                // Every rank receives from its right before it sends.
                ("receive cycle", &|g| {
                    let mut inbox = vec![0u32; 4];
                    g.recv(&mut inbox, right(g.rank()))?;
                    g.send(&inbox, left(g.rank()))
                }),
                // Every rank sends to its right (the bytes arrive and wait there), then
                // receives from its right: the bytes on their way go to ranks that do not
                // read them.
                ("receive from the wrong side", &|g| {
                    g.send(&[7u8; 16], right(g.rank()))?;
                    g.recv(&mut [0u8; 16], right(g.rank()))
                }),
                // Rank 0 sends more than the connection holds to rank 1, which receives
                // from rank 2 (rank 0 if there are two), which receives from rank 0.
                ("a blocked send", &|g| {
                    let big = vec![1f32; 4 << 20];
                    let mut inbox = vec![0f32; 4];
                    match g.rank() {
                        0 => g.send(&big, 1),
                        1 => g.recv(&mut inbox, 2 % size),
                        2 => g.recv(&mut inbox, 0),
                        _ => g.barrier(),
                    }
                }),
                // Ranks 0 and 1 receive from each other first; the others all-reduce (on one
                // host, a direct collective: waiting for stamps, not bytes).
                ("a pair receives while the others all-reduce", &|g| {
                    let mut inbox = [0f32; 4];
                    match g.rank() {
                        0 | 1 => g.recv(&mut inbox, 1 - g.rank()),
                        _ => g.all_sum(&[1f32; 4], &mut inbox),
                    }
                }),
            ];
            for (what, f) in cases {
                // With two ranks the right is also the left: a valid exchange.
                let fits = match what {
                    "a blocked send" => size == 3,
                    "receive from the wrong side"
                    | "a pair receives while the others all-reduce" => size > 2,
                    _ => true,
                };
                if !fits {
                    continue;
                }
                let case = format!("{net:?} size {size}: {what}");
                let results = with_group_timeout(net, size, 1, timeout, f);
                for (rank, r) in results.iter().enumerate() {
                    match r {
                        Err(Error::Deadlock {
                            rank: who, detail, ..
                        }) => {
                            assert_eq!(*who, rank, "{case}");
                            assert!(detail.contains("waits for"), "{case}: {detail}");
                        }
                        other => panic!("{case}: rank {rank}: expected Deadlock, got {other:?}"),
                    }
                }
            }
        }
    });
}

#[test]
fn a_deadlock_between_the_ranks_that_stay_is_found() {
    for net in nets() {
        let results = with_group_timeout(net, 4, 1, Duration::from_secs(600), |g| {
            match g.rank() {
                // Ranks 2 and 3 are done: they leave the group.
                2 | 3 => Ok(()),
                r => g.recv(&mut [0u8; 8], 1 - r),
            }
        });
        for (rank, r) in results.iter().enumerate() {
            match (rank, r) {
                (2 | 3, Ok(())) => {}
                (0 | 1, Err(Error::Deadlock { detail, .. })) => {
                    assert!(detail.contains("rank 2 has left"), "{net:?}: {detail}");
                }
                _ => panic!("{net:?} rank {rank}: {r:?}"),
            }
        }
    }
}

#[test]
fn a_receive_waiting_for_a_rank_busy_in_its_own_code_is_not_a_deadlock() {
    on_every_net_at_once(|net| {
        let results = with_group(net, 2, 1, |g| {
            let mut inbox = [0u64; 2];
            if g.rank() == 0 {
                // Several liveness windows: the heartbeat reports rank 0 blocked meanwhile.
                g.recv(&mut inbox, 1)?;
                g.send(&inbox, 1)
            } else {
                std::thread::sleep(liveness_window() * 4);
                g.send(&[1u64, 2], 0)?;
                g.recv(&mut inbox, 0)
            }
            .map(|()| inbox)
        });
        for (rank, r) in results.into_iter().enumerate() {
            assert_eq!(r.ok(), Some([1, 2]), "{net:?} rank {rank}");
        }
    });
}
