"""The package gives the command's answers: the same files, byte for byte, for every
policy, for a solve and for a replay."""

import json
from pathlib import Path

import pytest

import infersched as isd
from conftest import run_cli

RUN_FILES = ["schedule.json", "requests.csv", "batches.csv", "summary.json"]
# The solver's report holds the time it measured; everything else must match.
MEASURED = {"build_s", "solve_s"}


def assert_same_files(a: Path, b: Path, names):
    for name in names:
        left, right = (a / name).read_bytes(), (b / name).read_bytes()
        assert left == right, f"{name} differs between {a} and {b}"


@pytest.mark.parametrize("scheduler", isd.schedulers())
def test_every_policy_writes_the_commands_files(cli, trace_head, tmp_path, scheduler):
    run_cli(cli, "simulate", "--workload", str(trace_head), "--scheduler", scheduler,
            "--out", str(tmp_path / "cli"))
    run = isd.simulate(trace_head, scheduler)
    run.write(tmp_path / "py")
    assert_same_files(tmp_path / "cli" / scheduler, tmp_path / "py", RUN_FILES)
    assert run.producer == scheduler
    assert run.summary["requests"] == 40


def test_limits_and_knobs_reach_the_policy_as_the_flags_do(cli, trace_head, tmp_path):
    flags = ["--token-budget", "512", "--num-gpu-blocks", "300", "--block-size", "16",
             "--max-running", "8", "--victim", "longest", "--no-scheduler-reserve-full-isl"]
    run_cli(cli, "simulate", "--workload", str(trace_head), "--scheduler", "vllm-v1",
            "--cost-model", "llama2-7b-a100", *flags, "--out", str(tmp_path / "cli"))
    run = isd.simulate(trace_head, "vllm-v1", cost_model="llama2-7b-a100", token_budget=512,
                       num_gpu_blocks=300, block_size=16, max_running=8, victim="longest",
                       scheduler_reserve_full_isl=False)
    run.write(tmp_path / "py")
    assert_same_files(tmp_path / "cli" / "vllm-v1", tmp_path / "py", RUN_FILES)
    # The knobs changed the run: the default one differs.
    default = isd.simulate(trace_head, "vllm-v1", cost_model="llama2-7b-a100")
    assert default.summary != run.summary
    assert run.limits.startswith("C = 512")
    # Memory binds, so the victim rule is exercised.
    assert run.summary["evictions"] > 0


def test_a_solve_matches_the_command_and_reports_its_proof(cli, tmp_path):
    rows = [(300, 6, 0.0), (120, 12, 0.0), (40, 3, 0.0), (500, 2, 0.0), (64, 9, 0.0)]
    w = isd.Workload.from_rows(rows)
    path = tmp_path / "w.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n"
                    + "".join(f"{i},{o},{t}\n" for i, o, t in rows))
    run_cli(cli, "solve", "--workload", str(path), "--objective", "makespan",
            "--token-budget", "256", "--kv-capacity", "2048", "--time-limit", "30",
            "--out", str(tmp_path / "cli"))
    points = []
    run = isd.solve(w, "makespan", token_budget=256, kv_capacity=2048, time_limit=30,
                    progress=points.append)
    run.write(tmp_path / "py")
    assert_same_files(tmp_path / "cli", tmp_path / "py", RUN_FILES)
    cli_report = json.loads((tmp_path / "cli" / "solve.json").read_text())
    py_report = json.loads((tmp_path / "py" / "solve.json").read_text())
    for k in MEASURED:
        cli_report.pop(k), py_report.pop(k)
    assert cli_report == py_report
    # With C = 256 no exact model fits: the best schedule found, with its bound.
    assert (run.status, run.method) == ("not-proven", "best-heuristic")
    assert run.bound_method == cli_report["bound_method"]["combinatorial"]
    assert run.bound < run.summary["makespan_s"]
    assert run.gap == pytest.approx(1 - run.bound / run.summary["makespan_s"])
    assert run.producer == "optimal"
    assert all(set(p) == {"bound", "incumbent", "gap_percent", "elapsed_s"} for p in points)


def test_a_proven_optimum_says_so():
    w = isd.Workload.from_rows([(300, 6, 0.0), (120, 12, 0.0), (40, 3, 0.0), (500, 2, 0.0)])
    run = isd.solve(w, "makespan", kv_capacity=2048, time_limit=30)
    assert (run.status, run.method, run.bound_method) == ("optimal", "counting-search", "exact")
    assert run.gap == 0.0 and run.bound == pytest.approx(run.summary["makespan_s"], rel=1e-12)
    with pytest.raises(AttributeError, match="only a solve"):
        isd.simulate(w, "vllm", kv_capacity=2048).status


def test_replay_matches_the_command_and_round_trips_a_schedule(cli, trace_head, tmp_path):
    sim = isd.simulate(trace_head, "sarathi", kv_capacity=20000, block_size=16)
    sched = tmp_path / "s.json"
    sim.schedule.write(str(sched))
    run_cli(cli, "replay", "--workload", str(trace_head), "--schedule", str(sched),
            "--kv-capacity", "20000", "--block-size", "16", "--out", str(tmp_path / "cli"))
    run = isd.replay(trace_head, sched, kv_capacity=20000, block_size=16)
    run.write(tmp_path / "py")
    assert_same_files(tmp_path / "cli", tmp_path / "py", RUN_FILES[1:])
    again = isd.replay(trace_head, isd.Schedule.from_json(sim.schedule.to_json()),
                       kv_capacity=20000, block_size=16)
    assert again.summary == sim.summary
    assert run.producer == "sarathi"


def test_compare_writes_the_commands_folder(cli, tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n300,6\n120,12\n40,3\n500,2\n64,9\n")
    names = ["optimal", "vllm-v1", "mcsf", "sarathi"]
    run_cli(cli, "compare", "--workload", str(path), "--schedulers", ",".join(names),
            "--objective", "mean-latency", "--kv-capacity", "2048", "--time-limit", "20",
            "--no-plots", "--out", str(tmp_path / "cli"))
    c = isd.compare(isd.Workload.read(str(path)), names, "mean-latency", kv_capacity=2048,
                    time_limit=20, plots=False, out=tmp_path / "py")
    assert_same_files(tmp_path / "cli", tmp_path / "py", ["comparison.csv"])
    for name in names:
        assert_same_files(tmp_path / "cli" / name, tmp_path / "py" / name, RUN_FILES)
    left = json.loads((tmp_path / "cli" / "comparison.json").read_text())
    right = c.report
    for doc in (left, right):
        for k in MEASURED:
            doc["solve"].pop(k)
    assert left == right
    assert list(c.table["scheduler"]) == names
    assert set(c.runs) == set(names) and not c.failures
    optimal = c.runs["optimal"]
    assert optimal.status == "optimal"
    # No heuristic beats a proven optimum.
    best = optimal.summary["mean_e2e_s"]
    assert all(r.summary["mean_e2e_s"] >= best * (1 - 1e-9) for r in c.runs.values())
    assert bool(c.table.set_index("scheduler").loc["mcsf", "clairvoyant"])


def test_compare_behind_several_routers_matches_the_command(cli, tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,300,6\n0,120,12\n"
                    "0.01,40,3\n0.02,500,2\n0.03,64,9\n")
    run_cli(cli, "compare", "--workload", str(path), "--schedulers", "vllm-v1,sarathi",
            "--kv-capacity", "2048", "--replicas", "2", "--router", "round-robin,least-kv",
            "--no-plots", "--out", str(tmp_path / "cli"))
    c = isd.compare(isd.Workload.read(str(path)), ["vllm-v1", "sarathi"], "makespan",
                    kv_capacity=2048, replicas=2, router="round-robin,least-kv", plots=False,
                    out=tmp_path / "py")
    assert_same_files(tmp_path / "cli", tmp_path / "py", ["comparison.csv"])
    names = ["vllm-v1@round-robin", "vllm-v1@least-kv", "sarathi@round-robin", "sarathi@least-kv"]
    assert list(c.table["scheduler"]) == names
    assert set(c.runs) == set(names) and not c.failures
    with pytest.raises(isd.InferschedError, match="router lists 2 routers"):
        isd.compare(isd.Workload.read(str(path)), ["vllm-v1"], "makespan",
                    router="round-robin,least-kv", plots=False)


def all_files(root: Path):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_cluster_simulation_writes_the_commands_folder(cli, trace_head, tmp_path):
    run_cli(cli, "simulate", "--workload", str(trace_head), "--scheduler", "sarathi",
            "--replicas", "3", "--router", "least-outstanding", "--out", str(tmp_path / "cli"))
    run = isd.simulate(trace_head, "sarathi", replicas=3, router="least-outstanding")
    run.write(tmp_path / "py")
    names = all_files(tmp_path / "cli" / "sarathi")
    assert "routing.csv" in names and "replica-2/schedule.json" in names
    assert names == all_files(tmp_path / "py")
    assert_same_files(tmp_path / "cli" / "sarathi", tmp_path / "py", names)
    assert run.replicas == 3 and run.summary["requests"] == 40
    one = isd.simulate(trace_head, "sarathi")
    assert one.replicas == 1
    # Three replicas serve the same requests no later on average than one.
    assert run.summary["mean_e2e_s"] <= one.summary["mean_e2e_s"]


def test_pipelined_replicas_write_the_commands_folder(cli, trace_head, tmp_path):
    run_cli(cli, "simulate", "--workload", str(trace_head), "--scheduler", "vllm-v1",
            "--replicas", "2", "--pp", "2", "--pp-latency-us", "20",
            "--out", str(tmp_path / "cli"))
    run = isd.simulate(trace_head, "vllm-v1", replicas=2, pp=2, pp_latency_us=20)
    run.write(tmp_path / "py")
    names = all_files(tmp_path / "cli" / "vllm-v1")
    assert names == all_files(tmp_path / "py")
    assert_same_files(tmp_path / "cli" / "vllm-v1", tmp_path / "py", names)
    assert run.summary["pipeline"]["stages"] == 2
    assert run.summary["pipeline"]["send_latency_s"] == pytest.approx(2e-5)
    # A pipelined schedule replays on its pipeline, and is refused on one GPU.
    one_run = isd.simulate(trace_head, "vllm-v1", pp=2)
    again = isd.replay(trace_head, one_run, pp=2, token_budget=8192, max_running=256,
                       block_size=16)
    assert again.summary["mean_e2e_s"] == one_run.summary["mean_e2e_s"]
    with pytest.raises(isd.InferschedError, match="claimed"):
        isd.replay(trace_head, one_run, token_budget=8192, max_running=256, block_size=16,
                   kv_capacity=one_run.summary["kv_capacity"])
    # One replica of two stages: the command's summary, byte for byte.
    run_cli(cli, "simulate", "--workload", str(trace_head), "--scheduler", "sarathi",
            "--pp", "2", "--out", str(tmp_path / "one"))
    one = isd.simulate(trace_head, "sarathi", pp=2)
    one.write(tmp_path / "one-py")
    assert_same_files(tmp_path / "one" / "sarathi", tmp_path / "one-py", ["summary.json"])
    with pytest.raises(isd.InferschedError, match="modelled for vllm-v1, vllm and sarathi, not orca"):
        isd.simulate(trace_head, "orca", pp=2)
    with pytest.raises(isd.InferschedError, match="give --pp 2 or more"):
        isd.simulate(trace_head, "vllm-v1", pp_bandwidth=100.0)


def test_a_disaggregated_cluster_writes_the_commands_folders(cli, trace_head, tmp_path):
    run_cli(cli, "simulate", "--workload", str(trace_head), "--scheduler", "vllm-v1",
            "--disaggregate", "1:2", "--router", "least-outstanding", "--kv-latency-us", "20",
            "--slo", "ttft-p90=2s", "--out", str(tmp_path / "cli"))
    run = isd.simulate(trace_head, "vllm-v1", disaggregate="1:2", router="least-outstanding",
                       kv_latency_us=20, slo=["ttft-p90=2s"])
    run.write(tmp_path / "py")
    names = all_files(tmp_path / "cli" / "vllm-v1")
    assert "prefill/replica-0/schedule.json" in names and "decode/replica-1/schedule.json" in names
    assert names == all_files(tmp_path / "py")
    assert_same_files(tmp_path / "cli" / "vllm-v1", tmp_path / "py", names)
    assert run.replicas == 3 and run.time_split is None
    piped = isd.simulate(trace_head, "vllm-v1", disaggregate="1:1", pp=2)
    assert piped.summary["pipeline"]["stages"] == 2 and piped.replicas == 2
    assert run.summary["cluster"]["prefill_replicas"] == 1
    assert len(run.requests) == 40
    with pytest.raises(isd.InferschedError, match="sarathi does not take KV computed elsewhere"):
        isd.simulate(trace_head, "sarathi", disaggregate="1:1")
    with pytest.raises(isd.InferschedError, match="expected P:D"):
        isd.simulate(trace_head, "vllm-v1", disaggregate="0:2")
    with pytest.raises(isd.InferschedError, match="either replicas or a prefill:decode split"):
        isd.simulate(trace_head, "vllm-v1", disaggregate="1:1", replicas=2)
    # The KV pushed instead of pulled: the command's folders with --kv-connector p2p-nccl.
    run_cli(cli, "simulate", "--workload", str(trace_head), "--scheduler", "vllm-v1",
            "--disaggregate", "1:2", "--kv-connector", "p2p-nccl", "--out", str(tmp_path / "cli2"))
    pushed = isd.simulate(trace_head, "vllm-v1", disaggregate="1:2", kv_connector="p2p-nccl")
    pushed.write(tmp_path / "py2")
    assert_same_files(tmp_path / "cli2" / "vllm-v1", tmp_path / "py2", names)
    assert pushed.summary["cluster"]["kv_link"]["connector"] == "p2p-nccl"
    assert run.summary["cluster"]["kv_link"]["connector"] == "nixl"
    with pytest.raises(isd.InferschedError, match="unknown KV connector"):
        isd.simulate(trace_head, "vllm-v1", disaggregate="1:1", kv_connector="nccl")


def test_capacity_finds_the_commands_rate_and_ceiling(cli, trace_head, tmp_path):
    run_cli(cli, "capacity", "--workload", str(trace_head), "--scheduler", "vllm-v1",
            "--slo", "ttft-p90=300ms", "--slo", "tbt-p99=100ms", "--out", str(tmp_path / "cli"))
    rows = (tmp_path / "cli" / "capacity.csv").read_text().splitlines()
    header, row = rows[0].split(","), dict(zip(rows[0].split(","), rows[1].split(",")))
    assert "max_rate_per_s" in header
    got = isd.capacity(trace_head, "vllm-v1", ["ttft-p90=300ms", "tbt-p99=100ms"])
    assert got["result"] == row["result"] == "found"
    assert got["max_rate_per_s"] == float(row["max_rate_per_s"])
    assert got["ceiling_per_s"] == float(row["ceiling_per_s"])
    assert len(got["probes"]) == int(row["probes"])
    assert got["max_rate_per_s"] < got["misses_at_per_s"] <= got["max_rate_per_s"] * 1.01 + 1e-12
    assert got["ceiling_per_s"] >= got["max_rate_per_s"]
    # The rate found holds when simulated there.
    assert got["report"]["all_hold"]
    assert got["best_found_rate_per_s"] is None
    run_cli(cli, "capacity", "--workload", str(trace_head), "--scheduler", "vllm-v1",
            "--slo", "ttft-p90=300ms", "--arrivals", "poisson:1", "--out", str(tmp_path / "p"))
    rows = (tmp_path / "p" / "capacity.csv").read_text().splitlines()
    row = dict(zip(rows[0].split(","), rows[1].split(",")))
    poisson = isd.capacity(trace_head, "vllm-v1", ["ttft-p90=300ms"], arrivals="poisson:1")
    assert poisson["max_rate_per_s"] == float(row["max_rate_per_s"])
    assert poisson["ceiling_per_s"] == float(row["ceiling_per_s"])
    with pytest.raises(isd.InferschedError, match="poisson:SEED"):
        isd.capacity(trace_head, "vllm-v1", ["ttft-p90=300ms"], arrivals="uniform")
    best = isd.capacity(trace_head, "vllm-v1", ["ttft-p90=300ms"], best_found=True)
    assert best["max_rate_per_s"] <= best["best_found_rate_per_s"] <= best["ceiling_per_s"]


def test_a_disaggregated_capacity_matches_the_command(cli, trace_head, tmp_path):
    run_cli(cli, "capacity", "--workload", str(trace_head), "--scheduler", "vllm-v1",
            "--cost-model", "llama3-8b-h100", "--slo", "ttft-p90=300ms",
            "--disaggregate", "1:1", "--router", "least-outstanding", "--replicas", "2",
            "--out", str(tmp_path / "cli"))
    lines = (tmp_path / "cli" / "capacity.csv").read_text().splitlines()
    rows = [dict(zip(lines[0].split(","), line.split(","))) for line in lines[1:]]
    split = next(r for r in rows if r["disaggregate"] == "1:1")
    got = isd.capacity(trace_head, "vllm-v1", ["ttft-p90=300ms"],
                       cost_model="llama3-8b-h100", disaggregate="1:1",
                       router="least-outstanding")
    assert got["disaggregate"] == "1:1" and got["result"] == split["result"] == "found"
    assert got["max_rate_per_s"] == float(split["max_rate_per_s"])
    assert got["ceiling_per_s"] is None and split["ceiling_per_s"] == ""
    colocated = next(r for r in rows if r["disaggregate"] == "")
    assert float(colocated["max_rate_per_s"]) != got["max_rate_per_s"]
    with pytest.raises(isd.InferschedError, match="expected P:D"):
        isd.capacity(trace_head, "vllm-v1", ["ttft-p90=2s"], cost_model="llama3-8b-h100",
                     disaggregate="2")
    with pytest.raises(isd.InferschedError, match="either replicas or a prefill:decode split"):
        isd.capacity(trace_head, "vllm-v1", ["ttft-p90=2s"], cost_model="llama3-8b-h100",
                     disaggregate="1:1", replicas=2)


def test_a_pipelined_capacity_matches_the_command(cli, trace_head, tmp_path):
    run_cli(cli, "capacity", "--workload", str(trace_head), "--scheduler", "vllm-v1",
            "--cost-model", "llama3-8b-h100", "--slo", "ttft-p90=300ms", "--pp", "1,2",
            "--replicas", "2", "--router", "least-outstanding", "--out", str(tmp_path / "cli"))
    lines = (tmp_path / "cli" / "capacity.csv").read_text().splitlines()
    rows = [dict(zip(lines[0].split(","), line.split(","))) for line in lines[1:]]
    assert [r["pp"] for r in rows] == ["", "2"]
    got = isd.capacity(trace_head, "vllm-v1", ["ttft-p90=300ms"], cost_model="llama3-8b-h100",
                       pp=2, replicas=2, router="least-outstanding")
    assert got["result"] == rows[1]["result"] == "found"
    assert got["max_rate_per_s"] == float(rows[1]["max_rate_per_s"])
    # A pipeline's ceiling is its first stage's (a machine at 1 / P of each batch's time),
    # the command's (None where not proven at the highest rate).
    want = float(rows[1]["ceiling_per_s"]) if rows[1]["ceiling_per_s"] else None
    assert got["ceiling_per_s"] == want
    assert want is None or want >= got["max_rate_per_s"]
    assert got["max_rate_per_s"] != float(rows[0]["max_rate_per_s"])
    with pytest.raises(isd.InferschedError, match="not orca$"):
        isd.capacity(trace_head, "orca", ["ttft-p90=2s"], cost_model="llama3-8b-h100", pp=2)
    with pytest.raises(isd.InferschedError, match="vllm does not take KV computed elsewhere"):
        isd.capacity(trace_head, "vllm", ["ttft-p90=2s"], cost_model="llama3-8b-h100",
                     pp=2, disaggregate="1:1")


def test_a_cluster_solve_matches_the_command(cli, tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n300,6\n120,12\n40,3\n500,2\n64,9\n")
    run_cli(cli, "solve", "--workload", str(path), "--objective", "mean-latency", "--replicas", "2",
            "--kv-capacity", "2048", "--time-limit", "20", "--out", str(tmp_path / "cli"))
    run = isd.solve(isd.Workload.read(str(path)), "mean-latency", replicas=2, kv_capacity=2048,
                    time_limit=20)
    run.write(tmp_path / "py")
    names = all_files(tmp_path / "cli")
    assert "routing.csv" in names and "replica-1/schedule.json" in names
    assert names == all_files(tmp_path / "py")
    assert_same_files(tmp_path / "cli", tmp_path / "py", [n for n in names if n != "solve.json"])
    left = json.loads((tmp_path / "cli" / "solve.json").read_text())
    right = run.solve_report
    for doc in (left, right):
        doc.pop("solve_s")
    assert left == right
    assert run.replicas == 2 and run.status == left["status"]
    assert run.bound <= run.summary["mean_e2e_s"] * (1 + 1e-9)
    assert run.bound_method == left["bound_argument"]
