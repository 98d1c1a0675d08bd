import cProfile, pstats, time, sys
from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, IndexConfig
from contextpilot_rag.bench.workloads import online_workload
wl = online_workload(n_requests=6000)
blocks = {d: ContextBlock(text, id=d) for d, text in wl.corpus.items()}
p = ContextPilot(PilotConfig(index=IndexConfig(capacity_tokens=1_500_000)))
reqs = [[blocks[d] for d in r.doc_ids] for r in wl.requests]
for b, r in zip(reqs[:3000], wl.requests): p.optimize(b, r.query, system=wl.system_prompt)
ts=[]
prof = len(sys.argv) > 1
pr = cProfile.Profile()
if prof: pr.enable()
for b, r in zip(reqs[3000:], wl.requests[3000:]):
    t=time.perf_counter(); p.optimize(b, r.query, system=wl.system_prompt); ts.append(time.perf_counter()-t)
pr.disable()
ts.sort(); print('median ms', ts[len(ts)//2]*1e3)
if prof: pstats.Stats(pr).sort_stats('tottime').print_stats(14)
