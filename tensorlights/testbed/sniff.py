"""Capture TCP packets on an interface (scapy) and count them per time slot, source port and
DSCP: what the wire says about the marks.

    python -m tensorlights.testbed.sniff --iface veth-b --seconds 4 [--slot 0.1]

Prints "ready" once capturing, then one JSON object: {"slot": s, "counts": [[slot_index,
sport, dscp, packets], ...]} for IPv4 and IPv6 TCP packets arriving on the interface.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iface", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--slot", type=float, default=0.1)
    args = parser.parse_args(argv)

    from scapy.all import conf  # slow import: after argument errors
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6

    counts: Counter[tuple[int, int, int]] = Counter()
    sock = conf.L2listen(iface=args.iface)
    print("ready", flush=True)
    start = time.monotonic()
    try:
        while (now := time.monotonic()) - start < args.seconds:
            packet: Any = sock.recv()
            if packet is None or TCP not in packet:
                continue
            if IP in packet:
                dscp = packet[IP].tos >> 2
            elif IPv6 in packet:
                dscp = packet[IPv6].tc >> 2
            else:
                continue
            counts[(int((now - start) / args.slot), packet[TCP].sport, dscp)] += 1
    finally:
        sock.close()
    rows = [[slot, sport, dscp, n] for (slot, sport, dscp), n in sorted(counts.items())]
    print(json.dumps({"slot": args.slot, "counts": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
