"""The report's fairness figures (plain Python, no Spark session)."""

from __future__ import annotations

import pytest

from report.summary_sections import fairness as _fairness
from report.summary_sections import jain


def test_jain_index():
    """Jain's index: 1 for equal shares, 1/n when one consumer gets all, None for nothing."""
    assert jain([3, 3, 3]) == pytest.approx(1.0)
    assert jain([6, 0, 0]) == pytest.approx(1 / 3)
    assert jain([6, 3, 3, 0]) == pytest.approx(144 / 216)
    assert jain([]) is None and jain([0, 0]) is None


def test_browsers_do_not_count_in_fairness():
    """A browsing consumer sees every message: it is left out of shares and Jain's index."""
    def row(cid, delivered, browser):
        return {"queue": "q", "consumer_worker": 0, "consumer_id": cid, "delivered": delivered,
                "tag": f"t{cid}", "ctag": None, "priority": 0, "browser": browser}

    out = _fairness([row(1, 2, False), row(2, 2, False), row(3, 4, True)])
    assert out["share"] == {"q": {"w0.c1": 0.5, "w0.c2": 0.5}}
    assert out["jain"]["q"] == pytest.approx(1.0)
