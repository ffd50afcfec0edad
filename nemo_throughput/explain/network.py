"""The summary's ``network`` section: the settings that decide NCCL's transport, and the transport
NCCL really chose where its ``NCCL_DEBUG=INFO`` lines say so.

NCCL names its choice in INFO lines such as::

    host:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>
    host:1:2 [0] NCCL INFO Using network IB
    host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
    host:1:2 [0] NCCL INFO Channel 01/0 : 1[1] -> 2[2] via P2P/IPC/read

Channel lines are the strongest evidence (they name the transport of each connection), then the
``Using network`` line (the network NCCL initialised for traffic between nodes). The environment
decides only when it forces a network (``NCCL_NET``); anything else is not a guess we make:
``NCCL_IB_DISABLE=1`` does not stop a network plugin from using RDMA. Unknown stays None; when
the environment and the log disagree the log wins and ``note`` says so.

Labels, which ``report`` groups runs by: RDMA (NCCL's IB network, over InfiniBand or RoCE), IPoIB
(sockets on ib* interfaces), TCP (sockets on other interfaces), intra-node (only P2P / shared
memory connections), None when unknown.
"""

from __future__ import annotations

import os
import re
import socket
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_throughput.text import package_logger

log = package_logger(__name__)

TRANSPORT_ENV_PREFIXES = ("NCCL_", "GLOO_", "UCX_")  # TORCH_NCCL_* tune torch's watchdog, not the transport
MAX_DEBUG_FILE_BYTES = 32 * 1024 * 1024  # NCCL's init lines come first; NCCL_DEBUG_SUBSYS=ALL files can be huge

_INFO = re.compile(r"NCCL INFO (.*?)\s*$")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_CHANNEL = re.compile(r"^(?:Channel|Ring) \d+(?:/\d+)? : .*? via (\S.*)$")
_USING_NETWORK = re.compile(r"^Using network (\S.*)$")
_IB_DEVICES = re.compile(r"^NET/IB ?: Using (.*)$")
_IB_PORT = re.compile(r"([\w.-]+:\d+)/(IB|RoCE)\b")
_SOCKET_DEVICES = re.compile(r"^NET/Socket ?: Using (.*)$")
_SOCKET_INTERFACE = re.compile(r"\[\d+\]([^:\s]+):")
_ENV_SET = re.compile(r"^(NCCL_\w+) set (?:by environment )?to (.*?)\.?$")
_NODES = re.compile(r"\bnNodes (\d+)\b")


class NcclLines:
    """What a run's ``NCCL_DEBUG=INFO`` lines say about its network."""

    def __init__(self) -> None:
        self.info_lines = 0
        self.version: str | None = None
        self.networks: list[str] = []  # "Using network <name>", in order, distinct
        self.channels: Counter[str] = Counter()  # "NET/IB", "NET/Socket", "P2P", "SHM", ... -> channel lines
        self.gdrdma = False
        self.ib_ports: dict[str, str] = {}  # "mlx5_0:1" -> "IB" | "RoCE"
        self.socket_interfaces: list[str] = []
        self.env: dict[str, str] = {}  # NCCL_* as NCCL reports it read them
        self.nodes: int | None = None  # the largest nNodes of any communicator

    def feed(self, line: str) -> None:
        if self.version is None and (version := _VERSION.search(line)):
            self.version = version.group(1)
        info = _INFO.search(line)
        if info is None:
            return
        self.info_lines += 1
        message = info.group(1)
        if channel := _CHANNEL.match(message):
            self._add_channel(channel.group(1))
        elif network := _USING_NETWORK.match(message):
            if network.group(1) not in self.networks:
                self.networks.append(network.group(1))
        elif devices := _IB_DEVICES.match(message):
            self.ib_ports.update(dict(_IB_PORT.findall(devices.group(1))))
        elif devices := _SOCKET_DEVICES.match(message):
            for name in _SOCKET_INTERFACE.findall(devices.group(1)):
                if name not in self.socket_interfaces:
                    self.socket_interfaces.append(name)
        elif setting := _ENV_SET.match(message):
            self.env[setting.group(1)] = setting.group(2)
        if nodes := _NODES.search(message):
            self.nodes = max(self.nodes or 0, int(nodes.group(1)))

    def _add_channel(self, via: str) -> None:
        parts = via.split("/")
        if parts[0] == "NET" and len(parts) > 1:
            self.channels[f"NET/{parts[1]}"] += 1
            self.gdrdma = self.gdrdma or "GDRDMA" in parts[2:]
        elif parts[0].startswith("P2P") or via.startswith("direct pointer"):
            self.channels["P2P"] += 1
        elif parts[0].startswith("SHM") or via.startswith("direct shared memory"):
            self.channels["SHM"] += 1
        else:
            self.channels[parts[0].split()[0]] += 1  # CollNet, NVLS, ...: recorded, not classified


def read_nccl_lines(lines: Iterable[str]) -> NcclLines:
    parsed = NcclLines()
    for line in lines:
        parsed.feed(line)
    return parsed


def _family(network: str) -> str:
    """NCCL's own IB network and IB plugins (IBext, IBext_v8: the SHARP plugin's verbs transport) are IB."""
    return "IB" if network.upper().startswith("IB") else network


def transport_from_nccl_lines(lines: Iterable[str] | NcclLines, num_nodes: int | None = None) -> dict[str, Any] | None:
    """The transport NCCL chose, from ``NCCL_DEBUG=INFO`` lines; None when the lines say nothing about it.

    ``num_nodes`` (or the lines' own ``nNodes``) above 1 keeps P2P/SHM-only channel lines (one rank's
    view of a multi-node run) from being taken for an intra-node run.
    """
    parsed = lines if isinstance(lines, NcclLines) else read_nccl_lines(lines)
    if not (parsed.channels or parsed.networks or parsed.version or parsed.env):
        return None
    nodes = max(num_nodes or 0, parsed.nodes or 0) or None
    result: dict[str, Any] = {"transport": None, "interface": None, "label": None, "nccl_net": None,
                              "evidence": None, "nccl_version": parsed.version,
                              "channels": dict(sorted(parsed.channels.items())) or None,
                              "gdrdma": parsed.gdrdma if any(c.startswith("NET/") for c in parsed.channels) else None,
                              "nodes": nodes, "env": dict(sorted(parsed.env.items())), "note": None}
    channel_nets = [name.removeprefix("NET/") for name in parsed.channels if name.startswith("NET/")]
    intra = [name for name in ("P2P", "SHM") if parsed.channels[name]]
    if channel_nets:
        _set_network(result, parsed, channel_nets, "channel lines (via NET/...)")
    elif intra and (nodes or 1) == 1:
        result.update(transport=intra[0], label="intra-node", evidence="channel lines (only P2P / SHM)")
    elif parsed.networks:
        _set_network(result, parsed, parsed.networks, "'Using network' line (no channel line over the network)")
    elif intra:
        result["note"] = (f"only P2P / SHM channel lines, but the run spans {nodes} nodes: these lines are one "
                          "rank's view; transport unknown")
    return result


def _set_network(result: dict[str, Any], parsed: NcclLines, networks: Sequence[str], evidence: str) -> None:
    families = sorted({_family(name) for name in networks})
    result["nccl_net"] = ",".join(networks)
    result["evidence"] = evidence
    if len(families) > 1:
        result["note"] = f"several networks in the lines ({', '.join(networks)}): transport left unknown"
        return
    family = families[0]
    if family == "IB":
        layers = set(parsed.ib_ports.values())
        result["transport"] = "RoCE" if layers == {"RoCE"} else "IB"
        result["interface"] = ",".join(parsed.ib_ports) or None
        result["label"] = "RDMA"
    elif family == "Socket":
        result["transport"] = "Socket"
        result["interface"] = ",".join(parsed.socket_interfaces) or None
        result["label"] = socket_label(parsed.socket_interfaces)
    else:
        result["note"] = f"network plugin {family!r}: its transport is not classified"


def socket_label(interfaces: Sequence[str]) -> str | None:
    """IPoIB when every interface is an IPoIB one (ib*), TCP when none is, None when mixed or unknown."""
    if not interfaces:
        return None
    on_ib = [name.startswith("ib") for name in interfaces]
    return "IPoIB" if all(on_ib) else "TCP" if not any(on_ib) else None


def _ifname_label(value: str) -> str | None:
    """The label NCCL_SOCKET_IFNAME implies: its entries are interface-name prefixes ("=" exact,
    "^" excludes). IPoIB when every entry can match only ib* names, TCP when none can match one."""
    if not value or value.startswith("^"):
        return None
    entries = [entry.lstrip("=") for entry in value.split(",") if entry.lstrip("=")]
    can_be_ib = ["ib".startswith(entry) or entry.startswith("ib") for entry in entries]
    only_ib = [entry.startswith("ib") for entry in entries]
    return "IPoIB" if entries and all(only_ib) else "TCP" if entries and not any(can_be_ib) else None


def transport_from_env(env: Mapping[str, str]) -> dict[str, Any] | None:
    """What the environment forces: only ``NCCL_NET`` names the network outright."""
    forced = env.get("NCCL_NET", "").strip()
    if _family(forced) == "IB" and forced:
        return {"transport": "IB", "interface": env.get("NCCL_IB_HCA"), "label": "RDMA"}
    if forced.lower() == "socket":
        ifname = env.get("NCCL_SOCKET_IFNAME")
        return {"transport": "Socket", "interface": ifname, "label": _ifname_label(ifname or "")}
    return None


def nccl_debug_file(env: Mapping[str, str] = os.environ, hostname: str | None = None,
                    pid: int | None = None) -> Path | None:
    """The file NCCL writes this process's debug lines to, as NCCL expands NCCL_DEBUG_FILE:
    %h the host name up to its first dot (with % and / made -), %p the pid, %% a %."""
    pattern = env.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    host = (hostname or socket.gethostname()).split(".")[0].replace("%", "-").replace("/", "-")
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern):
            code = pattern[i + 1]
            out.append({"%": "%", "h": host, "p": str(pid if pid is not None else os.getpid())}.get(code, "%" + code))
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return Path("".join(out))


def _read_debug_file(path: Path) -> list[str] | None:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_DEBUG_FILE_BYTES)
    except OSError as error:
        log.debug("cannot read NCCL debug file %s: %s", path, error)
        return None
    return data.decode("utf-8", errors="replace").splitlines()


def _nccl_version_from_torch() -> str | None:
    import torch  # here, not at the top: `nemo-throughput import` reads logs without torch

    try:
        if not (torch.version.cuda and torch.cuda.is_available()):
            return None
        version = torch.cuda.nccl.version()
    except Exception:  # a torch built without NCCL
        return None
    if isinstance(version, tuple):
        return ".".join(map(str, version))
    if not isinstance(version, int):
        return None
    major, rest = divmod(version, 10000 if version >= 10000 else 1000)  # NCCL_VERSION_CODE: 22105, or 2408 before 2.9
    return f"{major}.{rest // 100}.{rest % 100}"


def _transport_env(nodes: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], dict[str, dict[str, str | None]]]:
    """The first node's transport settings, and per setting that differs between nodes: node -> value."""
    envs = [(node.get("name") or node.get("node") or str(i),
             {k: v for k, v in (node.get("communication_env") or {}).items() if k.startswith(TRANSPORT_ENV_PREFIXES)})
            for i, node in enumerate(nodes)]
    if not envs:
        return {}, {}
    keys = sorted({key for _, env in envs for key in env})
    differing = {key: {name: env.get(key) for name, env in envs} for key in keys
                 if len({env.get(key) for _, env in envs}) > 1}
    return dict(sorted(envs[0][1].items())), differing


def network_section(nodes: Sequence[Mapping[str, Any]], backend: str | None, *,
                    nccl_lines: Iterable[str] | NcclLines | None = None, nccl_source: str | None = None,
                    num_nodes: int | None = None, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The ``network`` section.

    ``nodes``: the environment section's nodes, or every rank's ``environment.rank_record()`` (each with
    ``communication_env``). ``nccl_lines``: NCCL INFO lines (the imported log's), named by
    ``nccl_source``; None reads the file NCCL_DEBUG_FILE names for this process when the backend is nccl.
    """
    settings, differing = _transport_env(nodes)
    num_nodes = num_nodes or (len({n.get("name") or n.get("node") for n in nodes}) if nodes else None)
    note = None
    if nccl_lines is None and backend == "nccl":
        nccl_lines, nccl_source, note = _live_nccl_lines(env)
    from_log = transport_from_nccl_lines(nccl_lines, num_nodes) if nccl_lines is not None else None
    if from_log is not None and not settings:
        settings = from_log["env"]  # an imported log: the settings NCCL reported reading
    log_version = from_log["nccl_version"] if from_log else None
    section: dict[str, Any] = {
        "backend": backend,
        "nccl_version": log_version or (_nccl_version_from_torch() if backend == "nccl" else None),
        "env": settings,
        "env_differs_by_node": differing or None,
        "transport": None, "interface": None, "transport_source": None, "label": None,
        "channels": None, "gdrdma": None, "note": note,
    }
    forced = transport_from_env(settings) if backend == "nccl" else None
    if from_log is not None and (from_log["transport"] or from_log["label"]):
        section.update({key: from_log[key] for key in ("transport", "interface", "label", "channels", "gdrdma")},
                       transport_source=f"nccl_debug:{nccl_source}" if nccl_source else "nccl_debug")
        section["note"] = _disagreement(settings, from_log) or from_log["note"]
    elif forced is not None:
        section.update(forced, transport_source="env")
        if from_log is not None and from_log["note"]:
            section["note"] = from_log["note"]
    elif from_log is not None:
        section["note"] = from_log["note"] or section["note"]
    return section


def _live_nccl_lines(env: Mapping[str, str]) -> tuple[list[str] | None, str | None, str | None]:
    """This process's NCCL debug lines, where NCCL_DEBUG_FILE put them; else why there are none."""
    path = nccl_debug_file(env)
    if path is None:
        if env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
            return None, None, ("NCCL_DEBUG=INFO writes to stdout, which the callback cannot read: set "
                                "NCCL_DEBUG_FILE (e.g. /tmp/nccl.%h.%p.log), or `nemo-throughput import` the log")
        return None, None, None
    lines = _read_debug_file(path)
    if lines is None:
        return None, None, f"cannot read NCCL_DEBUG_FILE {path} (NCCL writes it only with NCCL_DEBUG=INFO or WARN)"
    return lines, str(path), None


def _disagreement(settings: Mapping[str, str], from_log: Mapping[str, Any]) -> str | None:
    """What the environment asked for that the log shows NCCL did not do (the log wins)."""
    transport, interface = from_log["transport"], from_log["interface"]
    forced = settings.get("NCCL_NET", "").strip()
    if forced and from_log["nccl_net"] and _family(forced) != _family(from_log["nccl_net"].split(",")[0]):
        return f"NCCL_NET={forced} is set but NCCL used {from_log['nccl_net']}; the log wins"
    if settings.get("NCCL_IB_DISABLE", "").strip() == "1" and transport in ("IB", "RoCE"):
        return (f"NCCL_IB_DISABLE=1 is set but NCCL used {from_log['nccl_net']} (a network plugin does not obey it); "
                "the log wins")
    ifname = settings.get("NCCL_SOCKET_IFNAME", "")
    if transport == "Socket" and interface and ifname and not ifname.startswith("^"):
        prefixes = [entry.lstrip("=") for entry in ifname.split(",")]
        used = interface.split(",")
        if not all(any(name.startswith(prefix) for prefix in prefixes) for name in used):
            return f"NCCL_SOCKET_IFNAME={ifname} is set but NCCL used {interface}; the log wins"
    return None


def section_from_log(lines: Iterable[str], source: str, num_nodes: int | None = None) -> dict[str, Any] | None:
    """The ``network`` section of an imported log, from its NCCL INFO lines; None when it has none."""
    parsed = read_nccl_lines(lines)
    if not parsed.info_lines:
        return None
    section = network_section([], "nccl", nccl_lines=parsed, nccl_source=source, num_nodes=num_nodes)
    section["nccl_version"] = parsed.version  # the log's, never this machine's torch
    return section
