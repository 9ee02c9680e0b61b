"""Backlogged TCP flows for the testbed: a `serve` side that pushes bytes from fixed listening
ports (like a PS pushing parameters to workers) and a `sink` side that reads them and records
how many bytes each flow delivered in every interval.

    python -m tensorlights.testbed.traffic serve --port 5001 --port 5002
    python -m tensorlights.testbed.traffic sink --connect 10.77.0.1:5001 --seconds 6

`sink` prints one JSON object: {"interval": s, "flows": {"ADDR:PORT": [bytes, ...]},
"link": [bytes, ...] or null, "stolen": [share, ...] or null, "resets": n, "errors": [...]}.
Both sides stop by themselves.

`flows` count what the sink read in each interval; `link` (with `--link-dev DEV`) what the
link delivered into the sink's namespace: DEV's receive counter, which a veth advances as its
peer transmits. The two differ when the receiving side lags: on two busy cores the sink's
reads (and the kernel's receive processing before them) fell ~25% behind for one interval and
caught up in the next, with DEV's counter at the link's rate throughout. So what the link
carried is read from `link`, and the shares of the flows from `flows`.

`stolen` (with `--link-dev`): the share of each interval the hypervisor ran something else
while this VM wanted a core (/proc/stat's steal, all cores together). The link is emulated by
an HTB token bucket of a 2 ms burst: a core taken away past that dequeues late, and the link
time lost is not made up (a CI run carried 94-96% for 2 s, every slot 99.6-100.4% in 18 runs
on an idle VM and beside busy loops), so what a test asks of `link` leaves that share out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

from tensorlights.discovery.procfs import ProcFs

CHUNK = 256 * 1024
LINK_SAMPLE_S = 0.005  # how often the link's counter is read: boundaries are interpolated


def serve(ports: list[int], bind: str, max_seconds: float) -> int:
    """Accept connections on every port and write to each until its peer closes."""
    sel = selectors.DefaultSelector()
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    for port in ports:
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(64)
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ, "listener")
    payload = b"\0" * CHUNK
    print("ready", flush=True)
    deadline = time.monotonic() + max_seconds
    resets = 0
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if key.data == "listener":
                conn, _ = sock.accept()
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_WRITE, "flow")
                continue
            try:
                sock.send(payload)
            except BlockingIOError:
                continue
            except (ConnectionResetError, BrokenPipeError) as exc:
                resets += isinstance(exc, ConnectionResetError)
                sel.unregister(sock)
                sock.close()
    print(json.dumps({"resets": resets}), flush=True)
    return 0


def sink(targets: list[str], seconds: float, interval: float, link_dev: str | None = None) -> int:
    sel = selectors.DefaultSelector()
    slots = max(1, round(seconds / interval))
    flows: dict[str, list[int]] = {}
    errors: list[str] = []
    resets = 0
    for target in targets:
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        conn = socket.create_connection((host, int(port)), timeout=5)
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ, target)
        flows[target] = [0] * slots
    counter = Path(f"/sys/class/net/{link_dev}/statistics/rx_bytes") if link_dev else None
    link: list[tuple[float, int]] = []  # (seconds since start, DEV's received bytes)
    procfs = ProcFs()
    steal: list[tuple[float, int]] = []  # (seconds since start, steal ticks), once a slot
    start = time.monotonic()
    end = start + seconds
    while (now := time.monotonic()) < end:
        if counter is not None and (not link or now - start - link[-1][0] >= LINK_SAMPLE_S):
            link.append((now - start, int(counter.read_text())))
        if counter is not None and (
            not steal or int((now - start) / interval) > int(steal[-1][0] / interval)
        ):
            steal.append((now - start, procfs.machine_ticks().steal))
        for key, _ in sel.select(timeout=min(0.05, end - now)):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except ConnectionResetError as exc:
                resets += 1
                errors.append(f"{key.data}: {exc}")
                sel.unregister(sock)
                continue
            if not data:
                errors.append(f"{key.data}: closed by peer")
                sel.unregister(sock)
                continue
            slot = min(slots - 1, int((time.monotonic() - start) / interval))
            flows[key.data][slot] += len(data)
    if counter is not None:
        link.append((time.monotonic() - start, int(counter.read_text())))
        steal.append((time.monotonic() - start, procfs.machine_ticks().steal))
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    per_slot = slot_bytes(link, slots, interval) if counter is not None else None
    stolen = (
        [t / procfs.ticks_per_second / interval for t in slot_bytes(steal, slots, interval)]
        if counter is not None
        else None
    )
    result = {"interval": interval, "flows": flows, "link": per_slot, "stolen": stolen}
    result |= {"resets": resets, "errors": errors}
    print(json.dumps(result))
    return 0


def slot_bytes(samples: list[tuple[float, int]], slots: int, interval: float) -> list[int]:
    """Bytes per slot from a counter's (time, value) samples, its value at each slot boundary
    interpolated between the samples around it: a sample late by a stall of the sampler still
    puts the bytes the kernel counted meanwhile in the slots they were counted in, near enough."""

    def at(t: float) -> float:
        for (t0, v0), (t1, v1) in itertools.pairwise(samples):
            if t <= t1:
                return v0 if t1 == t0 or t <= t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return samples[-1][1]

    edges = [at(i * interval) for i in range(slots + 1)]
    return [round(b - a) for a, b in itertools.pairwise(edges)]


def serve_command(ports: list[int], max_seconds: float = 120.0) -> list[str]:
    args = [sys.executable, "-m", "tensorlights.testbed.traffic", "serve"]
    args += [arg for port in ports for arg in ("--port", str(port))]
    return [*args, "--max-seconds", str(max_seconds)]


def sink_command(
    targets: list[str], seconds: float, interval: float, link_dev: str | None = None
) -> list[str]:
    args = [sys.executable, "-m", "tensorlights.testbed.traffic", "sink"]
    args += [arg for target in targets for arg in ("--connect", target)]
    args += ["--link-dev", link_dev] if link_dev else []
    return [*args, "--seconds", str(seconds), "--interval", str(interval)]


def start_server(
    ns: str, ports: list[int], max_seconds: float = 120.0, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start `serve` in namespace `ns` (with `env` as its whole environment, when given: a
    PS's launcher variables) and return once its ports listen."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, *serve_command(ports, max_seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"traffic server in {ns} did not start (exit {proc.wait()})")
    return proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tensorlights.testbed.traffic",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    p_serve = sub.add_parser("serve", help="push bytes from listening ports")
    p_serve.add_argument("--port", type=int, action="append", required=True)
    p_serve.add_argument("--bind", default="::")
    p_serve.add_argument("--max-seconds", type=float, default=120.0)
    p_sink = sub.add_parser("sink", help="read flows and record bytes per interval")
    p_sink.add_argument("--connect", action="append", required=True, metavar="ADDR:PORT")
    p_sink.add_argument("--seconds", type=float, default=5.0)
    p_sink.add_argument("--interval", type=float, default=0.1)
    p_sink.add_argument(
        "--link-dev", metavar="DEV", help="also record what DEV received in each interval"
    )
    args = parser.parse_args(argv)
    if args.mode == "serve":
        return serve(args.port, args.bind, args.max_seconds)
    return sink(args.connect, args.seconds, args.interval, args.link_dev)


if __name__ == "__main__":
    sys.exit(main())
