#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets whose inputs follow jaccl's byte formats (the
hello and operation headers, the engine's input, a shared-memory offer, start-up's entries
and table) into corpus/: inputs
that get past the parsers, so fuzzing starts deep. Run it after changing one of those formats
(the constants below mirror crates/jaccl/src/{auth,wire,fuzzing}.rs, transport/shm and
connect/published.rs)."""

import json
import struct
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
PROTOCOL_VERSION = 15
HEADER_LEN = 64
# Kind ids (op_header.rs), ReduceOp ids (dtype.rs), Dtype ids (dtype.rs).
KIND = {"all_reduce": 1, "all_gather": 2, "reduce_scatter": 3, "send_recv": 4, "barrier": 5,
        "broadcast": 6, "reduce": 7, "gather": 8, "scatter": 9, "all_to_all": 10,
        "all_to_all_v": 11, "all_gather_v": 12, "reduce_scatter_v": 13}
SUM, F32, U8 = 0, 11, 5
# The engine target's list of operations, in its order (fuzzing.rs).
ENGINE_OPS = ["all_reduce", "all_gather", "reduce_scatter", "send", "recv", "barrier",
              "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_v",
              "all_gather_v", "reduce_scatter_v"]


def hello(purpose, rank, size, wire, group):
    """A connecting side's hello (auth.rs): magic, version, claim, group, nonce."""
    return (b"JCAU" + struct.pack("<HBxIIHxxQ", PROTOCOL_VERSION, purpose, rank, size, wire,
                                  group) + bytes(range(32)))


def header(seq, kind, dtype, reduce, sender, count, root=0, number=0):
    """An operation header (op_header.rs); `number`: the call's among the group's collectives."""
    b = b"JCOP" + struct.pack("<IBBBxIQII", seq, KIND[kind], dtype, reduce, sender, count, root,
                              number)
    # A send's header carries its whole message (here the one piece) at byte 32.
    message = struct.pack("<Q", count) if kind == "send_recv" else b""
    return b + bytes(32 - len(b)) + message + bytes(HEADER_LEN - 32 - len(message))


def piece(data):
    return struct.pack("<H", len(data)) + data


def engine(size, rank, wires, mesh, dtype, op, root, count, chunk, room, pieces, tail=b""):
    """The engine target's input (fuzzing.rs `engine`)."""
    head = bytes([size - 2, rank, wires - 1, int(mesh), dtype, SUM, ENGINE_OPS.index(op), root])
    head += struct.pack("<HHH", count, chunk, room)
    return head + b"".join(piece(p) for p in pieces) + tail


def peer_info(host, port, link=None):
    """What a rank publishes at start-up (connect/published.rs `PeerInfo`), as JSON."""
    return {"host": host, "wires": 1, "transport": "auto", "topology": "auto", "link": link,
            "links": {"tcp": f"127.0.0.1:{port}", "shm": f"jaccl-{port}",
                      "rdma": {"No": "no device"}}}


def table(infos):
    """Rank 0's reply to what every rank published (connect/published.rs `Table`): the
    distinct hosts and each rank's index among them, then the same of each transport's blobs
    (tcp, shm, rdma)."""
    def indexed(values):
        distinct = list(dict.fromkeys(values))
        return (struct.pack("<I", len(distinct))
                + b"".join(struct.pack("<I", len(v)) + v for v in distinct)
                + b"".join(struct.pack("<I", distinct.index(v)) for v in values))

    out = b"\x00" + indexed([i["host"].encode() for i in infos])
    for name in ["tcp", "shm", "rdma"]:
        out += indexed([json.dumps(i["links"][name], separators=(",", ":")).encode()
                        for i in infos])
    return out


def main():
    seeds = {
        "wire/hello-and-header": hello(2, 1, 4, 0, 0)
        + header(3, "all_reduce", F32, SUM, 1, 1024, number=1),
        "wire/late-hello": hello(4, 2, 5, 0, 0) + header(0, "send_recv", U8, SUM, 2, 9),
        "wire/earlier-call": hello(2, 1, 4, 0, 0)
        + header(3, "all_reduce", F32, SUM, 1, 1024, number=0),
        "wire/later-call": hello(2, 1, 4, 0, 0)
        + header(3, "all_reduce", F32, SUM, 1, 1024, number=2),
        "wire/header-mismatch": header(3, "all_gather", F32, SUM, 1, 1024)
        + header(0, "broadcast", U8, SUM, 1, 7, root=2),
        # Two ranks: rank 0's peer sends its header and two f32s on the channel it uses.
        "engine/pair-all-reduce": engine(2, 0, 1, False, F32, "all_reduce", 0, 2, 100, 1000,
                                         [b"", header(0, "all_reduce", F32, SUM, 1, 2)
                                          + struct.pack("<ff", 1.0, 2.0)]),
        "engine/pair-send-recv": engine(2, 0, 1, False, U8, "recv", 0, 4, 100, 1000,
                                        [b"", header(0, "send_recv", U8, SUM, 1, 4) + b"abcd"],
                                        tail=b"\x01"),
        "engine/ring-broadcast": engine(3, 1, 1, False, U8, "broadcast", 0, 8, 100, 1000,
                                        [header(0, "broadcast", U8, SUM, 0, 8, root=0)
                                         + b"12345678", header(0, "broadcast", U8, SUM, 2, 8)]),
        "engine/ring-all-to-all": engine(3, 0, 1, False, U8, "all_to_all", 0, 2, 100, 1000,
                                         [header(0, "all_to_all", U8, SUM, 2, 2) + b"xy",
                                          header(0, "all_to_all", U8, SUM, 1, 2) + b"zw"]),
        # A segment offer for one wire in a group of 4 (fuzzing.rs `shared_memory`): rings
        # 2 × 1 + 4, 256 KiB each, 1 MiB areas, no asymmetric fences.
        "shared_memory/offer": b"JCSM" + struct.pack("<QQQQ", 6, 1, 256 << 10, 1 << 20) + b"\x00",
        # What three ranks publish (rank 0 reads them; they disagree on the link), and rank
        # 0's table for three ranks on two hosts (a member reads it).
        "startup/peers": json.dumps([peer_info("a", 4000), peer_info("a", 4001),
                                     peer_info("b", 4002, "100Gb/s,2us")]).encode(),
        "startup/table": table([peer_info("a", 4000), peer_info("a", 4001),
                                peer_info("b", 4002)]),
    }
    for name, data in seeds.items():
        path = CORPUS / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    print(f"wrote {len(seeds)} seeds under {CORPUS}")


if __name__ == "__main__":
    main()
