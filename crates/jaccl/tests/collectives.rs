//! Every collective, every dtype and reduction, in place and out of place, over real loopback
//! TCP with one thread per rank; compared with the reference and across ranks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use std::sync::Mutex;

use common::*;
use jaccl::half::{bf16, f16};
use jaccl::num_complex::Complex32;
use jaccl::{Dtype, Group, ReduceOp};

const SIZES: [usize; 6] = [1, 2, 3, 4, 5, 8];
const WIRES: [usize; 3] = [1, 2, 4];

/// Runs `f::<T>` for all 14 element types.
macro_rules! for_all_dtypes {
    ($f:ident, $($arg:expr),*) => {{
        let mut digest: Vec<u64> = Vec::new();
        digest.extend($f::<bool>($($arg),*));
        digest.extend($f::<i8>($($arg),*));
        digest.extend($f::<i16>($($arg),*));
        digest.extend($f::<i32>($($arg),*));
        digest.extend($f::<i64>($($arg),*));
        digest.extend($f::<u8>($($arg),*));
        digest.extend($f::<u16>($($arg),*));
        digest.extend($f::<u32>($($arg),*));
        digest.extend($f::<u64>($($arg),*));
        digest.extend($f::<f16>($($arg),*));
        digest.extend($f::<bf16>($($arg),*));
        digest.extend($f::<f32>($($arg),*));
        digest.extend($f::<f64>($($arg),*));
        digest.extend($f::<Complex32>($($arg),*));
        digest
    }};
}

fn all_reduce_case<T: TestElem>(g: &mut Group, lengths: &[usize]) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    let mut digest = Vec::new();
    for &len in lengths {
        for op in ReduceOp::ALL {
            let ins = inputs::<T>(size, len, op);
            let expect = bits(&reference_reduce(&ins, op));
            let what = format!("{} {op} len {len} rank {rank}/{size}", T::DTYPE);
            let mut out = vec![T::default(); len];
            g.all_reduce(&ins[rank], &mut out, op)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(bits(&out), expect, "out of place: {what}");
            let mut data = ins[rank].clone();
            g.all_reduce_in_place(&mut data, op)
                .unwrap_or_else(|e| panic!("{what} in place: {e}"));
            assert_eq!(bits(&data), expect, "in place: {what}");
            digest.extend(bits(&out));
        }
    }
    digest
}

#[test]
fn all_reduce_every_dtype_op_size_and_wires() {
    for size in SIZES {
        for wires in WIRES {
            let digests = with_group(size, wires, |g| {
                for_all_dtypes!(all_reduce_case, g, &edge_lengths(size, wires))
            });
            for (rank, d) in digests.iter().enumerate() {
                assert_eq!(
                    d, &digests[0],
                    "rank {rank} differs from rank 0 (size {size} wires {wires})"
                );
            }
        }
    }
}

#[test]
fn large_messages_of_byte_types_take_the_ring_path() {
    // Small messages gather whole vectors; 1-byte elements need long vectors to reach the ring.
    for size in [2, 3, 5] {
        for wires in [1, 3] {
            let lengths = [300_007];
            let digests = with_group(size, wires, |g| {
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
        for op in ReduceOp::ALL {
            let ins = inputs::<T>(size, size * len, op);
            let full = reference_reduce(&ins, op);
            let expect = bits(&full[rank * len..(rank + 1) * len]);
            let mut out = vec![T::default(); len];
            g.reduce_scatter(&ins[rank], &mut out, op)
                .unwrap_or_else(|e| panic!("{} {op} len {len} rank {rank}: {e}", T::DTYPE));
            assert_eq!(
                bits(&out),
                expect,
                "{} {op} len {len} rank {rank}/{size}",
                T::DTYPE
            );
        }
    }
    Vec::new()
}

#[test]
fn all_gather_and_reduce_scatter_every_dtype_size_and_wires() {
    for size in SIZES {
        for wires in WIRES {
            let lengths = edge_lengths(size, wires);
            let digests = with_group(size, wires, |g| {
                let mut d = for_all_dtypes!(all_gather_case, g, &lengths);
                d.extend(for_all_dtypes!(reduce_scatter_case, g, &lengths));
                d
            });
            assert!(digests.iter().all(|d| d == &digests[0]));
        }
    }
}

fn send_recv_case<T: TestElem>(g: &mut Group, lengths: &[usize]) -> Vec<u64> {
    let (rank, size) = (g.rank(), g.size());
    let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
    for &len in lengths {
        // Shift right, then left. Even ranks send first, odd ranks receive first.
        for (to, from) in [(right, left), (left, right)] {
            let mine: Vec<T> = (0..len).map(|i| T::value(rank, i, ReduceOp::Sum)).collect();
            let expect: Vec<T> = (0..len).map(|i| T::value(from, i, ReduceOp::Sum)).collect();
            let mut got = vec![T::default(); len];
            if rank % 2 == 0 {
                g.send(&mine, to).unwrap();
                g.recv(&mut got, from).unwrap();
            } else {
                g.recv(&mut got, from).unwrap();
                g.send(&mine, to).unwrap();
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
    for size in [2, 3, 4, 5] {
        for wires in WIRES {
            let lengths = [0, 1, 5, 4096, 70_001];
            with_group(size, wires, |g| {
                for_all_dtypes!(send_recv_case, g, &lengths)
            });
        }
    }
}

#[test]
fn barrier_waits_for_every_rank() {
    for size in SIZES {
        let entered = Mutex::new(vec![0usize; size]);
        with_group(size, 1, |g| {
            for round in 1..=20 {
                entered.lock().unwrap()[g.rank()] = round;
                g.barrier().unwrap();
                let seen = entered.lock().unwrap().clone();
                assert!(
                    seen.iter().all(|&r| r >= round),
                    "rank {} left barrier {round} before all entered: {seen:?}",
                    g.rank()
                );
                // A second barrier keeps anyone from entering round + 1 before all checked.
                g.barrier().unwrap();
            }
        });
    }
}

#[test]
fn wrappers_raw_api_and_mixed_sequences() {
    for size in [1, 2, 3, 4] {
        with_group(size, 2, |g| {
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
            }
        });
    }
}

#[test]
fn float_sums_are_bit_identical_across_ranks_and_runs() {
    // Values whose sums round, so the order of additions matters.
    let run = || {
        with_group(5, 2, |g| {
            let rank = g.rank();
            let x: Vec<f32> = (0..50_003)
                .map(|i| (mix(rank, i) % 1_000_003) as f32 * 1.37e-3 + 1e-7)
                .collect();
            let mut y = vec![0f32; x.len()];
            g.all_sum(&x, &mut y).unwrap();
            let h: Vec<f16> = x.iter().map(|v| f16::from_f32(*v)).collect();
            let mut hy = vec![f16::ZERO; h.len()];
            g.all_sum(&h, &mut hy).unwrap();
            let mut bits: Vec<u64> = y.iter().map(|v| v.to_bits() as u64).collect();
            bits.extend(hy.iter().map(|v| v.to_bits() as u64));
            bits
        })
    };
    let first = run();
    for (rank, r) in first.iter().enumerate() {
        assert_eq!(r, &first[0], "rank {rank} differs");
    }
    assert_eq!(run()[0], first[0], "a second run gives other bits");
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn random_shapes_match_the_reference(
            size in 2usize..=5,
            wires in 1usize..=3,
            len in 0usize..20_000,
            op_index in 0usize..3,
        ) {
            let op = ReduceOp::ALL[op_index];
            let results = with_group(size, wires, |g| {
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
            let expect = bits(&reference_reduce(&inputs::<f32>(size, len, op), op));
            let gathered = inputs::<u16>(size, len, op).concat();
            let rs_full = reference_reduce(&inputs::<i64>(size, size * len, op), op);
            for (rank, (out, g, rs)) in results.into_iter().enumerate() {
                prop_assert_eq!(&out, &expect);
                prop_assert_eq!(&g, &gathered);
                prop_assert_eq!(&rs[..], &rs_full[rank * len..(rank + 1) * len]);
            }
        }
    }
}
