"""The report's stylesheet, inlined into every report.html (report.py).

Only fonts every system has (the system UI font, else DejaVu/Liberation/Arial), so the page
looks the same with no network. Episode colours: finished blue, timed out red, abandoned amber,
not played grey; budgets are drawn in red, means in dark grey. A value label inside a bar is
white, or dark on the light bars (abandoned, not played: svg.LIGHT_BARS); font sizes of chart
labels match svg_text.py's, which places them.
"""

STYLESHEET = """
:root { --text: #1f2328; --muted: #59636e; --line: #d8dee4; --soft: #f6f8fa; --blue: #2f6fd8;
  --red: #cf222e; --amber: #d4a72c; --grey: #a4acb6; --green: #1a7f37; }
* { box-sizing: border-box; }
body { margin: 0; background: #fff; color: var(--text);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 32px 32px 48px; }
header { padding-bottom: 20px; border-bottom: 1px solid var(--line); }
.eyebrow { margin: 0 0 10px; color: var(--muted); font-size: 13px; letter-spacing: .02em; }
.state-line { display: flex; align-items: center; gap: 10px; flex-wrap: wrap; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 999px; font-size: 13px; font-weight: 600;
  letter-spacing: .04em; text-transform: uppercase; }
.badge.state { color: #fff; background: var(--muted); }
.badge.success { background: var(--green); }
.badge.failed { background: var(--red); }
.badge.interrupted { background: #9a6700; }
.badge.debug { color: #7d4e00; background: #fff8c5; border: 1px solid #eac54f; }
.source { color: var(--muted); font-size: 13px; font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace;
  overflow-wrap: anywhere; }
.scores { display: flex; gap: 56px; flex-wrap: wrap; align-items: flex-end; margin: 18px 0 6px; }
.score .value { font-size: 60px; line-height: 1.05; font-weight: 700; letter-spacing: -.02em;
  font-variant-numeric: tabular-nums; }
.score.secondary .value { font-size: 34px; font-weight: 600; color: #31373d; }
.score.none .value { font-size: 44px; color: var(--red); }
.score .label { font-size: 15px; font-weight: 600; }
.score .direction { color: var(--muted); font-size: 13px; font-style: italic; }
.score .spread { color: var(--muted); font-size: 13px; font-variant-numeric: tabular-nums; }
.cause { margin: 12px 0 0; overflow-wrap: anywhere; }
.counts { display: grid; grid-template-columns: repeat(6, 1fr); gap: 12px; margin: 20px 0 0; }
.counts div { background: var(--soft); border-radius: 8px; padding: 10px 14px; }
.counts dt { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.counts dd { margin: 2px 0 0; font-size: 19px; font-weight: 600; font-variant-numeric: tabular-nums;
  white-space: nowrap; }
section { margin-top: 34px; }
h2 { font-size: 19px; margin: 0 0 10px; }
.note, .empty { color: var(--muted); margin: 0 0 10px; }
figure { margin: 0 0 22px; }
figcaption { font-weight: 600; font-size: 14px; margin-bottom: 4px; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top;
  overflow-wrap: anywhere; }
th { color: var(--muted); font-weight: 600; background: var(--soft); }
table.numeric td { font-variant-numeric: tabular-nums; }
table.episodes { font-size: 12px; }
table.episodes td, table.episodes th { padding: 4px 7px; }
table.episodes td { white-space: nowrap; }
table.episodes th { vertical-align: bottom; overflow-wrap: normal; }
.scroll { overflow-x: auto; }
.columns { display: grid; grid-template-columns: 1fr 1fr; gap: 32px; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; overflow-wrap: anywhere; }
.legend { display: flex; gap: 18px; color: var(--muted); font-size: 12px; margin-top: 2px; }
.key { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
.chart { display: block; width: 100%; height: auto; }
.chart text { font-size: 12px; fill: var(--muted); font-family: inherit; }
.chart .grid { stroke: #eef1f4; }
.chart .axis { stroke: #8c959f; }
.finished { fill: var(--blue); background: var(--blue); }
.timeout { fill: var(--red); background: var(--red); }
.abandoned { fill: var(--amber); background: var(--amber); }
.skipped { fill: var(--grey); background: var(--grey); }
.range .whisker { stroke: var(--blue); stroke-width: 1.5; }
.range .box { fill: var(--blue); fill-opacity: .3; stroke: var(--blue); }
.range .median { stroke: #1b4aa0; stroke-width: 2; }
.rule line { stroke-width: 1.5; stroke-dasharray: 6 4; }
.rule.budget line { stroke: var(--red); }
.rule.budget text { fill: var(--red); font-weight: 600; }
.rule.mean line { stroke: #57606a; }
.rule.mean text { fill: #31373d; font-weight: 600; }
.rule .plate { fill: #fff; fill-opacity: .9; }
.chart text.bar-label { font-size: 11px; font-weight: 600; fill: var(--text); }
.chart text.bar-label.inside { fill: #fff; }
.chart text.bar-label.inside.on-light { fill: var(--text); }
.track { fill: #eef1f4; }
.mark.used { fill: var(--blue); }
.mark.over { fill: var(--red); }
.line { fill: none; stroke: var(--blue); stroke-width: 1.6; }
.line.eval, .line.second { stroke: var(--green); }
.line.third { stroke: var(--amber); }
.area { fill: var(--blue); fill-opacity: .12; stroke: none; }
.rule.goal line { stroke: var(--green); }
.rule.goal text { fill: var(--green); font-weight: 600; }
.mark.converged { fill: var(--green); }
.mark.point { fill: var(--red); }
@media (max-width: 800px) {
  .counts { grid-template-columns: repeat(2, 1fr); }
  .columns { grid-template-columns: 1fr; }
}
"""
