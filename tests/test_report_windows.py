"""Windows, warm-ups and unfinished segments of resumed runs in `report` and `compare`: a run's
--window means its steps across its segments, warm-ups that differ along a scaling curve are named,
and segments that failed or were interrupted count their finished steps. Summaries and steps.jsonl
are written by the package's own writers (build_summary, progress.step_rows, append_jsonl)."""

import json

import pytest

from nemo_throughput.report.grouping import build_report
from nemo_throughput.report.runs import load_run
from test_report_segments import cli, write_segments


# ------------------------------------------------------------------------------- scaling curve
def test_warm_ups_that_differ_along_a_scaling_curve_are_named(tmp_path, capsys):
    """8 and 16 GPUs, each measured after its own warm-up: the efficiency compares them, so the
    curve says that they differ, as repeats and --baseline sides do (comparable.warmup_note)."""
    small = write_segments(tmp_path / "8", [[1.0] * 8], warmup=2)
    large = write_segments(tmp_path / "16", [[1.1] * 8], warmup=4, gpus=16, gbs=256)
    report = build_report([load_run(path) for path in (*small, *large)])
    assert [g.num_gpus for g in report.groups] == [8, 16] and report.groups[1].scaling_efficiency is not None
    (note,) = report.notes
    assert note.startswith("the scaling curve of bm / gpt3-126m (8, 16 GPUs): the runs left out different numbers "
                           f"of warm-up steps before the steps they count ({small[0]}: 2 (warmup_steps 2); "
                           f"{large[0]}: 4 (warmup_steps 4))")
    same = write_segments(tmp_path / "16-same", [[1.1] * 8], warmup=2, gpus=16, gbs=256)
    assert build_report([load_run(path) for path in (*small, *same)]).notes == []
    code, _, err = cli("report", small[0], large[0], "--window", "5:", capsys=capsys)
    assert "warm-up" not in err  # one window, chosen for every run


def test_a_curve_whose_sizes_each_mix_warm_ups_is_not_named_twice(tmp_path):
    """Each size's own note already names its runs; a size whose runs agree among themselves but
    not with the others' is still named on the curve."""
    runs = [*write_segments(tmp_path / "a", [[1.0] * 8], warmup=2),
            *write_segments(tmp_path / "b", [[1.0] * 8], warmup=3),
            *write_segments(tmp_path / "c", [[1.1] * 8], warmup=2, gpus=16, gbs=256),
            *write_segments(tmp_path / "d", [[1.1] * 8], warmup=3, gpus=16, gbs=256)]
    notes = build_report([load_run(path) for path in runs]).notes
    assert len(notes) == 2 and not any("scaling curve" in note for note in notes)
    uniform = write_segments(tmp_path / "e", [[1.1] * 8], warmup=5, gpus=32, gbs=512)
    notes = build_report([load_run(path) for path in (*runs, *uniform)]).notes
    assert len(notes) == 3 and "the scaling curve of bm / gpt3-126m (8, 16, 32 GPUs)" in notes[2]
