#!/usr/bin/env python3
"""What a request on a new connection costs a keel daemon (docs/benchmarks.md,
"A connection costs a route table").

Clients met in the wild open a connection for each request. This sends
`--n` requests to a running daemon (`keel serve`), each on a connection of
its own that is closed after the answer, and prints the daemon's CPU per
request (user + system, from /proc/PID/stat) and the rate. Standard library
only; the daemon's pid is given, or found with `ss` by its port:

    python3 bin/lab/bench/connections.py --addr 127.0.0.1:7777 \
        --token "$(cat keel-data/token)" --n 2000 [--path /healthz] [--pid PID]

Compare two builds by running each as its own daemon and alternating
batches between them, in one sitting: this machine's speed moves.
"""

import argparse
import http.client
import json
import time

from proc_stat import cpu_seconds, pid_listening


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True, help="HOST:PORT of the daemon")
    parser.add_argument("--token", default="", help="its bearer token")
    parser.add_argument("--n", type=int, default=2000, help="requests to send")
    parser.add_argument("--path", default="/healthz", help="what each request gets")
    parser.add_argument("--pid", type=int, help="the daemon's pid (else found by its port)")
    args = parser.parse_args()
    host, port = args.addr.rsplit(":", 1)
    pid = args.pid or pid_listening(int(port))
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    before, started = cpu_seconds(pid), time.monotonic()
    for _ in range(args.n):
        connection = http.client.HTTPConnection(host, int(port))
        connection.request("GET", args.path, headers=headers)
        answer = connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"GET {args.path} answered {answer.status}")
        connection.close()
    elapsed = time.monotonic() - started
    print(json.dumps({
        "path": args.path,
        "requests": args.n,
        "daemon_cpu_us_per_request": round((cpu_seconds(pid) - before) / args.n * 1e6, 1),
        "requests_per_second": round(args.n / elapsed),
    }))


if __name__ == "__main__":
    main()
