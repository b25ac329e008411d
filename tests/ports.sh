# ports.sh - sourced by shell tests: free_ports N prints the first of N
# consecutive TCP ports on 127.0.0.1 that could all be bound a moment
# ago (a cluster takes a client, a control and metrics ports in a row).
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randint(20000, 60000 - n)
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
