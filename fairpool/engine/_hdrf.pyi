# The compiled float backend (_hdrf.c); see _Update._solve_compiled in fairshare.py.
from typing_extensions import Buffer

def update(
    size: int,
    kinds: Buffer,
    child_start: Buffer,
    child_count: Buffer,
    children: Buffer,
    weights: Buffer,
    usage: list[tuple[int, ...]],
    demand: list[tuple[int, ...]],
    limits: list[tuple[float, ...]],
    guarantees: list[tuple[float, ...]],
    dens: tuple[int, ...],
    /,
) -> bytes: ...
