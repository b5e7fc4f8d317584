//! Start-up of RDMA between ring neighbours (the transport itself is `transport::rdma`).
//!
//! 1. Each rank that may use RDMA opens its devices (the device matrix's, else the first with
//!    an active port), checks that the locked-memory limit lets it register its links, and
//!    publishes, in the first exchange, whether it can, or why not ([`Availability`]).
//! 2. From everyone's availability every rank works out the same set of neighbour pairs that
//!    may use RDMA ([`candidates`]); `auto` leaves out pairs that share memory.
//! 3. If there is any, the ranks exchange endpoints (one per wire and candidate side), connect
//!    them, say hello over each, and exchange which hellos went through. A pair uses RDMA only
//!    where both sides saw theirs; `auto` falls back to TCP elsewhere, `rdma` fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bootstrap::SideChannel;
use crate::config::{Config, Transport};
use crate::error::{Error, Result};
use crate::transport::rdma::link::RdmaLink;
use crate::transport::rdma::{Endpoint, EndpointInfo, Nic, memlock_shortfall};

/// The longest the hellos of step 3 may take: a device that does not reach the peer shows as
/// silence.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a rank can use RDMA, as published in the first exchange.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum Availability {
    /// Its transport is `tcp` or `shm`.
    Off,
    /// It cannot, and why.
    No(String),
    Yes,
}

/// The devices of this rank towards its ring neighbours, one per wire.
pub(super) struct Devices {
    left: Vec<Arc<Nic>>,
    right: Vec<Arc<Nic>>,
}

/// Opens the devices this rank would use towards `left` and `right`.
pub(super) fn open_devices(
    config: &Config,
    (left, right): (usize, usize),
    wires: usize,
) -> (Availability, Option<Devices>) {
    if !matches!(config.transport, Transport::Auto | Transport::Rdma) {
        return (Availability::Off, None);
    }
    let mut opened: HashMap<Option<String>, Arc<Nic>> = HashMap::new();
    let mut open_side = |peer: usize| -> std::result::Result<Vec<Arc<Nic>>, String> {
        let names: Vec<Option<String>> = match &config.devices {
            Some(m) => m
                .devices(config.rank, peer)
                .iter()
                .map(|d| Some(d.clone()))
                .collect(),
            None => vec![None; wires],
        };
        names
            .into_iter()
            .map(|name| {
                if let Some(nic) = opened.get(&name) {
                    return Ok(Arc::clone(nic));
                }
                let nic = Nic::open(config.rdma_library.as_deref(), name.as_deref())?;
                opened.insert(name, Arc::clone(&nic));
                Ok(nic)
            })
            .collect()
    };
    let opened = open_side(left).and_then(|l| Ok((l, open_side(right)?)));
    let registrable =
        |(l, r): (Vec<Arc<Nic>>, Vec<Arc<Nic>>)| match memlock_shortfall(l.len() + r.len()) {
            Some(why) => Err(why),
            None => Ok((l, r)),
        };
    match opened.and_then(registrable) {
        Ok((left, right)) => (Availability::Yes, Some(Devices { left, right })),
        Err(why) => {
            tracing::debug!(rank = config.rank, %why, "no RDMA");
            (Availability::No(why), None)
        }
    }
}

/// For each ring pair `(p, p + 1)`, whether it may use RDMA: both ranks can, and (with `auto`)
/// they do not share memory.
///
/// # Errors
/// With `rdma`, a rank that cannot use it: every rank reports the same rank and reason.
pub(super) fn candidates(
    config: &Config,
    available: &[&Availability],
    shares_memory: impl Fn(usize, usize) -> bool,
) -> Result<Vec<bool>> {
    let size = available.len();
    if config.transport == Transport::Rdma
        && let Some((r, why)) = available.iter().enumerate().find_map(|(r, a)| match a {
            Availability::No(why) => Some((r, why)),
            _ => None,
        })
    {
        return Err(Error::Unsupported(format!(
            "rank {}: the rdma transport is unavailable on rank {r}: {why}",
            config.rank
        )));
    }
    Ok((0..size)
        .map(|p| {
            let q = (p + 1) % size;
            let both = matches!(available[p], Availability::Yes)
                && matches!(available[q], Availability::Yes);
            both && (config.transport == Transport::Rdma || !shares_memory(p, q))
        })
        .collect())
}

/// A rank's endpoints towards its left and right neighbours (empty where it uses none), or
/// why it could not make them.
#[derive(Debug, Serialize, Deserialize)]
struct Offer {
    left: std::result::Result<Vec<EndpointInfo>, String>,
    right: std::result::Result<Vec<EndpointInfo>, String>,
}

/// Whether a rank's hellos went through, per side (`Err`: why not).
#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    left: std::result::Result<(), String>,
    right: std::result::Result<(), String>,
}

/// This rank's RDMA links: towards the left neighbour, then the right one, one per wire, or
/// none where the pair does not use RDMA.
#[derive(Default)]
pub(super) struct Links {
    pub(super) left: Vec<RdmaLink>,
    pub(super) right: Vec<RdmaLink>,
}

/// Step 3 of the module docs, for the pairs of `candidates` (at least one). Every rank calls
/// it, with the same `candidates`.
///
/// # Errors
/// Side-channel failures; with `rdma`, any pair that could not connect.
pub(super) fn connect(
    side: &mut SideChannel,
    config: &Config,
    devices: Option<&Devices>,
    candidates: &[bool],
    deadline: Instant,
) -> Result<Links> {
    let (rank, size) = (config.rank, config.size);
    let left = (rank + size - 1) % size;
    // My left side is pair `left`, my right side pair `rank`.
    let (left_pair, right_pair) = (candidates[left], candidates[rank]);
    let make = |nics: Option<&Vec<Arc<Nic>>>,
                wanted: bool|
     -> std::result::Result<Vec<Endpoint>, String> {
        match (wanted, nics) {
            (false, _) => Ok(Vec::new()),
            (true, Some(nics)) => nics.iter().map(Endpoint::new).collect(),
            (true, None) => Err("no device".into()),
        }
    };
    let mine_left = make(devices.map(|d| &d.left), left_pair);
    let mine_right = make(devices.map(|d| &d.right), right_pair);
    let info = |e: &std::result::Result<Vec<Endpoint>, String>| match e {
        Ok(list) => Ok(list.iter().map(Endpoint::info).collect()),
        Err(why) => Err(why.clone()),
    };
    let offer = Offer {
        left: info(&mine_left),
        right: info(&mine_right),
    };
    let offers: Vec<Offer> = super::exchange(side, rank, &offer, deadline)?;

    // Connect each side to the neighbour's opposite side, then wait for the hellos.
    let connect_side = |mine: std::result::Result<Vec<Endpoint>, String>,
                        theirs: &std::result::Result<Vec<EndpointInfo>, String>,
                        peer: usize|
     -> std::result::Result<Vec<RdmaLink>, String> {
        let mine = mine?;
        let theirs = theirs
            .as_ref()
            .map_err(|why| format!("rank {peer} has no endpoint: {why}"))?;
        if theirs.len() != mine.len() {
            return Err(format!(
                "rank {peer} offers {} endpoint(s), this rank {}",
                theirs.len(),
                mine.len()
            ));
        }
        mine.into_iter()
            .zip(theirs)
            .map(|(e, remote)| e.connect(remote))
            .collect()
    };
    let right = (rank + 1) % size;
    let mut links = Links::default();
    let mut outcome = Outcome {
        left: Ok(()),
        right: Ok(()),
    };
    if left_pair {
        match connect_side(mine_left, &offers[left].right, left) {
            Ok(l) => links.left = l,
            Err(why) => outcome.left = Err(why),
        }
    }
    if right_pair {
        match connect_side(mine_right, &offers[right].left, right) {
            Ok(l) => links.right = l,
            Err(why) => outcome.right = Err(why),
        }
    }
    let hello_by = deadline.min(Instant::now() + HELLO_TIMEOUT);
    for (links, result, peer) in [
        (&mut links.left, &mut outcome.left, left),
        (&mut links.right, &mut outcome.right, right),
    ] {
        if result.is_ok()
            && let Err(why) = await_hellos(links, hello_by)
        {
            *result = Err(format!("with rank {peer}: {why}"));
        }
    }
    let outcomes: Vec<Outcome> = super::exchange(side, rank, &outcome, deadline)?;

    // A pair uses RDMA where both of its sides succeeded.
    let failure = |p: usize| -> Option<String> {
        let q = (p + 1) % size;
        let why = match (&outcomes[p].right, &outcomes[q].left) {
            (Err(why), _) => format!("rank {p}: {why}"),
            (_, Err(why)) => format!("rank {q}: {why}"),
            _ => return None,
        };
        Some(why)
    };
    for p in (0..size).filter(|&p| candidates[p]) {
        if let Some(why) = failure(p) {
            let q = (p + 1) % size;
            if config.transport == Transport::Rdma {
                return Err(Error::Bootstrap(format!(
                    "rank {rank}: ranks {p} and {q} cannot connect over RDMA: {why}"
                )));
            }
            tracing::info!(rank, "ranks {p} and {q} use TCP, not RDMA: {why}");
        }
    }
    if left_pair && failure(left).is_some() {
        links.left.clear();
    }
    if right_pair && failure(rank).is_some() {
        links.right.clear();
    }
    Ok(links)
}

/// Waits until every link heard its peer's hello and its own was acknowledged.
fn await_hellos(links: &mut [RdmaLink], by: Instant) -> std::result::Result<(), String> {
    let mut pending: Vec<&mut RdmaLink> = links.iter_mut().collect();
    while !pending.is_empty() {
        let mut still = Vec::with_capacity(pending.len());
        for link in pending {
            match link.greeted() {
                Ok(true) => {}
                Ok(false) => still.push(link),
                Err(e) => return Err(e.to_string()),
            }
        }
        pending = still;
        if !pending.is_empty() {
            if Instant::now() >= by {
                return Err(format!(
                    "no hello over RDMA within {HELLO_TIMEOUT:?} (does the device reach it?)"
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}
