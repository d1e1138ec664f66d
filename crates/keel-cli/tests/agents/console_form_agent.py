"""Test agent for the web console's forms: shows a markdown block and a table, then asks
a question with a form (a JSON schema) and exits with the structured answer.

Output: {"answer": {...the form's value...}}.
"""

from __future__ import annotations

import keel

FORM = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "enum": ["eu", "us"]},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 9},
        "canary": {"type": "boolean"},
        "note": {"type": "string"},
    },
    "required": ["region", "replicas"],
}

with keel.connect() as k:
    k.show_markdown("# Deploy plan\n\n- **build** done\n- `tests` green\n\n<script>alert(1)</script>")
    k.show_table(["step", "minutes"], [["build", 3], ["test", 5]], title="Steps")
    answer = k.ask("Where to deploy?", form=FORM)
    k.exit({"answer": answer})
