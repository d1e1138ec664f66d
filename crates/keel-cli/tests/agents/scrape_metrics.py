"""Test helper (not an agent): scrapes a kernel's `GET /metrics` over real HTTP and parses
it with the Prometheus project's Python client, the way a Prometheus server would read it.

Usage: scrape_metrics.py URL [TOKEN]

Prints one JSON object: {"status": HTTP status, "content_type": ..., "body": text (on an
error), "families": [{"name", "type", "help", "samples": [{"name", "labels", "value"}]}],
"openmetrics": {"content_type": ..., "families": [names]}}.

It scrapes twice, as the two kinds of scrapers do: without an `Accept` header (the
Prometheus text format), parsed by `prometheus_client.parser.text_string_to_metric_families`,
which gives the families above; and asking for OpenMetrics as Prometheus does, parsed by
the strict OpenMetrics parser (which also checks the `# EOF` end, names, units and
histogram buckets). A parse failure fails the script.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families


def get(url: str, accept: str | None) -> tuple[int, str, str]:
    request = urllib.request.Request(url)
    if len(sys.argv) > 2:
        request.add_header("Authorization", f"Bearer {sys.argv[2]}")
    if accept:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def main() -> int:
    url = sys.argv[1]
    status, content_type, text = get(url, None)
    if status != 200:
        print(json.dumps({"status": status, "content_type": content_type, "body": text, "families": []}))
        return 0
    # What Prometheus sends: OpenMetrics first.
    om_status, om_type, om_text = get(url, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
    assert om_status == 200, (om_status, om_text)
    strict = [family.name for family in openmetrics_families(om_text)]
    families = []
    for family in text_string_to_metric_families(text):
        families.append({
            "name": family.name,
            "type": family.type,
            "help": family.documentation,
            "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in family.samples],
        })
    print(json.dumps({"status": status, "content_type": content_type, "families": families,
                      "openmetrics": {"content_type": om_type, "families": strict}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
