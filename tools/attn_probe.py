"""Time verify_attn_partial and verify_attn_merge separately on a few shapes (development probe)."""
import statistics
import numpy as np, torch
import driverlevel as dl
from driverlevel.verify_attention import VerifyAttention, VerifyMetadata, TileConfig
from driverlevel.reference.trees import build_mask, random_tree

dev = dl.Device(0); st = dev.create_stream()
def probe(heads, bs, prefix, ntok, splits, tile=None):
    rng = np.random.default_rng(0)
    num_slots = bs * (prefix + ntok) + 64
    kv = torch.randn(num_slots, 576, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs * ntok, heads, 576, dtype=torch.bfloat16, device="cuda")
    perm = torch.randperm(num_slots, device="cuda")
    meta = VerifyMetadata(torch.arange(bs + 1, device="cuda") * ntok, (torch.arange(bs + 1, device="cuda") * prefix).to(torch.int32),
                          perm[: bs * prefix].contiguous(), perm[bs * prefix: bs * prefix + bs * ntok].contiguous())
    plan = VerifyAttention(dev, heads, max_batch=bs, max_q=ntok, num_splits=splits, mask_format="bitmask", tile=tile)
    m, _ = build_mask([random_tree(ntok, rng) for _ in range(bs)], [prefix] * bs, "bitmask", words_per_token=plan.mask_words)
    meta.custom_mask = torch.from_numpy(m.view(np.int32)).cuda()
    out = torch.empty(bs * ntok, heads, 512, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    plan.run(st, q, kv, meta, out); st.synchronize()
    ev = [dev.create_event() for _ in range(3)]
    tp, tm = [], []
    for _ in range(7):
        ev[0].record(st); plan._launches[0].launch(st); ev[1].record(st)
        if len(plan._launches) > 1: plan._launches[1].launch(st)
        ev[2].record(st); ev[2].synchronize()
        tp.append(ev[0].elapsed_ms(ev[1])); tm.append(ev[1].elapsed_ms(ev[2]))
    p, mm = statistics.median(tp), statistics.median(tm)
    flop = 2.0 * bs * ntok * heads * (prefix + ntok) * 1088
    print(f"h{heads} bs{bs} p{prefix} t{ntok} s{splits} tile={plan.config.rows}x{plan.config.keys}x{plan.config.csplit}x{plan.config.stages} "
          f"partial {p:.3f} ms merge {mm:.3f} ms  {flop/(p+mm)/1e9:.0f} TFLOP/s", flush=True)

CFGS = [None, TileConfig(64, 2, 32, 2), TileConfig(48, 2, 32, 2), TileConfig(32, 4, 16, 2), TileConfig(32, 4, 16, 3)]
for shape in [(16, 8, 32768, 256, 1), (9, 1, 200000, 16, 44), (9, 1, 32768, 16, 43), (9, 8, 32768, 64, 9)]:
    for t in CFGS:
        try:
            probe(*shape, tile=t)
        except Exception as e:
            print(t, "ERR", str(e)[:300])
