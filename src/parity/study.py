"""The study's fixed numbers that every floor reads: the context its engines run with and the new tokens
each prompt asks for. Declared here, below the engines, the traces and the routers, so each of them reads
the one declaration (a trace checks its prompts fit the study's context without importing an engine)."""

OUTPUT_TOKENS = 16  # new tokens per prompt, exactly (EOS ignored): the study's answers
MAX_MODEL_LEN = 32768  # every engine of the study: a prompt plus its answer must fit
VOCAB_LIMIT = 2**31  # token IDs are int32 in the engines (uint32 in trace files): no vocabulary holds more
