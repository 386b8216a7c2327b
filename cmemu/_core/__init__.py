"""The native core: the Cython event kernel (``engine``) and its pure-Python reference.

``make_engine(lowered, fabric, native=True)`` is the one way the rest of cmemu builds an engine.
"""


def make_engine(lowered, fabric, native: bool = True, bin_ps: int = 0, record_packets: bool = False,
                record_deliveries: int = -1, drop_inputs: bool = False):
    """An engine over lowered arrays and a fabric: the Cython kernel, or the pure-Python reference.

    ``bin_ps`` > 0 also collects per-link bytes and busy time in bins of that width;
    ``record_packets`` keeps a record of every packet's transmission on every link
    (``engine.packet_records()``; 40 B each: for small runs). ``engine.msg_delivered_ps`` holds
    the delivery times of the first ``record_deliveries`` messages (-1: all of them).
    ``drop_inputs``: the engine cuts the lowering's columns it has its own copy of as it is built
    (the native engine; ``Engine.__init__``), leaving what the results are built from.
    """
    if native:
        from cmemu._core.engine import Engine
    else:
        from cmemu._core.reference import Engine
    if not native:
        engine = Engine(lowered, fabric, bin_ps, record_packets, record_deliveries)
        if drop_inputs:
            lowered.drop_engine_inputs()
        return engine
    return Engine(lowered, fabric, bin_ps, record_packets, record_deliveries, drop_inputs)


def op_message_lists(lowered):
    """The messages each SEND / RECV op carries, as CSR arrays ``(ptr int64[ops + 1], idx int32)``.

    A COMM_SEND op starts the write messages whose ``msg_send_op`` it is, and ends when all of
    them are acknowledged; a COMM_RECV op starts the read messages whose ``msg_recv_op`` it is,
    and ends when all its messages are delivered. Within an op, messages keep their order.
    A counting sort in one kernel (cmemu.lower.passes.message_lists): on the 61-layer decode step's
    60 M messages it needs no temporary beyond the result, and reads the ops of a template's
    copies from the template (Lowered.message_segments).
    """
    import numpy as np

    from cmemu.lower.passes import message_lists
    from cmemu.vocab import OP_KIND_RECV, OP_KIND_SEND

    kind = lowered.op_kind
    ptr, idx = message_lists(kind, lowered.msg_send_op, lowered.msg_recv_op, OP_KIND_SEND, OP_KIND_RECV,
                             lowered.message_segments())
    carried = lowered.op_msg >= 0
    bad = carried & (ptr[1:] == ptr[:-1]) & ((kind == OP_KIND_SEND) | (kind == OP_KIND_RECV))
    if np.any(bad):
        bad = int(np.flatnonzero(bad)[0])
        raise ValueError(f"op {bad} names message {int(lowered.op_msg[bad])}, whose send/recv op is not it")
    return ptr, idx


def hbm_sharing(lowered):
    """Per-die HBM capacity (bytes/s) and each op's HBM demand (bytes/s) for the engine's sharing.

    A COMP or MEM_LOAD / MEM_STORE op with HBM traffic of its own die (``op_hbm_bytes``) and a
    duration demands its bytes over its duration (what it draws when it runs alone, as the die
    model timed it), at most what its cores can move (``op_aic`` x one AIC's MTE2 + FixPipe rate
    + ``op_aiv`` x one AIV's MTE2 + MTE3 rate: ``Lowered.die_aic_move_byte_per_s`` and
    ``die_aiv_move_byte_per_s``; an op without cores, an SDMA transfer or a MEM op, at its own
    rate) and at most the die's capacity. The engine shares each die's capacity among its running
    ops max-min (docs/model.md, "HBM shared between concurrent ops"). Ops of a die with no
    capacity given (0) do not take part (MEM ops then queue FIFO on their die's HBM server).
    """
    import numpy as np

    from cmemu.lower.passes import hbm_demand
    from cmemu.vocab import OP_KIND_COMP, OP_KIND_MEM

    dies = int(lowered.die_aic_cores.shape[0])
    cap = np.zeros(dies, dtype=np.int64)
    given = getattr(lowered, "die_hbm_byte_per_s", None)
    if given is not None and len(given):
        cap[:len(given)] = np.asarray(given, dtype=np.int64)[:dies]
    # At most its die's capacity: alone, an op runs at full speed (the die model's durations
    # already respect the HBM; rounding can put a demand a byte/s above it). The sums of a die's
    # demands stay far inside int64.
    aic_move = getattr(lowered, "die_aic_move_byte_per_s", None)
    aiv_move = getattr(lowered, "die_aiv_move_byte_per_s", None)
    cores = {}
    if aic_move is not None and len(aic_move) and aiv_move is not None and len(aiv_move):
        cores = {"aic": lowered.op_aic, "aiv": lowered.op_aiv, "aic_move": aic_move, "aiv_move": aiv_move}
    rate = hbm_demand(lowered.op_kind, lowered.op_dur_ps, lowered.op_hbm_bytes, lowered.op_rank, cap,
                      (OP_KIND_COMP, OP_KIND_MEM), **cores)
    # An op longer than this alone runs as timed: its target on the engine's share clock (1/1024
    # ps units) would not fit in int64 (no die-model op comes near: 2**50 ps is 19 minutes).
    rate[lowered.op_dur_ps > HBM_MAX_SHARED_PS] = 0
    return cap, rate


HBM_MAX_SHARED_PS = 1 << 50


def merge_link_series(bin_ps: int, rows):
    """The engine's binned link counters, rows of (link, bin, bytes, busy_ps), as sorted COO arrays
    with one row per (link, bin). A link's rows come in bin order on the packet-level fabric; a
    message-level unit may fill a gap in an earlier bin (see Engine.cal_take), which leaves a
    second row for that bin: rows of one (link, bin) are summed."""
    import numpy as np

    key = rows[:, 0] * (int(rows[:, 1].max()) + 1 if rows.shape[0] else 1) + rows[:, 1]
    order = np.argsort(key, kind="stable")
    rows, key = rows[order], key[order]
    if rows.shape[0] > 1:
        new = np.ones(rows.shape[0], dtype=bool)
        new[1:] = key[1:] != key[:-1]
        if not new.all():
            at = np.flatnonzero(new)
            rows = np.column_stack([rows[at, 0], rows[at, 1], np.add.reduceat(rows[:, 2], at),
                                    np.add.reduceat(rows[:, 3], at)])
    return {"bin_ps": int(bin_ps), "link": rows[:, 0].astype(np.int32), "bin": rows[:, 1].astype(np.int32),
            "bytes": rows[:, 2].copy(), "busy_ps": rows[:, 3].copy()}
