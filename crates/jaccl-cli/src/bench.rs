//! `jaccl bench`: an nccl-tests-style sweep over message sizes, with correctness checks.
//!
//! Outside a launcher it starts `-n` local ranks of itself; under one (a rank variable is
//! set) it is one rank. Per size, every rank:
//! 1. runs one operation on known inputs and checks every element;
//! 2. warms up in rounds of 1, 2, 4, ... operations until a round takes 50 ms (or `--warmup`);
//! 3. times `--iters` operations (default: enough for about 0.3 s), back to back;
//! 4. checks the last result (with `--check`: every result, timing each operation alone);
//! 5. does the same in place where the operation has an in-place form.
//!
//! Loop counts and times are agreed through the group itself, so every rank runs the same
//! number of operations; `time` is the slowest rank's mean.

use std::time::{Duration, Instant};

use jaccl::half::{bf16, f16};
use jaccl::num_complex::Complex32;
use jaccl::{Config, Dtype, Element, Group, ReduceOp};

use crate::args::{BenchArgs, BenchOp};
use crate::report::{self, Row, Timing};

/// The smallest size: `-b`, else 8 bytes or one element per rank, whichever is more.
pub(crate) fn min_bytes(args: &BenchArgs, ranks: usize) -> usize {
    let per_rank = if args.op.per_rank() { ranks } else { 1 };
    args.min_bytes
        .unwrap_or_else(|| (per_rank * args.dtype.size()).max(8))
}

/// The sizes of the sweep on `ranks` ranks: the smallest, × f, ... up to `-e`.
pub(crate) fn sizes(args: &BenchArgs, ranks: usize) -> Vec<usize> {
    if args.op == BenchOp::Barrier {
        return vec![0];
    }
    crate::args::sweep(min_bytes(args, ranks), args.max_bytes, args.factor)
}

/// Checks that the sweep makes sense for `ranks` ranks on this machine: it has sizes, each
/// moves at least one element per rank, and the largest fits in memory.
///
/// # Errors
/// What is wrong, and what to use instead.
pub(crate) fn check_sweep(args: &BenchArgs, ranks: usize) -> Result<(), String> {
    let sizes = sizes(args, ranks);
    let Some(&largest) = sizes.last() else {
        return Err(format!(
            "no sizes to measure: -b {} is larger than -e {}",
            min_bytes(args, ranks),
            args.max_bytes
        ));
    };
    if args.op.rooted() && args.root >= ranks {
        return Err(format!(
            "--root {}: there are only {} ranks (0 to {})",
            args.root,
            ranks,
            ranks.saturating_sub(1)
        ));
    }
    if !args.reduce.applies_to(args.dtype) && args.op.reduces() {
        return Err(format!(
            "--reduce {} does not apply to {} (bitwise reductions take integers and bool, avg \
             takes numbers)",
            args.reduce, args.dtype
        ));
    }
    if args.op == BenchOp::Barrier {
        return Ok(());
    }
    let elem = args.dtype.size();
    let smallest = sizes[0];
    let (input, output, _) = layout(args.op, ranks, smallest, elem);
    if input.min(output) == 0 {
        let needed = if args.op.per_rank() {
            ranks * elem
        } else {
            elem
        };
        return Err(format!(
            "-b {smallest}: less than one {} element per rank for {} on {ranks} ranks; use -b {needed} or more",
            args.dtype,
            args.op.name()
        ));
    }
    // Input, output and the expected output of every local rank.
    let (input, output, _) = layout(args.op, ranks, largest, elem);
    let per_rank = (input.saturating_add(output.saturating_mul(2))).saturating_mul(elem);
    let total = rustix::system::sysinfo();
    let memory = u64::from(total.mem_unit).saturating_mul(total.totalram as u64);
    let needed = (per_rank as u64).saturating_mul(ranks as u64);
    if needed > memory {
        return Err(format!(
            "-e {largest}: {ranks} ranks would need {} MiB of buffers, and this machine has {} MiB",
            needed >> 20,
            memory >> 20
        ));
    }
    Ok(())
}

/// True when a launcher (jaccl launch, mpirun, torchrun...) made this process a rank.
pub(crate) fn under_launcher() -> bool {
    jaccl::config::RANK_VARIABLES
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|x| !x.trim().is_empty()))
}

/// Runs the benchmark as one rank. Returns whether every value was right.
pub(crate) fn run_rank(args: &BenchArgs) -> Result<bool, String> {
    let mut config = Config::from_env().map_err(|e| e.to_string())?;
    args.group.apply(&mut config)?;
    let mut world = jaccl::init_with(config).map_err(|e| e.to_string())?;
    let leader = world.rank() == 0;
    let mut sub = match args.split {
        Some(groups) => Some(split(&mut world, usize::from(groups))?),
        None => None,
    };
    let g = sub.as_mut().unwrap_or(&mut world);
    if args.op == BenchOp::SendRecv && g.size() < 2 {
        return Err("send-recv needs at least 2 ranks".into());
    }
    check_sweep(args, g.size())?;
    let sizes = sizes(args, g.size());
    let setup = report::Setup {
        op: args.op.name(),
        bus_factor: args.op.bus_factor(g.size()),
        dtype: args.dtype.to_string(),
        reduce: args.op.reduces().then(|| args.reduce.to_string()),
        min_bytes: min_bytes(args, g.size()),
        max_bytes: args.max_bytes,
        factor: args.factor,
        iters: args.iters,
        warmup: args.warmup,
        check: args.check,
        json: args.json.clone(),
        plot: args.plot.clone(),
        split: args.split.map(usize::from),
    };
    let mut out = report::Report::new(&setup, g, sizes.len(), leader)?;
    let mut all_ok = true;
    for bytes in sizes {
        let row = measure_dtype(g, args, bytes).map_err(|e| e.to_string())?;
        all_ok &= row.wrong() == 0;
        out.row(row)?;
    }
    out.finish()?;
    Ok(all_ok)
}

/// The sub-group of `world` this rank measures with `--split groups`: consecutive ranks.
fn split(world: &mut Group, groups: usize) -> Result<Group, String> {
    let n = world.size();
    if !n.is_multiple_of(groups) {
        return Err(format!(
            "--split {groups}: {n} ranks do not split into {groups} equal groups"
        ));
    }
    let color = u32::try_from(world.rank() / (n / groups)).map_err(|e| e.to_string())?;
    let sub = world.split(Some(color), 0).map_err(|e| e.to_string())?;
    sub.ok_or_else(|| "split gave this rank no group".to_string())
}

fn measure_dtype(g: &mut Group, args: &BenchArgs, bytes: usize) -> jaccl::Result<Row> {
    match args.dtype {
        Dtype::Bool => measure::<bool>(g, args, bytes),
        Dtype::Int8 => measure::<i8>(g, args, bytes),
        Dtype::Int16 => measure::<i16>(g, args, bytes),
        Dtype::Int32 => measure::<i32>(g, args, bytes),
        Dtype::Int64 => measure::<i64>(g, args, bytes),
        Dtype::UInt8 => measure::<u8>(g, args, bytes),
        Dtype::UInt16 => measure::<u16>(g, args, bytes),
        Dtype::UInt32 => measure::<u32>(g, args, bytes),
        Dtype::UInt64 => measure::<u64>(g, args, bytes),
        Dtype::Float16 => measure::<f16>(g, args, bytes),
        Dtype::BFloat16 => measure::<bf16>(g, args, bytes),
        Dtype::Float32 => measure::<f32>(g, args, bytes),
        Dtype::Float64 => measure::<f64>(g, args, bytes),
        Dtype::Complex64 => measure::<Complex32>(g, args, bytes),
    }
}

/// Elements whose reductions are exact in every dtype whatever the order of their steps:
/// values 1 to 4, so sums of up to 64 ranks stay exact even in bf16; for products 1 or 2, so
/// a product is a power of two (exact, or infinite alike in any order); with a period of 13 so
/// misplaced blocks show.
pub(crate) trait Pattern: Element {
    fn from_small(v: u8) -> Self;
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    /// The average of `sum`, a sum over `ranks` ranks, as `ReduceOp::Avg` documents it.
    fn average(sum: Self, ranks: usize) -> Self;
}

/// Element `i` of rank `rank`'s data, for reductions by `op`.
pub(crate) fn value<T: Pattern>(op: ReduceOp, rank: usize, i: usize) -> T {
    let v = (((rank * 7 + i) % 13) % 4 + 1) as u8;
    T::from_small(if op == ReduceOp::Prod { v % 2 + 1 } else { v })
}

macro_rules! pattern_int {
    ($($t:ty),*) => {$(
        impl Pattern for $t {
            fn from_small(v: u8) -> Self { v as $t }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::BitAnd => a & b,
                    ReduceOp::BitOr => a | b,
                    ReduceOp::BitXor => a ^ b,
                    _ => a.wrapping_add(b),
                }
            }
            fn average(sum: Self, ranks: usize) -> Self {
                <$t>::try_from(ranks).map_or(0, |n| sum / n)
            }
        }
    )*};
}
pattern_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! pattern_float {
    ($($t:ty => $from:expr, $avg:expr),*) => {$(
        impl Pattern for $t {
            fn from_small(v: u8) -> Self { let f: fn(f32) -> $t = $from; f(f32::from(v)) }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Max => if b > a { b } else { a },
                    ReduceOp::Min => if b < a { b } else { a },
                    ReduceOp::Prod => a * b,
                    _ => a + b,
                }
            }
            fn average(sum: Self, ranks: usize) -> Self {
                let avg: fn($t, usize) -> $t = $avg;
                avg(sum, ranks)
            }
        }
    )*};
}
pattern_float!(
    f32 => |x| x, |s, n| s / n as f32,
    f64 => f64::from, |s, n| s / n as f64,
    f16 => f16::from_f32, |s, n| f16::from_f32(s.to_f32() / n as f32),
    bf16 => bf16::from_f32, |s, n| bf16::from_f32(s.to_f32() / n as f32)
);

impl Pattern for bool {
    fn from_small(v: u8) -> Self {
        v == 1
    }
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
        match op {
            ReduceOp::Min | ReduceOp::Prod | ReduceOp::BitAnd => a && b,
            ReduceOp::BitXor => a != b,
            _ => a || b,
        }
    }
    fn average(sum: Self, _ranks: usize) -> Self {
        sum
    }
}

impl Pattern for Complex32 {
    fn from_small(v: u8) -> Self {
        Complex32::new(f32::from(v), -f32::from(v))
    }
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
        let key = |c: Complex32| (c.re, c.im);
        match op {
            ReduceOp::Max => {
                if key(b) > key(a) {
                    b
                } else {
                    a
                }
            }
            ReduceOp::Min => {
                if key(b) < key(a) {
                    b
                } else {
                    a
                }
            }
            ReduceOp::Prod => a * b,
            _ => a + b,
        }
    }
    fn average(sum: Self, ranks: usize) -> Self {
        sum / ranks as f32
    }
}

/// Element counts of one size: (input on each rank, output on each rank, bytes per the table).
/// Rooted operations give every rank the root's lengths; [`lengths`] trims them.
fn layout(op: BenchOp, n: usize, bytes: usize, elem: usize) -> (usize, usize, usize) {
    let whole = bytes / elem;
    let block = bytes / (n * elem);
    match op {
        BenchOp::AllReduce | BenchOp::SendRecv | BenchOp::Broadcast | BenchOp::Reduce => {
            (whole, whole, whole * elem)
        }
        BenchOp::AllGather | BenchOp::Gather => (block, block * n, block * n * elem),
        BenchOp::ReduceScatter | BenchOp::Scatter => (block * n, block, block * n * elem),
        BenchOp::AllToAll => (block * n, block * n, block * n * elem),
        // The input is one rank's block, at most all of it ([`lengths`] says which).
        BenchOp::AllGatherV => (block * n, block * n, block * n * elem),
        BenchOp::Barrier => (0, 0, 0),
    }
}

/// All-gather-v's blocks: `total` elements cut at random (from `seed`) into `n` blocks, some
/// of them empty (every fourth, on average) and some large.
pub(crate) fn uneven_counts(n: usize, total: usize, seed: u64) -> Vec<usize> {
    let weights: Vec<u64> = (0..n as u64)
        .map(|r| {
            let mut x = (seed ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(r + 1);
            x ^= x >> 29;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 32;
            if x.is_multiple_of(4) { 0 } else { x % 8 + 1 }
        })
        .collect();
    let sum: u64 = weights.iter().sum::<u64>().max(1);
    let mut counts: Vec<usize> = weights
        .iter()
        .map(|&w| (total as u128 * u128::from(w) / u128::from(sum)) as usize)
        .collect();
    // What rounding left over goes to the first non-empty block (or the first).
    let rest = total - counts.iter().sum::<usize>();
    let first = weights.iter().position(|&w| w > 0).unwrap_or(0);
    if let Some(c) = counts.get_mut(first) {
        *c += rest;
    }
    counts
}

/// What a rank passes to one operation: its own lengths of the layout (a non-root passes
/// empty buffers where the root alone has data).
struct Lengths {
    input: usize,
    output: usize,
    /// All-gather-v's blocks.
    counts: Vec<usize>,
}

fn lengths(args: &BenchArgs, rank: usize, n: usize, in_len: usize, out_len: usize) -> Lengths {
    let root = rank == args.root;
    let counts = match args.op {
        BenchOp::AllGatherV => uneven_counts(n, out_len, args.seed),
        _ => Vec::new(),
    };
    match args.op {
        BenchOp::Gather if !root => Lengths {
            input: in_len,
            output: 0,
            counts,
        },
        BenchOp::Scatter if !root => Lengths {
            input: 0,
            output: out_len,
            counts,
        },
        BenchOp::Reduce if !root => Lengths {
            input: in_len,
            output: 0,
            counts,
        },
        BenchOp::AllGatherV => Lengths {
            input: counts[rank],
            output: out_len,
            counts,
        },
        _ => Lengths {
            input: in_len,
            output: out_len,
            counts,
        },
    }
}

/// One operation of `args.op`, out of place (`in_place` only for all-reduce).
fn operate<T: Pattern>(
    g: &mut Group,
    args: &BenchArgs,
    input: &[T],
    output: &mut [T],
    counts: &[usize],
    in_place: bool,
) -> jaccl::Result<()> {
    let (rank, n, root) = (g.rank(), g.size(), args.root);
    match args.op {
        BenchOp::AllReduce if in_place => g.all_reduce_in_place(output, args.reduce),
        BenchOp::AllReduce => g.all_reduce(input, output, args.reduce),
        BenchOp::AllGather => g.all_gather(input, output),
        BenchOp::ReduceScatter => g.reduce_scatter(input, output, args.reduce),
        BenchOp::Broadcast => g.broadcast(output, root),
        BenchOp::Reduce => g.reduce(input, output, args.reduce, root),
        BenchOp::Gather => g.gather(input, output, root),
        BenchOp::Scatter => g.scatter(input, output, root),
        BenchOp::AllToAll => g.all_to_all(input, output),
        BenchOp::AllGatherV => g.all_gather_v(input, output, counts),
        BenchOp::SendRecv => {
            let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
            // Even ranks send first, odd ranks receive first: no cycle of blocked sends.
            if rank % 2 == 0 {
                g.send(input, right)?;
                g.recv(output, left)
            } else {
                g.recv(output, left)?;
                g.send(input, right)
            }
        }
        BenchOp::Barrier => g.barrier(),
    }
}

/// The expected output of rank `rank`, element by element (`None`: not checked, a non-root's
/// output of reduce).
fn expected<T: Pattern>(
    args: &BenchArgs,
    rank: usize,
    n: usize,
    lengths: &Lengths,
) -> Option<Vec<T>> {
    let (op, reduce, root) = (args.op, args.reduce, args.root);
    let out_len = lengths.output;
    let fold = |i: usize| {
        let all = (1..n).fold(value::<T>(reduce, 0, i), |acc, r| {
            T::combine(reduce, acc, value(reduce, r, i))
        });
        match reduce {
            ReduceOp::Avg => T::average(all, n),
            _ => all,
        }
    };
    let mine = |from: usize, i: usize| value::<T>(reduce, from, i);
    let block = out_len / n.max(1);
    Some(match op {
        BenchOp::AllReduce => (0..out_len).map(fold).collect(),
        BenchOp::Reduce if rank != root => return None,
        BenchOp::Reduce => (0..out_len).map(fold).collect(),
        BenchOp::ReduceScatter => (0..out_len).map(|i| fold(rank * out_len + i)).collect(),
        BenchOp::AllGather | BenchOp::Gather => (0..out_len)
            .map(|i| mine(i / block.max(1), i % block.max(1)))
            .collect(),
        BenchOp::AllGatherV => {
            let mut out = Vec::with_capacity(out_len);
            for (r, &c) in lengths.counts.iter().enumerate() {
                out.extend((0..c).map(|i| mine(r, i)));
            }
            out
        }
        BenchOp::Broadcast => (0..out_len).map(|i| mine(root, i)).collect(),
        BenchOp::Scatter => (0..out_len)
            .map(|i| mine(root, rank * out_len + i))
            .collect(),
        // Block s of the output is block `rank` of rank s's input.
        BenchOp::AllToAll => (0..out_len)
            .map(|i| mine(i / block.max(1), rank * block + i % block.max(1)))
            .collect(),
        BenchOp::SendRecv => (0..out_len).map(|i| mine((rank + n - 1) % n, i)).collect(),
        BenchOp::Barrier => Vec::new(),
    })
}

fn wrong<T: Pattern>(got: &[T], expect: &[T]) -> u64 {
    got.iter().zip(expect).filter(|(a, b)| a != b).count() as u64
}

/// Measures one size, out of place and (for all-reduce) in place.
fn measure<T: Pattern>(g: &mut Group, args: &BenchArgs, bytes: usize) -> jaccl::Result<Row> {
    let (rank, n) = (g.rank(), g.size());
    let (in_len, out_len, table_bytes) = layout(args.op, n, bytes, T::DTYPE.size());
    let lengths = lengths(args, rank, n, in_len, out_len);
    let fault = args.inject_fault && rank + 1 == n;
    let input: Vec<T> = (0..lengths.input)
        .map(|i| {
            let v: T = value(args.reduce, rank, i);
            if fault { T::from_small(5) } else { v }
        })
        .collect();
    let expect = expected::<T>(args, rank, n, &lengths);
    let mut output = vec![T::default(); lengths.output];
    let data = Data {
        input: &input,
        expect: expect.as_deref(),
        counts: &lengths.counts,
    };
    let out_of_place = time_loop(g, args, &data, &mut output, false)?;
    let in_place = match args.op {
        BenchOp::AllReduce => Some(time_loop(g, args, &data, &mut output, true)?),
        _ => None,
    };
    Ok(Row {
        bytes: table_bytes,
        count: if matches!(args.op, BenchOp::AllGather | BenchOp::Gather) {
            in_len
        } else {
            out_len
        },
        out_of_place,
        in_place,
    })
}

/// One rank's data of one size.
struct Data<'a, T> {
    input: &'a [T],
    /// `None`: the output is not checked.
    expect: Option<&'a [T]>,
    counts: &'a [usize],
}

/// Check, warm up, time, check again. Returns the agreed timing and wrong count.
fn time_loop<T: Pattern>(
    g: &mut Group,
    args: &BenchArgs,
    data: &Data<'_, T>,
    output: &mut [T],
    in_place: bool,
) -> jaccl::Result<Timing> {
    // In place, and for broadcast (in place by nature), the output starts as the input.
    let refills = in_place || args.op == BenchOp::Broadcast;
    let refill = |out: &mut [T]| {
        if refills {
            out.copy_from_slice(&data.input[..out.len()]);
        }
    };
    let wrong = |got: &[T]| data.expect.map_or(0, |expect| wrong(got, expect));
    let operate = |g: &mut Group, output: &mut [T]| {
        operate(g, args, data.input, output, data.counts, in_place)
    };
    let mut wrong_count = 0;
    refill(output);
    operate(g, output)?;
    wrong_count += wrong(output);

    // Warm-up (and, without --iters, calibration): agreed so all ranks loop equally often.
    let per_op = match args.warmup {
        Some(k) => {
            let t = Instant::now();
            for _ in 0..k {
                operate(g, output)?;
            }
            agree_max(g, t.elapsed().as_secs_f64() / k.max(1) as f64)?
        }
        None => {
            let mut round = 1usize;
            loop {
                let t = Instant::now();
                for _ in 0..round {
                    operate(g, output)?;
                }
                let took = agree_max(g, t.elapsed().as_secs_f64())?;
                if took >= 0.05 || round >= 1 << 16 {
                    break took / round as f64;
                }
                round *= 2;
            }
        }
    };
    let iters = match args.iters {
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        None => agree_max(g, (0.3 / per_op.max(1e-9)).ceil().clamp(5.0, 100_000.0))? as usize,
    };

    g.barrier()?;
    let spans_hosts = g.hosts().count() > 1;
    let before = match spans_hosts {
        true => Some(g.bytes_across_hosts()?),
        false => None,
    };
    let mut elapsed = Duration::ZERO;
    if args.check {
        for _ in 0..iters {
            refill(output);
            let t = Instant::now();
            operate(g, output)?;
            elapsed += t.elapsed();
            wrong_count += wrong(output);
        }
    } else {
        let t = Instant::now();
        for _ in 0..iters {
            operate(g, output)?;
        }
        elapsed = t.elapsed();
        // In place, the data was reduced again and again; out of place it must still be right
        // (a broadcast of the broadcast data is that data again).
        if !in_place {
            wrong_count += wrong(output);
        }
    }
    let across_hosts = match before {
        Some(before) => {
            let sent = g.bytes_across_hosts()?.sent.saturating_sub(before.sent);
            Some(agree_max(g, sent as f64 / iters.max(1) as f64)?)
        }
        None => None,
    };
    let time_us = agree_max(g, elapsed.as_secs_f64() * 1e6 / iters as f64)?;
    let mut total = [0u64];
    g.all_sum(&[wrong_count], &mut total)?;
    Ok(Timing {
        time_us,
        iters,
        wrong: total[0],
        across_hosts,
    })
}

/// The maximum of `x` over all ranks.
fn agree_max(g: &mut Group, x: f64) -> jaccl::Result<f64> {
    let mut out = [0f64];
    g.all_max(&[x], &mut out)?;
    Ok(out[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_sum_exactly_in_bf16_up_to_64_ranks() {
        let sum = |i: usize| {
            (1..64).fold(value::<bf16>(ReduceOp::Sum, 0, i), |acc, r| {
                bf16::combine(ReduceOp::Sum, acc, value(ReduceOp::Sum, r, i))
            })
        };
        for i in 0..13 {
            let exact: f64 = (0..64).map(|r| value::<f64>(ReduceOp::Sum, r, i)).sum();
            assert_eq!(sum(i).to_f64(), exact);
        }
    }

    #[test]
    fn uneven_counts_add_up_and_include_empty_blocks() {
        for n in 1..=16 {
            for seed in 0..20 {
                let counts = uneven_counts(n, 1000 * n, seed);
                assert_eq!(counts.len(), n);
                assert_eq!(counts.iter().sum::<usize>(), 1000 * n);
            }
        }
        assert!((0..20).any(|seed| uneven_counts(8, 8000, seed).contains(&0)));
    }

    #[test]
    fn layouts_follow_nccl_tests() {
        assert_eq!(layout(BenchOp::AllReduce, 4, 1000, 4), (250, 250, 1000));
        assert_eq!(layout(BenchOp::AllGather, 4, 1000, 4), (62, 248, 992));
        assert_eq!(layout(BenchOp::ReduceScatter, 4, 1000, 4), (248, 62, 992));
    }
}
