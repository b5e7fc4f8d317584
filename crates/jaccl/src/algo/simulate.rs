//! Plans run in lockstep on every rank, step by step, without any network: checks the index
//! arithmetic of a plan; the engine's own harness (`super::fake`) and the multi-rank tests
//! check the real thing.

use super::geometry::Geometry;
use super::plan::{Buf, Merge, Plan};

/// Simulates a plan's data movement on every rank (in lockstep, step by step) and returns each
/// rank's output. `init` gives each rank's (input, output); with `combine`, a reducing merge
/// adds the input at `own` to the received value (else the output's value).
pub(crate) fn simulate(
    size: usize,
    wires: usize,
    mesh: bool,
    plan_of: impl Fn(&Geometry) -> Plan,
    init: impl Fn(usize) -> (Vec<i64>, Vec<i64>),
    combine: bool,
) -> Vec<Vec<i64>> {
    let geos: Vec<Geometry> = (0..size)
        .map(|rank| Geometry {
            rank,
            size,
            wires,
            mesh,
        })
        .collect();
    let plans: Vec<Plan> = geos.iter().map(&plan_of).collect();
    let mut state: Vec<(Vec<i64>, Vec<i64>)> = (0..size).map(&init).collect();
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
