import time
from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, IndexConfig
from contextpilot_rag.bench.workloads import online_workload
from contextpilot_rag.bench.replay import *
from contextpilot_rag.tokenizers import default_tokenizer
wl = online_workload()
tok = default_tokenizer(); enc = EngineTokenizer(tok)
blocks = {d: ContextBlock(text, id=d) for d, text in wl.corpus.items()}
cap = 1505956
for budget in [1, 2, 4, 8, 16, 64]:
    p = ContextPilot(PilotConfig(index=IndexConfig(capacity_tokens=cap, search_budget=budget)), tokenizer=tok)
    b, prompts = pilot_arm(p, wl, blocks.__getitem__)
    r = replay('x', wl, b, enc, capacity_tokens=cap)
    print(budget, round(r.hit_ratio,4), 'build_ms/req', round(r.build_s/2000*1e3,3))
