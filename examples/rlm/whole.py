# The naive alternative to rlm.py: the whole log in one prompt. The run's budget refuses
# it before anything is sent, since its input alone is more than the whole budget.
llm("Question: " + question + "\nThe log:\n" + log, max_tokens=300)
