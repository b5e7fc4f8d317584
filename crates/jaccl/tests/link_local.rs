//! RDMA with only IPv6 link-local GIDs, as Apple's Thunderbolt RDMA has them. The test takes
//! the IPv4 (and site-local IPv6) addresses off eth0, so it runs only inside the throw-away
//! RDMA VM (`RDMA_VM` set), in a binary of its own: scripts/test.sh boots a VM for it alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use jaccl::ReduceOp;

fn sh(args: &[&str]) {
    let status = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(status.success(), "{args:?}: {status}");
}

/// The GIDs of the first device's first port, and the one jaccl would choose.
fn gids() -> (Vec<IpAddr>, Option<IpAddr>) {
    let devices = jaccl::probe::rdma(None).unwrap();
    let port = &devices[0].ports[0];
    let chosen = port.chosen_gid.and_then(|i| {
        let gid = port.gids.iter().find(|g| g.index == i);
        gid.map(|g| g.address)
    });
    (port.gids.iter().map(|g| g.address).collect(), chosen)
}

#[test]
fn only_link_local_gids_connect_the_ring() {
    if !in_rdma_vm_or_skip(
        "only_link_local_gids_connect_the_ring",
        "it takes eth0's addresses away",
    ) {
        return;
    }
    let (before, chosen) = gids();
    assert!(
        matches!(chosen, Some(IpAddr::V4(_))),
        "{before:?}: {chosen:?}"
    );

    // No router advertisements, then no address but link-local ones.
    sh(&["sysctl", "-q", "net.ipv6.conf.eth0.accept_ra=0"]);
    sh(&["ip", "addr", "flush", "dev", "eth0", "scope", "global"]);
    sh(&["ip", "addr", "flush", "dev", "eth0", "scope", "site"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (after, chosen) = loop {
        let (after, chosen) = gids();
        let link_local = |a: &IpAddr| matches!(a, IpAddr::V6(v6) if v6.is_unicast_link_local());
        if after.iter().all(link_local) {
            break (after, chosen);
        }
        assert!(
            Instant::now() < deadline,
            "GIDs still not link-local only: {after:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("GIDs before {before:?}, after {after:?}; chosen {chosen:?}");
    // The VM has just booted: until duplicate address detection ends, the link-local address
    // is tentative and packets to it are dropped (the first hellos would be lost).
    loop {
        let out = Command::new("ip")
            .args(["-6", "addr", "show", "dev", "eth0", "tentative"])
            .output()
            .unwrap();
        if out.stdout.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "eth0's address stays tentative");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        matches!(chosen, Some(IpAddr::V6(v6)) if v6.is_unicast_link_local()),
        "{chosen:?}"
    );

    for (size, wires) in [(2, 1), (3, 2), (4, 1)] {
        let lengths = edge_lengths(size, wires);
        let digests = with_group(Net::Rdma, size, wires, |g| {
            let rank = g.rank();
            let mut digest = Vec::new();
            for &len in &lengths {
                for op in ops_of::<f32>() {
                    let ins = inputs::<f32>(size, len, op);
                    let mut out = vec![0f32; len];
                    g.all_reduce(&ins[rank], &mut out, op).unwrap();
                    assert_eq!(
                        bits(&out),
                        bits(&expected_reduction::<f32>(size, len, op)),
                        "{op} {len}"
                    );
                    digest.extend(bits(&out));
                }
                let ins = inputs::<u16>(size, len, ReduceOp::Sum);
                let mut out = vec![0u16; size * len];
                g.all_gather(&ins[rank], &mut out).unwrap();
                assert_eq!(out, ins.concat(), "all_gather {len}");
            }
            digest
        });
        assert!(digests.iter().all(|d| d == &digests[0]), "size {size}");
    }
}
