"""Calls hosts through the egress proxy of an `allowlist` sandbox and reports what it saw.

Usage: egress_credentials.py HTTPS_URL HTTP_URL BLIND_HOST BLIND_PORT REVERSED_NEEDLE

- HTTPS_URL / HTTP_URL: a host the kernel injects a credential for; the agent sends its
  own (fake) Authorization header, which the proxy must replace.
- BLIND_HOST:BLIND_PORT: a host without a credential; the agent opens the CONNECT tunnel
  by hand and reports the certificate it got (the real server's, if the tunnel is blind).
- REVERSED_NEEDLE: the kernel's secret, reversed (so this program's own command line does
  not hold it); the agent searches its environment and files for it.

Prints one JSON line.
"""

import binascii
import json
import os
import socket
import ssl
import sys
import urllib.parse
import urllib.request


def fetch(url):
    request = urllib.request.Request(url, headers={"Authorization": "agent-fake"})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return {"status": response.status, "body": response.read().decode()}
    except Exception as err:  # reported, asserted on by the test
        return {"error": repr(err)}


def blind(host, port):
    proxy = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
    raw = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
    raw.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = raw.recv(1)
        if not chunk:
            return {"error": "proxy closed", "reply": reply.decode(errors="replace")}
        reply += chunk
    if b" 200 " not in reply.split(b"\r\n")[0]:
        return {"error": reply.decode(errors="replace")}
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    tls = context.wrap_socket(raw, server_hostname=host)
    der = tls.getpeercert(binary_form=True)
    tls.sendall(
        f"GET /blind HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: agent-own\r\nConnection: close\r\n\r\n".encode()
    )
    response = b""
    while True:
        chunk = tls.recv(65536)
        if not chunk:
            break
        response += chunk
    return {"cert": binascii.hexlify(der).decode(), "response": response.decode(errors="replace")}


def search(needle):
    """Paths (and environment) where the secret is visible."""
    found = []
    if any(needle in f"{k}={v}" for k, v in os.environ.items()):
        found.append("environ")
    for root in ["/run", "/tmp", "/workspace", "/etc", "/proc/self/environ", "/proc/1/environ"]:
        paths = [root] if os.path.isfile(root) else [
            os.path.join(d, f) for d, _, files in os.walk(root) for f in files
        ]
        for path in paths:
            try:
                if os.path.getsize(path) > 4 << 20:
                    continue
                with open(path, "rb") as handle:
                    if needle.encode() in handle.read():
                        found.append(path)
            except OSError:
                pass
    return found


def main():
    https_url, http_url, blind_host, blind_port, reversed_needle = sys.argv[1:6]
    needle = reversed_needle[::-1]
    report = {
        "https": fetch(https_url),
        "http": fetch(http_url),
        "blind": blind(blind_host, int(blind_port)),
        "secret_seen_in": search(needle),
        "env": {k: os.environ.get(k) for k in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"]},
        "bundle_has_keel_ca": "Keel egress proxy CA" in open(os.environ.get("SSL_CERT_FILE", "/dev/null")).read(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
