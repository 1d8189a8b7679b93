"""Synthetic traffic for network-on-chip studies, and one measured run of it.

Every PE offers ``rate`` wavelets per cycle as packets of ``packet_wavelets`` (a Bernoulli
process per PE per cycle) to destinations chosen by a pattern. The run warms up, measures a
window, then drains: accepted throughput is wavelets delivered during the window per PE per
cycle; latency is from a packet's creation (so source queueing counts) to its last wavelet's
arrival, averaged over packets created in the window.

The routers and links are a fabric's: its virtual channels, queue depth, hop and ramp latency
(the packets take the virtual channels in turn); its mesh size is not used, the mesh is k x k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from wse_emu.engines import cycle
from wse_emu.engines.messages import Messages
from wse_emu.errors import UserError
from wse_emu.hardware.fabric import FabricSpec, load_fabric

DEFAULT_FABRIC = "wse3"  # the fabric whose routers a study uses unless given one

PATTERNS = ("uniform", "transpose", "bitcomp", "hotspot")


def saturation_bound(pattern: str, k: int) -> float | None:
    """Closed-form saturation injection rate on a k x k mesh with dimension-order routing."""
    if pattern == "uniform":
        return 4 / k if k % 2 == 0 else 4 * k / (k * k - 1)
    if pattern == "transpose":
        return 1 / (k - 1)
    if pattern == "bitcomp":
        return 2 / k
    return None


def mean_hops_uniform(k: int) -> float:
    return 2 * (k * k - 1) / (3 * k)


def destinations(pattern: str, src: np.ndarray, k: int, rng: np.random.Generator,
                 hotspot_fraction: float = 0.2) -> np.ndarray:
    x, y = src % k, src // k
    if pattern == "uniform":
        return rng.integers(0, k * k, size=len(src))
    if pattern == "transpose":
        return x * k + y
    if pattern == "bitcomp":
        return (k - 1 - y) * k + (k - 1 - x)
    if pattern == "hotspot":
        hot = (k // 2) * k + k // 2
        uniform = rng.integers(0, k * k, size=len(src))
        return np.where(rng.random(len(src)) < hotspot_fraction, hot, uniform)
    raise UserError(f"`pattern` must be one of {', '.join(PATTERNS)}, got {pattern!r}")


def generate(pattern: str, k: int, rate: float, cycles: int, packet_wavelets: int, vcs: int,
             seed: int) -> Messages:
    """Packets created over ``cycles`` cycles, sorted by creation cycle then source."""
    if not 0 < rate <= 1:
        raise UserError(f"`rate` must be in (0, 1] wavelets per PE per cycle, got {rate}")
    rng = np.random.default_rng(seed)
    n = k * k
    p = rate / packet_wavelets
    per_node = int(p * cycles * 1.3 + 6 * np.sqrt(p * cycles + 1) + 8)
    gaps = rng.geometric(p, size=(n, per_node))
    times = np.cumsum(gaps, axis=1) - 1
    node, col = np.nonzero(times < cycles)
    t = times[node, col]
    order = np.lexsort((node, t))
    t, node = t[order], node[order]
    dst = destinations(pattern, node, k, rng)
    vc = np.arange(len(t)) % vcs
    return Messages.build(t, node, dst, packet_wavelets, 0, vc)


@dataclass
class NocResult:
    mesh: int
    pattern: str
    offered_rate: float
    accepted_rate: float
    latency_mean: float
    latency_p99: float
    hops_mean: float
    delivered_fraction: float
    worst_source_slowdown: float  # max over PEs of mean latency / mean zero-load latency
    saturation_bound: float | None
    cycles: int
    packets_measured: int
    conservation_violations: int | None  # cycles found breaking it; None: not checked

    def to_dict(self) -> dict:
        return asdict(self)


def run_noc(k: int, pattern: str, rate: float, *, fabric: FabricSpec | None = None,
            packet_wavelets: int = 1, warmup: int = 1000, window: int = 4000, drain: int = 4000,
            seed: int = 0, check: bool = False) -> NocResult:
    """One measured run of ``pattern`` traffic at ``rate`` wavelets per PE per cycle on a
    k x k mesh with the routers of ``fabric`` (default: the ``DEFAULT_FABRIC`` preset)."""
    fabric = load_fabric(DEFAULT_FABRIC) if fabric is None else fabric
    vcs, hop, ramp = fabric.virtual_channels, fabric.hop_latency_cycles, fabric.ramp_latency_cycles
    msgs = generate(pattern, k, rate, warmup + window, packet_wavelets, vcs, seed)
    res = cycle.run(k, k, vcs, fabric.queue_wavelets, hop, ramp, msgs, warmup + window + drain,
                    check)
    measured = (msgs.t_ready >= warmup) & (msgs.t_ready < warmup + window)
    done = measured & (res.t_done >= 0)
    latency = (res.t_done - msgs.t_ready)[done]
    in_window = (res.t_done >= warmup) & (res.t_done < warmup + window)
    accepted = float(msgs.length[in_window].sum()) / (k * k * window)
    # Saturation shows first at the PEs whose flows share the busiest link: compare each PE's
    # mean latency with what it would be on an idle network.
    zero_load = msgs.hops(k) * hop + 2 * ramp + msgs.length - 1
    per_src = np.bincount(msgs.src[done], weights=latency, minlength=k * k)
    per_src_zero = np.bincount(msgs.src[done], weights=zero_load[done], minlength=k * k)
    has = per_src_zero > 0
    slowdown = float((per_src[has] / per_src_zero[has]).max()) if has.any() else float("nan")
    return NocResult(
        mesh=k, pattern=pattern, offered_rate=rate, accepted_rate=accepted,
        latency_mean=float(latency.mean()) if len(latency) else float("nan"),
        latency_p99=float(np.percentile(latency, 99)) if len(latency) else float("nan"),
        hops_mean=float(msgs.hops(k)[measured].mean()) if measured.any() else float("nan"),
        delivered_fraction=float(done.sum() / max(measured.sum(), 1)),
        worst_source_slowdown=slowdown,
        saturation_bound=saturation_bound(pattern, k), cycles=res.cycles,
        packets_measured=int(measured.sum()),
        conservation_violations=(0 if res.violation_cycle < 0 else 1) if check else None)


def stable(result: NocResult, slowdown_limit: float = 3.0) -> bool:
    """Below saturation: (nearly) every measured packet arrives, and no PE's packets take more
    than ``slowdown_limit`` times their idle-network latency on average."""
    return result.delivered_fraction > 0.99 and result.worst_source_slowdown < slowdown_limit


def find_saturation(k: int, pattern: str, steps: int = 7,
                    **kwargs) -> tuple[float | None, list]:
    """Bisect the offered rate in (0, min(1, 1.2 x the closed-form bound)] for the highest
    stable rate; returns it (None if no rate tried was stable) and the runs made. A PE can
    inject at most one wavelet per cycle, hence the cap at 1."""
    bound = saturation_bound(pattern, k)
    lo, hi = 0.0, min(1.0, 1.2 * bound) if bound else 1.0
    best, runs = None, []
    for _ in range(steps):
        mid = (lo + hi) / 2
        res = run_noc(k, pattern, mid, **kwargs)
        runs.append(res)
        if stable(res):
            lo = best = mid
        else:
            hi = mid
    return best, runs
