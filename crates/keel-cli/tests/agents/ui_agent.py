"""Test agent for agents that render UI: shows one block of each type, asks a question
with a form, then waits for the `contact` form's submission in its mailbox.

It exits with {"answer": <the form question's value>, "submitted": <the ui_form message>}.
"""

from __future__ import annotations

import keel

FORM = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean"},
        "amount": {"type": "integer", "minimum": 1, "maximum": 100},
    },
    "required": ["approve"],
    "additionalProperties": False,
}

with keel.connect() as k:
    k.show_table(["region", "orders"], [["eu", 12], ["us", 30]], title="Orders")
    k.show_chart("bar", ["mon", "tue"], {"orders": [3, 5]}, title="Per day")
    k.show_markdown("**Refund** requested")
    k.show_progress(0.5, label="halfway")
    k.show_form("contact", {"type": "object", "properties": {"email": {"type": "string"}}})
    answer = k.ask("Approve the refund?", form=FORM)
    submitted = k.recv()
    k.show_progress(1.0)
    k.exit({"answer": answer, "submitted": submitted["message"]})
