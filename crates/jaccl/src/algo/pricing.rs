//! What each algorithm of a collective costs a group, priced from the plans every rank would
//! run (`super::cost`), and the cheapest all-reduce for a link's figures ([`ByModel`]): the
//! choice of a group given `Config::link`, and of `jaccl plan`.
//!
//! The slowest rank sets a call's time: every rank's plans are priced where there are at most
//! 64, else those of one rank of each role ([`ranks_to_price`]).

use std::collections::HashMap;

use super::cost::{Rates, Tally};
use super::geometry::{DoublingRole, Geometry};
use super::plan::{Plan, Span};
use super::select::{AllReduce, Shape, SmallGather};
use super::{bruck, doubling, mesh, rabenseifner, ring};

/// An algorithm and its size, whose plans a rank's geometry gives.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Algorithm {
    /// Bytes per rank.
    Doubling(usize),
    /// Elements per rank, of `elem` bytes.
    Rabenseifner {
        count: usize,
        elem: usize,
    },
    /// Elements per rank, of `elem` bytes.
    RingAllReduce {
        count: usize,
        elem: usize,
    },
    /// Every rank's block to every rank (`how`), then, for an all-reduce, all of them reduced
    /// on every rank.
    Gather {
        block: usize,
        how: SmallGather,
        reduce: bool,
    },
    BruckAllGather(usize),
    RingAllGather(usize),
    /// Where the ranks pair up ([`Geometry::doubling_partners`]).
    DoublingAllGather(usize),
    BruckAllToAll(usize),
    /// After a header exchange with the ring neighbours if it `announces`
    /// ([`Shape::pairwise_announces`]).
    Pairwise {
        block: usize,
        announces: bool,
    },
}

impl Algorithm {
    /// What the slowest rank of a group laid out as `g` (any rank's geometry) does.
    pub(crate) fn slowest(self, g: &Geometry, rates: &Rates) -> Tally {
        ranks_to_price(g.size)
            .map(|rank| self.tally(&Geometry { rank, ..*g }))
            .max_by(|a, b| a.seconds(rates).total_cmp(&b.seconds(rates)))
            .unwrap_or_default()
    }

    /// What a rank in geometry `g` does, its plans one after another.
    fn tally(self, g: &Geometry) -> Tally {
        let one = |plan: Plan| Tally::of_plan(&plan, g.wires, false);
        match self {
            Algorithm::Doubling(bytes) => {
                let role = g.doubling_role();
                let plans = doubling::all_reduce_plans(g, &role, bytes);
                Tally::of_plans(&plans, g.wires, reducing_plans(&role, None))
            }
            Algorithm::Rabenseifner { count, elem } => {
                let role = g.doubling_role();
                let plans = rabenseifner::all_reduce_plans(g, &role, count, elem);
                let halving = match &role {
                    DoublingRole::Double { partners, .. } => partners.len(),
                    DoublingRole::HandOver { .. } => 0,
                };
                Tally::of_plans(&plans, g.wires, reducing_plans(&role, Some(halving)))
            }
            Algorithm::RingAllReduce { count, elem } => {
                one(ring::all_reduce(g, count, elem, false))
            }
            Algorithm::Gather { block, how, reduce } => {
                let reduced = match reduce {
                    true => (g.size - 1).saturating_mul(block),
                    false => 0,
                };
                one(ring::small_gather(g, how, block)).then(Tally {
                    reduced,
                    ..Tally::default()
                })
            }
            Algorithm::BruckAllGather(block) => {
                Tally::of_plans(&bruck::all_gather_plans(g, block), g.wires, 0)
            }
            Algorithm::RingAllGather(block) => one(ring::all_gather(g, block)),
            Algorithm::DoublingAllGather(block) => {
                let partners = g.doubling_partners().unwrap_or_default();
                let plans = doubling::all_gather_plans(g, block, &partners);
                Tally::of_plans(&plans, g.wires, 0)
            }
            Algorithm::BruckAllToAll(block) => {
                Tally::of_plans(&bruck::all_to_all_plans(g, block), g.wires, 0)
            }
            Algorithm::Pairwise { block, announces } => {
                let exchange = one(mesh::exchange(
                    g,
                    |p| Span::input(p * block, block),
                    |p| Span::output(p * block, block),
                ));
                match announces {
                    true => one(ring::neighbour_headers(g)).then(exchange),
                    false => exchange,
                }
            }
        }
    }
}

/// The ranks whose plans are priced: all of up to 64; else the first and last few and those
/// around the end of recursive doubling's hand-overs (`2·(n − p)`), one of each role.
fn ranks_to_price(n: usize) -> impl Iterator<Item = usize> {
    let mut ranks: Vec<usize> = if n <= 64 {
        (0..n).collect()
    } else {
        let p = 1 << n.ilog2();
        let paired = 2 * (n - p);
        [0, 1, 2, 3, n / 2, n - 2, n - 1]
            .into_iter()
            .chain(paired.saturating_sub(2)..paired + 2)
            .filter(|&r| r < n)
            .collect()
    };
    ranks.sort_unstable();
    ranks.dedup();
    ranks.into_iter()
}

/// How many of a doubling rank's first plans reduce what they receive: taking in its extra
/// rank's vector, then `steps` of them (`None`: all, recursive doubling; Rabenseifner's: the
/// halving ones). A rank that hands its vector over reduces nothing.
fn reducing_plans(role: &DoublingRole, steps: Option<usize>) -> usize {
    match (role, steps) {
        (DoublingRole::Double { extra, .. }, Some(steps)) => usize::from(extra.is_some()) + steps,
        (DoublingRole::Double { .. }, None) => usize::MAX,
        (DoublingRole::HandOver { .. }, _) => 0,
    }
}

/// The algorithm of an all-reduce `choice` of `count` elements of `elem` bytes per rank (the
/// direct ones, through shared memory, are not priced).
pub(crate) fn all_reduce_algorithm(
    choice: AllReduce,
    count: usize,
    elem: usize,
) -> Option<Algorithm> {
    let bytes = count * elem;
    match choice {
        AllReduce::Direct => None,
        AllReduce::Doubling => Some(Algorithm::Doubling(bytes)),
        AllReduce::Rabenseifner => Some(Algorithm::Rabenseifner { count, elem }),
        AllReduce::Ring => Some(Algorithm::RingAllReduce { count, elem }),
        AllReduce::Gather(how) => Some(Algorithm::Gather {
            block: bytes,
            how,
            reduce: true,
        }),
    }
}

/// The all-reduces the model chooses among for `count` elements of `elem` bytes per rank, in
/// the order that breaks ties: recursive doubling where the shape doubles, Rabenseifner's
/// among 3 or more ranks with an element for every rank, the ring, and the gather where every
/// rank's vector fits the gather's buffer ([`Shape::gathers`]) and recursive doubling does
/// not double. That last is the model corrected by measurement: doubling beat the both-ways
/// gather at every size from 5 ranks ([`Shape::doubles`]), where the model, which counts the
/// gather's hops and not its two messages per hop, prefers the gather (6 ranks up to 4 KiB).
fn all_reduce_candidates(shape: &Shape, count: usize, elem: usize) -> Vec<AllReduce> {
    let (n, bytes) = (shape.size, count * elem);
    let total = bytes.saturating_mul(n);
    let doubles = shape.doubles() && bytes > 0;
    [
        (AllReduce::Doubling, doubles),
        (AllReduce::Rabenseifner, n > 2 && count >= n),
        (AllReduce::Ring, bytes > 0),
        (
            AllReduce::Gather(shape.small_gather(total)),
            (shape.gathers(total) && !doubles) || bytes == 0,
        ),
    ]
    .into_iter()
    .filter_map(|(choice, candidate)| candidate.then_some(choice))
    .collect()
}

/// The all-reduce chosen by the cost model for a link's figures: the least predicted time
/// among [`all_reduce_candidates`], on the same figures and plans on every rank, so every rank
/// chooses alike. Where the model has nothing to weigh (every rank shares memory, RDMA rings,
/// the mesh's one step), the measured choice of [`Shape::all_reduce`] stands. Each size is
/// priced once (pricing builds the plans of several ranks: under half a millisecond among 1024
/// ranks, 13 ms among 16384).
#[derive(Debug)]
pub(crate) struct ByModel {
    rates: Rates,
    chosen: HashMap<(usize, usize), AllReduce>,
}

/// Sizes remembered per group before the memory starts again.
const REMEMBERED: usize = 1024;

impl ByModel {
    pub(crate) fn new(rates: Rates) -> ByModel {
        ByModel {
            rates,
            chosen: HashMap::new(),
        }
    }

    /// The all-reduce of `bytes` per rank in elements of `elem` bytes, for a group of `shape`
    /// laid out as `g`.
    pub(crate) fn all_reduce(
        &mut self,
        shape: &Shape,
        g: &Geometry,
        bytes: usize,
        elem: usize,
    ) -> AllReduce {
        let total = bytes.saturating_mul(shape.size);
        if shape.direct || shape.rdma || shape.in_one_step(total) || elem == 0 || bytes == 0 {
            return shape.all_reduce(bytes);
        }
        if let Some(&choice) = self.chosen.get(&(bytes, elem)) {
            return choice;
        }
        if self.chosen.len() >= REMEMBERED {
            self.chosen.clear();
        }
        let choice = cheapest(shape, g, bytes / elem, elem, &self.rates);
        self.chosen.insert((bytes, elem), choice);
        choice
    }
}

/// The candidate of least predicted time (the first of equals).
fn cheapest(shape: &Shape, g: &Geometry, count: usize, elem: usize, rates: &Rates) -> AllReduce {
    let priced = all_reduce_candidates(shape, count, elem)
        .into_iter()
        .filter_map(|choice| {
            let algorithm = all_reduce_algorithm(choice, count, elem)?;
            Some((choice, algorithm.slowest(g, rates).seconds(rates)))
        });
    let mut best: Option<(AllReduce, f64)> = None;
    for (choice, seconds) in priced {
        if best.is_none_or(|(_, least)| seconds < least) {
            best = Some((choice, seconds));
        }
    }
    best.map_or(AllReduce::Gather(shape.small_gather(0)), |(choice, _)| {
        choice
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LinkSpeed;

    fn rates(link: &str) -> Rates {
        Rates::of_link(&link.parse::<LinkSpeed>().unwrap(), 20e9)
    }

    #[test]
    fn every_rank_chooses_alike_and_shared_memory_keeps_its_choice() {
        for size in 2..=20 {
            for link in ["1Gb/s,50us", "100Gb/s,2us"] {
                let g = |rank| Geometry {
                    rank,
                    size,
                    wires: 1,
                    mesh: false,
                };
                let shape = g(0).shape(false, false);
                for bytes in [4, 400, 40_000, 4_000_000] {
                    let choices: Vec<AllReduce> = (0..size)
                        .map(|r| ByModel::new(rates(link)).all_reduce(&shape, &g(r), bytes, 4))
                        .collect();
                    assert!(choices.iter().all(|c| *c == choices[0]), "{size} {bytes}");
                }
                let direct = Shape {
                    direct: true,
                    ..shape
                };
                let mut model = ByModel::new(rates(link));
                assert_eq!(model.all_reduce(&direct, &g(0), 64, 4), AllReduce::Direct);
            }
        }
    }

    #[test]
    fn the_model_takes_doubling_small_and_rabenseifner_large_among_a_power_of_two() {
        let g = Geometry {
            rank: 5,
            size: 64,
            wires: 1,
            mesh: false,
        };
        let shape = g.shape(false, false);
        let mut model = ByModel::new(rates("100Gb/s,2us"));
        assert_eq!(model.all_reduce(&shape, &g, 8, 4), AllReduce::Doubling);
        assert_eq!(
            model.all_reduce(&shape, &g, 64 << 20, 4),
            AllReduce::Rabenseifner
        );
        // Remembered, not priced again: the same answer.
        assert_eq!(model.all_reduce(&shape, &g, 8, 4), AllReduce::Doubling);
        assert_eq!(model.chosen.len(), 2);
    }
}
