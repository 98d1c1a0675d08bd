import time, functools, collections
from contextpilot_rag import ContextBlock, ContextPilot, PilotConfig, IndexConfig
from contextpilot_rag import pilot as pm, blocks as bm
from contextpilot_rag.index import tree
from contextpilot_rag.bench.workloads import online_workload
acc = collections.Counter()
def timed(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter_ns(); r = f(*a, **k); acc[label] += time.perf_counter_ns() - t; return r
    setattr(obj, name, w)
for n in ['_match','_reorder','_notes','_render','_turn','_fixed_prefix','_load_conversation','_deduplicate','_commit','_count_tail']:
    timed(pm.ContextPilot, n, n)
timed(bm.BlockRegistry, 'resolve', 'resolve')
timed(pm, 'validate_blocks', 'validate')
timed(pm, 'reorder_for_prefix', 'reorder_fn')
timed(pm.ContextPilot, '_plan', 'PLAN')
timed(pm.ContextPilot, 'optimize', 'TOTAL')
timed(tree.ContextIndex, 'insert', 'insert')
wl = online_workload(n_requests=6000)
blocks = {d: ContextBlock(text, id=d) for d, text in wl.corpus.items()}
p = ContextPilot(PilotConfig(index=IndexConfig(capacity_tokens=1_500_000)))
reqs = [[blocks[d] for d in r.doc_ids] for r in wl.requests]
for b, r in zip(reqs[:3000], wl.requests): p.optimize(b, r.query, system=wl.system_prompt)
acc.clear()
for b, r in zip(reqs[3000:], wl.requests[3000:]): p.optimize(b, r.query, system=wl.system_prompt)
for k, v in acc.most_common(): print(f'{k:20s} {v/3000/1000:.1f} us')
