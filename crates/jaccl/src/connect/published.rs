//! What ranks publish at start-up and what rank 0 makes of it. Each rank sends rank 0 its
//! [`PeerInfo`] (JSON); rank 0 alone reads them all, checks that the ranks agree, and sends
//! every rank one compact [`Table`]: the distinct hosts and each rank's among them, and for
//! each transport the distinct blobs and each rank's among them. A member's work on the table
//! is a 4-byte index per rank per transport, and JSON only for the distinct blobs it reads: its
//! own host's ranks and the peers it connects to. (Every member reading every rank's JSON
//! made start-up grow as N², in CPU and in the bytes rank 0 sent.)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Transport;
use crate::op_header::{Reader, to_u32};
use crate::transport::connector::{Blobs, Published};

/// What each rank publishes at start-up.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct PeerInfo {
    /// Ranks with the same host may share memory (`crate::transport::shm::host_identity`).
    pub(super) host: String,
    pub(super) wires: usize,
    pub(super) transport: String,
    pub(super) topology: String,
    /// `Config::link`, exactly (whole bytes per second and nanoseconds).
    pub(super) link: Option<String>,
    /// `Config::liveness`, in nanoseconds (`u64::MAX`: off): a rank declares a peer lost
    /// after it, so all must wait alike.
    pub(super) liveness_ns: u64,
    /// What each transport's connector published, by transport name (opaque here).
    pub(super) links: BTreeMap<String, Value>,
}

/// The transports whose connectors publish, in the table's order.
const PUBLISHING: [Transport; 3] = [Transport::Tcp, Transport::Shm, Transport::Rdma];

/// The first byte of rank 0's reply: a table follows, or why the ranks cannot form a group.
const TABLE: u8 = 0;
const REFUSED: u8 = 1;

/// Why a member could not take rank 0's reply.
#[derive(Debug)]
pub(super) enum Unread {
    /// Rank 0 found that the ranks cannot form a group, and says why.
    Refused(String),
    /// The reply is not a table for this group.
    Bad(String),
}

/// Every rank's host and transports' blobs, as each rank holds them after start-up.
#[derive(Debug)]
pub(super) struct Table {
    hosts: Vec<String>,
    /// Each rank's host, an index into `hosts`.
    host_of: Vec<usize>,
    /// By transport name, what each rank's connector published.
    blobs: BTreeMap<&'static str, Blobs>,
}

impl Table {
    /// Rank 0: its reply to what every rank published (`all`, in rank order): the table, or
    /// why the ranks cannot form a group (every rank then fails with that reason).
    pub(super) fn reply(all: &[Vec<u8>]) -> Vec<u8> {
        Table::encode(all).unwrap_or_else(|why| {
            let mut b = vec![REFUSED];
            b.extend_from_slice(why.as_bytes());
            b
        })
    }

    fn encode(all: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let infos = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                serde_json::from_slice::<PeerInfo>(b)
                    .map_err(|e| format!("rank {r} published unreadable start-up data: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        agree(&infos)?;
        let put = |b: &mut Vec<u8>, bytes: &[u8]| {
            b.extend_from_slice(&to_u32(bytes.len()).to_le_bytes());
            b.extend_from_slice(bytes);
        };
        // The distinct values, then each rank's index among them.
        let indexed = |b: &mut Vec<u8>, values: Vec<&[u8]>| {
            let (distinct, of) = distinct(values);
            b.extend_from_slice(&to_u32(distinct.len()).to_le_bytes());
            distinct.iter().for_each(|v| put(b, v));
            of.iter()
                .for_each(|&i| b.extend_from_slice(&to_u32(i).to_le_bytes()));
        };
        let mut b = vec![TABLE];
        indexed(&mut b, infos.iter().map(|i| i.host.as_bytes()).collect());
        for transport in PUBLISHING {
            let blobs = infos
                .iter()
                .map(|i| {
                    let blob = i.links.get(transport.name()).unwrap_or(&Value::Null);
                    serde_json::to_vec(blob).map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, _>>()?;
            indexed(&mut b, blobs.iter().map(Vec::as_slice).collect());
        }
        Ok(b)
    }

    /// A member: rank 0's reply for a group of `size` ranks, checked.
    pub(super) fn read(bytes: &[u8], size: usize) -> Result<Table, Unread> {
        let mut r = Reader(bytes);
        match r.u8().map_err(Unread::Bad)? {
            TABLE => {}
            REFUSED => return Err(Unread::Refused(String::from_utf8_lossy(r.rest()).into())),
            other => return Err(Unread::Bad(format!("unknown reply kind {other}"))),
        }
        Table::read_table(&mut r, size).map_err(Unread::Bad)
    }

    fn read_table(r: &mut Reader<'_>, size: usize) -> Result<Table, String> {
        // The distinct values (at most one per rank, each once), then each rank's index.
        let mut indexed = |what: &str| -> Result<(Vec<&[u8]>, Vec<usize>), String> {
            let count = r.u32()? as usize;
            if count == 0 || count > size {
                return Err(format!("{count} distinct {what} for {size} ranks"));
            }
            let distinct = (0..count)
                .map(|_| {
                    let len = r.u32()? as usize;
                    r.take(len)
                })
                .collect::<Result<Vec<_>, _>>()?;
            if distinct.iter().collect::<HashSet<_>>().len() != count {
                return Err(format!("repeated {what}"));
            }
            let of = (0..size)
                .map(|_| match r.u32()? as usize {
                    i if i < count => Ok(i),
                    i => Err(format!("{what} {i} of {count}")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((distinct, of))
        };
        let (hosts, host_of) = indexed("hosts")?;
        let hosts = hosts
            .into_iter()
            .map(|h| String::from_utf8(h.to_vec()).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut blobs = BTreeMap::new();
        for transport in PUBLISHING {
            let (distinct, of) = indexed(transport.name())?;
            blobs.insert(transport.name(), Blobs::new(distinct, of)?);
        }
        r.end()?;
        Ok(Table {
            hosts,
            host_of,
            blobs,
        })
    }

    /// Rank `rank`'s host identity.
    fn host(&self, rank: usize) -> &str {
        &self.hosts[self.host_of[rank]]
    }

    /// The distinct host identities.
    pub(super) fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Each rank's host, an index into [`Table::hosts`].
    pub(super) fn host_of(&self) -> &[usize] {
        &self.host_of
    }

    /// What each rank's connector of `transport` published (nothing if none did).
    pub(super) fn blobs(&self, transport: Transport) -> &Blobs {
        static NONE: Blobs = Blobs::none();
        self.blobs.get(transport.name()).unwrap_or(&NONE)
    }

    /// What rank `rank` published for `transport`, as a connector reads it.
    pub(super) fn published(&self, rank: usize, transport: Transport) -> Published<'_> {
        Published {
            host: self.host(rank),
            blob: self.blobs(transport).get(rank),
        }
    }

    /// Takes what each rank's connector of `transport` published, for after start-up.
    pub(super) fn take_blobs(&mut self, transport: Transport) -> Blobs {
        self.blobs
            .remove(transport.name())
            .unwrap_or_else(Blobs::none)
    }
}

/// Checks that every rank uses the same settings as rank 0.
fn agree(infos: &[PeerInfo]) -> Result<(), String> {
    let me = infos.first().ok_or("no rank published anything")?;
    for (r, info) in infos.iter().enumerate() {
        if info.wires != me.wires {
            return Err(format!(
                "ranks disagree on the number of wires: rank 0 uses {}, rank {r} uses {}; \
                 set JACCL_WIRES (or Config::wires) the same on every rank",
                me.wires, info.wires
            ));
        }
        if info.topology != me.topology {
            return Err(format!(
                "ranks disagree on the topology: rank 0 uses {}, rank {r} uses {}; set \
                 JACCL_TOPOLOGY (or Config::topology) the same on every rank",
                me.topology, info.topology
            ));
        }
        if info.transport != me.transport {
            return Err(format!(
                "ranks disagree on the transport: rank 0 uses {}, rank {r} uses {}; set \
                 JACCL_TRANSPORT (or Config::transport) the same on every rank",
                me.transport, info.transport
            ));
        }
        if info.liveness_ns != me.liveness_ns {
            let name = |ns: u64| match ns {
                u64::MAX => "off".to_string(),
                ns => format!("{:?}", std::time::Duration::from_nanos(ns)),
            };
            return Err(format!(
                "ranks disagree on the liveness window: rank 0 uses {}, rank {r} uses {}; set \
                 JACCL_LIVENESS (or Config::liveness) the same on every rank",
                name(me.liveness_ns),
                name(info.liveness_ns)
            ));
        }
        if info.link != me.link {
            let name = |link: &Option<String>| link.clone().unwrap_or_else(|| "none".into());
            return Err(format!(
                "ranks disagree on the link speed: rank 0 uses {}, rank {r} uses {}; set \
                 JACCL_LINK (or Config::link) the same on every rank",
                name(&me.link),
                name(&info.link)
            ));
        }
    }
    Ok(())
}

/// The distinct `values`, in order of first appearance, and each value's index among them.
pub(super) fn distinct<T: Eq + Hash + Clone>(values: Vec<T>) -> (Vec<T>, Vec<usize>) {
    let mut distinct = Vec::new();
    let mut index = HashMap::new();
    let of = values
        .into_iter()
        .map(|v| {
            *index.entry(v).or_insert_with_key(|v| {
                distinct.push(v.clone());
                distinct.len() - 1
            })
        })
        .collect();
    (distinct, of)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(host: &str, wires: usize, port: u16) -> Vec<u8> {
        let mut links = BTreeMap::new();
        links.insert("tcp".to_owned(), Value::String(format!("127.0.0.1:{port}")));
        links.insert("rdma".to_owned(), serde_json::json!({"No": "no device"}));
        let info = PeerInfo {
            host: host.into(),
            wires,
            transport: "auto".into(),
            topology: "auto".into(),
            link: None,
            liveness_ns: 2_000_000_000,
            links,
        };
        serde_json::to_vec(&info).unwrap()
    }

    #[test]
    fn the_table_rank_0_sends_holds_what_every_rank_published() {
        let all = [("a", 1000), ("b", 1001), ("a", 1002)].map(|(h, p)| published(h, 1, p));
        let reply = Table::reply(&all);
        let table = Table::read(&reply, 3).unwrap();
        assert_eq!(table.hosts(), ["a", "b"]);
        assert_eq!(table.host_of(), [0, 1, 0]);
        let tcp = table.published(2, Transport::Tcp);
        assert_eq!((tcp.host, tcp.blob.as_str()), ("a", Some("127.0.0.1:1002")));
        for r in 0..3 {
            let rdma = table.published(r, Transport::Rdma).blob;
            assert_eq!(rdma["No"], "no device", "rank {r}");
            // A transport nobody published: nothing, for every rank.
            assert!(table.published(r, Transport::Shm).blob.is_null());
        }
        // The ranks' identical entries travel once.
        let once = reply.windows(9).filter(|w| w == b"no device").count();
        assert_eq!(once, 1);
    }

    #[test]
    fn rank_0_tells_every_rank_why_they_disagree_and_bad_tables_are_refused() {
        let refused = |all: &[Vec<u8>]| match Table::read(&Table::reply(all), all.len()) {
            Err(Unread::Refused(why)) => why,
            other => panic!("{other:?}"),
        };
        let why = refused(&[published("a", 1, 1), published("a", 2, 2)]);
        assert!(
            why.contains("wires") && why.contains("rank 1 uses 2"),
            "{why}"
        );
        let why = refused(&[published("a", 1, 1), b"not json".to_vec()]);
        assert!(why.contains("rank 1"), "{why}");
        let good = Table::reply(&[published("a", 1, 1), published("a", 1, 2)]);
        assert!(Table::read(&good, 2).is_ok());
        for size in [1, 3] {
            assert!(matches!(Table::read(&good, size), Err(Unread::Bad(_))));
        }
        for cut in 0..good.len() {
            assert!(matches!(Table::read(&good[..cut], 2), Err(Unread::Bad(_))));
        }
        // A rank's entry that names no distinct one.
        let mut bad = good.clone();
        let last = bad.len() - 4;
        bad[last..].copy_from_slice(&7u32.to_le_bytes());
        assert!(matches!(Table::read(&bad, 2), Err(Unread::Bad(_))));
    }

    /// The fuzz target's seed (fuzz/seeds.py writes it) is a table a member reads.
    #[test]
    fn the_fuzz_seed_is_a_table() {
        let seed = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/startup/table"
        );
        let table = Table::read(&std::fs::read(seed).unwrap(), 3).unwrap();
        assert_eq!(table.host_of(), [0, 0, 1]);
        let tcp = table.published(1, Transport::Tcp).blob;
        assert_eq!(tcp.as_str(), Some("127.0.0.1:4001"));
    }
}
