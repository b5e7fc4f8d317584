//! A soak: many random collectives of every kind (random rank count, transport, wires, element
//! type, reduction, root, length and uneven counts, in place or not), each compared with the
//! plain reference on every rank.
//! `JACCL_SOAK` sets the number of collectives (default 10,000, about 15 s); the full run is
//! `JACCL_SOAK=100000 cargo test --release -p jaccl --test soak -- --nocapture`.
//! `JACCL_SOAK_SEED` replays a run (the seed of each is printed).
//! A watchdog ends the process if no rank starts a collective for [`STALL`]: every operation
//! has a 60 s timeout, so that is a wait that never ends, and it names the group and the
//! step each rank is at (the test would otherwise hang until CI's limit, saying nothing).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use common::*;
use jaccl::Group;
use jaccl::half::{bf16, f16};
use jaccl::num_complex::Complex32;
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Collectives per group, before a fresh group with other settings.
const PER_GROUP: usize = 150;

/// The largest group the soak makes.
const MAX_RANKS: usize = 6;

/// How long the watchdog lets the ranks go without starting a collective: longer than any
/// operation's timeout (60 s) and liveness window together.
const STALL: Duration = Duration::from_secs(180);

/// What the watchdog reports: the group being run, and the step each rank last started.
static GROUP: Mutex<String> = Mutex::new(String::new());
static STEPS: [AtomicUsize; MAX_RANKS] = [const { AtomicUsize::new(0) }; MAX_RANKS];

/// Ends the process with a report if the steps stop moving for [`STALL`].
fn watchdog() {
    std::thread::spawn(|| {
        let steps = || {
            STEPS
                .iter()
                .map(|s| s.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        let (mut last, mut since) = (steps(), Instant::now());
        loop {
            std::thread::sleep(Duration::from_secs(5));
            let now = steps();
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() >= STALL {
                let group = GROUP
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                eprintln!(
                    "soak: HANG: no collective started for {STALL:?} in {group}; \
                     the step each rank started last (1-based): {now:?}"
                );
                std::process::exit(2);
            }
        }
    });
}

fn rng(seed: u64) -> TestRng {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&seed.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &b)
}

/// A length: mostly small, sometimes large (log-uniform up to 2^18 elements).
fn length(rng: &mut TestRng) -> usize {
    let bits = rng.random_range(0..19);
    rng.random_range(0..(1usize << bits) + 1)
}

/// One random collective of element type `T`, checked against the reference. Every rank
/// draws the same choices from `rng`.
fn one<T: TestElem>(g: &mut Group, rng: &mut TestRng, step: usize) {
    let (rank, size) = (g.rank(), g.size());
    STEPS[rank].store(step + 1, Ordering::Relaxed);
    let ops = ops_of::<T>();
    let op = ops[rng.random_range(0..ops.len())];
    let root = rng.random_range(0..size);
    let len = length(rng);
    let what = format!(
        "step {step}: {} {op} len {len} rank {rank}/{size}",
        T::DTYPE
    );
    match rng.random_range(0..12) {
        0 | 1 => {
            let ins = inputs::<T>(size, len, op);
            let expect = bits_for(op, &expected_reduction::<T>(size, len, op));
            if rng.random_bool(0.5) {
                let mut data = ins[rank].clone();
                g.all_reduce_in_place(&mut data, op)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(bits_for(op, &data), expect, "in place {what}");
            } else {
                let mut out = vec![T::default(); len];
                g.all_reduce(&ins[rank], &mut out, op)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(bits_for(op, &out), expect, "{what}");
            }
        }
        2 => {
            let ins = inputs::<T>(size, len, op);
            let mut out = vec![T::default(); size * len];
            g.all_gather(&ins[rank], &mut out)
                .unwrap_or_else(|e| panic!("all_gather {what}: {e}"));
            assert_eq!(bits(&out), bits(&ins.concat()), "all_gather {what}");
        }
        5 => {
            let mut data: Vec<T> = (0..len).map(|i| T::value(rank, i, op)).collect();
            g.broadcast(&mut data, root)
                .unwrap_or_else(|e| panic!("broadcast {what}: {e}"));
            let expect: Vec<T> = (0..len).map(|i| T::value(root, i, op)).collect();
            assert_eq!(bits(&data), bits(&expect), "broadcast {what} root {root}");
        }
        6 => {
            let ins = inputs::<T>(size, len, op);
            let mut out = vec![T::default(); if rank == root { len } else { 0 }];
            g.reduce(&ins[rank], &mut out, op, root)
                .unwrap_or_else(|e| panic!("reduce {what}: {e}"));
            if rank == root {
                let expect = bits_for(op, &expected_reduction::<T>(size, len, op));
                assert_eq!(bits_for(op, &out), expect, "reduce {what} root {root}");
            }
        }
        7 => {
            let ins = inputs::<T>(size, len, op);
            let mut out = vec![T::default(); if rank == root { size * len } else { 0 }];
            g.gather(&ins[rank], &mut out, root)
                .unwrap_or_else(|e| panic!("gather {what}: {e}"));
            if rank == root {
                assert_eq!(bits(&out), bits(&ins.concat()), "gather {what} root {root}");
            }
        }
        8 => {
            let all = inputs::<T>(size, len, op).concat();
            let input = if rank == root {
                all.clone()
            } else {
                Vec::new()
            };
            let mut out = vec![T::default(); len];
            g.scatter(&input, &mut out, root)
                .unwrap_or_else(|e| panic!("scatter {what}: {e}"));
            assert_eq!(
                bits(&out),
                bits(&all[rank * len..(rank + 1) * len]),
                "scatter {what}"
            );
        }
        9 => {
            // Uneven counts, the same draw on every rank: counts[s][d] from s to d.
            let counts: Vec<Vec<usize>> = (0..size)
                .map(|_| {
                    (0..size)
                        .map(|_| rng.random_range(0..=len / size))
                        .collect()
                })
                .collect();
            let send = counts[rank].clone();
            let recv: Vec<usize> = (0..size).map(|s| counts[s][rank]).collect();
            let input = |s: usize| -> Vec<T> {
                let n: usize = counts[s].iter().sum();
                (0..n).map(|i| T::value(s, i, op)).collect()
            };
            let mut out = vec![T::default(); recv.iter().sum()];
            g.all_to_all_v(&input(rank), &send, &mut out, &recv)
                .unwrap_or_else(|e| panic!("all_to_all_v {what}: {e}"));
            let expect: Vec<T> = (0..size)
                .flat_map(|s| {
                    let start: usize = counts[s][..rank].iter().sum();
                    input(s)[start..start + counts[s][rank]].to_vec()
                })
                .collect();
            assert_eq!(bits(&out), bits(&expect), "all_to_all_v {what}");
        }
        10 => {
            let counts: Vec<usize> = (0..size).map(|_| rng.random_range(0..=len)).collect();
            let mine: Vec<T> = (0..counts[rank]).map(|i| T::value(rank, i, op)).collect();
            let mut out = vec![T::default(); counts.iter().sum()];
            g.all_gather_v(&mine, &mut out, &counts)
                .unwrap_or_else(|e| panic!("all_gather_v {what}: {e}"));
            let expect: Vec<T> = (0..size)
                .flat_map(|r| (0..counts[r]).map(move |i| T::value(r, i, op)))
                .collect();
            assert_eq!(bits(&out), bits(&expect), "all_gather_v {what}");
        }
        11 => {
            let counts: Vec<usize> = (0..size).map(|_| rng.random_range(0..=len)).collect();
            let total: usize = counts.iter().sum();
            let ins = inputs::<T>(size, total, op);
            let mut out = vec![T::default(); counts[rank]];
            g.reduce_scatter_v(&ins[rank], &mut out, &counts, op)
                .unwrap_or_else(|e| panic!("reduce_scatter_v {what}: {e}"));
            let start: usize = counts[..rank].iter().sum();
            let full = expected_reduction::<T>(size, total, op);
            let expect = bits_for(op, &full[start..start + counts[rank]]);
            assert_eq!(bits_for(op, &out), expect, "reduce_scatter_v {what}");
        }
        3 => {
            let ins = inputs::<T>(size, size * len, op);
            let full = expected_reduction::<T>(size, size * len, op);
            let mut out = vec![T::default(); len];
            g.reduce_scatter(&ins[rank], &mut out, op)
                .unwrap_or_else(|e| panic!("reduce_scatter {what}: {e}"));
            assert_eq!(
                bits_for(op, &out),
                bits_for(op, &full[rank * len..(rank + 1) * len]),
                "reduce_scatter {what}"
            );
        }
        _ => {
            // Shift right around the ring; even ranks send first.
            let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
            let mine: Vec<T> = (0..len).map(|i| T::value(rank, i, op)).collect();
            let mut got = vec![T::default(); len];
            if rank % 2 == 0 {
                g.send(&mine, right).unwrap();
                g.recv(&mut got, left).unwrap();
            } else {
                g.recv(&mut got, left).unwrap();
                g.send(&mine, right).unwrap();
            }
            let expect: Vec<T> = (0..len).map(|i| T::value(left, i, op)).collect();
            assert_eq!(bits(&got), bits(&expect), "send/recv {what}");
        }
    }
}

fn any_dtype(g: &mut Group, rng: &mut TestRng, step: usize) {
    match rng.random_range(0..14) {
        0 => one::<bool>(g, rng, step),
        1 => one::<i8>(g, rng, step),
        2 => one::<i16>(g, rng, step),
        3 => one::<i32>(g, rng, step),
        4 => one::<i64>(g, rng, step),
        5 => one::<u8>(g, rng, step),
        6 => one::<u16>(g, rng, step),
        7 => one::<u32>(g, rng, step),
        8 => one::<u64>(g, rng, step),
        9 => one::<f16>(g, rng, step),
        10 => one::<bf16>(g, rng, step),
        11 => one::<f32>(g, rng, step),
        12 => one::<f64>(g, rng, step),
        _ => one::<Complex32>(g, rng, step),
    }
}

#[test]
fn random_collectives_match_the_reference() {
    let total: usize = std::env::var("JACCL_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let seed: u64 = std::env::var("JACCL_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(random_u64);
    eprintln!("soak: {total} collectives, JACCL_SOAK_SEED={seed}");
    let mut setup = rng(seed);
    let nets = nets();
    watchdog();
    let mut done = 0;
    while done < total {
        let net = nets[setup.random_range(0..nets.len())];
        let size = setup.random_range(2..=MAX_RANKS);
        let wires = setup.random_range(1..=4);
        let count = PER_GROUP.min(total - done);
        let group_seed = setup.random::<u64>();
        *GROUP.lock().unwrap() = format!(
            "the group of steps {done}.. ({net:?}, {size} ranks, {wires} wires, seed {seed})"
        );
        with_group(net, size, wires, |g| {
            let mut r = rng(group_seed);
            for step in 0..count {
                any_dtype(g, &mut r, done + step);
            }
        });
        done += count;
    }
    eprintln!("soak: {done} collectives, no wrong byte");
}
