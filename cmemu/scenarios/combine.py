"""combine: see cmemu.scenarios.moe_comm."""
from cmemu.scenarios.moe_comm import _command

command = _command("combine", combine=True)
