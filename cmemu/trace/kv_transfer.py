"""The prefill -> decode KV-cache transfer as ops of a prefill step: a pass over a prefill trace.

``add_kv_transfer(doc, cfg, dies, decode_dp)`` adds, after each request's last layer, its KV
cache written from one die of its attention TP group to its decode die over the RDMA plane
(docs/machine.md 2.8, [CM] 4.3.3). Decode runs attention data-parallel over ``decode_dp`` dies (TP 1),
placed on the dies after the prefill group's (die ``cfg.ep + d`` for DP rank d, wrapping round
the system when it has fewer). Requests go to decode DP ranks in order (request k of the step to
rank k mod decode_dp), and the paper's mapping picks the prefill TP rank that sends: with
ratio = prefill_tp / decode_tp and group_size = decode_dp / ratio, DP rank d gets its KV from
prefill TP rank (d // group_size) x decode_tp + d's TP rank (0).

A request's KV is its prompt's latents (576 B per token and layer in INT8) of the layers the
trace simulates; each die of the group holds all of it after the last layer's attention, so the
send waits for that die's last attention op of the request's micro-batch. Sends are COMM_SEND /
COMM_RECV pairs (``cmemu.plane`` "rdma"), each on a stream of its own on each side (they run at once), named
``kv.rN.kv_send`` / ``kv.rN.kv_recv``; the receive ends when the KV is in the decode die's HBM.
"""
from __future__ import annotations

from collections import defaultdict

from cmemu.errors import CmemuError

KV_TRANSFER_OPS = ("kv_send", "kv_recv")


def decode_die(cfg, dies: int, decode_dp: int, d: int) -> int:
    """The die of decode DP rank d: after the prefill group's dies, wrapping round the system."""
    return (cfg.ep + d) % dies


def sender_tp_rank(prefill_tp: int, decode_dp: int, d: int, decode_tp: int = 1) -> int:
    """[CM] 4.3.3: the prefill TP rank that sends decode DP rank d its KV cache."""
    ratio = max(1, prefill_tp // decode_tp)
    group_size = max(1, decode_dp // ratio)
    return min((d // group_size) * decode_tp, prefill_tp - 1)


def add_kv_transfer(doc: dict, cfg, dies: int, decode_dp: int = 320) -> dict:
    """The prefill trace ``doc`` (of ``cfg``) with every request's KV sent to its decode die."""
    if decode_dp < 1:
        raise CmemuError(f"--decode-dp must be at least 1, got {decode_dp}")
    if dies <= cfg.ep:
        raise CmemuError(f"--kv-transfer: the system's {dies} dies leave none for decode after the prefill "
                         f"group's {cfg.ep}")
    last = cfg.layers - 1
    # The last attention op of each (die, micro-batch) in the last layer, in file order: one per
    # request of the group (cmemu.trace.deepseek writes them request after request).
    attention = defaultdict(list)
    for n in doc["nodes"]:
        if n["name"].startswith(f"L{last}.mb") and n["name"].endswith(".attention"):
            attention[(n["rank"], int(n["name"].split(".")[1][2:]))].append(n["id"])
    next_id = max((n["id"] for n in doc["nodes"]), default=-1) + 1
    nbytes = cfg.prompt_len * cfg.kv_byte_per_token_layer * cfg.layers
    stream = 2 * cfg.micro_batches + 10_000  # clear of the generator's and the EMS fetch's streams
    G, r_g = cfg.attn_tp, cfg.requests_per_group
    added, k = [], 0
    for mb in range(cfg.micro_batches):
        for g in range(cfg.tp_groups):
            for q in range(r_g):
                d = k % decode_dp
                src = g * G + sender_tp_rank(G, decode_dp, d)
                dst = decode_die(cfg, dies, decode_dp, d)
                if dst == src:
                    raise CmemuError(f"--kv-transfer: decode die {dst} is prefill die {src}; use a system with more dies")
                after = attention[(src, mb)][q]
                attrs = {"comm_size": nbytes, "comm_tag": k, "cmemu.plane": "rdma"}
                added.append({"id": next_id, "name": f"kv.r{k}.kv_send", "type": "COMM_SEND", "rank": src,
                              "stream": stream + k, "data_deps": [after], "attrs": {"comm_dst": dst, **attrs}})
                added.append({"id": next_id + 1, "name": f"kv.r{k}.kv_recv", "type": "COMM_RECV", "rank": dst,
                              "stream": stream + k, "attrs": {"comm_src": src, **attrs}})
                next_id += 2
                k += 1
    out = dict(doc)
    out["nodes"] = doc["nodes"] + added
    gen = dict(doc.get("cmemu.generator", {}))
    gen["kv_transfer"] = {"decode_dp": decode_dp, "bytes_per_request": nbytes, "plane": "rdma"}
    out["cmemu.generator"] = gen
    out["description"] = doc.get("description", "") + f", KV to {decode_dp} decode dies over RDMA"
    return out
