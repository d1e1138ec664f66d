"""Writes a deterministic application log of about 20 MB for the rlm example.

    python3 examples/rlm/gen_log.py OUT [MEGABYTES]

Six services log requests at INFO, with scattered WARN and unrelated ERROR noise. From
12:40 on, `checkout` starts failing: its calls to `payments-db` time out because the
connection pool is exhausted. The same seed always writes the same bytes.
"""

import random
import sys

SERVICES = ["auth", "search", "checkout", "catalog", "billing", "gateway"]
NOISE = [
    "cache miss storm on key prefix user:",
    "retrying after 503 from recommendations",
    "slow query on orders_by_user (1200ms)",
    "TLS handshake failed from 10.0.3.17",
]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: gen_log.py OUT [MEGABYTES]")
    out, megabytes = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    target = int(megabytes * 1_000_000)
    rng = random.Random(20260101)
    written, line_no = 0, 0
    with open(out, "w", encoding="utf-8") as f:
        while written < target:
            second = line_no // 20  # 20 lines a second
            stamp = f"2026-01-01T{10 + second // 3600 % 14:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z"
            service = SERVICES[rng.randrange(len(SERVICES))]
            roll = rng.random()
            incident = stamp >= "2026-01-01T12:40:00Z" and service == "checkout"
            if incident and roll < 0.3:
                pool = rng.randrange(48, 65)
                line = (f"{stamp} ERROR checkout request={line_no} upstream=payments-db "
                        f"timeout after 5000ms (connection pool exhausted: {pool}/64 in use)")
            elif roll < 0.002:
                line = f"{stamp} ERROR {service} request={line_no} {rng.choice(NOISE)}{rng.randrange(1000)}"
            elif roll < 0.03:
                line = f"{stamp} WARN {service} request={line_no} latency {rng.randrange(300, 900)}ms over budget"
            else:
                line = (f"{stamp} INFO {service} request={line_no} {rng.choice(['GET', 'POST'])} "
                        f"/api/v1/{service}/{rng.randrange(10000)} 200 in {rng.randrange(2, 120)}ms")
            f.write(line + "\n")
            written += len(line) + 1
            line_no += 1


if __name__ == "__main__":
    main()
