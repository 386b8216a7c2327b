"""Workload models shared by the trace generators (cmemu.trace) and the lowering (cmemu.lower):
the MoE routing and payloads (``moe``) and DeepSeek-R1's shapes (``deepseek``). Below both in
the layers (tests/test_layers.py)."""
