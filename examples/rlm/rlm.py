# The program of the rlm example, for `keel exec` (the `python` language, monty). `log`
# (the whole file, a string) and `question` are inputs. Only the ERROR lines reach the
# model: plain code filters and counts, `llm_batch` summarises chunks of them
# concurrently, and one `llm` call answers the question from the summaries.

CHUNK_LINES = 200

errors = []
per_service = {}
for line in log.split("\n"):
    if " ERROR " in line:
        errors.append(line)
        service = line.split(" ")[2]
        per_service[service] = per_service.get(service, 0) + 1

chunks = ["\n".join(errors[i:i + CHUNK_LINES]) for i in range(0, len(errors), CHUNK_LINES)]
summaries = llm_batch(
    ["Summarise the errors in these log lines: which service, what failed, since when.\n" + chunk
     for chunk in chunks],
    system="You read application logs. Answer in one or two sentences.",
    max_tokens=200,
)
counts = ", ".join(f"{name}: {count}" for name, count in sorted(per_service.items()))
answer = llm(
    "Question: " + question + "\nERROR lines per service: " + counts
    + "\nSummaries of the ERROR lines, in time order:\n"
    + "\n".join(f"{i + 1}. {s}" for i, s in enumerate(summaries)),
    system="You are an on-call engineer. Answer the question from the evidence given.",
    max_tokens=300,
)
{"answer": answer, "lines": log.count("\n"), "error_lines": len(errors), "chunks": len(chunks),
 "per_service": per_service}
