"""One self-contained HTML page per explanation (:class:`~minibert.attribution.Explanation`).

The page holds everything it shows: the styles, the data (one JSON block) and the
script that draws the attention view; it loads nothing (no network, no other file).
It shows

* the prediction and its probability, what is explained and by which method (with the
  completeness gap of integrated gradients);
* the word pieces and the words coloured by attribution (green for evidence for the
  target, red against; the strength is |score| / max |score|), each with its score as a
  tooltip; these are written into the page, so they show without the script too;
* the attention view: the attention of one layer and head chosen on the page (rows =
  query token, columns = key token), with the rollout up to that layer beside it
  (Abnar & Zuidema 2020), both drawn by the script as tables of cells shaded by the
  value over the table's largest.

The script marks the body ``data-ready="1"`` when it has drawn, and writes a script
error into ``#errors`` (``data-errors`` on the body), which the browser test reads.
"""
from __future__ import annotations

import html
import json
import os
from pathlib import Path

import numpy as np

from .atomic import atomic_write_bytes

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.2em; }
.tok { display: inline-block; padding: 2px 4px; margin: 2px 1px; border-radius: 3px;
       border: 1px solid #ddd; font-family: monospace; }
.meta { color: #555; }
.views { display: flex; flex-wrap: wrap; gap: 2em; }
table.matrix { border-collapse: collapse; font-family: monospace; font-size: 11px; }
table.matrix td { width: 18px; height: 18px; border: 1px solid #eee; padding: 0; }
table.matrix th { font-weight: normal; padding: 0 3px; white-space: nowrap; }
table.matrix thead th { writing-mode: vertical-rl; transform: rotate(180deg); }
#errors { color: #b00; }
"""

_SCRIPT = """
(function () {
  function fail(msg) {
    document.getElementById('errors').textContent += msg + '\\n';
    document.body.setAttribute('data-errors', '1');
  }
  window.addEventListener('error', function (e) { fail(String(e.message)); });
  var data = JSON.parse(document.getElementById('explanation-data').textContent);
  var layerSel = document.getElementById('layer'), headSel = document.getElementById('head');
  function option(sel, value, text) {
    var o = document.createElement('option'); o.value = value; o.textContent = text;
    sel.appendChild(o);
  }
  for (var l = 0; l < data.attentions.length; l++) option(layerSel, l, 'layer ' + (l + 1));
  option(headSel, -1, 'mean of heads');
  for (var h = 0; h < data.attentions[0].length; h++) option(headSel, h, 'head ' + (h + 1));
  layerSel.value = data.attentions.length - 1;
  function draw(tableId, m) {
    var t = document.getElementById(tableId), T = data.tokens.length, i, j, top = 1e-9;
    for (i = 0; i < T; i++) for (j = 0; j < T; j++) top = Math.max(top, m[i][j]);
    t.textContent = '';
    var head = t.createTHead().insertRow(), body = t.createTBody();
    head.appendChild(document.createElement('th'));
    for (j = 0; j < T; j++) {
      var th = document.createElement('th'); th.textContent = data.tokens[j];
      head.appendChild(th);
    }
    for (i = 0; i < T; i++) {
      var row = body.insertRow(), lab = document.createElement('th');
      lab.textContent = data.tokens[i]; row.appendChild(lab);
      for (j = 0; j < T; j++) {
        var c = row.insertCell(), v = m[i][j];
        c.style.background = 'rgba(30, 90, 200, ' + (v / top).toFixed(3) + ')';
        c.title = data.tokens[i] + ' -> ' + data.tokens[j] + ': ' + v.toFixed(4);
      }
    }
  }
  function meanOfHeads(layer) {
    var heads = data.attentions[layer], T = data.tokens.length, out = [], i, j, h;
    for (i = 0; i < T; i++) {
      out.push([]);
      for (j = 0; j < T; j++) {
        var s = 0;
        for (h = 0; h < heads.length; h++) s += heads[h][i][j];
        out[i].push(s / heads.length);
      }
    }
    return out;
  }
  function update() {
    var l = Number(layerSel.value), h = Number(headSel.value);
    draw('attention-matrix', h < 0 ? meanOfHeads(l) : data.attentions[l][h]);
    draw('rollout-matrix', data.rollout[l]);
    document.getElementById('rollout-caption').textContent =
      'rollout through layer ' + (l + 1);
  }
  layerSel.addEventListener('change', update);
  headSel.addEventListener('change', update);
  update();
  document.body.setAttribute('data-ready', '1');
})();
"""


def _colour(score: float, scale: float) -> str:
    """Green for a positive score, red for a negative one, alpha |score| / scale."""
    a = 0.0 if scale <= 0 else min(1.0, abs(score) / scale)
    rgb = "40, 160, 60" if score >= 0 else "210, 50, 50"
    return f"rgba({rgb}, {a:.3f})"


def _spans(items, scores, cls: str) -> str:
    scale = float(np.max(np.abs(scores))) if len(scores) else 0.0
    return " ".join(
        f'<span class="tok {cls}" style="background: {_colour(s, scale)}" '
        f'title="{s:+.4g}">{html.escape(t)}</span>' for t, s in zip(items, scores))


def _header(e) -> str:
    """The prediction, what is explained and how, as HTML."""
    method = {"ig": "integrated gradients", "grad-x-input": "gradient x input",
              "rollout": "attention rollout"}[e.method]
    what = {"sequence": "the text", "token": f"token {e.position} ({e.tokens[e.position]})",
            "mlm": f"the [MASK] at {e.position}"}[e.kind]
    lines = [f"<p id=\"prediction\">Prediction for {html.escape(what)}: "
             f"<b>{html.escape(str(e.predicted))}</b> "
             f"(probability {e.predicted_probability:.3f})</p>",
             f"<p class=\"meta\">Explained: <b>{html.escape(str(e.target_label))}</b> "
             f"(probability {e.probability:.3f}) by {method}"]
    if e.gap is not None:
        lines[-1] += (f", {e.steps} steps; f(x) - f(baseline) = "
                      f"{e.value - e.baseline_value:+.4g}, sum of attributions "
                      f"{float(np.sum(e.scores)):+.4g}, completeness gap {e.gap:+.2g}")
    return "\n".join(lines) + "</p>"


def render_page(e) -> str:
    """The HTML text of the page for the :class:`~minibert.attribution.Explanation` ``e``
    (a str holding everything; see the module docstring)."""
    data = json.dumps({"tokens": e.tokens, "attentions": np.round(e.attentions, 5).tolist(),
                       "rollout": np.round(e.rollout, 5).tolist()})
    data = data.replace("</", "<\\/").replace("<!--", "<\\!--")    # safe inside <script>
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>minibert: {html.escape(e.text[:60])}</title>
<style>{_STYLE}</style></head>
<body>
<h1>Why the model said {html.escape(str(e.target_label))}</h1>
<p class="meta">Text: {html.escape(e.text)}</p>
{_header(e)}
<section id="attribution-view"><h2>Attribution</h2>
<p id="pieces"><span class="meta">word pieces:</span> {_spans(e.tokens, e.scores, "piece")}</p>
<p id="words"><span class="meta">words:</span> {_spans(e.words, e.word_scores, "word")}</p>
<p class="meta">Green: evidence for {html.escape(str(e.target_label))}; red: against.
Word scores are the sums over their word pieces.</p></section>
<section id="attention-view"><h2>Attention</h2>
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
<div class="views">
<div><p>attention (row: query, column: key)</p><table class="matrix" id="attention-matrix"></table></div>
<div id="rollout-view"><p id="rollout-caption">rollout</p><table class="matrix" id="rollout-matrix"></table></div>
</div></section>
<pre id="errors"></pre>
<script type="application/json" id="explanation-data">{data}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_page(e, path: str | os.PathLike) -> Path:
    """Write :func:`render_page` of ``e`` to ``path`` atomically (UTF-8); returns the path."""
    return atomic_write_bytes(path, render_page(e).encode("utf-8"))
