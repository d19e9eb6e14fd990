"""kgen/env.py: every KGEN_* switch has one meaning of on and off, and a value it cannot read is an
error that names the variable."""

import pytest

from kgen import env


@pytest.mark.parametrize("value, on", [("", False), ("0", False), ("false", False), (" No ", False), ("OFF", False),
                                       ("off", False), ("1", True), ("yes", True), ("True", True), (" on", True)])
def test_a_flag_is_on_or_off_the_same_way_everywhere(monkeypatch, value, on):
    monkeypatch.setenv("KGEN_VALIDATE", value)
    assert env.flag("KGEN_VALIDATE") is on


def test_an_unset_flag_is_off_and_a_value_it_cannot_read_names_the_variable(monkeypatch):
    monkeypatch.delenv("KGEN_DEFRAG", raising=False)
    assert env.flag("KGEN_DEFRAG") is False
    monkeypatch.setenv("KGEN_DEFRAG", "2")
    with pytest.raises(ValueError, match=r"KGEN_DEFRAG='2': expected one of 1/true/yes/on"):
        env.flag("KGEN_DEFRAG")


def test_numbers_and_paths(monkeypatch, tmp_path):
    monkeypatch.delenv("KGEN_DEFRAG_INTERVAL", raising=False)
    assert env.integer("KGEN_DEFRAG_INTERVAL", 256) == 256
    monkeypatch.setenv("KGEN_DEFRAG_INTERVAL", " 64 ")
    assert env.integer("KGEN_DEFRAG_INTERVAL", 256) == 64
    monkeypatch.setenv("KGEN_DEFRAG_THRESHOLD", "a quarter")
    with pytest.raises(ValueError, match=r"KGEN_DEFRAG_THRESHOLD='a quarter': expected a number"):
        env.number("KGEN_DEFRAG_THRESHOLD", 0.25)
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    assert env.cache_root() == tmp_path
    monkeypatch.setenv("KGEN_CACHE_DIR", "")
    assert env.cache_root().name == "kgen"
