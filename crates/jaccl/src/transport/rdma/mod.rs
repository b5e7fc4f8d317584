//! RDMA verbs (InfiniBand, RoCE, Thunderbolt): devices, the endpoints a rank offers its ring
//! neighbours, and connecting them into [`link::RdmaLink`]s.
//!
//! libibverbs is loaded when a group first asks for RDMA ([`verbs`]); without it, or without
//! an active port, RDMA is unavailable and the reason travels to every rank, so `auto` falls
//! back to TCP and a forced `rdma` fails everywhere with the same words.
//!
//! Set-up: before the ranks exchange their start-up data, each rank that may use RDMA creates
//! one queue pair per (neighbour, wire) with its two rings, and publishes an
//! [`EndpointInfo`] per queue pair: queue pair number, first packet sequence number (random),
//! LID, GID, MTU and where its incoming ring is. Then each pair of neighbours connects its
//! queue pairs and says hello over each; the ranks tell each other which hellos went through,
//! and a neighbour pair uses RDMA only where both saw them.
//!
//! GIDs are chosen by type and address, not by a fixed index: a RoCE v2 IPv4-mapped GID when
//! the port has one, else an IPv6 link-local one (Thunderbolt RDMA exposes only those), else
//! (InfiniBand) the port's LID. The path MTU is the smaller active MTU of the two ports.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::transport::shm::Mapping;

mod connect;
pub(crate) mod link;
mod verbs;

pub(crate) use connect::{DeviceNames, RdmaConnector};

use link::{PeerRing, RECEIVE_ID, RECEIVES, RING_BYTES, RdmaLink, SENDS};
use verbs::{Context, GidInfo, PortInfo, ProtectionDomain, QueuePair, Region, Verbs};

/// Memory each link registers: its incoming and its staging ring.
pub(crate) const BYTES_PER_LINK: usize = 2 * RING_BYTES;

/// Ports probed per device (devices with more are rare; the first active one is used).
const MAX_PORTS: u8 = 8;

/// An RDMA device as [`crate::probe::rdma`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaDevice {
    /// The device's name (`mlx5_0`, `rxe0`, `rdma_en5`).
    pub name: String,
    /// Its ports, from 1.
    pub ports: Vec<RdmaPort>,
}

/// A port of an [`RdmaDevice`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaPort {
    /// The port number, from 1.
    pub number: u8,
    /// `DOWN`, `INIT`, `ARMED`, `ACTIVE` or `ACTIVE_DEFER`.
    pub state: &'static str,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: &'static str,
    /// The active MTU in bytes.
    pub active_mtu: usize,
    /// The port's LID (InfiniBand; 0 on Ethernet).
    pub lid: u16,
    /// The valid entries of its GID table.
    pub gids: Vec<RdmaGid>,
    /// The GID index jaccl would use on this port, if any is usable.
    pub chosen_gid: Option<u32>,
}

/// A GID table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaGid {
    /// Its index in the table.
    pub index: u32,
    /// `IB`, `RoCE v1` or `RoCE v2`.
    pub kind: &'static str,
    /// The GID as an address (IPv4 for IPv4-mapped GIDs).
    pub address: IpAddr,
}

/// Lists the RDMA devices with their ports and GIDs, loading libibverbs from `library` (or
/// its usual name).
///
/// # Errors
/// Why RDMA is unavailable: no library, or it cannot list devices.
pub(crate) fn probe(library: Option<&str>) -> Result<Vec<RdmaDevice>, String> {
    let verbs = Verbs::load(library)?;
    let names = device_names(&verbs)?;
    let mut devices = Vec::new();
    for name in names {
        let Ok(Some(context)) = verbs.open(&name) else {
            devices.push(RdmaDevice {
                name,
                ports: Vec::new(),
            });
            continue;
        };
        let ports = (1..=MAX_PORTS)
            .map_while(|p| Some((p, context.port(p)?)))
            .map(|(number, info)| {
                let gids = context.gids(number, info.gid_table_len);
                RdmaPort {
                    number,
                    state: port_state(info.state),
                    link_layer: if ethernet(&info) {
                        "Ethernet"
                    } else {
                        "InfiniBand"
                    },
                    active_mtu: mtu_bytes(info.active_mtu),
                    lid: info.lid,
                    chosen_gid: choose_gid(&info, &gids).map(|g| g.index),
                    gids: gids
                        .iter()
                        .map(|g| RdmaGid {
                            index: g.index,
                            kind: gid_kind(g.kind),
                            address: address(&g.gid),
                        })
                        .collect(),
                }
            })
            .collect();
        devices.push(RdmaDevice { name, ports });
    }
    Ok(devices)
}

/// The devices' names; none where the kernel has no RDMA support at all.
fn device_names(verbs: &Verbs) -> Result<Vec<String>, String> {
    match verbs.device_names() {
        Ok(names) => Ok(names),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOSYS.raw_os_error()) => {
            Ok(Vec::new())
        }
        Err(e) => Err(format!("cannot list RDMA devices: {e}")),
    }
}

fn port_state(state: u32) -> &'static str {
    match state {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

fn gid_kind(kind: u32) -> &'static str {
    match kind {
        1 => "RoCE v1",
        2 => "RoCE v2",
        _ => "IB",
    }
}

/// `ibv_mtu` (1 = 256 ... 5 = 4096) in bytes.
fn mtu_bytes(mtu: u32) -> usize {
    128 << mtu.clamp(1, 5)
}

fn ethernet(port: &PortInfo) -> bool {
    port.link_layer == 2
}

fn address(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// The GID to use on `port`: on Ethernet (RoCE) a v2 IPv4-mapped one, else a v2 IPv6
/// link-local one, then the same of v1, then any; on InfiniBand the port GID (index 0), routed
/// by LID within the subnet.
fn choose_gid(port: &PortInfo, gids: &[GidInfo]) -> Option<GidInfo> {
    if !ethernet(port) {
        return gids.iter().find(|g| g.index == 0).copied();
    }
    let rank = |g: &GidInfo| {
        let v6 = Ipv6Addr::from(g.gid);
        let place = if v6.to_ipv4_mapped().is_some() {
            0
        } else if v6.is_unicast_link_local() {
            1
        } else {
            2
        };
        (u8::from(g.kind != 2), place, g.index)
    };
    gids.iter().min_by_key(|g| rank(g)).copied()
}

/// A device port opened for links, with the protection domain they share.
pub(crate) struct Nic {
    pd: Arc<ProtectionDomain>,
    context: Arc<Context>,
    port: u8,
    info: PortInfo,
    gid: GidInfo,
}

impl Nic {
    /// Opens `device` (else the first device with an active port) at its first active port
    /// with a usable GID, loading libibverbs from `library`.
    ///
    /// # Errors
    /// Why this rank cannot use RDMA: no library, no device (or not the one named), no
    /// active port.
    pub(crate) fn open(library: Option<&str>, device: Option<&str>) -> Result<Arc<Nic>, String> {
        let verbs = Verbs::load(library)?;
        let names = device_names(&verbs)?;
        if names.is_empty() {
            return Err("no RDMA device found".into());
        }
        let candidates: Vec<&String> = match device {
            Some(d) => match names.iter().find(|n| *n == d) {
                Some(n) => vec![n],
                None => {
                    return Err(format!(
                        "no RDMA device named {d} (found: {})",
                        names.join(", ")
                    ));
                }
            },
            None => names.iter().collect(),
        };
        let mut why_not = Vec::new();
        for name in candidates {
            let context = match verbs.open(name) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => {
                    why_not.push(format!("{name}: cannot open it ({e})"));
                    continue;
                }
            };
            for port in 1..=MAX_PORTS {
                let Some(info) = context.port(port) else {
                    break;
                };
                if !info.active() {
                    why_not.push(format!("{name} port {port}: {}", port_state(info.state)));
                    continue;
                }
                let gids = context.gids(port, info.gid_table_len);
                let Some(gid) = choose_gid(&info, &gids) else {
                    why_not.push(format!("{name} port {port}: no GID"));
                    continue;
                };
                if !ethernet(&info) && info.lid == 0 {
                    why_not.push(format!(
                        "{name} port {port}: no LID (is a subnet manager running?)"
                    ));
                    continue;
                }
                let pd = ProtectionDomain::new(&context)
                    .map_err(|e| format!("{name}: cannot allocate a protection domain: {e}"))?;
                return Ok(Arc::new(Nic {
                    pd,
                    context,
                    port,
                    info,
                    gid,
                }));
            }
        }
        Err(format!("no active RDMA port ({})", why_not.join("; ")))
    }

    fn name(&self) -> &str {
        self.context.name()
    }
}

/// What a peer needs to connect to one of this rank's endpoints (the per-transport blob of
/// the start-up exchange).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EndpointInfo {
    /// The device's name, for messages.
    device: String,
    qp: u32,
    psn: u32,
    lid: u16,
    /// The GID, in hex.
    gid: String,
    ethernet: bool,
    /// `ibv_mtu` value of the port's active MTU.
    mtu: u32,
    /// The incoming ring: address, key and length.
    ring: u64,
    rkey: u32,
    ring_bytes: usize,
}

impl EndpointInfo {
    /// Why two endpoints cannot be connected, if they cannot.
    pub(crate) fn mismatch(&self, other: &EndpointInfo) -> Option<String> {
        if self.ethernet != other.ethernet {
            return Some(format!(
                "{} is {} but {} is {}",
                self.device,
                layer(self.ethernet),
                other.device,
                layer(other.ethernet)
            ));
        }
        (self.ring_bytes != other.ring_bytes).then(|| {
            format!(
                "ring sizes differ ({} and {} bytes: another jaccl version?)",
                self.ring_bytes, other.ring_bytes
            )
        })
    }
}

fn layer(ethernet: bool) -> &'static str {
    if ethernet {
        "Ethernet (RoCE)"
    } else {
        "InfiniBand"
    }
}

/// A queue pair and its rings, not yet connected.
pub(crate) struct Endpoint {
    qp: QueuePair,
    nic: Arc<Nic>,
    psn: u32,
}

impl Endpoint {
    /// Creates a queue pair and registers its rings on `nic`.
    ///
    /// # Errors
    /// The device refused; a registration failure names the locked-memory limit, the usual
    /// cause.
    pub(crate) fn new(nic: &Arc<Nic>) -> Result<Endpoint, String> {
        let name = nic.name();
        let memory = |mirrored| {
            Mapping::private(RING_BYTES, mirrored)
                .map_err(|e| format!("cannot allocate {RING_BYTES} bytes: {e}"))
        };
        let register = |memory, remote| {
            Region::new(&nic.pd, memory, RING_BYTES, remote).map_err(|e| {
                format!(
                    "{name}: cannot register {} KiB of memory ({e}); the locked-memory limit \
                     is {} (`ulimit -l`), and jaccl registers {} KiB per wire and neighbour",
                    RING_BYTES / 1024,
                    memlock_limit(),
                    BYTES_PER_LINK / 1024
                )
            })
        };
        // The incoming ring is mirrored so its bytes are contiguous across its end for the
        // consumer; the device writes only the first copy (no write crosses the end).
        let incoming = register(memory(true)?, true)?;
        let outgoing = register(memory(false)?, false)?;
        let qp = QueuePair::new(&nic.pd, SENDS, RECEIVES, outgoing, incoming)
            .map_err(|e| format!("{name}: cannot create a queue pair: {e}"))?;
        let mut psn = [0u8; 4];
        getrandom::fill(&mut psn).map_err(|e| format!("no randomness: {e}"))?;
        Ok(Endpoint {
            qp,
            nic: Arc::clone(nic),
            psn: u32::from_le_bytes(psn) & 0x00ff_ffff,
        })
    }

    /// What the peer needs to connect.
    pub(crate) fn info(&self) -> EndpointInfo {
        EndpointInfo {
            device: self.nic.name().to_owned(),
            qp: self.qp.qp_num(),
            psn: self.psn,
            lid: self.nic.info.lid,
            gid: self
                .nic
                .gid
                .gid
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            ethernet: ethernet(&self.nic.info),
            mtu: self.nic.info.active_mtu,
            ring: self.qp.incoming().addr(),
            rkey: self.qp.incoming().rkey(),
            ring_bytes: RING_BYTES,
        }
    }

    /// Connects to the peer endpoint `remote`, posts the receives and says hello.
    ///
    /// # Errors
    /// The endpoints do not match, or the device refused the connection.
    pub(crate) fn connect(mut self, remote: &EndpointInfo) -> Result<RdmaLink, String> {
        let mine = self.info();
        if let Some(why) = mine.mismatch(remote) {
            return Err(why);
        }
        let gid = parse_gid(&remote.gid).ok_or("the peer published a malformed GID")?;
        let name = self.nic.name().to_owned();
        let fail = |what: &str, e: std::io::Error| format!("{name}: {what}: {e}");
        self.qp
            .init(self.nic.port)
            .map_err(|e| fail("queue pair", e))?;
        self.qp
            .post_receives(RECEIVES, RECEIVE_ID)
            .map_err(|e| fail("posting receives", e))?;
        let gid_index = u8::try_from(self.nic.gid.index).map_err(|_| {
            format!(
                "{name}: GID index {} is above 255, more than a connection can name; choose a \
                 port whose GID table puts the address lower",
                self.nic.gid.index
            )
        })?;
        let local = verbs::Local {
            port: self.nic.port,
            gid_index,
            mtu: self.nic.info.active_mtu.min(remote.mtu),
            psn: self.psn,
        };
        let global = mine.ethernet || self.nic.gid.gid[..8] != gid[..8];
        let remote_end = verbs::Remote {
            qp_num: remote.qp,
            psn: remote.psn,
            lid: remote.lid,
            gid,
            global,
        };
        self.qp
            .ready(local, remote_end)
            .map_err(|e| fail(&format!("connecting to {}", remote.device), e))?;
        let peer_ring = PeerRing {
            addr: remote.ring,
            rkey: remote.rkey,
        };
        let verbs = Arc::clone(self.nic.context.verbs());
        let mut link = RdmaLink::new(self.qp, verbs, peer_ring);
        link.greet()
            .map_err(|e| format!("{name}: saying hello: {e}"))?;
        Ok(link)
    }
}

/// Reads RDMA's start-up messages as a rank would (the fuzz target `startup`): endpoint
/// offers, checked against an endpoint of this rank's, and outcomes.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_offers(bytes: &[u8]) {
    let mine = EndpointInfo {
        device: "rxe0".into(),
        qp: 17,
        psn: 1,
        lid: 0,
        gid: "00000000000000000000ffff0a00020f".into(),
        ethernet: true,
        mtu: 3,
        ring: 1 << 20,
        rkey: 5,
        ring_bytes: RING_BYTES,
    };
    if let Ok(offers) = serde_json::from_slice::<Vec<connect::Offer>>(bytes) {
        for offer in &offers {
            for endpoints in [&offer.left, &offer.right].into_iter().flatten() {
                for theirs in endpoints {
                    let _ = mine.mismatch(theirs);
                    let _ = parse_gid(&theirs.gid);
                }
            }
        }
    }
    let _ = serde_json::from_slice::<Vec<connect::Outcome>>(bytes);
}

fn parse_gid(hex: &str) -> Option<[u8; 16]> {
    let mut gid = [0u8; 16];
    if hex.len() != 32 {
        return None;
    }
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(gid)
}

/// Why `links` links could not register their memory under this process's locked-memory
/// limit (`ulimit -l`), if they could not. `CAP_IPC_LOCK` (root has it) lifts the limit.
pub(crate) fn memlock_shortfall(links: usize) -> Option<String> {
    let needed = links.saturating_mul(BYTES_PER_LINK) as u64;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock).current?;
    let exempt = rustix::thread::capabilities(None).is_ok_and(|c| {
        c.effective
            .contains(rustix::thread::CapabilitySet::IPC_LOCK)
    });
    (limit < needed && !exempt).then(|| {
        format!(
            "the locked-memory limit (`ulimit -l`) is {} KiB and {links} RDMA link(s) register \
             {} KiB: raise it (`ulimit -l unlimited`, or `memlock` in \
             /etc/security/limits.conf)",
            limit / 1024,
            needed / 1024
        )
    })
}

/// The locked-memory limit, for messages.
fn memlock_limit() -> String {
    match rustix::process::getrlimit(rustix::process::Resource::Memlock).current {
        None => "unlimited".into(),
        Some(bytes) => format!("{} KiB", bytes / 1024),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(index: u32, text: &str, kind: u32) -> GidInfo {
        let v6 = match text.parse::<IpAddr>().unwrap() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        GidInfo {
            index,
            gid: v6.octets(),
            kind,
        }
    }

    fn port(link_layer: u8) -> PortInfo {
        PortInfo {
            state: 4,
            active_mtu: 3,
            lid: 7,
            link_layer,
            gid_table_len: 4,
        }
    }

    #[test]
    fn gids_are_chosen_by_type_and_address_not_index() {
        let ll_v2 = gid(0, "fe80::5054:ff:fe12:3456", 2);
        let v4_v1 = gid(1, "10.0.2.15", 1);
        let v4_v2 = gid(2, "10.0.2.15", 2);
        let site = gid(3, "fec0::5054:ff:fe12:3456", 2);
        let eth = port(2);
        assert_eq!(choose_gid(&eth, &[ll_v2, v4_v1, v4_v2, site]), Some(v4_v2));
        // Only link-local addresses (Thunderbolt; an interface without IPv4).
        assert_eq!(choose_gid(&eth, &[site, ll_v2]), Some(ll_v2));
        // RoCE v2 before v1: the two do not interoperate, and v2 is the routable, current one.
        assert_eq!(choose_gid(&eth, &[v4_v1, ll_v2]), Some(ll_v2));
        assert_eq!(choose_gid(&eth, &[site, v4_v1]), Some(site));
        assert_eq!(
            choose_gid(&eth, &[v4_v1, gid(4, "fe80::1", 1)]),
            Some(v4_v1)
        );
        assert_eq!(choose_gid(&eth, &[]), None);
        // InfiniBand: the port GID, whatever else the table holds.
        let ib = gid(0, "fe80::2:c903:0:1", 0);
        assert_eq!(choose_gid(&port(1), &[v4_v2, ib]), Some(ib));
    }

    #[test]
    fn gids_travel_as_hex() {
        let g = gid(0, "10.0.2.15", 2).gid;
        let hex: String = g.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_gid(&hex), Some(g));
        assert_eq!(parse_gid("zz"), None);
        assert_eq!(parse_gid(&"g".repeat(32)), None);
        assert_eq!(address(&g), "10.0.2.15".parse::<IpAddr>().unwrap());
        assert_eq!(mtu_bytes(3), 1024);
    }
}
