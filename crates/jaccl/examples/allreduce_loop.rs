//! The all-reduce loop of benches/c_overhead.sh through the Rust API: `BYTES ITERS` (f32 sum,
//! out of place, after ITERS/10 warm-up calls); rank 0 prints the mean microseconds per call,
//! timed between two barriers. benches/c_allreduce_loop.c is the same loop through the C
//! interface. Run under `jaccl launch -n N`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Instant;

fn main() -> jaccl::Result<()> {
    let mut args = std::env::args().skip(1);
    let bytes: usize = args.next().and_then(|a| a.parse().ok()).expect("BYTES");
    let iters: usize = args.next().and_then(|a| a.parse().ok()).expect("ITERS");
    let mut group = jaccl::init()?;
    let input = vec![(group.rank() + 1) as f32; bytes / 4];
    let mut output = vec![0.0f32; input.len()];
    for _ in 0..iters / 10 + 1 {
        group.all_reduce(&input, &mut output, jaccl::ReduceOp::Sum)?;
    }
    group.barrier()?;
    let start = Instant::now();
    for _ in 0..iters {
        group.all_reduce(&input, &mut output, jaccl::ReduceOp::Sum)?;
    }
    group.barrier()?;
    let elapsed = start.elapsed();
    if group.rank() == 0 {
        println!(
            "us_per_call {:.3}",
            elapsed.as_secs_f64() / iters as f64 * 1e6
        );
    }
    Ok(())
}
