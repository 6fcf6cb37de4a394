"""The benchmark (`benchmarks/bench.py`) in its tiny configuration: it runs every worker process of it
and writes a JSON whose every field holds a sane value.  No timing is asserted (a shared 2-core
machine gives any speed); the numbers checked are structural: counts, signs, FLOPs, ratios.
"""
import json

import pytest

from benchmarks import bench
from conftest import run_program


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = run_program(["benchmarks/bench.py", "--tiny", "--json", path], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(path.read_text())


def test_tiny_run_prints_a_progress_line_per_process_and_the_table(tiny):
    stdout, report = tiny
    configs = report["configurations"]
    runs = sum(c["repeats"] for c in configs)
    assert stdout.count("examples/sec (median)") == runs
    assert "matmul peak" in stdout and "x legacy" in stdout


def test_tiny_json_has_every_configuration_and_field(tiny):
    _, report = tiny
    configs = report["configurations"]
    variants = {(c["model"], c["variant"]) for c in configs}
    assert variants == {("mnist", v) for v in bench.VARIANTS["mnist"]}
    for c in configs:
        assert set(bench.FIELDS) <= set(c), set(bench.FIELDS) - set(c)
        assert c["repeats"] == bench.TINY["repeats"]
        assert c["timed_steps"] == bench.TINY["steps"] * bench.TINY["repeats"]
        assert c["replicas"] == 2 and c["batch"] == 8
        assert len(c["devices"]) == c["replicas"]


def test_tiny_json_values_are_sane(tiny):
    _, report = tiny
    peak = report["calibration"]["matmul_gflops"]
    assert peak > 0
    for c in report["configurations"]:
        assert 0 < c["examples_per_sec_min"] <= c["examples_per_sec_median"] <= c["examples_per_sec_max"]
        assert c["step_ms_median"] > 0
        assert 0 < c["first_step_s"] < 300
        assert c["peak_rss_mb"] > 50  # TensorFlow alone is hundreds of MB
        # 784*500 + 500*10 multiply-adds, plus the bias adds and the ReLU-free softmax-free head:
        assert 2 * (784 * 500 + 500 * 10) <= c["forward_flops_per_example"] < 1.01 * 2 * (784 * 500 + 500 * 10) + 2000
        assert 0 < c["share_of_matmul_peak"] < 1.5  # the MLP step cannot run far above a matmul's peak
        assert 0 < c["cpu_busy"] <= 1.05
        assert c["vs_legacy"] > 0


def test_repeats_are_interleaved_and_every_run_is_summarised(monkeypatch, capsys, tmp_path):
    """`main`'s schedule, with `spawn` answering in-process: all configurations once, then all
    again, and each record summarises its own configuration's runs (the tiny run has one repeat)."""
    order = []

    def spawn(spec):
        if spec["model"] == "calibrate":
            return dict(matmul_gflops=100.0, matmul_size=spec["matmul_size"],
                        flops={"mnist": {"legacy": 1e6, "modern": 1e6}})
        order.append((spec["variant"], spec["replicas"]))
        seconds = 0.01 * (len(order) + 1)  # each run its own speed, to find it in the summary
        return dict(rows=[spec["batch"]] * 4, seconds=[seconds] * 4, first_step_s=1.0, peak_rss_mb=500.0,
                    cpu_busy=0.5, devices=["/cpu:0"] * spec["replicas"])

    monkeypatch.setattr(bench, "spawn", spawn)
    path = tmp_path / "bench.json"
    assert bench.main(["--model", "mnist", "--replicas", "1", "2", "--variants", "legacy", "modern",
                       "--warmup", "1", "--steps", "3", "--repeats", "2", "--json", str(path)]) == 0
    once = [("legacy", 1), ("modern", 1), ("legacy", 2), ("modern", 2)]
    assert order == once + once
    out = capsys.readouterr().out
    assert out.count("[repeat 1/2") == 4 and out.count("[repeat 2/2") == 4
    assert out.index("[repeat 1/2, 4/4]") < out.index("[repeat 2/2, 1/4]")
    # modern at 2 replicas ran 4th and 8th: 3 timed steps of 0.05 s and 3 of 0.09 s, 100 rows each;
    # legacy at 2 replicas 3rd and 7th: 0.04 s and 0.08 s.  Every figure below is worked out here from
    # those inputs (and the calibration: 1 MFLOP forward per example, a 100 GFLOP/s peak).
    records = json.loads(path.read_text())["configurations"]
    record = records[3]
    assert (record["variant"], record["replicas"], record["repeats"], record["timed_steps"]) == ("modern", 2, 2, 6)
    modern_median = (100 / 0.05 + 100 / 0.09) / 2  # the median of 3 x 2000 and 3 x 1111 examples/sec
    assert record["examples_per_sec_median"] == pytest.approx(modern_median)
    assert record["examples_per_sec_min"] == pytest.approx(100 / 0.09)
    assert record["vs_legacy"] == pytest.approx(modern_median / ((100 / 0.04 + 100 / 0.08) / 2))
    assert record["achieved_gflops"] == pytest.approx(modern_median * 3 * 1e6 / 1e9)  # forward + 2x backward
    assert record["share_of_matmul_peak"] == pytest.approx(modern_median * 3e6 / 1e9 / 100)


def test_bad_variant_is_refused():
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "modern-fastest"])
