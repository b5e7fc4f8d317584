//! Every collective once among all of a group's ranks, against references: for the tests at
//! many ranks (threads or processes).

use jaccl::{Group, ReduceOp};

/// Every collective of `g`, the rooted ones from each of `roots`, with counts that do not
/// divide evenly, against plain references; a float all-reduce compared bit for bit across
/// ranks. `None` when all is right, else what was wrong.
pub fn every_collective_once(g: &mut Group, roots: &[usize]) -> jaccl::Result<Option<String>> {
    let (n, r) = (g.size(), g.rank());
    // Rank s's k-th value, and the sum of everyone's.
    let value = |s: usize, k: usize| (s * 1000 + k) as u64;
    let total = |k: usize| (0..n).map(|s| value(s, k)).sum::<u64>();
    let mine = |len: usize| (0..len).map(|k| value(r, k)).collect::<Vec<u64>>();
    let mut wrong = Vec::new();

    let mut sum = vec![0u64; 37];
    g.all_sum(&mine(37), &mut sum)?;
    if sum.iter().enumerate().any(|(k, &v)| v != total(k)) {
        wrong.push("all_reduce".to_owned());
    }
    let mut all = vec![0u64; 3 * n];
    g.all_gather(&mine(3), &mut all)?;
    if all
        .chunks(3)
        .enumerate()
        .any(|(s, c)| c != [0, 1, 2].map(|k| value(s, k)))
    {
        wrong.push("all_gather".to_owned());
    }
    let mut part = [0u64; 2];
    g.reduce_scatter(&mine(2 * n), &mut part, ReduceOp::Sum)?;
    if part != [total(2 * r), total(2 * r + 1)] {
        wrong.push("reduce_scatter".to_owned());
    }
    for &root in roots {
        let mut data = if r == root { mine(5) } else { vec![0; 5] };
        g.broadcast(&mut data, root)?;
        if data != (0..5).map(|k| value(root, k)).collect::<Vec<_>>() {
            wrong.push(format!("broadcast from {root}"));
        }
        // Sums of 2^rank show a part missed or counted twice; the max, the last rank's.
        let mut sum = vec![0u64; if r == root { 1 } else { 0 }];
        g.reduce(&[1u64 << (r % 64)], &mut sum, ReduceOp::Sum, root)?;
        let powers: u64 = (0..n).map(|s| 1u64 << (s % 64)).fold(0, u64::wrapping_add);
        let mut max = vec![0u64; if r == root { 4 } else { 0 }];
        g.reduce(&mine(4), &mut max, ReduceOp::Max, root)?;
        if r == root
            && (sum != [powers] || max != (0..4).map(|k| value(n - 1, k)).collect::<Vec<_>>())
        {
            wrong.push(format!("reduce to {root}"));
        }
        let mut gathered = vec![0u64; if r == root { 2 * n } else { 0 }];
        g.gather(&mine(2), &mut gathered, root)?;
        let expect: Vec<u64> = (0..n).flat_map(|s| [value(s, 0), value(s, 1)]).collect();
        if r == root && gathered != expect {
            wrong.push(format!("gather to {root}"));
        }
        let mut block = [0u64; 1];
        let blocks = if r == root {
            (0..n).map(|d| value(root, d)).collect()
        } else {
            Vec::new()
        };
        g.scatter(&blocks, &mut block, root)?;
        if block != [value(root, r)] {
            wrong.push(format!("scatter from {root}"));
        }
    }
    // Blocks of uneven lengths, some empty.
    let counts: Vec<usize> = (0..n).map(|s| s % 3).collect();
    let mut all_v = vec![0u64; counts.iter().sum()];
    g.all_gather_v(&mine(counts[r]), &mut all_v, &counts)?;
    let expect: Vec<u64> = (0..n)
        .flat_map(|s| (0..counts[s]).map(move |k| value(s, k)))
        .collect();
    if all_v != expect {
        wrong.push("all_gather_v".to_owned());
    }
    let mut part_v = vec![0u64; counts[r]];
    let start: usize = counts[..r].iter().sum();
    g.reduce_scatter_v(
        &mine(counts.iter().sum()),
        &mut part_v,
        &counts,
        ReduceOp::Sum,
    )?;
    if part_v != (start..start + counts[r]).map(total).collect::<Vec<_>>() {
        wrong.push("reduce_scatter_v".to_owned());
    }
    // Rank s sends (s + d) % 3 elements to rank d.
    let pair = |s: usize, d: usize, j: usize| (s * 1_000_000 + d * 10 + j) as u64;
    let sends: Vec<usize> = (0..n).map(|d| (r + d) % 3).collect();
    let recvs: Vec<usize> = (0..n).map(|s| (s + r) % 3).collect();
    let input: Vec<u64> = (0..n)
        .flat_map(|d| (0..sends[d]).map(move |j| pair(r, d, j)))
        .collect();
    let mut output = vec![0u64; recvs.iter().sum()];
    g.all_to_all_v(&input, &sends, &mut output, &recvs)?;
    let expect: Vec<u64> = (0..n)
        .flat_map(|s| (0..recvs[s]).map(move |j| pair(s, r, j)))
        .collect();
    if output != expect {
        wrong.push("all_to_all_v".to_owned());
    }
    let mut received = vec![0u64; n];
    g.all_to_all(&mine(n), &mut received)?;
    if received.iter().enumerate().any(|(s, &v)| v != value(s, r)) {
        wrong.push("all_to_all".to_owned());
    }
    let floats: Vec<f32> = (0..1001)
        .map(|k| (r as f32 + 0.1) * (k as f32 + 0.37))
        .collect();
    let mut fsum = vec![0f32; floats.len()];
    g.all_sum(&floats, &mut fsum)?;
    let digest = fsum
        .iter()
        .fold(0u64, |h, v| h.rotate_left(7) ^ u64::from(v.to_bits()));
    let mut digests = vec![0u64; n];
    g.all_gather(&[digest], &mut digests)?;
    if digests.iter().any(|&d| d != digest) {
        wrong.push("float all_reduce differs across ranks".to_owned());
    }
    g.barrier()?;
    Ok((!wrong.is_empty()).then(|| wrong.join(", ")))
}
