import time, collections
from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, IndexConfig
from contextpilot_rag.index import tree
from contextpilot_rag.bench.workloads import online_workload
cnt = collections.Counter()
orig = tree.ContextIndex._candidates
def c(node, rem):
    cnt['exp'] += 1; r = orig(node, rem); cnt['cands'] += len(r); return r
tree.ContextIndex._candidates = staticmethod(c)
wl = online_workload(n_requests=6000)
blocks = {d: ContextBlock(text, id=d) for d, text in wl.corpus.items()}
p = ContextPilot(PilotConfig(index=IndexConfig(capacity_tokens=1_500_000)))
reqs = [[blocks[d] for d in r.doc_ids] for r in wl.requests]
for b, r in zip(reqs[:3000], wl.requests): p.optimize(b, r.query, system=wl.system_prompt)
cnt.clear()
ms = collections.Counter()
for b, r in zip(reqs[3000:], wl.requests[3000:]):
    pr = p.optimize(b, r.query, system=wl.system_prompt); ms[pr.stats.blocks_matched] += 1
print({k: v/3000 for k, v in cnt.items()}, sorted(ms.items()))
print(p.index_stats())
