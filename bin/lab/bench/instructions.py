#!/usr/bin/env python3
"""Count the daemon's user-space instructions per client-shaped tool turn.

CPU time on a shared machine moves by 20-50% from one run to the next, so a
change worth 5% cannot be seen in `keel bench` alone. Instructions retired
in user space do not move with the neighbours: this script runs `keel
serve` under valgrind's callgrind, creates the conversations, zeroes the
counts, runs `--turns` client-shaped turns, dumps the counts and prints
them per turn. A turn is shaped as in docs/bench.md, "Client-shaped tool
turns": it sends over a new connection, then follows from the message's
seq over another, snapshot first, to the turn's end, on OpenAI's wire to
keel's fake provider (`--wire anthropic` for Anthropic's), running
`bash`. Repeated runs agree to 0.1%. Work in the kernel (system calls,
the network, the disk) is not counted; `keel bench` measures all of it.

Under valgrind the daemon has no spawner and no Landlock (valgrind cannot
run either), so its conversations run tools unconfined and start them
themselves (`KEEL_SANDBOX=full-access`); the tool path counted is that one.

Needs valgrind (`apt install valgrind`). Usage:

    cargo build --release -p keel
    python3 bin/lab/bench/instructions.py                     # 60 turns over 20 conversations
    python3 bin/lab/bench/instructions.py --conversations 1 --turns 40   # one long conversation
    python3 bin/lab/bench/instructions.py --top 30            # and where they go, per function
    python3 bin/lab/bench/instructions.py --keep turns.out    # then: callgrind_annotate --inclusive=yes turns.out

The figures and what they were used for: docs/benchmarks.md, "Work per
turn counted by instructions".
"""

import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

TOKEN = "count-instructions"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port, deadline):
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"nothing listens on port {port}")


class Daemon:
    def __init__(self, port, provider):
        self.port = port
        self.provider = provider
        self.headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=self.headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        if response.status >= 300:
            sys.exit(f"{method} {path}: {response.status} {data[:200]!r}")
        return json.loads(data)

    def create(self):
        return self.request("POST", "/v1/conversations", {"cwd": tempfile.gettempdir(), "provider": self.provider})["id"]

    def turn(self, conversation):
        """One client-shaped turn: send on a new connection, then follow
        from the message's seq on another until the turn ends."""
        seq = self.request("POST", f"/v1/conversations/{conversation}/messages", {"text": "run: true"})["seq"]
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        conn.request(
            "GET",
            f"/v1/conversations/{conversation}/events?from={seq}",
            headers={**self.headers, "Accept": "text/event-stream"},
        )
        response = conn.getresponse()
        while True:
            line = response.fp.readline()
            if not line:
                sys.exit("the event stream closed before the turn ended")
            if b"turn_failed" in line:
                sys.exit(f"a turn failed: {line!r}")
            if b"turn_completed" in line:
                break
        conn.close()


def counted_run(keel, turns, conversations, provider, workdir):
    """Start a fake provider and a daemon under callgrind, create
    `conversations` conversations, zero the counts, do `turns` turns over
    them, dump the counts and stop the daemon; the dump's file."""
    mock_port, port = free_port(), free_port()
    data_dir = os.path.join(workdir, f"data-{turns}")
    out = os.path.join(workdir, f"callgrind-{turns}.out")
    mock = subprocess.Popen([keel, "mock-llm", "--port", str(mock_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(
        os.environ,
        KEEL_DATA_DIR=data_dir,
        KEEL_ADDR=f"127.0.0.1:{port}",
        KEEL_TOKEN=TOKEN,
        KEEL_PROVIDER="mock",
        KEEL_MOCK_URL=f"http://127.0.0.1:{mock_port}",
        OPENAI_BASE_URL=f"http://127.0.0.1:{mock_port}/v1",
        OPENAI_API_KEY="fake",
        KEEL_SANDBOX="full-access",
        KEEL_SANDBOX_FULL_ACCESS="allow",
    )
    log = open(os.path.join(workdir, f"daemon-{turns}.log"), "w")
    daemon = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", keel, "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(mock_port, time.monotonic() + 30)
        wait_for_port(port, time.monotonic() + 120)
        client = Daemon(port, provider)
        ids = [client.create() for _ in range(conversations)]
        control(daemon.pid, "-z")
        for index in range(turns):
            client.turn(ids[index % conversations])
        control(daemon.pid, "-d")
    finally:
        daemon.terminate()
        daemon.wait(timeout=120)
        mock.terminate()
        mock.wait(timeout=30)
        log.close()
    dumps = sorted(
        (name for name in os.listdir(workdir) if name.startswith(os.path.basename(out) + ".")),
        key=lambda name: int(name.rsplit(".", 1)[1]),
    )
    if not dumps:
        sys.exit("callgrind wrote no dump")
    return os.path.join(workdir, dumps[-1])


def control(pid, command):
    """Tell the callgrind run `pid` to zero (`-z`) or dump (`-d`) its counts."""
    subprocess.run(["callgrind_control", command, str(pid)], capture_output=True, check=True)


def summary(path):
    with open(path) as lines:
        for line in lines:
            if line.startswith("summary:"):
                return int(line.split()[1])
    sys.exit(f"{path} has no summary line")


def by_function(path):
    output = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts = {}
    for line in output.splitlines():
        match = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(\S.*)$", line)
        if match and "PROGRAM TOTALS" not in line:
            name = re.sub(r"\s*\[[^\]]*\]\s*$", "", match.group(2))
            name = re.sub(r"^(\?\?\?|\S+\.[chS]):", "", name)
            counts[name] = counts.get(name, 0) + int(match.group(1).replace(",", ""))
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keel", default="target/release/keel", help="the keel binary (default: %(default)s)")
    parser.add_argument("--turns", type=int, default=60, help="turns counted (default: %(default)s)")
    parser.add_argument("--conversations", type=int, default=20, help="conversations they are spread over, round robin (default: %(default)s)")
    parser.add_argument("--top", type=int, default=0, help="also print the functions that spent the most, per turn")
    parser.add_argument("--keep", metavar="FILE", help="keep the callgrind dump there, for callgrind_annotate")
    parser.add_argument(
        "--wire",
        choices=["openai", "anthropic"],
        default="openai",
        help="the wire the conversations talk to the fake provider (default: %(default)s)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is needed: apt install valgrind")
    keel = os.path.abspath(args.keel)
    with tempfile.TemporaryDirectory(prefix="keel-instructions-") as workdir:
        # keel's fake provider speaks Anthropic's wire as `mock`.
        provider = "openai" if args.wire == "openai" else "mock"
        counted = counted_run(keel, args.turns, args.conversations, provider, workdir)
        per_turn = summary(counted) / args.turns
        if args.keep:
            shutil.copyfile(counted, args.keep)
        print(
            f"{per_turn / 1e6:.3f} M instructions per client-shaped tool turn "
            f"({args.turns} turns over {args.conversations} conversations, {args.wire} wire, user space of the daemon)"
        )
        if args.top:
            spent = by_function(counted)
            for name, count in sorted(spent.items(), key=lambda item: -item[1])[: args.top]:
                print(f"{count / args.turns:>12,.0f}  {name[:140]}")


if __name__ == "__main__":
    main()
