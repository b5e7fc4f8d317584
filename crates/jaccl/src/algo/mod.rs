//! Algorithms, written once over [`crate::transport::Link`].
//!
//! An algorithm turns a call into a [`plan::Plan`]: for each (direction, wire) lane, the
//! sequence of steps it sends and receives. The [`engine`] runs any plan over any links.
//!
//! - [`plan`]: the plan type; [`engine`]: runs plans over a group's channels; [`call`]: a
//!   call and its buffers as the algorithms see them; [`channel`]: one link to one peer and
//!   what it read ahead; [`waiting`]: how every algorithm waits (arm, poll, report blocked);
//! - [`geometry`]: which channel is which wire to which peer, and lanes; [`hosts`]: which
//!   ranks share a host;
//! - one file per family: [`ring`], [`mesh`] (one-step exchange), [`doubling`] (recursive
//!   doubling and halving), [`host_doubling`] (doubling within hosts, slices across), [`rabenseifner`] (halving then doubling), [`bruck`] (all-gather in ⌈log2 N⌉ rounds), [`p2p`] (send and receive), [`shared_memory`] (the direct
//!   collectives: every rank of the group on this host reads the others' memory), `any_source` (whose message a receive from any rank
//!   takes), [`tree`] (binomial trees: the rooted collectives in ⌈log2 N⌉ rounds);
//! - [`select`]: the one place that decides which algorithm runs for a call, by sizes measured
//!   here, or, for the all-reduce of a group given its link's figures, by the cost model
//!   ([`pricing`]: what each algorithm's plans cost the slowest rank; [`cost`]: what a rank's
//!   plans cost, rounds, bytes and reductions, the α–β–γ model of `crate::planner`);
//! - [`collectives`]: a group's collectives, run as [`select`] decides.

mod any_source;
pub(crate) mod bruck;
pub(crate) mod call;
pub(crate) mod channel;
pub(crate) mod collectives;
pub(crate) mod cost;
pub(crate) mod doubling;
pub(crate) mod engine;
#[cfg(test)]
mod fake;
pub(crate) mod geometry;
pub(crate) mod halving;
pub(crate) mod host_doubling;
pub(crate) mod hosts;
pub(crate) mod mesh;
pub(crate) mod p2p;
pub(crate) mod plan;
pub(crate) mod pricing;
pub(crate) mod rabenseifner;
pub(crate) mod ring;
pub(crate) mod select;
pub(crate) mod shared_memory;
#[cfg(test)]
mod simulate;
pub(crate) mod tree;
pub(crate) mod waiting;
