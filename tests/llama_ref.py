"""llama.cpp (llama-cpp-python) as the end-to-end reference of the engine tests."""
import numpy as np


def llama_greedy(llm, prompt_ids, n):
    """llama.cpp's greedy continuation of prompt_ids by n tokens, and its logits at every
    position of prompt + continuation: (ids, float32[len(ids), vocab])."""
    llm.reset()
    llm.eval(prompt_ids)
    ids = list(prompt_ids)
    for _ in range(n):
        tok = int(np.argmax(llm.scores[len(ids) - 1]))
        ids.append(tok)
        llm.eval([tok])
    return ids, np.array(llm.scores[: len(ids)])
