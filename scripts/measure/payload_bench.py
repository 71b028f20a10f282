#!/usr/bin/env python3
"""Measure the per-round payload in both candidate encodings: protobuf and msgpack.

For each case it times, per message, building + encoding on the sending side
and decoding + reading the values back on the receiving side, and reports the
median over many repetitions and the encoded size. docs/protocol.md records
the figures that decided the hot-path encoding.

    python scripts/measure/payload_bench.py [--repeats N] [--json]

Its figures are in ``docs/measurements.md#per-round-encoding``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

import msgpack
import numpy as np

from specwire.v1 import draft_pb2 as pb

TIMING = {
    "deserialize_ns": 21_000,
    "receive_to_start_ns": 40_000,
    "compute_ns": 180_000_000,
    "serialize_ns": 9_000,
}
COUNTERS = {
    "messages_received": 12,
    "messages_sent": 12,
    "rounds": 11,
    "forward_passes": 60,
    "draft_tokens": 44,
}


def case(k: int, support: int) -> dict:
    """Values of one Round and one Drafts message (support 0 = greedy, no distributions)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 49152, size=k).tolist()
    ids = rng.integers(0, 49152, size=k * support).tolist()
    probs = rng.random(k * support).tolist()
    return {
        "round": (7, 3, 1234, k),
        "tokens": tokens,
        "sizes": [support] * (k if support else 0),
        "ids": ids,
        "probs": probs,
    }


def protobuf_pair(
    v: dict,
) -> tuple[Callable[[], bytes], Callable[[bytes], object], Callable[[], bytes], Callable[[bytes], object]]:
    seq, accepted, token, k = v["round"]

    def enc_round() -> bytes:
        return pb.DraftRequest(
            round=pb.Round(seq=seq, accepted=accepted, token=token, k=k)
        ).SerializeToString()

    def dec_round(data: bytes) -> object:
        r = pb.DraftRequest.FromString(data).round
        return (r.seq, r.accepted, r.token, r.k)

    def enc_drafts() -> bytes:
        return pb.DraftReply(
            drafts=pb.Drafts(
                seq=seq,
                tokens=v["tokens"],
                dist_sizes=v["sizes"],
                dist_ids=v["ids"],
                dist_probs=v["probs"],
                timing=pb.ServerTiming(**TIMING),
                counters=pb.SessionCounters(**COUNTERS),
            )
        ).SerializeToString()

    def dec_drafts(data: bytes) -> object:
        d = pb.DraftReply.FromString(data).drafts
        return (
            list(d.tokens),
            list(d.dist_sizes),
            list(d.dist_ids),
            list(d.dist_probs),
            d.timing.compute_ns,
            d.counters.rounds,
        )

    return enc_round, dec_round, enc_drafts, dec_drafts


def msgpack_pair(
    v: dict,
) -> tuple[Callable[[], bytes], Callable[[bytes], object], Callable[[], bytes], Callable[[bytes], object]]:
    seq, accepted, token, k = v["round"]
    timing, counters = list(TIMING.values()), list(COUNTERS.values())

    def enc_round() -> bytes:
        return msgpack.packb(["round", seq, accepted, token, k])

    def dec_round(data: bytes) -> object:
        return tuple(msgpack.unpackb(data)[1:])

    def enc_drafts() -> bytes:
        return msgpack.packb(["drafts", seq, v["tokens"], v["sizes"], v["ids"], v["probs"], timing, counters])

    def dec_drafts(data: bytes) -> object:
        m = msgpack.unpackb(data)
        return (m[2], m[3], m[4], m[5], m[6][2], m[7][2])

    return enc_round, dec_round, enc_drafts, dec_drafts


def median_us(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


def measure(repeats: int) -> list[dict]:
    rows = []
    for name, k, support in [
        ("k=4 greedy", 4, 0),
        ("k=8 greedy", 8, 0),
        ("k=4 T>0, q of 32", 4, 32),
    ]:
        values = case(k, support)
        for fmt, make in (("protobuf", protobuf_pair), ("msgpack", msgpack_pair)):
            enc_round, dec_round, enc_drafts, dec_drafts = make(values)
            round_bytes, drafts_bytes = enc_round(), enc_drafts()
            assert dec_round(round_bytes) == values["round"]
            decode_round = functools.partial(dec_round, round_bytes)
            decode_drafts = functools.partial(dec_drafts, drafts_bytes)
            rows.append(
                {
                    "case": name,
                    "format": fmt,
                    "round_bytes": len(round_bytes),
                    "drafts_bytes": len(drafts_bytes),
                    "round_encode_decode_us": median_us(enc_round, repeats)
                    + median_us(decode_round, repeats),
                    "drafts_encode_decode_us": median_us(enc_drafts, repeats)
                    + median_us(decode_drafts, repeats),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20000, help="timed repetitions per measurement")
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args()
    rows = measure(args.repeats)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'case':<18} {'format':<9} {'Round B':>8} {'Drafts B':>9} {'Round µs':>9} {'Drafts µs':>10}")
    for r in rows:
        print(
            f"{r['case']:<18} {r['format']:<9} {r['round_bytes']:>8} {r['drafts_bytes']:>9} "
            f"{r['round_encode_decode_us']:>9.2f} {r['drafts_encode_decode_us']:>10.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
