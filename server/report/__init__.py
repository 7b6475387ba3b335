"""``arbiter report``: one self-contained report.html from a results folder (``page``), its charts
(``charts``, ``svg``, ``svg_text``) and its stylesheet (``style``). Formats add their own sections."""
