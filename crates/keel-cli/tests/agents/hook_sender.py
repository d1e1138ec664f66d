"""A webhook sender, as GitHub, Stripe or a CI system signs: HMAC-SHA256 computed here with
Python's own hmac module (not Keel's), sent over a plain HTTP connection.

    hook_sender.py ADDR NAME SCHEME SECRET BODY [key=value ...]

SCHEME is github, stripe, hmac-sha256 or none (unsigned). Options: delivery=ID (GitHub's
X-GitHub-Delivery, else Idempotency-Key), event=TYPE (X-GitHub-Event), header=NAME
(hmac-sha256's header), t=SECS (Stripe's signed time, default now), tamper=1 (sign one
body, send another), content_type=TYPE, size=N (a body of N bytes instead of BODY).
Prints one JSON line: {"status": ..., "body": ...}.
"""

import hashlib
import hmac
import http.client
import json
import sys
import time


def main():
    addr, name, scheme, secret, body = sys.argv[1:6]
    opts = dict(arg.split("=", 1) for arg in sys.argv[6:])
    payload = (b"x" * int(opts["size"])) if "size" in opts else body.encode()
    key = secret.encode()
    headers = {"Content-Type": opts.get("content_type", "application/json"), "User-Agent": "hook-sender"}
    signed = payload + (b"tampered" if opts.get("tamper") else b"")
    if scheme == "github":
        headers["X-Hub-Signature-256"] = "sha256=" + hmac.new(key, signed, hashlib.sha256).hexdigest()
        if "delivery" in opts:
            headers["X-GitHub-Delivery"] = opts["delivery"]
        headers["X-GitHub-Event"] = opts.get("event", "push")
    elif scheme == "stripe":
        t = opts.get("t", str(int(time.time())))
        v1 = hmac.new(key, t.encode() + b"." + signed, hashlib.sha256).hexdigest()
        headers["Stripe-Signature"] = f"t={t},v1={v1}"
    elif scheme == "hmac-sha256":
        headers[opts.get("header", "X-Keel-Signature")] = hmac.new(key, signed, hashlib.sha256).hexdigest()
    if scheme != "github" and "delivery" in opts:
        headers["Idempotency-Key"] = opts["delivery"]
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", f"/v1/hooks/{name}", body=payload, headers=headers)
    response = conn.getresponse()
    text = response.read().decode("utf-8", "replace")
    try:
        answer = json.loads(text)
    except ValueError:
        answer = text
    print(json.dumps({"status": response.status, "body": answer}))


if __name__ == "__main__":
    main()
