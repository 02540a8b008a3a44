"""Final answers as Markdown: rendered by markdown-it-py, then sanitised by nh3.

The model writes the answer, and a prompt-injected model writes whatever it was told to: the
rendered HTML is never trusted. markdown-it-py runs with raw HTML off (it is shown as text) and
refuses ``javascript:`` links; nh3 then keeps only the tags and attributes below, only http(s)
and mailto links, and adds ``rel="noopener noreferrer nofollow"``. The raw text stays stored
and shown beside it.
"""

import functools

import nh3
from markdown_it import MarkdownIt

ALLOWED_TAGS = frozenset({
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "code", "pre", "blockquote",
    "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td",
})
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}, "th": {"style"}, "td": {"style"},
                      "code": {"class"}}
URL_SCHEMES = frozenset({"http", "https", "mailto"})
MAX_CHARS = 200_000  # an answer longer than this is shown as text only


@functools.cache
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])


MEMO_CHARS = 20_000  # answers up to this long are remembered (MEMO_ENTRIES of them, the latest used)
MEMO_ENTRIES = 256


def markdown_html(text: str) -> str:
    """Safe HTML of a Markdown text (an empty string for none). The same answer is shown again and
    again: its step's card on each of the step's events, every page view, every WebSocket's backlog
    (an eighth of a backlog's rendering was this), so the HTML of the recent short ones is kept."""
    if not text or len(text) > MAX_CHARS:
        return ""
    return _remembered(text) if len(text) <= MEMO_CHARS else _render(text)


@functools.lru_cache(maxsize=MEMO_ENTRIES)
def _remembered(text: str) -> str:
    return _render(text)


def _render(text: str) -> str:
    html = _parser().render(text)
    return nh3.clean(html, tags=set(ALLOWED_TAGS), attributes={k: set(v) for k, v in ALLOWED_ATTRIBUTES.items()},
                     url_schemes=set(URL_SCHEMES), link_rel="noopener noreferrer nofollow",
                     filter_style_properties={"text-align"})
