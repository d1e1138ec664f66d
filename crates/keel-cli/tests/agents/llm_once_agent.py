"""Makes one LLM call (the model is the run's, `keel run --model`) and exits with the reply."""

import keel

k = keel.connect()
prompt = keel.input({}).get("prompt", "hello")
reply = k.llm_chat([{"role": "user", "content": prompt}], max_tokens=5)
k.exit({"reply": reply["message"]["content"]})
