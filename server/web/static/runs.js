// fedhop ui: the run list (api/runs) and the ticked runs overlaid (api/curves), redrawn as the folders change.
// Plain JS and inline SVG; no build step, nothing fetched from elsewhere. The selection is in the URL
// (?compare=NAME,NAME), so an overlay can be bookmarked or shared.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1363c6", "#d9480f", "#2f9e44", "#9c36b5", "#e8590c", "#0c8599", "#c2255c", "#5c940d",
                "#364fc7", "#862e9c"];
const REFRESH_MS = 5000;
const NOT_METRICS = new Set(["round", "elapsed_s", "round_s", "payload_bytes", "message_bytes"]);
const state = { runs: [], selected: [], curves: [], hidden: new Set(), metric: null, logX: false, charts: [] };

const el = (id) => document.getElementById(id);
const fmtInt = (n) => (n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US"));
function fmtBytes(b) {
  if (b === null || b === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(b) >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return `${i === 0 ? b.toFixed(0) : b >= 100 ? b.toFixed(0) : b.toPrecision(3)} ${units[i]}`;
}
function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  if (s < 60) return `${s.toFixed(1)}s`;
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return h ? `${h}h ${String(m).padStart(2, "0")}m` : `${m}m ${String(sec).padStart(2, "0")}s`;
}
const fmtValue = (v) => (Math.abs(v) >= 100 ? v.toFixed(1) : Math.abs(v) >= 1e-3 || v === 0 ? v.toFixed(4) : v.toExponential(3));
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
const colorOf = (name) => COLORS[state.selected.indexOf(name) % COLORS.length];

// ---- the list ------------------------------------------------------------------------------------------
async function loadRuns() {
  const conn = el("conn");
  try {
    const r = await fetch("api/runs", { cache: "no-store" });
    if (!r.ok) throw new Error(`api/runs: ${r.status}`);
    const data = await r.json();
    state.runs = data.runs;
    el("root").textContent = data.root;
    conn.textContent = `${data.runs.length} runs · read ${new Date().toLocaleTimeString()}`;
    conn.className = "conn folder";
  } catch (e) {
    conn.textContent = "fedhop ui is not answering";
    conn.className = "conn down";
    return;
  }
  const known = new Set(state.runs.map((r) => r.name));
  state.selected = state.selected.filter((n) => known.has(n));
  drawRuns();
  if (state.selected.some((n) => (state.runs.find((r) => r.name === n) || {}).status === "running") ||
      state.curves.length !== state.selected.length) {
    await loadCurves();
  }
}

function drawRuns() {
  const body = el("runs-body");
  body.replaceChildren();
  el("empty").hidden = state.runs.length > 0;
  const counts = {};
  for (const r of state.runs) counts[r.status] = (counts[r.status] || 0) + 1;
  el("runs-note").textContent = `(${Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ") || "none"})`;
  for (const r of state.runs) {
    const tr = document.createElement("tr");
    tr.dataset.run = r.name;
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "pick";
    box.checked = state.selected.includes(r.name);
    box.addEventListener("change", () => toggle(r.name, box.checked));
    const pick = document.createElement("td");
    pick.appendChild(box);
    tr.appendChild(pick);
    const name = document.createElement("td");
    name.className = "name";
    const a = document.createElement("a");
    a.href = r.page;
    a.textContent = r.name;
    name.appendChild(a);
    tr.appendChild(name);
    const total = r.rounds_total === null ? "?" : r.rounds_total;
    const cells = [
      [r.algorithm || "?", "algorithm"], [r.status, `status ${r.status}`],
      [`${r.rounds_done}/${total}`, "num rounds"],
      [r.accuracy === null ? "–" : r.accuracy.toFixed(4), "num accuracy"],
      [fmtBytes(r.payload_bytes), "num payload"], [fmtDuration(r.duration_s), "num duration"],
      [r.started ? new Date(r.started * 1000).toLocaleString() : "–", "started"],
    ];
    for (const [v, cls] of cells) {
      const td = document.createElement("td");
      td.className = cls;
      td.textContent = v;
      if (cls.startsWith("status")) td.title = r.why;
      tr.appendChild(td);
    }
    const live = document.createElement("td");
    if (r.url) {
      const l = document.createElement("a");
      l.href = r.url;
      l.textContent = "PS page";
      live.appendChild(l);
    }
    tr.appendChild(live);
    body.appendChild(tr);
  }
}

function toggle(name, on) {
  state.selected = on ? [...state.selected.filter((n) => n !== name), name] : state.selected.filter((n) => n !== name);
  const url = new URL(window.location.href);
  url.search = state.selected.length ? `?compare=${state.selected.map(encodeURIComponent).join(",")}` : "";
  history.replaceState(null, "", url);
  loadCurves();
}

// ---- the overlay ---------------------------------------------------------------------------------------
async function loadCurves() {
  if (!state.selected.length) {
    state.curves = [];
    drawOverlay();
    return;
  }
  const q = state.selected.map((n) => `run=${encodeURIComponent(n)}`).join("&");
  const r = await fetch(`api/curves?${q}`, { cache: "no-store" });
  if (!r.ok) return;
  state.curves = (await r.json()).runs;
  const metrics = new Set();
  for (const c of state.curves) for (const row of c.rounds) for (const k of Object.keys(row)) if (!NOT_METRICS.has(k)) metrics.add(k);
  const sel = el("metric");
  const names = [...metrics].sort((a, b) => (a === "accuracy" ? -1 : b === "accuracy" ? 1 : a.localeCompare(b)));
  if (!state.metric || !metrics.has(state.metric)) state.metric = names.includes("accuracy") ? "accuracy" : names[0] || null;
  sel.replaceChildren(...names.map((m) => { const o = document.createElement("option"); o.value = o.textContent = m; return o; }));
  if (state.metric) sel.value = state.metric;
  drawOverlay();
}

function drawOverlay() {
  const metric = state.metric;
  for (const s of document.querySelectorAll(".metric-name")) s.textContent = metric || "metric";
  el("overlay-note").textContent = state.selected.length ? `(${state.selected.length} runs; hover a chart for values, click a name to hide it)` : "(tick runs above)";
  drawLegend();
  const series = (xKey) => state.curves.filter((c) => !state.hidden.has(c.name)).map((c) => ({
    name: c.name, algorithm: c.algorithm, color: colorOf(c.name),
    pts: c.rounds.filter((r) => typeof r[metric] === "number" && typeof r[xKey] === "number")
                 .map((r) => [r[xKey], r[metric], r.round]),
  }));
  state.charts = [
    overlayChart(el("ov-round"), series("round"), "round", fmtInt, false),
    overlayChart(el("ov-bytes"), series("payload_bytes"), "cumulative payload", fmtBytes, state.logX),
    overlayChart(el("ov-time"), series("elapsed_s"), "seconds", (s) => fmtDuration(s), false),
  ];
}

function drawLegend() {
  const legend = el("legend");
  legend.replaceChildren();
  for (const c of state.curves) {
    const s = document.createElement("span");
    s.dataset.run = c.name;
    s.className = state.hidden.has(c.name) ? "off" : "";
    const sw = document.createElement("i");
    sw.style.background = colorOf(c.name);
    s.append(sw, `${c.name} (${c.algorithm || "?"}, ${c.status})`);
    s.addEventListener("click", () => {
      if (state.hidden.has(c.name)) state.hidden.delete(c.name); else state.hidden.add(c.name);
      drawOverlay();
    });
    legend.appendChild(s);
  }
}

function niceTicks(lo, hi, n) {
  if (!(hi > lo)) hi = lo + 1;
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let i = Math.ceil(lo / step - 1e-9); i <= Math.floor(hi / step + 1e-9); i++) out.push(Number((i * step).toPrecision(12)));
  return out;
}

function overlayChart(svg, series, xLabel, xFmt, logX) {
  svg.replaceChildren();
  const W = svg.clientWidth || 420, H = svg.clientHeight || 220;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const L = 52, R = 14, T = 10, B = 34;
  const all = series.flatMap((s) => s.pts).filter((p) => !logX || p[0] > 0);
  if (!all.length) {
    text(svg, W / 2, H / 2, state.selected.length ? "no points" : "tick runs to overlay them",
         { "text-anchor": "middle", class: "empty" });
    return null;
  }
  const fx = logX ? Math.log10 : (x) => x;
  let x0 = Math.min(...all.map((p) => fx(p[0]))), x1 = Math.max(...all.map((p) => fx(p[0])));
  let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.05 || 0.05; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.06; y0 -= pad; y1 += pad;
  const sx = (x) => L + ((fx(x) - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  for (const t of niceTicks(y0, y1, 4)) {
    svgEl("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }, svg);
    text(svg, L - 6, sy(t) + 4, Math.abs(t) >= 100 ? t.toFixed(0) : t.toPrecision(3), { "text-anchor": "end" });
  }
  const xt = logX ? niceTicks(x0, x1, 4).filter(Number.isInteger).map((e) => Math.pow(10, e))
                  : niceTicks(x0, x1, 5).filter((v) => xLabel !== "round" || Number.isInteger(v));
  for (const t of xt) {
    svgEl("line", { x1: sx(t), x2: sx(t), y1: H - B, y2: H - B + 4, class: "axis" }, svg);
    text(svg, sx(t), H - B + 16, xFmt(t), { "text-anchor": "middle" });
  }
  svgEl("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }, svg);
  svgEl("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }, svg);
  text(svg, (L + W - R) / 2, H - 4, xLabel + (logX ? " (log)" : ""), { "text-anchor": "middle" });
  const drawn = [];
  for (const s of series) {
    const pts = s.pts.filter((p) => !logX || p[0] > 0);
    if (!pts.length) continue;
    const line = svgEl("polyline", { points: pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" "),
                                     class: "series", stroke: s.color }, svg);
    line.dataset.run = s.name;
    if (pts.length <= 60) for (const p of pts) svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.2, fill: s.color }, svg);
    for (const p of pts) drawn.push({ x: sx(p[0]), y: sy(p[1]), p, s });
  }
  const cursor = svgEl("circle", { r: 4.5, class: "hover", visibility: "hidden" }, svg);
  const tip = el("tooltip");
  svg.onmousemove = (ev) => {
    const box = svg.getBoundingClientRect();
    const mx = ((ev.clientX - box.left) / box.width) * W, my = ((ev.clientY - box.top) / box.height) * H;
    let best = null, bestD = Infinity;
    for (const d of drawn) {
      const dd = (d.x - mx) ** 2 + (d.y - my) ** 2;
      if (dd < bestD) { bestD = dd; best = d; }
    }
    if (!best || bestD > 40 * 40) { cursor.setAttribute("visibility", "hidden"); tip.hidden = true; return; }
    cursor.setAttribute("cx", best.x);
    cursor.setAttribute("cy", best.y);
    cursor.setAttribute("visibility", "visible");
    tip.hidden = false;
    tip.textContent = `${best.s.name} (${best.s.algorithm || "?"})\nround ${best.p[2]}\n${state.metric} ${fmtValue(best.p[1])}` +
                      (xLabel === "round" ? "" : `\n${xLabel} ${xFmt(best.p[0])}`);
    tip.style.left = `${ev.clientX + 14}px`;
    tip.style.top = `${ev.clientY + 10}px`;
  };
  svg.onmouseleave = () => { cursor.setAttribute("visibility", "hidden"); tip.hidden = true; };
  return drawn.length;
}

// ---- start ----------------------------------------------------------------------------------------------
el("metric").addEventListener("change", (ev) => { state.metric = ev.target.value; drawOverlay(); });
el("log-x").addEventListener("change", (ev) => { state.logX = ev.target.checked; drawOverlay(); });
window.addEventListener("resize", () => drawOverlay());
const wanted = new URL(window.location.href).searchParams.get("compare");
state.selected = wanted ? wanted.split(",").filter(Boolean) : [];  // (searchParams decodes the names)
loadRuns().then(drawOverlay);
setInterval(loadRuns, REFRESH_MS);
