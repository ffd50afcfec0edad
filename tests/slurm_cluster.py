"""A real Slurm cluster on this host for the launcher tests: munged, slurmctld and one slurmd per
emulated node, all in a private directory, as root, without systemd or cgroups (docs/contributing/testing.md).

Nodes share NodeAddr 127.0.0.1 on distinct ports; their names resolve through /etc/hosts. Each
node has fake GPUs (character devices like /dev/null) so that `--gpus-per-node` is real GRES. The
scheduler passes every 2 s (not 60), so that a job whose start time is moved (`release_requeued`)
starts within seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from conftest import free_port

REQUIRED = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sacct")


def missing_reason() -> str | None:
    """Why a cluster cannot start here, or None."""
    absent = [tool for tool in REQUIRED[:-1] if shutil.which(tool) is None]
    if absent:
        return f"Slurm is not installed ({', '.join(absent)} missing): run .ci/setup-slurm"
    if os.geteuid() != 0:
        return "the local Slurm cluster runs its daemons as root"
    return None


class LocalSlurmCluster:
    def __init__(self, root: Path, nodes: int = 2, cpus_per_node: int = 2, gpus_per_node: int = 2) -> None:
        self.root = root
        self.node_names = [f"node{i + 1:02d}" for i in range(nodes)]
        self.cpus_per_node = cpus_per_node
        self.gpus_per_node = gpus_per_node
        self.conf = root / "slurm.conf"
        self._daemons: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands (sbatch, squeue, ...) that talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 60) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_config()
        self._add_hosts()
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)])
        for name in self.node_names:
            self._spawn(["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self.scontrol("show", "nodes", "-o", check=False).stdout
            if states.count("State=IDLE") == len(self.node_names):
                return
            time.sleep(0.5)
        raise RuntimeError(f"Slurm nodes did not come up:\n{states}\n{self.logs()}")

    def stop(self) -> None:
        for daemon in reversed(self._daemons):
            daemon.terminate()
        for daemon in self._daemons:
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
        self._daemons.clear()

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, check=check)

    def wait_for_job(self, job_id: str, timeout_s: float = 300) -> str:
        """Block until the job left the queue; return its final state."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.scontrol("show", "job", job_id, "-o", check=False).stdout
            state = next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} still in the queue after {timeout_s} s:\n{self.logs()}")

    def release_requeued(self, job_id: str, timeout_s: float = 120) -> None:
        """Start a requeued job now. Slurm holds one until its job credentials expire (cred_expire,
        120 s); a shorter lifetime for every job risks "Job credential replayed/expired" on this loaded
        host. Moved a whole second after the requeue (not within the second of it, when its new
        credentials would fall in the revoked ones' second and the job fail)."""
        deadline = time.monotonic() + timeout_s
        while "JobState=PENDING" not in self.scontrol("show", "job", job_id, "-o", check=False).stdout:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} was not requeued within {timeout_s} s:\n{self.logs()}")
            time.sleep(0.2)
        time.sleep(2)
        self.scontrol("update", f"jobid={job_id}", "StartTime=now")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    # ------------------------------------------------------------------ internals
    def _spawn(self, command: list[str]) -> None:
        log = open(self.root / f"{command[0]}-{len(self._daemons)}.out", "w")
        self._daemons.append(subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700, exist_ok=True)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = munge / "munge.socket"
        self._spawn(["munged", "--foreground", f"--key-file={key}", f"--socket={self.munge_socket}",
                     f"--pid-file={munge / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}",
                     f"--seed-file={munge / 'munged.seed'}", "--force"])
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{self.logs()}")
            time.sleep(0.1)

    def _write_config(self) -> None:
        gpus = []
        for name in self.node_names:
            for g in range(self.gpus_per_node):
                device = self.root / f"{name}-gpu{g}"
                if not device.exists():
                    os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null
                gpus.append(f"NodeName={name} Name=gpu File={device}")
        (self.root / "gres.conf").write_text("\n".join(gpus) + "\n")
        for directory in ("state", *(f"spool/{name}" for name in self.node_names)):
            (self.root / directory).mkdir(parents=True, exist_ok=True)
        nodes = "\n".join(
            f"NodeName={name} NodeAddr=127.0.0.1 Port={free_port()} CPUs={self.cpus_per_node} "
            f"Gres=gpu:{self.gpus_per_node} State=UNKNOWN"
            for name in self.node_names
        )
        self.conf.write_text(f"""\
ClusterName=nemo-throughput-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={self.root / 'state'}
SlurmdSpoolDir={self.root / 'spool'}/%n
SlurmctldPidFile={self.root / 'slurmctld.pid'}
SlurmdPidFile={self.root / 'slurmd'}-%n.pid
SlurmctldLogFile={self.root / 'slurmctld.log'}
SlurmdLogFile={self.root / 'slurmd'}-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
{nodes}
PartitionName=batch Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP
""")

    def _add_hosts(self) -> None:
        hosts = Path("/etc/hosts")
        known = hosts.read_text()
        missing = [name for name in self.node_names if not any(name in line.split() for line in known.splitlines())]
        if missing:
            with hosts.open("a") as f:
                f.write(f"127.0.0.1 {' '.join(missing)}  # nemo-throughput test cluster\n")
