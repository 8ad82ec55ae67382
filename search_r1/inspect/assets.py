"""The page's style sheet and script, inlined into every page by ``search_r1.inspect.page`` (no file, font or script
is fetched: the page is one file a browser opens from disk).

The script reads the trajectories' filter fields from the page's JSON (``<script type="application/json"
id="trajectory-data">``: ``{"mode": "view" | "compare", "rows": [...]}``), hides the list rows that the filters
exclude, counts the rest into ``#shown``, and on a click shows that row's pre-rendered details (``#d-<id>``).
A row of the view: ``id, step, split, em, searched, length, score, terms``; of the comparison: ``id, change``.
A trajectory is right when its EM is at least 0.5 (``compare.RIGHT``); unknown when the file records none.
"""

CSS = """
[hidden] { display: none !important; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d1d1f; background: #fafafa; }
header { padding: 10px 16px; background: #24292f; color: #fff; }
header h1 { font-size: 17px; margin: 0 0 4px; }
header p { margin: 2px 0; color: #d0d7de; }
#filters { display: flex; flex-wrap: wrap; gap: 10px 18px; align-items: center; padding: 8px 16px;
  background: #eaeef2; border-bottom: 1px solid #d0d7de; position: sticky; top: 0; z-index: 1; }
#filters label { white-space: nowrap; }
#filters input[type=number] { width: 6em; }
main { display: grid; grid-template-columns: minmax(340px, 38%) 1fr; height: calc(100vh - 120px); }
#list-pane { overflow: auto; border-right: 1px solid #d0d7de; }
#detail-pane { overflow: auto; padding: 0 16px 24px; }
table { border-collapse: collapse; }
#list { width: 100%; font-size: 13px; }
#list th { position: sticky; top: 0; background: #f6f8fa; text-align: left; }
#list td, #list th { padding: 3px 6px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
#list tr.row { cursor: pointer; }
#list tr.row:hover { background: #f0f6ff; }
#list tr.row.selected { background: #ddf4ff; }
.right { color: #1a7f37; font-weight: 600; }
.wrong { color: #cf222e; font-weight: 600; }
.unknown { color: #6e7781; }
.fixed { color: #1a7f37; font-weight: 600; }
.broken { color: #cf222e; font-weight: 600; }
main.compare { grid-template-columns: minmax(260px, 26%) 1fr; }
.pair { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 16px; }
.side > h2 { overflow-wrap: anywhere; }
.side > h2 { font-size: 15px; border-bottom: 2px solid #24292f; }
article.trajectory { border: 1px solid #d0d7de; border-radius: 6px; background: #fff; padding: 4px 12px 10px;
  margin: 12px 0; }
article h3 { font-size: 13px; margin: 12px 0 4px; text-transform: uppercase; color: #57606a; }
dl.facts { display: flex; flex-wrap: wrap; gap: 2px 18px; margin: 6px 0; font-size: 13px; }
dl.facts div { display: inline-flex; gap: 6px; }
dl.facts dt { color: #57606a; }
dl.facts dd { margin: 0; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font: 12.5px/1.45 ui-monospace, monospace; }
pre.prompt { background: #f6f8fa; padding: 6px; border-radius: 4px; max-height: 9em; overflow: auto; }
.turn { margin: 6px 0; border-left: 3px solid #0969da; padding-left: 8px; }
.turn-head { font-size: 12px; color: #0969da; }
.seg.policy { color: #1d1d1f; }
.seg.inserted { display: block; margin: 4px 0; padding: 4px 6px; color: #57606a;
  background: repeating-linear-gradient(135deg, #f6f8fa, #f6f8fa 6px, #eef1f4 6px, #eef1f4 12px);
  border: 1px dashed #8c959f; border-radius: 4px; }
.seg.inserted::before { content: "inserted by the environment: " attr(data-tokens) " tokens, no gradient";
  display: block; font: 600 11px system-ui, sans-serif; color: #9a6700; margin-bottom: 2px; }
.seg.unmarked { color: #1d1d1f; }
.note { color: #9a6700; font-size: 12px; }
table.terms td, table.terms th { padding: 1px 10px 1px 0; text-align: left; font-weight: normal; }
table.terms th { color: #57606a; }
#empty { padding: 16px; color: #57606a; }
"""

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("trajectory-data").textContent);
const byId = new Map(DATA.rows.map(r => [r.id, r]));
const RIGHT = 0.5;

function value(id) {
  const el = document.getElementById(id);
  return el ? el.value : "";
}

function bound(id) {
  const v = value(id);
  return v === "" ? null : Number(v);
}

function within(x, lo, hi) {
  if (lo === null && hi === null) return true;
  if (x === null || x === undefined) return false;
  return (lo === null || x >= lo) && (hi === null || x <= hi);
}

function outcome(r) {
  return r.em === null ? "unknown" : (r.em >= RIGHT ? "right" : "wrong");
}

function searched(r) {
  return r.searched === null ? "unknown" : (r.searched ? "yes" : "no");
}

function keepView(r) {
  const step = value("f-step"), split = value("f-split"), oc = value("f-outcome"), se = value("f-search");
  if (step !== "" && String(r.step) !== step) return false;
  if (split !== "" && r.split !== split) return false;
  if (oc !== "" && outcome(r) !== oc) return false;
  if (se !== "" && searched(r) !== se) return false;
  const term = value("f-term");
  if (term !== "") {
    const x = term === "score" ? r.score : r.terms[term];
    if (!within(x === undefined ? null : x, bound("f-term-min"), bound("f-term-max"))) return false;
  }
  return within(r.length, bound("f-len-min"), bound("f-len-max"));
}

function keepCompare(r) {
  const change = value("f-change");
  return change === "" || r.change === change;
}

function applyFilters() {
  const keep = DATA.mode === "compare" ? keepCompare : keepView;
  let shown = 0;
  for (const tr of document.querySelectorAll("#list tr.row")) {
    const ok = keep(byId.get(tr.dataset.id));
    tr.hidden = !ok;
    if (ok) shown += 1;
  }
  document.getElementById("shown").textContent = String(shown);
}

let current = null;
function show(id) {
  if (current) {
    document.getElementById("d-" + current).hidden = true;
    document.querySelector('#list tr[data-id="' + current + '"]').classList.remove("selected");
  }
  document.getElementById("d-" + id).hidden = false;
  document.querySelector('#list tr[data-id="' + id + '"]').classList.add("selected");
  document.getElementById("empty").hidden = true;
  document.getElementById("detail-pane").scrollTop = 0;
  current = id;
}

for (const el of document.querySelectorAll("#filters select, #filters input")) {
  el.addEventListener("input", applyFilters);
  el.addEventListener("change", applyFilters);
}
for (const tr of document.querySelectorAll("#list tr.row")) {
  tr.addEventListener("click", () => show(tr.dataset.id));
}
applyFilters();
"""
