"""Final answers render as sanitised Markdown in the timeline; the raw text stays available."""

import re

import pytest
from django.contrib.auth.models import User

from sessions_app.markdown import markdown_html
from sessions_app.models import Step
from sessions_app.services import step_transition, turn_transition
from tests import factories
from tests.helpers import login

ANSWER = """# Report

The build is **green** and `make test` passes.

- one
- two

| file | lines |
|:-----|------:|
| a.py | 10 |

[docs](https://example.com/docs) and [bad](javascript:alert(1))

<script>alert("x")</script> <img src=x onerror="alert(1)">
"""


def test_markdown_html_renders_markdown_and_strips_what_could_run() -> None:
    html = markdown_html(ANSWER)
    assert "<h1>Report</h1>" in html and "<strong>green</strong>" in html and "<code>make test</code>" in html
    assert "<li>one</li>" in html and "<table>" in html and '<td style="text-align:right">10</td>' in html
    assert '<a href="https://example.com/docs" rel="noopener noreferrer nofollow">docs</a>' in html
    assert "javascript:" not in html.replace("[bad](javascript:alert(1))", "")
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html and "&lt;img" in html  # raw HTML is shown as text, never run
    assert markdown_html("") == ""
    # nh3 keeps only http(s) and mailto links (markdown-it would let ftp: through).
    assert markdown_html("[f](ftp://host/file)") == '<p><a rel="noopener noreferrer nofollow">f</a></p>\n'


@pytest.mark.django_db
def test_timeline_renders_the_final_answer_as_markdown_with_the_raw_text(operator: User) -> None:
    session = factories.session(owner=operator)
    turn = factories.turn(session)
    turn_transition(turn_id=turn.id, to="running")
    step = factories.step(turn, kind="model", tool_name="")
    Step.objects.filter(pk=step.pk).update(message={"role": "assistant", "content": ANSWER})
    step_transition(step_id=step.id, to="running")
    step_transition(step_id=step.id, to="completed")
    turn_transition(turn_id=turn.id, to="completed", output_text=ANSWER)
    body = login(operator).get(f"/sessions/{session.id}/").content.decode()
    rendered = re.findall(r'<div class="answer markdown">(.*?)</div>\s*<details class="raw-answer">', body, re.S)
    assert len(rendered) == 2  # the answer's card and the turn's foot (shown when the card is not)
    assert "<strong>green</strong>" in rendered[0] and "<table>" in rendered[0]
    assert "<script>alert" not in body and "<img" not in rendered[0]
    raw = re.search(r'<pre class="mono answer-raw">(.*?)</pre>', body, re.S)
    assert raw is not None and "The build is **green**" in raw.group(1) and "&lt;script&gt;" in raw.group(1)


def test_the_html_of_a_recent_answer_is_kept_and_a_long_one_is_not() -> None:
    from sessions_app import markdown

    text = "A **kept** answer, unique to this test: 7f3a."
    first = markdown_html(text)
    hits = markdown._remembered.cache_info().hits
    assert markdown_html(text) == first == "<p>A <strong>kept</strong> answer, unique to this test: 7f3a.</p>\n"
    assert markdown._remembered.cache_info().hits == hits + 1
    long = "x" * (markdown.MEMO_CHARS + 1)
    misses = markdown._remembered.cache_info().misses
    assert markdown_html(long) == markdown_html(long) == f"<p>{long}</p>\n"
    assert markdown._remembered.cache_info().misses == misses
