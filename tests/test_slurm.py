"""`nemo-throughput launch slurm --submit` on a real Slurm cluster: two emulated nodes on this host."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_port, read_json
from nemo_throughput.goodput.ledger import LEDGER_FILE, RUN_FILE, read_ledger
from slurm_cluster import LocalSlurmCluster, missing_reason

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = missing_reason()
    if reason:
        if os.environ.get("NEMO_THROUGHPUT_REQUIRE_SLURM"):
            pytest.fail(f"the Slurm tests are required here: {reason}")
        pytest.skip(reason)
    cluster = LocalSlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, gpus_per_node=2)
    cluster.start()
    yield cluster
    cluster.stop()


def test_demo_across_two_nodes_through_the_generated_sbatch(cluster, tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {**cluster.env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}  # `python` in the job is this venv's
    command = ["python", "-m", "nemo_throughput.demo.train", "+callbacks=throughput", "trainer.devices=1",
               "trainer.num_nodes=2", "trainer.max_steps=8", "callbacks.throughput.warmup_steps=2",
               "callbacks.throughput.log_every_n_steps=4", f"exp_manager.exp_dir={tmp_path / 'exp'}"]
    result = subprocess.run([bin_dir / "nemo-throughput", "launch", "slurm", "--nodes", "2", "--gpus-per-node", "1",
                             "--repeat", "2", "--label", "bare-metal", "--time", "10", "--results-dir", "runs",
                             "--prometheus-port", str(port := free_port()), "--submit", "--", *command],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"submitted: job (\d+)", result.stdout).group(1)
    state = cluster.wait_for_job(job_id, timeout_s=300)
    log = tmp_path / "runs" / f"slurm-{job_id}.out"
    assert state == "COMPLETED", (log.read_text() if log.exists() else "") + cluster.logs()

    for repeat in (1, 2):
        summary = read_json(tmp_path / "runs" / job_id / f"repeat-{repeat}" / "summary.json")
        environment = summary["environment"]
        assert summary["status"] == "completed" and summary["run"]["label"] == "bare-metal"
        assert environment["orchestrator"] == "slurm"
        assert environment["job"]["slurm_job_id"] == job_id and environment["job"]["repeat"] == str(repeat)
        assert environment["job"]["slurm_job_nodelist"] == "node[01-02]"
        assert [(node["name"], node["ranks"]) for node in environment["nodes"]] == [("node01", [0]), ("node02", [1])]
        assert environment["gpus_per_node"] == 1
        assert summary["hardware"]["num_nodes"] == 2 and summary["hardware"]["num_gpus"] == 2
        assert summary["parallel"]["data"] == 2 and summary["timing"]["steps_measured"] == 6
    assert "repeat 2 of 2 on node[01-02]" in log.read_text()
    # Rank 0 serves live metrics on the first node, each repeat in turn on the same port.
    assert f"live metrics at http://node01:{port}/metrics" in log.read_text()
    assert log.read_text().count(f"Prometheus metrics at http://0.0.0.0:{port}/metrics") == 2


def test_hostile_values_reach_the_job_as_data(cluster, tmp_path):
    """One job carries every value Slurm and bash can take verbatim but a careless script would run:
    command substitution, backticks, `;`, new lines, quotes, '#' and '%' in the results path, a file
    name that looks like an sbatch option. The job completes, each value arrives exactly, nothing runs."""
    bin_dir = Path(sys.executable).parent
    env = {**cluster.env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    marker = tmp_path / "injected"
    show = tmp_path / "show_args.py"
    show.write_text("import json, os, sys\n"
                    "out = os.environ['NEMO_THROUGHPUT_OUTPUT_DIR']\n"
                    "os.makedirs(out)\n"
                    "label = os.environ['NEMO_THROUGHPUT_RUN_LABEL']\n"
                    "seen = {'args': sys.argv[1:], 'cwd': os.getcwd(), 'label': label}\n"
                    "json.dump(seen, open(os.path.join(out, 'seen.json'), 'w'))\n")
    hostile = [f"$(touch {marker})", f"`touch {marker}`", f"x; touch {marker}", f"a\ntouch {marker}", "it's",
               'say "hi"', "#not-a-comment", "100%", "$SLURM_JOB_ID", "*"]
    workdir = tmp_path / "work dir `touch injected` 'q'"  # a relative marker: no '/' in a file name
    workdir.mkdir()
    results = tmp_path / "runs #1 $(touch injected) \"d\" 100%"
    label = f"it's $(touch {marker})"
    result = subprocess.run([bin_dir / "nemo-throughput", "launch", "slurm", "--nodes", "1", "--gpus-per-node", "1",
                             "--job-name", "hostile-1.v2", "--partition", "batch", "--time", "5", "--label", label,
                             "--workdir", str(workdir), "--results-dir", str(results), "--output=-h.sbatch",
                             "--submit", "--", "python", str(show), *hostile],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"submitted: job (\d+)", result.stdout).group(1)
    state = cluster.wait_for_job(job_id, timeout_s=120)
    log = results / f"slurm-{job_id}.out"  # '#' and '%' in --output were taken literally
    assert state == "COMPLETED", (log.read_text() if log.exists() else "no log") + cluster.logs()
    assert "repeat 1 of 1" in log.read_text()
    seen = read_json(results / job_id / "repeat-1" / "seen.json")
    assert seen == {"args": hostile, "cwd": str(workdir), "label": label}
    assert "JobName=hostile-1.v2" in cluster.scontrol("show", "job", job_id).stdout
    assert not marker.exists() and not list(tmp_path.rglob("injected"))


def test_the_longest_job_name_the_launcher_accepts_sbatch_accepts(cluster, tmp_path):
    from nemo_throughput.launch.slurm import MAX_JOB_NAME, SlurmJob

    (option,) = [o for o in SlurmJob(command=["python", "t.py"], job_name="j" * MAX_JOB_NAME).sbatch_options()
                 if o.startswith("--job-name")]
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\ntrue\n")
    accepted = subprocess.run(["sbatch", "--test-only", option, str(job)], env=cluster.env, capture_output=True,
                              text=True, cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    refused = subprocess.run(["sbatch", "--test-only", option + "j", str(job)], env=cluster.env, capture_output=True,
                             text=True, cwd=tmp_path)  # the limit is Slurm's: one more is refused
    assert refused.returncode != 0 and "too long" in refused.stdout + refused.stderr


@pytest.mark.parametrize("time", ["90", "120:00", "1:00:00", "2-12", "2-12:30", "2-12:30:00", "UNLIMITED", "infinite",
                                  "1:99:99", "0"])
def test_every_time_the_launcher_accepts_sbatch_accepts(cluster, tmp_path, time):
    from nemo_throughput.launch.slurm import SlurmJob

    (option,) = [o for o in SlurmJob(command=["python", "t.py"], time=time).sbatch_options() if o.startswith("--time")]
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\ntrue\n")
    result = subprocess.run(["sbatch", "--test-only", option, str(job)], env=cluster.env, capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_longest_time_the_launcher_accepts_is_the_longest_slurm_keeps(cluster, tmp_path):
    """One minute more and Slurm keeps another limit (2957761-01:03:00); 2**31 - 1 minutes, none."""
    from nemo_throughput.launch import LaunchError
    from nemo_throughput.launch.slurm import MAX_TIME_MINUTES, SlurmJob

    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\ntrue\n")
    limits = {}
    for minutes in (MAX_TIME_MINUTES, MAX_TIME_MINUTES + 1, 2**31 - 1):
        submitted = subprocess.run(["sbatch", "--parsable", "--hold", f"--time={minutes}", str(job)], env=cluster.env,
                                   capture_output=True, text=True, cwd=tmp_path, check=True)
        job_id = submitted.stdout.strip()
        limits[minutes] = re.search(r"TimeLimit=(\S+)", cluster.scontrol("show", "job", job_id).stdout).group(1)
        subprocess.run(["scancel", job_id], env=cluster.env, check=True)
    days, rest = divmod(MAX_TIME_MINUTES, 1440)
    assert limits[MAX_TIME_MINUTES] == f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"
    assert limits[MAX_TIME_MINUTES + 1] != f"{days}-{rest // 60:02d}:{rest % 60 + 1:02d}:00"
    assert limits[2**31 - 1] == "UNLIMITED"
    SlurmJob(command=["python", "t.py"], time=str(MAX_TIME_MINUTES))
    for too_long in (MAX_TIME_MINUTES + 1, 2**31 - 1, 2**32):
        with pytest.raises(LaunchError, match="which Slurm keeps as another limit or none"):
            SlurmJob(command=["python", "t.py"], time=str(too_long))


def test_template_by_hand_refuses_a_command_that_starts_with_an_option(cluster, tmp_path):
    """`sbatch benchmark.sbatch --nodes=2 python ...`: srun would have taken --nodes=2 as its own."""
    from nemo_throughput.launch.slurm import TEMPLATE

    ran = tmp_path / "ran"
    result = subprocess.run(["sbatch", f"--output={tmp_path}/slurm-%j.out", "--nodes=1", "--time=5", str(TEMPLATE),
                             "--nodes=2", sys.executable, "-c", f"open({str(ran)!r}, 'w')"],
                            env=cluster.env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"Submitted batch job (\d+)", result.stdout).group(1)
    assert cluster.wait_for_job(job_id, timeout_s=120) == "FAILED"
    log = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert "the training command starts with the option '--nodes=2'" in log and not ran.exists()


def test_a_requeued_job_is_one_run_of_two_segments(cluster, tmp_path):
    """`scontrol requeue` while the job trains: Slurm sends SIGTERM, the run stops, and the same job id
    starts again (SLURM_RESTART_COUNT=1), resuming from the last checkpoint into the same output directory."""
    out = tmp_path / "out"
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
srun {sys.executable} {Path(__file__).parent / 'scripts' / 'train_tiny.py'} --output-dir {out} --steps 40 \
    --log-every 4 --warmup 1 --checkpoint-every 5 --resume --step-sleep-s 0.1
""")
    submitted = subprocess.run(["sbatch", "--parsable", "--open-mode=append", f"--output={tmp_path / 'job.out'}",
                                str(script)], env=cluster.env, capture_output=True, text=True, check=True)
    job_id = submitted.stdout.strip()
    deadline = time.monotonic() + 120
    while (ledger := read_ledger(out / LEDGER_FILE)) is None or ledger.last_step < 12:  # past two checkpoints
        assert time.monotonic() < deadline, (tmp_path / "job.out").read_text() + cluster.logs()
        time.sleep(0.2)
    cluster.scontrol("requeue", job_id)
    cluster.release_requeued(job_id)
    state = cluster.wait_for_job(job_id, timeout_s=300)
    assert state == "COMPLETED", (tmp_path / "job.out").read_text() + cluster.logs()

    first = read_ledger(out / LEDGER_FILE)
    (second_dir,) = [path.parent for path in out.glob(f"*/{LEDGER_FILE}")]
    second = read_ledger(second_dir / LEDGER_FILE)
    key = f"slurm:nemo-throughput-test:{job_id}"
    assert (first.identity["scheduler_key"], first.identity["restart_count"]) == (key, 0)
    assert (second.identity["scheduler_key"], second.identity["restart_count"]) == (key, 1)
    assert read_json(out / "summary.json")["status"] == "interrupted"  # SIGTERM, then a clean stop
    resumed_at = first.checkpoints[-1][0]
    assert second.first_step == resumed_at and second.last_step == 40

    goodput = read_json(second_dir / "summary.json")["goodput"]
    assert goodput["segment"] == 2 and goodput["run_id"] == first.run_id and goodput["scheduler_key"] == key
    assert [row["restart_count"] for row in goodput["segments"]] == [0, 1]
    assert goodput["steps"]["lost"] == first.last_step - resumed_at
    assert goodput["seconds"]["restart"] > 0  # the requeue: from the stop to the new process
    assert json.loads((out / RUN_FILE).read_text())["steps"] == goodput["steps"]
