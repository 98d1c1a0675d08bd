import time
from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, IndexConfig
from contextpilot_rag.bench.workloads import online_workload
wl = online_workload(n_requests=6000)
blocks = {d: ContextBlock(text, id=d) for d, text in wl.corpus.items()}
p = ContextPilot(PilotConfig(index=IndexConfig(capacity_tokens=1_500_000)))
reqs = [[blocks[d] for d in r.doc_ids] for r in wl.requests]
for b, r in zip(reqs[:3000], wl.requests): p.optimize(b, r.query, system=wl.system_prompt)
ix = p._index
fixed = (p._system_key(wl.system_prompt),)
toks = {d: p._registry._entries[d].tokens for d in wl.corpus if d in p._registry._entries}
qs = [[b.id for b in bs] for bs in reqs[3000:]]
qs = [[i for i in q if i in toks] for q in qs]
for rep in range(2):
    t=time.perf_counter(); tot=0
    for q in qs: tot += ix.search(q, fixed_prefix=fixed, token_counts=toks).tokens
    print('search us', (time.perf_counter()-t)/len(qs)*1e6, tot)
import cProfile, pstats
pr=cProfile.Profile(); pr.enable()
for q in qs: ix.search(q, fixed_prefix=fixed, token_counts=toks)
pr.disable(); pstats.Stats(pr).sort_stats('tottime').print_stats(10)
