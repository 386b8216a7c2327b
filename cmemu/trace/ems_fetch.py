"""The EMS context-cache fetch as ops of a prefill step: a pass over a generated prefill trace.

``add_ems_fetch(doc, cfg, spec, plane)`` takes the document ``prefill_trace`` wrote and adds, for
every request's reused prefix, the reads of its KV blocks from the EMS pool (cmemu.ems) into the
HBM of the dies that serve it, and makes the first layer that needs them wait for them. The
pass changes no op the generator wrote but for the dependencies of the first layer's KV load:
with no reused token it returns the document as it was.

What the fetch is (docs/model.md, "EMS context caching"):

- The pool: the DRAM of every CPU socket of ``pool_nodes`` nodes (default: all), placed by
  consistent hashing (``EMSPool``); a block is ``ems.block_tokens`` tokens of every layer of the
  model (576 B per token and layer in INT8; 1,152 in BF16), keyed by its prefix. Only whole
  blocks are kept, so the reused tokens must be a whole number of blocks (``ems_reuse`` rounds a
  rate down to one). The pool is warm: every request's prefix was put there before the step, in
  request order; blocks evicted to SSD by then (the DRAM per socket, ``ems.dram_gbyte_per_cpu``,
  is full) are read back from their node's SSD first.
- Who reads what: the dies of an attention TP group all need the whole prefix of the group's
  requests (each rebuilds K and V for its heads from the cached latents), so each die reads a
  share of the group's blocks (block b of the group goes to its die b mod TP), then the group
  all-gathers them (ALL_GATHER over UB, SDMA). Each read is a MEM_LOAD from the owning socket
  (``cmemu.src_cpu``), one per (die, micro-batch, socket), each on a stream of its own so that
  the die's DMA engines read from every socket at once: read messages on the fabric over UB
  (``plane="ub"``) or over the VPC plane through the two nodes' DPUs (``plane="vpc"``). The
  socket serves reads from DRAM at ``ub.cpu_memory_read_gbyte_per_s``, one after the other.
- SSD: a node's SSD reads its evicted blocks back into the owner's DRAM one after the other at
  ``ems.ssd_gbyte_per_s_per_node``, all of them requested when the step starts; a read that
  needs such blocks waits for the last of them (a COMP of that fixed time and no cores before it
  on its stream: a schedule worked out here, not an engine resource).
- When: the fetch is issued when the step starts (the scheduler looked the prefix up when it
  batched the request) and is a whole: the first layer's KV load of each micro-batch
  (``L0.mb*.kv_fetch``) waits for the die's all-gather, so layer 0's TP stage starts once the
  whole prefix is in HBM, while its SP stage (the new tokens' projections) runs meanwhile.
"""
from __future__ import annotations

from collections import defaultdict

from cmemu.ems import EMSPool, prefix_keys
from cmemu.errors import CmemuError
from cmemu.workload.deepseek import KV_LORA, LAYERS, QK_ROPE

KV_LATENT = KV_LORA + QK_ROPE  # values per token and layer in the KV cache (docs/machine.md 2.7)

EMS_PLANES = ("ub", "vpc")
EMS_OPS = ("ems_fetch", "ems_gather", "ssd_read")  # the names' last parts (ems.mb0.ems_fetch, ...)


def block_bytes(spec, int8: bool = True) -> int:
    """Bytes of one EMS block: ``ems.block_tokens`` tokens of every layer's KV latents."""
    return spec.ems.block_tokens * KV_LATENT * (1 if int8 else 2) * LAYERS


def ems_reuse(reuse: float, prompt_len: int, block_tokens: int) -> float:
    """The reuse rate rounded down so that the reused tokens are whole blocks (what the pool can
    give: blocks are keyed by their whole prefix), and below the prompt (one token is new)."""
    tokens = min(round(reuse * prompt_len), prompt_len - 1) // block_tokens * block_tokens
    return tokens / prompt_len


def _pool(spec, pool_nodes: int | None, nbytes: int) -> EMSPool:
    nodes = spec.nodes if pool_nodes is None else pool_nodes
    if not 1 <= nodes <= spec.nodes:
        raise CmemuError(f"--pool-nodes {nodes}: {spec.name} has {spec.nodes} nodes")
    try:
        return EMSPool(range(nodes * spec.cpus_per_node), int(spec.ems.dram_gbyte_per_cpu * 1e9), nbytes)
    except ValueError as exc:
        raise CmemuError(f"EMS pool: {exc} (ems.dram_gbyte_per_cpu {spec.ems.dram_gbyte_per_cpu:g} GB, "
                         f"a block is {nbytes:,} B)") from None


def add_ems_fetch(doc: dict, cfg, spec, plane: str = "ub", pool_nodes: int | None = None,
                  layerwise: bool = False) -> dict:
    """The prefill trace ``doc`` (of ``cfg``, a PrefillConfig) with the EMS fetch of every
    request's reused prefix added (module docstring). ``layerwise``: each block is read layer
    by layer (its layer i part, 1/61 of it, for each simulated layer i, in layer order from the
    same socket), gathered per layer, and layer i's KV load waits for layer i's part only.
    Returns a new document."""
    if plane not in EMS_PLANES:
        raise CmemuError(f"--ems-plane must be one of {', '.join(EMS_PLANES)}, got {plane!r}")
    reused = cfg.reused_tokens
    bt = spec.ems.block_tokens
    if reused == 0:
        return doc
    if reused % bt:
        raise CmemuError(f"EMS context cache: {reused} reused tokens per prompt is not a whole number of "
                         f"{bt}-token blocks (the pool keeps whole blocks); use a reuse rate of k x {bt} / "
                         f"{cfg.prompt_len}")
    nbytes = block_bytes(spec, cfg.int8)
    pool = _pool(spec, pool_nodes, nbytes)
    G, r_g = cfg.attn_tp, cfg.requests_per_group
    requests = [(mb, g, q) for mb in range(cfg.micro_batches) for g in range(cfg.tp_groups) for q in range(r_g)]
    keys = {req: prefix_keys("r{}.{}.{}".format(*req), reused, bt) for req in requests}
    for req in requests:  # warm: every prefix was seen before the step
        for k in keys[req]:
            pool.put(k)
    # Where each die reads its blocks from: (die, mb) -> socket -> [DRAM blocks, SSD blocks].
    reads = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for mb in range(cfg.micro_batches):
        for g in range(cfg.tp_groups):
            blocks = [k for q in range(r_g) for k in keys[(mb, g, q)]]
            for b, key in enumerate(blocks):
                where = pool.get(key)
                if where == "miss":  # cannot happen in a warm pool: every block was put
                    raise AssertionError(f"EMS block {key} is not in the pool")
                reads[(g * G + b % G, mb)][pool.owner(key)][where == "ssd"] += 1
    ssd_rate = spec.ems.ssd_gbyte_per_s_per_node * 1e9
    ssd_busy_ns = defaultdict(float)  # node -> when its SSD is done with what was asked so far
    nodes: list[dict] = []
    next_id = max((n["id"] for n in doc["nodes"]), default=-1) + 1
    gather = {}
    stream0 = 2 * cfg.micro_batches  # after the generator's compute and copy streams
    streams = defaultdict(int)  # die -> fetch streams so far
    for (die, mb), sockets in sorted(reads.items()):
        tag = f"ems.mb{mb}"
        loads = []
        for cpu, (dram, ssd) in sorted(sockets.items()):
            stream = stream0 + streams[die]
            streams[die] += 1
            deps = []
            if ssd:
                node = cpu // spec.cpus_per_node
                ssd_busy_ns[node] += ssd * nbytes / ssd_rate * 1e9
                nodes.append({"id": next_id, "name": f"{tag}.ssd_read", "type": "COMP", "rank": die, "stream": stream,
                              "attrs": {"cmemu.duration_ns": round(ssd_busy_ns[node], 3)}})
                deps.append(next_id)
                next_id += 1
            parts = range(cfg.layers) if layerwise else [None]
            for layer in parts:
                size = (dram + ssd) * nbytes // (LAYERS if layerwise else 1)
                name = f"{tag}.ems_fetch" if layer is None else f"{tag}.L{layer}.ems_fetch"
                node = {"id": next_id, "name": name, "type": "MEM_LOAD", "rank": die, "stream": stream,
                        "attrs": {"tensor_size": size, "cmemu.src_cpu": cpu, "cmemu.plane": plane}}
                if deps:
                    node["data_deps"] = deps
                    deps = []
                nodes.append(node)
                loads.append((layer, next_id))
                next_id += 1
        gather[(die, mb)] = loads
    # Every die of a group contributes the same bytes to the all-gather: the largest share.
    share = defaultdict(int)
    for (die, mb), sockets in reads.items():
        mine = sum(d + s for d, s in sockets.values()) * nbytes // (LAYERS if layerwise else 1)
        share[(die // G, mb)] = max(share[(die // G, mb)], mine)
    first_load = {}
    for mb in range(cfg.micro_batches):
        for layer in (range(cfg.layers) if layerwise else [None]):
            for die in range(cfg.ep):
                if layer is None:  # the micro-batch's copy stream, first
                    name, stream = f"ems.mb{mb}.ems_gather", stream0 - cfg.micro_batches + mb
                else:  # a stream of its own, so that layer i's load waits for layer i's part alone
                    name, stream = f"ems.mb{mb}.L{layer}.ems_gather", 2**20 + mb * cfg.layers + layer
                node = {"id": next_id, "name": name, "type": "COMM_COLL", "rank": die, "stream": stream,
                        "attrs": {"comm_type": "ALL_GATHER", "cmemu.group": f"tp{die // G}",
                                  "comm_size": share[(die // G, mb)], "cmemu.engine": "sdma"}}
                mine = [i for part, i in gather.get((die, mb), []) if part == layer]
                if mine:
                    node["data_deps"] = mine
                nodes.append(node)
                first_load[(die, f"L{layer or 0}.mb{mb}.kv_fetch")] = next_id
                next_id += 1
    rest = []
    for n in doc["nodes"]:
        dep = first_load.get((n["rank"], n["name"]))
        if dep is not None:
            n = {**n, "data_deps": [*n.get("data_deps", []), dep]}
        rest.append(n)
    out = dict(doc)
    out["nodes"] = nodes + rest
    out["description"] = doc.get("description", "") + f", EMS fetch over {plane.upper()}" + (
        " layer by layer" if layerwise else "")
    gen = dict(doc.get("cmemu.generator", {}))
    gen["ems"] = {"plane": plane, "fetch": "layerwise" if layerwise else "whole",
                  "pool_nodes": spec.nodes if pool_nodes is None else pool_nodes,
                  "block_tokens": bt, "block_bytes": nbytes, "blocks": sum(len(v) for v in keys.values()),
                  "ssd_blocks": sum(s for socks in reads.values() for _, s in socks.values())}
    out["cmemu.generator"] = gen
    return out


def prefill_step(cfg, spec, ems_plane: str = "ub", pool_nodes: int | None = None, kv_transfer: bool = False,
                 decode_dp: int = 320, layerwise: bool = False):
    """One prefill step's trace: ``prefill_trace`` of ``cfg``, then with a context-cache hit the
    EMS fetch over ``ems_plane`` ("ub" or "vpc"; "hbm": the reused KV is in the die's HBM already,
    no fetch; ``layerwise``: read layer by layer), and with ``kv_transfer`` every request's KV sent to its decode die over RDMA
    (cmemu.trace.kv_transfer). With EMS the reuse rate is rounded down to whole blocks
    (``ems_reuse``). Returns (the PrefillConfig used, the document)."""
    import dataclasses

    from cmemu.trace.deepseek import prefill_trace
    from cmemu.trace.kv_transfer import add_kv_transfer

    if ems_plane not in (*EMS_PLANES, "hbm"):
        raise CmemuError(f"--ems-plane must be one of ub, vpc, hbm; got {ems_plane!r}")
    if ems_plane != "hbm" and cfg.reuse:
        cfg = dataclasses.replace(cfg, reuse=ems_reuse(cfg.reuse, cfg.prompt_len, spec.ems.block_tokens))
    doc = prefill_trace(cfg, spec.name, spec.dies)
    if ems_plane != "hbm":
        doc = add_ems_fetch(doc, cfg, spec, ems_plane, pool_nodes, layerwise)
    if kv_transfer:
        doc = add_kv_transfer(doc, cfg, spec.dies, decode_dp)
    return cfg, doc
