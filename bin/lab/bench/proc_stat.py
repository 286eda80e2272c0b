"""What the bench scripts beside this one read of a process from /proc and
`ss`: who listens on a port, and a process's CPU time. Imported by them
(`python3 bin/lab/bench/NAME.py` puts this directory on the path)."""

import os
import subprocess


def pid_listening(port):
    """The pid of the process listening on TCP `port` (exits if none)."""
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    for part in out.split("pid=")[1:]:
        return int(part.split(",")[0])
    raise SystemExit(f"no process listens on port {port}")


def cpu_seconds(pid):
    """The CPU time (user + system) of process `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
