//! What each algorithm of a collective costs a group, priced from the plans every rank would
//! run (`super::cost`), and the cheapest all-reduce for a link's figures ([`ByModel`]): the
//! choice of a group given `Config::link`, and of `jaccl plan`.
//!
//! The slowest rank sets a call's time: every rank's plans are priced where there are at most
//! 64, else those of one rank of each role ([`ranks_to_price`]).

use std::collections::HashMap;

use super::cost::{Rates, Spread, Tally};
use super::geometry::{DoublingRole, Geometry};
use super::plan::{Plan, Span};
use super::select::{AllGather, AllReduce, Shape, SmallGather};
use super::{bruck, doubling, host_doubling, mesh, rabenseifner, ring};

/// An algorithm and its size, whose plans a rank's geometry gives.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Algorithm {
    /// Bytes per rank.
    Doubling(usize),
    /// Elements per rank, of `elem` bytes, among hosts of `per_host` ranks in blocks.
    DoublingOnHosts {
        count: usize,
        elem: usize,
        per_host: usize,
    },
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
    /// What the slowest rank of a group laid out as `g` (any rank's geometry), a rank per
    /// host, does.
    pub(crate) fn slowest(self, g: &Geometry, rates: &Rates) -> Tally {
        let spread = Spread::apart(g.size);
        ranks_to_price(g.size)
            .map(|rank| self.tally(&Geometry { rank, ..*g }, &spread))
            .max_by(|a, b| a.seconds(rates).total_cmp(&b.seconds(rates)))
            .unwrap_or_default()
    }

    /// What a rank in geometry `g` of a group spread as `spread` does, its plans one after
    /// another.
    pub(crate) fn tally(self, g: &Geometry, spread: &Spread) -> Tally {
        let one = |plan: Plan| Tally::of_plan(&plan, g, spread, false);
        let plans = |plans: &[Plan], reducing: usize| Tally::of_plans(plans, g, spread, reducing);
        match self {
            Algorithm::Doubling(bytes) => {
                let role = g.doubling_role();
                let all = doubling::all_reduce_plans(g, &role, bytes);
                plans(&all, reducing_plans(&role, None))
            }
            Algorithm::DoublingOnHosts {
                count,
                elem,
                per_host,
            } => {
                let all = host_doubling::all_reduce_plans(g, per_host, count, elem);
                // The steps within the host and across reduce; the gather does not.
                let reducing = g.size.trailing_zeros() as usize;
                plans(&all, reducing)
            }
            Algorithm::Rabenseifner { count, elem } => {
                let role = g.doubling_role();
                let all = rabenseifner::all_reduce_plans(g, &role, count, elem);
                let halving = match &role {
                    DoublingRole::Double { partners, .. } => partners.len(),
                    DoublingRole::HandOver { .. } => 0,
                };
                plans(&all, reducing_plans(&role, Some(halving)))
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
            Algorithm::BruckAllGather(block) => plans(&bruck::all_gather_plans(g, block), 0),
            Algorithm::RingAllGather(block) => one(ring::all_gather(g, block)),
            Algorithm::DoublingAllGather(block) => {
                let partners = g.doubling_partners().unwrap_or_default();
                plans(&doubling::all_gather_plans(g, block, &partners), 0)
            }
            Algorithm::BruckAllToAll(block) => plans(&bruck::all_to_all_plans(g, block), 0),
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
pub(crate) fn ranks_to_price(n: usize) -> impl Iterator<Item = usize> {
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
        AllReduce::DoublingOnHosts(per_host) => Some(Algorithm::DoublingOnHosts {
            count,
            elem,
            per_host,
        }),
        AllReduce::Rabenseifner => Some(Algorithm::Rabenseifner { count, elem }),
        AllReduce::Ring => Some(Algorithm::RingAllReduce { count, elem }),
        AllReduce::Gather(how) => Some(Algorithm::Gather {
            block: bytes,
            how,
            reduce: true,
        }),
    }
}

/// The algorithm of an all-gather `choice` of blocks of `block` bytes (the direct one,
/// through shared memory, is not priced).
pub(crate) fn all_gather_algorithm(choice: AllGather, block: usize) -> Option<Algorithm> {
    match choice {
        AllGather::Direct => None,
        AllGather::Bruck => Some(Algorithm::BruckAllGather(block)),
        AllGather::Ring => Some(Algorithm::RingAllGather(block)),
        AllGather::Doubling => Some(Algorithm::DoublingAllGather(block)),
        AllGather::Small(how) => Some(Algorithm::Gather {
            block,
            how,
            reduce: false,
        }),
    }
}

/// The all-reduces the model chooses among for `count` elements of `elem` bytes per rank, in
/// the order that breaks ties: recursive doubling where the shape doubles, Rabenseifner's
/// among 3 or more ranks with an element for every rank, the ring, and the gather where every
/// rank's vector fits the gather's buffer ([`Shape::gathers`]) and recursive doubling does
/// not double (3 ranks). That last is the model corrected by measurement: doubling beat the
/// both-ways gather at every size from 5 ranks ([`Shape::doubles`]), where the model, which
/// counts the gather's hops and not its two messages per hop, prefers the gather (6 ranks up
/// to 4 KiB). Each with whether it is one.
fn all_reduce_candidates(shape: &Shape, count: usize, elem: usize) -> [(AllReduce, bool); 4] {
    let (n, bytes) = (shape.size, count * elem);
    let total = bytes.saturating_mul(n);
    let doubles = shape.doubles();
    [
        (AllReduce::Doubling, doubles),
        (AllReduce::Rabenseifner, n > 2 && count >= n),
        (AllReduce::Ring, true),
        (
            AllReduce::Gather(shape.small_gather(total)),
            shape.gathers(total) && !doubles,
        ),
    ]
}

/// The all-reduce chosen by the cost model for a link's figures: the least predicted time
/// among [`all_reduce_candidates`], on the same figures and plans on every rank, so every rank
/// chooses alike. Where the model has nothing to weigh (every rank shares memory, RDMA rings,
/// the mesh's one step, no data), the measured choice of [`Shape::all_reduce`] stands.
///
/// Sizes are priced by class, an eighth of an octave (the four leading bits of the size), at
/// the smallest size of the class, each class once per group: pricing builds the plans of
/// several ranks (0.5–0.8 ms among 64 to 1024 ranks over one wire, 17 ms among 16384; with
/// four wires 1.3, 3.8 and 78 ms), and the classes are few (8 per octave and element size).
#[derive(Debug)]
pub(crate) struct ByModel {
    rates: Rates,
    /// By size class, element size and which candidates the size allows.
    chosen: HashMap<(usize, usize, [bool; 4]), AllReduce>,
}

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
        if shape.direct || shape.rdma || shape.in_one_step(total) || bytes < elem.max(1) {
            return shape.all_reduce(bytes);
        }
        let candidates = all_reduce_candidates(shape, bytes / elem, elem);
        let class = size_class(bytes).max(elem);
        let key = (class, elem, candidates.map(|(_, allowed)| allowed));
        if let Some(&choice) = self.chosen.get(&key) {
            return choice;
        }
        let priced = candidates
            .into_iter()
            .filter(|&(_, allowed)| allowed)
            .filter_map(|(choice, _)| {
                let algorithm = all_reduce_algorithm(choice, class / elem, elem)?;
                Some((
                    choice,
                    algorithm.slowest(g, &self.rates).seconds(&self.rates),
                ))
            });
        // The least time, the first of equals (the ring is always a candidate).
        let mut best = (AllReduce::Ring, f64::INFINITY);
        for (choice, seconds) in priced {
            if seconds < best.1 {
                best = (choice, seconds);
            }
        }
        // On hosts in blocks, doubling within hosts sends the message across once, not once
        // per rank of a host, for rounds within hosts that these rates do not tell apart:
        // where bytes count, that way (`Shape::doubling`).
        let choice = match best.0 {
            AllReduce::Doubling => shape.doubling(class),
            choice => choice,
        };
        self.chosen.insert(key, choice);
        choice
    }
}

/// The smallest size with the same four leading bits as `bytes`.
fn size_class(bytes: usize) -> usize {
    let shift = bytes.checked_ilog2().unwrap_or(0).saturating_sub(3);
    bytes >> shift << shift
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LinkSpeed;

    fn rates(link: &str) -> Rates {
        Rates::of_link(&link.parse::<LinkSpeed>().unwrap(), 20e9)
    }

    #[test]
    fn shared_memory_rdma_and_empty_calls_keep_the_measured_choice() {
        let g = Geometry {
            rank: 0,
            size: 6,
            wires: 1,
            mesh: false,
        };
        let shape = g.shape(false, false);
        let mut model = ByModel::new(rates("1Gb/s,50us"));
        for other in [
            Shape {
                direct: true,
                ..shape
            },
            Shape {
                rdma: true,
                ..shape
            },
        ] {
            for bytes in [8, 1 << 20] {
                let measured = other.all_reduce(bytes);
                assert_eq!(model.all_reduce(&other, &g, bytes, 4), measured);
            }
        }
        assert_eq!(model.all_reduce(&shape, &g, 0, 4), shape.all_reduce(0));
        assert!(model.chosen.is_empty());
    }

    #[test]
    fn sizes_are_priced_by_eighths_of_an_octave() {
        assert_eq!(size_class(7), 7);
        assert_eq!(size_class(15), 15);
        assert_eq!(size_class(16), 16);
        assert_eq!(size_class(17), 16);
        assert_eq!(size_class(19), 18);
        assert_eq!(size_class((1 << 20) + 12345), 1 << 20);
        assert_eq!(size_class(usize::MAX), 0b1111 << (usize::BITS - 4));
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

    #[test]
    fn on_hosts_in_blocks_the_models_doubling_goes_within_hosts_from_2_kib() {
        let g = Geometry {
            rank: 3,
            size: 8,
            wires: 1,
            mesh: false,
        };
        let shape = Shape {
            on_hosts: true,
            host_blocks: Some(4),
            ..g.shape(false, false)
        };
        let mut model = ByModel::new(rates("100Gb/s,2us"));
        assert_eq!(model.all_reduce(&shape, &g, 2047, 1), AllReduce::Doubling);
        assert_eq!(
            model.all_reduce(&shape, &g, 2048, 1),
            AllReduce::DoublingOnHosts(4)
        );
    }
}
