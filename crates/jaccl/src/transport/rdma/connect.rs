//! RDMA's part in a group's set-up, between ring neighbours ([`RdmaConnector`]).
//!
//! 1. Each rank that may use RDMA opens its devices (the device matrix's, else the first with
//!    an active port), checks that the locked-memory limit lets it register its links, and
//!    publishes, in the first exchange, whether it can, or why not ([`Availability`]).
//! 2. From everyone's availability every rank works out the same set of neighbour pairs that
//!    may use RDMA (`crate::connect`; `auto` leaves out pairs that share memory).
//! 3. If there is any, the ranks exchange endpoints (one per wire and wanted side), connect
//!    them, say hello over each, and exchange which hellos went through. A pair uses RDMA only
//!    where both sides saw theirs; `auto` falls back to TCP elsewhere, `rdma` fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::link::RdmaLink;
use super::{Endpoint, EndpointInfo, Nic, memlock_shortfall};
use crate::error::{Error, Result};
use crate::transport::Link;
use crate::transport::connector::{Connector, End, Opened, Request, exchange_json};

/// The longest the hellos of step 3 may take: a device that does not reach the peer shows as
/// silence.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a rank can use RDMA, as published in the first exchange.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Availability {
    /// Its transport is `tcp` or `shm`.
    Off,
    /// It cannot, and why.
    No(String),
    Yes,
}

/// The devices of this rank towards its ring neighbours, one per wire.
struct Devices {
    left: Vec<Arc<Nic>>,
    right: Vec<Arc<Nic>>,
}

/// The device to open for each wire: by name, or `None` for the first with an active port.
pub(crate) type DeviceNames = Vec<Option<String>>;

/// RDMA's part in a group's set-up: the devices this rank uses towards its ring neighbours.
pub(crate) struct RdmaConnector {
    availability: Availability,
    devices: Option<Devices>,
}

impl RdmaConnector {
    /// A connector for a rank that does not use RDMA (its transport is `tcp` or `shm`).
    pub(crate) fn off() -> RdmaConnector {
        RdmaConnector {
            availability: Availability::Off,
            devices: None,
        }
    }

    /// Opens the devices towards the left and right neighbour (`left[w]`, `right[w]` for wire
    /// w), loading libibverbs from `library`; a rank that cannot use RDMA says why.
    pub(crate) fn open_devices(
        library: Option<&str>,
        left: DeviceNames,
        right: DeviceNames,
    ) -> RdmaConnector {
        let mut opened: HashMap<Option<String>, Arc<Nic>> = HashMap::new();
        let mut open_side = |names: DeviceNames| -> std::result::Result<Vec<Arc<Nic>>, String> {
            names
                .into_iter()
                .map(|name| {
                    if let Some(nic) = opened.get(&name) {
                        return Ok(Arc::clone(nic));
                    }
                    let nic = Nic::open(library, name.as_deref())?;
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
            Ok((left, right)) => RdmaConnector {
                availability: Availability::Yes,
                devices: Some(Devices { left, right }),
            },
            Err(why) => {
                tracing::debug!(%why, "no RDMA");
                RdmaConnector {
                    availability: Availability::No(why),
                    devices: None,
                }
            }
        }
    }
}

impl Connector for RdmaConnector {
    fn publish(&self) -> Value {
        serde_json::to_value(&self.availability).unwrap_or(Value::Null)
    }

    fn unusable(&self, blob: &Value) -> Option<String> {
        match Availability::deserialize(blob) {
            Ok(Availability::Yes) => None,
            Ok(Availability::No(why)) => Some(why),
            Ok(Availability::Off) => Some("its transport is neither auto nor rdma".into()),
            Err(e) => Some(format!("unreadable RDMA availability ({e})")),
        }
    }

    fn open(&mut self, request: Request<'_>) -> Result<Opened> {
        let me = request.me;
        let wanted = |end: End| request.wants.iter().find(|w| w.end == end);
        let (left, right) = (wanted(End::Left), wanted(End::Right));
        let mut links = connect(
            request.exchange,
            (me.rank, me.size),
            self.devices.as_ref(),
            (left.is_some(), right.is_some()),
            request.required,
            request.deadline,
        )?;
        // The devices' last users are the links now.
        self.devices = None;
        let boxed = |links: Vec<RdmaLink>| {
            links
                .into_iter()
                .map(|l| Box::new(l) as Box<dyn Link>)
                .collect::<Vec<_>>()
        };
        Ok(request
            .wants
            .iter()
            .map(|want| {
                let side = match want.end {
                    End::Left => &mut links.left,
                    End::Right => &mut links.right,
                    End::Other => return None,
                };
                side.take().map(boxed)
            })
            .collect())
    }
}

/// A rank's endpoints towards its left and right neighbours (empty where it uses none), or
/// why it could not make them.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Offer {
    pub(super) left: std::result::Result<Vec<EndpointInfo>, String>,
    pub(super) right: std::result::Result<Vec<EndpointInfo>, String>,
}

/// Whether a rank's hellos went through, per side (`Err`: why not).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Outcome {
    left: std::result::Result<(), String>,
    right: std::result::Result<(), String>,
}

/// This rank's RDMA links: towards the left neighbour, then the right one, one per wire;
/// `None` where the pair does not use RDMA.
#[derive(Default)]
struct Links {
    left: Option<Vec<RdmaLink>>,
    right: Option<Vec<RdmaLink>>,
}

/// Step 3 of the module docs, for this rank's wanted sides `(left_pair, right_pair)`. Every
/// rank calls it.
///
/// # Errors
/// Exchange failures; with `required`, any pair that could not connect.
fn connect(
    exchange: &mut dyn crate::transport::connector::Exchange,
    (rank, size): (usize, usize),
    devices: Option<&Devices>,
    (left_pair, right_pair): (bool, bool),
    required: bool,
    deadline: Instant,
) -> Result<Links> {
    let left = (rank + size - 1) % size;
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
    let offers: Vec<Offer> = exchange_json(exchange, rank, &offer)?;

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
    let (mut left_links, mut right_links) = (Vec::new(), Vec::new());
    let mut outcome = Outcome {
        left: Ok(()),
        right: Ok(()),
    };
    if left_pair {
        match connect_side(mine_left, &offers[left].right, left) {
            Ok(l) => left_links = l,
            Err(why) => outcome.left = Err(why),
        }
    }
    if right_pair {
        match connect_side(mine_right, &offers[right].left, right) {
            Ok(l) => right_links = l,
            Err(why) => outcome.right = Err(why),
        }
    }
    let hello_by = deadline.min(Instant::now() + HELLO_TIMEOUT);
    for (links, result, peer) in [
        (&mut left_links, &mut outcome.left, left),
        (&mut right_links, &mut outcome.right, right),
    ] {
        if result.is_ok()
            && let Err(why) = await_hellos(links, hello_by)
        {
            *result = Err(format!("with rank {peer}: {why}"));
        }
    }
    let outcomes: Vec<Outcome> = exchange_json(exchange, rank, &outcome)?;

    // A pair uses RDMA where both of its sides succeeded (a side nobody wanted says Ok).
    let failure = |p: usize| -> Option<String> {
        let q = (p + 1) % size;
        let why = match (&outcomes[p].right, &outcomes[q].left) {
            (Err(why), _) => format!("rank {p}: {why}"),
            (_, Err(why)) => format!("rank {q}: {why}"),
            _ => return None,
        };
        Some(why)
    };
    for p in 0..size {
        if let Some(why) = failure(p) {
            let q = (p + 1) % size;
            if required {
                return Err(Error::Bootstrap(format!(
                    "rank {rank}: ranks {p} and {q} cannot connect over RDMA: {why}"
                )));
            }
            tracing::info!(rank, "ranks {p} and {q} use TCP, not RDMA: {why}");
        }
    }
    Ok(Links {
        left: (left_pair && failure(left).is_none()).then_some(left_links),
        right: (right_pair && failure(rank).is_none()).then_some(right_links),
    })
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
