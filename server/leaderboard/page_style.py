"""How the leaderboard page looks and behaves in a browser: its stylesheet and its sorting script.

The stylesheet is the report's (same fonts, palette and tables, so both pages of a competition
look alike) plus what only a ranking needs: sortable headers, reference rows for baselines and
the small tags that qualify a row. The script sorts the table by the header clicked, or by the
URL's ``#sort=`` fragment (page.py describes it); it reads the cells' ``data-value`` attributes
and never writes markup, so nothing from the board can become code.
"""

from arbiter.server.report.style import STYLESHEET as REPORT_STYLESHEET

LEADERBOARD_RULES = """
h1 { font-size: 28px; line-height: 1.2; margin: 0 0 6px; overflow-wrap: anywhere; }
h1 .phase { color: var(--muted); font-weight: 500; }
.rule-line { margin: 8px 0 0; color: var(--muted); }
table.board { font-size: 14px; }
table.board td { font-variant-numeric: tabular-nums; overflow-wrap: normal; }
table.board th { padding: 0; vertical-align: bottom; overflow-wrap: normal; }
table.board th button { all: unset; box-sizing: border-box; display: block; width: 100%; padding: 6px 10px;
  cursor: pointer; color: var(--muted); font-weight: 600; }
table.board th button:hover { color: var(--text); }
table.board th button:focus-visible { outline: 2px solid var(--blue); outline-offset: -2px; }
table.board th[aria-sort] button { color: var(--text); background: #eaeef2; }
th[aria-sort="ascending"] button::after { content: " \\25B4"; }
th[aria-sort="descending"] button::after { content: " \\25BE"; }
.arrow { color: var(--blue); font-weight: 700; }
td.rank { font-weight: 700; width: 3.5em; white-space: nowrap; }
td.figure .value { white-space: nowrap; }
.ci { display: block; color: var(--muted); font-size: 12px; white-space: nowrap; }
.name { font-weight: 600; overflow-wrap: anywhere; }
.tags { display: flex; flex-wrap: wrap; gap: 4px; margin-top: 3px; }
.tag { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 11px; line-height: 18px;
  background: var(--soft); border: 1px solid var(--line); color: var(--muted); }
.tag.not-separable { color: #7d4e00; background: #fff8c5; border-color: #eac54f; }
.tag.tie { color: #1b4aa0; background: #ddf4ff; border-color: #a8d1ff; }
.tag.rescored { color: #6e40c9; background: #fbefff; border-color: #d8b9ff; }
.tag.baseline { color: #fff; background: var(--muted); border-color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; font-weight: 600; }
tr.baseline td { background: #fafbfc; color: #424a53; font-style: italic; border-top: 1px dashed #8c959f;
  border-bottom: 1px dashed #8c959f; }
tr.baseline .tag { font-style: normal; }
.achievements { display: flex; flex-wrap: wrap; gap: 4px; }
.achievement { display: inline-block; padding: 0 7px; border-radius: 4px; font-size: 12px;
  color: var(--green); background: #dafbe1; border: 1px solid #aceebb; cursor: help; white-space: nowrap; }
ul.notes { margin: 10px 0 0; padding: 0; list-style: none; color: var(--muted); font-size: 12px; }
ul.notes li { margin: 3px 0; }
"""

STYLESHEET = REPORT_STYLESHEET + LEADERBOARD_RULES

SORT_SCRIPT = """
document.querySelectorAll("table.board").forEach((table) => {
  const body = table.tBodies[0];
  const headers = Array.from(table.tHead.rows[0].cells);
  const rows = Array.from(body.rows);
  const order = (row) => Number(row.dataset.order);
  const valueOf = (row, index, numeric) => {
    const raw = row.cells[index] ? row.cells[index].getAttribute("data-value") : null;
    if (raw === null || raw === "") return null;
    if (!numeric) return raw;
    const value = Number(raw);
    return Number.isFinite(value) ? value : null;
  };
  let current = null;
  const apply = (key, reversed) => {
    const header = headers.find((th) => th.dataset.sort === key);
    if (!header) return false;
    const index = headers.indexOf(header);
    const numeric = header.dataset.type === "number";
    // "better first" is descending for a higher-is-better column, ascending for everything else.
    const descending = (header.dataset.better === "higher") !== reversed;
    const sign = descending ? -1 : 1;
    const sorted = rows.slice().sort((a, b) => {
      if (key === "rank") return sign * (order(a) - order(b));
      const x = valueOf(a, index, numeric), y = valueOf(b, index, numeric);
      if (x === null || y === null) return (x === null) - (y === null) || order(a) - order(b);
      const compared = numeric ? x - y : x.localeCompare(y);
      return sign * compared || order(a) - order(b);
    });
    sorted.forEach((row) => body.appendChild(row));
    headers.forEach((th) => th.removeAttribute("aria-sort"));
    header.setAttribute("aria-sort", descending ? "descending" : "ascending");
    current = { key, reversed };
    return true;
  };
  const fromFragment = () => {
    const found = /^#sort=(-?)(.+)$/.exec(window.location.hash);
    let key = null;
    try { key = found ? decodeURIComponent(found[2]) : null; } catch (error) { key = null; }
    if (key === null || !apply(key, found[1] === "-")) apply("rank", false);
  };
  headers.forEach((th) => {
    const button = th.querySelector("button");
    if (!th.dataset.sort || !button) return;
    button.addEventListener("click", () => {
      const key = th.dataset.sort;
      const reversed = current !== null && current.key === key && !current.reversed;
      apply(key, reversed);
      try { history.replaceState(null, "", "#sort=" + (reversed ? "-" : "") + encodeURIComponent(key)); }
      catch (error) { /* a page opened from a sandboxed viewer may not rewrite its URL; the sort holds */ }
    });
  });
  window.addEventListener("hashchange", fromFragment);
  fromFragment();
});
"""
