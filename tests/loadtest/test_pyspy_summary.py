"""loadtest.pyspy_summary: collapsed stacks -> per-function inclusive and self shares."""

from __future__ import annotations

from loadtest.pyspy_summary import function_of, parse_line, summarise

PROFILE = [
    "py-spy> Wrote raw flamegraph data\n",
    'process 1:"serve";serve (w.py:10);step (e.py:5);launch (r.py:7) 30\n',
    'process 1:"serve";serve (w.py:10);step (e.py:6);wait (t.py:2) 10\n',
    'process 1:"serve";serve (w.py:11);drain (w.py:40) 60\n',
    'process 2:"sweep";main (s.py:1) 500\n',
    "\n",
]


def test_parse_line_skips_messages_and_splits_frames():
    assert parse_line(PROFILE[0]) is None
    assert parse_line("\n") is None
    assert parse_line("a (x.py:1);b (y.py:2) 7\n") == (["a (x.py:1)", "b (y.py:2)"], 7)


def test_line_numbers_are_dropped_so_a_function_adds_up():
    assert function_of("step (e.py:5)") == "step (e.py)"
    assert function_of('process 1:"serve"') == 'process 1:"serve"'


def test_summarise_filters_and_counts_inclusive_and_self():
    total, shares = summarise(PROFILE, ["serve (w.py"])
    assert total == 100  # the sweep's 500 samples are filtered out
    by_name = {s.frame: s for s in shares}
    assert by_name["serve (w.py)"].inclusive == 100
    assert by_name["step (e.py)"].inclusive == 40  # lines 5 and 6 of one function
    assert by_name["step (e.py)"].self_samples == 0
    assert by_name["drain (w.py)"].self_samples == 60
    assert [s.frame for s in shares[:2]] == ['process 1:"serve"', "serve (w.py)"]
    assert shares[2].frame == "drain (w.py)"


def test_a_function_twice_in_one_stack_counts_once():
    total, shares = summarise(["f (a.py:1);g (a.py:2);f (a.py:3) 4\n"])
    assert total == 4
    assert {s.frame: s.inclusive for s in shares}["f (a.py)"] == 4
