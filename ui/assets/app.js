// The Skein page: the query list (#/) and one query (#/q/<backend>/<code>),
// drawn from the JSON API every 2 s without a reload. Plain DOM and SVG; no
// library, no build step.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
let timer = null;
let loads = 0;

// ---------- formatting ----------

function num(v, digits = 0) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(2) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return v.toLocaleString("en-US", { maximumFractionDigits: digits });
}
function bytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
}
function ms(v) {
  if (v === null || v === undefined) return "–";
  if (Math.abs(v) >= 86400000) return (v / 86400000).toFixed(1) + " d";
  if (Math.abs(v) >= 3600000) return (v / 3600000).toFixed(1) + " h";
  if (Math.abs(v) >= 60000) return (v / 60000).toFixed(1) + " min";
  if (Math.abs(v) >= 1000) return (v / 1000).toFixed(1) + " s";
  return v.toFixed(1) + " ms";
}
function usd(v) {
  if (v === null || v === undefined) return "–";
  return "$" + (v >= 0.01 ? v.toFixed(2) : v.toPrecision(2));
}
function time(t) {
  return t ? new Date(t).toLocaleTimeString("en-GB") : "–";
}
function esc(s) {
  return String(s ?? "").replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}
function stateBadge(state) {
  return `<span class="state ${esc(state)}">${esc(state)}</span>`;
}

// ---------- loading ----------

async function getJson(url, options) {
  const r = await fetch(url, options);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function route() {
  const m = location.hash.match(/^#\/q\/(local|lambda)\/([^/]+)$/);
  return m ? { backend: m[1], code: decodeURIComponent(m[2]) } : null;
}

async function refresh() {
  clearTimeout(timer);
  if (location.hash === "#/editor") {
    // The editor is drawn once and polls nothing.
    if (!document.getElementById("editor")) renderEditor();
    return;
  }
  const q = route();
  try {
    if (q) {
      const d = await getJson(`/api/queries/${q.backend}/${encodeURIComponent(q.code)}`);
      if (route() && route().code === q.code) renderQuery(d);
    } else {
      const l = await getJson("/api/queries");
      if (!route()) renderList(l);
    }
    loads++;
    document.body.dataset.loads = String(loads);
    document.getElementById("updated").textContent = new Date().toLocaleTimeString("en-GB");
  } catch (e) {
    document.getElementById("main").innerHTML = `<div class="card error" id="load-error">${esc(e.message)}</div>`;
  }
  timer = setTimeout(refresh, POLL_MS);
}

window.addEventListener("hashchange", () => {
  document.getElementById("main").innerHTML = '<p class="muted">Loading…</p>';
  loads = 0;
  document.body.dataset.loads = "0";
  refresh();
});

// ---------- the list ----------

function renderList(l) {
  document.getElementById("crumbs").textContent = "queries";
  const rows = l.queries.map((q) => `
    <tr class="query" data-id="${esc(q.id)}" data-state="${esc(q.state)}" onclick="location.hash='#/q/${esc(q.id)}'">
      <td>${q.name ? `<b class="name">${esc(q.name)}</b> ` : ""}<code>${esc(q.query_code)}</code></td>
      <td>${esc(q.backend)}</td>
      <td data-field="state">${stateBadge(q.state)}${q.error ? `<div class="error wrap">${esc(q.error)}</div>` : ""}</td>
      <td class="wrap">${esc(q.title)}</td>
      <td class="num" data-field="lag">${num(q.lag)}</td>
      <td class="num" data-field="watermark_delay">${ms(q.watermark_delay_ms)}</td>
      <td class="num" data-field="events_per_s">${num(q.events_per_s, 1)}</td>
      <td class="num" data-field="cost">${usd(q.usd_per_million_events)}</td>
      <td class="num">${q.committed_epoch ?? "–"}</td>
    </tr>`).join("");
  const lambda = l.lambda.store
    ? (l.lambda.error ? `<p class="error">Lambda (${esc(l.lambda.store)}): ${esc(l.lambda.error)}</p>`
                      : `<p class="muted">Lambda: queries deployed with the store ${esc(l.lambda.store)}.</p>`)
    : `<p class="muted">Lambda: not asked (no AWS endpoint or region in the environment).</p>`;
  document.getElementById("main").innerHTML = `
    <div class="card">
      <h2>Queries</h2>
      <table id="queries">
        <thead><tr><th>query</th><th>backend</th><th>state</th><th>SQL</th><th class="num">lag (records)</th>
        <th class="num">watermark delay</th><th class="num">events/s</th><th class="num">$ / M events</th><th class="num">committed</th></tr></thead>
        <tbody>${rows || '<tr><td colspan="9" class="muted">No queries: write one in the <a href="#/editor">editor</a>, or run one with <code>skein run</code> or <code>skein deploy</code>.</td></tr>'}</tbody>
      </table>
      ${lambda}
      <p class="muted">$ / M events: what the query used (invocations, billed time, checkpoint requests) at Lambda arm64 prices.</p>
    </div>`;
}

// ---------- one query ----------

function stat(id, k, v) {
  return `<div class="stat"><div class="v" id="${id}">${v}</div><div class="k">${k}</div></div>`;
}

function renderQuery(d) {
  document.getElementById("crumbs").textContent = `${d.backend} / ${d.name ? d.name + " (" + d.query_code + ")" : d.query_code}`;
  const main = document.getElementById("main");
  if (!main.querySelector("#query")) {
    main.innerHTML = `
      <div id="query">
        <div class="card"><div class="stats" id="stats"></div><div id="controls"></div></div>
        <div class="card graph"><h2>Stages</h2><svg id="graph"></svg></div>
        <div class="grid">
          <div class="card"><h2>Events per second</h2><svg id="chart-events" class="chart"></svg></div>
          <div class="card"><h2>Lag (records)</h2><svg id="chart-lag" class="chart"></svg></div>
          <div class="card"><h2>Epoch duration</h2><svg id="chart-epoch" class="chart"></svg></div>
          <div class="card"><h2>Group members (all groups)</h2><svg id="chart-members" class="chart"></svg></div>
        </div>
        <div class="card" style="margin-top:14px"><h2>Stages, measured</h2><div id="stages"></div></div>
        <div class="grid">
          <div class="card"><h2>Lag per partition</h2><div id="partitions"></div></div>
          <div class="card"><h2>Checkpoints</h2><div id="checkpoints"></div></div>
        </div>
        <div class="card" style="margin-top:14px"><h2>Late rows, dead letters, sink errors</h2><div id="set-aside"></div></div>
        <div class="grid">
          <div class="card"><h2>SQL</h2><pre id="sql"></pre></div>
          <div class="card"><h2>Explain</h2><pre id="explain"></pre></div>
        </div>
      </div>`;
  }
  document.getElementById("stats").innerHTML =
    `<div class="stat"><div class="v" id="state" data-state="${esc(d.state)}">${stateBadge(d.state)}</div><div class="k">${esc(d.backend)}${d.schedule ? " · schedule " + esc(d.schedule) : ""}</div></div>` +
    stat("lag", "lag (records)", num(d.lag)) +
    stat("events-per-s", "events/s", num(d.events_per_s, 1)) +
    stat("watermark-delay", "watermark behind now", ms(d.watermark_delay_ms)) +
    stat("cost", "$ per million events (Lambda arm64)", usd(d.usd_per_million_events)) +
    stat("epoch", "epoch run / committed", `${d.last_epoch ?? "–"} / ${d.committed_epoch ?? "–"}`) +
    stat("state-bytes", "state held", bytes(d.state_bytes)) +
    stat("events", "events since start", num(d.totals.events));
  const errors = [d.error && `last error: ${d.error}`, d.plan_error && `plan: ${d.plan_error}`].filter(Boolean);
  document.getElementById("controls").innerHTML =
    (errors.length ? `<p class="error" id="query-error">${errors.map(esc).join("<br>")}</p>` : "") +
    (d.controls && d.backend === "local"
      ? `<p><button class="stop" id="stop">Stop</button>
         <span class="muted">Sends SIGTERM to its process, as Ctrl-C would: it ends after the epoch in flight; a query with a checkpoint store resumes from its last commit when run again.</span></p>`
      : d.controls
      ? `<p><button class="stop" id="stop" ${d.schedule === "DISABLED" ? "disabled" : ""}>Stop</button>
         <button class="start" id="start" ${d.schedule === "ENABLED" ? "disabled" : ""}>Start</button>
         <span class="muted">What <code>skein stop</code> / <code>skein start</code> do: the schedule is disabled or enabled; state is kept.</span></p>`
      : "");
  for (const [id, action] of [["stop", "stop"], ["start", "start"]]) {
    const b = document.getElementById(id);
    if (b) b.onclick = () => control(d, action);
  }
  if (d.graph) drawGraph(document.getElementById("graph"), d.graph);
  drawChart(document.getElementById("chart-events"), d.series.map((p) => [p.t, p.events_per_s]), (v) => num(v, 1));
  drawChart(document.getElementById("chart-lag"), d.series.map((p) => [p.t, p.lag]), (v) => num(v));
  drawChart(document.getElementById("chart-epoch"), d.series.map((p) => [p.t, p.epoch_ms]), ms);
  drawChart(document.getElementById("chart-members"), d.series.map((p) => [p.t, p.members]), (v) => num(v));
  document.getElementById("stages").innerHTML = d.graph ? table(
    ["stage", "kind", "functions", "invocations", "p50", "p99", "retries", "state", "watermark", "behind now", "epoch"],
    d.graph.nodes.filter((n) => n.id !== "sink").map((n) => [
      esc(n.label), esc(n.kind), n.functions.map((f) => `<code>${esc(f)}</code>`).join("<br>"),
      num(n.invocations), ms(n.p50_ms), ms(n.p99_ms), num(n.retries), bytes(n.state_bytes),
      time(n.watermark_ms), ms(n.watermark_delay_ms), n.epoch ?? "–"]),
    [3, 4, 5, 6, 7, 9, 10], "stages-table") : `<p class="muted">No plan.</p>`;
  document.getElementById("partitions").innerHTML =
    (d.partitions_error ? `<p class="error">${esc(d.partitions_error)}</p>` : "") +
    table(["source", "partition", "committed", "latest", "lag", "behind"],
      d.partitions.map((p) => [esc(p.source), p.partition, num(p.committed), num(p.latest), num(p.lag), ms(p.behind_ms)]),
      [2, 3, 4, 5], "partitions-table");
  document.getElementById("checkpoints").innerHTML = table(
    ["epoch", "at", "duration", "bytes", "requests"],
    d.checkpoints.map((c) => [c.epoch, time(c.at_ms), ms(c.duration_ms), bytes(c.bytes), num(c.requests)]),
    [2, 3, 4], "checkpoints-table");
  const s = d.set_aside;
  document.getElementById("set-aside").innerHTML =
    `<div class="stats">${stat("late-rows", "late rows", num(s.late_rows))}${stat("dead-letters", "dead letters", num(s.dead_letters))}${stat("sink-errors", "sink errors", num(s.sink_errors))}</div>` +
    table(["at", "kind", "table", "reason"], d.reasons.map((r) => [time(r.at_ms), esc(r.kind), esc(r.table), esc(r.text)]), [], "reasons-table");
  setText("sql", d.sql ?? "(not recorded)");
  setText("explain", d.explain ?? "(no plan)");
}

function setText(id, text) {
  const el = document.getElementById(id);
  if (el.textContent !== text) el.textContent = text;
}

function table(head, rows, numeric, id) {
  if (!rows.length) return `<p class="muted" id="${id}">None yet.</p>`;
  const cls = (i) => (numeric.includes(i) ? ' class="num"' : "");
  return `<table id="${id}"><thead><tr>${head.map((h, i) => `<th${cls(i)}>${h}</th>`).join("")}</tr></thead>
    <tbody>${rows.map((r) => `<tr>${r.map((c, i) => `<td${cls(i)}>${c}</td>`).join("")}</tr>`).join("")}</tbody></table>`;
}

async function control(d, action) {
  const verb = action === "stop" ? "Stop" : "Start";
  if (!confirm(`${verb} query ${d.query_code}?`)) return;
  try {
    await getJson(`/api/queries/${d.backend}/${encodeURIComponent(d.query_code)}/${action}`, { method: "POST" });
  } catch (e) {
    alert(`${verb}: ${e.message}`);
  }
  refresh();
}

// ---------- the stage graph ----------

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function drawGraph(svg, g) {
  const W = 250, H = 96, GAP_X = 150, GAP_Y = 28, PAD = 16;
  // Columns by the longest path from a source.
  const depth = {};
  for (const n of g.nodes) depth[n.id] = 0;
  for (let i = 0; i < g.nodes.length; i++) {
    for (const e of g.edges) depth[e.to] = Math.max(depth[e.to], depth[e.from] + 1);
  }
  const columns = [];
  for (const n of g.nodes) (columns[depth[n.id]] ||= []).push(n);
  const pos = {};
  const tallest = Math.max(...columns.map((c) => c.length));
  columns.forEach((col, x) => col.forEach((n, y) => {
    const offset = ((tallest - col.length) * (H + GAP_Y)) / 2;
    pos[n.id] = { x: PAD + x * (W + GAP_X), y: PAD + offset + y * (H + GAP_Y) };
  }));
  svg.innerHTML = "";
  svg.setAttribute("width", PAD * 2 + columns.length * W + (columns.length - 1) * GAP_X);
  svg.setAttribute("height", PAD * 2 + tallest * H + (tallest - 1) * GAP_Y);
  for (const e of g.edges) {
    const a = pos[e.from], b = pos[e.to];
    if (!a || !b) continue;
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    const group = el("g", { class: "edge", "data-from": e.from, "data-to": e.to }, svg);
    el("path", { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` }, group);
    el("polygon", { points: `${x2},${y2} ${x2 - 7},${y2 - 4} ${x2 - 7},${y2 + 4}`, fill: "#7a8699" }, group);
    const lines = [e.exchange, `${num(e.rows_per_s, 1)} rows/s`];
    if (e.bytes_per_s !== null) lines.push(`${bytes(e.bytes_per_s)}/s`);
    const ly = (y1 + y2) / 2 - 18;
    el("rect", { x: mx - 55, y: ly - 11, width: 110, height: 44, rx: 4 }, group);
    lines.forEach((t, i) => {
      const text = el("text", { x: mx, y: ly + i * 14, "text-anchor": "middle", class: i ? "rate" : "exchange" }, group);
      text.textContent = t;
    });
  }
  for (const n of g.nodes) {
    const p = pos[n.id];
    const group = el("g", { class: `node ${n.kind}`, "data-stage": n.id, transform: `translate(${p.x},${p.y})` }, svg);
    el("rect", { width: W, height: H, rx: 7 }, group);
    const lines = n.id === "sink"
      ? [["title", "sink"], ["line", n.label]]
      : [["title", `${n.label}`],
         ["line", `${n.kind}${n.mode ? " · " + n.mode : ""} · ${n.functions.length} function${n.functions.length === 1 ? "" : "s"}`],
         ["line", `p50 ${ms(n.p50_ms)} · p99 ${ms(n.p99_ms)} · retries ${num(n.retries)}`],
         ["line", `state ${bytes(n.state_bytes)} · ${num(n.invocations)} invocations`],
         ["line", `watermark ${n.watermark_delay_ms === null ? "–" : ms(n.watermark_delay_ms) + " behind"}`]];
    lines.forEach(([cls, t], i) => {
      const text = el("text", { x: 10, y: 19 + i * 17, class: cls }, group);
      text.textContent = t.length > 40 ? t.slice(0, 39) + "…" : t;
    });
  }
}

// ---------- time series ----------

function drawChart(svg, points, fmt) {
  const W = 420, H = 150, L = 58, B = 22, T = 10;
  svg.innerHTML = "";
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", "100%");
  const pts = points.filter(([, v]) => v !== null && v !== undefined);
  el("line", { x1: L, y1: H - B, x2: W - 4, y2: H - B, class: "axis" }, svg);
  el("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }, svg);
  if (!pts.length) {
    el("text", { x: L + 10, y: H / 2 }, svg).textContent = "no epochs recorded yet";
    return;
  }
  const t0 = pts[0][0], t1 = Math.max(pts[pts.length - 1][0], t0 + 1);
  const vmax = Math.max(...pts.map(([, v]) => v), 1e-9);
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - 8);
  const y = (v) => H - B - (v / vmax) * (H - B - T);
  el("polyline", { points: pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }, svg);
  el("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, svg).textContent = fmt(vmax);
  el("text", { x: L - 4, y: H - B, "text-anchor": "end" }, svg).textContent = "0";
  el("text", { x: L, y: H - 6 }, svg).textContent = time(t0);
  el("text", { x: W - 4, y: H - 6, "text-anchor": "end" }, svg).textContent = time(t1);
  el("text", { x: W - 4, y: T + 8, "text-anchor": "end", class: "last" }, svg).textContent = "now " + fmt(pts[pts.length - 1][1]);
}

refresh();

// ---------- the editor ----------

let previewAbort = null;

function renderEditor() {
  document.getElementById("crumbs").textContent = "editor";
  document.getElementById("main").innerHTML = `
    <section class="card" id="sources"><h2>Topics</h2><div id="source-list"><p class="muted">Loading…</p></div>
      <div id="sample"></div></section>
    <section class="card" id="editor">
      <h2>Query</h2>
      <textarea id="sql" rows="14" spellcheck="false" placeholder="CREATE EXTERNAL TABLE ...;&#10;SELECT ..."></textarea>
      <div class="controls">
        <button id="explain">Explain</button>
        <button id="preview">Preview</button>
        <button id="stop-preview" disabled>Stop</button>
        <label>rows <input id="preview-rows" type="number" value="100" min="1"></label>
        <label>seconds <input id="preview-seconds" type="number" value="30" min="1"></label>
        <label>from <select id="preview-from"><option>latest</option><option>earliest</option><option value="time">a time…</option></select></label>
        <input id="preview-time" type="datetime-local" step="1" hidden>
      </div>
      <div class="controls">
        <label>name <input id="deploy-name" placeholder="clicks-per-ad"></label>
        <label>members <input id="group-size" type="number" value="8" min="1" title="members of each function group"></label>
        <label>on <select id="deploy-backend"><option value="local">this machine</option><option value="lambda">Lambda</option></select></label>
        <button id="deploy">Deploy…</button>
      </div>
      <div id="deploy-confirm" class="confirm" hidden>
        <span id="deploy-question"></span>
        <button id="deploy-yes">Deploy</button> <button id="deploy-no">Cancel</button>
      </div>
      <div id="editor-error" class="error" hidden></div>
    </section>
    <section class="card"><h2>Plan</h2><div id="plan"><p class="muted">Explain shows the stages.</p></div></section>
    <section class="card"><h2>Preview</h2><p id="preview-status" class="muted">Preview runs the query on the live tables; it writes no sink and commits no offset.</p>
      <div id="preview-table"></div></section>`;
  document.getElementById("explain").onclick = explainQuery;
  document.getElementById("preview").onclick = previewQuery;
  document.getElementById("stop-preview").onclick = () => previewAbort && previewAbort.abort();
  document.getElementById("preview-from").onchange = (e) => {
    document.getElementById("preview-time").hidden = e.target.value !== "time";
  };
  document.getElementById("deploy").onclick = askDeploy;
  document.getElementById("deploy-no").onclick = () => { document.getElementById("deploy-confirm").hidden = true; };
  document.getElementById("deploy-yes").onclick = deployQuery;
  loadSources();
}

// ---------- topics, a sample, and declaring a table ----------

async function loadSources() {
  const holder = document.getElementById("source-list");
  try {
    const l = await getJson("/api/sources");
    if (!l.clusters.length) {
      holder.innerHTML = '<p class="muted">No cluster: start <code>skein ui --kafka HOST:PORT</code> to list its topics.</p>';
      return;
    }
    holder.innerHTML = l.clusters.map((c) => {
      if (c.error) return `<p class="error">${esc(c.kind)} ${esc(c.name)}: ${esc(c.error)}</p>`;
      const rows = c.streams.map((t) => [
        `<code>${esc(t.name)}</code>`, num(t.partitions.length), num(t.records),
        `<button class="sample" data-cluster="${c.cluster}" data-stream="${esc(t.name)}">Sample</button>`,
      ]);
      return `<p class="muted">${esc(c.kind)} ${esc(c.name)}</p>` +
        table(["topic", "partitions", "records", ""], rows, [1, 2], `streams-${c.cluster}`);
    }).join("");
    for (const b of holder.querySelectorAll("button.sample")) {
      b.onclick = () => sampleStream(Number(b.dataset.cluster), b.dataset.stream);
    }
  } catch (e) {
    holder.innerHTML = `<p class="error">${esc(e.message)}</p>`;
  }
}

async function sampleStream(cluster, stream) {
  const holder = document.getElementById("sample");
  holder.innerHTML = `<p class="muted">Reading the newest records of ${esc(stream)}…</p>`;
  try {
    const s = await getJson("/api/sources/sample", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ cluster, stream, records: 10 }),
    });
    const records = s.sample.records.map((r) => [esc(r.partition), esc(r.offset), esc(r.key ?? ""), `<code>${esc(r.value)}</code>`]);
    const columns = s.sample.columns.map((c) => [esc(c.name), esc(c.sql_type), c.name === s.sample.event_time ? "event time" : ""]);
    holder.innerHTML = `<h3>${esc(stream)}</h3>
      ${table(["partition", "offset", "key", "value"], records, [], "sample-records")}
      <p>Format: <b id="sample-format">${esc(s.sample.format ?? "unknown")}</b>; columns ${esc(s.sample.columns_from)}.</p>
      ${table(["column", "type", ""], columns, [], "sample-columns")}
      ${s.sample.schema ? `<details><summary>The registry's schema</summary><pre>${esc(s.sample.schema)}</pre></details>` : ""}
      <pre id="declaration">${esc(s.declaration)}</pre>
      <button id="declare">Declare this table</button>`;
    document.getElementById("declare").onclick = () => {
      const sql = document.getElementById("sql");
      sql.value = s.declaration + "\n\n" + sql.value;
      sql.focus();
    };
  } catch (e) {
    holder.innerHTML = `<p class="error">${esc(e.message)}</p>`;
  }
}

// ---------- deploy ----------

function askDeploy() {
  showEditorError(null);
  const name = document.getElementById("deploy-name").value.trim();
  const backend = document.getElementById("deploy-backend");
  document.getElementById("deploy-question").textContent =
    `Start ${name ? `"${name}"` : "this query"} on ${backend.options[backend.selectedIndex].text}? It runs until it is stopped.`;
  document.getElementById("deploy-confirm").hidden = false;
}

async function deployQuery() {
  document.getElementById("deploy-confirm").hidden = true;
  const button = document.getElementById("deploy");
  button.disabled = true;
  button.textContent = "Deploying…";
  try {
    const r = await fetch("/api/queries", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        sql: document.getElementById("sql").value,
        name: document.getElementById("deploy-name").value.trim() || null,
        backend: document.getElementById("deploy-backend").value,
        group_size: Number(document.getElementById("group-size").value),
        confirmed: true,
      }),
    });
    const body = await r.json();
    if (!r.ok) return showEditorError(body);
    location.hash = `#/q/${body.id}`;
  } finally {
    button.disabled = false;
    button.textContent = "Deploy…";
  }
}

function showEditorError(body) {
  const box = document.getElementById("editor-error");
  box.hidden = !body;
  box.textContent = body ? (body.line ? `line ${body.line}: ` : "") + body.error : "";
}

async function explainQuery() {
  showEditorError(null);
  const r = await fetch("/api/explain", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      sql: document.getElementById("sql").value,
      group_size: Number(document.getElementById("group-size").value),
    }),
  });
  const body = await r.json();
  if (!r.ok) return showEditorError(body);
  // An exchange is a word ("sink") or an object ({"hash": [...]}).
  const exchange = (o) => (typeof o === "string" ? o : Object.keys(o ?? {}).join(", "));
  const stages = body.stages.map((s) => [
    s.id, s.kind, s.mode, s.members, exchange(s.output),
    s.state ? `${s.state.incremental ? "incremental" : "recompute"}: ${s.state.keeps}` : "–",
  ].map(esc));
  document.getElementById("plan").innerHTML =
    `<p>${body.updates ? "The result updates (a changelog)." : "The result only grows."} ${num(body.functions)} functions.</p>` +
    table(["stage", "kind", "mode", "members", "output", "state"], stages, [], "plan-stages");
}

// Where a preview starts: latest, earliest, or the time picked (local
// time on the page, sent as UTC).
function previewFrom() {
  const from = document.getElementById("preview-from").value;
  if (from !== "time") return from;
  const t = document.getElementById("preview-time").value;
  return t ? new Date(t).toISOString() : "latest";
}

async function previewQuery() {
  showEditorError(null);
  if (previewAbort) previewAbort.abort();
  previewAbort = new AbortController();
  const status = document.getElementById("preview-status");
  const holder = document.getElementById("preview-table");
  const rows = [];
  let columns = [];
  const draw = () => {
    // Rows are data from the topic: every cell is escaped.
    const cells = rows.map((r) => ["+", ...columns.map((c) => esc(r.row[c] ?? "NULL"))]);
    holder.innerHTML = table(["", ...columns.map(esc)], cells, [], "preview-rows");
  };
  document.getElementById("stop-preview").disabled = false;
  status.textContent = "Starting…";
  try {
    const r = await fetch("/api/preview", {
      method: "POST",
      headers: { "content-type": "application/json" },
      signal: previewAbort.signal,
      body: JSON.stringify({
        sql: document.getElementById("sql").value,
        rows: Number(document.getElementById("preview-rows").value),
        seconds: Number(document.getElementById("preview-seconds").value),
        from: previewFrom(),
      }),
    });
    if (!r.ok) return showEditorError(await r.json());
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const e = JSON.parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        if (e.type === "started") {
          columns = e.columns;
          status.textContent = e.updates ? "Running; rows are taken back and replaced as they change." : "Running.";
        } else if (e.type === "rows") {
          for (const r of e.rows) {
            if (r.op === "delete") {
              // A retraction takes back the current row it names.
              const same = JSON.stringify(r.row);
              const i = rows.findIndex((x) => JSON.stringify(x.row) === same);
              if (i >= 0) rows.splice(i, 1);
            } else {
              rows.push({ op: r.op, row: r.row });
            }
          }
          draw();
          document.body.dataset.previewEpochs = String(e.epoch);
        } else if (e.type === "ended") {
          const price = e.usd_per_million_events == null ? "" :
            ` About ${usd(e.usd_per_million_events)} per million events on Lambda arm64, from what these epochs used (${num(e.invocations)} invocations, ${num(e.billed_ms)} ms; a deployed query adds its checkpoint writes).`;
          status.innerHTML = esc(`Stopped after ${e.reason === "rows" ? "the rows" : "the seconds"} asked for: ${num(e.rows)} rows from ${num(e.events)} records in ${num(e.epochs)} epochs.`) +
            `<span id="preview-price">${esc(price)}</span>`;
        } else if (e.type === "error") {
          showEditorError({ error: e.error });
        }
      }
    }
  } catch (err) {
    if (err.name !== "AbortError") showEditorError({ error: err.message });
    else status.textContent = "Stopped.";
  } finally {
    document.getElementById("stop-preview").disabled = true;
  }
}
