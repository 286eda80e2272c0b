#!/usr/bin/env python3
"""The cost of a forwarded request between keel nodes (docs/nodes.md).

Two nodes of one database must be running (`keel serve` with KEEL_NODE,
see docs/nodes.md). A conversation is created on the owner; then the same
requests go to it directly and through the other node, which forwards them:

- GET /v1/conversations/{id}          (a read)
- POST /v1/conversations/{id}/messages (a send; its turn runs on the owner)

Each is timed on one keep-alive connection per node, one at a time, and the
CPU both processes used is read from /proc/PID/stat. Prints one JSON object
per measurement. Standard library only:

    python3 bin/lab/bench/forwarding.py --owner 127.0.0.1:7801 \
        --via 127.0.0.1:7802 --token TOKEN --n 2000
"""

import argparse
import http.client
import json
import time

from proc_stat import cpu_seconds, pid_listening


class Node:
    def __init__(self, addr, token):
        host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.conn = http.client.HTTPConnection(host, self.port)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.pid = pid_listening(self.port)

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body)
        self.conn.request(method, path, body=data, headers=self.headers)
        response = self.conn.getresponse()
        payload = response.read()
        return response.status, response.getheader("x-keel-node"), payload


def percentile(sorted_values, p):
    index = min(len(sorted_values) - 1, int(round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def measure(name, entry, nodes, n, request, expect, prepare=None):
    before = {node.port: cpu_seconds(node.pid) for node in nodes}
    times = []
    answered = set()
    started = time.perf_counter()
    for i in range(n):
        if prepare is not None:
            prepare()
        t0 = time.perf_counter()
        status, by, payload = request(entry, i)
        times.append(time.perf_counter() - t0)
        if status != expect:
            raise SystemExit(f"{name}: {status} {payload[:200]!r}")
        answered.add(by)
    wall = time.perf_counter() - started
    times.sort()
    cpu = {node.port: cpu_seconds(node.pid) - before[node.port] for node in nodes}
    print(json.dumps({
        "measurement": name,
        "requests": n,
        "answered_by": sorted(a for a in answered if a),
        "p50_ms": round(percentile(times, 50) * 1000, 3),
        "p99_ms": round(percentile(times, 99) * 1000, 3),
        "mean_ms": round(sum(times) / n * 1000, 3),
        "cpu_ms_per_request": {str(port): round(seconds * 1000 / n, 3) for port, seconds in cpu.items()},
        "wall_s": round(wall, 2),
    }))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--owner", required=True, help="HOST:PORT of the node that creates the conversation")
    parser.add_argument("--via", required=True, help="HOST:PORT of another node")
    parser.add_argument("--token", required=True)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    owner, via = Node(args.owner, args.token), Node(args.via, args.token)
    nodes = [owner, via]
    status, by, payload = owner.call("POST", "/v1/conversations", {})
    if status != 201:
        raise SystemExit(f"create: {status} {payload!r}")
    conversation = json.loads(payload)["id"]
    get = lambda node, i: node.call("GET", f"/v1/conversations/{conversation}")
    for name, entry in [("read, direct", owner), ("read, forwarded", via)] * 2:
        measure(name, entry, nodes, args.n, get, 200)

    def idle():
        # A send is accepted while a turn runs only if the policy queues
        # it: wait (untimed, on the owner) for idle between sends, so each
        # is a plain 202. The CPU figures include these waits' reads.
        while True:
            status, _, payload = owner.call("GET", f"/v1/conversations/{conversation}")
            if status == 200 and json.loads(payload)["state"] == "idle":
                return

    send = lambda node, i: node.call(
        "POST", f"/v1/conversations/{conversation}/messages", {"text": f"message {i}"}
    )
    sends = max(50, args.n // 10)
    for name, entry in [("send, direct", owner), ("send, forwarded", via)] * 2:
        measure(name, entry, nodes, sends, send, 202, prepare=idle)


if __name__ == "__main__":
    main()
