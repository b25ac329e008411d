"""free_ports.py - test ports on 127.0.0.1, picked below the kernel's
ephemeral range: there an outgoing connection of a test running beside
ours could take a checked port before our process binds it (CI,
2026-12-03/05: "Address already in use").  Imported by the Python tests;
`python3 free_ports.py N` prints the first of N consecutive free ports
(tests/ports.sh).  cluster_util.h's cu_free_port is the C twin."""
import random
import socket
import sys


def free_ports(n=1):
    """The first of n consecutive ports that could all be bound a moment
    ago."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            eph_lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        eph_lo = 32768
    lo, hi = (10000, eph_lo - n - 1) if eph_lo >= 12000 else (20000, 50000 - n)
    for _ in range(200):
        base = random.randint(lo, hi)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no %d free ports in a row" % n)


if __name__ == "__main__":
    try:
        print(free_ports(int(sys.argv[1]) if len(sys.argv) > 1 else 1))
    except RuntimeError:
        sys.exit(1)
