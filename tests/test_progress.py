"""records/progress.py: the step k/N and ETA suffix of the four programs' progress lines."""
from records.progress import duration, progress


def test_eta_is_the_average_step_time_so_far_times_the_steps_left():
    assert progress(10, 110, elapsed=5.0, steps_done=10) == " [step 10/110, ETA 50s]"
    assert progress(100, 1000, elapsed=30.0, steps_done=50) == " [step 100/1000, ETA 9m00s]"  # a resumed run
    assert progress(504, 504, elapsed=180.0, steps_done=504) == " [step 504/504, ETA 0s]"


def test_nothing_before_the_first_step_or_without_a_total():
    assert progress(0, 10, elapsed=0.0, steps_done=0) == ""
    assert progress(3, None, elapsed=1.0, steps_done=3) == ""


def test_durations_read_as_hours_minutes_seconds():
    assert ([duration(s) for s in (0.4, 59.6, 61, 3599, 3600, 7325)]
            == ["0s", "1m00s", "1m01s", "59m59s", "1h00m", "2h02m"])
