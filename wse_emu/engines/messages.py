"""The message table both engines consume.

A message is ``length`` wavelets (32 bits each) from PE ``src`` to PE ``dst`` on virtual channel
(color) ``vc``, routed dimension-ordered: along x first, then along y (y grows southward).
A ``UNICAST`` message is delivered at ``dst`` only; a ``LINE`` message (a multicast along its
path, as a static color route with a ramp tap at every router) is delivered at every router of
its path after the source. PEs are numbered ``y * width + x``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UNICAST = 0
LINE = 1

# Router ports. Directions first so that a port index doubles as a link direction.
NORTH, EAST, SOUTH, WEST, RAMP = 0, 1, 2, 3, 4
PORTS = 5


@dataclass
class Messages:
    """Columns of the message table (int64 arrays of equal length)."""

    t_ready: np.ndarray  # cycle at which the source may start injecting it
    src: np.ndarray
    dst: np.ndarray
    length: np.ndarray  # wavelets
    mode: np.ndarray  # UNICAST or LINE
    vc: np.ndarray  # color class; the cycle engine queues it on virtual channel vc % vcs

    def __len__(self) -> int:
        return len(self.src)

    @classmethod
    def build(cls, t_ready, src, dst, length, mode=UNICAST, vc=0) -> "Messages":
        n = len(np.atleast_1d(src))
        col = [np.broadcast_to(np.asarray(a, dtype=np.int64), (n,)).copy()
               for a in (t_ready, src, dst, length, mode, vc)]
        return cls(*col)

    def hops(self, width: int) -> np.ndarray:
        sx, sy = self.src % width, self.src // width
        dx, dy = self.dst % width, self.dst // width
        return np.abs(dx - sx) + np.abs(dy - sy)

    def points(self, width: int) -> np.ndarray:
        """Delivery points per message: 1 for unicast, the hops of its path for a line."""
        return np.where(self.mode == LINE, np.maximum(self.hops(width), 1), 1)

    def validate(self, width: int, height: int, vcs: int) -> None:
        n = width * height
        if len(self) and (self.src.min() < 0 or self.src.max() >= n or self.dst.min() < 0
                          or self.dst.max() >= n):
            raise ValueError("message endpoint outside the mesh")
        if len(self) and (self.length.min() < 1 or self.vc.min() < 0 or self.vc.max() >= vcs):
            raise ValueError("message length must be >= 1 and vc within range")
        if len(self) > 1 and (np.diff(self.t_ready) < 0).any():
            raise ValueError("messages must be sorted by t_ready")
