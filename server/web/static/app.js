// fedhop live page: one EventSource on api/events; every message says what changed (see server/web/feed.py).
// Plain JS and inline SVG drawn here; no build step, nothing fetched from elsewhere.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const MAX_TABLE_ROWS = 300;  // feed.py's FEED_LINKS
const MAX_CLIENT_DOTS = 160;
const HOPS_SHOWN = 12;

const state = { status: null, spec: null, rounds: [], route: [], missing: [], links: null, topology: null,
                receivedAt: 0 };
let drawPending = false;

// ---- formatting -----------------------------------------------------------------------------------------
const fmtInt = (n) => (n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US"));
const fmtMetric = (x) => (typeof x === "number" ? x.toFixed(4) : "–");
function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return h ? `${h}h ${String(m).padStart(2, "0")}m` : m ? `${m}m ${String(sec).padStart(2, "0")}s` : `${sec}s`;
}
function fmtBytesShort(b) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(b) >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return `${b >= 100 || i === 0 ? b.toFixed(0) : b.toPrecision(3)} ${units[i]}`;
}
function linkClass(src, dst) {
  const role = (n) => (n === "ps" ? "ps" : n.startsWith("edge-") ? "edge" : "client");
  return [role(src), role(dst)].sort().join("↔");
}
const el = (id) => document.getElementById(id);
function svgEl(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
function text(parent, x, y, s, attrs) {
  const t = svgEl("text", { x, y, ...(attrs || {}) }, parent);
  t.textContent = s;
  return t;
}

// ---- applying a message -----------------------------------------------------------------------------------
function apply(msg) {
  if (msg.reset) {
    Object.assign(state, { spec: null, rounds: [], route: [], missing: [], links: null, topology: null });
  }
  if (msg.status.spec) state.spec = msg.status.spec;
  state.status = msg.status;
  state.receivedAt = performance.now();
  state.rounds.push(...msg.rounds);
  if (msg.cumulative) {
    const c = msg.cumulative;
    c.payload_bytes.forEach((p, i) => {
      const r = state.rounds[c.from + i];
      if (r) { r.payload_bytes = p; r.message_bytes = c.message_bytes[i]; }
    });
  }
  state.route.push(...msg.route);
  state.missing.push(...msg.missing);
  if (msg.links) state.links = msg.links;
  if (msg.topology) state.topology = msg.topology;
  if (!drawPending) {
    drawPending = true;
    requestAnimationFrame(() => { drawPending = false; draw(); });
  }
}

// ---- drawing ------------------------------------------------------------------------------------------------
function draw() {
  drawFacts();
  const evaluated = (key) => state.rounds.filter((r) => typeof r[key] === "number");
  const acc = evaluated("accuracy"), loss = evaluated("loss");
  // a run folder being written has no byte counts before its end (fedhop ui; the PS's own page has them live)
  const st = state.status, noBytes = st && st.source === "folder" && !(state.links && state.links.links.length);
  const bytes = (rows) => (noBytes ? [] : rows);
  const why = noBytes ? "bytes are written when the run ends" : undefined;
  lineChart(el("chart-acc-round"), acc.map((r) => [r.round, r.accuracy]), "round", fmtInt, true);
  lineChart(el("chart-acc-bytes"), bytes(acc.map((r) => [r.payload_bytes, r.accuracy])), "cumulative payload",
            fmtBytesShort, false, why);
  lineChart(el("chart-loss-round"), loss.map((r) => [r.round, r.loss]), "round", fmtInt, true);
  lineChart(el("chart-loss-bytes"), bytes(loss.map((r) => [r.payload_bytes, r.loss])), "cumulative payload",
            fmtBytesShort, false, why);
  drawLinks();
  refreshTimeline();
  drawTopology();
  drawRoute();
  drawMissing();
}

function drawFacts() {
  const st = state.status;
  if (!st) return;
  if (state.spec) {
    el("run-name").textContent = state.spec.name;
    el("run-algorithm").textContent = state.spec.algorithm.name;
    document.title = `fedhop · ${state.spec.name} · ${st.phase}`;
  }
  el("run-id").textContent = st.run_id || "–";
  if (st.source === "folder") folderNav(st);
  const phase = el("phase");
  phase.textContent = st.phase;
  phase.className = `phase ${st.phase}`;
  const shown = st.phase === "running" && st.round ? st.round : st.rounds_completed;
  el("round").textContent = `${shown} / ${st.rounds_total}`;
  el("nodes").textContent = `${st.nodes.joined} / ${st.nodes.expected}`;
  el("lost").textContent = String(Object.keys(st.nodes.lost).length);
  el("last-accuracy").textContent = fmtMetric(st.last.accuracy);
  el("last-loss").textContent = fmtMetric(st.last.loss);
  const err = el("error");
  err.hidden = !st.error;
  err.textContent = st.error || "";
  tickClock();
}

function tickClock() {
  const st = state.status;
  if (!st) return;
  const live = st.phase === "running" || st.phase === "joining";
  const since = live ? (performance.now() - state.receivedAt) / 1000 : 0;
  el("elapsed").textContent = fmtDuration(st.elapsed_s + since);
  el("eta").textContent = st.eta_s === null ? "–" : fmtDuration(st.eta_s - since);
}

function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { hi = lo + 1; }
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let i = Math.ceil(lo / step - 1e-9); i <= Math.floor(hi / step + 1e-9); i++) out.push(Number((i * step).toPrecision(12)));
  return out;
}

function lineChart(svg, pts, xLabel, xFmt, integerX, empty) {
  svg.replaceChildren();
  const W = svg.clientWidth || 460, H = svg.clientHeight || 220;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const L = 52, R = 14, T = 10, B = 34;
  if (!pts.length) {
    text(svg, W / 2, H / 2, empty || "no evaluated round yet", { "text-anchor": "middle", class: "empty" });
    return;
  }
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => p[1])), y1 = Math.max(...pts.map((p) => p[1]));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 0.05; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.06; y0 -= pad; y1 += pad;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  for (const t of niceTicks(y0, y1, 4)) {
    svgEl("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }, svg);
    text(svg, L - 6, sy(t) + 4, Math.abs(t) >= 100 ? t.toFixed(0) : t.toPrecision(3), { "text-anchor": "end" });
  }
  for (const t of niceTicks(x0, x1, 5).filter((v) => !integerX || Number.isInteger(v))) {
    svgEl("line", { x1: sx(t), x2: sx(t), y1: H - B, y2: H - B + 4, class: "axis" }, svg);
    text(svg, sx(t), H - B + 16, xFmt(t), { "text-anchor": "middle" });
  }
  svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }, svg);
  svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }, svg);
  text(svg, (L + W - R) / 2, H - 4, xLabel, { "text-anchor": "middle" });
  svgEl("polyline", { points: pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" "),
                      class: "line" }, svg);
  if (pts.length <= 60) for (const p of pts) svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, class: "pt" }, svg);
}

function drawLinks() {
  const body = el("links-body");
  body.replaceChildren();
  const L = state.links;
  if (!L) return;
  const hasWire = "wire_bytes" in L.totals;
  el("links").classList.toggle("nowire", !hasWire);
  el("total-payload").textContent = fmtInt(L.totals.payload_bytes);
  el("total-message").textContent = fmtInt(L.totals.message_bytes);
  const rows = L.links.slice(0, MAX_TABLE_ROWS);
  const total = L.links_total ?? L.links.length;  // the feed sends the largest links and their count (feed.py)
  el("links-note").textContent = total > rows.length
    ? `(largest ${rows.length} of ${total} links)` : `(${total} links, largest first)`;
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset.link = `${r.src}>${r.dst}`;
    const cells = [
      [`${r.src} → ${r.dst}`, "link"], [linkClass(r.src, r.dst), "class"],
      [fmtInt(r.payload_bytes), "num payload"], [fmtInt(r.message_bytes), "num message"],
      [hasWire ? fmtInt(r.wire_bytes) : "", "num wire"], [fmtInt(r.messages), "num messages"],
      [r.kinds.join(", "), "kinds"],
    ];
    for (const [v, cls] of cells) {
      const td = document.createElement("td");
      td.className = cls;
      td.textContent = v;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

function drawMissing() {
  const body = el("missing-body");
  body.replaceChildren();
  el("missing-count").textContent = `(${state.missing.length} entries)`;
  for (const m of state.missing.slice(-MAX_TABLE_ROWS)) {
    const tr = document.createElement("tr");
    for (const [v, cls] of [[m.round, "num"], [m.by, ""], [m.node, ""], [m.task, ""], [m.reason, ""]]) {
      const td = document.createElement("td");
      td.className = cls;
      td.textContent = String(v);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

function drawRoute() {
  const p = el("route");
  if (!state.route.length) { p.textContent = ""; return; }
  const shown = state.route.slice(-40).map((s) => `r${s.round}: ${s.edges.join(" → ")}${s.redo ? ` (redo: ${s.redo})` : ""}`);
  p.textContent = `Route${state.route.length > 40 ? " (last 40 rounds)" : ""}: ${shown.join(" · ")}`;
}

function drawTopology() {
  const svg = el("topology");
  svg.replaceChildren();
  const T = state.topology;
  if (!T || !T.clients.length) return;
  const W = svg.clientWidth || 900, H = svg.clientHeight || 340;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const missed = new Set(state.missing.map((m) => m.node));  // the feed resends topology only when nodes change
  const pos = {};
  const yPS = 28, yEdge = T.edges.length ? 150 : null, yClient = H - 40;
  pos[T.server] = [W / 2, yPS];
  T.edges.forEach((e, i) => { pos[e] = [((i + 0.5) * W) / T.edges.length, yEdge]; });
  const groups = T.edges.length ? T.edges.map((e) => [e, T.clients.filter((c) => T.parent[c] === e)])
                                : [[T.server, T.clients]];
  const dots = T.clients.length <= MAX_CLIENT_DOTS;
  if (dots) T.clients.forEach((c, i) => { pos[c] = [((i + 0.5) * W) / T.clients.length, yClient]; });

  const tree = svgEl("g", {}, svg);
  for (const e of T.edges) svgEl("line", lineAttrs(pos[T.server], pos[e], "tree"), tree);
  if (dots) for (const c of T.clients) svgEl("line", lineAttrs(pos[T.parent[c]], pos[c], "tree"), tree);
  const arc = (a, b, cls, bend) => {
    const [x1, y1] = pos[a], [x2, y2] = pos[b];
    const mx = (x1 + x2) / 2, my = Math.min(y1, y2) - bend - Math.abs(x2 - x1) * 0.18;
    return svgEl("path", { d: `M${x1},${y1} Q${mx},${my} ${x2},${y2}`, class: cls }, svg);
  };
  for (const [a, b] of T.edge_graph) arc(a, b, "graph", 10);

  // hops of the model between edges: consecutive route entries, the latest darkest
  const seq = [];
  for (const s of state.route) for (const e of s.edges) seq.push(e);
  const visits = {};
  for (const e of seq) visits[e] = (visits[e] || 0) + 1;
  const hops = [];
  for (let i = 1; i < seq.length; i++) if (seq[i] !== seq[i - 1]) hops.push([seq[i - 1], seq[i]]);
  hops.slice(-HOPS_SHOWN).forEach(([a, b], i, arr) => {
    const k = (i + 1) / arr.length;
    const p = arc(a, b, "hop", 26);
    p.setAttribute("stroke-width", String(1 + 2.5 * k));
    p.setAttribute("stroke-opacity", String(0.15 + 0.85 * k));
    p.setAttribute("marker-end", "url(#arrow)");
  });
  const defs = svgEl("defs", {}, svg);
  const marker = svgEl("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 16, refY: 5, markerWidth: 6,
                                   markerHeight: 6, orient: "auto-start-reverse" }, defs);
  svgEl("path", { d: "M0,0 L10,5 L0,10 z", fill: "#d9480f" }, marker);

  const node = (n, r, label, below) => {
    const st = (T.nodes[n] || {}).state || "waiting";
    const [x, y] = pos[n];
    const c = svgEl("circle", { cx: x, cy: y, r, class: `node ${st}${missed.has(n) ? " missed" : ""}` }, svg);
    c.dataset.node = n;
    const t = svgEl("title", {}, c);
    t.textContent = `${n}: ${st}${T.nodes[n] && T.nodes[n].reason ? ` (${T.nodes[n].reason})` : ""}` +
                    (missed.has(n) ? "; in the missing log" : "");
    if (st === "lost") {
      svgEl("path", { d: `M${x - r / 2},${y - r / 2} L${x + r / 2},${y + r / 2} M${x + r / 2},${y - r / 2} L${x - r / 2},${y + r / 2}`,
                      stroke: "#fff", "stroke-width": 2 }, svg);
    }
    if (label) text(svg, x, below ? y + r + 13 : y - r - 5, label, { "text-anchor": "middle" });
  };
  node(T.server, 13, "PS", false);
  for (const e of T.edges) {
    node(e, 11, e, true);
    if (visits[e]) text(svg, pos[e][0], pos[e][1] + 36, `visits ${visits[e]}`, { "text-anchor": "middle", class: "visits" });
  }
  const holder = seq.length ? seq[seq.length - 1] : null;
  if (holder && pos[holder]) svgEl("circle", { cx: pos[holder][0], cy: pos[holder][1], r: 17, class: "holder" }, svg);
  if (dots) {
    const r = Math.max(3, Math.min(8, W / T.clients.length / 3));
    for (const c of T.clients) node(c, r, T.clients.length <= 24 ? c.replace("client-", "c") : "", true);
  } else {
    // too many clients to draw one by one: one box per cluster with its counts
    groups.forEach(([parent, members], i) => {
      const x = ((i + 0.5) * W) / groups.length, w = Math.min(120, W / groups.length - 8);
      const counts = { joined: 0, waiting: 0, lost: 0 };
      for (const c of members) counts[(T.nodes[c] || {}).state || "waiting"]++;
      svgEl("line", lineAttrs(pos[parent], [x, yClient - 14], "tree"), tree);
      svgEl("rect", { x: x - w / 2, y: yClient - 14, width: w, height: 28, rx: 4,
                      class: `node ${counts.lost ? "lost" : counts.waiting ? "waiting" : "joined"}` }, svg);
      text(svg, x, yClient + 4, `${members.length} clients${counts.lost ? `, ${counts.lost} lost` : ""}`,
           { "text-anchor": "middle" });
    });
  }
}

function lineAttrs(a, b, cls) {
  return { x1: a[0], y1: a[1], x2: b[0], y2: b[1], class: cls };
}

// A run served by `fedhop ui` from its folder (server/web/browse.py): a way back to the list, and to the PS's
// own page while the run is live.
function folderNav(st) {
  let nav = el("folder-nav");
  if (!nav) {
    nav = document.createElement("nav");
    nav.id = "folder-nav";
    nav.className = "legend";
    document.querySelector("header").after(nav);
  }
  const home = document.createElement("a");
  home.id = "home";
  home.href = st.home || "../../";
  home.textContent = "← all runs";
  nav.replaceChildren(home, ` · read from the run folder ${st.folder}`);
  if (st.live_url) {
    const live = document.createElement("a");
    live.href = st.live_url;
    live.textContent = "the PS's live page";
    nav.append(" · running: ", live);
  }
}

// ---- where the last round's time went: /api/timeline's chart (server/web/gantt.py) ------------------------------
let timelineKey = null, timelineBusy = false;
function refreshTimeline() {
  const st = state.status;
  if (!st || timelineBusy) return;
  const key = `${st.run_id}/${st.rounds_completed}/${st.phase}`;
  if (key === timelineKey) return;
  timelineBusy = true;
  fetch(`api/timeline?since=${Math.max(0, (st.rounds_completed || 1) - 1)}`, { cache: "no-store" })
    .then((r) => (r.ok ? r.json() : null))
    .then((got) => { if (got) { timelineKey = key; drawGantt(got.chart); } })
    .catch(() => {})
    .finally(() => { timelineBusy = false; });
}

function drawGantt(chart) {
  const svg = el("gantt"), body = el("rates-body");
  svg.replaceChildren();
  body.replaceChildren();
  if (!chart || !chart.nodes.length) { el("gantt-note").textContent = "no timed round yet"; return; }
  const fmtS = (x) => (typeof x === "number" ? x.toFixed(3) : "–");
  el("gantt-note").textContent = `round ${chart.round + 1}: ${fmtS(chart.round_s)} s measured` +
    (chart.predicted_round_s !== null && chart.predicted_round_s !== undefined
      ? `, ${fmtS(chart.predicted_round_s)} s predicted` : "");
  const rowH = 18, left = 80, w = Math.max(300, svg.clientWidth || 800), h = chart.nodes.length * rowH + 24;
  svg.style.height = `${h}px`;
  const ends = chart.nodes.map((n) => n.segments.reduce((m, s) => Math.max(m, s.start + s.seconds), 0));
  const span = Math.max(...ends, chart.round_s || 0, chart.predicted_round_s || 0, 1e-6);
  const x = (t) => left + (t / span) * (w - left - 10);
  chart.nodes.forEach((n, i) => {
    const y = 4 + i * rowH;
    text(svg, 4, y + rowH * 0.7, n.node);
    for (const s of n.segments) {
      const r = svgEl("rect", { x: x(s.start), y, width: Math.max(1, x(s.start + s.seconds) - x(s.start)),
                                height: rowH - 4, class: s.phase }, svg);
      svgEl("title", {}, r).textContent = `${n.node} ${s.phase}: ${s.seconds.toFixed(4)} s`;
    }
  });
  const bottom = 4 + chart.nodes.length * rowH;
  text(svg, left, bottom + 14, "0 s");
  text(svg, w - 60, bottom + 14, `${span.toFixed(3)} s`);
  if (typeof chart.predicted_round_s === "number") {
    svgEl("line", { x1: x(chart.predicted_round_s), x2: x(chart.predicted_round_s), y1: 0, y2: bottom,
                    class: "predicted" }, svg);
  }
  const mbit = (v) => (v === null || v === undefined ? "unlimited" : String(v));
  for (const lk of chart.links) {
    const tr = document.createElement("tr");
    const conf = lk.configured_mbit ? `${mbit(lk.configured_mbit.out)} / ${mbit(lk.configured_mbit.back)}` : "–";
    const cells = [`${lk.src} ↔ ${lk.dst}`, fmtInt(lk.bytes), fmtS(lk.transfer_s), fmtS(lk.predicted_s),
                   typeof lk.achieved_mbit === "number" ? lk.achieved_mbit.toFixed(2) : "–", conf];
    cells.forEach((c, j) => {
      const td = document.createElement("td");
      td.textContent = c;
      if (j) td.className = "num";
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

// ---- the feed -------------------------------------------------------------------------------------------------
const ENDED = ["finished", "failed", "interrupted"];
function connect() {
  const conn = el("conn");
  const es = new EventSource("api/events");
  es.addEventListener("update", (ev) => {
    const msg = JSON.parse(ev.data);
    const folder = msg.status.source === "folder";
    conn.textContent = folder ? (msg.status.phase === "running" ? "run folder (following)" : "run folder") : "live";
    conn.className = folder ? "conn folder" : "conn live";
    apply(msg);
  });
  es.onerror = () => {
    if (!state.status) finalState();
    const st = state.status, done = st && ENDED.includes(st.phase);
    conn.textContent = !done ? "reconnecting…" : st.source === "folder" ? "run folder (fedhop ui stopped)"
      : "run ended; server gone (fedhop ui shows it from its run folder)";
    conn.className = "conn down";
  };
}

// The stream gave nothing (the server was closing, or a proxy keeps event streams out): the run's state from
// the JSON API once, so a page opened as a run ends shows that run rather than an empty page.
async function finalState() {
  const get = async (path) => {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(`${path}: ${r.status}`);
    return r.json();
  };
  try {
    const [status, rounds, links, topology, missing] = await Promise.all(
      ["api/status", "api/rounds", "api/links", "api/topology", "api/missing"].map(get));
    if (state.status) return;  // the stream came back meanwhile
    apply({ reset: true, status, rounds: rounds.rounds, route: topology.route, missing: missing.missing, links,
            topology });
    const conn = el("conn");
    conn.textContent = ENDED.includes(status.phase) ? "run ended (final state)" : "no live stream (state as read)";
    conn.className = "conn down";
  } catch (e) {
    // the server is gone too: nothing to show
  }
}

window.addEventListener("resize", () => draw());
setInterval(tickClock, 1000);
function start() {
  const snapshot = el("snapshot");  // the state when the page was served (server/web/app.py), until the stream speaks
  if (snapshot) apply(JSON.parse(snapshot.textContent));
  connect();
}
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
