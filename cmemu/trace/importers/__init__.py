"""Converters from other trace formats to cmemu's IR: Ascend profiler output, Chakra execution traces."""
