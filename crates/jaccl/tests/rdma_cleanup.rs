//! Every RDMA object a group makes is released when it is dropped, on every path. It counts
//! the objects the kernel lists for all processes, so it runs only inside the RDMA VM
//! (`RDMA_VM` set), in a binary of its own: scripts/test.sh boots a VM for it alone, where
//! nothing else uses RDMA meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use jaccl::Error;

/// The RDMA objects of `kind` (`ctx`, `qp`, `cq`, `mr`, `pd`) that processes made (not the
/// kernel's own, listed as `comm [ib_core]`).
fn rdma_objects(kind: &str) -> usize {
    let out = Command::new("rdma")
        .args(["resource", "show", kind])
        .output()
        .expect("the rdma tool (iproute2)");
    assert!(out.status.success(), "rdma resource show {kind}");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("comm ["))
        .count()
}

/// Device contexts, queue pairs, completion queues, memory regions and protection domains are
/// all released when a group is dropped: after success, after a peer left mid-operation, and
/// after a start-up that failed once the devices were open.
#[test]
fn rdma_objects_are_released_on_every_path() {
    if !in_rdma_vm_or_skip(
        "rdma_objects_are_released_on_every_path",
        "it counts every process's RDMA objects",
    ) {
        return;
    }
    let kinds = ["ctx", "qp", "cq", "mr", "pd"];
    let count = || kinds.map(rdma_objects);
    assert_eq!(count(), [0; 5], "before ({kinds:?})");

    let during = with_group(Net::Rdma, 3, 2, |g| {
        let mut out = [0u32; 1000];
        g.all_sum(&[1; 1000], &mut out).unwrap();
        assert_eq!(out, [3; 1000]);
        // Every rank made all its objects before any left start-up; none drops them before
        // the barrier.
        let seen = count();
        g.barrier().unwrap();
        seen
    });
    // 3 ranks × 2 neighbours × 2 wires: 12 queue pairs, each with its completion queue and
    // two regions.
    assert!(during[0][1..4] == [12, 12, 24], "{kinds:?}: {during:?}");
    assert_eq!(count(), [0; 5], "after success ({kinds:?})");

    let results = with_group_timeout(Net::Rdma, 3, 2, Duration::from_secs(60), |g| {
        if g.rank() == 1 {
            return None;
        }
        let mut out = vec![0f32; 1 << 18];
        Some(g.all_sum(&vec![1f32; 1 << 18], &mut out))
    });
    assert!(
        results
            .iter()
            .flatten()
            .all(|r| matches!(r, Err(Error::PeerLost { .. }))),
        "{results:?}"
    );
    assert_eq!(count(), [0; 5], "after a peer left ({kinds:?})");

    let mut cfgs = configs(Net::Rdma, 3, 1, Duration::from_secs(30));
    cfgs[2] = cfgs[2].clone().rdma_library("/nonexistent/libibverbs.so.1");
    let refused: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = cfgs
            .into_iter()
            .map(|c| s.spawn(move || matches!(jaccl::init_with(c), Err(Error::Unsupported(_)))))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(refused, [true; 3]);
    assert_eq!(count(), [0; 5], "after a failed start-up ({kinds:?})");
}
