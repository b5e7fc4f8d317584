//! Plans run in lockstep on every rank, step by step, without any network: checks the index
//! arithmetic of a plan; the engine's own harness (`super::fake`) and the multi-rank tests
//! check the real thing.

use super::geometry::Geometry;
use super::plan::{Buf, Merge, Plan};

/// A rank's (input, output).
type Buffers = (Vec<i64>, Vec<i64>);

/// Every rank's geometry in a group of `size`.
fn geometries(size: usize, wires: usize, mesh: bool) -> Vec<Geometry> {
    (0..size)
        .map(|rank| Geometry {
            rank,
            size,
            wires,
            mesh,
        })
        .collect()
}

/// An all-gather to check: each rank's (input, output) with only its own block of `block`
/// elements filled (`rank · 100 + index`), and the output every rank must end with.
pub(crate) fn all_gather_case(size: usize, block: usize) -> (impl Fn(usize) -> Buffers, Vec<i64>) {
    let value = |r: usize, i: usize| (r * 100 + i) as i64;
    let init = move |r: usize| {
        let mut out = vec![-1i64; size * block];
        for i in 0..block {
            out[r * block + i] = value(r, i);
        }
        (vec![], out)
    };
    let expect = (0..size)
        .flat_map(|r| (0..block).map(move |i| value(r, i)))
        .collect();
    (init, expect)
}

/// Simulates a plan's data movement on every rank (in lockstep, step by step) and returns each
/// rank's output. `init` gives each rank's (input, output); with `combine`, a reducing merge
/// adds the input at `own` to the received value (else the output's value).
pub(crate) fn simulate(
    size: usize,
    wires: usize,
    mesh: bool,
    plan_of: impl Fn(&Geometry) -> Plan,
    init: impl Fn(usize) -> Buffers,
    combine: bool,
) -> Vec<Vec<i64>> {
    let geos = geometries(size, wires, mesh);
    let plans: Vec<Plan> = geos.iter().map(&plan_of).collect();
    let mut state: Vec<Buffers> = (0..size).map(&init).collect();
    let steps = plans[0]
        .transfers
        .iter()
        .map(|t| t.steps.len())
        .max()
        .unwrap_or(0);
    for s in 0..steps {
        // Everything sent in step s, keyed by (receiver, receiver's channel).
        let mut inbox = std::collections::HashMap::new();
        for (r, plan) in plans.iter().enumerate() {
            for t in plan.transfers.iter().filter(|t| s < t.steps.len()) {
                let step = t.steps[s];
                // As in the engine, an in-place call (no input) reads its input spans from the output.
                let src = match step.send.buf {
                    Buf::Input if !state[r].0.is_empty() => &state[r].0,
                    _ => &state[r].1,
                };
                let data: Vec<i64> = src[step.send.off..step.send.off + step.send.len].to_vec();
                inbox.insert(geos[r].far_end(t.tx.unwrap()), data);
            }
        }
        for (r, plan) in plans.iter().enumerate() {
            for t in plan.transfers.iter().filter(|t| s < t.steps.len()) {
                let step = t.steps[s];
                let data = &inbox[&(r, t.rx.unwrap())];
                assert_eq!(data.len(), step.recv.len, "rank {r} step {s}");
                for (i, v) in data.iter().enumerate() {
                    let at = step.recv.off + i;
                    state[r].1[at] = match step.merge {
                        Merge::Copy => *v,
                        Merge::Reduce { own: Some(o) } if combine => state[r].0[o + i] + v,
                        Merge::Reduce { .. } => state[r].1[at] + v,
                    };
                }
            }
        }
    }
    state.into_iter().map(|(_, out)| out).collect()
}

/// Like [`simulate`], for plans whose ranks take different numbers of steps (chains, trees):
/// every channel is a stream of elements; a step sends all of its span once the step before
/// it in its lane has received all of its own (forwarding, by whole steps), and receives once
/// enough elements have arrived. Runs until nothing moves, and checks that every step ran.
pub(crate) fn simulate_by_rounds(
    size: usize,
    wires: usize,
    mesh: bool,
    plan_of: impl Fn(&Geometry) -> Plan,
    init: impl Fn(usize) -> Buffers,
) -> Vec<Vec<i64>> {
    use std::collections::{HashMap, VecDeque};
    let geos = geometries(size, wires, mesh);
    let plans: Vec<Plan> = geos.iter().map(&plan_of).collect();
    let mut state: Vec<Buffers> = (0..size).map(&init).collect();
    let mut streams: HashMap<(usize, usize), VecDeque<i64>> = HashMap::new();
    // Per rank and lane: the next step to send, and the next to receive.
    let mut at: Vec<Vec<(usize, usize)>> = plans
        .iter()
        .map(|p| vec![(0, 0); p.transfers.len()])
        .collect();
    loop {
        let mut moved = false;
        for (r, plan) in plans.iter().enumerate() {
            for (l, t) in plan.transfers.iter().enumerate() {
                let (send, recv) = at[r][l];
                let forwarded = t.rx.is_none() || send == 0 || recv >= send;
                if send < t.steps.len() && forwarded {
                    let step = t.steps[send];
                    if let Some(tx) = t.tx {
                        let src = match step.send.buf {
                            Buf::Input if !state[r].0.is_empty() => &state[r].0,
                            _ => &state[r].1,
                        };
                        let data = src[step.send.off..step.send.off + step.send.len].to_vec();
                        let far = geos[r].far_end(tx);
                        streams.entry(far).or_default().extend(data);
                    }
                    at[r][l].0 += 1;
                    moved = true;
                }
                let (send, recv) = at[r][l];
                if recv < t.steps.len() && (!t.merge_after_send || send > recv) {
                    let step = t.steps[recv];
                    let queue = streams.entry((r, t.rx.unwrap_or(usize::MAX))).or_default();
                    if t.rx.is_none() || step.recv.len == 0 || queue.len() >= step.recv.len {
                        let data: Vec<i64> =
                            queue.drain(..step.recv.len.min(queue.len())).collect();
                        for (i, v) in data.iter().enumerate() {
                            let at = step.recv.off + i;
                            state[r].1[at] = match step.merge {
                                Merge::Copy => *v,
                                Merge::Reduce { own: Some(o) } => state[r].0[o + i] + v,
                                Merge::Reduce { own: None } => state[r].1[at] + v,
                            };
                        }
                        at[r][l].1 += 1;
                        moved = true;
                    }
                }
            }
        }
        if !moved {
            break;
        }
    }
    for (r, plan) in plans.iter().enumerate() {
        for (l, t) in plan.transfers.iter().enumerate() {
            assert_eq!(
                at[r][l],
                (t.steps.len(), t.steps.len()),
                "rank {r} lane {l} stopped short"
            );
        }
    }
    for ((r, c), left) in &streams {
        assert!(
            left.is_empty(),
            "rank {r} channel {c}: {} elements never received",
            left.len()
        );
    }
    state.into_iter().map(|(_, out)| out).collect()
}
