"""The report as one self-contained HTML page: report.md rendered (`markdown`, with its tables), the
study's own rows shaded so they read apart from ours, every plot inlined as a data URI, so the page reads the same opened alone, inside Snakemake's `--report`
(which embeds HTML results as they are), or from an archived bundle. Nothing is computed here.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1400px; margin: 1.5em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.86em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #eef1f5; }
tr:nth-child(even) td { background: #fafafa; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
h1 { border-bottom: 2px solid #456; } h2 { border-bottom: 1px solid #aab; margin-top: 1.6em; }
li { margin: 0.2em 0; }
tr.study td { background: #fff6e0; font-style: italic; }
"""


# Markdown's raw HTML and links: report.md writes neither (its images are `![name](NAME.png)`), so on the page they
# could only have come from a trial's text
UNTRUSTED = ("html", "link", "reference", "short_reference", "autolink", "automail")


def _inline_images(html: str, folder: Path) -> str:
    """Each <img src="NAME.png"> of a file beside the report becomes a data URI."""

    def inline(match: re.Match) -> str:
        path = folder / match.group(2)
        if not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode()
        return f'{match.group(1)}data:image/png;base64,{data}{match.group(3)}'

    return re.sub(r'(<img[^>]*src=")([^":]+\.png)(")', inline, html)


def _mark_study_rows(html: str) -> str:
    """Rows that carry the study's published numbers (a cell "study" or "study (...)") stand out from ours."""
    return re.sub(r"<tr>(?=(?:(?!</tr>).)*<td>study(?: \(|</td>))", '<tr class="study">', html, flags=re.S)


def render(markdown_text: str, folder: Path, title: str = "parity report") -> str:
    """The page for `markdown_text`, whose images are files in `folder`."""
    import markdown

    md = markdown.Markdown(extensions=["tables"], output_format="html")
    for pattern in UNTRUSTED:  # text from trial files (a failed trial's reasons) reaches the page as text, never as
        md.inlinePatterns.deregister(pattern)  # markup, a link or a script (an outsider's, 2026-12-07)
    md.preprocessors.deregister("html_block")
    body = _inline_images(_mark_study_rows(md.convert(markdown_text)), folder)
    body = re.sub(r'<img[^>]*src="(?!data:)[^"]*"[^>]*>', "", body)  # only the plots beside it, inlined
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")
