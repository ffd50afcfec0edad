"""The start-up fabric probe: nccl-tests' arithmetic on hand-computed values, real gloo runs on 2 and 3
processes (one made slow on purpose), the command under torchrun and under srun on a local Slurm cluster."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import free_port
from nemo_throughput import cli
from nemo_throughput.environment import first_host, launcher_env
from nemo_throughput.explain.probe import (
    ENV_TEST_SLOWDOWN,
    OPS,
    bandwidths_gbps,
    bus_factor,
    flag_outliers,
    op_shape,
    outlier_bounds,
    run_probe,
    sendrecv_pairs,
)
from nemo_throughput.explain.probe_command import parse_size_bytes, render

BIN = Path(sys.executable).parent
SMALL_SIZES = (4096, 65536)


# ---------------------------------------------------------------------------- nccl-tests' arithmetic
def test_bus_bandwidth_follows_nccl_tests_performance_md_on_hand_computed_values():
    # 1 GB in 10 ms on 8 ranks: algbw = S/t = 100 GB/s (1e9 B/s); busbw = algbw x factor (PERFORMANCE.md)
    assert bandwidths_gbps("all_reduce", 10**9, 0.01, 8) == pytest.approx((100.0, 175.0))  # 2(n-1)/n = 1.75
    assert bandwidths_gbps("all_gather", 10**9, 0.01, 8) == pytest.approx((100.0, 87.5))  # (n-1)/n
    assert bandwidths_gbps("reduce_scatter", 10**9, 0.01, 8) == pytest.approx((100.0, 87.5))
    assert bandwidths_gbps("all_to_all", 10**9, 0.01, 8) == pytest.approx((100.0, 87.5))
    assert bandwidths_gbps("sendrecv", 10**9, 0.01, 2) == pytest.approx((100.0, 100.0))  # factor 1
    # 3 ranks, 6 MB in 4 ms: algbw 1.5 GB/s; all_reduce 1.5 x 4/3 = 2.0, all_gather 1.5 x 2/3 = 1.0
    assert bandwidths_gbps("all_reduce", 6 * 10**6, 0.004, 3) == pytest.approx((1.5, 2.0))
    assert bandwidths_gbps("all_gather", 6 * 10**6, 0.004, 3) == pytest.approx((1.5, 1.0))
    assert bus_factor("all_reduce", 1) == 0.0 and bus_factor("all_gather", 2) == 0.5
    with pytest.raises(ValueError, match="unknown op 'broadcast'"):
        bus_factor("broadcast", 4)


def test_sizes_are_nccl_tests_sizes_total_bytes_for_all_gather_reduce_scatter_and_all_to_all():
    # all_reduce / sendrecv: the buffer; count = its elements
    assert op_shape("all_reduce", 4096, 3) == (4096, 1024)
    assert op_shape("sendrecv", 4096, 3) == (4096, 1024)
    # the others: per-rank (per-peer) count rounded down to 16 bytes as nccl-tests does,
    # size = that count x ranks: 1024 floats / 3 = 341 -> 340 per rank -> 4080 bytes in all
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert op_shape(op, 4096, 3) == (4080, 340)
        assert op_shape(op, 64 * 2**20, 8) == (64 * 2**20, 2**21)
        assert op_shape(op, 16, 8) is None  # less than 16 bytes per rank


def test_outlier_bounds_are_median_plus_minus_the_larger_of_three_mads_and_ten_percent():
    # 10, 99, 100, 101: median 99.5, |deviations| 89.5, 0.5, 0.5, 1.5 -> MAD 1.0; 3 MAD = 3 < 9.95 (10 %)
    assert outlier_bounds([100, 101, 99, 10]) == pytest.approx((89.55, 109.45, 99.5))
    # 50, 100, 150, 100, 100: median 100, deviations 50, 0, 50, 0, 0 -> MAD 0: the 10 % floor
    assert outlier_bounds([50, 100, 150, 100, 100]) == pytest.approx((90, 110, 100))
    # a wide pack, 3 MAD wins: 60, 80, 100, 120, 140: median 100, deviations 40, 20, 0, 20, 40 -> MAD 20 -> +- 60
    assert outlier_bounds([60, 80, 100, 120, 140]) == pytest.approx((40, 160, 100))


def test_flagging_names_the_rank_out_of_line_with_its_host_on_either_side():
    places = [{"rank": r, "host": f"node{r // 2}", "gpu_index": r % 2} for r in range(5)]
    flagged = flag_outliers([100.0, 101.0, 99.0, 10.0, None], places, "matmul_tflops")
    assert flagged == [{"rank": 3, "host": "node1", "gpu_index": 1, "what": "matmul_tflops", "value": 10.0,
                        "median": 99.5}]
    assert [f["rank"] for f in flag_outliers([100.0, 100.0, 100.0, 111.0], places[:4], "x")] == [3]  # 10 % floor
    assert flag_outliers([100.0, 100.0, 100.0, 109.0], places[:4], "x") == []
    assert flag_outliers([1.0, 100.0], places[:2], "x") == []  # two ranks: each is one MAD from the median
    assert flag_outliers([None, math.nan], places[:2], "x") == []


def test_send_recv_pairs_neighbours_on_one_host_and_cross_nodes_on_several():
    assert sendrecv_pairs(4, ["a"] * 4) == [(0, 1), (2, 3)]
    assert sendrecv_pairs(3, ["a"] * 3) == [(0, 1)]  # the odd rank sits out
    assert sendrecv_pairs(8, ["a"] * 4 + ["b"] * 4) == [(0, 4), (1, 5), (2, 6), (3, 7)]


# ---------------------------------------------------------------------------- real runs on gloo
def _probe_worker(rank, world_size, port, slow_rank, results):
    torch.set_num_threads(1)  # ranks share two cores
    if rank == slow_rank:
        os.environ[ENV_TEST_SLOWDOWN] = "10"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results[rank] = run_probe(sizes_bytes=SMALL_SIZES, iterations=5, warmup=2, time_budget_s=1.0,
                                  matmul_budget_s=0.2)
    finally:
        dist.destroy_process_group()


def probe_on(world_size, slow_rank=None):
    results = mp.Manager().dict()
    mp.start_processes(_probe_worker, args=(world_size, free_port(), slow_rank, results), nprocs=world_size,
                       start_method="spawn")
    return [results[rank] for rank in range(world_size)]


def without_duration(result):
    return {key: value for key, value in result.items() if key != "duration_s"}


@pytest.mark.slow
def test_probe_on_two_gloo_ranks_measures_every_op_and_size_and_agrees_on_every_rank():
    results = probe_on(2)
    result = results[0]
    assert without_duration(results[1]) == without_duration(result)  # the same table on every rank
    assert (result["backend"], result["world_size"], result["device"]) == ("gloo", 2, "cpu")
    assert result["skipped"] == []
    assert [(row["op"], row["bytes"]) for row in result["collectives"]] == [
        (op, size) for op in OPS for size in SMALL_SIZES]
    for row in result["collectives"]:
        assert row["time_us"] > 0 and 1 <= row["iterations"] <= 5
        algbw, busbw = bandwidths_gbps(row["op"], row["bytes"], row["time_us"] / 1e6, 2)
        assert (row["algbw_gbps"], row["busbw_gbps"]) == pytest.approx((algbw, busbw))
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * (1.0 if row["op"] in ("all_reduce", "sendrecv")
                                                                       else 0.5))
    assert result["sendrecv"]["pairs"] == [[0, 1]] and result["sendrecv"]["bytes"] == 65536
    assert all(busbw > 0 for busbw in result["sendrecv"]["busbw_gbps_per_rank"])
    matmul = result["matmul_tflops"]
    assert len(matmul["per_rank"]) == 2 and all(v > 0 for v in matmul["per_rank"]) and matmul["dtype"] == "float32"
    assert [place["rank"] for place in result["ranks"]] == [0, 1]
    assert result["flagged_ranks"] == []  # two ranks cannot be told apart (test above)


@pytest.mark.slow
def test_probe_on_three_gloo_ranks_names_the_rank_made_ten_times_slower():
    results = probe_on(3, slow_rank=2)
    result = results[0]
    assert without_duration(results[2]) == without_duration(result)
    gathered = {row["bytes"] for row in result["collectives"] if row["op"] == "all_gather"}
    assert gathered == {4080, 65520}  # 16384 floats / 3 = 5461 -> 5460 per rank (16-byte rounding)
    assert result["sendrecv"]["pairs"] == [[0, 1]]
    assert result["sendrecv"]["busbw_gbps_per_rank"][2] is None  # the odd rank sits out
    tflops = result["matmul_tflops"]["per_rank"]
    assert tflops[2] == min(tflops)
    slow = [f for f in result["flagged_ranks"] if f["what"] == "matmul_tflops"]
    assert [(f["rank"], f["host"]) for f in slow] == [(2, result["ranks"][2]["host"])]
    assert slow[0]["value"] == tflops[2] and slow[0]["median"] == pytest.approx(result["matmul_tflops"]["median"])


def test_probe_without_torch_distributed_measures_the_matmul_and_says_why_collectives_were_skipped():
    assert not dist.is_initialized()
    result = run_probe(matmul_budget_s=0.05)
    assert (result["backend"], result["world_size"], result["collectives"]) == (None, 1, [])
    assert [skip["op"] for skip in result["skipped"]] == list(OPS)
    assert all("torch.distributed is not initialised" in skip["reason"] for skip in result["skipped"])
    assert len(result["matmul_tflops"]["per_rank"]) == 1 and result["flagged_ranks"] == []


def test_probe_on_a_one_rank_group_skips_collectives_with_that_reason():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        result = run_probe(matmul_budget_s=0.05)
    finally:
        dist.destroy_process_group()
    assert (result["backend"], result["world_size"], result["collectives"]) == ("gloo", 1, [])
    assert all("one rank" in skip["reason"] for skip in result["skipped"])
    assert "collectives skipped: the process group has one rank" in render(result)


def test_probe_refuses_bad_arguments_before_any_collective():
    with pytest.raises(ValueError, match="iterations must be a whole number >= 1"):
        run_probe(iterations=0)
    with pytest.raises(ValueError, match="sizes_bytes must be a whole number >= 1"):
        run_probe(sizes_bytes=[1024, -1], matmul_budget_s=0.01)
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        run_probe(group=object())


# ---------------------------------------------------------------------------- the command
@pytest.mark.slow
def test_command_under_torchrun_prints_the_table_on_rank_zero_and_writes_the_json(tmp_path):
    """--output a link: replaced by the JSON, the file it pointed to left as it was."""
    output, private = tmp_path / "probe.json", tmp_path / "private.txt"
    private.write_text("mine\n")
    output.symlink_to(private)
    result = subprocess.run([BIN / "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()),
                             "-m", "nemo_throughput.cli", "probe", "--sizes", "4K,64KiB", "--iterations", "5",
                             "--time-budget", "1", "--output", output],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert not output.is_symlink() and private.read_text() == "mine\n"
    written = json.loads(output.read_text())
    assert written["world_size"] == 2 and written["backend"] == "gloo"
    assert {(row["op"], row["bytes"]) for row in written["collectives"]} == {
        (op, size) for op in OPS for size in (4096, 65536)}
    table = result.stdout
    assert table.count("# nemo-throughput probe: 2 ranks, backend gloo") == 1  # rank 0 only
    assert "#       size       count   type    time(us)  algbw(GB/s)  busbw(GB/s)  iters" in table
    first_row = next(row for row in written["collectives"] if row["op"] == "all_gather")
    assert f"        4096         512  float {first_row['time_us']:>11.1f}" in table
    assert "# sendrecv (pairs 0<->1)" in table and "# flagged (outside median +- max(3 MAD, 10 %)): none" in table


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "8X"], "size '8X' is not a positive number of bytes"),
    (["--sizes", "0"], "size '0' is not a positive number of bytes"),
    (["--iterations", "0"], "must be a whole number >= 1"),
    (["--time-budget", "-1"], "must be a positive number of seconds"),
    (["--backend", "mpi"], "invalid choice: 'mpi'"),
])
def test_command_refuses_bad_options_with_what_to_give(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["probe", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_command_refuses_nccl_without_cuda_and_an_output_in_a_missing_directory(tmp_path, capsys):
    if not torch.cuda.is_available():
        assert cli.main(["probe", "--backend", "nccl"]) == 2
        assert "--backend nccl needs CUDA" in capsys.readouterr().err
    assert cli.main(["probe", "--backend", "gloo", "--output", str(tmp_path / "missing" / "probe.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["probe", "--backend", "gloo", "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path} is a directory" in capsys.readouterr().err


def test_sizes_read_binary_units():
    assert [parse_size_bytes(text) for text in ("8K", "8KiB", "64M", "1G", "1048576", "2mb")] == [
        8192, 8192, 64 * 2**20, 2**30, 2**20, 2 * 2**20]


# ---------------------------------------------------------------------------- launchers' environments
def test_torchrun_variables_are_taken_as_they_are_and_incomplete_ones_refused():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "n1", "MASTER_PORT": "29500",
           "TORCHELASTIC_RUN_ID": "none",  # torchrun sets it
           "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}  # torchrun inside srun: torchrun's ranks win
    assert launcher_env(env) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "n1",
                                 "MASTER_PORT": "29500"}
    with pytest.raises(ValueError, match="MASTER_PORT not"):
        launcher_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n1"})
    assert launcher_env({"HOME": "/root"}) is None


STALE = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("env, message", [
    (STALE, "RANK=0 and WORLD_SIZE=2 are set, but no launcher started this process .* wait for 1 more rank"),
    ({**STALE, "RANK": "2", "TORCHELASTIC_RUN_ID": "x"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({**STALE, "WORLD_SIZE": "two", "TORCHELASTIC_RUN_ID": "x"}, "must be whole numbers"),
    ({**STALE, "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"},
     "disagree with this srun step's rank 1 of 4"),
])
def test_a_stale_or_inconsistent_rank_environment_is_refused_before_any_rendezvous(env, message):
    with pytest.raises(ValueError, match=message):
        launcher_env(env)
    assert launcher_env({**STALE, "WORLD_SIZE": "1", "RANK": "0"}) is not None  # one rank waits for nobody
    assert launcher_env({**STALE, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is not None  # a PyTorchJob pod


def test_the_command_in_a_shell_with_a_stale_export_says_so_at_once(tmp_path):
    """What used to wait 30 minutes: `export RANK=0 WORLD_SIZE=2 ...` left over, then `nemo-throughput probe`."""
    env = {key: value for key, value in os.environ.items() if key not in ("TORCHELASTIC_RUN_ID", "SLURM_STEP_ID")}
    result = subprocess.run([BIN / "nemo-throughput", "probe", "--backend", "gloo"], env={**env, **STALE},
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("nemo-throughput probe: RANK=0 and WORLD_SIZE=2 are set, but no launcher")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_rank_whose_peers_never_come_gives_up_after_the_rendezvous_timeout(tmp_path):
    """A launcher's variables, but rank 0 never starts: a one-line error after --rendezvous-timeout."""
    env = {**os.environ, **STALE, "RANK": "1", "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": "x"}
    result = subprocess.run([BIN / "nemo-throughput", "probe", "--backend", "gloo", "--rendezvous-timeout", "2"],
                            env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]  # after torch's own c10d log line
    assert last.startswith("nemo-throughput probe: rank 1 of 2 could not meet the other ranks at 127.0.0.1:")
    assert "within 2 s" in last and "Traceback" not in result.stderr


def test_srun_variables_give_rank_world_size_and_the_first_node_of_the_step():
    env = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "16", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5",
           "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "2", "SLURM_STEP_NODELIST": "gpu[07-08]",
           "SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7"}
    assert launcher_env(env) == {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "MASTER_ADDR": "gpu07",
                                 "MASTER_PORT": str(20000 + (1234 * 16 + 2) % 40000)}
    given = launcher_env({**env, "MASTER_ADDR": "head", "MASTER_PORT": "6000"})  # benchmark.sbatch exports them
    assert (given["MASTER_ADDR"], given["MASTER_PORT"]) == ("head", "6000")
    del env["SLURM_STEP_NODELIST"], env["SLURM_JOB_NODELIST"]
    assert launcher_env(env)["MASTER_ADDR"] == "10.0.0.7"
    # a batch script's own shell is one process, whatever SLURM_NTASKS says
    assert launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_JOB_NODELIST": "gpu[07-08]"}) is None


@pytest.mark.parametrize("procid, tasks", [("5", "2"), ("2", "2"), ("0", "abc"), ("-1", "2"), ("0", "0"), ("²", "4")])
def test_srun_variables_that_no_srun_step_has_are_refused_before_any_rendezvous(procid, tasks):
    """SLURM_PROCID=5 of SLURM_STEP_NUM_TASKS=2 waited the whole rendezvous timeout for ranks that never come."""
    with pytest.raises(ValueError, match=f"SLURM_PROCID='{procid}' and SLURM_STEP_NUM_TASKS='{tasks}' must be whole "
                                         "numbers, the rank below the number of tasks"):
        launcher_env({"SLURM_PROCID": procid, "SLURM_STEP_NUM_TASKS": tasks, "SLURM_JOB_ID": "1",
                      "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu07"})


def test_first_host_of_a_slurm_nodelist():
    assert first_host("gpu[07-09,12],login1") == "gpu07"
    assert first_host("rack[1-2]-n[03-04]") == "rack1-n03"
    assert first_host("a,b") == "a" and first_host("node01") == "node01"
    with pytest.raises(ValueError, match="export MASTER_ADDR"):
        first_host("gpu[07")


@pytest.mark.slow
def test_command_under_srun_on_two_slurm_nodes_finds_rank_zero_and_pairs_across_nodes(tmp_path_factory, tmp_path):
    from slurm_cluster import LocalSlurmCluster, missing_reason
    if missing_reason():
        pytest.skip(missing_reason())
    cluster = LocalSlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, gpus_per_node=1)
    cluster.start()
    try:
        env = {**cluster.env, "PATH": f"{BIN}:{os.environ['PATH']}", "MASTER_PORT": str(free_port())}
        env.pop("MASTER_ADDR", None)  # derived from the step's nodelist
        output = tmp_path / "probe.json"
        result = subprocess.run(["srun", "--nodes", "2", "--ntasks-per-node", "1", "--time", "2",
                                 "nemo-throughput", "probe", "--sizes", "4K", "--iterations", "3",
                                 "--time-budget", "0.5", "--output", str(output)],
                                capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    finally:
        cluster.stop()
    assert result.returncode == 0, result.stdout + result.stderr + cluster.logs()
    written = json.loads(output.read_text())
    assert written["world_size"] == 2
    assert [place["host"] for place in written["ranks"]] == ["node01", "node02"]
    assert written["sendrecv"]["pairs"] == [[0, 1]]
    assert result.stdout.count("# nemo-throughput probe") == 1
