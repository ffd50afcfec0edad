"""`nemo-throughput launch slurm|k8s [options] -- <training command>`."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import secrets
import shlex
import sys
from pathlib import Path

from nemo_throughput.launch import LaunchError, kubernetes, slurm, submit
from nemo_throughput.launch.kubernetes import KubernetesJob, manifest_yaml, render_manifest, validate_manifest
from nemo_throughput.launch.slurm import SlurmJob, render_sbatch
from nemo_throughput.outputs import OutputPathError, check_output_dir, check_output_file, write_text_atomic
from nemo_throughput.text import printable


def add_parsers(commands: argparse._SubParsersAction) -> None:
    launch = commands.add_parser("launch", help="write (and --submit) one benchmark job for Slurm or Kubernetes",
                                 description="The training command follows `--`.")
    launch.set_defaults(handler=run_launch, takes_command=True)
    targets = launch.add_subparsers(dest="target", required=True)

    slurm = targets.add_parser("slurm", help="an sbatch script: srun, one task per GPU, Pyxis container optional",
                               description="Writes launchers/slurm/benchmark.sbatch filled in; --submit runs "
                                           "sbatch on it. The training command follows `--`.")
    _job_arguments(slurm, "sbatch")
    slurm.add_argument("--image", help="container image for Pyxis/enroot; omit to run on the hosts")
    slurm.add_argument("--mounts", default="", help="container mounts, src:dst[,src:dst...]")
    slurm.add_argument("--workdir", help="working directory of the tasks (default: where sbatch runs)")
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--time", help="time limit, e.g. 01:00:00")
    slurm.add_argument("--results-dir", default="nemo_throughput_runs",
                       help="summaries go to <dir>/<job id>/repeat-<k>/ (default ./nemo_throughput_runs)")

    k8s = targets.add_parser("k8s", help="a Kubeflow PyTorchJob: one pod per node, torchrun in each pod",
                             description="Writes launchers/kubernetes/pytorchjob.yaml filled in; --submit runs "
                                         "kubectl create on it. The training command follows `--` and starts "
                                         "with `python`.")
    _job_arguments(k8s, "yaml")
    k8s.add_argument("--image", required=True, help="container image of the pods")
    k8s.add_argument("--namespace", default="default")
    k8s.add_argument("--rdma-resource", help="RDMA device resource for each pod, e.g. rdma/ib")
    k8s.add_argument("--rdma-count", type=int, help="how many of --rdma-resource per pod")
    k8s.add_argument("--scheduler-name", help="pod scheduler, e.g. runai-scheduler")
    k8s.add_argument("--queue", help="scheduler queue, set as the label --queue-label on the job and pods")
    k8s.add_argument("--queue-label", default="runai/queue", help="label key for --queue (default runai/queue)")
    k8s.add_argument("--summary-volume", help="PersistentVolumeClaim mounted at /results for the summaries")
    k8s.add_argument("--expand-env", action="store_true",
                     help="let Kubernetes expand $(VAR) in the training command and --label, and torchrun its "
                          "${local_rank}; by default every $ is escaped and the command reaches the script as written")


def _job_arguments(parser: argparse.ArgumentParser, suffix: str) -> None:
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="identical runs, one after another (default 1)")
    parser.add_argument("--label", help="run.label of the summaries, e.g. bare-metal (default: the orchestrator)")
    default_name = "nemo-throughput" if suffix == "sbatch" else "nemo-throughput-<MMDD-HHMMSS>-<4 hex digits>"
    parser.add_argument("--job-name", help=f"default {default_name}")
    parser.add_argument("--output", type=Path, help=f"file to write (default ./<job name>.{suffix})")
    parser.add_argument("--submit", action="store_true", help="submit it and print the job id")
    parser.add_argument("--prometheus-port", type=int,
                        help="rank 0 serves live metrics on this port (NEMO_THROUGHPUT_PROMETHEUS_PORT)")


def run_launch(args: argparse.Namespace, command: list[str]) -> int:
    try:
        _require_separator(command)
        if args.target == "slurm":
            launch_slurm(args, command)
        else:
            launch_kubernetes(args, command)
    except (LaunchError, OutputPathError) as error:
        print(f"nemo-throughput launch {args.target}: {printable(error)}", file=sys.stderr)
        return 2
    return 0


def _require_separator(command: list[str]) -> None:
    """Without `--` argparse reads the training command's options as the launcher's wherever they
    stand (`python t.py --nodes 4` would run t.py on 4 nodes, without `--nodes 4`)."""
    if command and "--" not in command and not command[0].startswith("-"):
        raise LaunchError(f"put the training command after `--` (`-- {shlex.join(command)} ...`): without it, "
                          "its options are read as the launcher's")


def launch_slurm(args: argparse.Namespace, command: list[str]) -> None:
    results_dir = args.results_dir
    if not results_dir.strip():
        raise LaunchError("--results-dir is empty: give the directory for the summaries")
    if not args.image:  # on the hosts: absolute, so that it does not depend on where sbatch runs; `=~/x` unexpanded
        results_dir = str(Path(results_dir).expanduser().resolve())
    job = SlurmJob(
        command=command, nodes=args.nodes, gpus_per_node=args.gpus_per_node, image=args.image,
        mounts=[m for m in args.mounts.split(",") if m], workdir=args.workdir, partition=args.partition,
        account=args.account, time=args.time, job_name=args.job_name or "nemo-throughput", repeat=args.repeat,
        label=args.label, results_dir=results_dir, prometheus_port=args.prometheus_port,
    )
    path = check_output_file(args.output or Path(f"{job.job_name}.sbatch"), "--output", reads=[slurm.TEMPLATE])
    # Slurm writes the job's log there, on the hosts (with --image: the mount's source), and does not create it
    log_dir = check_output_dir(job.host_results_dir, "--results-dir")
    _write(path, render_sbatch(job), mode=0o755)
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"wrote {path}")
    if args.submit:
        reply = submit("sbatch", path)
        submitted = re.search(r"Submitted batch job (\d+)", reply)
        if not submitted:
            raise LaunchError(f"sbatch did not report a job id for {path}; it said: {reply!r}")
        job_id = submitted.group(1)
        print(f"submitted: job {job_id}; summaries in {results_dir}/{job_id}/")


def launch_kubernetes(args: argparse.Namespace, command: list[str]) -> None:
    job = KubernetesJob(
        command=command, image=args.image, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        namespace=args.namespace, rdma_resource=args.rdma_resource, rdma_count=args.rdma_count,
        scheduler_name=args.scheduler_name, queue=args.queue, queue_label=args.queue_label,
        summary_volume=args.summary_volume, repeat=args.repeat, label=args.label, expand_env=args.expand_env,
        prometheus_port=args.prometheus_port,
        # a PyTorchJob name is unique in its namespace and keys the results: one per launch, two
        # launches in the same second included
        job_name=args.job_name or f"nemo-throughput-{dt.datetime.now():%m%d-%H%M%S}-{secrets.token_hex(2)}",
    )
    path = check_output_file(args.output or Path(f"{job.job_name}.yaml"), "--output", reads=[kubernetes.TEMPLATE])
    manifest = render_manifest(job)
    try:
        validate_manifest(manifest)
    except ImportError:
        print("(not validated offline: pip install 'nemo-throughput[kubernetes]' to check it before applying)")
    _write(path, manifest_yaml(manifest))
    print(f"wrote {path}")
    if not job.summary_volume:
        print("note: without --summary-volume the summaries stay in the pods' /results and go with them")
    if args.submit:
        print(submit("kubectl", path))  # "pytorchjob.kubeflow.org/<name> created"
        print(f"submitted: PyTorchJob {job.namespace}/{job.job_name}")


def _write(path: Path, text: str, mode: int | None = None) -> None:
    try:
        write_text_atomic(path, text, durable=False, mode=mode)
    except OSError as error:  # what the checks cannot see: a full disk, an I/O error
        raise LaunchError(f"--output {printable(path)} cannot be written: {error.strerror}") from None
