"""infersched from Python: simulate the schedulers real LLM serving systems use, find
provably optimal batch schedules (or the best found, with a certified bound), and replay
any schedule, with the same code and the same answers as the ``infersched`` command.

Keyword arguments are the command's flags with underscores (``--token-budget`` is
``token_budget``); unset ones mean what the unset flag means. Results are :class:`Run`
objects: ``.summary`` (a dict, ``summary.json``), ``.requests`` and ``.batches``
(pandas DataFrames with the columns of ``requests.csv`` and ``batches.csv``),
``.schedule`` and ``.write(dir)`` (the files ``--out DIR`` writes, byte for byte).

>>> import infersched
>>> w = infersched.Workload.from_rows([(512, 64, 0.0), (128, 32, 0.01)])
>>> run = infersched.simulate(w, "vllm-v1", kv_capacity=4096)
>>> run.summary["requests"]
2
"""

from __future__ import annotations

import io
import json
import operator
import os
import re
import tempfile
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple, Union

from . import _infersched
from ._infersched import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    InferschedError,
    Schedule,
    SolveInterrupted,
)

__all__ = [
    "Workload",
    "Schedule",
    "Run",
    "simulate",
    "solve",
    "replay",
    "compare",
    "capacity",
    "Comparison",
    "compare_rows",
    "schedulers",
    "objectives",
    "cost_model_presets",
    "is_clairvoyant",
    "DEFAULT_COST_MODEL",
    "InferschedError",
    "SolveInterrupted",
]

#: The cost model used when none is named (a calibrated H100 preset).
DEFAULT_COST_MODEL: str = _infersched.default_cost_model()


def schedulers() -> list:
    """The heuristic schedulers' names, as ``--scheduler`` takes them."""
    return list(_infersched.scheduler_names())


def objectives() -> list:
    """The solver's objectives, as ``--objective`` takes them."""
    return list(_infersched.objective_names())


def cost_model_presets() -> list:
    """The cost-model presets by name (roofline specs and coefficient files work too)."""
    return list(_infersched.cost_model_presets())


def is_clairvoyant(scheduler: str) -> bool:
    """Whether ``scheduler`` reads the true output lengths, which no online system knows."""
    return _infersched.is_clairvoyant(scheduler)


class Workload:
    """The requests: prompt tokens, output tokens and arrival time of each.

    Build one from a trace file (:meth:`read`), a pandas DataFrame with the trace's
    columns (:meth:`from_dataframe`) or rows of ``(input_tokens, output_tokens,
    arrival_s)`` (:meth:`from_rows`). Every way goes through the command's trace reader:
    the same columns, the same checks, errors naming the row and the column.
    """

    def __init__(self, inner: "_infersched.Workload"):
        self._inner = inner

    @staticmethod
    def read(path: Union[str, os.PathLike]) -> "Workload":
        """Reads a trace (CSV, or Mooncake's JSONL) as ``--workload`` does."""
        return Workload(_infersched.Workload.read(os.fspath(path)))

    @staticmethod
    def from_csv_text(text: str, name: str = "<text>") -> "Workload":
        """Parses trace CSV text; errors name ``name``, the line and the column."""
        return Workload(_infersched.Workload.parse(text, name))

    @staticmethod
    def from_dataframe(df: Any, name: str = "<DataFrame>") -> "Workload":
        """A workload from a DataFrame with a trace's columns (``num_prefill_tokens``,
        ``num_decode_tokens``, optional ``arrived_at``, ...). Errors name the CSV line
        (the header is line 1, so the frame's ``k``-th row is line ``k + 2``), the
        column, and the row's index label in the frame."""
        try:
            return Workload.from_csv_text(df.to_csv(index=False), name)
        except InferschedError as e:
            line = re.search(r"line (\d+)", str(e))
            row = int(line.group(1)) - 2 if line else -1
            if 0 <= row < len(df):
                label = df.index[row]
                label = label.item() if hasattr(label, "item") else label  # numpy scalars
                raise InferschedError(f"{e} (DataFrame row {label!r})") from None
            raise

    @staticmethod
    def from_rows(rows: Iterable[Tuple[int, int, float]], name: str = "<rows>") -> "Workload":
        """A workload from ``(input_tokens, output_tokens, arrival_s)`` rows (Python or
        NumPy numbers; token counts must be integers)."""
        lines = ["num_prefill_tokens,num_decode_tokens,arrived_at"]
        for k, (i, o, t) in enumerate(rows):
            try:
                lines.append(f"{operator.index(i)},{operator.index(o)},{float(t)!r}")
            except (TypeError, ValueError) as e:
                raise InferschedError(
                    f"{name}: row {k}: expected (whole input tokens, whole output tokens, "
                    f"arrival seconds), got {(i, o, t)!r}: {e}"
                ) from None
        return Workload.from_csv_text("\n".join(lines) + "\n", name)

    @property
    def source(self) -> str:
        """Where the requests came from (a path, or the name given)."""
        return self._inner.source

    def rows(self) -> list:
        """``(input_tokens, output_tokens, arrival_s)`` per request, in id order."""
        return self._inner.rows()

    def to_dataframe(self) -> Any:
        """The requests as a DataFrame (``input_tokens``, ``output_tokens``, ``arrival_s``)."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=["input_tokens", "output_tokens", "arrival_s"])

    def __len__(self) -> int:
        return len(self._inner)

    def __repr__(self) -> str:
        return f"Workload({len(self)} requests from {self.source})"


def _workload(w: Any) -> "_infersched.Workload":
    if isinstance(w, Workload):
        return w._inner
    if isinstance(w, (str, os.PathLike)):
        return Workload.read(w)._inner
    if hasattr(w, "to_csv"):
        return Workload.from_dataframe(w)._inner
    raise TypeError(f"workload: expected a Workload, a trace path or a DataFrame, got {type(w).__name__}")


def _schedule(s: Any) -> Schedule:
    if isinstance(s, Schedule):
        return s
    if isinstance(s, Run):
        return s.schedule
    if isinstance(s, (str, os.PathLike)):
        return Schedule.read(os.fspath(s))
    raise TypeError(f"schedule: expected a Schedule, a Run or a schedule path, got {type(s).__name__}")


class Run:
    """A schedule, its independent replay and every metric computed from the replay."""

    def __init__(self, inner: "_infersched.Run"):
        self._inner = inner
        self._summary: Optional[dict] = None
        self._solve: Optional[dict] = None

    @property
    def producer(self) -> str:
        """What produced the schedule: a scheduler's name, ``optimal`` (the solver; its
        policy class after a ``+``), or the producer a replayed schedule file names."""
        return self._inner.producer

    @property
    def limits(self) -> str:
        """The limits it ran under and was replayed against."""
        return self._inner.limits

    @property
    def replicas(self) -> int:
        """Replicas the run had (1: one GPU)."""
        return self._inner.replicas

    @property
    def schedule(self) -> Schedule:
        """The schedule (``.to_json()``, ``.write(path)``)."""
        return self._inner.schedule

    @property
    def summary(self) -> dict:
        """``summary.json`` as a dict (times in seconds)."""
        if self._summary is None:
            self._summary = json.loads(self._inner.summary_json())
        return self._summary

    @property
    def time_split(self) -> Optional[dict]:
        """Where the makespan goes, term by term of the cost model (seconds); None for a
        disaggregated cluster (the command gives none either)."""
        return json.loads(self._inner.time_split_json())

    @property
    def requests(self) -> Any:
        """``requests.csv`` as a DataFrame: one row per request."""
        import pandas as pd

        return pd.read_csv(io.StringIO(self._inner.requests_csv()))

    @property
    def batches(self) -> Any:
        """``batches.csv`` as a DataFrame: one row per batch."""
        import pandas as pd

        return pd.read_csv(io.StringIO(self._inner.batches_csv()))

    def requests_csv(self) -> str:
        """``requests.csv``'s text."""
        return self._inner.requests_csv()

    def batches_csv(self) -> str:
        """``batches.csv``'s text."""
        return self._inner.batches_csv()

    @property
    def solve_report(self) -> Optional[dict]:
        """The solver's report (``solve.json``) as a dict; None unless this is a solve."""
        if self._solve is None:
            text = self._inner.solve_json()
            self._solve = json.loads(text) if text is not None else None
        return self._solve

    def _report(self, key: str) -> Any:
        report = self.solve_report
        if report is None:
            raise AttributeError(f"{key}: only a solve() result has the solver's report")
        return report[key]

    def _names(self, key: str) -> tuple:
        names = self._inner.solve_names()
        if names is None:
            raise AttributeError(f"{key}: only a solve() result has the solver's report")
        return names

    @property
    def status(self) -> str:
        """The solver's status: ``optimal`` only with a proof."""
        return self._names("status")[0]

    @property
    def method(self) -> str:
        """The method that answered (the MILP, the counting search, independent groups...)."""
        return self._names("method")[1]

    @property
    def bound(self) -> float:
        """The proven lower bound on the objective (seconds)."""
        return self._report("best_bound")

    @property
    def bound_method(self) -> str:
        """The argument that gave the bound (as the command prints it)."""
        return self._names("bound_method")[2]

    @property
    def gap(self) -> float:
        """The certified gap, ``(replayed objective - bound) / replayed objective``."""
        return self._report("certified_gap")

    def write(self, out: Union[str, os.PathLike]) -> list:
        """Writes the files ``--out DIR`` writes (schedule.json, requests.csv,
        batches.csv, summary.json; solve.json for a solve); returns their paths."""
        return [str(p) for p in self._inner.write(os.fspath(out))]

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"Run({self.producer}: {s['requests']} requests, makespan {s['makespan_s']:.6g} s, "
            f"mean latency {s['mean_e2e_s']:.6g} s)"
        )


def _limits(
    token_budget, prefill_budget, kv_capacity, num_gpu_blocks, gpu_memory_utilization,
    max_running, block_size, watermark,
) -> dict:
    return dict(
        token_budget=token_budget,
        prefill_budget=prefill_budget,
        kv_capacity=kv_capacity,
        num_gpu_blocks=num_gpu_blocks,
        gpu_memory_utilization=float(gpu_memory_utilization),
        max_running=max_running,
        block_size=block_size,
        watermark=watermark,
    )


def _knobs(
    no_preemption, victim, max_model_len, mcsf_order, scheduler_reserve_full_isl,
    long_prefill_token_threshold, max_ragged_sequence_count, max_waiting_iters,
    enable_prefix_caching=None,
) -> dict:
    return dict(
        no_preemption=bool(no_preemption),
        victim=victim,
        max_model_len=max_model_len,
        mcsf_order=mcsf_order,
        scheduler_reserve_full_isl=scheduler_reserve_full_isl,
        long_prefill_token_threshold=long_prefill_token_threshold,
        max_ragged_sequence_count=max_ragged_sequence_count,
        max_waiting_iters=max_waiting_iters,
        enable_prefix_caching=enable_prefix_caching,
    )


def _solve_options(
    time_limit, threads, mip_gap, memory_limit, horizon, milp_only, list_search_tries,
    plan_search_tries, no_phase_relaxation, no_independent_groups, no_warm_start,
    warm_start_from, no_evict, no_chunk, no_mix, fcfs, reserve,
) -> dict:
    return dict(
        time_limit=float(time_limit),
        threads=threads,
        mip_gap=float(mip_gap),
        memory_limit=float(memory_limit),
        horizon=horizon,
        milp_only=bool(milp_only),
        list_search_tries=list_search_tries,
        plan_search_tries=plan_search_tries,
        no_phase_relaxation=bool(no_phase_relaxation),
        no_independent_groups=bool(no_independent_groups),
        no_warm_start=bool(no_warm_start),
        warm_start_from=list(warm_start_from),
        no_evict=bool(no_evict),
        no_chunk=bool(no_chunk),
        no_mix=bool(no_mix),
        fcfs=bool(fcfs),
        reserve=bool(reserve),
    )


def simulate(
    workload: Any,
    scheduler: str,
    *,
    cost_model: str = DEFAULT_COST_MODEL,
    token_budget: Optional[int] = None,
    prefill_budget: Optional[int] = None,
    kv_capacity: Optional[int] = None,
    num_gpu_blocks: Optional[int] = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_running: Optional[int] = None,
    block_size: Optional[int] = None,
    watermark: Optional[float] = None,
    no_preemption: bool = False,
    victim: str = "newest",
    max_model_len: Optional[int] = None,
    mcsf_order: str = "output",
    scheduler_reserve_full_isl: Optional[bool] = None,
    long_prefill_token_threshold: Optional[int] = None,
    max_ragged_sequence_count: Optional[int] = None,
    max_waiting_iters: Optional[int] = None,
    enable_prefix_caching: Optional[bool] = None,
    slo: Sequence[str] = (),
    replicas: int = 1,
    router: str = "round-robin",
    pp: int = 1,
    pp_bandwidth: Optional[float] = None,
    pp_latency_us: Optional[float] = None,
    disaggregate: Optional[str] = None,
    kv_bandwidth: Optional[float] = None,
    kv_latency_us: float = 0.0,
    kv_connector: str = "nixl",
) -> Run:
    """Runs one heuristic scheduler (see :func:`schedulers`) on ``workload`` (a
    :class:`Workload`, a trace path or a DataFrame), replays its schedule and measures it:
    ``infersched simulate --scheduler SCHEDULER``. Unset limits take the policy's
    defaults; M comes from ``kv_capacity``, ``num_gpu_blocks`` or the cost model's model and
    GPU. ``slo`` takes the command's SLO strings (``"ttft-p90=2s"``). With ``replicas`` > 1
    each replica runs the scheduler on the requests ``router`` sends it (``round-robin``,
    ``least-outstanding``, ``least-waiting``, ``least-kv``, ``vllm-dp``,
    ``power-of-two[:SEED]``, ``random[:SEED]``); the run is the cluster's (``write`` gives
    routing.csv and replica-K/ as ``--out`` does). With ``pp`` > 1 each replica is a
    pipeline of that many stages (``--pp``; vllm-v1, vllm and sarathi), its stages linked at
    ``pp_bandwidth`` GB/s (default: the GPU's NVLink) with ``pp_latency_us`` per send.
    ``disaggregate="P:D"`` runs P prefill and D decode replicas behind ``router``
    (``--disaggregate``; vllm-v1), the prompts' KV moved at ``kv_bandwidth`` GB/s
    (default: the GPU's NVLink) plus ``kv_latency_us`` each, pulled by the decode replica
    (``kv_connector="nixl"``) or pushed by the prefill one (``"p2p-nccl"``;
    ``--kv-connector``); ``write`` then gives the command's prefill/ and decode/ folders,
    and ``time_split`` is None. The simulation runs without the GIL."""
    limits = _limits(token_budget, prefill_budget, kv_capacity, num_gpu_blocks,
                     gpu_memory_utilization, max_running, block_size, watermark)
    knobs = _knobs(no_preemption, victim, max_model_len, mcsf_order, scheduler_reserve_full_isl,
                   long_prefill_token_threshold, max_ragged_sequence_count, max_waiting_iters,
                   enable_prefix_caching)
    cluster = dict(replicas=int(replicas), router=router)
    pipeline = dict(pp=int(pp), pp_bandwidth=pp_bandwidth, pp_latency_us=pp_latency_us)
    split = dict(disaggregate=disaggregate, kv_bandwidth=kv_bandwidth,
                 kv_latency_us=float(kv_latency_us), kv_connector=kv_connector)
    inner = _infersched.simulate(_workload(workload), scheduler, cost_model, limits, knobs,
                                 list(slo), cluster, pipeline, split)
    return Run(inner)


def replay(
    workload: Any,
    schedule: Any,
    *,
    cost_model: str = DEFAULT_COST_MODEL,
    token_budget: Optional[int] = None,
    prefill_budget: Optional[int] = None,
    kv_capacity: Optional[int] = None,
    num_gpu_blocks: Optional[int] = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_running: Optional[int] = None,
    block_size: Optional[int] = None,
    watermark: Optional[float] = None,
    slo: Sequence[str] = (),
    pp: int = 1,
    pp_bandwidth: Optional[float] = None,
    pp_latency_us: Optional[float] = None,
) -> Run:
    """Validates ``schedule`` (a :class:`Schedule`, a :class:`Run` or a schedule path) on
    ``workload`` under the limits and measures it: ``infersched replay``. Unset limits are
    unlimited (block size 1). An invalid schedule raises :class:`InferschedError` naming
    the batch and the rule it breaks. With ``pp`` > 1 the replica is a pipeline of that
    many stages (``replay --pp``; M then each stage GPU's where not given)."""
    limits = _limits(token_budget, prefill_budget, kv_capacity, num_gpu_blocks,
                     gpu_memory_utilization, max_running, block_size, watermark)
    pipeline = dict(pp=int(pp), pp_bandwidth=pp_bandwidth, pp_latency_us=pp_latency_us)
    inner = _infersched.replay(_workload(workload), _schedule(schedule), cost_model, limits,
                               list(slo), pipeline)
    return Run(inner)


def solve(
    workload: Any,
    objective: str = "makespan",
    *,
    cost_model: str = DEFAULT_COST_MODEL,
    token_budget: Optional[int] = None,
    prefill_budget: Optional[int] = None,
    kv_capacity: Optional[int] = None,
    num_gpu_blocks: Optional[int] = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_running: Optional[int] = None,
    block_size: Optional[int] = None,
    watermark: Optional[float] = None,
    time_limit: float = 60.0,
    threads: int = 2,
    mip_gap: float = 1e-6,
    memory_limit: float = 4.0,
    horizon: Optional[int] = None,
    milp_only: bool = False,
    list_search_tries: int = _infersched.DEFAULT_LIST_SEARCH_TRIES,
    plan_search_tries: int = _infersched.DEFAULT_PLAN_SEARCH_TRIES,
    no_phase_relaxation: bool = False,
    no_independent_groups: bool = False,
    no_warm_start: bool = False,
    warm_start_from: Sequence[str] = (),
    no_evict: bool = False,
    no_chunk: bool = False,
    no_mix: bool = False,
    fcfs: bool = False,
    reserve: bool = False,
    slo: Sequence[str] = (),
    progress: Optional[Callable[[dict], None]] = None,
    replicas: int = 1,
) -> Run:
    """The best schedule for ``objective`` (see :func:`objectives`) with a proven bound:
    ``infersched solve``. With ``replicas`` > 1 the cluster search (``solve --replicas``):
    every heuristic behind every router, the routing searched, each replica's part
    re-solved, with a bound valid for every routing (``write`` gives the cluster's folder
    and solve.json). The result's ``status`` is ``optimal`` only with a proof;
    ``bound``, ``bound_method`` and ``gap`` say how far from optimal it can be.

    The solve runs on its own thread without the GIL. ``progress``, if given, is called
    with each progress point (``bound``, ``incumbent``, ``gap_percent``, ``elapsed_s``).
    Ctrl-C raises :class:`SolveInterrupted`; its ``args[1]`` is the best schedule found so
    far, replayed (a :class:`Run`'s inner object: wrap it with ``Run(...)``), or None. The
    solver cannot be stopped early: its thread runs on until ``time_limit``."""
    limits = _limits(token_budget, prefill_budget, kv_capacity, num_gpu_blocks,
                     gpu_memory_utilization, max_running, block_size, watermark)
    options = _solve_options(
        time_limit, threads, mip_gap, memory_limit, horizon, milp_only, list_search_tries,
        plan_search_tries, no_phase_relaxation, no_independent_groups, no_warm_start,
        warm_start_from, no_evict, no_chunk, no_mix, fcfs, reserve,
    )
    inner = _infersched.solve(_workload(workload), objective, cost_model, limits, options,
                              list(slo), progress, int(replicas))
    return Run(inner)


class Comparison:
    """What :func:`compare` ran: ``.table`` (``comparison.csv`` as a DataFrame: one row per
    scheduler, the ratios to the optimum and to the bound, status, method, clairvoyance),
    ``.report`` (``comparison.json``), ``.runs`` (each scheduler's :class:`Run`),
    ``.failures`` (each failed scheduler's error) and ``.out`` (the folder written: a
    folder per scheduler, plots/ and report.html, as the command writes them)."""

    def __init__(self, out: str, contended: list):
        self.out = out
        self.runs = {name: Run(run) for name, run, _ in contended if run is not None}
        self.failures = {name: e for name, run, e in contended if run is None}

    @property
    def table(self) -> Any:
        """``comparison.csv`` as a DataFrame."""
        import pandas as pd

        return pd.read_csv(os.path.join(self.out, "comparison.csv"))

    @property
    def report(self) -> dict:
        """``comparison.json`` as a dict (the setting, the rows, the solver's report)."""
        with open(os.path.join(self.out, "comparison.json")) as f:
            return json.load(f)

    def __repr__(self) -> str:
        return f"Comparison({', '.join(self.runs)} in {self.out})"


def compare(
    workload: Any,
    schedulers: Union[str, Sequence[str]] = "optimal,vllm,vllm-v1,sarathi,orca,mcsf",
    objective: str = "makespan",
    *,
    out: Optional[Union[str, os.PathLike]] = None,
    plots: bool = True,
    traces: bool = True,
    replicas: int = 1,
    router: str = "round-robin",
    cost_model: str = DEFAULT_COST_MODEL,
    token_budget: Optional[int] = None,
    prefill_budget: Optional[int] = None,
    kv_capacity: Optional[int] = None,
    num_gpu_blocks: Optional[int] = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_running: Optional[int] = None,
    block_size: Optional[int] = None,
    watermark: Optional[float] = None,
    no_preemption: bool = False,
    victim: str = "newest",
    max_model_len: Optional[int] = None,
    mcsf_order: str = "output",
    scheduler_reserve_full_isl: Optional[bool] = None,
    long_prefill_token_threshold: Optional[int] = None,
    max_ragged_sequence_count: Optional[int] = None,
    max_waiting_iters: Optional[int] = None,
    enable_prefix_caching: Optional[bool] = None,
    time_limit: float = 60.0,
    threads: int = 2,
    mip_gap: float = 1e-6,
    memory_limit: float = 4.0,
    horizon: Optional[int] = None,
    milp_only: bool = False,
    list_search_tries: int = _infersched.DEFAULT_LIST_SEARCH_TRIES,
    plan_search_tries: int = _infersched.DEFAULT_PLAN_SEARCH_TRIES,
    no_phase_relaxation: bool = False,
    no_independent_groups: bool = False,
    no_evict: bool = False,
    no_chunk: bool = False,
    no_mix: bool = False,
    fcfs: bool = False,
    reserve: bool = False,
    slo: Sequence[str] = (),
    progress: Optional[Callable[[dict], None]] = None,
) -> Comparison:
    """The optimal scheduler and heuristics on one setting: ``infersched compare``.
    ``schedulers`` as ``--schedulers`` takes them (``optimal``, ``optimal+no-evict``, any
    heuristic). Writes the command's folder to ``out`` (a new temporary folder when None).
    The ``optimal`` row is ``best-found`` unless the solver proved it. Runs without the
    GIL; Ctrl-C raises :class:`SolveInterrupted` as :func:`solve` does."""
    if not isinstance(schedulers, str):
        schedulers = ",".join(schedulers)
    out = os.fspath(out) if out is not None else tempfile.mkdtemp(prefix="infersched-compare-")
    limits = _limits(token_budget, prefill_budget, kv_capacity, num_gpu_blocks,
                     gpu_memory_utilization, max_running, block_size, watermark)
    knobs = _knobs(no_preemption, victim, max_model_len, mcsf_order, scheduler_reserve_full_isl,
                   long_prefill_token_threshold, max_ragged_sequence_count, max_waiting_iters,
                   enable_prefix_caching)
    options = _solve_options(
        time_limit, threads, mip_gap, memory_limit, horizon, milp_only, list_search_tries,
        plan_search_tries, no_phase_relaxation, no_independent_groups, False, (), no_evict,
        no_chunk, no_mix, fcfs, reserve,
    )
    how = dict(schedulers=schedulers, objective=objective,
               cluster=dict(replicas=int(replicas), router=router),
               out=out, plots=bool(plots), traces=bool(traces))
    contended = _infersched.compare(_workload(workload), cost_model, limits, knobs, options,
                                    list(slo), how, progress)
    return Comparison(out, contended)


def capacity(
    workload: Any,
    scheduler: str,
    slo: Sequence[str],
    *,
    warmup: float = 0.1,
    cooldown: float = 0.1,
    min_rate: float = 0.01,
    max_rate: float = 10_000.0,
    tolerance: float = 0.01,
    max_probes: int = 64,
    best_found: bool = False,
    arrivals: str = "trace",
    replicas: int = 1,
    router: str = "round-robin",
    disaggregate: Optional[str] = None,
    kv_bandwidth: Optional[float] = None,
    kv_latency_us: float = 0.0,
    kv_connector: str = "nixl",
    pp: int = 1,
    cost_model: str = DEFAULT_COST_MODEL,
    token_budget: Optional[int] = None,
    prefill_budget: Optional[int] = None,
    kv_capacity: Optional[int] = None,
    num_gpu_blocks: Optional[int] = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_running: Optional[int] = None,
    block_size: Optional[int] = None,
    watermark: Optional[float] = None,
    no_preemption: bool = False,
    victim: str = "newest",
    max_model_len: Optional[int] = None,
    mcsf_order: str = "output",
    scheduler_reserve_full_isl: Optional[bool] = None,
    long_prefill_token_threshold: Optional[int] = None,
    max_ragged_sequence_count: Optional[int] = None,
    max_waiting_iters: Optional[int] = None,
    enable_prefix_caching: Optional[bool] = None,
) -> dict:
    """The highest request rate at which ``scheduler`` meets every SLO in ``slo`` on the
    trace with its arrivals scaled (``infersched capacity`` for one configuration; the
    first ``warmup`` and last ``cooldown`` shares of requests are not measured; bisection
    to ``tolerance``, at most ``max_probes`` simulations), and the ceiling: a rate at
    which no schedule at all meets them under the same limits (None where the bounds give
    none). Returns a dict: ``result`` (``found``, ``at-least``: they hold at ``max_rate``,
    ``below``: they miss at ``min_rate``), ``max_rate_per_s``, ``misses_at_per_s``,
    ``binding_slos``, ``report`` (the SLO report at the rate found), ``probes``
    (``[rate, held]`` in order), ``ceiling_per_s``, ``limits``, ``disaggregate``, and with ``best_found``
    (one replica) ``best_found_rate_per_s``: the highest rate at which the goodput search
    (clairvoyant) finds a schedule meeting them under the same limits (``capacity
    --best-found``; the best possible rate lies between it and the ceiling). ``arrivals``:
    ``trace`` (the trace's own, scaled) or ``poisson[:SEED]`` (``capacity --arrivals``).
    ``disaggregate="P:D"`` searches a disaggregated cluster instead (``capacity
    --disaggregate``: P prefill and D decode replicas behind ``router``, KV over
    ``kv_bandwidth`` GB/s, the GPU's NVLink by default; vllm-v1; no ceiling); ``pp`` > 1
    makes each replica a pipeline of that many stages (``capacity --pp``; vllm-v1,
    vllm and sarathi; the ceiling is the first stage's, a machine at ``1 / pp`` of each
    batch's time)."""
    limits = _limits(token_budget, prefill_budget, kv_capacity, num_gpu_blocks,
                     gpu_memory_utilization, max_running, block_size, watermark)
    knobs = _knobs(no_preemption, victim, max_model_len, mcsf_order, scheduler_reserve_full_isl,
                   long_prefill_token_threshold, max_ragged_sequence_count, max_waiting_iters,
                   enable_prefix_caching)
    search = dict(warmup=float(warmup), cooldown=float(cooldown), min_rate=float(min_rate),
                  max_rate=float(max_rate), tolerance=float(tolerance), max_probes=int(max_probes),
                  best_found=bool(best_found), arrivals=str(arrivals), pp=int(pp),
                  disaggregate=disaggregate, kv_bandwidth=kv_bandwidth,
                  kv_latency_us=float(kv_latency_us), kv_connector=kv_connector)
    cluster = dict(replicas=int(replicas), router=router)
    text = _infersched.capacity(_workload(workload), scheduler, cost_model, limits, knobs,
                                list(slo), cluster, search)
    return json.loads(text)


def compare_rows(runs: Sequence[Run], reference: Optional[Run] = None) -> Any:
    """One row per run (producer, makespan, mean latency and TTFT, p99 latency, tokens/s,
    evictions) as a DataFrame, with each run's mean latency over ``reference``'s (or the
    best run's) and, for a solve, its bound and certified gap. A clairvoyant producer is
    marked."""
    import pandas as pd

    rows = []
    for r in runs:
        s = r.summary
        row = {
            "producer": r.producer,
            "clairvoyant": r.producer in schedulers() and is_clairvoyant(r.producer),
            "makespan_s": s["makespan_s"],
            "mean_e2e_s": s["mean_e2e_s"],
            "mean_ttft_s": s["mean_ttft_s"],
            "p99_e2e_s": s["e2e_s"]["p99"],
            "throughput_tok_s": s["throughput_tok_s"],
            "evictions": s["evictions"],
            "status": r.status if r.solve_report is not None else "heuristic",
            "bound_s": r.bound if r.solve_report is not None else None,
            "certified_gap": r.gap if r.solve_report is not None else None,
        }
        rows.append(row)
    df = pd.DataFrame(rows)
    base = reference.summary["mean_e2e_s"] if reference is not None else df["mean_e2e_s"].min()
    df["mean_e2e_over_reference"] = df["mean_e2e_s"] / base
    return df
