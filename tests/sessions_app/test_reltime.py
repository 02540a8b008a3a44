"""The ``reltime`` tag: a time as "N ago" with the exact time, as Django's date formats write it."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.timesince import timesince

from sessions_app.templatetags.dashboard_tags import reltime


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "Asia/Kolkata", "America/St_Johns"])
@pytest.mark.parametrize("when", [datetime(2026, 7, 4, 9, 5, 7, 123456, tzinfo=UTC),  # summer time in Paris
                                  datetime(2026, 1, 31, 23, 59, 59, tzinfo=UTC),  # another day in Kolkata
                                  datetime(987, 3, 1, 0, 0, 0, tzinfo=UTC)])  # a year of three digits
def test_the_exact_time_is_written_as_djangos_formats_write_it(zone: str, when: datetime) -> None:
    with timezone.override(ZoneInfo(zone)):
        local = timezone.localtime(when)
        exact = date_format(local, "Y-m-d H:i:s e")
        expected = f'<time datetime="{date_format(local, "c")}" data-rel title="{exact}">{timesince(when)} ago</time>'
        assert str(reltime(when)) == expected


def test_no_time_is_a_dash() -> None:
    assert str(reltime(None)) == "—"
    assert "3\xa0minutes ago" in str(reltime(timezone.now() - timedelta(minutes=3, seconds=5)))
