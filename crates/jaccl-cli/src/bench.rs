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
    let per_rank = match args.op {
        BenchOp::AllGather | BenchOp::ReduceScatter => ranks,
        _ => 1,
    };
    args.min_bytes
        .unwrap_or_else(|| (per_rank * args.dtype.size()).max(8))
}

/// The sizes of the sweep on `ranks` ranks: the smallest, × f, ... up to `-e`.
pub(crate) fn sizes(args: &BenchArgs, ranks: usize) -> Vec<usize> {
    if args.op == BenchOp::Barrier {
        return vec![0];
    }
    let mut v = Vec::new();
    let mut s = min_bytes(args, ranks);
    while s <= args.max_bytes {
        v.push(s);
        match s.checked_mul(args.factor as usize) {
            Some(next) if next > s => s = next,
            _ => break,
        }
    }
    v
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
    if args.op == BenchOp::Barrier {
        return Ok(());
    }
    let elem = args.dtype.size();
    let smallest = sizes[0];
    let (input, output, _) = layout(args.op, ranks, smallest, elem);
    if input.min(output) == 0 {
        let needed = match args.op {
            BenchOp::AllGather | BenchOp::ReduceScatter => ranks * elem,
            _ => elem,
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
    let mut g = jaccl::init_with(config).map_err(|e| e.to_string())?;
    if args.op == BenchOp::SendRecv && g.size() < 2 {
        return Err("send-recv needs at least 2 ranks".into());
    }
    check_sweep(args, g.size())?;
    let leader = g.rank() == 0;
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
    };
    let mut out = report::Report::new(&setup, &g, sizes.len(), leader)?;
    let mut all_ok = true;
    for bytes in sizes {
        let row = measure_dtype(&mut g, args, bytes).map_err(|e| e.to_string())?;
        all_ok &= row.wrong() == 0;
        out.row(row)?;
    }
    out.finish()?;
    Ok(all_ok)
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

/// Elements whose reductions are exact in every dtype (values 1 to 4, so sums of up to 64
/// ranks stay exact even in bf16), with a period of 13 so misplaced blocks show.
pub(crate) trait Pattern: Element {
    fn from_small(v: u8) -> Self;
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
}

pub(crate) fn small(rank: usize, i: usize) -> u8 {
    (((rank * 7 + i) % 13) % 4 + 1) as u8
}

macro_rules! pattern_int {
    ($($t:ty),*) => {$(
        impl Pattern for $t {
            fn from_small(v: u8) -> Self { v as $t }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op { ReduceOp::Sum => a.wrapping_add(b), ReduceOp::Max => a.max(b), ReduceOp::Min => a.min(b) }
            }
        }
    )*};
}
pattern_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! pattern_float {
    ($($t:ty => $from:expr),*) => {$(
        impl Pattern for $t {
            fn from_small(v: u8) -> Self { let f: fn(f32) -> $t = $from; f(f32::from(v)) }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Max => if b > a { b } else { a },
                    ReduceOp::Min => if b < a { b } else { a },
                }
            }
        }
    )*};
}
pattern_float!(f32 => |x| x, f64 => f64::from, f16 => f16::from_f32, bf16 => bf16::from_f32);

impl Pattern for bool {
    fn from_small(v: u8) -> Self {
        v == 1
    }
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
        if op == ReduceOp::Min { a && b } else { a || b }
    }
}

impl Pattern for Complex32 {
    fn from_small(v: u8) -> Self {
        Complex32::new(f32::from(v), -f32::from(v))
    }
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
        let key = |c: Complex32| (c.re, c.im);
        match op {
            ReduceOp::Sum => a + b,
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
        }
    }
}

/// Element counts of one size: (input on each rank, output on each rank, bytes per the table).
fn layout(op: BenchOp, n: usize, bytes: usize, elem: usize) -> (usize, usize, usize) {
    match op {
        BenchOp::AllReduce | BenchOp::SendRecv => {
            let c = bytes / elem;
            (c, c, c * elem)
        }
        BenchOp::AllGather => {
            let c = bytes / (n * elem);
            (c, c * n, c * n * elem)
        }
        BenchOp::ReduceScatter => {
            let c = bytes / (n * elem);
            (c * n, c, c * n * elem)
        }
        BenchOp::Barrier => (0, 0, 0),
    }
}

/// One operation of `args.op`, out of place (`in_place` only for all-reduce).
fn operate<T: Pattern>(
    g: &mut Group,
    args: &BenchArgs,
    input: &[T],
    output: &mut [T],
    in_place: bool,
) -> jaccl::Result<()> {
    let (rank, n) = (g.rank(), g.size());
    match args.op {
        BenchOp::AllReduce if in_place => g.all_reduce_in_place(output, args.reduce),
        BenchOp::AllReduce => g.all_reduce(input, output, args.reduce),
        BenchOp::AllGather => g.all_gather(input, output),
        BenchOp::ReduceScatter => g.reduce_scatter(input, output, args.reduce),
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

/// The expected output, element by element.
fn expected<T: Pattern>(
    op: BenchOp,
    reduce: ReduceOp,
    rank: usize,
    n: usize,
    out_len: usize,
) -> Vec<T> {
    let fold = |i: usize| {
        (1..n).fold(T::from_small(small(0, i)), |acc, r| {
            T::combine(reduce, acc, T::from_small(small(r, i)))
        })
    };
    match op {
        BenchOp::AllReduce => (0..out_len).map(fold).collect(),
        BenchOp::ReduceScatter => (0..out_len).map(|i| fold(rank * out_len + i)).collect(),
        BenchOp::AllGather => {
            let block = out_len / n.max(1);
            (0..out_len)
                .map(|i| T::from_small(small(i / block.max(1), i % block.max(1))))
                .collect()
        }
        BenchOp::SendRecv => (0..out_len)
            .map(|i| T::from_small(small((rank + n - 1) % n, i)))
            .collect(),
        BenchOp::Barrier => Vec::new(),
    }
}

fn wrong<T: Pattern>(got: &[T], expect: &[T]) -> u64 {
    got.iter().zip(expect).filter(|(a, b)| a != b).count() as u64
}

/// Measures one size, out of place and (for all-reduce) in place.
fn measure<T: Pattern>(g: &mut Group, args: &BenchArgs, bytes: usize) -> jaccl::Result<Row> {
    let (rank, n) = (g.rank(), g.size());
    let (in_len, out_len, table_bytes) = layout(args.op, n, bytes, T::DTYPE.size());
    let fault = args.inject_fault && rank + 1 == n;
    let input: Vec<T> = (0..in_len)
        .map(|i| T::from_small(small(rank, i) + u8::from(fault)))
        .collect();
    let expect = expected::<T>(args.op, args.reduce, rank, n, out_len);
    let mut output = vec![T::default(); out_len];

    let out_of_place = time_loop(g, args, &input, &mut output, &expect, false)?;
    let in_place = if args.op == BenchOp::AllReduce {
        Some(time_loop(g, args, &input, &mut output, &expect, true)?)
    } else {
        None
    };
    Ok(Row {
        bytes: table_bytes,
        count: if args.op == BenchOp::AllGather {
            in_len
        } else {
            out_len
        },
        out_of_place,
        in_place,
    })
}

/// Check, warm up, time, check again. Returns the agreed timing and wrong count.
fn time_loop<T: Pattern>(
    g: &mut Group,
    args: &BenchArgs,
    input: &[T],
    output: &mut [T],
    expect: &[T],
    in_place: bool,
) -> jaccl::Result<Timing> {
    let refill = |out: &mut [T]| {
        if in_place {
            out.copy_from_slice(input);
        }
    };
    let mut wrong_count = 0;
    refill(output);
    operate(g, args, input, output, in_place)?;
    wrong_count += wrong(output, expect);

    // Warm-up (and, without --iters, calibration): agreed so all ranks loop equally often.
    let per_op = match args.warmup {
        Some(k) => {
            let t = Instant::now();
            for _ in 0..k {
                operate(g, args, input, output, in_place)?;
            }
            agree_max(g, t.elapsed().as_secs_f64() / k.max(1) as f64)?
        }
        None => {
            let mut round = 1usize;
            loop {
                let t = Instant::now();
                for _ in 0..round {
                    operate(g, args, input, output, in_place)?;
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
    let mut elapsed = Duration::ZERO;
    if args.check {
        for _ in 0..iters {
            refill(output);
            let t = Instant::now();
            operate(g, args, input, output, in_place)?;
            elapsed += t.elapsed();
            wrong_count += wrong(output, expect);
        }
    } else {
        let t = Instant::now();
        for _ in 0..iters {
            operate(g, args, input, output, in_place)?;
        }
        elapsed = t.elapsed();
        // In place, the data was reduced again and again; out of place it must still be right.
        if !in_place {
            wrong_count += wrong(output, expect);
        }
    }
    let time_us = agree_max(g, elapsed.as_secs_f64() * 1e6 / iters as f64)?;
    let mut total = [0u64];
    g.all_sum(&[wrong_count], &mut total)?;
    Ok(Timing {
        time_us,
        iters,
        wrong: total[0],
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
        let got = expected::<bf16>(BenchOp::AllReduce, ReduceOp::Sum, 0, 64, 13);
        let exact = expected::<f64>(BenchOp::AllReduce, ReduceOp::Sum, 0, 64, 13);
        for (a, b) in got.iter().zip(&exact) {
            assert_eq!(a.to_f64(), *b);
        }
    }

    #[test]
    fn layouts_follow_nccl_tests() {
        assert_eq!(layout(BenchOp::AllReduce, 4, 1000, 4), (250, 250, 1000));
        assert_eq!(layout(BenchOp::AllGather, 4, 1000, 4), (62, 248, 992));
        assert_eq!(layout(BenchOp::ReduceScatter, 4, 1000, 4), (248, 62, 992));
    }
}
