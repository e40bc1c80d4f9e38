/* webgym-engine run report: the index (sort, filter, paginate) and the episode page (steps, action overlays).
 * Data arrives as <script> files calling WG.setSummary / WG.addIndex / WG.episode (fetch() of file:// is
 * blocked in browsers). Everything from the records is inserted as text, never as HTML. */
"use strict";

const WG = { parts: [], loaded: 0, rows: [], meta: null };
const PAGE = 100;
const SVGNS = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function loadScript(src, onerror) {
  const s = el("script", { src: src });
  if (onerror) s.onerror = onerror;
  document.body.append(s);
  return s;
}

const fmt = {
  reward: (v) => (v === null || v === undefined ? "—" : String(v)),
  num: (v, d) => (typeof v === "number" ? v.toFixed(d) : "—"),
  pct: (v) => (typeof v === "number" ? (100 * v).toFixed(1) + "%" : "—"),
  json: (v) => JSON.stringify(v, null, 1),
};

WG.setSummary = function (meta) {
  WG.meta = meta;
  if (document.body.classList.contains("index")) initIndex(meta);
  else initEpisode();
};

/* ---------------------------------------------------------------- index */

function initIndex(meta) {
  document.getElementById("title").textContent = "run " + meta.run;
  document.title = "run " + meta.run;
  document.getElementById("meta").textContent = [
    "policy " + (meta.policy || "?"), "mode " + (meta.mode || "?"),
    meta.interaction ? "interaction " + meta.interaction : null, meta.code_version,
    "report built " + new Date(meta.built_at * 1000).toLocaleString() + " in " + meta.build_s + " s",
  ].filter(Boolean).join(" · ");
  const s = meta.summary;
  const figures = [
    ["episodes", s.episodes], ["succeeded", s.succeeded], ["failed", s.failed], ["unrewarded", s.unrewarded],
    ["blocked", s.blocked], ["errors", s.errors], ["judge pending", s.judge_pending],
    ["success rate (of rewarded)", fmt.pct(s.success_rate)], ["steps", s.steps],
    ["steps/s", fmt.num(s.steps_per_s, 2)], ["step latency p50", fmt.num(s.step_latency_p50_ms, 0) + " ms"],
    ["step latency p95", fmt.num(s.step_latency_p95_ms, 0) + " ms"], ["elapsed", fmt.num(s.elapsed_s, 1) + " s"],
  ];
  const table = document.getElementById("summary");
  for (const [k, v] of figures) table.append(el("tr", {}, el("th", { text: k }), el("td", { text: String(v) })));
  drawChart(meta.by_difficulty);
  for (const th of document.querySelectorAll("#episodes th")) th.onclick = () => sortBy(th.dataset.key);
  for (const id of ["f-status", "f-site", "f-diff"]) document.getElementById(id).onchange = () => filterChanged();
  document.getElementById("f-text").oninput = () => filterChanged();
  document.getElementById("prev").onclick = () => turn(-1);
  document.getElementById("next").onclick = () => turn(1);
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT" || e.target.tagName === "SELECT") return;
    if (e.key === "/") { e.preventDefault(); document.getElementById("f-text").focus(); }
    else if (e.key === "n") turn(1);
    else if (e.key === "p") turn(-1);
  });
  if (!meta.chunks) finishLoading();
  // All chunks load in parallel; the table shows as soon as the first one is in.
  for (let k = 0; k < meta.chunks; k++) loadScript("data/index-" + k + ".js");
}

WG.addIndex = function (k, rows) {
  for (const r of rows) r.hay = [r.task, r.id, r.reason, r.error, r.site].join(" ").toLowerCase();
  WG.parts[k] = rows;
  WG.loaded += 1;
  WG.rows = [].concat(...WG.parts.filter(Boolean));
  if (WG.loaded === WG.meta.chunks) finishLoading();
  else if (WG.loaded === 1) render();
};

const state = { status: "", site: "", diff: "", text: "", key: "n", dir: 1, page: 0 };

function finishLoading() {
  const sites = [...new Set(WG.rows.map((r) => r.site))].sort();
  const diffs = [...new Set(WG.rows.map((r) => r.diff))].sort((a, b) => a - b);
  for (const v of sites) document.getElementById("f-site").append(el("option", { value: v, text: v }));
  for (const v of diffs) document.getElementById("f-diff").append(el("option", { value: String(v), text: String(v) }));
  // The filters live in the URL's hash, so coming back from an episode page keeps them.
  const saved = new URLSearchParams(location.hash.slice(1));
  for (const k of Object.keys(state)) if (saved.has(k)) state[k] = typeof state[k] === "number" ? +saved.get(k) : saved.get(k);
  document.getElementById("f-status").value = state.status;
  document.getElementById("f-site").value = state.site;
  document.getElementById("f-diff").value = state.diff;
  document.getElementById("f-text").value = state.text;
  render();
  document.body.dataset.loaded = "1";
}

function filterChanged() {
  state.status = document.getElementById("f-status").value;
  state.site = document.getElementById("f-site").value;
  state.diff = document.getElementById("f-diff").value;
  state.text = document.getElementById("f-text").value.trim().toLowerCase();
  state.page = 0;
  render();
}

function sortBy(key) {
  state.dir = state.key === key ? -state.dir : 1;
  state.key = key;
  render();
}

function turn(delta) {
  state.page += delta;
  render();
}

function visible() {
  const t = state.text.toLowerCase();
  const rows = WG.rows.filter((r) => (!state.status || r.status === state.status) &&
    (!state.site || r.site === state.site) && (!state.diff || String(r.diff) === state.diff) &&
    (!t || r.hay.includes(t)));
  const k = state.key, dir = state.dir;
  // Missing values sort last whatever the direction.
  rows.sort((a, b) => {
    const x = a[k], y = b[k];
    if (x === y) return a.n - b.n;
    if (x === null || x === undefined || x === "") return 1;
    if (y === null || y === undefined || y === "") return -1;
    return (x < y ? -1 : 1) * dir;
  });
  return rows;
}

function render() {
  const rows = visible();
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  state.page = Math.min(Math.max(0, state.page), pages - 1);
  const body = el("tbody");
  for (const r of rows.slice(state.page * PAGE, (state.page + 1) * PAGE)) {
    body.append(el("tr", { "data-n": r.n, class: "st-" + r.status },
      el("td", { text: r.n }),
      el("td", {}, el("a", { href: "episode.html#" + r.n, text: r.task || r.id })),
      el("td", { text: r.site }), el("td", { text: r.diff }),
      el("td", { class: "status", text: r.status }), el("td", { text: fmt.reward(r.reward) }),
      el("td", { class: "reason", text: r.reason, title: r.reason }), el("td", { text: r.steps }),
      el("td", { text: fmt.num(r.dur, 1) }), el("td", { class: "error", text: r.error, title: r.error })));
  }
  document.querySelector("#episodes tbody").replaceWith(body);
  for (const th of document.querySelectorAll("#episodes th")) {
    th.className = th.dataset.key === state.key ? (state.dir > 0 ? "asc" : "desc") : "";
  }
  document.getElementById("count").textContent = rows.length + " of " + WG.rows.length + " episodes";
  document.getElementById("page").textContent = "page " + (state.page + 1) + " of " + pages;
  document.getElementById("prev").disabled = state.page === 0;
  document.getElementById("next").disabled = state.page >= pages - 1;
  const hash = new URLSearchParams();
  for (const [k, v] of Object.entries(state)) if (v !== "" && !(k === "key" && v === "n") && !(k === "dir" && v === 1) && !(k === "page" && v === 0)) hash.set(k, v);
  history.replaceState(null, "", hash.toString() ? "#" + hash : location.pathname);
}

function drawChart(groups) {
  const w = 60, h = 120, top = 16, bottom = 30;
  const chart = svg("svg", { width: Math.max(1, groups.length) * w + 10, height: h + top + bottom, class: "chart" });
  groups.forEach((g, i) => {
    const bh = Math.round(g.rate * h), x = 10 + i * w;
    chart.append(svg("rect", { x: x, y: top + h - bh, width: w - 16, height: bh, class: "bar" }));
    chart.append(svg("rect", { x: x, y: top, width: w - 16, height: h, class: "bar-bg" }));
    chart.append(svg("text", { x: x + (w - 16) / 2, y: top + h - bh - 3, "text-anchor": "middle" }, fmt.pct(g.rate)));
    chart.append(svg("text", { x: x + (w - 16) / 2, y: top + h + 14, "text-anchor": "middle" }, "d" + g.difficulty));
    chart.append(svg("text", { x: x + (w - 16) / 2, y: top + h + 27, "text-anchor": "middle", class: "small" },
      g.succeeded + "/" + g.rewarded));
  });
  document.getElementById("chart").prepend(chart);
}

/* ---------------------------------------------------------------- episode */

let current = { n: -1, step: -1, script: null };

function initEpisode() {
  window.addEventListener("hashchange", loadEpisode);
  document.addEventListener("keydown", (e) => {
    const steps = document.querySelectorAll(".step");
    if (e.key === "j" || e.key === "ArrowDown" || e.key === "ArrowRight") { e.preventDefault(); focusStep(current.step + 1, steps); }
    else if (e.key === "k" || e.key === "ArrowUp" || e.key === "ArrowLeft") { e.preventDefault(); focusStep(current.step - 1, steps); }
    else if (e.key === "n" && current.n + 1 < WG.meta.total) location.hash = "#" + (current.n + 1);
    else if (e.key === "p" && current.n > 0) location.hash = "#" + (current.n - 1);
  });
  loadEpisode();
}

function loadEpisode() {
  const n = parseInt(location.hash.slice(1), 10) || 0;
  if (current.script) current.script.remove();
  current = { n: n, step: -1, script: null };
  const prev = document.getElementById("prev-ep"), next = document.getElementById("next-ep");
  prev.toggleAttribute("hidden", n <= 0);
  next.toggleAttribute("hidden", n + 1 >= WG.meta.total);
  prev.href = "#" + (n - 1);
  next.href = "#" + (n + 1);
  if (n < 0 || n >= WG.meta.total) {
    document.getElementById("ep").replaceChildren(el("p", { text: "no episode " + n + " in this report" }));
    return;
  }
  current.script = loadScript("data/ep-" + n + ".js");
}

function focusStep(i, steps) {
  if (!steps.length) return;
  i = Math.min(Math.max(0, i), steps.length - 1);
  for (const s of steps) s.classList.remove("current");
  steps[i].classList.add("current");
  steps[i].scrollIntoView({ block: "start" });
  current.step = i;
}

function dl(pairs) {
  const list = el("dl");
  for (const [k, v] of pairs) {
    if (v === null || v === undefined || v === "") continue;
    list.append(el("dt", { text: k }), el("dd", {}, typeof v === "object" && !(v instanceof Node) ? el("pre", { text: fmt.json(v) }) : v));
  }
  return list;
}

WG.episode = function (d) {
  document.title = "episode " + d.n + ": " + (d.task.task_name || d.id);
  const main = el("main", { id: "ep" });
  const reward = d.reward || {};
  main.append(el("h1", { text: d.task.task_name || d.id }),
    dl([["episode", d.n + " · " + d.id], ["status", el("span", { class: "status st-" + d.status, text: d.status })],
      ["reward", fmt.reward(reward.value) + (reward.source ? " (" + reward.source + ")" : "")],
      ["reason", reward.reason || d.judge_error], ["answer", d.answer],
      ["error", d.error ? d.error.kind + ": " + d.error.message : null],
      ["website", d.task.website], ["difficulty", d.task.difficulty], ["policy", d.policy], ["mode", d.mode],
      ["duration", fmt.num(d.duration_s, 2) + " s"], ["attempts", d.attempts],
      ["previous errors", d.previous_errors && d.previous_errors.length ? d.previous_errors : null],
      ["episode timings (ms)", d.timings_ms]]));
  main.append(rubric(d));
  if (reward.evidence) main.append(evidence(reward.evidence, d));
  const steps = el("section", { id: "steps" }, el("h2", { text: d.steps.length + " steps" }));
  d.steps.forEach((s, i) => steps.append(stepView(s, i, d.viewport)));
  const lastShot = d.steps.length ? d.steps[d.steps.length - 1].screenshot : null;
  if (d.final && d.final.screenshot && d.final.screenshot !== lastShot) {
    steps.append(el("section", { class: "step final", id: "final" }, el("h3", { text: "final page" }),
      el("div", { class: "body" }, shot(d.final, null, d.viewport),
        dl([["url", d.final.url], ["title", d.final.title], ["settled", String(d.final.settled)]]))));
  }
  main.append(steps);
  document.getElementById("ep").replaceWith(main);
  window.scrollTo(0, 0);
  document.body.dataset.loaded = String(d.n);
};

function rubric(d) {
  const sec = el("section", { id: "rubric" }, el("h2", { text: "rubric" }));
  const verdicts = {};
  for (const f of (d.reward && d.reward.facts) || []) verdicts[f.group + "\u0000" + f.fact] = f;
  for (const g of d.task.evaluator_reference || []) {
    const list = el("ul");
    for (const fact of g.facts || []) {
      const v = verdicts[g.id + "\u0000" + fact] || verdicts[String(g.id) + "\u0000" + fact];
      list.append(el("li", { class: v ? (v.passed ? "pass" : "fail") : "" }, el("span", { text: fact }),
        v ? el("span", { class: "detail", text: " — " + (v.passed ? "holds" : "fails") + " (" + v.check + ") " + (v.detail || "") }) : null));
    }
    sec.append(el("h3", { text: "group " + g.id + (g.description ? ": " + g.description : "") }), list);
  }
  if (d.task.definite_answer) sec.append(el("p", { text: "reference answer: " + d.task.definite_answer }));
  return sec;
}

function evidence(ev, d) {
  const sec = el("section", { id: "evidence" }, el("h2", { text: "judge evidence" }));
  if (ev.judge) sec.append(el("p", { text: "judge " + ev.judge.model + " · " + ev.judge.prompt_version }));
  const kp = ev.keypoint;
  if (kp) {
    const kept = new Set(kp.kept || []);
    const grid = el("div", { class: "thumbs" });
    for (const v of kp.verdicts || []) {
      grid.append(el("figure", { class: kept.has(v.ref) ? "kept" : "dropped" },
        el("img", { src: "../" + v.ref, alt: v.ref }),
        el("figcaption", { text: (kept.has(v.ref) ? "kept" : "not kept") + " — " + v.reason })));
    }
    sec.append(el("h3", { text: "keypoint screenshots (" + (kp.kept || []).length + " kept)" }), grid);
  }
  const rows = [];
  if (ev.blocking) rows.push(["blocking", (ev.blocking.blocked ? "blocked" : "not blocked") + " — " + ev.blocking.reason]);
  if (ev.hallucination) rows.push(["answer supported", (ev.hallucination.supported ? "yes" : "no") + " — " + ev.hallucination.reason]);
  for (const f of ev.facts || []) rows.push(["fact: " + f.fact, (f.passed ? "yes" : "no") + " — " + f.reason]);
  if (ev.reference) rows.push(["reference answer", (ev.reference.agrees ? "agrees" : "differs") + " — " + ev.reference.reason]);
  if (ev.counts) rows.push(["calls", ev.counts]);
  sec.append(dl(rows));
  return sec;
}

function stepView(s, i, viewport) {
  const a = s.action || {};
  const timings = el("table", { class: "timings" });
  for (const [k, v] of Object.entries(s.timings_ms || {})) timings.append(el("tr", {}, el("th", { text: k }), el("td", { text: v })));
  const result = s.result || {};
  const info = dl([
    ["thought", s.thought], ["action", s.action_text], ["parsed action", a],
    ["tool call", s.parsed && s.parsed.tool_call], ["coordinate frames", s.parsed && s.parsed.frames],
    ["parse error", s.parse_error ? el("span", { class: "parse-error", text: s.parse_error }) : null],
    ["error", s.error], ["note", s.note], ["url", s.url], ["title", s.title],
    ["settled before", s.settled === undefined ? null : String(s.settled)],
    ["settle after", result.settle], ["page changed", s.page_changed === undefined || s.page_changed === null ? null : String(s.page_changed)],
    ["url after", result.url && result.url !== s.url ? result.url : null],
    ["timings (ms)", timings.childElementCount ? timings : null],
    ["reply", s.reply && s.reply !== s.action_text ? el("pre", { text: s.reply }) : null],
    ["accessibility tree", s.axtree ? el("details", { class: "axtree" },
      el("summary", { text: s.axtree.split("\n").length + " lines" }), el("pre", { text: s.axtree })) : null],
    ["DOM snapshot", s.dom ? domTable(s.dom) : null],
  ]);
  return el("section", { class: "step", id: "step-" + i, "data-step": i },
    el("h3", { text: "step " + i + ": " + (s.action_text || a.name || "") }),
    el("div", { class: "body" }, shot(s, s, viewport), info));
}

/* A step's DOM snapshot (rows of id, parent, tag, x, y, w, h, visibility, clickable), folded: a count, then a
 * table of the elements with their boxes. */
function domTable(rows) {
  const visible = rows.filter((r) => r[7] >= 0.5).length, clickable = rows.filter((r) => r[8]).length;
  const table = el("table", { class: "dom" },
    el("tr", {}, ...["id", "tag", "x", "y", "w", "h", "visible", "clickable"].map((h) => el("th", { text: h }))));
  for (const r of rows) {
    table.append(el("tr", {}, ...[r[0], r[2], r[3], r[4], r[5], r[6], r[7], r[8] ? "yes" : ""].map(
      (v) => el("td", { text: String(v) }))));
  }
  return el("details", { class: "dom" }, el("summary", {
    text: rows.length + " elements (" + visible + " visible, " + clickable + " clickable)" }), table);
}

/* The screenshot with the action drawn over it. The SVG's viewBox is the screenshot's pixel size; actions
 * are in CSS px of the viewport, scaled by screenshot width / viewport width (1 when they are equal). */
function shot(frame, step, viewport) {
  const box = el("div", { class: "frame" });
  if (!frame.screenshot) return el("p", { class: "missing", text: "no screenshot recorded" });
  if (!frame.size) box.append(el("p", { class: "missing", text: "screenshot missing or unreadable: " + frame.screenshot }));
  const [W, H] = frame.size || viewport;
  const img = el("img", { src: "../" + frame.screenshot, alt: "screenshot " + frame.screenshot, width: W, height: H });
  box.append(img);
  if (step && frame.size) box.append(overlay(step, W, H, W / viewport[0]));
  return box;
}

function overlay(s, W, H, scale) {
  const o = svg("svg", { class: "overlay", viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none" });
  const a = s.action || {};
  // SoM boxes, when the step recorded its elements ([id, tag, text, x, y, w, h] in CSS px).
  for (const e of s.elements || []) {
    o.append(svg("rect", { class: "som", x: e[3] * scale, y: e[4] * scale, width: e[5] * scale, height: e[6] * scale }));
    o.append(svg("text", { class: "som-id", x: e[3] * scale + 2, y: e[4] * scale + 12 }, String(e[0])));
  }
  // Where the action landed (the worker's point), else where the policy aimed.
  const p = Array.isArray(s.point) ? s.point : (a.x !== undefined && a.y !== undefined ? [a.x, a.y] : null);
  const label = (x, y, text) => o.append(svg("text", { class: "label", x: x, y: y }, text));
  if (a.name === "scroll") {
    const [cx, cy] = p ? [p[0] * scale, p[1] * scale] : [W / 2, H / 2];
    const d = { up: [0, -1], down: [0, 1], left: [-1, 0], right: [1, 0] }[a.direction || "down"] || [0, 1];
    const L = 120 * scale, hx = cx + d[0] * L, hy = cy + d[1] * L, nx = -d[1], ny = d[0], k = 18 * scale;
    o.append(svg("path", {
      class: "marker scroll", "data-direction": a.direction || "down",
      d: `M${cx} ${cy} L${hx} ${hy} M${hx - d[0] * k + nx * k} ${hy - d[1] * k + ny * k} L${hx} ${hy} L${hx - d[0] * k - nx * k} ${hy - d[1] * k - ny * k}`,
    }));
    label(cx + 12, cy - 8, "scroll " + (a.direction || "down"));
  } else if (p) {
    const cx = p[0] * scale, cy = p[1] * scale;
    o.append(svg("circle", { class: "marker " + a.name, cx: cx, cy: cy, r: 18 * scale, "data-x": p[0], "data-y": p[1] }));
    o.append(svg("circle", { class: "dot", cx: cx, cy: cy, r: 4 * scale }));
    if (a.element_id !== undefined) label(cx + 24, cy + 26, "#" + a.element_id);
    if (a.name === "type" || a.name === "select") label(cx + 24, cy - 10, a.name + " " + JSON.stringify(a.text || ""));
  } else if (a.name === "keypress") {
    label(12, 28, "press " + a.keys);
  }
  return o;
}
