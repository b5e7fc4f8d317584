#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use common::*;

#[test]
fn four_ranks_sum() {
    let out = with_group(4, 1, |g| {
        let input = vec![g.rank() as f32 + 1.0; 100_000];
        let mut out = vec![0f32; input.len()];
        g.all_sum(&input, &mut out).unwrap();
        out
    });
    for o in out {
        assert!(o.iter().all(|&x| x == 10.0));
    }
}
