# ports.sh - sourced by shell tests: free_ports N prints the first of N
# consecutive TCP ports on 127.0.0.1 that could all be bound a moment
# ago (a cluster takes a client, a control and metrics ports in a row).
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
# below the kernel's ephemeral range: a neighbour test's outgoing
# connection cannot take the port before our process binds it
try:
    eph_lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    eph_lo = 32768
lo, hi = (10000, eph_lo - n - 1) if eph_lo >= 12000 else (20000, 50000 - n)
for _ in range(200):
    base = random.randint(lo, hi)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks: s.close()
    print(base); sys.exit(0)
sys.exit(1)
PY
}
