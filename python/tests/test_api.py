"""The package's own surface: workloads from DataFrames and rows, results as DataFrames,
errors as exceptions naming what was wrong, SLOs, Ctrl-C during a solve."""

import _thread
import json
import threading

import pandas as pd
import pytest

import infersched as isd
from conftest import ROOT, TRACE


def test_a_dataframe_a_path_and_rows_give_the_same_workload(trace_head):
    df = pd.read_csv(trace_head)
    from_df = isd.Workload.from_dataframe(df)
    from_path = isd.Workload.read(trace_head)
    assert from_df.rows() == from_path.rows()
    assert len(from_df) == 40
    from_rows = isd.Workload.from_rows(from_path.rows())
    assert from_rows.rows() == from_path.rows()
    a = isd.simulate(df, "vllm", kv_capacity=30000)
    b = isd.simulate(from_path, "vllm", kv_capacity=30000)
    assert a.requests_csv() == b.requests_csv()


def test_results_are_dataframes_with_the_commands_columns(trace_head):
    run = isd.simulate(trace_head, "vllm-v1")
    req, bat = run.requests, run.batches
    assert len(req) == 40 and list(req.columns) == run.requests_csv().splitlines()[0].split(",")
    assert len(bat) == run.summary["batches"]
    # Every request completes after it arrives and no earlier than its first token.
    assert (req["completion_s"] >= req["first_token_s"]).all()
    assert (req["first_token_s"] > req["arrival_s"]).all()
    assert run.summary["e2e_s"]["mean"] == pytest.approx(run.summary["mean_e2e_s"])


def test_bad_rows_name_the_line_and_column():
    df = pd.DataFrame({"num_prefill_tokens": [10, 0], "num_decode_tokens": [3, 4]}, index=[7, 9])
    with pytest.raises(isd.InferschedError,
                       match=r"<DataFrame>: line 3, column num_prefill_tokens.*\(DataFrame row 9\)"):
        isd.Workload.from_dataframe(df)
    with pytest.raises(isd.InferschedError, match="no such file|No such file"):
        isd.Workload.read("/nonexistent/trace.csv")
    with pytest.raises(TypeError, match="workload: expected"):
        isd.simulate(42, "vllm")


def test_bad_settings_are_refused_with_the_flag_named(trace_head):
    w = isd.Workload.read(trace_head)
    with pytest.raises(isd.InferschedError, match="unknown name \"vllm-v9\""):
        isd.simulate(w, "vllm-v9")
    with pytest.raises(isd.InferschedError, match="num-gpu-blocks: expected at least 2"):
        isd.simulate(w, "vllm", num_gpu_blocks=1)
    with pytest.raises(isd.InferschedError, match="max-model-len 100: request 0"):
        isd.simulate(w, "vllm", max_model_len=100)
    with pytest.raises(isd.InferschedError, match="time_limit must be > 0"):
        isd.solve(w, time_limit=0)
    with pytest.raises(isd.InferschedError, match="slo \"ttft\""):
        isd.simulate(w, "vllm", slo=["ttft"])


def test_an_invalid_schedule_is_refused_by_the_replay():
    w = isd.Workload.from_rows([(4, 2, 0.0)])
    # One batch processing 5 tokens of a 4-token prompt breaks the request state rule.
    bad = isd.Schedule.from_json(
        '{"format": "infersched-schedule/1", "batches": [{"entries": [{"request": 0, "tokens": 5}]}]}'
    )
    with pytest.raises(isd.InferschedError):
        isd.replay(w, bad, kv_capacity=100)


def test_slos_give_attainment_and_goodput(trace_head):
    loose = isd.simulate(trace_head, "vllm-v1", slo=["e2e-max=1000s"])
    tight = isd.simulate(trace_head, "vllm-v1", slo=["ttft-max=1us"])
    assert loose.summary["slo"]["attainment"] == 1.0
    assert tight.summary["slo"]["attainment"] == 0.0


def test_clairvoyant_schedulers_are_named_and_marked():
    assert isd.is_clairvoyant("mcsf") and isd.is_clairvoyant("lightllm")
    assert not isd.is_clairvoyant("vllm-v1")
    w = isd.Workload.from_rows([(100, 5, 0.0), (50, 20, 0.0)])
    runs = [isd.simulate(w, k, kv_capacity=1000) for k in ("vllm-v1", "mcsf")]
    df = isd.compare_rows(runs)
    assert list(df["clairvoyant"]) == [False, True]
    assert df["mean_e2e_over_reference"].min() == pytest.approx(1.0)


def test_ctrl_c_during_a_solve_keeps_the_best_schedule_found():
    # 48 real requests at once: the mean-latency solve runs to its time limit.
    w = isd.Workload.from_rows([(i, o, 0.0) for i, o, _ in isd.Workload.read(TRACE).rows()[:48]])
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(isd.SolveInterrupted) as caught:
            isd.solve(w, "mean-latency", kv_capacity=60000, time_limit=8)
    finally:
        timer.cancel()
    assert isinstance(caught.value, KeyboardInterrupt)
    best = isd.Run(caught.value.args[1])
    assert best.producer == "optimal (interrupted)"
    assert best.summary["requests"] == 48


@pytest.mark.parametrize(
    "frame, expected",
    [
        ({"num_prefill_tokens": [10, 20], "num_decode_tokens": [3.0, float("nan")]},
         r"line 3, column num_decode_tokens"),
        ({"num_prefill_tokens": [10, 20]}, r"num_decode_tokens"),
        ({"num_prefill_tokens": [10.5], "num_decode_tokens": [3]}, r"line 2, column num_prefill_tokens"),
        ({"num_prefill_tokens": [10], "num_decode_tokens": [3], "arrived_at": [-1.0]},
         r"line 2, column arrived_at"),
    ],
    ids=["nan", "missing-column", "fractional-tokens", "negative-arrival"],
)
def test_bad_dataframes_are_refused_with_the_line_and_column(frame, expected):
    with pytest.raises(isd.InferschedError, match=expected):
        isd.Workload.from_dataframe(pd.DataFrame(frame))


def test_unknown_keywords_are_refused_by_python(trace_head):
    with pytest.raises(TypeError, match="token_budgett"):
        isd.simulate(trace_head, "vllm", token_budgett=512)


def test_a_hugging_face_config_runs_end_to_end_and_bad_ones_are_refused(trace_head, tmp_path):
    config = ROOT / "notebooks-data" / "models" / "llama3-8b" / "config.json"
    by_file = isd.simulate(trace_head, "vllm-v1", cost_model=f"roofline:h100:{config}")
    by_name = isd.simulate(trace_head, "vllm-v1", cost_model="roofline:h100:llama3-8b")
    assert by_file.summary == by_name.summary
    with pytest.raises(isd.InferschedError, match="does not divide"):
        isd.simulate(trace_head, "vllm-v1", cost_model=f"roofline:h100:{config}:tp3")
    broken = json.loads(config.read_text())
    del broken["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(isd.InferschedError, match="num_hidden_layers"):
        isd.simulate(trace_head, "vllm-v1", cost_model=f"roofline:h100:{path}")


def test_rows_take_numpy_numbers_and_refuse_fractional_tokens():
    import numpy as np

    w = isd.Workload.from_rows([(np.int64(5), np.int32(3), np.float64(0.25) * 2)])
    assert w.rows() == [(5, 3, 0.5)]
    with pytest.raises(isd.InferschedError, match=r"<rows>: row 1: expected"):
        isd.Workload.from_rows([(5, 3, 0.0), (5.5, 3, 0.1)])


def test_vllm_v1_takes_shared_prompt_blocks_from_its_prefix_cache():
    # A recorded Mooncake window (prompt block ids): vLLM V1's prefix cache, on by default,
    # serves shared prompt blocks; switched off, every prompt is computed whole.
    w = isd.Workload.read(
        ROOT / "notebooks-data" / "fidelity" / "vllm-0.32" / "mooncake-syn100-c2048-m24576" / "workload.csv"
    )
    knobs = dict(token_budget=2048, kv_capacity=24576, max_running=64, block_size=16)
    on = isd.simulate(w, "vllm-v1", cost_model="llama2-7b-a100", **knobs)
    off = isd.simulate(
        w, "vllm-v1", cost_model="llama2-7b-a100", enable_prefix_caching=False, **knobs
    )
    assert on.summary["cached_tokens"] > 0
    assert "cached_tokens" not in off.summary
    assert on.requests["processed_tokens"].sum() < off.requests["processed_tokens"].sum()


def test_vllm_v0_takes_the_cache_only_when_asked():
    # vLLM v0's prefix cache is off by default, as in vLLM v0; on, a recorded Mooncake
    # window (vLLM 0.6.3's own schedule) takes prompt blocks from it.
    w = isd.Workload.read(
        ROOT / "notebooks-data" / "fidelity" / "vllm-0.6.3-prefix"
        / "v0-mooncake-syn100-c8192-m16384-x2" / "workload.csv"
    )
    knobs = dict(token_budget=8192, kv_capacity=16384, max_running=64, block_size=16,
                 watermark=0.0)
    off = isd.simulate(w, "vllm", cost_model="llama2-7b-a100", **knobs)
    on = isd.simulate(w, "vllm", cost_model="llama2-7b-a100", enable_prefix_caching=True,
                      **knobs)
    assert "cached_tokens" not in off.summary
    # What vLLM 0.6.3 took from its cache on this window.
    assert on.summary["cached_tokens"] == 121536
