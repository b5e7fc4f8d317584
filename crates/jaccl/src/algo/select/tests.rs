//! The choices of `super` at their limits.

use super::*;

fn shape(size: usize, mesh: bool, pairs: bool) -> Shape {
    Shape {
        size,
        mesh,
        pairs,
        rdma: false,
        direct: false,
        on_hosts: false,
        host_blocks: None,
        scattered_hosts: false,
        shared_hosts: false,
    }
}

#[test]
fn lanes_fall_back_for_small_messages() {
    assert_eq!(lanes(100, 25, 4, 4), Lanes { dirs: 1, wires: 1 });
    assert_eq!(lanes(32 * 1024, 8192, 4, 4), Lanes { dirs: 1, wires: 1 });
    assert_eq!(lanes(64 * 1024, 8192, 4, 4), Lanes { dirs: 2, wires: 4 });
    // Many bytes but too few elements to give every lane one.
    assert_eq!(lanes(1 << 20, 31, 4, 4), Lanes { dirs: 1, wires: 1 });
}

#[test]
fn each_size_has_its_algorithm() {
    let four = shape(4, false, true);
    assert_eq!(four.all_reduce(8), AllReduce::Doubling);
    assert_eq!(four.all_reduce(0), AllReduce::Gather(SmallGather::BothWays));
    assert_eq!(four.all_reduce(RABENSEIFNER_MIN), AllReduce::Doubling);
    assert_eq!(
        four.all_reduce(RABENSEIFNER_MIN + 1),
        AllReduce::Rabenseifner
    );
    assert_eq!(
        four.all_reduce(rabenseifner_max(4)),
        AllReduce::Rabenseifner
    );
    assert_eq!(four.all_reduce(rabenseifner_max(4) + 1), AllReduce::Ring);
    // On hosts, Rabenseifner's up to the two levels.
    let hosts = Shape {
        on_hosts: true,
        ..shape(8, false, true)
    };
    assert_eq!(hosts.all_reduce(RABENSEIFNER_MIN), AllReduce::Doubling);
    let blocks = Shape {
        host_blocks: Some(4),
        ..hosts
    };
    assert_eq!(
        blocks.all_reduce(HOST_DOUBLING_MIN - 1),
        AllReduce::Doubling
    );
    assert_eq!(
        blocks.all_reduce(HOST_DOUBLING_MIN),
        AllReduce::DoublingOnHosts(4)
    );
    assert_eq!(
        blocks.all_reduce(RABENSEIFNER_MIN),
        AllReduce::DoublingOnHosts(4)
    );
    assert_eq!(
        blocks.all_reduce(RABENSEIFNER_MIN + 1),
        AllReduce::Rabenseifner
    );
    let pairs = Shape {
        host_blocks: Some(2),
        ..hosts
    };
    assert_eq!(
        pairs.all_reduce(HOST_DOUBLING_MIN),
        AllReduce::DoublingOnHosts(2)
    );
    assert_eq!(
        hosts.all_reduce(ALL_REDUCE_TWO_LEVEL_MIN),
        AllReduce::Rabenseifner
    );
    assert_eq!(
        hosts.all_reduce(ALL_REDUCE_TWO_LEVEL_MIN + 1),
        AllReduce::Ring
    );
    let two = shape(2, false, true);
    assert_eq!(two.all_reduce(DOUBLING_MAX), AllReduce::Doubling);
    assert_eq!(two.all_reduce(DOUBLING_MAX + 1), AllReduce::Ring);
    let rdma = Shape { rdma: true, ..four };
    assert_eq!(rdma.all_reduce(DOUBLING_MAX_RDMA), AllReduce::Doubling);
    assert_eq!(rdma.all_reduce(DOUBLING_MAX_RDMA + 1), AllReduce::Ring);
    let mesh8 = shape(8, true, true);
    assert_eq!(
        mesh8.all_reduce(8),
        AllReduce::Gather(SmallGather::Exchange)
    );
    assert_eq!(mesh8.all_reduce(MESH_LIMIT / 4), AllReduce::Doubling);
    assert_eq!(mesh8.all_reduce(MESH_LIMIT), AllReduce::Rabenseifner);
    // Recursive doubling among 5 ranks or more, Rabenseifner's algorithm among 3 or more.
    let eight = shape(8, false, false);
    assert_eq!(eight.all_reduce(8), AllReduce::Doubling);
    assert_eq!(eight.barrier(), Barrier::Doubling);
    let twelve = shape(12, false, false);
    assert_eq!(twelve.all_reduce(32 * 1024), AllReduce::Doubling);
    assert_eq!(twelve.all_reduce(64 * 1024), AllReduce::Rabenseifner);
    assert_eq!(
        twelve.all_reduce(rabenseifner_max(12)),
        AllReduce::Rabenseifner
    );
    assert_eq!(twelve.all_reduce(rabenseifner_max(12) + 1), AllReduce::Ring);
    for size in [5, 6, 7, 9, 10, 11] {
        let s = shape(size, false, false);
        assert_eq!(s.all_reduce(8), AllReduce::Doubling);
        assert_eq!(s.all_reduce(64 * 1024), AllReduce::Rabenseifner);
        assert_eq!(s.barrier(), Barrier::Doubling);
    }
    // Bruck's all-gather from 6 ranks, up to its limit: 16 KiB per rank, 512 B where hosts
    // share ports.
    let cases = [
        (6, false),
        (8, false),
        (12, false),
        (64, false),
        (8, true),
        (64, true),
    ];
    for (size, shared_hosts) in cases {
        let s = Shape {
            shared_hosts,
            ..shape(size, false, false)
        };
        let most = bruck_max(size, shared_hosts) / size;
        assert_eq!(most, if shared_hosts { 512 } else { 16 * 1024 });
        assert_eq!(s.all_gather(8), AllGather::Bruck, "{size} ranks");
        assert_eq!(s.all_gather(most), AllGather::Bruck);
        assert_ne!(s.all_gather(most + 1), AllGather::Bruck);
    }
    assert_eq!(
        shape(5, false, false).all_gather(8),
        AllGather::Small(SmallGather::BothWays)
    );
    // Bruck's all-to-all from 8 ranks, up to its limit (the largest block × N); fewer
    // ranks pairwise, every rank sharing memory directly, RDMA rings unmeasured.
    // Where hosts share ports, to half the block.
    for (size, shared_hosts) in [(8, false), (13, false), (64, false), (8, true), (16, true)] {
        let s = Shape {
            shared_hosts,
            ..shape(size, false, size == 64)
        };
        let most = bruck_all_to_all_max(size, shared_hosts) / size - 1;
        assert_eq!(most + 1, if shared_hosts { 2048 } else { 4096 });
        assert_eq!(s.all_to_all(1), AllToAll::Bruck, "{size} ranks");
        assert_eq!(s.all_to_all(most), AllToAll::Bruck);
        assert_eq!(s.all_to_all(most + 1), AllToAll::Pairwise);
        assert_eq!(s.all_to_all(0), AllToAll::Pairwise);
    }
    assert_eq!(shape(7, false, false).all_to_all(8), AllToAll::Pairwise);
    let direct = Shape {
        direct: true,
        ..shape(8, false, true)
    };
    assert_eq!(direct.all_to_all(8), AllToAll::Direct);
    let rdma = Shape {
        rdma: true,
        ..shape(8, false, true)
    };
    assert_eq!(rdma.all_to_all(8), AllToAll::Pairwise);
    // Where the ring uses RDMA, no new links beyond it for small messages (unmeasured).
    let rdma6 = Shape {
        rdma: true,
        ..shape(6, false, false)
    };
    assert_eq!(rdma6.all_gather(8), AllGather::Small(SmallGather::BothWays));
    assert_eq!(
        rdma6.all_reduce(8),
        AllReduce::Gather(SmallGather::BothWays)
    );
    assert_eq!(
        rdma6.all_reduce(64 * 1024),
        AllReduce::Gather(SmallGather::BothWays)
    );
    assert_eq!(
        shape(8, true, true).all_gather(64 * 1024),
        AllGather::Doubling
    );
    let three = shape(3, false, false);
    assert_eq!(
        three.all_reduce(8),
        AllReduce::Gather(SmallGather::BothWays)
    );
    assert_eq!(three.all_reduce(64 * 1024), AllReduce::Rabenseifner);
    assert_eq!(
        three.barrier(),
        Barrier::Gather(AllGather::Small(SmallGather::BothWays))
    );
    assert_eq!(four.barrier(), Barrier::Gather(AllGather::Doubling));
    assert_eq!(three.all_gather(8), AllGather::Small(SmallGather::BothWays));
    assert_eq!(three.all_gather(GATHER_LIMIT), AllGather::Ring);
    assert_eq!(
        shape(2, false, true).reduce_scatter(8),
        ReduceScatter::Halving
    );
    assert_eq!(
        shape(2, false, true).reduce_scatter(PAIR_HALVING_MAX),
        ReduceScatter::Ring
    );
    assert_eq!(mesh8.reduce_scatter(8), ReduceScatter::Exchange);
    // Ranks that do not pair up halve over links made on first use, up to their limit (any
    // count: those beyond a power of two fold in); RDMA rings and hosts that share ports take
    // the ring.
    for size in [3, 8, 12, 32, 48, 64, 1000, 1024] {
        let s = shape(size, false, false);
        let most = halving_over_links_max(size) / size;
        assert_eq!(most, (16 * 1024).min(GATHER_LIMIT / size));
        assert_eq!(s.reduce_scatter(8), ReduceScatter::Halving, "{size} ranks");
        assert_eq!(s.reduce_scatter(most), ReduceScatter::Halving);
        assert_eq!(s.reduce_scatter(most + 1), ReduceScatter::Ring);
        let shared = Shape {
            shared_hosts: true,
            ..s
        };
        assert_eq!(shared.reduce_scatter(8), ReduceScatter::Ring);
        let rdma = Shape { rdma: true, ..s };
        assert_eq!(rdma.reduce_scatter(8), ReduceScatter::Ring);
    }
    assert_eq!(four.broadcast(TREE_BROADCAST_MAX), Broadcast::Tree);
    assert_eq!(four.broadcast(TREE_BROADCAST_MAX + 1), Broadcast::Chain);
    assert_eq!(rdma.broadcast(8), Broadcast::Chain);
    assert_eq!(three.broadcast(8), Broadcast::Chain);
    // Among many ranks on one host (or each on its own), the tree only for small messages,
    // then all of the data each way to half the ranks while the hops cost more than bytes.
    let many = shape(64, false, false);
    assert_eq!(
        many.broadcast(MANY_RANKS_TREE_BROADCAST_MAX),
        Broadcast::Tree
    );
    let whole_max = WHOLE_CHAINS_PER_HOP * 63;
    assert_eq!(
        many.broadcast(MANY_RANKS_TREE_BROADCAST_MAX + 1),
        Broadcast::WholeChains
    );
    assert_eq!(many.broadcast(whole_max), Broadcast::WholeChains);
    assert_eq!(many.broadcast(whole_max + 1), Broadcast::Chain);
    let hosts_of_many = Shape {
        shared_hosts: true,
        ..many
    };
    assert_eq!(hosts_of_many.broadcast(TREE_BROADCAST_MAX), Broadcast::Tree);
    assert_eq!(
        hosts_of_many.broadcast(TREE_BROADCAST_MAX + 1),
        Broadcast::Chain
    );
    assert_eq!(
        shape(15, false, false).broadcast(TREE_BROADCAST_MAX),
        Broadcast::Tree
    );
    // On hosts whose ranks alternate, the trees at every size (the two levels take over above).
    let scattered = Shape {
        scattered_hosts: true,
        ..four
    };
    assert_eq!(scattered.broadcast(64 << 20), Broadcast::Tree);
    assert_eq!(scattered.reduce(64 << 20), Rooted::Tree);
    assert_eq!(four.reduce(64 << 20), Rooted::ViaAll);
    let even = Shape {
        on_hosts: true,
        ..four
    };
    assert_eq!(even.reduce(64 << 20), Rooted::Tree);
    let direct = Shape {
        direct: true,
        ..three
    };
    assert_eq!(direct.broadcast(EAGER_DATA_BYTES), Broadcast::Eager);
    assert_eq!(direct.broadcast(EAGER_DATA_BYTES + 1), Broadcast::Flat);
    let direct_pair = Shape { size: 2, ..direct };
    assert_eq!(direct_pair.broadcast(0), Broadcast::Eager);
    assert_eq!(
        direct_pair.broadcast(EAGER_DATA_BYTES + 1),
        Broadcast::Direct
    );
    assert_eq!(
        direct.direct_all_reduce(8 * 1024, 1 << 20),
        DirectAllReduce::OneRound
    );
    assert_eq!(
        direct.direct_all_reduce(8 * 1024 + 1, 1 << 20),
        DirectAllReduce::Sliced
    );
}

#[test]
fn rooted_trees_reach_further_among_more_ranks() {
    // Reduces: 64 KiB per rank of the group, at least 512 KiB.
    for (size, max) in [(2, 512 << 10), (8, 512 << 10), (16, 1 << 20), (64, 4 << 20)] {
        let s = shape(size, false, false);
        assert_eq!(s.reduce(max), Rooted::Tree, "{size} ranks");
        assert_eq!(s.reduce(max + 1), Rooted::ViaAll, "{size} ranks");
    }
    // Gathers: 64 KiB per rank, 512 KiB among 16 ranks or more on one host or each alone.
    let (few, many) = (shape(15, false, false), shape(16, false, false));
    assert_eq!(few.gather(TREE_GATHER_PER_RANK), Rooted::Tree);
    assert_eq!(few.gather(TREE_GATHER_PER_RANK + 1), Rooted::Chain);
    assert_eq!(many.gather(MANY_RANKS_TREE_GATHER_PER_RANK), Rooted::Tree);
    assert_eq!(
        many.gather(MANY_RANKS_TREE_GATHER_PER_RANK + 1),
        Rooted::Chain
    );
    let hosts_of_many = Shape {
        shared_hosts: true,
        ..many
    };
    assert_eq!(
        hosts_of_many.gather(TREE_GATHER_PER_RANK + 1),
        Rooted::Chain
    );
}
