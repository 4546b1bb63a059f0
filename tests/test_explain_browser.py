"""The explanation page in a real browser: headless Chromium (Debian's ``chromium``).

Chromium opens the file (no server, nothing else on disk or on the network), runs its
script, and the test reads back the DOM it ends with (``--dump-dom``) and its console
(``--enable-logging=stderr``: every console message, errors included, is a ``CONSOLE``
line): no console message, the script finished (``data-ready``), every word piece in
the attribution view and in both tables of the attention view, and the screenshots of
two texts differ. A page with a script error is caught by the same check.

On a machine without Chromium the tests skip with that reason; CI installs it
(``apt-get install -y chromium``), so there they always run.
"""
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from minibert import BertConfig
from minibert.attribution import explain
from minibert.explain_page import render_page, write_page
from minibert.heads import BertForSequenceClassification
from minibert.tokenization import BertTokenizer

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                           "google-chrome-stable") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine "
                                "(Debian: apt-get install -y chromium)")
WORDS = ["the", "acting", "was", "good", "plot", "dull", "grip", "##ping", ",", "."]


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    config = BertConfig(vocab_size=15, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=32, initializer_range=0.3)
    return BertForSequenceClassification(config, seed=1), BertTokenizer(vocab)


def chromium(page: Path, tmp: Path, *args) -> subprocess.CompletedProcess:
    """Headless Chromium on ``page`` with a profile of its own under ``tmp``."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0",
           "--window-size=1100,1000", *args, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp)


class Cells(HTMLParser):
    """Text of the ``th`` cells and count of the ``td`` cells of each table, by id, and
    the spans of the attribution view."""

    def __init__(self):
        super().__init__()
        self.table = self.cell = None
        self.heads, self.tds, self.pieces = {}, {}, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.table = a.get("id")
            self.heads[self.table], self.tds[self.table] = [], 0
        elif tag == "th" and self.table:
            self.cell = "th"
            self.heads[self.table].append("")
        elif tag == "td" and self.table:
            self.tds[self.table] += 1
        elif tag == "span" and "piece" in a.get("class", ""):
            self.cell = "piece"
            self.pieces.append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.table = None
        if tag in ("th", "span"):
            self.cell = None

    def handle_data(self, data):
        if self.cell == "th":
            self.heads[self.table][-1] += data
        elif self.cell == "piece":
            self.pieces[-1] += data


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_page_runs_and_shows_every_token(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    e = explain(model, tok, "the acting was gripping , the plot was dull .", steps=16)
    page = write_page(e, tmp_path / "page.html")
    done = chromium(page, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert console_lines(done.stderr) == []
    dom = done.stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-ready="1"' in body and "data-errors" not in body
    cells = Cells()
    cells.feed(dom)
    T = len(e.tokens)
    assert cells.pieces == e.tokens                             # the attribution view
    for table in ("attention-matrix", "rollout-matrix"):        # the attention view, both
        assert cells.heads[table] == ["", *e.tokens, *e.tokens]
        assert cells.tds[table] == T * T
    assert dom.count("<option") == 2 + 1 + 2                   # 2 layers; mean + 2 heads


def test_a_script_error_is_caught(model_and_tokenizer, tmp_path):
    """The check above sees a broken page: bad data makes the script throw."""
    model, tok = model_and_tokenizer
    e = explain(model, tok, "the plot was dull", method="rollout")
    text = render_page(e).replace('"rollout": [', '"rollout": [[[{]]], ', 1)
    (tmp_path / "bad.html").write_text(text, encoding="utf-8")
    done = chromium(tmp_path / "bad.html", tmp_path, "--dump-dom")
    assert console_lines(done.stderr)
    assert 'data-ready="1"' not in re.search(r"<body[^>]*>", done.stdout).group(0)


def test_screenshots_of_two_texts_differ(model_and_tokenizer, tmp_path):
    model, tok = model_and_tokenizer
    shots = []
    for n, text in enumerate(["the acting was good .", "the plot was dull , dull , dull ."]):
        page = write_page(explain(model, tok, text, steps=16), tmp_path / f"p{n}.html")
        png = tmp_path / f"p{n}.png"
        done = chromium(page, tmp_path, f"--screenshot={png}")
        assert done.returncode == 0 and console_lines(done.stderr) == []
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        shots.append(png)
    import matplotlib.image
    a, b = (matplotlib.image.imread(str(p)) for p in shots)
    assert a.shape == b.shape and np.abs(a - b).max() > 0
    assert a.std() > 0                                          # not a blank page
