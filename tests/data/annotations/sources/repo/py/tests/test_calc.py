import sys
sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])

from calc import add, parse, ratio


def test_add():
    assert add(1, 2) == 3


def test_ratio():
    assert ratio(4, 0) == 0


def test_parse():
    assert parse("{") == {}


def test_passes():
    assert add(0, 0) == 1
