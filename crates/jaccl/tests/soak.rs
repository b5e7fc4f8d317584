//! A soak: many random collectives (random rank count, transport, wires, element type,
//! reduction, length, in place or not), each compared with the plain reference on every rank.
//! `JACCL_SOAK` sets the number of collectives (default 10,000, about 15 s); the full run is
//! `JACCL_SOAK=100000 cargo test --release -p jaccl --test soak -- --nocapture`.
//! `JACCL_SOAK_SEED` replays a run (the seed of each is printed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use common::*;
use jaccl::half::{bf16, f16};
use jaccl::num_complex::Complex32;
use jaccl::{Group, ReduceOp};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng};

/// Collectives per group, before a fresh group with other settings.
const PER_GROUP: usize = 150;

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
    let op = ReduceOp::ALL[rng.random_range(0..3)];
    let len = length(rng);
    let what = format!(
        "step {step}: {} {op} len {len} rank {rank}/{size}",
        T::DTYPE
    );
    match rng.random_range(0..5) {
        0 | 1 => {
            let ins = inputs::<T>(size, len, op);
            let expect = bits(&reference_reduce(&ins, op));
            if rng.random_bool(0.5) {
                let mut data = ins[rank].clone();
                g.all_reduce_in_place(&mut data, op)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(bits(&data), expect, "in place {what}");
            } else {
                let mut out = vec![T::default(); len];
                g.all_reduce(&ins[rank], &mut out, op)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(bits(&out), expect, "{what}");
            }
        }
        2 => {
            let ins = inputs::<T>(size, len, op);
            let mut out = vec![T::default(); size * len];
            g.all_gather(&ins[rank], &mut out)
                .unwrap_or_else(|e| panic!("all_gather {what}: {e}"));
            assert_eq!(bits(&out), bits(&ins.concat()), "all_gather {what}");
        }
        3 => {
            let ins = inputs::<T>(size, size * len, op);
            let full = reference_reduce(&ins, op);
            let mut out = vec![T::default(); len];
            g.reduce_scatter(&ins[rank], &mut out, op)
                .unwrap_or_else(|e| panic!("reduce_scatter {what}: {e}"));
            assert_eq!(
                bits(&out),
                bits(&full[rank * len..(rank + 1) * len]),
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
    let mut done = 0;
    while done < total {
        let net = nets[setup.random_range(0..nets.len())];
        let size = setup.random_range(2..=6);
        let wires = setup.random_range(1..=4);
        let count = PER_GROUP.min(total - done);
        let group_seed = setup.random::<u64>();
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
