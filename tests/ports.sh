# ports.sh - sourced by shell tests: free_ports N prints the first of N
# consecutive TCP ports on 127.0.0.1 that could all be bound a moment
# ago (a cluster takes a client, a control and metrics ports in a row).
free_ports() {
  python3 "$(dirname "${BASH_SOURCE[0]}")/free_ports.py" "$1"
}
