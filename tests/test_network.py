"""The network section (nemo_throughput/explain/network.py), from real NCCL_DEBUG=INFO lines
(tests/data/nccl, origins in its ORIGIN.md), the environment, and `nemo-throughput import`."""

import json
import os
import socket
from pathlib import Path

import pytest

from nemo_throughput import environment
from nemo_throughput.cli import main
from nemo_throughput.explain.network import (
    nccl_debug_file,
    network_section,
    section_from_log,
    socket_label,
    transport_from_env,
    transport_from_nccl_lines,
)

DATA = Path(__file__).parent / "data" / "nccl"


def lines_of(name):
    return (DATA / name).read_text().splitlines()


@pytest.mark.parametrize("fixture, transport, interface, label, version", [
    ("ib_gdrdma.log", "IB", None, "RDMA", None),
    ("ib_with_p2p.log", "IB", None, "RDMA", None),
    ("roce_using_network.log", "RoCE", "mlx5_10:1,mlx5_11:1", "RDMA", "2.19.3"),
    ("roce_hca_set.log", "RoCE", "mlx5_4:1", "RDMA", "2.18.5"),
    ("ibext_plugin.log", "RoCE", "mlx5_2:1,mlx5_3:1,mlx5_0:1,mlx5_1:1", "RDMA", None),
    ("socket_lo.log", "Socket", "lo", "TCP", None),
    ("socket_ethernet.log", "Socket", "enp225s0f1", "TCP", "2.11.4"),
    ("ipoib_socket.log", "Socket", "ibs85f0,ib0", "IPoIB", None),
    ("socket_with_p2p.log", "Socket", None, None, None),  # the interface is not in the lines: no label
    ("p2p_single_node.log", "P2P", None, "intra-node", None),
    ("shm_single_node.log", "SHM", None, "intra-node", None),
    ("old_nccl_bootstrap_socket.log", None, None, None, "2.4.7"),  # bootstrap socket + IB devices: not guessed
])
def test_real_nccl_lines(fixture, transport, interface, label, version):
    found = transport_from_nccl_lines(lines_of(fixture))
    assert (found["transport"], found["interface"], found["label"], found["nccl_version"]) == (
        transport, interface, label, version)


def test_channel_lines_are_the_evidence_over_the_using_network_line():
    found = transport_from_nccl_lines(lines_of("ib_gdrdma.log"))
    assert found["evidence"] == "channel lines (via NET/...)" and found["gdrdma"] is True
    assert found["channels"] == {"NET/IB": 12}
    found = transport_from_nccl_lines(lines_of("ib_with_p2p.log"))
    assert found["channels"] == {"NET/IB": 2, "P2P": 10}
    found = transport_from_nccl_lines(lines_of("roce_using_network.log"))
    assert found["evidence"].startswith("'Using network' line") and found["gdrdma"] is None


def test_ib_plugin_counts_as_ib_and_its_node_count_is_read():
    found = transport_from_nccl_lines(lines_of("ibext_plugin.log"))
    assert found["nccl_net"] == "IBext_v8" and found["nodes"] == 3
    assert found["env"] == {"NCCL_P2P_LEVEL": "LOC"}


def test_settings_nccl_reports_reading_are_kept():
    assert transport_from_nccl_lines(lines_of("socket_lo.log"))["env"] == {
        "NCCL_IBEXT_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}
    assert transport_from_nccl_lines(lines_of("roce_hca_set.log"))["env"] == {"NCCL_IB_HCA": "mlx5_4"}


def test_launcher_prefixes_do_not_hide_nccl_lines():
    srun = [f"{i % 4}: {line}" for i, line in enumerate(lines_of("ipoib_socket.log"))]
    assert transport_from_nccl_lines(srun)["label"] == "IPoIB"


def test_p2p_lines_of_one_rank_in_a_multi_node_run_are_not_intra_node():
    found = transport_from_nccl_lines(lines_of("p2p_single_node.log"), num_nodes=2)
    assert found["transport"] is None and found["label"] is None
    assert "spans 2 nodes" in found["note"]


def test_lines_without_nccl_say_nothing():
    assert transport_from_nccl_lines(["Epoch 0: 100%|####| 10/10", "iteration 10/100 |"]) is None


@pytest.mark.parametrize("interfaces, label", [
    (["ib0"], "IPoIB"), (["ibs85f0", "ib1"], "IPoIB"), (["eth0"], "TCP"), (["enp225s0f1", "lo"], "TCP"),
    (["ib0", "eth0"], None), ([], None)])
def test_socket_labels(interfaces, label):
    assert socket_label(interfaces) == label


@pytest.mark.parametrize("env, expected", [
    ({"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "ib"}, ("Socket", "ib", "IPoIB")),
    ({"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "=ib0"}, ("Socket", "=ib0", "IPoIB")),
    ({"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "eth0,ens"}, ("Socket", "eth0,ens", "TCP")),
    ({"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "^lo,docker"}, ("Socket", "^lo,docker", None)),  # excludes only
    ({"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "i"}, ("Socket", "i", None)),  # could match ib0 or ixgbe0
    ({"NCCL_NET": "Socket"}, ("Socket", None, None)),
    ({"NCCL_NET": "IB", "NCCL_IB_HCA": "mlx5_0"}, ("IB", "mlx5_0", "RDMA")),
])
def test_what_the_environment_forces(env, expected):
    found = transport_from_env(env)
    assert (found["transport"], found["interface"], found["label"]) == expected


@pytest.mark.parametrize("env", [{}, {"NCCL_IB_DISABLE": "1"}, {"NCCL_SOCKET_IFNAME": "eth0"},
                                 {"NCCL_NET": "AWS Libfabric"}])
def test_settings_that_do_not_force_a_network_are_not_guessed_from(env):
    assert transport_from_env(env) is None


# ---------------------------------------------------------------------------------------------
# the section


def nodes_with(*envs):
    return [{"name": f"node{i}", "ranks": [i], "pods": [], "communication_env": env} for i, env in enumerate(envs)]


def test_the_log_wins_over_the_environment_and_says_so():
    nodes = nodes_with({"NCCL_IB_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    section = network_section(nodes, "nccl", nccl_lines=lines_of("ibext_plugin.log"), nccl_source="run.log")
    assert section["transport"] == "RoCE" and section["label"] == "RDMA"
    assert section["transport_source"] == "nccl_debug:run.log"
    assert section["note"].startswith("NCCL_IB_DISABLE=1 is set but NCCL used IBext_v8")
    assert section["env"] == {"NCCL_IB_DISABLE": "1"}  # torch's own TORCH_NCCL_* settings are not the transport's


def test_an_interface_outside_nccl_socket_ifname_is_a_disagreement():
    section = network_section(nodes_with({"NCCL_SOCKET_IFNAME": "eth0"}), "nccl", nccl_lines=lines_of("socket_lo.log"),
                              nccl_source="x.log")
    assert section["interface"] == "lo" and section["label"] == "TCP"
    assert section["note"] == "NCCL_SOCKET_IFNAME=eth0 is set but NCCL used lo; the log wins"
    agreeing = network_section(nodes_with({"NCCL_SOCKET_IFNAME": "en"}), "nccl",
                               nccl_lines=lines_of("socket_ethernet.log"), nccl_source="x.log")
    assert agreeing["note"] is None


def test_forced_network_without_lines_comes_from_the_environment():
    section = network_section(nodes_with({"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "ib0"}), "nccl", nccl_lines=[],
                              env={})
    assert (section["transport"], section["label"], section["transport_source"]) == ("Socket", "IPoIB", "env")


def test_unknown_stays_none():
    section = network_section(nodes_with({"NCCL_IB_DISABLE": "1"}), "nccl", env={})
    assert section["transport"] is None and section["label"] is None and section["transport_source"] is None
    assert section["env"] == {"NCCL_IB_DISABLE": "1"}


def test_settings_that_differ_between_nodes_are_listed():
    section = network_section(nodes_with({"NCCL_SOCKET_IFNAME": "eno1", "NCCL_IB_HCA": "mlx5"},
                                         {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5"}), "nccl", env={})
    assert section["env"] == {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eno1"}
    assert section["env_differs_by_node"] == {"NCCL_SOCKET_IFNAME": {"node0": "eno1", "node1": "eth0"}}


def test_rank_records_as_the_callback_gathers_them():
    env = {"NCCL_NET": "IB", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "LOCAL_RANK": "0", "SLURMD_NODENAME": "gpu01"}
    records = [environment.rank_record(env), environment.rank_record({**env, "LOCAL_RANK": "1"})]
    section = network_section(records, "nccl", env={})
    assert section["env"] == {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_NET": "IB"}
    assert (section["transport"], section["label"], section["transport_source"]) == ("IB", "RDMA", "env")


def test_gloo_has_no_nccl_transport_but_keeps_the_settings():
    section = network_section(nodes_with({"GLOO_SOCKET_IFNAME": "eth0", "NCCL_NET": "Socket"}), "gloo", env={})
    assert section["backend"] == "gloo" and section["nccl_version"] is None
    assert section["transport"] is None and section["label"] is None
    assert section["env"] == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_NET": "Socket"}
    json.dumps(section, allow_nan=False)


# ---------------------------------------------------------------------------------------------
# the live run: the file NCCL_DEBUG_FILE names


def test_nccl_debug_file_expands_as_nccl_does():
    env = {"NCCL_DEBUG_FILE": "/logs/nccl.%h.%p.log"}
    assert nccl_debug_file(env, hostname="gpu01.cluster.local", pid=42) == Path("/logs/nccl.gpu01.42.log")
    assert nccl_debug_file({"NCCL_DEBUG_FILE": "/l/100%%.%x.%h"}, hostname="a/b%c", pid=1) == Path("/l/100%.%x.a-b-c")
    assert nccl_debug_file({}) is None


def test_live_section_reads_this_processs_nccl_debug_file(tmp_path):
    host = socket.gethostname().split(".")[0]
    (tmp_path / f"nccl.{host}.{os.getpid()}.log").write_text((DATA / "ib_with_p2p.log").read_text())
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log")}
    section = network_section(nodes_with({}, {}), "nccl", env=env)
    assert section["transport_source"] == f"nccl_debug:{tmp_path}/nccl.{host}.{os.getpid()}.log"
    assert section["label"] == "RDMA" and section["channels"] == {"NET/IB": 2, "P2P": 10}


def test_nccl_info_on_stdout_is_named_as_the_reason():
    section = network_section(nodes_with({}), "nccl", env={"NCCL_DEBUG": "INFO"})
    assert section["transport"] is None and "set NCCL_DEBUG_FILE" in section["note"]
    missing = network_section(nodes_with({}), "nccl", env={"NCCL_DEBUG_FILE": "/nonexistent/nccl.%p"})
    assert missing["transport"] is None and missing["note"].startswith("cannot read NCCL_DEBUG_FILE /nonexistent/nccl.")


# ---------------------------------------------------------------------------------------------
# nemo-throughput import


MEGATRON_LINE = (" iteration {step:8d}/     100 | consumed samples: {samples:12d} | "
                 "elapsed time per iteration (ms): 1500.0 | global batch size:   128 |")


def test_section_from_an_imported_log_uses_the_logs_version_and_settings():
    section = section_from_log(lines_of("socket_lo.log"), "job.out", num_nodes=2)
    assert section["nccl_version"] is None  # not this machine's torch
    assert section["env"]["NCCL_SOCKET_IFNAME"] == "lo" and section["label"] == "TCP"
    assert section_from_log(["no nccl here"], "job.out") is None


def test_import_adds_the_network_section_from_the_logs_nccl_lines(tmp_path, capsys):
    nccl = lines_of("roce_using_network.log") + lines_of("ib_with_p2p.log")
    steps = [MEGATRON_LINE.format(step=s, samples=128 * s) for s in range(1, 21)]
    log = tmp_path / "job.out"
    log.write_text("\n".join(f"0: {line}" for line in nccl + steps) + "\n")
    quiet = tmp_path / "quiet.out"
    quiet.write_text("\n".join(steps) + "\n")
    out = tmp_path / "out"
    for path in (log, quiet):
        code = main(["import", str(path), "--label", "bare-metal", "--model", "gpt3-126m", "--seq-length", "2048",
                     "--num-gpus", "16", "--output-dir", str(out)])
        assert code == 0, capsys.readouterr().err
    network = json.loads((out / "job" / "summary.json").read_text())["network"]
    assert (network["transport"], network["label"], network["nccl_version"]) == ("RoCE", "RDMA", "2.19.3")
    assert network["transport_source"] == f"nccl_debug:{log}"
    assert json.loads((out / "quiet" / "summary.json").read_text())["network"] is None


@pytest.mark.parametrize("env", [{"LOCAL_RANK": "²"}, {"LOCAL_RANK": "first"}, {"SLURM_LOCALID": "-1"}])
def test_a_local_rank_that_is_not_a_whole_number_is_recorded_as_unknown_not_a_crash(env):
    assert environment.rank_record(env)["local_rank"] is None


@pytest.mark.parametrize("rank, world", [("²", "2"), ("0", "²"), ("0", "1e3")])
def test_rank_variables_that_are_not_whole_numbers_are_refused_naming_them(rank, world):
    env = {"RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(ValueError, match=rf"RANK={rank!r} and WORLD_SIZE={world!r} must be whole numbers"):
        environment.launcher_env(env)
