import sys
from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, IndexConfig
from contextpilot_rag.bench.workloads import online_workload
from contextpilot_rag.bench.replay import *
from contextpilot_rag.tokenizers import default_tokenizer
wl = online_workload()
tok = default_tokenizer(); enc = EngineTokenizer(tok)
blocks = {d: ContextBlock(text, id=d) for d, text in wl.corpus.items()}
cap = 1505956
for src in ['registry', 'index']:
  for budget in [8, 16]:
    p = ContextPilot(PilotConfig(index=IndexConfig(capacity_tokens=cap, search_budget=budget)), tokenizer=tok)
    if src == 'index': p._registry.popularity = p._index.popularity
    b, prompts = pilot_arm(p, wl, blocks.__getitem__)
    r = replay('x', wl, b, enc, capacity_tokens=cap)
    print(src, budget, round(r.hit_ratio,4))
